"""What a user expects of SageMaker's endpoint names, the MCP server's errors and the benchmark's specs,
each checked where no other test would notice it going wrong (scripts/planted_bugs.py plants each bug these
catch). Everything runs in-process: no AWS call, no server."""

from __future__ import annotations

import anyio
import pytest

from gemma4_t4 import mcp_server
from gemma4_t4.bench.specs import DecodeSpec, TTFTSpec
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.config import validate_name

# ---------------------------------------------------------------- SageMaker: what a deploy is told


def test_an_endpoint_name_of_64_characters_is_refused_before_aws_sees_it():
    """SageMaker's names hold 63 characters: the 63rd passes, a 64th is refused here with the rule,
    not by AWS halfway through a deploy."""
    validate_name("g" * 63)
    validate_name("g4-" + "t" * 60)
    with pytest.raises(Gemma4T4Error, match="invalid endpoint name") as refused:
        validate_name("g" * 64)
    assert refused.value.fix == "use 1-63 letters, digits and hyphens, starting with a letter or digit"


# ---------------------------------------------------------------- the MCP server's answers


def test_a_secret_in_a_tools_error_is_masked_in_the_mcp_answer(monkeypatch):
    """A tool that fails with the environment's token in its message (a server echoing its
    Authorization header) answers with the token masked, and still names the fix."""
    monkeypatch.setenv("HF_TOKEN", "hf-secret-token-0451")

    def failing() -> mcp_server.QueryResult:
        raise Gemma4T4Error("the server refused token hf-secret-token-0451", fix="check the token's scope")

    with pytest.raises(mcp_server.ToolError, match="refused token") as answer:
        anyio.run(mcp_server._adapter(failing))
    text = str(answer.value)
    assert "hf-secret-token-0451" not in text and "the server refused token ***" in text
    assert "fix: check the token's scope" in text


# ---------------------------------------------------------------- the benchmark's specs


@pytest.mark.parametrize(
    ("build", "field"),
    [(lambda: DecodeSpec(concurrency=[]), "concurrency"), (lambda: TTFTSpec(input_lens=[]), "input_lens")],
)
def test_an_empty_concurrency_list_is_refused_with_its_fix(build, field):
    """An empty list (a notebook's `CONCURRENCY = []`) would measure nothing: refused, naming the field."""
    with pytest.raises(Gemma4T4Error, match=f"{field} is empty") as refused:
        build()
    assert refused.value.fix == "give at least one value, e.g. 1"


def test_a_negative_warmup_is_refused_and_zero_is_allowed():
    """No warm-up is a choice (`--warmup 0`); a negative count is a typo."""
    assert DecodeSpec(warmup=0).warmup == 0
    for warmup in (-1, -5):
        with pytest.raises(Gemma4T4Error, match="warm-up requests cannot be negative") as refused:
            DecodeSpec(warmup=warmup)
        assert refused.value.fix == "use --warmup 0 or more"
