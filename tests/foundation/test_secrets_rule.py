"""One masking rule for secrets: bench results, MCP answers and SageMaker environments all use
gemma4_t4.foundation.secrets, and names of measured data are never taken for secrets."""

import pytest

from gemma4_t4 import mcp_server
from gemma4_t4.bench.specs import DecodeSpec
from gemma4_t4.bench.workloads import BenchArgs
from gemma4_t4.foundation import secrets

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
    """An MCP answer is masked by the package's rule: the MCP server has no scrubber of its own."""
    import anyio

    value = {"cmd": ["vllm", "serve", "--api-key", KEY], "note": f"Bearer {KEY}", "HF_TOKEN": KEY, "n": 1}

    def leaky() -> dict[str, object]:
        return value

    answered = anyio.run(mcp_server._adapter(leaky))
    assert answered == secrets.mask(value, secrets.known_values())
    assert KEY not in str(answered)  # by name, by flag and by pattern alone


def test_sagemaker_env_masking_is_the_package_rule():
    from gemma4_t4.sagemaker.config import DeployConfig

    env = {"HF_TOKEN": KEY, "SM_VLLM_MAX_NUM_BATCHED_TOKENS": "8192", "AWS_SECRET_ACCESS_KEY": KEY, "X": "1"}
    shown = DeployConfig(extra_env=env).summary()["container_env"]  # what a dry run and the MCP config tool show
    assert {k: shown[k] for k in env} == {k: ("***" if secrets.is_secret_name(k) else v) for k, v in env.items()}
    assert shown["SM_VLLM_MAX_NUM_BATCHED_TOKENS"] == "8192" and shown["HF_TOKEN"] == "***"


def test_a_bench_record_keeps_no_secret(tmp_path):
    args = BenchArgs(
        base_url="http://127.0.0.1:1",
        model="m",
        spec=DecodeSpec(),
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


@pytest.mark.parametrize("name", ["DB_PASSWORD", "--client-secret", "AUTHORIZATION", "X-Key"])
def test_a_secret_word_anywhere_or_a_last_key_word_makes_a_secret_name(name):
    """PASSWORD / SECRET / AUTHORIZATION need not be the last word; KEY after any other word
    (even a one-letter one) is a secret, only a bare ``key`` is a lookup key."""
    assert secrets.is_secret_name(name)


def test_mask_env_keeps_an_unset_secret_visible_as_unset():
    """An empty or missing token is shown as it is (the reader sees it is not set), not as ***."""
    env = {"HF_TOKEN": "", "API_KEY": None, "DB_PASSWORD": "pw", "MAX_MODEL_LEN": "4096"}
    assert secrets.mask_env(env) == {"HF_TOKEN": "", "API_KEY": None, "DB_PASSWORD": "***", "MAX_MODEL_LEN": "4096"}


def test_mask_argv_masks_each_form_and_only_the_secret_values():
    # base64 keys end in "=" padding: the value is everything after the FIRST "="
    argv = [
        "vllm", "serve", "--api-key", KEY, "--port", "8000",
        "--hf-token=abc=", "--max-model-len=4096",
        "-u", "HF_TOKEN",  # a bare secret NAME (unset it) is no value
        "hf_token=abc123", "MAX_MODEL_LEN=4096", "HF_TOKEN=tok=en=",
    ]  # fmt: skip
    assert secrets.mask_argv(argv) == [
        "vllm", "serve", "--api-key", "***", "--port", "8000",
        "--hf-token=***", "--max-model-len=4096",
        "-u", "HF_TOKEN",
        "hf_token=***", "MAX_MODEL_LEN=4096", "HF_TOKEN=***",
    ]  # fmt: skip


def test_a_secret_option_with_no_value_after_it_is_kept_and_gives_no_value():
    assert secrets.mask_argv(["serve", "--api-key"]) == ["serve", "--api-key"]
    assert secrets.secret_values(argv=["serve", "--api-key"]) == []


def test_secret_values_collects_every_form_longest_first():
    argv = [
        "vllm", "serve", "--port", "8000",
        "--hf-token=hf=tok=",  # the value keeps its "=" characters
        "--api-key=local-dev-key", "HF_TOKEN=env=tok=12", "MAX_TOKENS=512",
        "--password-file=/run/secrets/pw", "-u", "HF_TOKEN",  # a value that itself looks like no secret
        "--api-key", "opt-key-1",  # the option-space form as the last two words
    ]  # fmt: skip
    env = {"DB_PASSWORD": "pw-12345678901", "AWS_REGION": "us-east-2", "HF_TOKEN": ""}
    extra = [None, "", "extra-value-123456", "***", "ab"]  # unset, masked and too-short values are not values
    assert secrets.secret_values(argv, env, extra) == [
        "extra-value-123456",
        "/run/secrets/pw",
        "pw-12345678901",
        "local-dev-key",
        "env=tok=12",
        "opt-key-1",
        "hf=tok=",
    ]


def test_mask_text_replaces_the_longest_value_first():
    """A short secret inside a longer one must not cut the longer one apart (leaving pieces of it
    readable): the longer value is replaced whole first."""
    values = ["xyz", "abc-xyz-123", "", "ab"]
    assert secrets.mask_text("token abc-xyz-123 and xyz, ab", values) == "token *** and ***, ab"


def test_mask_text_masks_tokens_options_and_names_in_free_text():
    text = (
        "run --api-key sk-1 --port 8000 --HF-TOKEN hf-2 --api-key=sk-3; hf_token=abc123 max_tokens=5 "
        "Authorization: Bearer abc.def id hf_abcdefghijklmnopqrst key AKIAABCDEFGHIJKLMNOP"
    )
    assert secrets.mask_text(text) == (
        "run --api-key *** --port 8000 --HF-TOKEN *** --api-key=***; hf_token=*** max_tokens=5 "
        "Authorization: Bearer *** id *** key ***"
    )


def test_mask_keeps_plain_strings_and_masks_values_inside_nested_lists():
    assert secrets.mask({"model": "gemma", "api_key": KEY}) == {"model": "gemma", "api_key": "***"}
    assert secrets.mask([{"note": f"used {KEY}"}, 3], [KEY]) == [{"note": "used ***"}, 3]
    assert secrets.mask(["serve", "--api-key", KEY]) == ["serve", "--api-key", "***"]


def test_an_option_whose_value_ends_in_key_does_not_make_the_next_word_a_secret():
    """``--served-model-name=my-key`` is not a secret option, and the word after it is the next
    option, not its value: taking ``--port`` as a secret would mask every "--port" in a log."""
    argv = ["--served-model-name=my-key", "--port", "8000", "--tokenizer=org/gemma-token", "-q"]
    assert secrets.secret_values(argv) == []
    assert secrets.mask_argv(argv) == argv
    assert secrets.mask_text("started with --port 8000", secrets.secret_values(argv)) == "started with --port 8000"


def test_a_secret_under_its_name_in_an_echoed_json_body_is_masked():
    """A server's error body that echoes the request's headers or settings as JSON (or a Python repr)
    hides every value under a secret name, and only those."""
    body = '{"error": {"headers": {"authorization": "Bearer zz-1", "x-api-key": "k\\"1"}, "model": "m"}}'
    assert secrets.mask_text(body) == (
        '{"error": {"headers": {"authorization": "***", "x-api-key": "***"}, "model": "m"}}'
    )
    assert secrets.mask_text("{'aws_secret_access_key': 'wJal/rX', 'max_tokens': '5'}") == (
        "{'aws_secret_access_key': '***', 'max_tokens': '5'}"
    )


def test_the_known_values_are_the_key_given_and_the_environments_secrets():
    env = {"HF_TOKEN": "abc123", "AWS_SECRET_ACCESS_KEY": "wJal/rX", "AWS_REGION": "us-east-2", "X": "abc"}
    assert secrets.known_values(["sk-1", None], env=env) == ["wJal/rX", "abc123", "sk-1"]


def test_a_six_character_token_is_masked_in_an_mcp_answer(monkeypatch):
    """`HF_TOKEN=abc123` in the MCP server's environment, echoed by a tool's answer, is masked: the
    answers go through the package's rule, which keeps values of 3 characters and more."""
    import anyio

    monkeypatch.setenv("HF_TOKEN", "abc123")

    def leaky() -> mcp_server.QueryResult:
        return mcp_server.QueryResult(target="x", text="the server refused token abc123", latency_s=0.0)

    result = anyio.run(mcp_server._adapter(leaky))
    assert result.text == "the server refused token ***"


def test_a_four_character_secret_is_masked_in_an_mcp_answer_as_everywhere_else(monkeypatch):
    """`HF_TOKEN=k3y9` is masked in MCP answers exactly as serve, bench and SageMaker mask it: the MCP
    server has no shorter rule of its own (it once kept only values of 6 characters and more)."""
    import anyio

    monkeypatch.setenv("HF_TOKEN", "k3y9")

    def leaky() -> mcp_server.QueryResult:
        return mcp_server.QueryResult(target="x", text="the server refused token k3y9", latency_s=0.0)

    assert anyio.run(mcp_server._adapter(leaky)).text == "the server refused token ***"
    assert secrets.mask_text("token k3y9", secrets.known_values()) == "token ***"


def test_a_config_or_a_deploy_watcher_shown_in_a_cell_or_a_log_shows_no_secret():
    """repr and str are what a notebook cell, a log line or a traceback print: the secrets are masked there as in
    every record (pydantic's own repr printed them)."""
    from gemma4_t4.sagemaker.config import DeployConfig
    from gemma4_t4.sagemaker.deploy import DeploymentWatcher, DeployResult
    from gemma4_t4.serving.server_config import ServerConfig

    token, key = "hf_" + "t" * 30, "k" * 24
    deploy = DeployConfig(extra_env={"HF_TOKEN": token})
    local = ServerConfig(model="m/x", api_key=key, extra_env={"HF_TOKEN": token})
    watcher = DeploymentWatcher(object(), DeployResult("g4", "us-east-2", "Creating", True), 60.0, config=deploy)
    for shown in (repr(deploy), str(deploy), repr(local), str(local), repr(watcher)):
        assert token not in shown and key not in shown, shown
    assert "HF_TOKEN" in repr(deploy) and "api_key" in repr(local)  # the settings still show, masked
    assert deploy.extra_env["HF_TOKEN"] == token and local.api_key == key  # only their display is masked
