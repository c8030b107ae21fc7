"""The CLI's one error boundary: every failure is one message with its fix and exit code 2;
the traceback only with --debug or GEMMA4_T4_DEBUG=1. Real bad inputs first, then faults
injected into real commands where the fault cannot be produced here (a full disk, a denied
permission)."""

from __future__ import annotations

import errno
import json
import subprocess
import sys

import pytest

from gemma4_t4 import cli
from gemma4_t4.cli import main


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def assert_one_clear_error(err: str, fix_words: str | None = None) -> None:
    lines = _error_lines(err)
    assert "Traceback" not in err
    assert len(lines) == 2, lines
    assert lines[0].startswith("error: ") and lines[1].startswith("  fix: ")
    if fix_words:
        assert fix_words in lines[1]


def test_an_os_error_from_a_real_command_is_one_message_and_exit_2(capsys):
    # the tiny builder writes its temporary folder next to the target: /proc refuses it
    rc = main(["tiny", "/proc/gemma4-t4-test"])
    assert rc == 2
    assert_one_clear_error(capsys.readouterr().err)


def test_debug_shows_the_traceback_before_or_after_the_command(capsys, monkeypatch):
    for argv in (["--debug", "tiny", "/proc/gemma4-t4-test"], ["tiny", "/proc/gemma4-t4-test", "--debug"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and "\nerror: " in err
    monkeypatch.setenv("GEMMA4_T4_DEBUG", "1")
    assert main(["tiny", "/proc/gemma4-t4-test"]) == 2
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    monkeypatch.setenv("GEMMA4_T4_DEBUG", "0")
    assert main(["tiny", "/proc/gemma4-t4-test"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def _doctor_raising(monkeypatch, exc: BaseException) -> None:
    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr("gemma4_t4.cli.doctor.doctor", broken)


@pytest.mark.parametrize(
    "exc, kind, fix_words",
    [
        (
            PermissionError(errno.EACCES, "Permission denied", "/root/.cache/huggingface"),
            "PermissionError",
            "permissions (/root/.cache/huggingface)",
        ),
        (OSError(errno.ENOSPC, "No space left on device", "/data"), "OSError", "free disk space (/data)"),
        (OSError(errno.EROFS, "Read-only file system", "/mnt/ro"), "OSError", "read-only"),
        (json.JSONDecodeError("Expecting value", "{", 1), "JSONDecodeError", "not valid JSON"),
        (KeyError("gpus"), "KeyError", "--debug"),
        (MemoryError(), "MemoryError", "more RAM"),
    ],
)
def test_unexpected_exceptions_become_type_message_and_fix(monkeypatch, capsys, exc, kind, fix_words):
    _doctor_raising(monkeypatch, exc)  # a fault the doctor cannot meet on this machine
    assert main(["doctor"]) == 2
    err = capsys.readouterr().err
    assert_one_clear_error(err, fix_words)
    assert err.startswith(f"error: {kind}: ")
    assert main(["doctor", "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert data["error"] == kind and fix_words in data["fix"] and data["message"].startswith(kind)


def test_a_multi_line_exception_message_stays_on_one_line(monkeypatch, capsys):
    _doctor_raising(monkeypatch, RuntimeError("first line\nsecond line\n\tthird"))
    assert main(["doctor"]) == 2
    assert_one_clear_error(capsys.readouterr().err)


def test_interrupt_is_130_and_usage_errors_stay_argparse(monkeypatch, capsys):
    _doctor_raising(monkeypatch, KeyboardInterrupt())
    assert main(["doctor"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"
    with pytest.raises(SystemExit) as usage:
        main(["fit", "--gpus", "many"])
    assert usage.value.code == 2


def test_a_broken_command_module_is_reported_not_raised(monkeypatch, capsys):
    def broken_modules(command=None):
        raise ImportError("cannot import name 'x' from 'gemma4_t4.cli.fake'")

    monkeypatch.setattr(cli, "_command_modules", broken_modules)
    assert main(["doctor"]) == 2
    assert_one_clear_error(capsys.readouterr().err)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["fit", "--overhead-gib", "-100"], "overhead_gib"),
        (["fit", "--overhead-gib", "nan"], "overhead_gib"),
        (
            ["fit", "--max-num-batched-tokens", "0", "--model", "e2b", "--format", "bf16"],
            "max_num_batched_tokens",
        ),
        (["fit", "--gpu-memory-utilization", "nan"], "gpu_memory_utilization"),
        (["swap", "create", "--size", "lots", "--dry-run"], "cannot read swap size"),
    ],
)
def test_bad_numbers_are_refused_not_silently_wrong(capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert_one_clear_error(err)
    assert words in err


FULL_DISK_DOCTOR = """
import sys
import gemma4_t4.cli.doctor as doctor_cli
from gemma4_t4.cli import main

def full_disk(**kwargs):  # a fault injected into the real command: this disk is not full
    raise OSError(28, "No space left on device", "/data/hf")

doctor_cli.doctor = full_disk
sys.exit(main(sys.argv[1:]))
"""


def test_a_real_process_exits_2_with_the_message_on_stderr_only():
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK_DOCTOR, "doctor"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stdout == ""
    assert_one_clear_error(done.stderr, "free disk space (/data/hf)")
    debug = subprocess.run(
        [sys.executable, "-c", FULL_DISK_DOCTOR, "doctor", "--debug"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert debug.returncode == 2 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.rstrip().endswith(
        "fix: free disk space (/data/hf), or write to a disk with more room"
    )
