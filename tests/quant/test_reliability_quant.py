"""Reliability of grid-check / grid-compare / repack / requant-awq, tried as a careless user would:
targets that hold the source, real SIGTERM / SIGHUP / kill -9 of a running `gemma4-t4 repack`,
malformed safetensors files and indexes, bad numbers, read-only and full disks. Each fault must
give a one-line error with a fix (exit 2, no traceback), lose nothing and leave nothing behind."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import safepaths
from gemma4_t4.quant import grid_check, grid_compare, open_checkpoint, repack
from gemma4_t4.quant.safetensors_io import PlannedTensor, ShardedWriter

REPO = Path(__file__).resolve().parents[2]


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _cli(*args: str, check_clean: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run the real command line in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-m", "gemma4_t4", *map(str, args)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        **kwargs,
    )
    if check_clean:
        assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    return proc


def _run(*args: str) -> subprocess.CompletedProcess:
    """The same command line in this process (fast): an exception other than the package's
    own error would propagate and fail the test, as a traceback would."""
    import contextlib
    import io

    from gemma4_t4.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def _refused(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """A refusal: exit 2, one error line naming the problem, and a fix."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr
    assert err.startswith("error: ") and "\n  fix: " in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name or ".old-" in p.name)


@pytest.fixture()
def src(tiny_qat_model_dir, tmp_path) -> Path:
    """A private copy of the tiny QAT checkpoint inside ``tmp_path/work`` (next to an unrelated file)."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(tiny_qat_model_dir, work / "src")
    (work / "notes.txt").write_text("unrelated work\n")
    return work / "src"


# ------------------------------------------------------------------------------------------
# item 2: a target that holds the source, or lies inside it, is refused; --overwrite is scoped


@pytest.mark.parametrize("command", ["repack", "requant-awq"])
def test_overwrite_of_the_sources_parent_is_refused_and_nothing_is_removed(src, command):
    before = _digest(src.parent)
    _refused(_cli(command, src, src.parent, "--overwrite"), "contains the source")
    _refused(_run(command, src, src / "sub" / "out"), "is inside the source")
    _refused(_run(command, src / "model.safetensors", src, "--overwrite"), "the source")
    assert _digest(src.parent) == before and not (src / "sub").exists()


def test_a_symlink_that_leads_to_the_source_is_refused(src, tmp_path):
    link = tmp_path / "link-to-work"
    link.symlink_to(src.parent)
    before = _digest(src.parent)
    _refused(_run("repack", src, link, "--overwrite"), "the source")
    _refused(_run("repack", src, link / "src", "--overwrite"), "the source")
    assert _digest(src.parent) == before and link.is_symlink()


def test_symlinked_shards_count_as_source(tmp_path, tiny_qat_model_dir):
    """A Hugging Face cache snapshot: the weights are symlinks into a blobs folder; a target that
    holds the blobs is refused too."""
    blobs, snap = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "rev"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    shutil.copy(tiny_qat_model_dir / "model.safetensors", blobs / "abc123")
    (snap / "model.safetensors").symlink_to(blobs / "abc123")
    shutil.copy(tiny_qat_model_dir / "config.json", snap / "config.json")
    with pytest.raises(Gemma4T4Error, match="contains the source"):
        repack(snap, tmp_path / "hub", overwrite=True)
    with pytest.raises(Gemma4T4Error, match="is inside the source"):
        repack(snap, blobs / "out")
    assert (blobs / "abc123").stat().st_size > 0


def test_overwrite_replaces_only_folders_this_package_wrote(src, tmp_path):
    mine = tmp_path / "mine"
    assert repack(src, mine).levels_changed == 0
    marker = json.loads((mine / safepaths.MARKER_NAME).read_text())
    assert marker["gemma4_t4_output"] is True and marker["command"] == "repack"
    assert safepaths.PARTIAL_OWNER not in os.listdir(mine)
    (mine / "stale.txt").write_text("from the old build")
    repack(src, mine, overwrite=True, scale_dtype="bf16")
    assert not (mine / "stale.txt").exists() and _leftovers(tmp_path) == []
    assert json.loads((mine / "config.json").read_text())["quantization_config"]["version"]

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("years of work")
    err = _refused(_run("repack", src, theirs, "--overwrite"), "not written by gemma4-t4")
    assert "remove the folder yourself" in err
    assert (theirs / "thesis.tex").read_text() == "years of work" and _leftovers(tmp_path) == []

    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(_run("repack", src, empty), "already exists")
    assert _run("repack", src, empty, "--overwrite").returncode == 0  # an empty folder holds nothing to lose
    assert (empty / "model.safetensors").is_file()


def test_a_destination_that_appears_during_the_build_is_not_replaced(src, tmp_path):
    dst = tmp_path / "out"

    def other_run_finishes(_name):  # another run into the same DST completes while this one works
        if not dst.exists():
            dst.mkdir()
            (dst / "theirs.txt").write_text("the other run's output")

    with pytest.raises(Gemma4T4Error, match="appeared while this build was written"):
        repack(src, dst, progress=other_run_finishes)
    assert os.listdir(dst) == ["theirs.txt"] and _leftovers(tmp_path) == []


def test_a_destination_that_is_a_file_is_refused(src, tmp_path):
    f = tmp_path / "out.safetensors"
    f.write_bytes(b"keep me")
    for extra in ([], ["--overwrite"]):
        _refused(_run("repack", src, f, *extra), "is a file, not a folder")
    _refused(_run("repack", src, f / "inside"), "is a file")
    assert f.read_bytes() == b"keep me" and _leftovers(tmp_path) == []


# ------------------------------------------------------------------------------------------
# item 5: interrupted runs leave nothing; a kill -9's debris is removed by the next run


@pytest.fixture(scope="module")
def big_src(tmp_path_factory) -> Path:
    """A 0.5 GB all-zero bf16 checkpoint (sparse, instant to make; about 2 s of repack work on
    two cores after the kernels are cached), big enough to be interrupted mid-run."""
    folder = tmp_path_factory.mktemp("big") / "src"
    folder.mkdir()
    plan = [PlannedTensor(f"model.layers.{i}.mlp.up_proj.weight", "BF16", (4096, 2048)) for i in range(32)]
    ShardedWriter(folder, plan).finish()
    (folder / "config.json").write_text('{"model_type": "gemma4_text"}')
    # warm the kernel cache so the interrupt tests time the work, not numba's first compile
    repack(folder / "model.safetensors", folder.parent / "warm")
    shutil.rmtree(folder.parent / "warm")
    return folder


@pytest.fixture()
def stalled_src(big_src, tmp_path) -> Path:
    """``big_src`` with a side file whose read never ends, as on a hung network mount: here a
    terminal nobody types into. A repack reads side files after writing every tensor, so it cannot
    finish while the test holds the terminal: once its partial folder is seen, a signal always finds
    it running (mid-write or blocked in that read), never already done."""
    master, slave = os.openpty()
    folder = tmp_path / "stalled"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(big_src / "model.safetensors")
    shutil.copy(big_src / "config.json", folder / "config.json")
    (folder / "tokenizer.json").symlink_to(os.ttyname(slave))
    yield folder
    os.close(master)
    os.close(slave)


def _start_repack(src: Path, dst: Path) -> tuple[subprocess.Popen, Path]:
    """Start a real `gemma4-t4 repack` and return it once it is writing into its partial folder."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gemma4_t4", "repack", str(src), str(dst)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        partials = list(dst.parent.glob(f".{dst.name}.partial-*"))
        if partials and (partials[0] / "model.safetensors").exists():
            return proc, partials[0]
        if proc.poll() is not None:
            raise AssertionError(f"repack ended before it could be interrupted: {proc.communicate()}")
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("repack never started writing")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signal_during_repack_removes_the_partial_output(stalled_src, tmp_path, sig):
    (tmp_path / "run").mkdir()
    dst = tmp_path / "run" / "out"
    proc, partial = _start_repack(stalled_src, dst)
    assert proc.poll() is None  # it cannot have finished: the stalled side file is still unread
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "interrupted" in err
    else:
        assert proc.returncode == -sig  # the process still ends by the signal, as its sender expects
    assert not partial.exists() and not dst.exists() and os.listdir(dst.parent) == []


def test_kill_9_debris_is_found_and_removed_by_the_next_run(big_src, stalled_src, tmp_path):
    (tmp_path / "run").mkdir()
    dst = tmp_path / "run" / "out"
    proc, partial = _start_repack(stalled_src, dst)
    proc.kill()
    proc.wait(timeout=60)
    assert partial.is_dir() and not dst.exists()  # nothing can clean up after SIGKILL ...
    owner = json.loads((partial / safepaths.PARTIAL_OWNER).read_text())
    assert owner["pid"] == proc.pid
    done = _cli("repack", big_src, dst)  # ... so the next run into the same DST does
    assert done.returncode == 0, done.stderr
    assert f"removed stale partial output {partial}" in done.stdout
    assert not partial.exists() and (dst / "model.safetensors").is_file() and _leftovers(dst.parent) == []


def test_a_partial_of_a_live_run_is_left_alone(tmp_path):
    dst = tmp_path / "out"
    live = safepaths.make_partial(dst)  # owned by this (live) process
    recycled = safepaths.make_partial(dst)
    owner = json.loads((recycled / safepaths.PARTIAL_OWNER).read_text())
    owner["start"] = "1"  # same PID, another process start time: the PID was reused
    (recycled / safepaths.PARTIAL_OWNER).write_text(json.dumps(owner))
    newborn = tmp_path / ".out.partial-newborn"  # created a moment ago, owner file not written yet
    newborn.mkdir()
    orphan = tmp_path / ".out.partial-orphan"
    orphan.mkdir()
    os.utime(orphan, (time.time() - 3600, time.time() - 3600))
    other = tmp_path / ".other.partial-x"  # another target's partial: not ours to judge
    other.mkdir()
    os.utime(other, (time.time() - 3600, time.time() - 3600))
    done = safepaths.clean_stale(dst)
    assert sorted(done) == sorted(
        f"removed stale partial output {p} (left by an interrupted run)" for p in (recycled, orphan)
    )
    assert live.is_dir() and newborn.is_dir() and other.is_dir()


def test_a_kill_while_swapping_builds_is_settled_by_the_next_run(src, tmp_path):
    dst = tmp_path / "out"
    repack(src, dst)
    before = _digest(dst)
    dst.rename(tmp_path / ".out.old-1700000000-4242")  # killed after moving the old build aside
    done = repack(src, tmp_path / "elsewhere")  # another target: this DST's backup is not touched
    assert done.cleanup == [] and (tmp_path / ".out.old-1700000000-4242").is_dir()
    with pytest.raises(Gemma4T4Error, match="already exists"):
        repack(src, dst)  # the old build is restored first, so it is not silently replaced
    assert _digest(dst) == before and _leftovers(tmp_path) == []
    shutil.copytree(dst, tmp_path / ".out.old-1700000001-4243")  # killed after the new build was in place
    rep = repack(src, dst, overwrite=True)
    assert (
        rep.cleanup
        == [
            f"removed stale backup {tmp_path / '.out.old-1700000001-4243'} (left by a run "
            "interrupted while replacing its target)"
        ]
        and _leftovers(tmp_path) == []
    )


# ------------------------------------------------------------------------------------------
# item 6: clear errors instead of tracebacks


def _raw_safetensors(path: Path, header: object, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


BAD_HEADERS = {
    "entry is a list": ({"w.weight": [1, 2]}, b""),
    "entry is a string": ({"w.weight": "F32"}, b""),
    "no data_offsets": ({"w.weight": {"dtype": "F32", "shape": [2, 2]}}, b"\0" * 16),
    "offsets not a pair": ({"w.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0]}}, b"\0" * 16),
    "offsets are strings": (
        {"w.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": ["0", "16"]}},
        b"\0" * 16,
    ),
    "shape is a number": ({"w.weight": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}}, b"\0" * 16),
    "negative dim": ({"w.weight": {"dtype": "F32", "shape": [-2, -2], "data_offsets": [0, 16]}}, b"\0" * 16),
    "absurd shape": (
        {"w.weight": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 16]}},
        b"\0" * 16,
    ),
    "metadata a list": (
        {"__metadata__": [1], "w.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
        b"\0" * 4,
    ),
    "header is a list": ([{"dtype": "F32"}], b""),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_malformed_header_entries_are_clear_errors(tmp_path, case):
    header, data = BAD_HEADERS[case]
    path = _raw_safetensors(tmp_path / "ckpt" / "model.safetensors", header, data)
    with pytest.raises(Gemma4T4Error) as err:
        open_checkpoint(path.parent)
    assert err.value.fix
    _refused(_run("grid-check", path.parent))
    _refused(_run("repack", path.parent, tmp_path / "out"))
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["grid-check", "{src}", "--group-size", "0"], "group size 0"),
        (["grid-check", "{src}", "--group-size", "-32"], "group size -32"),
        (["grid-compare", "{src}", "{src}", "--group-size", "0"], "group size 0"),
        (["repack", "{src}", "{out}", "--group-size", "0"], "group size 0"),
        (["repack", "{src}", "{out}", "--group-size", "-32"], "group size -32"),
        (["repack", "{src}", "{out}", "--group-size", "12"], "multiple of 8"),
        (["requant-awq", "{src}", "{out}", "--group-size", "0"], "group size 0"),
        (["grid-check", "{src}", "--tol", "nan"], "tolerance nan"),
        (["grid-check", "{src}", "--tol", "inf"], "tolerance inf"),
        (["grid-check", "{src}", "--tol", "-0.1"], "tolerance -0.1"),
        (["grid-check", "{src}", "--tol", "0.5"], "tolerance 0.5"),
    ],
)
def test_unusable_numbers_are_refused(tiny_qat_model_dir, tmp_path, args, needle):
    argv = [a.format(src=tiny_qat_model_dir, out=tmp_path / "out") for a in args]
    _refused(_run(*argv), needle)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("text", ['{"model_type": "gemma4",', "[1, 2, 3]", "\udcff"])
def test_corrupt_config_json_is_a_clear_error_and_nothing_is_written(src, tmp_path, text):
    (src / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    _refused(_run("repack", src, tmp_path / "out"), "config.json")
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_a_failed_build_removes_the_folders_it_created(tiny_model_dir, tmp_path):
    from gemma4_t4.quant.repack import OffGridError

    with pytest.raises(OffGridError):  # the plain bf16 model is off grid: refused after scanning
        repack(tiny_model_dir, tmp_path / "new" / "deeper" / "out")
    assert os.listdir(tmp_path) == []
    (tmp_path / "kept").mkdir()
    with pytest.raises(OffGridError):
        repack(tiny_model_dir, tmp_path / "kept" / "new" / "out")
    assert os.listdir(tmp_path) == ["kept"] and os.listdir(tmp_path / "kept") == []


def test_a_malformed_checkpoint_url_is_a_clear_error():
    for url in ("http://127.0.0.1:9/a folder/with spaces", "http://[::1/x", "https://"):
        with pytest.raises(Gemma4T4Error) as err:
            grid_check(url)
        assert err.value.fix


def test_read_only_target_is_a_clear_error(src):
    # /sys is mounted read-only in containers and owned by root everywhere: a real unwritable place
    _refused(_run("repack", src, "/sys/gemma4-t4-out"), "cannot write", "/sys")
    assert not Path("/sys/gemma4-t4-out").exists()


def _in_small_tmpfs(
    mnt: Path, script: str, size: str = "4m", options: str = ""
) -> subprocess.CompletedProcess:
    """Run ``script`` (sh) with a fresh tmpfs of ``size`` mounted at ``mnt`` ($MNT) in a private mount
    namespace (root: a mount namespace; otherwise a user namespace maps us to root). The mount
    vanishes with the namespace, so ``script`` reports what it left there itself."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("util-linux unshare is not installed")
    ns = ["--mount"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--mount"]
    probe = subprocess.run([unshare, *ns, "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a private mount namespace here: {probe.stderr.decode().strip()}")
    mnt.mkdir()
    full = f'mount -t tmpfs -o size={size}{options} gemma4t4test "{mnt}" || exit 99; MNT="{mnt}"; {script}'
    return subprocess.run(
        [unshare, *ns, "sh", "-c", full], capture_output=True, text=True, env=_env(), timeout=300
    )


def test_full_disk_is_refused_before_anything_is_written(src, tmp_path):
    proc = _in_small_tmpfs(
        tmp_path / "mnt", f'{sys.executable} -m gemma4_t4 repack {src} "$MNT/out"; echo "rc=$?"; ls -A "$MNT"'
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "error: not enough free space" in proc.stderr and "fix: " in proc.stderr
    assert proc.stdout.split() == ["rc=2"], proc.stdout  # and nothing left on that disk


def test_read_only_filesystem_is_refused(src, tmp_path):
    proc = _in_small_tmpfs(
        tmp_path / "mnt",
        f'{sys.executable} -m gemma4_t4 repack {src} "$MNT/out"; echo "rc=$?"',
        options=",ro",
    )
    assert "Traceback" not in proc.stderr and proc.stdout.strip() == "rc=2", (proc.stdout, proc.stderr)
    assert "read-only" in proc.stderr and "fix: " in proc.stderr


def test_a_disk_that_fills_while_writing_leaves_no_partial(src, tmp_path):
    """A real write failure after the free-space check passed: a file-size limit (RLIMIT_FSIZE)
    makes the kernel refuse the shard with EFBIG, as a disk filled by someone else would (ENOSPC)."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    proc = _cli("repack", src, tmp_path / "out", preexec_fn=limit)
    _refused(proc, "cannot write the build", "file-size limit")
    assert os.listdir(tmp_path) == ["work"]


def test_free_space_check_uses_the_real_filesystem(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    safepaths.ensure_free_space(tmp_path / "new" / "deeper", 1_000_000)  # a folder yet to be made
    with pytest.raises(Gemma4T4Error, match="not enough free space") as err:
        safepaths.ensure_free_space(tmp_path, free + 10**9)
    assert "free some space" in err.value.fix


# ------------------------------------------------------------------------------------------
# item 7: silent wrong results


def _f32(*values: float) -> bytes:
    return np.array(values, np.float32).tobytes()


def _entry(offsets, shape=(2,)):
    return {"dtype": "F32", "shape": list(shape), "data_offsets": list(offsets)}


@pytest.mark.parametrize(
    "case, header, data, needle",
    [
        ("shared offsets", {"a": _entry([0, 8]), "b": _entry([0, 8])}, _f32(1, 2), "overlap"),
        ("overlap", {"a": _entry([0, 8]), "b": _entry([4, 12])}, _f32(1, 2, 3), "overlap"),
        ("gap", {"a": _entry([0, 8]), "b": _entry([12, 20])}, _f32(1, 2, 0, 3, 4), "belong to no tensor"),
        ("not from 0", {"a": _entry([4, 12])}, _f32(0, 1, 2), "belong to no tensor"),
        ("trailing bytes", {"a": _entry([0, 8])}, _f32(1, 2, 3), "after the last tensor"),
    ],
)
def test_overlapping_or_gapped_tensor_data_is_refused_like_the_safetensors_library(
    tmp_path, case, header, data, needle
):
    from safetensors import SafetensorError, deserialize

    path = _raw_safetensors(tmp_path / "model.safetensors", header, data)
    with pytest.raises(SafetensorError):  # the format's reference implementation refuses it too
        deserialize(path.read_bytes())
    with pytest.raises(Gemma4T4Error, match=needle):
        open_checkpoint(path)


def test_tensor_order_in_the_header_does_not_matter(tmp_path):
    from safetensors import safe_open

    header = {"b": _entry([8, 16]), "__metadata__": {"format": "pt"}, "a": _entry([0, 8])}
    path = _raw_safetensors(tmp_path / "model.safetensors", header, _f32(1, 2, 3, 4))
    reader = open_checkpoint(path)
    with safe_open(str(path), "np") as f:
        for name in ("a", "b"):
            assert np.array_equal(reader.read_rows(name), f.get_tensor(name))
    assert reader.read_rows("b").tolist() == [3.0, 4.0]


def test_index_shard_paths_must_stay_inside_the_checkpoint(tmp_path, tiny_qat_model_dir):
    outside = tmp_path / "secret"
    outside.mkdir()
    shutil.copy(tiny_qat_model_dir / "model.safetensors", outside / "x.safetensors")
    ckpt = tmp_path / "a" / "b" / "ckpt"
    ckpt.mkdir(parents=True)
    names = list(open_checkpoint(tiny_qat_model_dir).tensors)
    for shard in ("../../../secret/x.safetensors", str(outside / "x.safetensors"), "sub/../../x.safetensors"):
        index = {"metadata": {}, "weight_map": dict.fromkeys(names, shard)}
        (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(Gemma4T4Error, match="outside the checkpoint folder"):
            open_checkpoint(ckpt)
        _refused(_run("grid-check", ckpt), "outside the checkpoint folder")
    for bad in ([1, 2], {"weight_map": ["x"]}, {"weight_map": {"w": 3}}):
        (ckpt / "model.safetensors.index.json").write_text(json.dumps(bad))
        with pytest.raises(Gemma4T4Error, match="index"):
            open_checkpoint(ckpt)


def _dense(folder: Path, w: np.ndarray) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    save_file({"m.weight": w}, str(folder / "model.safetensors"))
    return folder


def test_grid_compare_counts_moves_inside_groups_whose_lattice_is_ambiguous(tmp_path):
    s = np.float32(2.0**-7)
    rng = np.random.default_rng(0)
    w = (rng.integers(-8, 8, (8, 64)) * s).astype(np.float32)
    w[:, ::32] = -8 * s  # every group peaks at -8: one lattice, step s
    w[0, :32] = 0.0
    w[0, 0] = -8 * s  # {-8s, 0}: also {-1, 0} at 8s, {-2, 0} at 4s ...
    w[1, 32:] = 0.0  # an all-zero group
    other = w.copy()
    other[0, 5] = s  # one level up on the s lattice: within half a level of the 8s one
    other[0, 6] = 2 * s
    other[1, 40] = s  # out of an all-zero group
    w[2, 3] = 3 * s
    other[2, 3] = 4 * s  # an ordinary group
    moved = 4
    ref = _dense(tmp_path / "ref", w)
    oth = _dense(tmp_path / "other", other)
    assert grid_compare(str(ref), str(oth)).level_changed == moved
    assert grid_compare(str(oth), str(ref)).level_changed == moved
    repack(ref, tmp_path / "ref-packed")  # packed REF stores the coarsest lattice: {-1, 0} at 8s
    assert grid_compare(str(tmp_path / "ref-packed"), str(oth)).level_changed == moved
    # the repack itself moves nothing, ambiguous groups included
    assert grid_compare(str(ref), str(tmp_path / "ref-packed")).level_changed == 0


def test_grid_check_still_works_on_a_valid_single_file(tiny_qat_model_dir):
    report = grid_check(str(tiny_qat_model_dir / "model.safetensors"))
    assert report.on_grid and report.tensors_checked >= 30


def test_the_free_space_need_counts_only_the_side_files_a_build_copies(tmp_path):
    """Pickle weights, the index and the report are never copied, so they never count towards the
    space a build needs (a folder with both .safetensors and pytorch_model.bin was refused)."""
    from gemma4_t4.quant.repack import _side_bytes, _side_items

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "tokenizer.json").write_text("0123456789")
    with open(src / "pytorch_model.bin", "wb") as f:  # sparse: 1 GiB of size, no disk
        f.truncate(2**30)
    (src / "model.safetensors.index.json").write_text("{}")
    assert _side_bytes(src) == 10
    assert [item.name for item in _side_items(src)] == ["tokenizer.json"]  # what the build copies
