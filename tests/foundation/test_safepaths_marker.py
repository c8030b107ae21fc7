"""The output marker (``.gemma4_t4-output.json``) under a full disk: written atomically, and a marker a
full disk cut short (0 bytes) or a corrupt one is named, never taken for ownership (issue 41, lows)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gemma4_t4.bench.results import check_out_dir
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import safepaths
from gemma4_t4.foundation.safepaths import MARKER_NAME

# a file-size limit of 0 bytes fails every write with EFBIG, as a full disk fails it with ENOSPC:
# the file is created, its first write fails (no monkeypatching: a real kernel refusal, in a child)
FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    from gemma4_t4.foundation import safepaths
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        safepaths.write_marker(sys.argv[1], "bench run")
    except OSError as exc:
        print("refused:", exc.errno)
""")


def test_a_marker_write_cut_short_by_a_full_disk_leaves_no_marker(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(out)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.startswith("refused:"), done.stderr
    assert list(out.iterdir()) == []  # before: a 0-byte .gemma4_t4-output.json stayed behind


def _zero_byte_marker(folder: Path) -> Path:
    """What the old, non-atomic write left on a full disk: the bench's --out holding only an empty marker."""
    folder.mkdir(parents=True)
    (folder / MARKER_NAME).write_bytes(b"")
    return folder


def test_a_bench_retry_after_a_full_disk_is_not_blocked(tmp_path):
    out = _zero_byte_marker(tmp_path / "out")
    # before: "--out … is not empty", and with --overwrite "holds files the bench did not write (no marker)"
    assert check_out_dir(out, overwrite=False) == out
    assert check_out_dir(out, overwrite=True) == out


def test_overwrite_of_a_folder_holding_only_an_empty_marker_goes_ahead(tmp_path):
    out = _zero_byte_marker(tmp_path / "out")
    # before: "was not written by gemma4-t4 (no .gemma4_t4-output.json)" while the file was right there
    assert safepaths.check_target(out, overwrite=True, what="OUT") == out
    with pytest.raises(Gemma4T4Error, match="already exists") as info:
        safepaths.check_target(out, overwrite=False, what="OUT")
    assert "--overwrite" in info.value.fix


@pytest.mark.parametrize("content", [b"", b'{"gemma4_t4_out', b"\xff\xfe not text", b"[]"])
def test_a_corrupt_marker_beside_other_files_is_named_and_nothing_is_removed(tmp_path, content):
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER_NAME).write_bytes(content)
    (out / "notes.txt").write_text("someone's notes")
    with pytest.raises(Gemma4T4Error) as info:
        safepaths.check_target(out, overwrite=True, what="OUT")
    assert f"{MARKER_NAME} is corrupt" in info.value.message  # before: "no .gemma4_t4-output.json"
    assert str(out) in info.value.fix and "choose a new OUT" in info.value.fix
    with pytest.raises(Gemma4T4Error, match="corrupt"):
        check_out_dir(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER_NAME, "notes.txt"])
