"""SageMaker endpoints as a benchmark backend: ``--base-url sagemaker://REGION/ENDPOINT`` through
boto3's sagemaker-runtime (SigV4, normal endpoint resolution), against local runtime STAND-INs that
forward to the bench FAKE server's ``/invocations`` and frame streams as AWS event-stream messages
botocore decodes: the package's own (gemma4_t4.standins.runtime_standin) for healthy endpoints,
and a FAULT-INJECTING one (tests/fakes/sagemaker_fault_standin.py) for throttling, model errors, no
streaming and an endpoint that dies. Against the REAL vLLM CPU server: tests/bench/test_bench_vllm.py
and tests/notebooks/test_notebooks_sagemaker.py."""

import json

import pytest
from fakes import sagemaker_fault_standin
from fakes.fake_openai_server import FakeScript, FakeServer, FakeServerState
from fakes.sagemaker_fault_standin import Endpoint, FaultInjectingStandIn, aws_env

from gemma4_t4.bench import compare_runs, load_run, run_benchmark
from gemma4_t4.bench.backends import OpenAIHTTPBackend, SageMakerBackend, backend_for, parse_base_url
from gemma4_t4.bench.client import RequestSpec
from gemma4_t4.bench.compare import compare_suites
from gemma4_t4.cli import main as cli_main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.serving.server_state import free_port
from gemma4_t4.standins import runtime_standin
from gemma4_t4.standins.runtime_standin import RuntimeStandIn

SM = "sagemaker://us-east-2/"


@pytest.fixture(scope="module")
def fake():
    with FakeServer(free_port(), FakeServerState(default=FakeScript(ttft_s=0.02, gap_s=0.002))) as server:
        yield server


@pytest.fixture
def standin(fake, monkeypatch):
    endpoints = {
        "gemma-t4": Endpoint(fake.base_url),
        "gemma-l4": Endpoint(fake.base_url),
        "throttled": Endpoint(fake.base_url, throttle_first=2),
        "busy": Endpoint(fake.base_url, model_error=(503, "engine busy"), model_error_first=1),
        "broken": Endpoint(fake.base_url, model_error=(400, "prompt too long for this model")),
        "no-stream": Endpoint(fake.base_url, no_stream=True),
        "dies": Endpoint(fake.base_url, dies_after=6),
    }
    with FaultInjectingStandIn(free_port(), endpoints) as server:
        aws_env(monkeypatch, server.url)
        yield server


@pytest.fixture
def healthy(fake, monkeypatch):
    """The package's stand-in: every endpoint (gemma-t4, gemma-l4) healthy, in front of the fake server."""
    with RuntimeStandIn(fake.base_url) as server:
        aws_env(monkeypatch, server.url)
        yield server


def test_base_urls_are_parsed_or_refused_in_one_line():
    assert parse_base_url("sagemaker://us-east-2/gemma4-e2b-t4") == (
        "sagemaker",
        "us-east-2",
        "gemma4-e2b-t4",
    )
    assert parse_base_url("http://127.0.0.1:8000/") == ("http", "http://127.0.0.1:8000", "")
    assert isinstance(backend_for("http://127.0.0.1:8000"), OpenAIHTTPBackend)
    assert isinstance(backend_for("sagemaker://eu-west-1/x"), SageMakerBackend)
    for bad, match in [
        ("sagemaker://us-east-2", "REGION/ENDPOINT"),
        ("sagemaker://nowhere/ep", "REGION/ENDPOINT"),
        ("sagemaker://us-east-2/bad_name!", "REGION/ENDPOINT"),
        ("ftp://host", "http"),
        ("http://127.0.0.1:8000 /v1", "space"),
        ("http://h:99999", "port"),
        ("", "empty"),
    ]:
        with pytest.raises(Gemma4T4Error, match=match) as err:
            parse_base_url(bad)
        assert err.value.fix and "\n" not in err.value.message


def test_event_stream_frames_decode_with_botocore():
    """Both stand-ins frame with the package's code, which botocore's own decoder reads."""
    from botocore.eventstream import EventStreamBuffer

    assert sagemaker_fault_standin.payload_part is runtime_standin.payload_part  # one framing, not two
    buffer = EventStreamBuffer()
    buffer.add_data(runtime_standin.payload_part(b"data: {}\n"))
    message = next(iter(buffer))
    assert message.headers[":event-type"] == "PayloadPart" and message.payload == b"data: {}\n"


def test_stream_invocation_gives_the_same_record_as_http(healthy, fake):
    backend = SageMakerBackend("us-east-2", "gemma-t4")
    spec = RequestSpec("r-0", "x" * 40, 12, extra_body={"fake": {"tokens_per_chunk": 3}})
    record = backend._invoke(spec, "fake-model", keep_text=True)
    assert record.error is None and record.streamed and record.attempts == 1
    assert record.completion_tokens == 12 and record.token_source == "usage" and record.prompt_tokens == 40
    assert len(record.chunk_times_s) == 4 and record.text == "ab" * 12  # 4 chunks of 3 tokens, reassembled
    assert record.send_s < record.first_content_s <= record.last_choice_s <= record.end_s
    assert healthy.parts_sent >= 1  # it went through invoke_endpoint_with_response_stream


def test_throttling_and_busy_model_errors_are_retried_with_backoff(standin):
    spec = RequestSpec("r-0", "hello there", 4)
    throttled = SageMakerBackend("us-east-2", "throttled", backoff_s=0.01)._invoke(spec, "fake-model", False)
    assert throttled.error is None and throttled.attempts == 3
    busy = SageMakerBackend("us-east-2", "busy", backoff_s=0.01)._invoke(spec, "fake-model", False)
    assert busy.error is None and busy.attempts == 2
    gives_up = SageMakerBackend("us-east-2", "throttled", retries=1, backoff_s=0.01)
    standin.endpoints["throttled"].invocations = 0
    failed = gives_up._invoke(spec, "fake-model", False)
    assert failed.error == "throttling" and failed.attempts == 2 and "Rate exceeded" in failed.error_detail


def test_a_client_model_error_is_a_counted_failure_with_its_message(standin, tmp_path):
    backend = SageMakerBackend("us-east-2", "broken", backoff_s=0.01)
    record = backend._invoke(RequestSpec("r-0", "hello there", 4), "fake-model", False)
    assert (record.error, record.http_status, record.attempts) == ("model_error", 400, 1)  # not retried
    assert "prompt too long for this model" in record.error_detail
    with pytest.raises(Gemma4T4Error, match="1-token probe") as err:
        run_benchmark(SM + "broken", "fake-model", "answers", tmp_path / "x", progress=False)
    assert "logs" in err.value.fix and not (tmp_path / "x").exists()


def test_an_endpoint_that_cannot_stream_falls_back_to_invoke(standin, tmp_path):
    run = run_benchmark(
        SM + "no-stream", "fake-model", "answers", tmp_path / "ns", output_len=4, progress=False
    )
    cell = run.cells[0]
    assert run.status == "complete" and cell.completed == 20
    assert all(a.text == "abababab" for a in cell.answers)
    records = run.measured(cell.cell)
    assert all(r.streamed is False for r in records)
    assert cell.ttft_ms.n == 0 and cell.e2el_ms.n == 20  # no TTFT without a stream, only end-to-end
    log = standin.endpoints["no-stream"].log
    assert log[0] == "invoke" and log[1] == "stream" and set(log[2:]) == {"invoke"}  # asked once, then invoke


def test_unknown_endpoint_and_missing_tokenizer_fail_before_the_run(standin, tmp_path):
    with pytest.raises(Gemma4T4Error, match="cannot reach the SageMaker endpoint") as err:
        run_benchmark(SM + "nope", "fake-model", "answers", tmp_path / "a", progress=False)
    assert "endpoint name" in err.value.fix
    with pytest.raises(Gemma4T4Error, match="tokenizer") as err:
        run_benchmark(SM + "gemma-t4", "fake-model", "decode", tmp_path / "b", progress=False)
    assert "--tokenizer" in err.value.fix
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_endpoint_dying_mid_benchmark_keeps_partial_results_and_exits_nonzero(standin, tmp_path, capsys):
    out = tmp_path / "partial"
    # probe 1 + warm-up 2 (a full batch for c=2) + 3 measured answers succeed, then the endpoint is gone
    code = cli_main(
        [
            "bench",
            "run",
            "--base-url",
            SM + "dies",
            "--model",
            "fake-model",
            "--workload",
            "answers",
            "--concurrency",
            "1,2",
            "--warmup",
            "1",
            "--output-len",
            "4",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 1
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "aborted: server unreachable" and "not found" in data["run"]["error"]
    run = load_run(out)
    first = run.cells[0]
    assert (first.completed, first.failed) == (3, 17) and set(first.errors) == {"endpoint_not_found"}
    assert "not found" in first.error_examples["endpoint_not_found"]
    assert len(run.cells) == 1 and len(run.measured(first.cell)) == 20


def test_answers_and_compare_across_two_endpoints(healthy, fake, tmp_path, capsys):
    """The T4-vs-L4 shape: answers per endpoint, then one headline per model; same as over HTTP."""
    for name in ("gemma-t4", "gemma-l4"):
        assert (
            cli_main(
                [
                    "bench",
                    "run",
                    "--base-url",
                    SM + name,
                    "--model",
                    "fake-model",
                    "--workload",
                    "answers",
                    "--output-len",
                    "6",
                    "--out",
                    str(tmp_path / name / "answers"),
                    "--no-plots",
                ]
            )
            == 0
        )
    http = run_benchmark(
        fake.base_url, "fake-model", "answers", tmp_path / "http", output_len=6, progress=False
    )
    via_sm = load_run(tmp_path / "gemma-t4" / "answers")
    assert via_sm.run.server.backend == "sagemaker" and via_sm.run.base_url == SM + "gemma-t4"
    assert compare_runs(http, via_sm).answers.identical == 20
    assert [c.total_output_tokens for c in via_sm.cells] == [c.total_output_tokens for c in http.cells]
    suite = compare_suites(tmp_path / "gemma-t4", tmp_path / "gemma-l4")
    (headline,) = suite.headlines
    assert headline.answers.identical == 20 and headline.answers.total == 20
    capsys.readouterr()
    assert cli_main(["bench", "compare", str(tmp_path / "gemma-t4"), str(tmp_path / "gemma-l4")]) == 0
    assert "identical answers: 20/20" in capsys.readouterr().out


def test_run_help_documents_sagemaker_urls(capsys):
    with pytest.raises(SystemExit):
        cli_main(["bench", "run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "sagemaker://REGION/ENDPOINT" in text and "invoke_endpoint_with_response_stream" in text
    assert "--request-timeout" in text and "--method" in text
