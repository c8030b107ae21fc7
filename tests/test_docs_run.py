"""The commands and Python snippets in README.md and docs/*.md run as written.

Every shell code block (```bash, ```sh, ```console, or untagged) is read line by line (``\\``
continuations joined, comments dropped). Each ``gemma4-t4 ...`` command is checked with the real
argparse parser (an unknown flag, a bad choice, a missing subcommand fails); ``bench run`` is also
validated by :func:`~gemma4_t4.bench.workloads.build_args` (the run's options and its workload spec), as the command would before sending a
request. Then each command is classified:

- ``run``: safe as written, run on a stand-in T4 host (a stand-in ``nvidia-smi`` on PATH, as in
  tests/host/test_setup_hosts.py): ``doctor``, ``fix-torch`` (it only prints), ``turing status``,
  ``setup --dry-run``, ``serve start --print-command``, ``swap create --dry-run``, ``models``, ``fit``;
- ``dry-run``: would install, change the host or start a server, so it is run with ``--dry-run`` or
  ``--print-command`` added (``setup``, ``swap create``, ``serve start``);
- ``parse``: needs a live server, AWS, a GPU or minutes of compiling (``bench run``, ``serve stop``,
  ``turing verify``, ``sagemaker ...``): parsed (and validated) only.

A command run must exit 0 (``doctor``: 0 or 1, its documented "not ready") without a traceback.
Usage synopses (``[--json]``, ``fp16|bf16``, ``...`` for the previous command's required options)
are read as the docs mean them. Other shell lines are checked for what they name: a ``make``
target, a file, a pytest marker, a module, a script's flags. ``sudo gemma4-t4`` is refused: sudo
resets PATH, so a venv's command is not found (``sudo "$(which gemma4-t4)"`` is the form).

Every ```python block (and every ``python -c`` program in a shell or Dockerfile block) must parse,
its imports must work, and each call whose callee the snippet's imports resolve must bind to the
callee's real signature (``inspect.signature``): a renamed function or keyword fails here.

The checkers are functions, run on the real docs and on synthetic blocks holding a misspelt flag,
a bad choice, a stale import and a wrong keyword, so the test is seen to fail on each.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

import pytest

from gemma4_t4.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console", ""}
FENCE = re.compile(r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```", re.S | re.M)

Plan = Literal["run", "dry-run", "parse"]


@dataclass
class DocCommand:
    where: str  # file:line
    argv: list[str]  # the words after gemma4-t4, as the docs mean them
    plan: Plan
    run_argv: list[str] = field(default_factory=list)  # what the test runs (run / dry-run)


@dataclass
class Block:
    where: str
    lang: str
    body: str
    line: int  # the first line of the body


def blocks(text: str, name: str) -> list[Block]:
    found = []
    for m in FENCE.finditer(text):
        line = text[: m.start("body")].count("\n") + 1
        found.append(Block(f"{name}:{line}", m["lang"].lower(), m["body"], line))
    return found


def logical_lines(body: str, first_line: int) -> list[tuple[int, str]]:
    """Lines with ``\\`` continuations joined, each with its first line number."""
    out: list[tuple[int, str]] = []
    pending, start = "", first_line
    for i, raw in enumerate(body.splitlines()):
        if not pending:
            start = first_line + i
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        out.append((start, pending + raw))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


# ------------------------------------------------------------------------------------------
# gemma4-t4 commands


@cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_path(argv: list[str]) -> tuple[str, ...]:
    """The (sub)command words of ``argv``: ("serve", "start"), ("doctor",)."""
    path: list[str] = []
    parser = _parser()
    for word in argv:
        subs = _subparsers(parser)
        if word not in subs:
            break
        path.append(word)
        parser = subs[word]
    return tuple(path)


def _subparser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = _parser()
    for word in path:
        parser = _subparsers(parser)[word]
    return parser


def _required_options(argv: list[str], given: list[str]) -> list[str]:
    """The required options of ``argv``'s command with their values, less those ``given`` sets
    itself (what ``...`` stands for)."""
    required = {s for a in _subparser(command_path(argv))._actions if a.required for s in a.option_strings}
    out: list[str] = []
    for i, word in enumerate(argv):
        if word in required and word not in given:
            out.append(word)
            out.extend(w for w in argv[i + 1 :][:1] if not w.startswith("-"))
    return out


def synopsis_words(words: list[str]) -> list[str]:
    """Usage-synopsis words as the docs mean them: ``[--json]`` -> ``--json``, ``NAME]...`` ->
    ``NAME``, ``fp16|bf16`` -> ``fp16``."""
    out = []
    for word in words:
        if word == "...":
            out.append(word)
            continue
        word = word.removesuffix("...").lstrip("[").rstrip("]")
        if "|" in word and not word.startswith(("http", "sagemaker:")):
            word = word.split("|")[0]
        if word:
            out.append(word)
    return out


def classify(argv: list[str]) -> tuple[Plan, list[str]]:
    """How the test exercises a documented command, and the argv it runs."""
    path = command_path(argv)
    flags = set(argv)
    if "--help" in flags or "-h" in flags:
        return "run", argv
    if path in {("doctor",), ("turing", "status"), ("models",), ("fit",), ("swap", "status")}:
        return "run", argv
    if path == ("fix-torch",):
        return ("parse", argv) if "--apply" in flags else ("run", argv)
    if path == ("setup",):
        if "--undo" in flags:  # needs a record of an earlier install
            return "parse", argv
        return ("run", argv) if "--dry-run" in flags else ("dry-run", [*argv, "--dry-run"])
    if path == ("serve", "start"):
        return ("run", argv) if "--print-command" in flags else ("dry-run", [*argv, "--print-command"])
    if path == ("swap", "create"):
        return ("run", argv) if "--dry-run" in flags else ("dry-run", [*argv, "--dry-run"])
    return "parse", argv


def shell_problems(block: Block, mention: bool = False) -> tuple[list[DocCommand], list[str]]:
    """The gemma4-t4 commands of a shell block, and the problems found in its other lines
    (``mention``: a command named in prose, where ``gemma4-t4 serve`` alone names the group)."""
    commands: list[DocCommand] = []
    problems: list[str] = []
    previous: dict[tuple[str, ...], list[str]] = {}
    served: str | None = None
    for line_no, line in logical_lines(block.body, block.line):
        where = f"{block.where.split(':')[0]}:{line_no}"
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            problems.append(f"{where}: not a shell line ({exc}): {line.strip()}")
            continue
        for segment in _segments(words):
            if not segment:
                continue
            if segment[0] == "sudo":
                if segment[1:2] == ["gemma4-t4"]:
                    problems.append(
                        f'{where}: `sudo gemma4-t4` is "command not found" in a venv or conda install '
                        '(sudo resets PATH): write sudo "$(which gemma4-t4)"'
                    )
                segment = segment[1:]
            if segment and segment[0] in ("$(which gemma4-t4)", "$(command -v gemma4-t4)"):
                segment = ["gemma4-t4", *segment[1:]]
            if segment[0] != "gemma4-t4":
                problems += _other_line_problems(segment, where)
                continue
            argv = synopsis_words(segment[1:])
            if mention:  # prose names a command ("`gemma4-t4 bench run`"), or quotes a log line
                if any(w.endswith(":") for w in argv):
                    continue
                argv = [w for w in argv if w != "..."]
            path = command_path(argv)
            if argv[len(path) : len(path) + 1] == ["..."]:
                # "bench run ... --workload ttft": the previous bench run's required options
                before = previous.get(path)
                if before is None:
                    problems.append(f"{where}: `...` with no earlier full command in the block to stand for")
                    continue
                i = len(path)
                argv = [*argv[:i], *_required_options(before, argv), *argv[i + 1 :]]
            else:
                previous[command_path(argv)] = argv
            problem = parse_problem(argv, group_ok=mention)
            if problem:
                problems.append(f"{where}: gemma4-t4 {' '.join(argv)}\n    {problem}")
                continue
            path = command_path(argv)
            if mention:
                pass  # a mention may leave out required arguments: nothing more to check
            elif path == ("serve", "start"):
                served = _served_name(argv)
            elif path == ("bench", "run") and served is not None:
                problems += _bench_model_problem(argv, served, where)
            plan, run_argv = classify(argv)
            commands.append(DocCommand(where, argv, plan, run_argv))
    return commands, problems


def _segments(words: list[str]) -> list[list[str]]:
    """Split on ``&&``, ``;`` and ``||``; ``a X | b Y`` where ``b`` is a sibling subcommand of ``a``
    (``sagemaker status g4 | logs g4``) is a synopsis's alternation, anything else a real pipe whose
    first command is the one checked."""
    segments, current = [], []
    for word in words:
        if word in ("&&", ";", "||"):
            segments.append(current)
            current = []
        else:
            current.append(word)
    segments.append(current)
    out = []
    for segment in segments:
        if "|" not in segment:
            out.append(segment)
            continue
        parts, part = [], []
        for word in segment:
            if word == "|":
                parts.append(part)
                part = []
            else:
                part.append(word)
        parts.append(part)
        out.append(parts[0])
        if parts[0][:1] == ["gemma4-t4"]:
            head = list(command_path(parts[0][1:]))
            siblings = set(_subparsers(_subparser(tuple(head[:-1])))) if head else set()
            out += [["gemma4-t4", *head[:-1], *p] for p in parts[1:] if p and p[0] in siblings]
    return out


PLACEHOLDER_VALUE = re.compile(r"invalid (int|float) value: '[A-Z][A-Z0-9_]*'$")


def parse_problem(argv: list[str], group_ok: bool = False) -> str | None:
    """What the real parser says about ``gemma4-t4 ARGV`` (None: it parses), then BenchArgs for
    ``bench run``. A synopsis's placeholder (``--minutes N``) stands for a value of the right type;
    ``group_ok``: prose may name a group or a command without its required arguments."""
    err = io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            ns = _parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0:
            return None  # --help
        message = (err.getvalue().strip().splitlines() or [f"exit {exc.code}"])[-1]
        if group_ok and "the following arguments are required" in message:
            return None  # prose names the command, not a whole invocation
        return None if PLACEHOLDER_VALUE.search(message) else message
    unfinished = [k for k, v in vars(ns).items() if k.endswith("_command") and v is None]
    if (unfinished or getattr(ns, "_handler", None) is None) and not group_ok:
        return "a command group without its subcommand (it only prints its help)"
    if unfinished:
        return None
    if command_path(argv) == ("bench", "run"):
        from pydantic import ValidationError

        from gemma4_t4.bench.workloads import build_args
        from gemma4_t4.cli.bench import bench_args
        from gemma4_t4.errors import Gemma4T4Error

        fields = bench_args(ns)
        try:
            build_args(fields.pop("base_url"), fields.pop("model"), fields.pop("workload"), fields.pop("out_dir"), **fields)
        except (ValidationError, Gemma4T4Error, ValueError) as exc:
            return f"bench run refuses these options: {str(exc).splitlines()[0]}"
    return None


def _served_name(argv: list[str]) -> str | None:
    from gemma4_t4.serving.server_config import DEFAULT_T4_MODEL, ServerConfig

    ns = _parser().parse_args(argv)
    model = ns.model or (DEFAULT_T4_MODEL if ns.target == "t4" else None)
    if model is None:
        return None
    return ServerConfig(model=model, served_model_name=ns.served_model_name, target=ns.target).resolved_name()


def _bench_model_problem(argv: list[str], served: str, where: str) -> list[str]:
    ns = _parser().parse_args(argv)
    if not re.match(r"https?://(127\.0\.0\.1|localhost)[:/]", ns.base_url) or ns.model == served:
        return []
    return [
        f"{where}: bench run --model {ns.model} against the server started above, which serves "
        f"{served!r} (vLLM refuses any other name)"
    ]


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))


def _markers() -> set[str]:
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return {m.split(":")[0] for m in ini["markers"]}


@cache
def _script_flags(script: str) -> str:
    done = subprocess.run(
        [sys.executable, str(REPO / script), "--help"], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return done.stdout if done.returncode == 0 else ""


def _other_line_problems(words: list[str], where: str) -> list[str]:
    """A shell line that is not gemma4-t4: what it names must exist."""
    head, rest = words[0], words[1:]
    problems = []
    if head == "make":
        for target in (w for w in rest if "=" not in w and not w.startswith("-")):
            if target not in _makefile_targets():
                problems.append(f"{where}: make {target}: no such target in the Makefile")
    elif head == "conda" and "-f" in rest:
        name = rest[rest.index("-f") + 1]
        if not (REPO / name).is_file():
            problems.append(f"{where}: conda ... -f {name}: no such file")
    elif head.endswith("pytest") and "-m" in rest:
        expr = rest[rest.index("-m") + 1]
        unknown = set(re.findall(r"[A-Za-z_]\w*", expr)) - {"not", "and", "or"} - _markers()
        if unknown:
            problems.append(f"{where}: pytest -m {expr!r}: no such marker {sorted(unknown)}")
    elif head in ("python", "python3") and rest[:1] == ["-m"]:
        if importlib.util.find_spec(rest[1]) is None:
            problems.append(f"{where}: python -m {rest[1]}: no such module")
    elif head in ("python", "python3") and rest[:1] == ["-c"]:
        problems += python_problems(rest[1], where)
    elif head in ("python", "python3") and rest and rest[0].endswith(".py"):
        if not (REPO / rest[0]).is_file():
            problems.append(f"{where}: python {rest[0]}: no such script")
        else:
            usage = _script_flags(rest[0])
            for flag in (w.split("=")[0] for w in rest[1:] if w.startswith("--")):
                if flag not in usage:
                    problems.append(f"{where}: {rest[0]} has no {flag} (its --help does not list it)")
    return problems


# ------------------------------------------------------------------------------------------
# Python snippets


def python_problems(source: str, where: str) -> list[str]:
    """The snippet parses, its imports import, and every call it makes to something its imports
    resolve binds to that callable's signature (positional count and keyword names)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"{where}: does not parse as Python: {exc.msg} (line {exc.lineno})"]
    namespace: dict[str, object] = {}
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            try:
                exec(compile(ast.Module([node], []), where, "exec"), namespace)  # the import alone
            except Exception as exc:  # ImportError, and what a broken module raises
                problems.append(f"{where}: {ast.unparse(node)}: {type(exc).__name__}: {exc}")
    instances: dict[str, type] = {}  # x = SomeClass(...): x's methods are checked too
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1:
            target, callee = node.targets[0], _resolve(node.value.func, namespace, instances)
            if isinstance(target, ast.Name) and isinstance(callee, type):
                instances[target.id] = callee
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        try:
            callee = _resolve(node.func, namespace, instances)
        except AttributeError as exc:
            problems.append(f"{where}: {ast.unparse(node.func)}: {exc}")
            continue
        if callee is None or not callable(callee):
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue
        try:
            signature = inspect.signature(callee)
        except (TypeError, ValueError):
            continue
        try:
            signature.bind(*[None] * len(node.args), **{k.arg: None for k in node.keywords})
        except TypeError as exc:
            problems.append(f"{where}: {ast.unparse(node)[:100]}: {exc} (signature {signature})")
    return problems


def _resolve(func: ast.expr, namespace: dict[str, object], instances: dict[str, type]) -> object | None:
    """The object ``func`` names where the snippet's imports decide it (None: not decidable here);
    AttributeError where a module or class lacks the attribute."""
    chain: list[str] = []
    while isinstance(func, ast.Attribute):
        chain.insert(0, func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    if func.id in namespace:
        obj = namespace[func.id]
    elif func.id in instances and chain:
        cls = instances[func.id]
        fields = getattr(cls, "model_fields", {})
        if chain[0] in fields:
            return None  # a pydantic field's value
        obj = inspect.getattr_static(cls, chain[0])  # AttributeError: no such method
        if isinstance(obj, property) or len(chain) > 1:
            return None
        return _bound(cls, chain[0])
    else:
        return None  # a builtin, a placeholder or a value the snippet computes
    for name in chain:
        if not (inspect.ismodule(obj) or inspect.isclass(obj)):
            return None  # an instance's attribute: not decidable statically
        if not hasattr(obj, name) and inspect.ismodule(obj):
            try:  # a submodule not imported yet (``from pkg import sub`` imports it; ``pkg.sub`` may not)
                obj = importlib.import_module(f"{obj.__name__}.{name}")
                continue
            except ImportError:
                pass
        obj = getattr(obj, name)  # AttributeError names the stale attribute
    return obj


def _bound(cls: type, name: str) -> object:
    """``cls.name`` as an instance would call it (``self`` already bound)."""
    attr = inspect.getattr_static(cls, name)
    function = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
    if isinstance(attr, staticmethod) or not inspect.isfunction(function):
        return function
    signature = inspect.signature(function)
    params = list(signature.parameters.values())[1:]

    def stand_in(*args, **kwargs):  # carries the signature without self
        raise NotImplementedError

    stand_in.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return stand_in


# ------------------------------------------------------------------------------------------
# Collected from the real docs


def _all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc.read_text(), str(doc.relative_to(REPO)))]


@cache
def documented() -> tuple[tuple[DocCommand, ...], tuple[str, ...]]:
    commands: list[DocCommand] = []
    problems: list[str] = []
    for block in _all_blocks():
        if block.lang in SHELL_LANGS:
            found, bad = shell_problems(block)
            commands += found
            problems += bad
        elif block.lang == "dockerfile":
            for line_no, line in logical_lines(block.body, block.line):
                if line.lstrip().startswith("#"):
                    continue
                for program in re.findall(r"python3? -c \"([^\"]+)\"", line):
                    problems += python_problems(program, f"{block.where.split(':')[0]}:{line_no}")
    return tuple(commands), tuple(problems)


@cache
def mentioned() -> tuple[tuple[DocCommand, ...], tuple[str, ...]]:
    commands: list[DocCommand] = []
    problems: list[str] = []
    for doc in DOCS:
        found, bad = inline_problems(doc.read_text(), str(doc.relative_to(REPO)))
        commands += found
        problems += bad
    return tuple(commands), tuple(problems)


INLINE = re.compile(r"`(gemma4-t4 [^`]+)`")


def inline_problems(text: str, name: str) -> tuple[list[DocCommand], list[str]]:
    """Commands named in prose (```gemma4-t4 serve start --target t4```), parsed like a block's
    (a usage synopsis's ``a|b`` and ``[--opt]`` as meant); none is run."""
    commands: list[DocCommand] = []
    problems: list[str] = []
    for m in INLINE.finditer(text):
        line = text[: m.start()].count("\n") + 1
        found, bad = shell_problems(Block(f"{name}:{line}", "", m[1].replace("|", " | "), line), mention=True)
        commands += [DocCommand(c.where, c.argv, "parse", c.argv) for c in found]
        problems += bad
    return commands, problems


def python_blocks() -> list[Block]:
    return [b for b in _all_blocks() if b.lang in ("python", "py")]


def test_every_documented_command_parses_and_every_named_thing_exists():
    commands, problems = documented()
    assert len(commands) >= 30, f"only {len(commands)} gemma4-t4 commands found in the docs"
    assert not problems, "\n".join(problems)


def test_every_command_named_in_prose_parses():
    commands, problems = mentioned()
    assert len(commands) >= 40, f"only {len(commands)} inline gemma4-t4 commands found"
    assert not problems, "\n".join(problems)


def test_every_python_snippet_imports_and_binds():
    snippets = python_blocks()
    assert len(snippets) >= 3
    problems = [p for b in snippets for p in python_problems(b.body, b.where)]
    assert not problems, "\n".join(problems)


# A stand-in T4 host: nvidia-smi answering as a Tesla T4 with driver 550 would (the same stand-in
# as tests/host/test_setup_hosts.py builds); the test runs each command there in a scratch folder.
STANDIN_SMI = """#!/bin/sh
# STAND-IN nvidia-smi: a Tesla T4, driver 550.54.15, CUDA 12.4
q=""
for a in "$@"; do case "$a" in --query-gpu=*) q="${a#--query-gpu=}" ;; esac; done
if [ -z "$q" ]; then echo "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |"; exit 0; fi
line=""
IFS=,
for f in $q; do
  case "$f" in
    index) v=0 ;; name) v="Tesla T4" ;; memory.total) v=15360 ;; compute_cap) v=7.5 ;;
    driver_version) v=550.54.15 ;; clocks.max.sm) v=1590 ;; power.limit) v=70.00 ;; *) v="[N/A]" ;;
  esac
  line="${line:+$line, }$v"
done
echo "$line"
"""


@pytest.fixture(scope="module")
def t4_host(tmp_path_factory):
    root = tmp_path_factory.mktemp("standin-t4")
    (root / "bin").mkdir()
    smi = root / "bin" / "nvidia-smi"
    smi.write_text(STANDIN_SMI)
    smi.chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COLAB_")}
    environ.update(
        PATH=os.pathsep.join([str(root / "bin"), os.path.dirname(sys.executable), "/usr/bin", "/bin"]),
        PYTHONPATH=str(REPO),
        GEMMA4_T4_CACHE_DIR=str(root / "cache"),
    )
    (root / "cwd").mkdir()
    return root / "cwd", environ


def _runnable() -> list[DocCommand]:
    return [c for c in documented()[0] if c.plan != "parse"]


@pytest.mark.parametrize("command", _runnable(), ids=lambda c: f"{c.where} {' '.join(c.run_argv[:3])}")
def test_documented_command_runs_on_a_standin_t4_host(command, t4_host):
    cwd, environ = t4_host
    done = subprocess.run(
        [sys.executable, "-m", "gemma4_t4", *command.run_argv],
        cwd=cwd, env=environ, capture_output=True, text=True, timeout=180,
    )
    allowed = (0, 1) if command_path(command.argv) == ("doctor",) else (0,)
    out = done.stdout + done.stderr
    assert done.returncode in allowed, f"{command.where}: gemma4-t4 {' '.join(command.run_argv)}\n{out[-3000:]}"
    assert "Traceback" not in out


def test_readme_benchmark_runs_against_a_standin_serving_what_serve_start_serves(fake_server_process, t4_host):
    """README's first benchmark, as written but for the port: against the FAKE server (the bench
    stand-in) serving the name README's ``serve start`` serves; vLLM, like the stand-in, refuses
    any other name."""
    commands = [c for c in documented()[0] if c.where.startswith("README.md")]
    start = next(c for c in commands if command_path(c.argv) == ("serve", "start"))
    bench = next(c for c in commands if command_path(c.argv) == ("bench", "run"))
    served = _served_name(start.argv)
    base_url = fake_server_process("--model", served, "--ttft", "0.005", "--gap", "0.001")
    argv = list(bench.argv)
    argv[argv.index("--base-url") + 1] = base_url
    cwd, environ = t4_host
    done = subprocess.run(
        [sys.executable, "-m", "gemma4_t4", *argv, "--json"],
        cwd=cwd, env=environ, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["status"] == "complete" and [c["concurrency"] for c in result["cells"]] == [1, 8]


def test_the_docs_commands_are_exercised():
    """What the docs hold and how each is exercised (the count is part of the report)."""
    commands, _ = documented()
    plans = {p: sum(c.plan == p for c in commands) for p in ("run", "dry-run", "parse")}
    print(f"\n[docs] {len(commands)} gemma4-t4 commands: {plans}; python snippets: {len(python_blocks())}")
    assert plans["run"] >= 5 and plans["dry-run"] >= 3 and plans["parse"] >= 20


# ------------------------------------------------------------------------------------------
# The checkers fail on broken docs


def _problems_in(body: str, lang: str = "bash") -> list[str]:
    return shell_problems(Block("synthetic.md:1", lang, body, 2))[1]


def test_checker_reports_a_misspelt_flag():
    problems = _problems_in(
        "gemma4-t4 bench run --base-url http://127.0.0.1:8000 --model m --workload decode \\\n"
        "    --concurency 1,8 --out build/x\n"
    )
    assert len(problems) == 1 and "--concurency" in problems[0] and "synthetic.md:2" in problems[0]


def test_checker_reports_a_bad_choice_a_bare_group_and_an_unknown_command():
    problems = _problems_in(
        "gemma4-t4 serve start --target gpu\ngemma4-t4 serve\ngemma4-t4 fix-everything\ngemma4-t4 doctor\n"
    )
    assert len(problems) == 3, problems
    assert "invalid choice: 'gpu'" in problems[0] and "without its subcommand" in problems[1]


def test_checker_reports_options_bench_run_refuses():
    problems = _problems_in(
        "gemma4-t4 bench run --base-url http://h:1 --model m --workload decode --concurrency 0 --out o\n"
    )
    assert len(problems) == 1 and "refuses" in problems[0]


def test_checker_reports_sudo_without_the_venv_path_and_a_wrong_served_name():
    problems = _problems_in(
        "sudo gemma4-t4 swap create --size 16G\n"
        'sudo "$(which gemma4-t4)" swap create --size 16G\n'
        "gemma4-t4 serve start --target t4 --model google/gemma-4-E2B-it-qat-w4a16-ct\n"
        "gemma4-t4 bench run --base-url http://127.0.0.1:8000 --model google/gemma-4-E2B-it-qat-w4a16-ct \\\n"
        "    --workload decode --concurrency 1,8 --out build/bench/qat\n"
        "gemma4-t4 bench run --base-url http://127.0.0.1:8000 --model gemma-4-E2B-it-qat-w4a16-ct \\\n"
        "    --workload decode --concurrency 1,8 --out build/bench/qat\n"
    )
    assert len(problems) == 2, problems
    assert "sudo resets PATH" in problems[0] and "serves 'gemma-4-E2B-it-qat-w4a16-ct'" in problems[1]


def test_checker_reads_synopses_and_elisions_as_meant():
    commands, problems = shell_problems(Block("synthetic.md:1", "bash", (
        "gemma4-t4 turing apply  [--path .../vllm/x.py] [--json]\n"
        "gemma4-t4 bench run --base-url http://h:1 --model m --workload decode --out a\n"
        "gemma4-t4 bench run ... --workload ttft --input-lens 256,512 --out b\n"
        "gemma4-t4 repack SRC DST [--scale-dtype fp16|bf16] [--json]\n"
        "gemma4-t4 serve status | logs --lines 5\n"
    ), 2))
    assert not problems, problems
    argvs = [c.argv for c in commands]
    assert argvs[0] == ["turing", "apply", "--path", ".../vllm/x.py", "--json"]
    assert argvs[2][:6] == ["bench", "run", "--base-url", "http://h:1", "--model", "m"]
    assert "fp16" in argvs[3] and argvs[4:] == [["serve", "status"], ["serve", "logs", "--lines", "5"]]
    bad = _problems_in("gemma4-t4 bench run ... --workload ttft --out b\n")
    assert "no earlier full command" in bad[0]


def test_checker_reports_a_missing_make_target_script_flag_and_marker():
    problems = _problems_in(
        "make tset\nmake test\n.venv/bin/pytest -m 'not vlm'\n"
        "python scripts/bench_vs_vllm.py --base-url U --model M --tokenizer T --concurency 1\n"
        "python -m gemma4_t4.no_such_module\n"
    )
    assert len(problems) == 4, problems
    assert "tset" in problems[0] and "vlm" in problems[1] and "--concurency" in problems[2]


def test_checker_reports_a_wrong_flag_named_in_prose():
    text = (
        "Run it against a server started with `gemma4-t4 serve start --no-enable-prefix-caching`,\n"
        "then `gemma4-t4 bench run` and `gemma4-t4 serve start|stop|status` as usual; the log says\n"
        "`gemma4-t4 turing prefill: routed: sm_75`. `gemma4-t4 fit --gpu t5` has no such GPU.\n"
    )
    commands, problems = inline_problems(text, "synthetic.md")
    assert len(problems) == 2, problems
    assert "--no-enable-prefix-caching" in problems[0] and "synthetic.md:1" in problems[0]
    assert "invalid choice: 't5'" in problems[1] and "synthetic.md:3" in problems[1]
    assert [c.argv for c in commands][:4] == [["bench", "run"], ["serve", "start"], ["serve", "stop"], ["serve", "status"]]


def test_commands_are_classified_by_what_they_would_do():
    assert classify(["setup"]) == ("dry-run", ["setup", "--dry-run"])
    assert classify(["setup", "--undo"])[0] == "parse"
    assert classify(["serve", "start", "--target", "t4"])[1][-1] == "--print-command"
    assert classify(["swap", "create", "--size", "16G"])[1][-1] == "--dry-run"
    assert classify(["fix-torch", "--apply"])[0] == "parse" and classify(["fix-torch"])[0] == "run"
    assert classify(["bench", "run", "--base-url", "http://h:1"])[0] == "parse"
    assert classify(["turing", "verify", "--arch", "sm_75"])[0] == "parse"  # minutes of compiling


def test_python_checker_reports_a_stale_import_and_a_wrong_keyword():
    stale = python_problems(
        "from gemma4_t4.turing import prefill, prefill_bench, ttft\n"
        "ttft.ttft_route_on_off(server_config, out_dir, input_lens=(512, 1024))\n",
        "synthetic.md:1",
    )
    assert len(stale) == 1 and "ttft" in stale[0] and "ImportError" in stale[0]
    wrong = python_problems(
        "from gemma4_t4.bench.specs import DecodeSpec\n"
        "from gemma4_t4.studies.ttft_route import ttft_route_on_off\n"
        "from gemma4_t4.serving.server_config import ServerConfig\n"
        "decode = DecodeSpec(concurency=[1, 8])\n"
        "ttft_route_on_off(config, out_dir, input_lens=(512,))\n"
        "config = ServerConfig(model='m')\n"
        "config.resolved_name(1, 2, 3)\n"
        "import gemma4_t4.turing as turing\n"
        "turing.no_such_function()\n",
        "synthetic.md:1",
    )
    assert len(wrong) == 4, "\n".join(wrong)
    assert "concurency" in wrong[0] or "concurency" in " ".join(wrong)
    assert any("input_lens" in w for w in wrong) and any("no_such_function" in w for w in wrong)
    assert any("resolved_name" in w for w in wrong)
    assert python_problems("turing.status() -> TuringStatus\n", "x")[0].startswith("x: does not parse")


# ------------------------------------------------------------------------------------------
# What the docs promise of the command line


def _help_of(*path: str) -> str:
    return " ".join(_subparser(path).format_help().split())


def test_serve_start_help_states_the_real_t4_defaults():
    from gemma4_t4.serving import server_config, speculative

    text = _help_of("serve", "start")
    assert f"prefill chunk (t4 default {server_config.T4_MAX_NUM_BATCHED_TOKENS})" in text
    assert f"t4 default: {server_config.T4_CONTEXT} where the fit calculator" in text
    assert f"cpu: {server_config.CPU_CONTEXT}" in text
    assert f"t4 default {server_config.T4_MAX_NUM_SEQS}" in text
    assert f"t4 default {server_config.T4_GPU_MEMORY_UTILIZATION:.2f}" in text
    assert "the tune profile's N, else the assistant's size recipe, 2 for E2B" in text
    assert f"{speculative.DEFAULT_NUM_DRAFT_TOKENS} for a whole-model drafter" in text


def _all_actions(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _all_actions(sub, (*path, name))
        else:
            yield path, action


def test_every_help_default_matches_the_parser_default():
    """A help text saying "(default X)" names the default argparse really fills in."""
    wrong = []
    for path, action in _all_actions(_parser()):
        text = action.help or ""
        if "%(default)" in text or action.default in (None, False, True, argparse.SUPPRESS):
            continue
        # "(default 16G)", "default /swapfile", "(default auto: ...)": one word naming the value
        m = re.search(r"\bdefault:? ([^\s();,:]+)(?=[);,:]|$)", text)
        shown = {str(action.default), f"{action.default:g}" if isinstance(action.default, float) else ""}
        if m and m[1] not in shown:
            wrong.append(f"{' '.join(path)} {action.option_strings}: help says {m[1]!r}, default is {action.default!r}")
    assert not wrong, "\n".join(wrong)


def test_list_options_take_commas_or_spaces():
    base = ["bench", "run", "--base-url", "http://h:1", "--model", "m", "--workload", "decode", "--out", "o"]
    for words in (["1,8"], ["1", "8"], ["1,2", "8"]):
        ns = _parser().parse_args([*base, "--concurrency", *words])
        assert ns.concurrency == ([1, 2, 8] if words == ["1,2", "8"] else [1, 8])
    assert _parser().parse_args([*base, "--rate", "0.5", "1"]).rates == [0.5, 1.0]
    assert "comma- or space-separated" in _help_of("bench", "run")


@pytest.mark.parametrize(
    "argv, dest, value",
    [
        (["fit", "--gpu", "T4"], "gpu", "t4"),
        (["fit", "--gpu", "L4"], "gpu", "l4"),
        (["serve", "start", "--target", "T4"], "target", "t4"),
        (["serve", "start", "--target", "CPU"], "target", "cpu"),
        (["run", "--target", "T4"], "target", "t4"),
        (["run", "--target", "Auto"], "target", "auto"),
    ],
)
def test_choices_are_accepted_in_any_case(argv, dest, value):
    assert parse_problem(argv) is None
    assert getattr(_parser().parse_args(argv), dest) == value


def test_setup_help_names_the_matrix_cuda12_route():
    from gemma4_t4.host.setup_plan import INSTALL_MATRIX

    text = _help_of("setup")
    cuda12 = [r for r in INSTALL_MATRIX if r.variant.startswith("cu12")]
    assert f"vLLM {cuda12[0].vllm_version}'s {cuda12[0].variant} build" in text


def test_notebooks_doc_names_part1_target_choices_and_params_that_skip():
    """docs/notebooks.md names Part 1's TARGET choices as its parameters cell declares them, and a
    params file it says skips parts holds ``_skip``."""
    nb = json.loads((REPO / "notebooks" / "01_sagemaker_mcp.ipynb").read_text())
    cell = next("".join(c["source"]) for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    choices = ast.literal_eval(re.search(r"^TARGET = .*# @param (\[.*\])", cell, re.M)[1])
    text = " ".join((REPO / "docs" / "notebooks.md").read_text().split())
    named = "its `TARGET` choices are " + ", ".join(f"`{c}`" for c in choices[:-1]) + f" and `{choices[-1]}`"
    assert named in text, f"docs/notebooks.md should say: {named}"
    for m in re.finditer(r"`_skip[^`]*`[^.]*?as `(\w+)\.yaml` does", text):
        assert "_skip" in (REPO / "notebooks" / "params" / f"{m[1]}.yaml").read_text(), m[0]
    params = {p.stem for p in (REPO / "notebooks" / "params").glob("*.yaml")}
    skipping = {p for p in params if "_skip" in (REPO / "notebooks" / "params" / f"{p}.yaml").read_text()}
    for name in params - skipping:
        assert not re.search(rf"`{name}\.yaml` (does|skips)", text), f"{name}.yaml skips no part"
