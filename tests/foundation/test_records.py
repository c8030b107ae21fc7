"""Records written to disk are one pydantic type each: written with ``model_dump(mode="json")``,
read back with ``model_validate``, secrets masked, and older records still read."""

import json

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.launch_record import ServerSettings
from gemma4_t4.host import env, smi, torchfix
from gemma4_t4.serving import server
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.turing import cpuattn


def test_the_masked_config_is_the_settings_record_with_secrets_masked():
    config = ServerConfig(
        model="m",
        api_key="secret-value",
        extra_args=["--hf-token", "k12345", "--enforce-eager"],
        extra_env={"WANDB_API_KEY": "wb_abcdef"},
    )
    masked = server.masked_config(config)
    assert type(masked) is ServerSettings
    assert set(masked.model_dump()) == set(ServerSettings.model_fields)
    # the token left the words every user reads (ps) when the config was built: it travels as HF_TOKEN
    assert masked.api_key == "***" and masked.extra_args == ["--enforce-eager"]
    assert masked.extra_env == {"HF_TOKEN": "***", "WANDB_API_KEY": "***"}
    text = json.dumps(masked.model_dump(mode="json"))
    assert "secret-value" not in text and "k12345" not in text and "wb_abcdef" not in text
    assert config.api_key == "secret-value"  # the live config keeps its key


def test_a_state_file_s_config_reads_back_into_the_same_config(tmp_path):
    config = ServerConfig(model="m", port=8123, work_dir=str(tmp_path), extra_env={"A": "1"})
    state = {"config": server.masked_config(config).model_dump(mode="json"), "pid": None}
    path = tmp_path / "server-8123.json"
    path.write_text(json.dumps(state))
    again = server.VLLMServer.from_state(path).config
    assert isinstance(again, ServerConfig)
    assert again.model_dump(exclude={"api_key"}) == config.model_dump(exclude={"api_key"})
    assert again.api_key is None  # masked on disk: a server read back has no key


def test_a_config_recorded_before_speculative_decoding_reads_back_with_no_drafter(tmp_path):
    old = server.masked_config(ServerConfig(model="m", work_dir=str(tmp_path))).model_dump(mode="json")
    for key in ("draft", "num_draft_tokens", "draft_method"):
        del old[key]
    old["a_setting_from_a_newer_version"] = 1  # ignored, not refused
    path = tmp_path / "server-8000.json"
    path.write_text(json.dumps({"config": old}))
    config = server.VLLMServer.from_state(path).config
    assert config.draft == "off" and config.draft_plan().enabled is False


def test_an_unreadable_state_config_is_refused_with_a_fix(tmp_path):
    path = tmp_path / "server-8000.json"
    path.write_text(json.dumps({"config": {"port": 8000}}))  # no model
    with pytest.raises(Gemma4T4Error, match="no readable config") as info:
        server.VLLMServer.from_state(path)
    assert "delete" in info.value.fix


def test_replaced_makes_a_new_config_with_the_change():
    config = ServerConfig(model="m", extra_env={"A": "1"})
    other = config.replaced(port=9001, extra_env={"VLLM_API_KEY": "lifted-key"})
    assert (other.port, config.port) == (9001, 8000)
    assert other.api_key == "lifted-key" and "VLLM_API_KEY" not in other.extra_env


def test_the_cpu_attention_choice_round_trips_through_its_cache_file(tmp_path):
    probe = cpuattn.ProbeResult(
        candidate="vec-kernel",
        dtype="bfloat16",
        ok=True,
        returncode=0,
        isa="vec",
        max_abs_err=0.01,
        detail="",
        seconds=1.5,
    )
    choice = cpuattn.Choice(
        candidate="vec-kernel",
        dtype="bfloat16",
        env={"GEMMA4_T4_CPU_ATTN_ISA": "vec"},
        reason="passed",
        probes=[probe],
        fingerprint_id="abc",
    )
    stored = choice.model_dump(mode="json", exclude={"cached"})
    assert "cached" not in stored
    again = cpuattn.Choice.model_validate_json(json.dumps(stored))
    assert again == choice and again.probes[0].unavailable is False


def test_the_torch_fix_json_is_the_plan_and_its_command_line():
    facts = env.Facts(
        os="Linux",
        kernel="6",
        machine="x86_64",
        python="3.12.3",
        platform="gce",
        platform_evidence="DMI: Google",
        nvidia_smi=True,
        gpus=[smi.GPUInfo(0, "Tesla T4", 15360, "7.5", "580.65.06")],
        driver_version="580.65.06",
        torch_version="2.11.0+cpu",
        vllm_distribution="vllm",
        vllm_version="0.33.0",
    )
    plan = torchfix.plan_torch_fix(facts, python="py")
    data = torchfix.torch_fix_dict(plan)
    assert set(data) == set(torchfix.TorchFixPlan.model_fields) | {"command_line"}
    assert data["command_line"] == plan.command_line()
    restored = torchfix.TorchFixPlan.model_validate(data)  # command_line is derived, ignored on reading
    assert restored == plan and restored.facts == facts
