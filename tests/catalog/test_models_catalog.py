"""The Gemma 4 catalog: lookup by name, hub ids, and parameter counts derived from the shapes."""

from __future__ import annotations

import pytest

from gemma4_t4.catalog.family import VARIANTS, get_variant, normalize_format
from gemma4_t4.catalog.models import linear_counts, model_info, param_breakdown
from gemma4_t4.errors import Gemma4T4Error


@pytest.mark.parametrize(
    "name, key",
    [("e2b", "e2b"), ("E2B", "e2b"), ("gemma-4-e2b", "e2b"), ("google/gemma-4-E2B-it", "e2b"),
     ("google/gemma-4-E4B-it-qat-w4a16-ct", "e4b"), ("gemma4-12b", "12b"), ("26B", "26b-a4b"),
     ("26b-a4b", "26b-a4b"), ("Gemma 4 31B", "31b"), ("xbill9/gemma-4-12B-it-qat-q4_0-w4a16-ct-text-emb4", "12b")],
)
def test_flexible_names(name, key):
    assert get_variant(name).key == key


def test_unknown_name_lists_valid_names():
    with pytest.raises(Gemma4T4Error) as err:
        get_variant("gemma-4-7b")
    assert "e2b" in err.value.fix and "26b-a4b" in err.value.fix


def test_format_aliases_and_error():
    assert normalize_format("QAT") == "qat-w4a16"
    assert normalize_format("fp16") == "bf16"
    assert normalize_format("q4_0-unquantized") == "bf16"
    with pytest.raises(Gemma4T4Error, match="unknown format"):
        normalize_format("gguf")


def test_family_facts():
    e2b = VARIANTS["e2b"]
    assert e2b.layer_types().count("full_attention") == 7
    assert [i for i, t in enumerate(e2b.layer_types()) if t == "full_attention"] == [4, 9, 14, 19, 24, 29, 34]
    assert not e2b.is_kv_shared(14) and e2b.is_kv_shared(15)
    assert [v.num_full_layers for v in VARIANTS.values()] == [7, 7, 8, 5, 10]
    for v in VARIANTS.values():
        assert (v.head_dim, v.global_head_dim, v.vocab_size, v.tie_word_embeddings) == (256, 512, 262_144, True)
        assert v.layer_types()[-1] == "full_attention"


def test_hub_ids():
    assert VARIANTS["e2b"].hub.bf16 == "google/gemma-4-E2B-it"
    assert VARIANTS["12b"].hub.qat_w4a16_ct == "google/gemma-4-12B-it-qat-w4a16-ct"
    assert VARIANTS["26b-a4b"].hub.qat_w4a16_ct is None  # Google published none
    assert VARIANTS["26b-a4b"].hub.qat_q4_0_unquantized == "google/gemma-4-26B-A4B-it-qat-q4_0-unquantized"


def test_published_shapes():
    # E2B layer-0 q_proj is 2048 x 1536; 26B's is 4096 x 2816 = 11,534,336.
    v = VARIANTS["26b-a4b"]
    assert v.hidden_size * v.num_q_heads * v.head_dim == 11_534_336
    assert VARIANTS["e2b"].num_q_heads * VARIANTS["e2b"].head_dim == 2048


@pytest.mark.parametrize("key", list(VARIANTS))
def test_derived_params_match_published(key):
    p = param_breakdown(key)
    assert p.total == pytest.approx(p.published.total * 1e9, rel=0.002)
    if p.published.body is not None:  # E2B / E4B splits
        assert p.body / 1e9 == pytest.approx(p.published.body, abs=0.001)
        assert p.embed / 1e9 == pytest.approx(p.published.embed, abs=0.001)
        assert p.ple / 1e9 == pytest.approx(p.published.ple, abs=0.001)


def test_moe_active_params():
    p = param_breakdown("26b-a4b")
    assert p.active_per_token / 1e9 == pytest.approx(3.8, abs=0.05)


def test_linear_counts_equal_transformers_modules():
    """The analytic shapes equal transformers' own Gemma 4 text model, built on the meta device."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for v in VARIANTS.values():
        kw = dict(
            vocab_size=v.vocab_size, vocab_size_per_layer_input=v.vocab_size, hidden_size=v.hidden_size,
            intermediate_size=v.intermediate_size, num_hidden_layers=v.num_layers,
            num_attention_heads=v.num_q_heads, num_key_value_heads=v.num_kv_heads_sliding,
            head_dim=v.head_dim, global_head_dim=v.global_head_dim,
            num_global_key_value_heads=v.num_kv_heads_global, hidden_size_per_layer_input=v.ple_dim_per_layer,
            sliding_window=v.sliding_window, layer_types=v.layer_types(), attention_k_eq_v=v.attention_k_eq_v,
            num_kv_shared_layers=v.num_kv_shared_layers, use_double_wide_mlp=v.double_wide_mlp_in_kv_shared,
            tie_word_embeddings=True,
        )
        if v.moe:
            kw.update(enable_moe_block=True, num_experts=v.moe.num_experts, top_k_experts=v.moe.top_k,
                      moe_intermediate_size=v.moe.expert_intermediate_size)
        with torch.device("meta"):
            model = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**kw))
        linears = sum(p.numel() for n, p in model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n)
        assert linears == linear_counts(v).resident, v.key
        b = param_breakdown(v)
        assert sum(p.numel() for p in model.parameters()) == b.body + b.embed + b.ple, v.key


def test_model_info_is_complete():
    info = model_info("e4b")
    assert info.kv_shared_layers == 18 and info.ple.startswith("262144 x 10752")
    assert info.hub.qat_w4a16_ct.endswith("-qat-w4a16-ct")
    assert set(info.decode_bytes_gb) == {"bf16", "qat-w4a16", "emb4"}
