"""The one command runner: every external command the package runs to *probe or change the host*
(nvidia-smi, pip, fallocate/mkswap/swapon, sudo) goes through :func:`subprocess_runner`.

A ``Runner`` is any ``runner(command, input=None) -> CommandResult``; tests pass a fake one to
simulate a full disk, a missing permission, a T4 or a host without ``nvidia-smi``. A command that
is not installed answers 127 (as a shell would), one that hangs answers 124 (as ``timeout`` would):
callers never see ``FileNotFoundError`` or ``TimeoutExpired``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass

NOT_FOUND = 127
TIMED_OUT = 124


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


Runner = Callable[..., CommandResult]  # runner(command: list[str], input: str | None = None)


def subprocess_runner(command: list[str], input: str | None = None, timeout: float = 1800.0) -> CommandResult:
    """The real runner: runs ``command`` and captures its output (text)."""
    try:
        done = subprocess.run(
            command, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError as exc:
        return CommandResult(NOT_FOUND, "", str(exc))
    except subprocess.TimeoutExpired:
        return CommandResult(TIMED_OUT, "", f"{command[0]} did not finish within {timeout:g} s")
    except OSError as exc:  # not executable, exec format error
        return CommandResult(126, "", f"{type(exc).__name__}: {exc}")
    return CommandResult(done.returncode, done.stdout, done.stderr)


def probe_runner(command: list[str], input: str | None = None) -> CommandResult:
    """The runner for quick host probes (nvidia-smi and the like): 20 s, then it counts as hung."""
    return subprocess_runner(command, input=input, timeout=20.0)
