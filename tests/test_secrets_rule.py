"""One masking rule for secrets: bench results, MCP answers and SageMaker environments all use
gemma4_t4.secrets, and names of measured data are never taken for secrets."""

import pytest

from gemma4_t4 import mcp_server, secrets
from gemma4_t4.bench.workloads import BenchArgs
from gemma4_t4.sagemaker.config import redact_env

KEY = "sk-test-0123456789abcdef"


@pytest.mark.parametrize(
    "name", ["first_token_s", "token_source", "bytes_per_token", "kv_read_bytes_per_token", "key"]
)
def test_names_of_measured_data_are_not_secrets(name):
    assert not secrets.is_secret_name(name)


def test_numbers_and_flags_under_a_secret_name_stay():
    assert secrets.mask({"api_key": KEY, "api_key_used": True, "token_count": 3}) == {
        "api_key": "***",
        "api_key_used": True,
        "token_count": 3,
    }


def test_the_mcp_scrubber_is_the_package_rule():
    value = {"cmd": ["vllm", "serve", "--api-key", KEY], "note": f"Bearer {KEY}", "HF_TOKEN": KEY, "n": 1}
    assert mcp_server._scrub(value, [KEY]) == secrets.mask(value, [KEY])
    assert KEY not in str(mcp_server._scrub(value, []))  # by name, by flag and by pattern alone


def test_sagemaker_env_masking_is_the_package_rule():
    env = {"HF_TOKEN": KEY, "SM_VLLM_MAX_NUM_BATCHED_TOKENS": "8192", "AWS_SECRET_ACCESS_KEY": KEY, "X": "1"}
    assert redact_env(env) == {k: ("***" if secrets.is_secret_name(k) else v) for k, v in env.items()}
    assert (
        redact_env(env)["SM_VLLM_MAX_NUM_BATCHED_TOKENS"] == "8192" and redact_env(env)["HF_TOKEN"] == "***"
    )


def test_a_bench_record_keeps_no_secret(tmp_path):
    args = BenchArgs(
        base_url="http://127.0.0.1:1",
        model="m",
        workload="decode",
        out_dir=str(tmp_path),
        api_key=KEY,
        label=f"--api-key={KEY}",
    )
    record = args.record()
    assert KEY not in str(record) and record["api_key_used"] is True
