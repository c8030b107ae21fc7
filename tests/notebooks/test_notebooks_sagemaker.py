"""What notebooks 2-4 share on ``TARGET=sagemaker``: the clean-up check, the headline rows that
put the series' published figures beside what was measured, and the fixture that serves every
moto endpoint from the real vLLM CPU server through the package's SageMaker-runtime STAND-IN."""

from __future__ import annotations

import pytest
from fakes.aws_fixtures import reset

from gemma4_t4.bench.compare import Headline, published_decode
from gemma4_t4.bench.published import headline_rows
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.standins.local import LocalAWS
from gemma4_t4.venues import parts

REGION = "us-east-2"


# moto 5.2's endpoint-config enum of instance types predates the L4 (real SageMaker has offered
# ml.g6.xlarge since 2024): the test extends moto's list by the instance types Part 4 deploys.
MOTO_MISSING_TYPES = {parts.INSTANCE_OF_GPU["l4"]}


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
        reset(aws)  # moto's state is per process: start from none, whatever ran before
        yield aws


def test_leftover_endpoints_refuses_a_part_that_creates_none():
    with pytest.raises(Gemma4T4Error, match="creates no endpoints"):
        parts.leftover_endpoints(REGION, 1)


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
