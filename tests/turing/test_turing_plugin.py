"""The tile cap (plugin route) on vLLM's real kernel module, loaded offline, for simulated devices.

The kernel is the installed vLLM's, or the release named by GEMMA4_T4_VLLM_ROOT (a ``vllm`` package
folder unpacked from a wheel): run this file with it set to check a release before it joins
``tilecap.TESTED_VLLM_SERIES``.
"""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest

from gemma4_t4.turing import plugin, tilecap
from gemma4_t4.turing.state import status
from gemma4_t4.turing.verify import AttentionShape, call_launcher

T4 = {"platform": "cuda", "name": "Tesla T4", "capability": (7, 5), "limit": 65_536, "limit_source": "target"}
H100 = {"platform": "cuda", "name": "H100", "capability": (9, 0), "limit": 232_448, "limit_source": "target"}
E2B_GLOBAL = AttentionShape("E2B", "global", 512, 8, 1, None)
E2B_SLIDING = AttentionShape("E2B", "sliding", 256, 8, 1, 512)


@pytest.fixture(scope="module")
def loaded():
    pytest.importorskip("triton")
    from gemma4_t4.turing.offline import load_kernel_module

    return load_kernel_module(os.environ.get("GEMMA4_T4_VLLM_ROOT"), capability=(7, 5))


@pytest.fixture
def kernel(loaded):
    original = loaded.module._get_tile_size
    yield loaded
    loaded.module._get_tile_size = original
    loaded.module.__dict__.pop(tilecap.OUTCOME_ATTR, None)


def launch(kernel, shape, seqs, q_len, ctx):
    from gemma4_t4.turing.offline import recording_launches

    with recording_launches(kernel) as recorded:
        call_launcher(kernel, shape, seqs=seqs, q_len=q_len, ctx=ctx)
    kwargs = next(r["kwargs"] for r in recorded if r["kernel"] == "kernel_unified_attention")
    return kwargs["TILE_SIZE"], kwargs["BLOCK_M"], "3d" if kwargs["IS_3D"] else "2d"


def install(kernel, device, **kw):
    return tilecap.install(kernel.module, origin="test", device=device,
                           vllm_version=kw.pop("vllm_version", kernel.vllm_version), **kw)


def test_t4_caps_head512_launches_and_keeps_the_rest(kernel, caplog):
    assert launch(kernel, E2B_GLOBAL, 2, 64, 64) == (32, 16, "2d")  # vLLM's own choice: 98,304 B
    with caplog.at_level(logging.INFO, logger="vllm.gemma4_t4.turing"):
        outcome = install(kernel, T4)
    assert outcome["action"] == "capped"
    assert "98,304 B to 65,536 B" in outcome["reason"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(tilecap.LOG_PREFIX)]
    assert len(lines) == 1 and "capped" in lines[0] and f"vLLM {kernel.vllm_version}" in lines[0]
    assert launch(kernel, E2B_GLOBAL, 2, 64, 64) == (16, 16, "2d")  # prefill
    assert launch(kernel, E2B_GLOBAL, 129, 1, 32) == (16, 16, "2d")  # decode batch above the 3D threshold
    assert launch(kernel, E2B_GLOBAL, 4, 1, 256) == (16, 16, "3d")  # 3D decode: already 16
    assert launch(kernel, E2B_SLIDING, 2, 64, 64) == (32, 16, "2d")  # head 256 fits: unchanged
    assert [c["tile_to"] for c in outcome["clamps"]] == [16]
    assert getattr(kernel.module, tilecap.OUTCOME_ATTR)["action"] == "capped"


def test_block_m_is_read_from_the_launcher(kernel, caplog):
    install(kernel, T4, log=False)
    # 32 q heads per KV head -> BLOCK_M 32: head 256 at TILE 32 needs 65,536 B and still fits
    assert launch(kernel, AttentionShape("x", "global", 256, 32, 1, None), 2, 16, 64) == (32, 32, "2d")
    # 64 per KV head -> BLOCK_M 64: even TILE 16 needs 81,920 B; the cap says so instead of hiding it
    with caplog.at_level(logging.WARNING, logger="vllm.gemma4_t4.turing"):
        assert launch(kernel, AttentionShape("x", "global", 256, 64, 1, None), 2, 16, 64) == (16, 64, "2d")
    assert any("cannot fit" in r.getMessage() for r in caplog.records)


def test_install_twice_is_a_noop(kernel):
    assert install(kernel, T4, log=False)["action"] == "capped"
    wrapper = kernel.module._get_tile_size
    again = install(kernel, T4, log=False)
    assert again["action"] == "already-active" and "via test" in again["reason"]
    assert kernel.module._get_tile_size is wrapper
    assert wrapper.__wrapped__(512, 0, 2, True) == 32  # one layer of wrapping only


def test_big_shared_memory_gpu_is_left_alone(kernel):
    original = kernel.module._get_tile_size
    outcome = install(kernel, H100, log=False)
    assert outcome["action"] == "no-change" and "232,448" in outcome["reason"]
    assert kernel.module._get_tile_size is original
    assert launch(kernel, E2B_GLOBAL, 2, 64, 64)[0] == 32


def test_cpu_platform_changes_nothing_and_imports_nothing():
    cpu = SimpleNamespace(is_cuda=lambda: False, _enum=SimpleNamespace(name="CPU"))
    outcome = tilecap.install(None, origin="test", platform=cpu, vllm_version="0.32.0", log=False)
    assert outcome["action"] == "no-change" and "platform is cpu" in outcome["reason"]


def test_disabled_by_environment(kernel, monkeypatch):
    original = kernel.module._get_tile_size
    monkeypatch.setenv(tilecap.ENV_DISABLE, "0")
    assert install(kernel, T4, log=False)["action"] == "disabled"
    assert kernel.module._get_tile_size is original
    assert not status().plugin_enabled and "GEMMA4_T4_TURING_FIX=0" in status().summary


def test_unknown_vllm_version_is_refused_loudly(kernel, caplog, monkeypatch):
    original = kernel.module._get_tile_size
    with caplog.at_level(logging.ERROR, logger="vllm.gemma4_t4.turing"):
        outcome = install(kernel, T4, vllm_version="0.99.1")
    assert outcome["action"] == "refused" and "vLLM 0.99.1" in outcome["reason"]
    assert kernel.module._get_tile_size is original
    assert any("refused" in r.getMessage() and "0.99.1" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv(tilecap.ENV_ALLOW_UNTESTED, "1")
    assert install(kernel, T4, vllm_version="0.99.1", log=False)["action"] == "capped"


def test_changed_kernel_is_refused(tmp_path):
    pytest.importorskip("triton")
    from gemma4_t4.turing.offline import KERNEL_RELPATH, find_vllm_root

    source = (find_vllm_root() / KERNEL_RELPATH).read_text()
    changed = source.replace("    is_prefill: bool,\n) -> int:", "    is_prefill: bool,\n    block_m: int = 16,\n) -> int:")
    assert changed != source
    path = tmp_path / "triton_unified_attention.py"
    path.write_text(changed)

    def old_tile(head_size, sliding_window, element_size, is_prefill, block_m=16):
        return 32

    module = SimpleNamespace(__file__=str(path), _get_tile_size=old_tile, unified_attention=lambda: None)
    outcome = tilecap.install(module, origin="test", device=T4, vllm_version="0.32.0", log=False)
    assert outcome["action"] == "refused"
    assert "_get_tile_size() takes (head_size, sliding_window, element_size, is_prefill, block_m)" in outcome["reason"]
    assert module._get_tile_size is old_tile


def test_structure_check_on_the_installed_kernel():
    pytest.importorskip("triton")
    from gemma4_t4.turing.offline import KERNEL_RELPATH, find_vllm_root

    source = (find_vllm_root(os.environ.get("GEMMA4_T4_VLLM_ROOT")) / KERNEL_RELPATH).read_text()
    assert tilecap.structure_problem(source) is None
    assert "missing" in tilecap.structure_problem(source.replace("def _get_tile_size(", "def _pick_tile("))
    no_call = source.replace("TILE_SIZE_PREFILL = _get_tile_size(", "TILE_SIZE_PREFILL = max(")
    assert "no longer calls" in tilecap.structure_problem(no_call.replace("TILE_SIZE_DECODE = _get_tile_size(",
                                                                         "TILE_SIZE_DECODE = max("))


def test_plugin_entry_point_and_status():
    assert plugin.entry_point_registered()
    state = status()
    assert state.plugin_registered and state.vllm_version == "0.32.0"
    assert state.active and state.file_patch is not None and not state.file_patch.patched
