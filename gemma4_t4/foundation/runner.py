"""The one command runner: every external command the package runs to *probe or change the host*
(nvidia-smi, pip, fallocate/mkswap/swapon, sudo) goes through :func:`subprocess_runner`.

A ``Runner`` is any ``runner(command, input=None) -> CommandResult`` (tests pass a fake one). A command
not installed answers 127 (as a shell would), one that hangs 124 (as ``timeout`` would). Each command
starts in its own session, so a hung tool or an interrupted pip is stopped with every process it
started. Output is decoded as UTF-8 with undecodable bytes replaced, never raised on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

NOT_FOUND = 127
TIMED_OUT = 124
# how long a stopped group gets to exit after SIGTERM before SIGKILL
STOP_GRACE_S = 5.0


@dataclass
class CommandResult:
    returncode: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def missing(self) -> bool:
        """The command is not installed here."""
        return self.returncode == NOT_FOUND

    @property
    def timed_out(self) -> bool:
        return self.returncode == TIMED_OUT

    def tail(self, lines: int = 15) -> str:
        """The last ``lines`` of stdout then stderr (stdout need not end with a newline: never run them together)."""
        return "\n".join((self.stdout.rstrip() + "\n" + self.stderr).strip().splitlines()[-lines:])


Runner = Callable[..., CommandResult]  # runner(command: list[str], input: str | None = None)


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group ``proc`` leads, then SIGKILL what is left after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; children it forked may still hold the group: make sure they go too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends it SIGKILL when this process dies, even by a SIGKILL that
    runs no cleanup (the group stop covers Ctrl-C, SIGTERM and the timeout)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def subprocess_runner(command: list[str], input: str | None = None, timeout: float = 1800.0,
                      die_with_parent: bool = False) -> CommandResult:
    """The real runner: runs ``command`` in a new process group and captures its output (text);
    ``die_with_parent``: the command is killed when this process dies, however it dies."""
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=_die_with_parent if die_with_parent else None)
    except FileNotFoundError as exc:
        return CommandResult(NOT_FOUND, "", str(exc))
    except OSError as exc:  # not executable, exec format error
        return CommandResult(126, "", f"{type(exc).__name__}: {exc}")
    try:
        out, err = proc.communicate(input.encode() if input is not None else None, timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc, grace_s=1.0)
        return CommandResult(TIMED_OUT, "", f"{command[0]} did not finish within {timeout:g} s")
    except BaseException:  # Ctrl-C, SIGTERM/SIGHUP (signals.Terminated): the command stops with us
        stop_group(proc)
        raise
    return CommandResult(proc.returncode, _decode(out), _decode(err))


def probe_runner(command: list[str], input: str | None = None) -> CommandResult:
    """The runner for quick host probes (nvidia-smi and the like): 20 s, then it counts as hung."""
    return subprocess_runner(command, input=input, timeout=20.0)
