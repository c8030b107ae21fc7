"""Bytes per decoded token and the decode roofline against the series' published figures."""

from __future__ import annotations

import pytest

from gemma4_t4.catalog.hardware import get_gpu
from gemma4_t4.catalog.models import decode_bytes_per_token, decode_roofline, kv_read_bytes_per_token
from gemma4_t4.errors import Gemma4T4Error


def test_e2b_bytes_per_token_published():
    bf16 = decode_bytes_per_token("e2b", "bf16")
    qat = decode_bytes_per_token("e2b", "qat-w4a16")
    emb4 = decode_bytes_per_token("e2b", "emb4")
    assert bf16.weights_gb == pytest.approx(4.597, abs=0.0006)
    assert qat.weights_gb == pytest.approx(1.862, abs=0.0006)
    assert emb4.weights_gb == pytest.approx(1.29, abs=0.006)
    # The published derivation's terms: N_lin 1,895.7 M (bf16 checkpoint), N_emb 402.7 M.
    assert bf16.linear_params / 1e6 == pytest.approx(1895.7, abs=0.05)
    assert bf16.embed_params / 1e6 == pytest.approx(402.7, abs=0.05)
    assert qat.linear_bytes / 1e9 == pytest.approx(1.056, abs=0.0006)  # the ct file's int4 body
    assert emb4.linear_bytes / 1e9 == pytest.approx(1.066, abs=0.0006)


def test_more_bits_more_bytes_for_every_size():
    for key in ("e2b", "e4b", "12b", "26b-a4b", "31b"):
        b = [decode_bytes_per_token(key, f).weights_bytes for f in ("bf16", "qat-w4a16", "emb4")]
        assert b[0] > b[1] > b[2], key


@pytest.mark.parametrize(
    "fmt, gpu, expected",
    [("bf16", "t4", 69.6), ("qat-w4a16", "t4", 171.9), ("bf16", "l4", 65.3),
     ("qat-w4a16", "l4", 161.1), ("emb4", "t4", 248)],
)
def test_roofline_table(fmt, gpu, expected):
    r = decode_roofline("e2b", fmt, gpu)
    assert r.tok_s_spec == pytest.approx(expected, abs=0.6 if expected > 200 else 0.06)


def test_roofline_measured_bandwidth():
    t4 = get_gpu("t4")
    assert t4.measured_bandwidth_gb_s == 277.0
    assert decode_roofline("e2b", "bf16", "t4").tok_s_measured == pytest.approx(60.3, abs=0.05)
    assert decode_roofline("e2b", "qat-w4a16", "t4").tok_s_measured == pytest.approx(148.8, abs=0.05)
    assert decode_roofline("e2b", "bf16", "l4").tok_s_measured is None
    # The series' measured T4 QAT stream (72.31 tok/s) sits well under the ceiling.
    assert decode_roofline("e2b", "qat-w4a16", "t4").tok_s_spec > 72.31


def test_kv_reads_published_estimates():
    assert kv_read_bytes_per_token("e2b", 640) / 1e6 == pytest.approx(24, abs=0.5)
    assert kv_read_bytes_per_token("e2b", 4200) / 1e6 == pytest.approx(75, abs=0.5)
    assert kv_read_bytes_per_token("e2b", 16384) / 1e6 == pytest.approx(250, abs=1)
    with_kv = decode_roofline("e2b", "qat-w4a16", "t4", context_len=16384)
    assert with_kv.tok_s_spec < decode_roofline("e2b", "qat-w4a16", "t4").tok_s_spec
    with pytest.raises(Gemma4T4Error):
        kv_read_bytes_per_token("e2b", -1)


def test_moe_reads_only_active_experts():
    moe = decode_bytes_per_token("26b-a4b", "bf16")
    dense = decode_bytes_per_token("31b", "bf16")
    assert moe.weights_bytes < dense.weights_bytes / 7  # ~3.8 B of 25.8 B read per token
