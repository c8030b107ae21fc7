"""Speculative decoding without a server: the tiny drafter, drafter resolution and refusals, the
exact --speculative-config, the fit calculator's drafter, and the spec-decode counters' arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemma4_t4.bench.telemetry import snapshot_from_text, spec_decode_delta
from gemma4_t4.catalog import assistants, models
from gemma4_t4.cli import main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.serving import speculative
from gemma4_t4.serving.server_config import ServerConfig, build_command


def _folder(root: Path, name: str, config: dict) -> str:
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _target_config(
    vocab: int = 512, hidden: int = 128, layer_types: tuple = ("sliding_attention", "full_attention")
) -> dict:
    return {
        "model_type": "gemma4_text",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "head_dim": 32,
        "global_head_dim": 64,
        "num_key_value_heads": 1,
        "num_global_key_value_heads": 1,
        "layer_types": list(layer_types),
    }


def _assistant_config(vocab: int = 512, backbone: int = 128, full_head: int = 64) -> dict:
    return {
        "model_type": "gemma4_assistant",
        "backbone_hidden_size": backbone,
        "text_config": {
            "model_type": "gemma4_text",
            "vocab_size": vocab,
            "hidden_size": 64,
            "head_dim": 32,
            "num_key_value_heads": 1,
            "layer_types": ["sliding_attention", "full_attention"],
            "per_layer_config": {"1": {"head_dim": full_head}},
        },
    }


# -- the tiny drafter ------------------------------------------------------------------------------


def test_tiny_drafter_is_an_assistant_matching_the_tiny_target(tiny_model_dir, tiny_drafter_dir):
    config = json.loads((tiny_drafter_dir / "config.json").read_text())
    target = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "gemma4_assistant"
    assert config["backbone_hidden_size"] == target["hidden_size"]
    assert config["text_config"]["vocab_size"] == target["vocab_size"]
    assert config["text_config"]["hidden_size_per_layer_input"] == 0
    # the same tokenizer as the target, byte for byte
    assert (tiny_drafter_dir / "tokenizer.json").read_bytes() == (
        tiny_model_dir / "tokenizer.json"
    ).read_bytes()
    shape = speculative.read_shape(str(tiny_drafter_dir))
    assert shape.head_dims == speculative.read_shape(str(tiny_model_dir)).head_dims
    assert "matches" in speculative.check_pair(str(tiny_model_dir), str(tiny_drafter_dir), "mtp")


def test_tiny_drafter_loads_in_transformers(tiny_drafter_dir):
    from transformers import AutoConfig, Gemma4AssistantForCausalLM

    config = AutoConfig.from_pretrained(tiny_drafter_dir)
    assert config.model_type == "gemma4_assistant"
    model = Gemma4AssistantForCausalLM.from_pretrained(tiny_drafter_dir)
    assert model.lm_head.weight.shape == (config.text_config.vocab_size, 64)
    assert model.pre_projection.weight.shape == (64, 2 * config.backbone_hidden_size)


def test_tiny_cli_builds_the_drafter(tmp_path, capsys):
    assert main(["tiny", str(tmp_path / "d"), "--variant", "drafter", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["variant"] == "drafter"
    assert json.loads((tmp_path / "d" / "config.json").read_text())["model_type"] == "gemma4_assistant"


# -- refusals before launch ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("draft", "named"),
    [
        (_assistant_config(vocab=600), "vocabulary 600 vs the target's 512"),
        (_assistant_config(backbone=256), "backbone_hidden_size 256 vs the target's hidden size 128"),
        (
            _assistant_config(full_head=128),
            "full_attention (head size, KV heads) (128, 1) vs the target's (64, 1)",
        ),
    ],
)
def test_a_mismatched_drafter_is_refused_naming_the_mismatch(tmp_path, draft, named):
    target = _folder(tmp_path, "target", _target_config())
    drafter = _folder(tmp_path, "drafter", draft)
    with pytest.raises(Gemma4T4Error) as err:
        ServerConfig(model=target, target="cpu", draft=drafter).validate()
    assert named in err.value.message
    assert "--variant drafter" in err.value.fix


def test_a_target_model_as_drafter_is_refused_unless_draft_model(tmp_path):
    target = _folder(tmp_path, "target", _target_config())
    other = _folder(tmp_path, "other", _target_config(layer_types=("full_attention",)))
    with pytest.raises(Gemma4T4Error) as err:
        ServerConfig(model=target, target="cpu", draft=other).validate()
    assert "is a target model" in err.value.message and "draft_model" in err.value.fix
    config = ServerConfig(
        model=target, target="cpu", draft=other, draft_method="draft_model", dtype="bfloat16"
    )
    cmd = build_command(config)
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"model": other, "num_speculative_tokens": 3, "method": "draft_model"}


def test_an_assistant_cannot_run_as_a_draft_model(tmp_path):
    target = _folder(tmp_path, "target", _target_config())
    drafter = _folder(tmp_path, "drafter", _assistant_config())
    with pytest.raises(Gemma4T4Error, match="cannot run as a standalone draft model"):
        ServerConfig(model=target, target="cpu", draft=drafter, draft_method="draft_model").validate()


def test_a_whole_model_drafter_with_another_vocabulary_is_refused(tmp_path):
    target = _folder(tmp_path, "target", _target_config())
    other = _folder(tmp_path, "other", _target_config(vocab=1024))
    with pytest.raises(Gemma4T4Error, match="vocabulary 1024 vs the target's 512"):
        ServerConfig(model=target, target="cpu", draft=other, draft_method="draft_model").validate()


@pytest.mark.parametrize("num", [0, -1, 17])
def test_num_draft_tokens_outside_1_to_16_is_refused(tmp_path, num):
    target = _folder(tmp_path, "target", _target_config())
    with pytest.raises(Gemma4T4Error, match=f"num_draft_tokens={num} must be in 1..16"):
        ServerConfig(model=target, target="cpu", draft="self", num_draft_tokens=num)


def test_a_hub_id_that_is_no_assistant_is_refused():
    with pytest.raises(Gemma4T4Error, match="not a Gemma 4 assistant"):
        ServerConfig(model="google/gemma-4-E2B-it", target="t4", draft="google/gemma-4-E2B-it").validate()


def test_a_raw_speculative_config_next_to_draft_is_refused(tmp_path):
    target = _folder(tmp_path, "target", _target_config(layer_types=("full_attention",)))
    config = ServerConfig(
        model=target, target="cpu", draft="self", extra_args=['--speculative-config={"method": "ngram"}']
    )
    with pytest.raises(Gemma4T4Error, match="both set a drafter"):
        config.validate()


# -- auto, off, self and the command line ------------------------------------------------------------------


def test_auto_picks_the_qat_assistant_for_a_qat_e2b_and_the_command_carries_it():
    config = ServerConfig(
        model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4", draft="auto", num_draft_tokens=2
    )
    cmd = build_command(config)
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {
        "model": "google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant",
        "num_speculative_tokens": 2,
    }
    assert "fit calculator with the drafter: fits" in config.chosen_by["draft"]


# Google's assistants vLLM is known to serve (4 sizes x base/QAT, hub ids per hosts_as_they_are.md "Added
# 2026-12-01"; the 12B's below) for their targets, with the untuned N per size; tensor-parallel sizes where
# target and drafter fit T4s at 4,096 tokens (a bf16 26B-A4B or 31B needs eight).
AUTO_PAIRS = [
    ("google/gemma-4-E2B-it", 1, "google/gemma-4-E2B-it-assistant", 2),
    ("google/gemma-4-E2B-it-qat-w4a16-ct", 1, "google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant", 2),
    ("google/gemma-4-E4B-it", 2, "google/gemma-4-E4B-it-assistant", 4),
    ("google/gemma-4-E4B-it-qat-w4a16-ct", 1, "google/gemma-4-E4B-it-qat-q4_0-unquantized-assistant", 4),
    ("google/gemma-4-26B-A4B-it", 8, "google/gemma-4-26B-A4B-it-assistant", 2),
    (
        "google/gemma-4-26B-A4B-it-qat-q4_0-unquantized",
        8,
        "google/gemma-4-26B-A4B-it-qat-q4_0-unquantized-assistant",
        2,
    ),
    ("google/gemma-4-31B-it", 8, "google/gemma-4-31B-it-assistant", 4),
    ("google/gemma-4-31B-it-qat-w4a16-ct", 2, "google/gemma-4-31B-it-qat-q4_0-unquantized-assistant", 4),
]


@pytest.mark.parametrize(("target", "tp", "assistant", "num"), AUTO_PAIRS, ids=[p[0].split("/")[1] for p in AUTO_PAIRS])
def test_print_command_with_draft_auto_names_the_matching_assistant(target, tp, assistant, num, capsys):
    code = main(["serve", "start", "--target", "t4", "--model", target, "--draft", "auto",
                 "--tensor-parallel-size", str(tp), "--max-model-len", "4096", "--print-command", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["started"] is False, data
    assert data["speculative_config"] == {"model": assistant, "num_speculative_tokens": num}
    assert f'"model":"{assistant}"' in data["shell"]
    assert data["chosen_by"]["num_draft_tokens"].startswith("untuned N for the")  # until tune measures
    assert data["chosen_by"]["draft"].startswith("Google's assistant for")


@pytest.mark.parametrize(
    ("target", "assistant"),
    [
        ("google/gemma-4-12B-it", "google/gemma-4-12B-it-assistant"),
        ("google/gemma-4-12B-it-qat-w4a16-ct", "google/gemma-4-12B-it-qat-q4_0-unquantized-assistant"),
    ],
)
def test_auto_does_not_pick_the_12b_assistant_vllm_is_not_known_to_serve_and_says_so(target, assistant, capsys):
    """The 12B assistant is a gemma4_unified_assistant: no run of vLLM serving it was found (reference notes
    hosts_as_they_are.md, 2026-12-05), so auto stays off naming it; the user can still pass its id."""
    code = main(["serve", "start", "--target", "t4", "--model", target, "--draft", "auto",
                 "--tensor-parallel-size", "4", "--max-model-len", "4096", "--print-command", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["speculative_config"] is None and "--speculative-config" not in data["shell"], data
    why = data["chosen_by"]["draft"]
    assert why.startswith(f"off: {assistant} is not picked") and "gemma4_unified_assistant" in why
    assert f"pass --draft {assistant}" in why
    explicit = ServerConfig(model=target, target="t4", draft=assistant, tensor_parallel_size=4, max_model_len=4096)
    assert explicit.draft_plan().speculative_config() == {"model": assistant, "num_speculative_tokens": 4}


def test_an_assistants_speculative_config_leaves_the_method_out_and_gemma4_mtp_is_refused_as_one():
    """In vLLM `gemma4_mtp` is the assistant's model type; the method is `mtp`, detected when left out. A
    hand-written {"method": "gemma4_mtp"} is rejected by vLLM (reference notes hosts_as_they_are.md,
    2026-12-05), so neither --draft-method nor a raw --speculative-config may carry it."""
    assistant = "google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant"
    record = ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4", draft=assistant,
                          num_draft_tokens=2).draft_plan().speculative_config()
    assert record == {"model": assistant, "num_speculative_tokens": 2}  # no "method": vLLM detects mtp
    for method in ("gemma4_mtp", "GEMMA4_MTP"):
        with pytest.raises(Gemma4T4Error, match="model type, not a vLLM speculative method") as info:
            ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4", draft=assistant,
                         draft_method=method).draft_plan()
        assert "leave --draft-method out" in info.value.fix
    raw = json.dumps({"method": "gemma4_mtp", "model": assistant, "num_speculative_tokens": 2})
    for extra in ([f"--speculative-config={raw}"], ["--speculative-config", raw]):
        with pytest.raises(Gemma4T4Error, match="names method 'gemma4_mtp', which vLLM refuses") as info:
            ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4", extra_args=extra).validate()
        assert '"method": "mtp"' in info.value.fix
    fine = raw.replace("gemma4_mtp", "mtp")
    ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4", extra_args=[f"--speculative-config={fine}"]).validate()


def test_an_explicit_num_draft_tokens_wins_over_the_untuned_n():
    config = ServerConfig(model="google/gemma-4-E4B-it-qat-w4a16-ct", target="t4", draft="auto", num_draft_tokens=6)
    assert config.draft_plan().num_speculative_tokens == 6
    assert "num_draft_tokens" not in config.chosen_by


def test_untuned_n_for_an_unknown_pair_or_self_is_the_default():
    assert speculative.untuned_num_draft_tokens("/no/such/model", "auto")[0] == speculative.DEFAULT_NUM_DRAFT_TOKENS
    assert speculative.untuned_num_draft_tokens("google/gemma-4-E2B-it", "self")[0] == speculative.DEFAULT_NUM_DRAFT_TOKENS
    assert speculative.untuned_num_draft_tokens("google/gemma-4-E2B-it", "/a/model", "draft_model")[0] == 3
    # a catalogued assistant id names its size when the target is not in the catalog
    assert speculative.untuned_num_draft_tokens("/my/e2b-finetune", "google/gemma-4-E2B-it-assistant")[0] == 2


def test_auto_on_a_bf16_e4b_that_cannot_fit_a_t4_is_off_with_the_verdict():
    plan = ServerConfig(model="google/gemma-4-E4B-it", target="t4", draft="auto").draft_plan()
    assert not plan.enabled and "would not fit with the target (does not fit: weights" in plan.reason


@pytest.mark.parametrize(
    ("target", "assistant"),
    [
        ("google/gemma-4-E2B-it-qat-w4a16-ct", "google/gemma-4-12B-it-qat-q4_0-unquantized-assistant"),
        ("google/gemma-4-26B-A4B-it", "google/gemma-4-31B-it-assistant"),
    ],
)
def test_an_assistant_for_another_size_is_refused_by_name(target, assistant):
    with pytest.raises(Gemma4T4Error) as err:
        ServerConfig(model=target, target="t4", draft=assistant).validate()
    assert assistant in err.value.message and "differ in size" in err.value.message
    assert "--draft auto" in err.value.fix


def test_auto_is_off_when_the_drafter_would_not_fit():
    # bf16 31B cannot fit a T4 at all: auto says so instead of launching a drafter on top
    config = ServerConfig(model="google/gemma-4-31B-it", target="t4", draft="auto", max_model_len=16384)
    plan = config.draft_plan()
    assert not plan.enabled and "would not fit with the target" in plan.reason


def test_auto_on_a_folder_outside_the_catalog_is_off_with_the_reason(tiny_model_dir):
    plan = ServerConfig(model=str(tiny_model_dir), target="cpu", draft="auto").draft_plan()
    assert not plan.enabled and "not in the catalog" in plan.reason


def test_off_and_self(tiny_model_dir, tmp_path):
    off = ServerConfig(model=str(tiny_model_dir), target="cpu", dtype="bfloat16")
    assert "--speculative-config" not in build_command(off)
    all_full = _folder(tmp_path, "all-full", _target_config(layer_types=("full_attention",)))
    selfdraft = ServerConfig(model=all_full, target="cpu", dtype="bfloat16", draft="self", num_draft_tokens=4)
    cmd = build_command(selfdraft)
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {
        "model": all_full,
        "num_speculative_tokens": 4,
        "method": "draft_model",
    }


@pytest.mark.parametrize("model", ["tiny", "google/gemma-4-E2B-it"])
def test_a_draft_model_mixing_sliding_and_full_layers_is_refused(tiny_model_dir, model):
    # vLLM 0.32.0 asserts one KV cache group for a draft model; measured on the tiny model (CPU)
    model = str(tiny_model_dir) if model == "tiny" else model
    with pytest.raises(Gemma4T4Error) as err:
        ServerConfig(model=model, target="cpu", dtype="bfloat16", draft="self").validate()
    assert "All drafting layers should belong to the same kv cache group" in err.value.message
    assert "one attention type" in err.value.fix


def _print_cpu_launch(model, draft: str, num_draft_tokens: str, capsys) -> tuple[int, dict]:
    """``serve start --target cpu ... --print-command --json`` with a drafter: (exit code, JSON)."""
    code = main(["serve", "start", "--target", "cpu", "--model", str(model), "--dtype", "bfloat16",
                 "--draft", draft, "--num-draft-tokens", num_draft_tokens, "--print-command", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_print_command_shows_the_exact_speculative_config(tiny_model_dir, tiny_drafter_dir, capsys):
    code, data = _print_cpu_launch(tiny_model_dir, str(tiny_drafter_dir), "5", capsys)
    assert code == 0 and data["started"] is False
    assert data["speculative_config"] == {"model": str(tiny_drafter_dir), "num_speculative_tokens": 5}
    assert (
        f'--speculative-config \'{{"model":"{tiny_drafter_dir}","num_speculative_tokens":5}}\''
        in data["shell"]
    )


def test_cli_refuses_zero_draft_tokens_with_the_fix(tiny_model_dir, capsys):
    code, data = _print_cpu_launch(tiny_model_dir, "self", "0", capsys)
    assert code == 2 and "must be in 1..16" in data["message"] and "--draft off" in data["fix"]


# -- the catalog and the fit calculator ----------------------------------------------------------------


def test_catalog_names_only_recorded_assistant_ids():
    ids = {a.hub_id for a in assistants.ASSISTANTS.values()}
    sizes = ("E2B", "E4B", "12B", "26B-A4B", "31B")
    assert ids == {f"google/gemma-4-{s}-it-assistant" for s in sizes} | {
        f"google/gemma-4-{s}-it-qat-q4_0-unquantized-assistant" for s in sizes
    }
    assert all(a.evidence and a.weights_source and a.num_draft_tokens_source for a in assistants.ASSISTANTS.values())
    # every size has a figure; the sizes without a direct bf16 figure say what they rest on
    assert "[inferred]" in assistants.ASSISTANTS[("e2b", "qat")].weights_source
    assert all(not a.vllm_gap for (k, _), a in assistants.ASSISTANTS.items() if k != "12b")
    assert all("gemma4_unified_assistant" in a.vllm_gap for (k, _), a in assistants.ASSISTANTS.items() if k == "12b")
    assert {k: a.num_draft_tokens for (k, b), a in assistants.ASSISTANTS.items() if b == "base"} == {
        "e2b": 2, "e4b": 4, "12b": 4, "26b-a4b": 2, "31b": 4,
    }


@pytest.mark.parametrize("build", ["base", "qat"])
def test_the_26b_a4b_assistant_is_about_0_84_gb_as_deployed_not_322_mb(build):
    """A deployment saw ~0.42 B parameters and the weights grow by 0.78 GiB (reference notes
    hosts_as_they_are.md, 2026-12-05): ~840 MB bf16, about the 12B assistant's 862 MB."""
    assistant = assistants.ASSISTANTS[("26b-a4b", build)]
    assert assistant.weights_bytes == 840 * assistants.MB
    assert 0.78 * 2**30 <= assistant.weights_bytes <= 0.42e9 * 2 * 1.01
    assert "0.42 B parameters" in assistant.weights_source and "2026-12-05" in assistant.weights_source


def test_fit_counts_the_drafter_weights_and_a_whole_model_drafter_kv():
    plain = models.fit("e2b", "qat-w4a16", context_len=16384)
    assistant = assistants.assistant_for("e2b", "qat")[0]
    drafted = models.fit("e2b", "qat-w4a16", context_len=16384, draft_weights_bytes=assistant.weights_bytes)
    assert drafted.weights_gib == pytest.approx(plain.weights_gib + assistant.weights_bytes / 2**30, abs=1e-3)
    assert drafted.kv_gib_per_sequence == plain.kv_gib_per_sequence  # an assistant reads the target's KV
    own_kv = models.fit("e2b", "qat-w4a16", context_len=16384, draft_own_kv=True)
    assert own_kv.kv_gib_per_sequence == pytest.approx(2 * plain.kv_gib_per_sequence, rel=1e-3)
    assert own_kv.kv_token_capacity == pytest.approx(plain.kv_token_capacity / 2, rel=1e-3)
    with pytest.raises(Gemma4T4Error):
        models.fit("e2b", "qat-w4a16", draft_weights_bytes=-1)


# -- the counters ---------------------------------------------------------------------------------------

METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} {p2}
"""


def test_spec_decode_delta_known_numbers():
    before = snapshot_from_text(METRICS.format(drafts=10, draft_tokens=30, accepted=12, p0=8, p1=3, p2=1))
    after = snapshot_from_text(
        METRICS.format(drafts=110, draft_tokens=330, accepted=162, p0=88, p1=53, p2=21)
    )
    spec = spec_decode_delta(before, after)
    assert (spec.drafts, spec.draft_tokens, spec.accepted_tokens) == (100, 300, 150)
    assert spec.acceptance_rate == pytest.approx(0.5)
    assert spec.mean_accepted_length == pytest.approx(2.5)
    assert spec.per_position_acceptance == pytest.approx([0.8, 0.5, 0.2])
    assert spec.source == "/metrics"


def test_spec_decode_delta_is_none_without_counters():
    plain = snapshot_from_text('vllm:prefix_cache_queries_total{engine="0"} 5\n')
    assert spec_decode_delta(plain, plain) is None
    after = snapshot_from_text(METRICS.format(drafts=1, draft_tokens=3, accepted=3, p0=1, p1=1, p2=1))
    assert spec_decode_delta(None, after).source == "unavailable"


# -- SageMaker and MCP carry the same drafter ------------------------------------------------------------


def test_sagemaker_passes_the_speculative_config_through_the_container_env(tmp_path):
    from gemma4_t4.sagemaker.config import DeployConfig

    env = DeployConfig(model_id="google/gemma-4-E2B-it", draft="auto", num_draft_tokens=2).container_env()
    assert json.loads(env["SM_VLLM_SPECULATIVE_CONFIG"]) == {
        "model": "google/gemma-4-E2B-it-assistant",
        "num_speculative_tokens": 2,
    }
    assert "SM_VLLM_SPECULATIVE_CONFIG" not in DeployConfig(model_id="google/gemma-4-E2B-it").container_env()
    local = _folder(tmp_path, "drafter", _assistant_config())
    with pytest.raises(Gemma4T4Error, match="the SageMaker container cannot read"):
        DeployConfig(model_id="google/gemma-4-E2B-it", draft=local).container_env()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_start_tool_takes_the_drafter_parameters():
    from mcp import Client

    from gemma4_t4.mcp_server import build_server

    async with Client(build_server()) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    properties = tools["start_vllm_server"].input_schema["properties"]
    # left out, N follows the tune profile, else the assistant's size (2 for E2B, 4 for E4B ...)
    assert properties["draft"]["default"] == "off" and properties["num_draft_tokens"]["default"] is None


def test_run_comparison_shows_drafter_off_against_on():
    from gemma4_t4.bench.compare import CellComparison, RunComparison
    from gemma4_t4.bench.schemas import SpecDecode

    on = SpecDecode(
        drafts=10,
        draft_tokens=30,
        accepted_tokens=15,
        acceptance_rate=0.5,
        mean_accepted_length=2.5,
        source="/metrics",
    )
    comparison = RunComparison("off", "on", [CellComparison(("decode",), "c1", "c1", [], None, on)])
    (row,) = comparison.table_rows()
    assert row == {"cell": "c1", "metric": "drafter", "A": "off", "B": "accepted 50.0%, mean accepted length 2.50"}
    assert "accepted 50.0%, mean accepted length 2.50" in str(comparison)


def test_sagemaker_deploy_cli_plan_carries_the_drafter(capsys, monkeypatch):
    from gemma4_t4.cli import main as cli_main

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    image = "763104351884.dkr.ecr.us-east-2.amazonaws.com/vllm:0.30.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.2"
    code = cli_main(["sagemaker", "deploy", "--name", "g6", "--model-id", "google/gemma-4-E2B-it",
                     "--instance-type", "ml.g6.xlarge", "--region", "us-east-2", "--image-uri", image,
                     "--draft", "auto", "--num-draft-tokens", "2", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and "SM_VLLM_SPECULATIVE_CONFIG" in out and "google/gemma-4-E2B-it-assistant" in out
    assert cli_main(["sagemaker", "deploy", "--name", "g6", "--model-id", "google/gemma-4-E2B-it",
                     "--instance-type", "ml.g6.xlarge", "--region", "us-east-2", "--image-uri", image,
                     "--draft", "auto", "--num-draft-tokens", "0", "--dry-run"]) == 2


def test_the_untuned_n_follows_the_size_on_every_venue_and_tool():
    """The cpu target and the MCP tool and drafter comparison (which leave N to the launch) use the
    size recipe too, not one N for every size."""
    from gemma4_t4.serving.server_config import ServerConfig, target_defaults

    for target in ("cpu", "t4"):
        config = ServerConfig(model="google/gemma-4-E4B-it", target=target, draft="auto")
        assert target_defaults(config)["num_draft_tokens"][0] == 4, target
    config = ServerConfig(model="google/gemma-4-E2B-it", target="cpu", draft="auto")
    assert target_defaults(config)["num_draft_tokens"][0] == 2


def test_a_sagemaker_deploy_drafts_the_sizes_n_unless_told():
    from gemma4_t4.sagemaker.config import DeployConfig

    e4b = DeployConfig(model_id="google/gemma-4-E4B-it", draft="auto", region="us-east-2")
    assert e4b.draft_plan().num_speculative_tokens == 4
    told = DeployConfig(model_id="google/gemma-4-E4B-it", draft="auto", num_draft_tokens=3, region="us-east-2")
    assert told.draft_plan().num_speculative_tokens == 3


@pytest.mark.parametrize("bad", [{"per_layer_config": {"0": 5}}, {"layer_types": [["x"]]},
                                 {"layer_types": ["full_attention", 7]}])
def test_a_drafter_config_with_malformed_layer_fields_is_a_clear_error(tmp_path, bad):
    folder = tmp_path / "drafter"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "gemma4_text", "head_dim": 256, "num_key_value_heads": 1,
        "layer_types": ["sliding_attention", "full_attention"], **bad,
    }))
    with pytest.raises(Gemma4T4Error, match=r"cannot read .*config\.json: (per_layer_config|layer_types)") as refused:
        speculative.read_shape(str(folder))
    assert "config.json" in refused.value.fix
