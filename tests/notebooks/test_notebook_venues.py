"""The notebooks' venue choice, ``nb.endpoint(TARGET, ...)``, on the venue CI cannot reach: SageMaker.
Offline it is the package's LocalAWS (moto + the SageMaker-runtime STAND-IN forwarding to the session's
real vLLM CPU server with the tiny Gemma 4). The cells the notebooks run on every venue (a spec, ``run``,
the T4-vs-L4 step, the clean-up check) run here unchanged."""

from __future__ import annotations

import pytest

from gemma4_t4 import notebook as nb
from gemma4_t4.bench.specs import AnswersSpec, DecodeSpec, PrefixSpec, run
from gemma4_t4.studies import part4
from gemma4_t4.venues.endpoint import Budget
from tests.notebooks.test_notebooks_sagemaker import REGION, aws_to_tiny_model  # noqa: F401


@pytest.mark.vllm
def test_a_part_on_sagemaker_runs_the_same_cells_and_leaves_nothing_billing(
    aws_to_tiny_model, tiny_model_dir, tmp_path, monkeypatch  # noqa: F811
):
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))
    budget = Budget(2.0)
    decode = DecodeSpec(concurrency=[1], input_len=32, output_len=24, num_prompts=3, warmup=1)
    answers = AnswersSpec(output_len=6)
    runs_dir = tmp_path / "runs"
    # a local folder is uploaded to S3 and served from there (Part 3's path); the name is what vLLM serves
    with nb.endpoint("sagemaker", tiny_model_dir, tmp_path, name="tiny-gemma4", part=4, region=REGION,
                     budget=budget, max_num_seqs=4, poll_s=0) as endpoint:
        assert endpoint.url.startswith(f"sagemaker://{REGION}/g4-p4-t4-")
        assert endpoint.venue == "sagemaker" and endpoint.gpu == "t4" and not endpoint.exposes_metrics
        assert endpoint.tokenizer == str(tiny_model_dir)
        decoded = run(endpoint, decode, runs_dir / "decode", progress=False)
        answered = run(endpoint, answers, runs_dir / "answers", progress=False)
        prefix = run(endpoint, PrefixSpec(input_len=64, output_len=2, num_prompts=4, groups=2, warmup=0),
                     tmp_path / "prefix", progress=False)
    assert decoded.status == answered.status == prefix.status == "complete"
    assert decoded.run.server.backend == "sagemaker" and set(decoded.per_stream_by_concurrency()) == {1}
    assert prefix.prefix_hit_rate() is None  # an endpoint has no /metrics: not measured, never 0
    assert endpoint.stopped and endpoint.cost_usd() > 0
    headline = part4.t4_vs_l4(endpoint, {"decode": decode, "answers": answers}, runs_dir, tmp_path / "l4",
                           model=tiny_model_dir, budget=budget, region=REGION, poll_s=0)
    assert headline is not None
    # vLLM's CPU build flushes each answer: no per-stream ratio then, and the headline says why
    assert (headline.decode_ratio is not None and headline.decode_ratio > 0) or headline.decode_not_measured
    assert headline.answers.total > 0
    assert 0 < budget.spent_usd <= budget.usd
    assert nb.clean_up(endpoint, part=4, region=REGION) == []
    assert part4.price_of(endpoint).instance == "ml.g4dn.xlarge"
