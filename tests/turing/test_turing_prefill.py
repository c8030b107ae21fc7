"""The tensor-core prefill route without a GPU: which layers and batches go where, the split of
mixed steps, K/V from arguments or from the paged cache, every fallback, install and verdicts.

Steps are built like vLLM's (``prefill_bench.make_step``: TritonAttentionMetadata's fields,
vLLM's cache layout, shuffled block tables). On CPU the tensor-core kernel is replaced by the same
function in float32 PyTorch (``fakes.packed_attention``) and vLLM's Triton kernel, which
cannot run here, by a float32 paged-attention stand-in (``paged_forward`` below); the GPU test
(tests/turing/test_turing_prefill_gpu.py) runs both real kernels.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from fakes.packed_attention import reference_attention as packed_reference  # noqa: E402

from gemma4_t4.foundation.cache import CACHE_ENV  # noqa: E402
from gemma4_t4.turing import plugin, prefill, tilecap  # noqa: E402
from gemma4_t4.turing import prefill_bench as pb  # noqa: E402
from gemma4_t4.turing.numerics import reference_attention as paged_reference  # noqa: E402
from gemma4_t4.turing.verify import AttentionShape  # noqa: E402

GLOBAL = AttentionShape("E2B", "global", 512, 8, 1, None)
SLIDING = AttentionShape("E4B", "sliding", 256, 8, 2, 16)
MIXED = (
    [1, 30, 1, 20, 8, 1, 12],
    [50, 30, 61, 20, 40, 9, 12],
)  # decode, new, decode, new, chunk, decode, new


def vllm_root() -> Path:
    """The release under test: GEMMA4_T4_VLLM_ROOT (a ``vllm`` package folder unpacked from a wheel), else the
    installed vLLM. Run this file with GEMMA4_T4_VLLM_ROOT set to check a release before it joins
    ``prefill.TESTED_VLLM_SERIES``."""
    import importlib.util

    from gemma4_t4.turing.offline import find_vllm_root

    if os.environ.get("GEMMA4_T4_VLLM_ROOT") is None and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    return find_vllm_root(os.environ.get("GEMMA4_T4_VLLM_ROOT"))


def vllm_triton_attn_file() -> Path:
    return vllm_root() / "v1/attention/backends/triton_attn.py"


def release_version() -> str:
    from gemma4_t4.turing.offline import read_vllm_version

    return read_vllm_version(vllm_root())


class Recorder:
    """Stand-in for vLLM's Triton forward (float32 paged attention); records what it was given."""

    def __init__(self):
        self.calls = []

    def __call__(
        self,
        impl,
        layer,
        query,
        key,
        value,
        kv_cache,
        attn_metadata,
        output,
        output_scale=None,
        output_block_scale=None,
    ):
        lens, seq_lens = prefill.host_lengths(attn_metadata)
        self.calls.append(
            {
                "query_lens": list(lens),
                "seq_lens": list(seq_lens),
                "tokens": query.shape[0],
                "key_is_none": key is None,
            }
        )
        key_cache, value_cache = prefill.split_kv_cache(kv_cache, impl.head_size)
        case = SimpleNamespace(
            q=query[: attn_metadata.num_actual_tokens],
            key_cache=key_cache,
            value_cache=value_cache,
            block_table=attn_metadata.block_table,
            query_lens=lens,
            context_lens=seq_lens,
            num_q_heads=impl.num_heads,
            num_kv_heads=impl.num_kv_heads,
            head_size=impl.head_size,
            sliding_window=prefill._window(impl),
            softmax_scale=impl.scale,
        )
        output[: attn_metadata.num_actual_tokens] = paged_reference(case).to(output.dtype)
        return output


class SpyAttention:
    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def __call__(self, q, k, v, cu, max_len, scale, window):
        self.calls.append(
            {
                "tokens": q.shape[0],
                "cu": cu.tolist(),
                "max_len": max_len,
                "window": window,
                "k_heads": k.shape[1],
            }
        )
        if self.fail is not None:
            raise self.fail
        return packed_reference(q, k, v, cu, max_len, scale, window)


def on(impl):
    return True, 0, "test"


def route_with(attention=None, policy=on):
    lines = []
    route = prefill.PrefillRoute(
        policy=policy, attention=attention or SpyAttention(), log=lambda level, msg: lines.append(msg)
    )
    route.lines = lines
    return route


def run(route, step, original, **kw):
    output = torch.full_like(step.query, float("nan"))
    route.forward(
        original,
        step.impl,
        None,
        step.query,
        step.key,
        step.value,
        step.kv_cache,
        step.metadata,
        output,
        **kw,
    )
    return output


# ----------------------------------------------------------------------------- batch planning


def test_plan_splits_new_prompts_from_decode_and_cached_context():
    routed, rest = prefill.plan_batch(*MIXED)
    assert routed == [1, 3, 6] and rest == [0, 2, 4, 5]
    assert prefill.plan_batch([1], [1]) == ([], [0])  # a one-token prompt: nothing to gain
    assert prefill.plan_batch([30, 20], [30, 20], min_tokens=25) == ([0], [1])


def test_host_lengths_syncs_once_per_metadata_object():
    step = pb.make_step(GLOBAL, *MIXED, device="cpu")
    first = prefill.host_lengths(step.metadata)
    assert first == (MIXED[0], MIXED[1])
    step.metadata.query_start_loc = None  # a second read would fail: the cached lists are used
    assert prefill.host_lengths(step.metadata) is first


# ----------------------------------------------------------------------------- numerics of the split


@pytest.mark.parametrize("shape", [GLOBAL, SLIDING], ids=["global-512", "sliding-256-window16"])
@pytest.mark.parametrize("shared_kv", [False, True], ids=["kv-args", "kv-from-cache"])
def test_mixed_step_equals_the_reference_with_prompts_routed(shape, shared_kv):
    step = pb.make_step(shape, *MIXED, device="cpu", seed=7, shared_kv=shared_kv)
    original, attention = Recorder(), SpyAttention()
    route = route_with(attention)
    output = run(route, step, original)
    expected = paged_reference(step.case)
    assert torch.isfinite(output).all()  # every token row written (the buffer was NaN)
    assert (output.float() - expected).abs().max() < 4e-3
    # the kernel saw exactly the three new prompts, packed; the GQA heads expanded
    assert attention.calls == [
        {
            "tokens": 62,
            "cu": [0, 30, 50, 62],
            "max_len": 30,
            "window": shape.sliding_window,
            "k_heads": shape.num_q_heads,
        }
    ]
    # vLLM's forward saw only the rest: decode tokens and the chunk with cached context
    assert original.calls == [
        {"query_lens": [1, 1, 8, 1], "seq_lens": [50, 61, 40, 9], "tokens": 11, "key_is_none": shared_kv}
    ]
    assert route.counts["routed_sequences"] == 3 and route.counts["fallback_steps"] == 0


def test_contiguous_prompts_only_skip_vllm_forward():
    step = pb.make_step(GLOBAL, [40, 25], [40, 25], device="cpu", seed=3)
    original = Recorder()
    output = run(route_with(), step, original)
    assert original.calls == []
    assert (output.float() - paged_reference(step.case)).abs().max() < 4e-3


def test_gather_reads_prompts_through_a_shuffled_block_table():
    step = pb.make_step(GLOBAL, *MIXED, device="cpu", seed=11)
    key_cache, value_cache = prefill.split_kv_cache(step.kv_cache, 512)
    k, v = prefill.gather_prompt_kv(key_cache, value_cache, step.metadata.block_table, [1, 3], [30, 20])
    starts = [sum(MIXED[0][:i]) for i in (1, 3)]
    assert torch.equal(
        k, torch.cat([step.key[starts[0] : starts[0] + 30], step.key[starts[1] : starts[1] + 20]])
    )
    assert torch.equal(
        v, torch.cat([step.value[starts[0] : starts[0] + 30], step.value[starts[1] : starts[1] + 20]])
    )
    assert len(set(step.metadata.block_table[1, :2].tolist())) == 2  # two different, shuffled blocks


def test_reference_window_counts_the_query_itself():
    q = k = v = torch.randn(40, 1, 8)
    cu = torch.tensor([0, 40], dtype=torch.int32)
    one = packed_reference(q, k, v, cu, 40, 1.0, 1)
    assert torch.allclose(one, v)  # window 1: each query sees only itself


# ----------------------------------------------------------------------------- fallbacks


def assert_all_triton(route, step, original, attention, **kw):
    output = run(route, step, original, **kw)
    assert attention.calls == [] and len(original.calls) == 1
    assert original.calls[0]["tokens"] == step.query.shape[0]
    return output


def test_decode_only_step_never_syncs_or_routes():
    step = pb.make_step(GLOBAL, [1, 1, 1], [5, 40, 17], device="cpu")
    seen = []

    def vllm_forward(impl, layer, query, key, value, kv_cache, md, output, *a):
        seen.append(getattr(md, prefill.HOST_LENGTHS_ATTR, None))  # the route read no lengths
        return output.zero_()

    attention = SpyAttention()
    route = route_with(attention)
    run(route, step, vllm_forward)
    assert attention.calls == [] and seen == [None]
    assert all("decode-only" not in line for line in route.lines)  # the common case logs nothing


@pytest.mark.parametrize(
    "change,reason",
    [
        (lambda s: setattr(s, "query", s.query.float()), "query dtype torch.float32"),
        (lambda s: setattr(s.metadata, "causal", torch.tensor([True])), "non-causal"),
        (lambda s: setattr(s.metadata, "mm_prefix_range_tensor", torch.zeros(1, 2)), "multimodal prefix"),
        (lambda s: setattr(s.metadata, "rswa_prefix_lens", torch.zeros(1)), "RSWA"),
        (lambda s: setattr(s.metadata, "use_cascade", True), "cascade attention"),  # vLLM 0.31's field
    ],
)
def test_unsupported_batches_stay_on_triton(change, reason):
    step = pb.make_step(GLOBAL, [24], [24], device="cpu")
    change(step)
    attention, original = SpyAttention(), Recorder()
    route = route_with(attention)
    assert_all_triton(route, step, original, attention)
    assert any(reason in line for line in route.lines), route.lines


def test_fused_output_quantisation_stays_on_triton():
    step = pb.make_step(GLOBAL, [24], [24], device="cpu")
    attention, original = SpyAttention(), Recorder()
    assert_all_triton(route_with(attention), step, original, attention, output_scale=torch.ones(1))


def test_cached_context_chunks_stay_on_triton():
    step = pb.make_step(GLOBAL, [16, 8], [48, 20], device="cpu")
    attention, original = SpyAttention(), Recorder()
    assert_all_triton(route_with(attention), step, original, attention)


@pytest.mark.parametrize(
    "attr,value,reason",
    [
        ("kv_cache_dtype", "fp8_e4m3", "KV cache dtype"),
        ("_is_per_token_head_quant", True, "KV cache dtype"),
        ("logits_soft_cap", 30.0, "soft-capping"),
        ("sinks", "x", "sinks"),
        ("alibi_slopes", "x", "ALiBi"),
        ("attn_type", "encoder_only", "not decoder"),
        ("chunk_lookback", 8, "chunked local"),
        ("sliding_window", (15, 15), "not causal-left"),
    ],
)
def test_unsupported_layers_stay_on_triton_and_say_why(attr, value, reason):
    step = pb.make_step(GLOBAL, [24], [24], device="cpu")
    setattr(step.impl, attr, value)
    attention, original = SpyAttention(), Recorder()
    route = route_with(attention)
    decision = route.layer_decision(step.impl)
    assert decision[0] is False and reason in decision[2]
    if attr != "sliding_window":  # the stand-in cannot compute a two-sided window
        assert_all_triton(route, step, original, attention)
    assert sum(reason in line and "Triton" in line for line in route.lines) == 1, route.lines


def test_head_sizes_that_are_not_multiples_of_8_stay_on_triton():
    impl = pb.FakeImpl(8, 100, 1, (-1, -1))
    assert "not a multiple of 8" in prefill.layer_problem(impl)
    assert prefill.layer_problem(pb.FakeImpl(8, 512, 1, (-1, -1))) is None
    assert prefill.layer_problem(pb.FakeImpl(8, 256, 2, (511, 0))) is None


def test_out_of_memory_falls_back_for_that_step_and_logs_once():
    step = pb.make_step(GLOBAL, *MIXED, device="cpu", seed=5)
    attention, original = SpyAttention(fail=torch.cuda.OutOfMemoryError("CUDA out of memory")), Recorder()
    route = route_with(attention)
    for _ in range(2):
        original.calls.clear()
        output = run(route, step, original)
        assert (output.float() - paged_reference(step.case)).abs().max() < 4e-3
        assert original.calls[-1]["tokens"] == step.query.shape[0]  # the whole step on Triton
    assert len(attention.calls) == 2  # tried again next step: OOM is transient
    assert sum("out of memory" in line for line in route.lines) == 1
    assert route.counts["fallback_steps"] == 2


def test_a_kernel_error_falls_back_and_retires_the_route_for_that_layer():
    step = pb.make_step(GLOBAL, [24], [24], device="cpu")
    attention, original = SpyAttention(fail=RuntimeError("No available kernel")), Recorder()
    route = route_with(attention)
    for _ in range(3):
        assert torch.isfinite(run(route, step, original)).all()
    assert len(attention.calls) == 1 and len(original.calls) == 3
    assert sum("failed for head 512" in line for line in route.lines) == 1


def test_a_planning_error_never_reaches_the_engine():
    step = pb.make_step(GLOBAL, [24], [24], device="cpu")
    step.metadata.seq_lens = None  # something the route cannot read
    attention, original = SpyAttention(), Recorder()
    route = route_with(attention)
    step.metadata.__dict__[prefill.HOST_LENGTHS_ATTR] = None
    original_fn = original

    def safe_original(impl, layer, query, key, value, kv_cache, md, output, *a):
        output.zero_()
        original_fn.calls.append({"tokens": query.shape[0]})
        return output

    out = run(route, step, safe_original)
    assert attention.calls == [] and len(original.calls) == 1 and torch.equal(out, torch.zeros_like(out))
    assert any("planning failed" in line for line in route.lines)


def test_profiling_run_goes_straight_to_vllm():
    called = []
    attention = SpyAttention()
    route = route_with(attention)
    result = route.forward(
        lambda *a: called.append(a) or "vllm",
        SimpleNamespace(),
        None,
        None,
        None,
        None,
        None,
        None,
        torch.empty(1),
    )
    # vLLM's own kernel ran exactly once, with the arguments it was given, and the route neither
    # planned nor ran its tensor-core attention for the profiling step (no metadata, no KV cache)
    assert result == "vllm" and len(called) == 1 and called[0][0] is not None
    assert attention.calls == [] and route.lines == []


# ----------------------------------------------------------------------------- policy and verdicts


def key():
    return {"gpu": "Tesla T4", "capability": "sm_75", "torch": "2.14.0", "triton": "3.8.0", "vllm": "0.33.0"}


def test_no_verdict_means_off_until_measured_and_says_how_to_measure(monkeypatch):
    monkeypatch.delenv(prefill.ENV_SWITCH, raising=False)
    policy = prefill.VerdictPolicy(key_fn=key, loader=lambda k: None)
    on_, min_tokens, why = policy(SimpleNamespace(head_size=512))
    assert not on_ and min_tokens == 0 and "bench-prefill" in why and prefill.ENV_SWITCH in why
    monkeypatch.setenv(prefill.ENV_SWITCH, "1")
    assert policy(SimpleNamespace(head_size=512))[0]  # forced on for an experiment


def test_verdict_decides_per_head_size_and_minimum_length(monkeypatch, tmp_path):
    from gemma4_t4.foundation.atomic import atomic_write_json

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(prefill.ENV_SWITCH, raising=False)
    heads = {
        "512": {"use_route": True, "min_tokens": 1024, "why": "4x"},
        "256": {"use_route": False, "min_tokens": 0, "why": "slower"},
    }
    atomic_write_json(prefill.verdict_path(key()), {"key": key(), "heads": heads})
    assert prefill.load_verdict(key())["heads"] == heads
    assert prefill.load_verdict({**key(), "torch": "2.15.0"}) is None  # new versions: measure again
    policy = prefill.VerdictPolicy(key_fn=key)
    assert policy(SimpleNamespace(head_size=512))[:2] == (True, 1024)
    assert policy(SimpleNamespace(head_size=256))[0] is False
    route = route_with(policy=policy)
    short = pb.make_step(GLOBAL, [600, 1], [600, 80], device="cpu")  # below min_tokens: all Triton
    attention, original = SpyAttention(), Recorder()
    route.attention = attention
    run(route, short, original)
    assert attention.calls == [] and original.calls[0]["tokens"] == 601
    sliding = pb.make_step(SLIDING, [40], [40], device="cpu")
    run(route, sliding, original)
    assert attention.calls == []
    monkeypatch.setenv(prefill.ENV_SWITCH, "1")  # force: the verdict is ignored
    assert prefill.VerdictPolicy(key_fn=key)(SimpleNamespace(head_size=256))[0] is True


def test_decide_needs_speed_from_a_length_up_and_accuracy_everywhere():
    def row(head, n, route_ms, triton_ms, route_err=1e-3, triton_err=1e-3):
        return {
            "head_size": head,
            "seq_len": n,
            "route_ms": route_ms,
            "triton_ms": triton_ms,
            "route_max_abs_err": route_err,
            "triton_max_abs_err": triton_err,
            "route_finite": True,
        }

    rows = [
        row(512, 512, 2, 1),
        row(512, 1024, 1, 2),
        row(512, 2048, 1, 5),
        row(256, 512, 1, 2),
        row(256, 1024, 1, 2, route_err=9e-3),
        row(128, 512, 1, 2),
        row(128, 1024, 3, 2),
    ]
    verdict = pb.decide(rows)
    assert verdict["512"]["use_route"] and verdict["512"]["min_tokens"] == 1024
    assert not verdict["256"]["use_route"] and "error" in verdict["256"]["why"]
    assert not verdict["128"]["use_route"]  # slower at the longest prompt
    assert pb.decide([row(512, 512, 1, 2), row(512, 4096, 1, 9)])["512"]["min_tokens"] == 0


# ----------------------------------------------------------------------------- structure and install


def test_installed_vllm_forward_has_the_known_structure():
    assert prefill.structure_problem(vllm_triton_attn_file().read_text()) is None


@pytest.mark.parametrize(
    "edit,problem",
    [
        (("kv_cache.transpose(1, 2)", "kv_cache.permute(0, 2, 1, 3)"), "no longer splits"),
        (("window_size=self.sliding_window", "window_size=(-1, -1)"), "window_size"),
        (("softmax_scale=self.scale", "softmax_scale=1.0"), "softmax_scale"),
        (("def do_kv_cache_update(", "def _moved_kv_cache_update("), "do_kv_cache_update"),
        (
            (
                '        output_block_scale: torch.Tensor | None = None,\n    ) -> torch.Tensor:\n        """Forward',
                "        output_block_scale: torch.Tensor | None = None,\n        extra=None,\n    ) -> torch.Tensor:\n"
                '        """Forward',
            ),
            "forward takes",
        ),
        (("    rswa_prefix_lens: torch.Tensor | None = None\n", ""), "has no rswa_prefix_lens"),
    ],
)
def test_changed_forward_structures_are_refused(edit, problem):
    source = vllm_triton_attn_file().read_text()
    assert edit[0] in source
    assert problem in (prefill.structure_problem(source.replace(edit[0], edit[1], 1)) or "")


def test_forward_that_writes_the_cache_itself_is_refused():
    source = vllm_triton_attn_file().read_text()
    changed = source.replace(
        "        cu_seqlens_q = attn_metadata.query_start_loc\n",
        "        triton_reshape_and_cache_flash(key, value)\n"
        "        cu_seqlens_q = attn_metadata.query_start_loc\n",
        1,
    )
    assert "writes the KV cache itself" in prefill.structure_problem(changed)


T4 = {"platform": "cuda", "name": "Tesla T4", "capability": (7, 5), "limit": 65_536}


def fake_backend(tmp_path, source=None):
    path = tmp_path / "triton_attn.py"
    path.write_text(source if source is not None else vllm_triton_attn_file().read_text())

    class Impl:
        def forward(
            self,
            layer,
            query,
            key,
            value,
            kv_cache,
            attn_metadata,
            output=None,
            output_scale=None,
            output_block_scale=None,
        ):
            return "vllm"

    return SimpleNamespace(__file__=str(path), TritonAttentionImpl=Impl)


def test_install_on_t4_wraps_forward_once_and_logs_one_line(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(prefill.ENV_SWITCH, raising=False)
    module = fake_backend(tmp_path)
    original = module.TritonAttentionImpl.forward
    version = release_version()  # the release whose triton_attn.py the fake backend carries
    with caplog.at_level(logging.INFO, logger="vllm.gemma4_t4.turing"):
        outcome = prefill.install("test", device=T4, vllm_version=version, module=module)
    assert outcome["action"] == "routed", outcome
    wrapper = module.TritonAttentionImpl.forward
    assert wrapper is not original and getattr(wrapper, prefill.MARK) is not None
    prefill.install("test", device=T4, vllm_version=version, module=module, log=False)
    assert module.TritonAttentionImpl.forward is wrapper  # idempotent
    assert wrapper.__wrapped__ is original
    # a decode call goes through the wrapper to vLLM's own forward, unchanged
    metadata = SimpleNamespace(max_query_len=1, causal=True)
    impl = pb.FakeImpl(8, 512, 1, (-1, -1))
    assert (
        wrapper(
            impl,
            None,
            torch.zeros(1, 8, 512, dtype=torch.float16),
            None,
            None,
            None,
            metadata,
            torch.zeros(1, 8, 512),
        )
        == "vllm"
    )
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefill.LOG_PREFIX)]
    assert len(lines) == 1 and lines[0].startswith("gemma4-t4 turing prefill: routed:")
    assert f"vLLM {version}, via test" in lines[0]


@pytest.mark.parametrize("version", ["0.31.0+cu129", "0.31.0", "0.32.0", "0.33.0", "0.34.0"])
def test_the_cuda12_wheel_and_the_later_releases_pass_the_version_gate(version):
    # 0.31.0+cu129 is the CUDA-12 route's wheel (drivers 525-579, Colab); it and 0.34.0 (the PyPI wheel,
    # 2026-12-05) pass the structure check and this file's tests with GEMMA4_T4_VLLM_ROOT pointing at their files
    assert tilecap.untested_version(version, prefill.TESTED_VLLM_SERIES) is None


@pytest.mark.parametrize(
    "device,version,env,action,reason",
    [
        ({"platform": "cpu"}, "0.32.0", None, "no-change", "not CUDA"),
        ({"platform": "cuda", "capability": (8, 9)}, "0.33.0", None, "no-change", "sm_89"),
        (T4, "0.33.0", "0", "disabled", "GEMMA4_T4_TC_PREFILL=0"),
        (T4, "0.99.0", None, "refused", "not a tested version"),
        (T4, "0.30.0", None, "refused", "not a tested version"),  # a release whose triton_attn.py was never checked
    ],
)
def test_install_decisions(tmp_path, monkeypatch, device, version, env, action, reason):
    if env is None:
        monkeypatch.delenv(prefill.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(prefill.ENV_SWITCH, env)
    module = fake_backend(tmp_path)
    original = module.TritonAttentionImpl.forward
    outcome = prefill.install("test", device=device, vllm_version=version, module=module, log=False)
    assert outcome["action"] == action and reason in outcome["reason"], outcome
    assert module.TritonAttentionImpl.forward is original


def test_install_refuses_an_unknown_structure_with_one_log_line(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(prefill.ENV_SWITCH, raising=False)
    module = fake_backend(tmp_path, source="class TritonAttentionImpl:\n    pass\n")
    original = module.TritonAttentionImpl.forward
    logger = logging.getLogger("vllm.gemma4_t4.turing")
    handler = logging.NullHandler()
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="vllm.gemma4_t4.turing"):
            outcome = prefill.install("test", device=T4, vllm_version="0.33.0", module=module)
    finally:
        logger.removeHandler(handler)
    assert outcome["action"] == "refused" and "route stays off" in outcome["reason"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefill.LOG_PREFIX)]
    assert len(lines) == 1 and "refused" in lines[0]
    assert module.TritonAttentionImpl.forward is original


def test_plugin_reports_the_prefill_outcome_on_cpu(monkeypatch, caplog):
    from gemma4_t4.turing import tilecap

    monkeypatch.setattr(plugin, "_outcome", None)
    cpu = {"platform": "cpu", "capability": None, "limit": None}
    monkeypatch.setattr(tilecap, "current_device", lambda platform=None: dict(cpu))
    logger = logging.getLogger("vllm.gemma4_t4.turing")
    handler = logging.NullHandler()
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="vllm.gemma4_t4.turing"):
            plugin.register()
    finally:
        logger.removeHandler(handler)
    assert plugin.outcome()["action"] == "no-change"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefill.LOG_PREFIX)]
    assert len(lines) == 1 and lines[0].startswith(f"{prefill.LOG_PREFIX}: no-change"), lines


def test_bench_prefill_on_a_cpu_machine_says_it_needs_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible")
    from gemma4_t4.cli import main

    assert main(["turing", "bench-prefill", "--out", "/nonexistent/never-written"]) != 0
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "Traceback" not in err
    assert not Path("/nonexistent/never-written").exists()


# ----------------------------------------------------------------------------- notebook 4's TTFT curve


def test_ttft_on_off_starts_one_server_per_mode_and_records_what_the_route_did(tmp_path):
    """Against the FAKE OpenAI server (tests/fakes/fake_openai_server.py): the orchestration, not vLLM."""
    from fakes.fake_openai_server import FakeScript, FakeServer, FakeServerState

    from gemma4_t4.bench.specs import TTFTSpec
    from gemma4_t4.serving.server_config import ServerConfig
    from gemma4_t4.serving.server_state import free_port
    from gemma4_t4.studies.ttft_route import ttft_route_on_off

    started = []

    class FakeVLLM:  # a stand-in for VLLMServer: a fake server whose TTFT depends on the switch
        def __init__(self, cfg):
            self.cfg = cfg
            switch = cfg.extra_env[prefill.ENV_SWITCH]
            ttft = 0.04 if switch == "0" else 0.01
            self.fake = FakeServer(free_port(), FakeServerState(default=FakeScript(ttft_s=ttft, gap_s=0.001)))
            self.log_path = tmp_path / f"vllm-{switch}.log"
            action = "disabled" if switch == "0" else "routed"
            self.log_path.write_text(
                f"INFO gemma4-t4 turing prefill: {action}: test [vLLM 0.33.0, via plugin, pid 1]\n"
            )
            started.append(switch)

        @property
        def base_url(self):
            return self.fake.base_url

        def __enter__(self):
            self.fake.start()
            return self

        def __exit__(self, *exc):
            self.fake.stop()

    config = ServerConfig(model="fake-model", target="t4", extra_env={"KEEP": "1"})
    report = ttft_route_on_off(
        config,
        TTFTSpec(input_lens=[32, 64], output_len=2, num_prompts=2, warmup=0),
        tmp_path / "out",
        server_factory=FakeVLLM,
        progress=False,
    )
    assert started == ["0", "1"]
    assert [r["input_len"] for r in report.rows] == [32, 64]
    for row in report.rows:
        # causal bounds (the fake waits 40 ms off, 10 ms on, before its first token) and the arithmetic;
        # how large the speed-up comes out times this machine, so it is not asserted
        assert row["ttft_ms_route_off"] >= 40.0 and row["ttft_ms_route_on"] >= 10.0
        assert row["speedup"] == pytest.approx(round(row["ttft_ms_route_off"] / row["ttft_ms_route_on"], 2))
    assert report.route_on_active and report.route_off_log == ["disabled"]
    assert Path(report.plot).stat().st_size > 1000
    assert config.extra_env == {"KEEP": "1"}  # the caller's config is not changed


def test_the_committed_h200_results_hold_the_rows_and_meet_the_speed_target():
    """docs/results/turing_prefill_h200.json (H200, not a T4): rows for 512..4096 tokens at head 512 and
    256, Triton rows named as such, and the routed head-512 single-prompt prefill >= 5x faster than the
    sm_75 Triton build at 2k-4k tokens with max error within 1.5x of Triton's."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[2] / "docs/results/turing_prefill_h200.json").read_text())
    assert "not a T4" in json.dumps(doc["conditions"])
    rows = doc["rows"]
    assert {r["seq_len"] for r in rows} >= {512, 1024, 2048, 4096}
    assert {r["head_size"] for r in rows} >= {256, 512}
    assert any("triton" in r["path"] for r in rows) and any("triton" not in r["path"] for r in rows)

    def single(path_part, n):
        return [r for r in rows if path_part in r["path"] and r["seq_len"] == n and r["head_size"] == 512
                and r["batch"] == "single"]

    for n in (2048, 4096):
        route = min(single("route", n), key=lambda r: r["ms"])
        sm75 = min(single("sm_75", n), key=lambda r: r["ms"])
        assert sm75["ms"] / route["ms"] >= 5.0, (n, sm75["ms"], route["ms"])
        assert route["max_abs_err"] <= 1.5 * sm75["max_abs_err"]
