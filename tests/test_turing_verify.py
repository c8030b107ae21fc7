"""The offline proof: vLLM's own kernel compiled for sm_75 (and sm_89) with Triton's AOT path."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gemma4_t4.errors import Gemma4T4Error

pytest.importorskip("triton")

from gemma4_t4.turing.verify import AttentionShape, parse_arch, verify  # noqa: E402

E2B_GLOBAL = AttentionShape("E2B", "global", 512, 8, 1, None)
REQUIRED_KEYS = {"head_size", "path", "tile_size", "block_m", "shared_bytes_unpatched", "shared_bytes_patched",
                 "limit_bytes", "ok"}


@pytest.fixture(scope="module")
def sm75_report() -> dict:
    """The CLI as a user runs it (its compiles are cached on disk by Triton for later runs)."""
    run = subprocess.run([sys.executable, "-m", "gemma4_t4", "turing", "verify", "--arch", "sm_75", "--json"],
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_sm75_every_gemma4_launch_fits_after_the_cap(sm75_report):
    report = sm75_report
    assert report["ok"] is True and report["arch"] == "sm_75" and report["limit_bytes"] == 65_536
    assert report["patch_action"] == "capped" and report["model_exact"] is True
    launches = report["launches"]
    assert {(x["model"], x["layer"]) for x in launches} >= {("E2B", "global"), ("31B", "sliding"), ("12B", "global")}
    assert {x["path"] for x in launches} == {"2d", "3d"}
    for launch in launches:
        assert launch.keys() >= REQUIRED_KEYS
        assert launch["ok"] and launch["shared_bytes_patched"] <= 65_536
    head512_2d = [x for x in launches if x["head_size"] == 512 and x["path"] == "2d"]
    assert len(head512_2d) == 10
    assert all(x["shared_bytes_unpatched"] == 98_304 for x in head512_2d)  # the T4 crash, reproduced
    assert all(x["shared_bytes_patched"] == 65_536 and x["tile_size"] == 16 for x in head512_2d)
    # launches that already fit keep vLLM's tiles (head 256 everywhere, head-512 3D decode)
    assert all(x["tile_size"] == x["tile_size_unpatched"] for x in launches if x not in head512_2d)


@pytest.mark.compile
def test_sm89_the_cap_is_a_noop():
    report = verify("sm_89", shapes=[E2B_GLOBAL])
    assert report.ok and report.patch_action == "no-change" and report.changed_launches == 0
    assert report.limit_bytes == 101_376
    prefill = next(c for c in report.launches if c.case == "prefill")
    assert prefill.tile_size == 32 and 81_920 <= prefill.shared_bytes_patched <= report.limit_bytes


@pytest.mark.compile
def test_refused_vllm_fails_verify(tmp_path):
    import shutil

    from gemma4_t4.turing.offline import KERNEL_RELPATH, find_vllm_root

    installed, root = find_vllm_root(), tmp_path / "vllm"
    for rel in ("_version.py", "v1/kv_cache_interface.py", "v1/attention/ops/triton_attention_helpers.py",
                str(KERNEL_RELPATH)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(installed / rel, root / rel)
    (root / "_version.py").write_text("__version__ = version = '0.50.0'\n")
    report = verify("sm_75", vllm_root=str(root), shapes=[E2B_GLOBAL])
    assert not report.ok and report.patch_action == "refused" and "0.50.0" in report.patch_reason
    assert any(c.shared_bytes_patched == 98_304 and not c.ok for c in report.launches)


def test_arch_parsing_and_missing_triton(monkeypatch):
    assert parse_arch("sm_75") == parse_arch("sm75") == parse_arch("7.5") == (7, 5)
    assert parse_arch("sm_100") == (10, 0)
    with pytest.raises(Gemma4T4Error, match="unknown architecture"):
        parse_arch("turing")
    monkeypatch.setitem(sys.modules, "triton", None)  # "import triton" now fails, as when it is missing
    with pytest.raises(Gemma4T4Error, match="Triton is not installed") as info:
        verify("sm_75")
    assert "pip install 'triton==3.8.0'" in info.value.fix
