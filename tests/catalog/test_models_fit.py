"""The memory-fit calculator: what fits a T4, multi-T4 tensor parallelism, host RAM to load."""

from __future__ import annotations

import pytest

from gemma4_t4.catalog.family import FORMATS, GiB
from gemma4_t4.catalog.models import (
    fit,
    fit_table,
    kv_cache_bytes_per_sequence,
    largest_fitting,
    load_ram,
    weights_estimate,
)
from gemma4_t4.errors import Gemma4T4Error


def test_12b_is_the_largest_that_fits_one_t4():
    table = fit_table("t4", context_len=8192)
    assert len(table) == 5 * len(FORMATS)
    best = largest_fitting(table)
    assert best is not None and best.model == "12b"
    assert fit("12b", "qat-w4a16", "t4").fits
    assert fit("12b", "emb4", "t4").fits
    assert not fit("12b", "bf16", "t4").fits


@pytest.mark.parametrize("fmt", FORMATS)
def test_26b_a4b_fits_one_t4_in_no_format(fmt):
    # Published: OOM at load, even with a 1k context.
    for util in (0.9, 0.95):
        r = fit("26b-a4b", fmt, "t4", context_len=1024, gpu_memory_utilization=util)
        assert not r.fits and not r.weights_fit
        assert r.kv_token_capacity == 0 and r.max_context_fits == 0
        assert "does not fit" in r.verdict
    assert not fit("31b", fmt, "t4", context_len=1024).fits


def test_26b_a4b_fits_4x_t4_with_tensor_parallelism():
    r = fit("26b-a4b", "qat-w4a16", "t4", context_len=8192, num_gpus=4)
    assert r.fits and r.weights_gib < fit("26b-a4b", "qat-w4a16", "t4").weights_gib / 3
    assert any("no Google -qat-w4a16-ct" in n for n in r.notes)
    with pytest.raises(Gemma4T4Error, match="cannot be split"):
        fit("e2b", "bf16", "t4", num_gpus=3)


def test_e2b_bf16_runs_on_a_t4_at_16k():
    # Published: E2B bf16 (served as fp16, 9.8 GiB) runs on a T4 at 16k context.
    r = fit("e2b", "bf16", "t4", context_len=16384)
    assert r.fits
    assert r.weights_gib == pytest.approx(9.8, abs=0.1)
    assert any("fp16" in n for n in r.notes)


@pytest.mark.parametrize(
    "fmt, weights_gib, kv_tokens",
    [("bf16", 9.8, 315_974), ("qat-w4a16", 8.02, 519_568), ("emb4", 2.86, 1_099_362)],
)
def test_e2b_gce_t4_published_kv_tokens(fmt, weights_gib, kv_tokens):
    """GCE T4 sweep: 16k context, 8 seqs, utilisation 0.9. Our estimate lands within ~10 %."""
    r = fit("e2b", fmt, "t4", context_len=16384, max_num_seqs=8, gpu_memory_utilization=0.9)
    assert r.weights_gib == pytest.approx(weights_gib, rel=0.02)
    assert r.kv_token_capacity == pytest.approx(kv_tokens, rel=0.11)


def test_12b_loaded_weights_published():
    assert fit("12b", "qat-w4a16").weights_gib == pytest.approx(8.28, rel=0.05)
    assert fit("12b", "emb4").weights_gib == pytest.approx(7.36, rel=0.05)


def test_kv_cache_per_sequence_rules():
    # Sliding layers stop growing at window + batched tokens; KV-shared layers add nothing.
    small, big = (kv_cache_bytes_per_sequence("e2b", n) for n in (8192, 16384))
    full_layer_token = 2 * 1 * 512 * 2  # K and V, 1 head, dim 512, fp16
    assert big - small == 3 * full_layer_token * 8192  # only the 3 non-shared full layers grow
    # KV heads split over tensor-parallel ranks; a single head is replicated.
    assert kv_cache_bytes_per_sequence("31b", 8192, tensor_parallel=4) * 4 == kv_cache_bytes_per_sequence("31b", 8192)
    assert kv_cache_bytes_per_sequence("e2b", 8192, tensor_parallel=4) == small


def test_max_context_is_consistent():
    r = fit("e4b", "qat-w4a16", "t4", context_len=8192)
    assert r.fits and 8192 <= r.max_context_fits < 131_072
    assert fit("e4b", "qat-w4a16", "t4", context_len=r.max_context_fits).fits
    assert not fit("e4b", "qat-w4a16", "t4", context_len=r.max_context_fits + 1024).fits
    assert "max context" in fit("e4b", "qat-w4a16", "t4", context_len=r.max_context_fits + 1024).verdict


def test_more_memory_more_kv():
    t4 = fit("e2b", "qat-w4a16", "t4")
    l4 = fit("e2b", "qat-w4a16", "l4")
    assert l4.kv_token_capacity > t4.kv_token_capacity
    assert fit("e2b", "qat-w4a16", "t4", gpu_memory_utilization=0.8).kv_token_capacity < t4.kv_token_capacity
    assert fit("e2b", "qat-w4a16", "t4", text_only=True).weights_gib < t4.weights_gib


def test_bad_input():
    with pytest.raises(Gemma4T4Error):
        fit("e2b", "bf16", "t4", gpu_memory_utilization=1.5)
    with pytest.raises(Gemma4T4Error):
        fit("e2b", "bf16", "t4", context_len=0)
    with pytest.raises(Gemma4T4Error, match="unknown GPU"):
        fit("e2b", "bf16", "v100")


def test_load_ram_and_swap_advice():
    # The series' 7.8 GB n1-standard-2 was OOM-killed loading E2B bf16 without swap.
    r = load_ram("e2b", "bf16", host_ram_gib=7.26)
    assert r.swap_needed_gib > 0 and "swap" in r.advice
    assert r.peak_ram_gib == pytest.approx(7.26 + 6.5, abs=1.0)  # RAM peak + published swap peak
    assert load_ram("e2b", "qat-w4a16").peak_ram_gib < r.peak_ram_gib
    assert load_ram("e2b", "bf16", host_ram_gib=32).swap_needed_gib == 0


def test_checkpoint_sizes_published():
    assert weights_estimate("e2b", "qat-w4a16").checkpoint_bytes / 1e9 == pytest.approx(8.316, abs=0.01)
    assert weights_estimate("26b-a4b", "bf16").checkpoint_bytes / 1e9 == pytest.approx(51.6, rel=0.01)
    assert weights_estimate("e2b", "emb4").total_bytes / GiB == pytest.approx(2.86 - 0.25, abs=0.05)
