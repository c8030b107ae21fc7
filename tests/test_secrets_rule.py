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


# a value that no token pattern recognises (not AKIA/ASIA...): only the name rule can hide it
ACCESS_KEY_ID = "localstack-test-id"


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", "aws_access_key_id", "--aws-access-key-id", "MINIO_KEY_ID"])
def test_a_key_id_is_a_secret_name(name):
    assert secrets.is_secret_name(name)


def test_an_aws_access_key_id_value_is_scrubbed_everywhere():
    env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_REGION": "us-east-2"}
    assert secrets.mask_env(env) == {"AWS_ACCESS_KEY_ID": "***", "AWS_REGION": "us-east-2"}
    assert secrets.secret_values(env=env) == [ACCESS_KEY_ID]
    line = f"export AWS_ACCESS_KEY_ID={ACCESS_KEY_ID}; boto3 used id {ACCESS_KEY_ID} in us-east-2"
    assert "export AWS_ACCESS_KEY_ID=***;" in secrets.mask_text(line)  # by name alone (NAME=VALUE)...
    scrubbed = secrets.mask_text(line, secrets.secret_values(env=env))  # ...and the bare value too
    assert ACCESS_KEY_ID not in scrubbed and "us-east-2" in scrubbed
    assert secrets.mask_argv(["aws", f"AWS_ACCESS_KEY_ID={ACCESS_KEY_ID}"]) == ["aws", "AWS_ACCESS_KEY_ID=***"]


@pytest.mark.parametrize("value", ["abc", "pa55", "s3cr3t7"])  # 3 to 7 characters: still secrets
def test_a_short_secret_value_is_scrubbed_from_text(value):
    env = {"HF_TOKEN": value}
    assert secrets.secret_values(env=env) == [value]
    assert secrets.mask_text(f"the server said: bad token {value}!", secrets.secret_values(env=env)) == (
        "the server said: bad token ***!"
    )
    assert secrets.mask({"log": f"used {value}"}, [value]) == {"log": "used ***"}


def test_a_two_character_value_is_not_scrubbed_from_text():
    """The shortest value scrubbed is 3 characters: a 2-character one would mask every "ok" or "10"
    in a log, so it is not taken as a value to scrub (its name still masks it in an environment)."""
    assert secrets.secret_values(env={"HF_TOKEN": "ok"}) == []
    assert secrets.mask_text("ok: 10 ok", ["ok"]) == "ok: 10 ok"
    assert secrets.mask_env({"HF_TOKEN": "ok"}) == {"HF_TOKEN": "***"}
