import contextlib
import errno
import io
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gemma4_t4.catalog.tiny import TinySpec, build_tiny_gemma4, snap_to_int4_grid
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.safepaths import MARKER_NAME

REPO = Path(__file__).resolve().parents[2]


def test_tiny_checkpoint_loads_in_transformers(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1 and tok.bos_token_id == 2
    text = "Gemma 4 on the T4"
    assert tok.decode(tok(text).input_ids) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt.endswith("<|turn>model\n")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Gemma4ForCausalLM"
    ids = tok("The quick brown", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 5
    assert model.config.tie_word_embeddings
    assert torch.equal(model.get_input_embeddings().weight, model.get_output_embeddings().weight)


def test_config_keeps_distinct_head_dims_in_portable_keys(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["head_dim"] != config["global_head_dim"]
    assert "per_layer_config" not in config
    assert {"sliding_attention", "full_attention"} <= set(config["layer_types"])
    assert config["layer_types"][-1] == "full_attention"


def test_build_is_deterministic(tmp_path):
    a = build_tiny_gemma4(tmp_path / "a")
    b = build_tiny_gemma4(tmp_path / "b")
    assert (a.path / "model.safetensors").read_bytes() == (b.path / "model.safetensors").read_bytes()
    c = build_tiny_gemma4(tmp_path / "c", spec=TinySpec(seed=1))
    assert (a.path / "model.safetensors").read_bytes() != (c.path / "model.safetensors").read_bytes()


def test_existing_output_is_refused(tmp_path):
    build_tiny_gemma4(tmp_path / "m")
    with pytest.raises(Gemma4T4Error, match="already exists"):
        build_tiny_gemma4(tmp_path / "m")


def test_qat_variant_sits_on_int4_grid(tiny_qat_model_dir):
    import torch
    from safetensors.torch import load_file

    tensors = load_file(tiny_qat_model_dir / "model.safetensors")
    checked = 0
    for name, t in tensors.items():
        if t.dim() != 2 or t.shape[1] % 32:
            continue
        g = t.float().reshape(t.shape[0], -1, 32)
        absmax = g.abs().amax(-1, keepdim=True)
        # some peak level k in 5..8 reproduces every value as an integer multiple
        ok = torch.zeros(g.shape[:2], dtype=torch.bool)
        for k in range(1, 9):
            q = g / (absmax / k).clamp_min(1e-12)
            ok |= ((q - q.round()).abs() < 0.05).all(-1) & (q.round() >= -8).all(-1) & (q.round() <= 7).all(-1)
        assert ok.all(), name
        checked += 1
    assert checked >= 10


def test_snap_rejects_bad_shape():
    import torch

    with pytest.raises(Gemma4T4Error, match="multiple of 32"):
        snap_to_int4_grid(torch.zeros(4, 40))


# -- the output folder follows the same rules as repack's (gemma4_t4.foundation.safepaths) ----------------


def _tiny_cli(*args) -> subprocess.CompletedProcess:
    """The real command line in this process: any exception but the package's own would propagate."""
    from gemma4_t4.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def _siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_overwrite_never_removes_a_folder_this_package_did_not_write(tmp_path):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me\n")
    proc = _tiny_cli("tiny", user, "--overwrite")
    assert proc.returncode == 2 and "was not written by gemma4-t4" in proc.stderr, proc.stderr
    assert "\n  fix: " in proc.stderr
    assert (user / "notes.txt").read_text() == "keep me\n" and _siblings(tmp_path) == ["mine"]
    # what it wrote itself it replaces; so also an empty folder, and a tiny build made before the
    # ownership marker existed (it carries tiny_gemma4.json)
    built = build_tiny_gemma4(tmp_path / "m")
    assert (built.path / MARKER_NAME).is_file() and MARKER_NAME not in built.files
    (built.path / MARKER_NAME).unlink()
    again = build_tiny_gemma4(tmp_path / "m", variant="qat", overwrite=True)
    assert json.loads((again.path / "tiny_gemma4.json").read_text())["variant"] == "qat"
    (tmp_path / "empty").mkdir()
    build_tiny_gemma4(tmp_path / "empty", overwrite=True)
    assert _siblings(tmp_path) == ["empty", "m", "mine"]  # no partial or backup left beside them


def test_overwrite_of_a_symlink_is_a_clear_error_and_follows_nothing(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "notes.txt").write_text("keep me\n")
    link = tmp_path / "link"
    link.symlink_to(real)
    for extra in (["--overwrite"], []):
        proc = _tiny_cli("tiny", link, *extra)
        assert proc.returncode == 2 and "is a symbolic link" in proc.stderr, proc.stderr
        assert "fix: give the real folder" in proc.stderr
    assert link.is_symlink() and (real / "notes.txt").read_text() == "keep me\n"
    assert _siblings(tmp_path) == ["link", "real"]


@pytest.mark.parametrize("failure", ["safetensors", "oserror"])
def test_a_full_disk_while_writing_is_a_clear_error_and_leaves_nothing(tmp_path, failure):
    """The weights writer fails part way (injected through ``save``): the package's error names the
    disk and the fix; the partial build and the folders it made are gone."""
    from safetensors import SafetensorError

    def full_disk(model, folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(b"\0" * 4096)  # part of it reached the disk
        if failure == "safetensors":
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "model.safetensors"))

    out = tmp_path / "new" / "deeper" / "m"
    with pytest.raises(Gemma4T4Error, match=r"cannot write the tiny model .*: the disk is full") as info:
        build_tiny_gemma4(out, save=full_disk)
    assert "free disk space" in info.value.fix
    assert _siblings(tmp_path) == []


def test_a_real_write_failure_on_the_command_line_leaves_nothing(tmp_path):
    """No injection: a file-size limit (RLIMIT_FSIZE) makes the kernel refuse safetensors' write
    with EFBIG, as a disk filled by someone else would with ENOSPC."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, 500_000))  # the weights are ~1.6 MB

    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "gemma4_t4", "tiny", str(tmp_path / "m")], capture_output=True,
                          text=True, env=env, timeout=300, preexec_fn=limit)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write the tiny model" in proc.stderr and "file-size limit" in proc.stderr, proc.stderr
    assert "\n  fix: " in proc.stderr and _siblings(tmp_path) == []


def test_a_partial_build_left_by_a_killed_run_is_removed_by_the_next(tmp_path):
    from gemma4_t4.foundation import safepaths

    debris = tmp_path / ".m.partial-dead"
    debris.mkdir()
    (debris / "model.safetensors").write_bytes(b"\0" * 100)
    dead_pid = 2**22 + 12345  # above Linux's pid_max default (4,194,304): never a live process
    (debris / safepaths.PARTIAL_OWNER).write_text(json.dumps({"pid": dead_pid, "start": "1"}))
    info = build_tiny_gemma4(tmp_path / "m")
    assert info.cleanup == [f"removed stale partial output {debris} (left by an interrupted run)"]
    assert _siblings(tmp_path) == ["m"]


def test_a_second_ensure_waits_for_the_first_build_and_reuses_it(tmp_path):
    """Two test workers (or two notebooks) asking for the same tiny model: the one that finds the
    build lock held waits, then reuses the finished folder instead of replacing it under the first."""
    import fcntl

    out = tmp_path / "models" / "tiny"
    out.parent.mkdir()
    code = ("import sys; from gemma4_t4.catalog.tiny import ensure_tiny_gemma4; "
            "print(ensure_tiny_gemma4(sys.argv[1]))")
    with open(out.parent / ".tiny.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # this test is the first builder
        waiter = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(REPO)))
        build_tiny_gemma4(out)
        built = os.stat(out / "tiny_gemma4.json").st_ino
    stdout, _ = waiter.communicate(timeout=300)
    assert waiter.returncode == 0 and stdout.strip() == str(out)
    # a second build would have replaced the folder (a new file from its rename)
    assert os.stat(out / "tiny_gemma4.json").st_ino == built
