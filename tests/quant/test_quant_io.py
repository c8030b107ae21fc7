"""Checkpoint reading: pickle refusal, sharded index validation, HTTP range requests."""

from __future__ import annotations

import functools
import http.server
import json
import os
import pickle
import re
import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.quant import grid_check, open_checkpoint, repack
from gemma4_t4.quant.safetensors_io import PlannedTensor, RemoteCheckpoint, ShardedWriter, hub_headers


class _Trap:
    """Unpickling this creates a marker file: proves a pickle was (not) loaded."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def test_pickle_checkpoint_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "UNPICKLED"
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Trap(str(marker))))
    (folder / "config.json").write_text("{}")
    for target in (folder, folder / "pytorch_model.bin"):
        with pytest.raises(Gemma4T4Error, match="pickle") as err:
            grid_check(str(target))
        assert "safetensors" in err.value.fix
    with pytest.raises(Gemma4T4Error, match="pickle"):
        repack(folder, tmp_path / "out")
    assert not marker.exists() and not (tmp_path / "out").exists()
    # a pickle renamed to .safetensors is rejected by the header check, not unpickled
    (folder / "model.safetensors").write_bytes(pickle.dumps(_Trap(str(marker))))
    with pytest.raises(Gemma4T4Error, match="not a safetensors file|corrupt"):
        grid_check(str(folder))
    assert not marker.exists()


@pytest.fixture()
def sharded(tiny_qat_model_dir, tmp_path):
    """The tiny QAT model re-written as 4 shards + index by our writer."""
    src = open_checkpoint(tiny_qat_model_dir)
    out = tmp_path / "sharded"
    out.mkdir()
    plan = [PlannedTensor(n, t.dtype, t.shape) for n, t in sorted(src.tensors.items())]
    writer = ShardedWriter(out, plan, max_shard_bytes=500_000)
    for p in plan:
        writer.write_rows(p.name, 0, src.read_rows(p.name))
    files = writer.finish()
    assert len(files) == 5 and (out / "model.safetensors.index.json").exists()
    shutil.copy(tiny_qat_model_dir / "config.json", out / "config.json")
    return out


def test_sharded_writer_output_reads_back_with_the_safetensors_library(sharded, tiny_qat_model_dir):
    import torch
    from safetensors.torch import load_file

    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    src = open_checkpoint(tiny_qat_model_dir)
    for shard in set(index["weight_map"].values()):
        for name, arr in load_file(str(sharded / shard)).items():
            raw = arr.contiguous().view(-1).view(torch.uint8).numpy()
            assert np.array_equal(raw, src.read_rows(name).reshape(-1).view(np.uint8)), name
    assert grid_check(str(sharded)).tensors_on_grid == grid_check(str(tiny_qat_model_dir)).tensors_on_grid


def test_missing_shard_and_index_mismatch_are_clear_errors(sharded):
    index_path = sharded / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    (sharded / first).rename(sharded / "moved.bin.tmp")
    with pytest.raises(Gemma4T4Error, match="missing") as err:
        open_checkpoint(sharded)
    assert first in err.value.message and "download" in err.value.fix
    (sharded / "moved.bin.tmp").rename(sharded / first)
    name = next(iter(index["weight_map"]))
    index["weight_map"][name + ".renamed"] = index["weight_map"].pop(name)
    index_path.write_text(json.dumps(index))
    with pytest.raises(Gemma4T4Error, match="index and shards disagree"):
        open_checkpoint(sharded)


def test_truncated_shard_is_detected(sharded):
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shard = sharded / sorted(set(index["weight_map"].values()))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(Gemma4T4Error, match="past the end"):
        open_checkpoint(sharded)


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """A static file server with single-range ``Range: bytes=a-b`` support (206 responses)."""

    requests_seen: list[str] = []
    bytes_sent = 0
    require_auth: str | None = None  # play a gated repository: 401 without this Authorization

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_GET(self):
        if self.require_auth is not None and self.headers.get("Authorization") != self.require_auth:
            self.send_error(401)
            return
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        type(self).requests_seen.append(f"{self.path} {self.headers.get('Range', '')}")
        if match:
            start, end = int(match.group(1)), min(int(match.group(2)), len(data) - 1)
            body = data[start:end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        else:
            body = data
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        type(self).bytes_sent += len(body)


@pytest.fixture()
def http_folder(sharded):
    from gemma4_t4.serving.server_state import free_port

    handler = functools.partial(_RangeHandler, directory=str(sharded))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _RangeHandler.requests_seen = []
    _RangeHandler.bytes_sent = 0
    _RangeHandler.require_auth = None
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", sharded
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_remote_grid_check_reads_only_headers_and_the_named_tensor(http_folder, monkeypatch):
    from gemma4_t4.quant import safetensors_io

    # real shards are GBs behind a header of tens of KB; these are ~0.5 MB, so shrink the header fetch
    monkeypatch.setattr(safetensors_io, "HEAD_BYTES", 16 * 1024)
    url, folder = http_folder
    name = "model.layers.1.mlp.gate_proj.weight"
    report = grid_check(url, tensors=[name])
    assert report.tensors_checked == 1 and report.tensors_on_grid == 1
    local = grid_check(str(folder), tensors=[name])
    assert report.tensors[0].values_bit_identical == local.tensors[0].values_bit_identical
    total = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    assert report.bytes_read == 256 * 128 * 2
    ranged = [r for r in _RangeHandler.requests_seen if "bytes=" in r]
    assert ranged and all("index.json" not in r for r in ranged)
    shards = {p.name for p in folder.glob("*.safetensors")}
    # one ranged GET per shard (its header, existence and size) plus one for the tensor's rows
    assert len(ranged) == len(shards) + 1
    assert sorted(r.split()[0].lstrip("/") for r in ranged[:-1]) == sorted(shards)
    assert _RangeHandler.bytes_sent < total / 4


def test_remote_gated_repository_names_the_token_and_accepts_it(http_folder):
    url, _ = http_folder
    _RangeHandler.require_auth = "Bearer hf_test"
    with pytest.raises(Gemma4T4Error) as err:
        grid_check(url)
    assert "401" in str(err.value) and "HF_TOKEN" in err.value.fix
    reader = RemoteCheckpoint(url, headers={"Authorization": "Bearer hf_test"})
    assert reader.tensors


def test_hub_token_is_sent_to_hugging_face_hosts_only():
    env = {"HF_TOKEN": "hf_abc"}
    assert hub_headers("https://huggingface.co/google/x/resolve/main", env) == {"Authorization": "Bearer hf_abc"}
    assert hub_headers("https://cdn-lfs.hf.co/repos/x", env) == {"Authorization": "Bearer hf_abc"}
    assert hub_headers("http://127.0.0.1:8000/ckpt", env) == {}
    assert hub_headers("https://evilhuggingface.co/x", env) == {}
    assert hub_headers("https://huggingface.co/x", {}) == {}


def test_remote_truncated_shard_is_detected(http_folder):
    url, folder = http_folder
    shard = sorted(folder.glob("*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(Gemma4T4Error, match="past the end"):
        RemoteCheckpoint(url)


def test_remote_missing_tensor_and_bad_url(http_folder):
    url, _ = http_folder
    with pytest.raises(Gemma4T4Error, match="no tensor"):
        grid_check(url, tensors=["model.nope.weight"])
    with pytest.raises(Gemma4T4Error, match="neither"):
        grid_check(url + "/no-such-folder")


def test_grid_check_reads_fp16_and_fp32_checkpoints(tmp_path):
    """Non-bf16 sources take the kernels' float path: same lattice, same verdicts."""
    from safetensors.numpy import save_file

    from gemma4_t4.quant import lattice

    rng = np.random.default_rng(0)
    q = rng.integers(-8, 8, size=(64, 128)).astype(np.float32)
    q[:, ::32] = -8  # every group peaks at -8
    scale = np.repeat((10 ** rng.uniform(-3, -1, size=(64, 4))).astype(np.float32), 32, axis=1)
    on_grid = (q * scale).astype(np.float32)
    off = on_grid.copy()
    off[3, 5] *= 1.3
    save_file({"a.weight": on_grid.astype(np.float16), "b.weight": on_grid, "c.weight": off},
              str(tmp_path / "model.safetensors"))
    report = grid_check(str(tmp_path))
    rows = {t.name: t for t in report.tensors}
    assert rows["a.weight"].dtype == "F16" and rows["b.weight"].dtype == "F32"
    assert rows["a.weight"].on_grid and rows["b.weight"].on_grid and not rows["c.weight"].on_grid
    assert rows["c.weight"].groups_off_grid == 1 and report.tensors_off_grid == ["c.weight"]
    fit = lattice.fit_lattice(on_grid.astype(np.float16))  # float16 arrays are widened, not misread as bits
    assert fit.on_grid.all() and set(np.unique(fit.peak)) == {8}


def test_symlink_loops_and_dangling_links_are_named_as_such(tmp_path, sharded):
    """``Path.exists`` is False for a looping or dangling link: saying "does not exist" sent users
    looking for a file that is there."""
    from gemma4_t4.cli import main

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(Gemma4T4Error, match="is a symlink loop") as err:
        open_checkpoint(a)
    assert "real .safetensors file" in err.value.fix
    assert main(["grid-check", str(a), "--quiet"]) == 2
    gone = tmp_path / "gone.safetensors"
    gone.symlink_to(tmp_path / "nowhere.safetensors")
    with pytest.raises(Gemma4T4Error, match=r"is a symlink to .*nowhere\.safetensors, which does not exist"):
        open_checkpoint(gone)
    with pytest.raises(Gemma4T4Error, match=r"nowhere\.safetensors does not exist"):
        open_checkpoint(tmp_path / "nowhere.safetensors")  # a plain missing path keeps its message
    # inside a folder: the single file, and one shard of an index
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to("model.safetensors")
    with pytest.raises(Gemma4T4Error, match=r"model\.safetensors is a symlink loop"):
        open_checkpoint(folder)
    first = sorted(p for p in sharded.iterdir() if p.name.endswith(".safetensors"))[0]
    first.unlink()
    first.symlink_to(first.name)
    with pytest.raises(Gemma4T4Error, match=f"{first.name} is a symlink loop"):
        open_checkpoint(sharded)


def test_an_unreachable_host_reads_the_same_for_a_folder_and_a_file_url():
    # the index GET and the shard's ranged GET name the failure in the same words
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now: the connection is refused
    for url in (f"http://127.0.0.1:{port}/repo", f"http://127.0.0.1:{port}/model.safetensors"):
        with pytest.raises(Gemma4T4Error, match=rf"^cannot reach http://127\.0\.0\.1:{port}"):
            RemoteCheckpoint(url, timeout=5)
