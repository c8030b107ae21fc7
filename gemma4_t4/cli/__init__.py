"""The ``gemma4-t4`` command line: a thin adapter over the package's functions.

Every capability owns one module in this folder that defines ``register(subparsers)``.
``main`` discovers them, so adding a capability never edits this file. A command given on the
command line whose module bears its name (``fix-torch``: ``fix_torch.py``) loads that module alone;
any other start (``--help``, ``repack``, a typo) loads them all. Handlers return an
:class:`Output`; ``--json`` (on every command) prints its ``data`` instead of its ``text``.

``main`` is the CLI's one error boundary: any exception becomes ``error: <message>`` and a
``fix:`` line on stderr (a JSON object with ``--json``) and exit code 2; ``--debug`` (or
``GEMMA4_T4_DEBUG=1``) also prints the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import pkgutil
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gemma4_t4 import __version__
from gemma4_t4.errors import debug_enabled, user_error
from gemma4_t4.foundation import signals
from gemma4_t4.foundation.jsonable import to_jsonable


@dataclass
class Output:
    """What a command produced: machine-readable ``data``, human ``text``, an exit code."""

    data: Any
    text: str
    exit_code: int = 0


Handler = Callable[[argparse.Namespace], Output]


def add_command(subparsers: argparse._SubParsersAction, name: str, handler: Handler, help: str,
                description: str | None = None) -> argparse.ArgumentParser:
    """Add a subcommand with the shared ``--json`` flag and ``handler`` bound to it."""
    parser = subparsers.add_parser(name, help=help, description=description or help)
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    _add_debug(parser, default=argparse.SUPPRESS)  # after the command too; keeps an earlier --debug
    parser.set_defaults(_handler=handler)
    return parser


@contextlib.contextmanager
def stopping_in_order(undone: Callable[[BaseException], str]) -> Iterator[None]:
    """SIGTERM and SIGHUP unwind like Ctrl-C within the block (:func:`gemma4_t4.foundation.signals.orderly_stop`),
    and an interrupted command's last line names the interruption and ``undone(exc)``: what it stopped or
    deleted on the way out."""
    with signals.orderly_stop():
        try:
            yield
        except KeyboardInterrupt as exc:
            print(f"{signals.interrupt_label(exc)} {undone(exc)}", file=sys.stderr, flush=True)
            raise


def add_group(subparsers: argparse._SubParsersAction, name: str, help: str,
              description: str) -> argparse._SubParsersAction:
    """A command with subcommands (``gemma4-t4 serve start``...); alone it prints its help, exit 2."""
    top = subparsers.add_parser(name, help=help, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    top.set_defaults(_handler=lambda _args: Output(None, top.format_help(), 2))
    return top.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND")


def _add_debug(parser: argparse.ArgumentParser, default: object = False) -> None:
    parser.add_argument("--debug", action="store_true", default=default,
                        help="show the full traceback when something fails (also: GEMMA4_T4_DEBUG=1)")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``command`` only that command's (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="gemma4-t4",
        description="Run Google's Gemma 4 on NVIDIA T4 GPUs with vLLM: checks, fixes, serving, "
        "benchmarks, 4-bit repacking and SageMaker deployment.",
    )
    parser.add_argument("--version", action="version", version=f"gemma4-t4 {__version__}")
    _add_debug(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules(command):
        module.register(subparsers)
    if command is not None and command not in subparsers.choices:  # not the module's own: all of them
        return build_parser()
    return parser


def _command_modules(command: str | None = None) -> list[Any]:
    # Loading every module costs a start ~0.5 s (the benchmark's flags are built from its pydantic
    # specs): a user's `gemma4-t4 setup` or `doctor` should not pay for `bench`.
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
    own = command.replace("-", "_") if command else None
    # every module here is a command's and defines register (the module docstring)
    return [importlib.import_module(f"{__name__}.{name}") for name in ([own] if own in names else names)]


def _command_named(argv: Sequence[str]) -> str | None:
    """The command ``argv`` asks for: its first word that is not an option (the top level's options
    take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def report_error(exc: BaseException, as_json: bool, debug: bool) -> int:
    """Show ``exc`` as the user sees every failure: one message, its fix; the traceback on --debug."""
    error = user_error(exc)
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    if as_json:
        try:
            print(json.dumps(error.to_dict(), indent=2))
            return 2
        except OSError:  # stdout itself failed (a full disk, a closed pipe): say it where it can be read
            pass
    print(f"error: {error}", file=sys.stderr)
    return 2


BROKEN_PIPE_EXIT = 128 + signal.SIGPIPE  # what a shell reports for a Unix tool killed by SIGPIPE


def _reader_went_away() -> int:
    """The reader closed the pipe (``... | head -c1``): exit quietly like a Unix tool, stdout pointed at
    /dev/null so Python's final flush does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return BROKEN_PIPE_EXIT


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    as_json, debug = "--json" in words, debug_enabled("--debug" in words)
    try:
        parser = build_parser(_command_named(words))
        args = parser.parse_args(argv)
        handler: Handler | None = getattr(args, "_handler", None)
        if handler is None:
            parser.print_help()
            return 2
        as_json, debug = (
            bool(getattr(args, "json", False)), debug_enabled(bool(getattr(args, "debug", False))),
        )
        output = handler(args)
        if as_json:
            print(json.dumps(to_jsonable(output.data), indent=2))
        elif output.text:
            print(output.text)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_went_away()
    except SystemExit:
        raise  # argparse's usage errors (exit 2) and --help/--version (exit 0)
    except Exception as exc:  # the boundary: nothing reaches the user raw
        return report_error(exc, as_json, debug)
    return output.exit_code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
