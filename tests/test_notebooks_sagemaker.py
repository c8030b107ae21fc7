"""What notebooks 2-4 run on ``TARGET=sagemaker``, end to end offline: the package's LocalAWS
(moto for the control plane and S3) with the package's SageMaker-runtime STAND-IN in front of the
real vLLM CPU server (tiny Gemma 4). Every endpoint is deployed to moto, measured through
``sagemaker://REGION/ENDPOINT`` (boto3, event-stream framing botocore decodes) and deleted."""

from __future__ import annotations

import boto3
import pytest

from gemma4_t4.bench.compare import Headline, compare_suites, published_decode
from gemma4_t4.bench.results import load_run
from gemma4_t4.bench.specs import AnswersSpec, DecodeSpec, TTFTSpec
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.notebook import headline_rows, table_cells
from gemma4_t4.sagemaker import experiments
from gemma4_t4.sagemaker.local import LocalAWS
from gemma4_t4.sagemaker.matrix import EndpointHandling, MatrixEntry, MatrixResult

REGION = "us-east-2"
FAST = EndpointHandling(poll_s=0, watch_s=0.05, progress=False)


# moto 5.2's endpoint-config enum of instance types predates the L4 (real SageMaker has offered
# ml.g6.xlarge since 2024): the test extends moto's list by the instance types Part 4 deploys.
MOTO_MISSING_TYPES = {experiments.L4}


@pytest.fixture
def aws_to_tiny_model(vllm_server, monkeypatch, tmp_path):
    """moto + the runtime stand-in forwarding every endpoint to the session's vLLM server; the
    endpoints' ownership records under the test's own folder."""
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))
    from moto.sagemaker.models import FakeEndpointConfig

    original = FakeEndpointConfig.validate_instance_type

    def validate(self, instance_type):
        if instance_type not in MOTO_MISSING_TYPES:
            original(self, instance_type)

    monkeypatch.setattr(FakeEndpointConfig, "validate_instance_type", validate)
    with LocalAWS(runtime_backend=vllm_server.base_url) as aws:
        aws.reset()  # moto's state is per process: start from none, whatever ran before
        yield aws


def _endpoints() -> list[str]:
    return [
        e["EndpointName"] for e in boto3.client("sagemaker", region_name=REGION).list_endpoints()["Endpoints"]
    ]


@pytest.mark.vllm
def test_part4_t4_vs_l4_headline_on_two_local_endpoints(aws_to_tiny_model, tiny_model_dir, tmp_path):
    """Part 4's cell: the same model on the T4 and the L4 endpoint, decode + TTFT + answers on each,
    then the headline compare_suites (and `bench compare`) gives from the two out dirs."""
    result = experiments.t4_vs_l4(
        "google/gemma-4-E2B-it-qat-w4a16-ct",
        REGION,
        specs={
            # 24 tokens: a per-stream rate (the interval's samples) exists even when vLLM's CPU
            # build streams several tokens per chunk
            "decode": DecodeSpec(concurrency=[1], input_len=32, output_len=24, num_prompts=3, warmup=1),
            "ttft": TTFTSpec(input_lens=[32, 64], output_len=2, num_prompts=2, warmup=1),
            "answers": AnswersSpec(output_len=6, warmup=1),
        },
        budget=2.0,
        out_dir=tmp_path,
        served_model_name="tiny-gemma4",  # what the local vLLM serves (on AWS: the id's last part)
        tokenizer=str(tiny_model_dir),
        max_num_seqs=4,
        how=FAST,
    )
    t4, l4 = result.entries
    assert (t4.status, l4.status) == ("measured", "measured"), (t4.error, l4.error)
    assert (t4.instance_type, l4.instance_type) == (experiments.T4, experiments.L4)
    t4_runs, l4_runs = experiments.entry_runs(result)
    assert set(t4_runs) == set(l4_runs) == {"decode", "ttft", "answers"}
    for runs, entry in ((t4_runs, t4), (l4_runs, l4)):
        assert runs["decode"].run.base_url == f"sagemaker://{REGION}/{entry.endpoint}"
        assert runs["decode"].run.server.backend == "sagemaker"
        assert (
            runs["decode"].cells[0].total_output_tokens == 3 * 24 and runs["decode"].cells[0].input_len_exact
        )
        assert [c.input_len for c in runs["ttft"].cells] == [32, 64]
        assert load_run(f"{entry.out_dir}/answers").cells[0].completed == 20
    assert aws_to_tiny_model.runtime.parts_sent > 0  # the requests went through the runtime API
    assert result.deleted and _endpoints() == [] and experiments.leftover_endpoints(REGION, 4) == []

    (headline,) = compare_suites(t4.out_dir, l4.out_dir).headlines
    assert headline.model == "tiny-gemma4"
    assert headline.answers.identical == headline.answers.total == 20  # one greedy server behind both
    if headline.decode_not_measured:  # vLLM's CPU build at times sends each answer in one flush
        assert headline.decode_ratio is None and "in one flush" in headline.text()
    else:
        assert headline.decode_method == "per-stream c=1" and headline.decode_ratio > 0
    assert headline.ttft_ratio > 0
    # a tiny random model's throughput is no price, whatever instance the endpoint was priced as
    assert headline.usd_per_mtok_a == headline.usd_per_mtok_b == {}
    assert "tiny random model" in headline.unpriced_a and "tiny random model" in headline.unpriced_b
    rows = headline_rows(headline)
    assert rows[0]["measured here"] == headline.decode_a and rows[2]["measured here"] == headline.decode_ratio
    assert rows[4]["measured here"] == 1.0 and all(r["published"] is None for r in rows)  # no tiny row


@pytest.mark.vllm
def test_parts_2_and_3_on_local_endpoints(aws_to_tiny_model, tiny_model_dir, tmp_path):
    """Part 2: both builds on T4 endpoints in turn; Part 3: a model folder uploaded to S3 (once) and
    served from there, its answers equal to the same server's over HTTP."""
    from gemma4_t4.bench import run_benchmark
    from gemma4_t4.bench.answers import compare_answers

    part2 = experiments.bf16_vs_qat_on_t4(
        REGION,
        specs={"decode": DecodeSpec(concurrency=[1, 2], input_len=32, output_len=4, num_prompts=2, warmup=1)},
        budget=2.0,
        out_dir=tmp_path / "p2",
        served_model_name="tiny-gemma4",
        tokenizer=str(tiny_model_dir),
        how=FAST,
    )
    bf16_run, qat_run = (runs["decode"] for runs in experiments.entry_runs(part2))
    assert [e.endpoint for e in part2.entries] == ["g4-p2-bf16-e2b", "g4-p2-qat-e2b"]
    assert set(bf16_run.per_stream_by_concurrency()) == set(qat_run.per_stream_by_concurrency()) == {1, 2}
    assert bf16_run.failed == 0 and qat_run.failed == 0

    upload, part3 = experiments.repack_on_endpoint(
        tiny_model_dir, REGION, specs={"answers": AnswersSpec(output_len=6)}, budget=2.0, out_dir=tmp_path / "p3",
        how=FAST,
    )  # fmt: skip
    (served,) = (runs["answers"] for runs in experiments.entry_runs(part3))
    assert upload.s3_uri.startswith("s3://") and upload.total_bytes > 0
    assert part3.entries[0].endpoint.startswith(experiments.PART_PREFIX[3])
    http = run_benchmark(
        aws_to_tiny_model.runtime.backend_for("*"), "tiny-gemma4", "answers", tmp_path / "http",
        output_len=6, progress=False,
    )  # fmt: skip
    same = compare_answers(served.cells[0].answers, http.cells[0].answers)
    assert same.identical == same.total == 20
    again, _ = experiments.repack_on_endpoint(
        tiny_model_dir, REGION, specs={"answers": AnswersSpec(output_len=2)}, budget=2.0, out_dir=tmp_path / "p3b",
        how=FAST,
    )  # fmt: skip
    assert again.s3_uri == upload.s3_uri and again.bytes_uploaded == 0  # nothing uploaded twice
    assert _endpoints() == [] and experiments.leftover_endpoints(REGION, 2) == []


def test_entry_runs_refuses_a_half_measured_comparison():
    t4_run, l4_run = object(), object()  # stand for the two BenchRuns: only their identity is read
    result = MatrixResult("ml.g4dn.xlarge", REGION, 1.0, 0.736)
    result.entries = [
        MatrixEntry("m", "g4-p4-t4-m", "measured", 0.3, runs={"decode": t4_run}),
        MatrixEntry("m", "g4-p4-l4-m", "deploy failed", 0.5, error="ResourceLimitExceeded"),
    ]
    result.stopped_reason = None
    with pytest.raises(Gemma4T4Error, match="g4-p4-l4-m: deploy failed .ResourceLimitExceeded") as err:
        experiments.entry_runs(result)
    assert "deleted" in err.value.fix
    result.entries[1] = MatrixEntry("m", "g4-p4-l4-m", "measured", 0.5, runs={"decode": l4_run})
    assert experiments.entry_runs(result) == [{"decode": t4_run}, {"decode": l4_run}]
    rows = experiments.result_rows(result)
    assert [(r.endpoint, r.status, r.estimate_usd) for r in rows] == [
        ("g4-p4-t4-m", "measured", 0.3),
        ("g4-p4-l4-m", "measured", 0.5),
    ]
    columns, _ = table_cells(rows)  # what nb.show_table shows
    assert columns[:5] == ["endpoint", "model", "instance", "status", "estimate_usd"]
    with pytest.raises(Gemma4T4Error, match="creates no endpoints"):
        experiments.leftover_endpoints(REGION, 1)


def test_served_names_and_instance_gpus():
    from gemma4_t4.sagemaker.config import DeployConfig

    assert experiments.served_name(DeployConfig(model_id="google/gemma-4-E2B-it")) == "gemma-4-E2B-it"
    assert experiments.served_name(DeployConfig(served_model_name="x")) == "x"
    assert (
        experiments.instance_gpu(experiments.T4) == "t4" and experiments.instance_gpu(experiments.L4) == "l4"
    )
    assert experiments.instance_gpu("ml.nothing") is None


def test_headline_rows_put_the_published_row_beside_and_label_it():
    from gemma4_t4.bench.answers import AnswerComparison

    pub = published_decode("gemma-4-E2B-it-qat-w4a16-ct")
    assert (pub.build, pub.t4_tok_s, pub.l4_tok_s, pub.identical_answers) == ("emb4", 108.5, 141.7, "40/40")
    headline = Headline(
        "gemma-4-E2B-it-qat-w4a16-ct", "per-stream c=1", 80.0, 100.0, 0.8, 0.75, 0.85, 300.0, 250.0, 1.2,
        AnswerComparison(20, 19, 18, 18, None, [3]), {}, {}, pub,
    )  # fmt: skip
    rows = {r["figure"]: r for r in headline_rows(headline)}
    ratio = rows["T4 / L4 decode"]
    assert ratio["measured here"] == 0.8 and ratio["published"] == pytest.approx(108.5 / 141.7)
    assert "emb4" in ratio["published under"] and ratio["source"]
    assert rows["identical answers (share)"]["measured here"] == 0.95
    assert rows["identical answers (share)"]["published"] == 1.0
    assert rows["T4 / L4 median TTFT"]["published"] is None  # the series published no TTFT ratio
