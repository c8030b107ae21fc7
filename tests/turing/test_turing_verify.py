"""The offline proof: vLLM's own kernel compiled for sm_75 (and sm_89) with Triton's AOT path."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gemma4_t4.errors import Gemma4T4Error

pytest.importorskip("triton")

from gemma4_t4.turing.verify import (  # noqa: E402
    VERIFY_DRAFT_TOKENS,
    AttentionShape,
    capture_attention_launches,
    gemma4_attention_shapes,
    parse_arch,
    verify,
)

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
    # vLLM 0.32 (CI): 10 global shapes (5 sizes, 5 assistants) x (prefill, decode-batch, 7 verification
    # steps, a verification batch), all 2D
    assert len(head512_2d) == 10 * (2 + len(VERIFY_DRAFT_TOKENS) + 1) == 100
    assert all(x["shared_bytes_unpatched"] == 98_304 for x in head512_2d)  # the T4 crash, reproduced
    assert all(x["shared_bytes_patched"] == 65_536 and x["tile_size"] == 16 for x in head512_2d)
    # launches that already fit keep vLLM's tiles (head 256 everywhere, head-512 3D decode)
    assert all(x["tile_size"] == x["tile_size_unpatched"] for x in launches if x not in head512_2d)


def expected_step_bytes(step: dict) -> tuple[int, int]:
    """(unpatched, patched) bytes of a verification step on sm_75 with BLOCK_M 16.

    2D (TILE_SIZE_PREFILL, 32): head 512 needs 98,304 B and is capped to TILE 16 (65,536 B). 3D, which
    vLLM 0.33 takes for up to 8 query tokens in a small batch (TILE_SIZE_DECODE): head 512 at 16 fits
    already; head 256 at 16, or 32 for the Gemma-3-like window-1024 layers.
    """
    if step["path"] == "2d":
        return (98_304, 65_536) if step["head_size"] == 512 else (49_152, 49_152)
    need = 4 * (step["tile_size_unpatched"] + 16) * step["head_size"]
    return need, need


def test_sm75_speculative_decoding_launches_fit_after_the_cap(sm75_report):
    launches = sm75_report["launches"]
    verify_cases = {f"verify-{n}" for n in VERIFY_DRAFT_TOKENS} | {"verify-batch"}
    assert verify_cases == {f"verify-{n}" for n in (1, 2, 3, 4, 5, 6, 16)} | {"verify-batch"}
    steps = [x for x in launches if x["case"] in verify_cases]
    assert {(x["role"], x["model"], x["layer"]) for x in steps} >= {
        ("target", "E2B", "global"), ("target", "12B", "global"), ("drafter", "E2B", "global"),
        ("drafter", "31B", "global"), ("drafter", "E4B", "sliding")}
    assert len(steps) == 20 * len(verify_cases)  # 10 target shapes, 10 assistant shapes
    for step in steps:
        assert step["block_m"] == 16 and step["query_len"] > 1
        assert step["block_q"] == 16 * step["num_kv_heads"] // step["num_q_heads"]
        assert (step["shared_bytes_unpatched"], step["shared_bytes_patched"]) == expected_step_bytes(step)
        assert step["ok"] and step["model_bytes"] == step["shared_bytes_patched"]
    assert {x["path"] for x in steps if x["case"] in ("verify-16", "verify-batch")} == {"2d"}
    drafter = [x for x in launches if x["role"] == "drafter"]
    assert {x["model"] for x in drafter} == {"E2B", "E4B", "12B", "26B-A4B", "31B"}  # every size has one
    assert all(x["ok"] and x["shared_bytes_patched"] <= 65_536 for x in drafter)


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


def test_verify_covers_speculative_decoding_shapes():
    from gemma4_t4.catalog.assistants import ASSISTANTS
    from gemma4_t4.catalog.family import VARIANTS
    from gemma4_t4.foundation.launch_record import VLLMSettings

    # the longest draft a launch accepts: num_draft_tokens' upper limit
    (most,) = [m.le for m in VLLMSettings.model_fields["num_draft_tokens"].metadata if hasattr(m, "le")]
    assert tuple(VERIFY_DRAFT_TOKENS) == (1, 2, 3, 4, 5, 6, most)
    shapes = gemma4_attention_shapes()
    drafters = [s for s in shapes if s.role == "drafter"]
    sizes = {VARIANTS[variant].size for variant, _build in ASSISTANTS}
    assert {s.model for s in drafters} == sizes and len(drafters) == 2 * len(sizes)
    for drafter in drafters:  # Q-only layers over the target's KV cache: the target's layer shape
        target = next(s for s in shapes if s.role == "target" and (s.model, s.layer) == (drafter.model,
                                                                                              drafter.layer))
        assert (drafter.head_size, drafter.num_kv_heads, drafter.sliding_window) == (
            target.head_size, target.num_kv_heads, target.sliding_window)
    assert [s for s in gemma4_attention_shapes(drafters=False) if s.role == "drafter"] == []


def test_verification_steps_are_capped_like_prefill():
    """The recorded launches (no compile): what the tile cap chooses for N+1 query tokens per sequence."""
    from gemma4_t4.turing import smem, tilecap
    from gemma4_t4.turing.offline import load_kernel_module

    kernel = load_kernel_module(capability=(7, 5))
    shapes = [s for s in gemma4_attention_shapes() if s.model in ("E2B", "12B") or s.role == "drafter"]
    before = capture_attention_launches(kernel, shapes)
    t4 = {"platform": "cuda", "name": "sm_75 target", "capability": (7, 5), "limit": 65_536, "limit_source": "target"}
    outcome = tilecap.install(kernel.module, origin="test", device=t4, vllm_version=kernel.vllm_version, log=False)
    assert outcome["action"] == "capped"
    after = capture_attention_launches(kernel, shapes)
    steps = [(b, a) for b, a in zip(before, after, strict=True) if b["case"].startswith("verify-")]
    assert len(steps) == len(shapes) * (len(VERIFY_DRAFT_TOKENS) + 1)
    for b, a in steps:
        shape, unpatched, patched = a["shape"], b["kwargs"], a["kwargs"]
        draft_tokens = 3 if a["case"] == "verify-batch" else int(a["case"].removeprefix("verify-"))
        assert a["query_len"] == draft_tokens + 1
        assert patched["BLOCK_M"] == 16
        assert patched["BLOCK_Q"] == 16 // (shape.num_q_heads // shape.num_kv_heads)
        need = smem.attention_smem_bytes(patched["TILE_SIZE"], patched["BLOCK_M"], shape.head_size)
        assert need <= 65_536
        if not patched["IS_3D"]:  # 2D: TILE_SIZE_PREFILL, 32, capped to 16 at head 512
            assert unpatched["TILE_SIZE"] == 32
            assert (patched["TILE_SIZE"], need) == ((16, 65_536) if shape.head_size == 512 else (32, 49_152))
        else:  # 3D (vLLM 0.33, up to 8 query tokens): TILE_SIZE_DECODE already fits
            assert a["query_len"] <= 8 and patched["TILE_SIZE"] == unpatched["TILE_SIZE"]


def test_arch_parsing_and_missing_triton(monkeypatch):
    assert parse_arch("sm_75") == parse_arch("sm75") == parse_arch("7.5") == (7, 5)
    assert parse_arch("sm_100") == (10, 0)
    with pytest.raises(Gemma4T4Error, match="unknown architecture"):
        parse_arch("turing")
    monkeypatch.setitem(sys.modules, "triton", None)  # "import triton" now fails, as when it is missing
    with pytest.raises(Gemma4T4Error, match="Triton is not installed") as info:
        verify("sm_75")
    assert "pip install 'triton==3.8.0'" in info.value.fix
