"""The launch settings are declared once, on ServerSettings: every one is a flag of ``serve start`` with its
help, and the MCP tool ``start_vllm_server`` takes the safe ones with the same help (its own defaults and
limits kept); the flags give the configs they always gave, and both surfaces refuse alike."""

from __future__ import annotations

import argparse
import json
import sys

import pytest
from mcp import Client

from gemma4_t4 import mcp_server
from gemma4_t4.cli import build_parser, main
from gemma4_t4.cli import serve as serve_cli
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.launch_record import ServerSettings, help_for, user_settings
from gemma4_t4.sagemaker.config import DeployConfig
from gemma4_t4.sagemaker.image import DEFAULT_VLLM_TAG
from gemma4_t4.serving.server_config import DEFAULT_T4_MODEL, WHEN_UNSET, ServerConfig

SETTINGS = user_settings(ServerSettings)


def setting_help(name: str, default: object = None) -> str:
    return help_for(ServerConfig, name, default)
# Every flag of `serve start`, as users have always typed them, and its destination (a tri-state's flags set one).
FLAGS = {
    "--target": "target", "--model": "model", "--served-model-name": "served_model_name", "--host": "host",
    "--port": "port", "--work-dir": "work_dir", "--dtype": "dtype", "--max-model-len": "max_model_len",
    "--max-num-seqs": "max_num_seqs", "--max-num-batched-tokens": "max_num_batched_tokens",
    "--gpu-memory-utilization": "gpu_memory_utilization", "--tensor-parallel-size": "tensor_parallel_size",
    "--language-model-only": "language_model_only", "--multimodal": "language_model_only",
    "--no-prefix-caching": "enable_prefix_caching", "--compile": "enforce_eager", "--eager": "enforce_eager",
    "--kv-cache-space": "kv_cache_space_gib", "--block-size": "block_size", "--api-key": "api_key",
    "--python": "python", "--vllm-arg": "extra_args", "--env": "extra_env", "--restart-on-crash": "restart_on_crash",
    "--draft": "draft", "--num-draft-tokens": "num_draft_tokens", "--draft-method": "draft_method",
    "--print-command": "print_command", "--timeout": "timeout", "--no-wait": "no_wait", "--force": "force",
    "--no-gate": "no_gate",
}  # fmt: skip
# What `serve start` with no flag passes on (None: the target's default, see WHEN_UNSET; the model: t4's). The
# target is the declaration's one default, cpu (the CLI said t4, the config and the MCP tool cpu).
CLI_DEFAULTS = {
    "target": "cpu", "model": None, "served_model_name": None, "host": "127.0.0.1", "port": 8000,
    "work_dir": ".cache/gemma4_t4", "dtype": None, "max_model_len": None, "max_num_seqs": None,
    "max_num_batched_tokens": None, "gpu_memory_utilization": None, "tensor_parallel_size": None,
    "language_model_only": None, "enable_prefix_caching": None, "enforce_eager": None, "kv_cache_space_gib": 1,
    "block_size": None, "api_key": None, "python": None, "extra_args": None, "extra_env": None, "restart_on_crash": 0,
    "draft": None, "num_draft_tokens": None, "draft_method": None, "print_command": False, "timeout": 1800.0,
    "no_wait": False, "force": False, "no_gate": False,
}  # fmt: skip
# start_vllm_server's parameters and their defaults (port None: a free one; a vLLM setting None: the target's
# default, as serve start's, where the tool said 4096 tokens and 8 sequences of its own) and the settings it takes
# beyond them; never host, api_key, python, extra args or env, work_dir.
MCP_DEFAULTS = {
    "model": None, "target": "cpu", "port": None, "served_model_name": None, "max_model_len": None,
    "max_num_seqs": None, "timeout_s": 600.0, "draft": "off", "num_draft_tokens": None, "dtype": None,
    "max_num_batched_tokens": None, "gpu_memory_utilization": None, "tensor_parallel_size": None,
    "kv_cache_space_gib": 1, "block_size": None, "draft_method": None,
}  # fmt: skip


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _start_parser() -> argparse.ArgumentParser:
    parser = build_parser("serve")
    for word in ("serve", "start"):
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    return parser


def _flags() -> dict[str, argparse.Action]:
    return {option: action for action in _start_parser()._actions for option in action.option_strings}


def _help_text() -> str:
    return " ".join(_start_parser().format_help().split())


def test_every_launch_setting_is_declared_with_one_line_of_help():
    assert set(SETTINGS) == set(ServerSettings.model_fields) - {"probe_cpu_attention", "chosen_by"}
    for name, field in SETTINGS.items():
        assert field.description and "\n" not in field.description, name
    # the texts that quote the launch constants are composed where those live (serving), on None only
    assert setting_help("max_model_len") == f"{SETTINGS['max_model_len'].description} ({WHEN_UNSET['max_model_len']})"
    assert setting_help("max_model_len", 4096) == SETTINGS["max_model_len"].description


def test_every_launch_setting_is_a_serve_start_flag_with_its_help():
    flags = _flags()
    assert {flag: action.dest for flag, action in flags.items() if flag not in ("-h", "--help", "--json", "--debug")} == FLAGS
    assert set(SETTINGS) <= set(FLAGS.values())
    for name, field in SETTINGS.items():
        switches = (field.json_schema_extra or {}).get("switches")
        if switches:  # a tri-state: each flag sets its value, with its own help
            for flag, (value, text) in switches.items():
                assert (flags[flag].const, flags[flag].help) == (value, text), flag
            continue
        flag = next(f for f, dest in FLAGS.items() if dest == name)
        assert flags[flag].help.startswith(setting_help(name, flags[flag].default)), flag
    defaults = vars(_start_parser().parse_args([]))
    assert {name: defaults[name] for name in CLI_DEFAULTS} == CLI_DEFAULTS
    text = _help_text()
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "draft",
                 "num_draft_tokens"):
        assert WHEN_UNSET[name] in text, name  # the help states what the launch really uses when left out
    assert "t4 (this GPU) or cpu, any case (default cpu)" in text
    assert f"hub id or local folder (t4 default: {DEFAULT_T4_MODEL})" in text


def _print_command(monkeypatch, capsys, *argv: str) -> tuple[int, ServerConfig | None, str]:
    """``serve start --print-command ARGV``: its exit code, the config it printed and its output."""
    seen: list[ServerConfig] = []
    printed = serve_cli._print_command

    def record(config):
        seen.append(config)
        return printed(config)

    monkeypatch.setattr(serve_cli, "_print_command", record)
    monkeypatch.delenv("GEMMA4_T4_API_KEY", raising=False)
    capsys.readouterr()
    code = main(["serve", "start", "--print-command", "--json", *argv])
    out = capsys.readouterr()
    return code, (seen[0] if seen else None), out.out + out.err


def test_print_command_with_every_flag_gives_the_config_it_always_gave(monkeypatch, capsys, tmp_path):
    work = str(tmp_path / "w")
    code, config, out = _print_command(
        monkeypatch, capsys, "--target", "T4", "--model", "org/some-model", "--served-model-name", "svc",
        "--host", "0.0.0.0", "--api-key", "k3y-Secret-77", "--port", "9001", "--work-dir", work, "--dtype", "float16",
        "--max-model-len", "2048", "--max-num-seqs", "3", "--max-num-batched-tokens", "1024",
        "--gpu-memory-utilization", "0.8", "--tensor-parallel-size", "2", "--multimodal", "--no-prefix-caching",
        "--compile", "--kv-cache-space", "3", "--block-size", "16", "--python", sys.executable,
        "--vllm-arg=--seed=1", "--env", "A=1", "--env", "B=x=y", "--restart-on-crash", "2", "--draft", "off",
        "--num-draft-tokens", "4", "--draft-method", "MTP")
    assert code == 0, out
    given = {name: getattr(config, name) for name in SETTINGS}
    assert given == {
        "model": "org/some-model", "target": "t4", "served_model_name": "svc", "host": "0.0.0.0", "port": 9001,
        "dtype": "float16", "max_model_len": 2048, "max_num_seqs": 3, "enable_prefix_caching": False,
        "enforce_eager": False, "max_num_batched_tokens": 1024, "gpu_memory_utilization": 0.8,
        "tensor_parallel_size": 2, "language_model_only": False, "kv_cache_space_gib": 3, "block_size": 16,
        "api_key": "k3y-Secret-77", "extra_args": ["--seed=1"], "extra_env": {"A": "1", "B": "x=y"},
        "work_dir": work, "python": sys.executable, "restart_on_crash": 2, "draft": "off", "num_draft_tokens": 4,
        "draft_method": "mtp",
    }  # fmt: skip
    assert list(config.chosen_by) == ["draft"]  # every setting was given: no target default, only the plan's reason
    data = json.loads(out)
    assert "k3y-Secret-77" not in out and data["env"]["VLLM_API_KEY"] == "***"
    command = " ".join(data["command"])
    assert "--host 0.0.0.0 --port 9001 --dtype float16 --max-model-len 2048 --max-num-seqs 3" in command
    assert "--no-enable-prefix-caching" in command and "--enforce-eager" not in command
    assert "--tensor-parallel-size 2" in command and "--language-model-only" not in command


@pytest.mark.parametrize(
    "argv, eager, text_only, prefix",
    [
        ([], None, None, True),
        (["--eager", "--language-model-only", "--no-prefix-caching"], True, True, False),
        (["--compile", "--multimodal"], False, False, True),
        (["--eager", "--compile", "--language-model-only", "--multimodal"], True, True, True),  # as ever: True wins
    ],
    ids=["none", "on", "off", "both"],
)
def test_the_tri_state_flags_give_true_false_or_the_target_default(monkeypatch, capsys, argv, eager, text_only,
                                                                    prefix):
    code, config, out = _print_command(monkeypatch, capsys, "--target", "cpu", "--model", "m", "--dtype", "float32",
                                       *argv)
    assert code == 0, out
    assert config.enable_prefix_caching is prefix
    for name, given in (("enforce_eager", eager), ("language_model_only", text_only)):
        if given is None:  # left out: the cpu default, with its reason
            assert name in config.chosen_by, name
        else:
            assert getattr(config, name) is given and name not in config.chosen_by, name


def test_the_api_key_comes_from_the_environment_when_not_given(monkeypatch, capsys):
    printed = serve_cli._print_command
    seen: list[ServerConfig] = []
    monkeypatch.setattr(serve_cli, "_print_command", lambda config: seen.append(config) or printed(config))
    monkeypatch.setenv("GEMMA4_T4_API_KEY", "env-Key-4242")
    argv = ["serve", "start", "--print-command", "--target", "cpu", "--model", "m", "--dtype", "float32"]
    assert main([*argv, "--host", "0.0.0.0"]) == 0 and seen[-1].api_key == "env-Key-4242"
    assert main([*argv, "--api-key", "flag-Key-4242"]) == 0 and seen[-1].api_key == "flag-Key-4242"
    assert "Key-4242" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message, fix",
    [
        (["--target", "cpu"], "--model is required with --target cpu", "gemma4-t4 tiny models/tiny-gemma4"),
        (["--target", "cpu", "--model", "m", "--env", "NOVALUE"], "--env expects KEY=VALUE, got 'NOVALUE'",
         "--env VLLM_LOGGING_LEVEL=DEBUG"),
        (["--target", "cpu", "--model", "m", "--host", "0.0.0.0"], "binding 0.0.0.0 without an API key",
         "bind 127.0.0.1"),
        (["--target", "cpu", "--model", "m", "--dtype", "float32", "--gpu-memory-utilization", "1.5"],
         "gpu_memory_utilization=1.5 must be in 0.1..0.99", "0.90"),
    ],
    ids=["cpu-without-model", "env-without-value", "public-host", "memory-share"],
)
def test_serve_start_refuses_as_it_always_has(monkeypatch, capsys, argv, message, fix):
    code, config, out = _print_command(monkeypatch, capsys, *argv)
    assert code == 2 and message in out and fix in out, out


async def _start_tool_schema() -> dict:
    async with Client(mcp_server.build_server()) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    return tools["start_vllm_server"].input_schema


@pytest.mark.anyio
async def test_start_vllm_server_takes_its_settings_described_with_todays_defaults_and_limits():
    schema = await _start_tool_schema()
    properties = schema["properties"]
    assert set(properties) == set(MCP_DEFAULTS) and schema["required"] == ["model"]
    for name, default in MCP_DEFAULTS.items():
        assert properties[name]["description"], name
        if name != "model":
            assert properties[name]["default"] == default, name
        if name in SETTINGS and name != "model":  # the model is required: no "t4 default" of serve start's
            assert properties[name]["description"] == setting_help(name, properties[name].get("default")), name
    assert properties["model"]["description"] == SETTINGS["model"].description
    # a default of None says what the launch uses then, as serve start's help does
    assert WHEN_UNSET["num_draft_tokens"] in properties["num_draft_tokens"]["description"]
    assert properties["max_model_len"]["description"] == f"tokens per sequence, prompt + output ({WHEN_UNSET['max_model_len']})"
    limits = json.dumps(properties)
    port = json.dumps(properties["port"])
    assert '"minimum": 1024' in port and '"maximum": 65535' in port
    assert '"minimum": 256' in json.dumps(properties["max_model_len"])
    assert '"maximum": 1048576' in json.dumps(properties["max_model_len"])
    assert '"maximum": 1024' in json.dumps(properties["max_num_seqs"]) and properties["timeout_s"]["exclusiveMinimum"] == 0
    assert '"maximum": 16' in json.dumps(properties["num_draft_tokens"])
    assert {"type": "string"} in properties["draft"]["anyOf"]  # or null: its default, off
    assert {"enum": ["t4", "cpu"], "type": "string"} in properties["target"]["anyOf"] and '"draft_model"' in json.dumps(properties["draft_method"])
    assert "api_key" not in limits and "host" not in properties


async def _start_recorded(monkeypatch, tmp_path, arguments: dict) -> tuple[list[ServerConfig], object]:
    """Call start_vllm_server with the launch replaced by a recorder: the configs it would start, and the answer."""
    seen: list[ServerConfig] = []

    def recorder(config, **_kwargs):
        seen.append(config)
        raise Gemma4T4Error("recorded, not started", fix="nothing to do")

    monkeypatch.setenv("GEMMA4_T4_WORK_DIR", str(tmp_path / "mcp"))
    monkeypatch.setattr(mcp_server, "start_server", recorder)
    async with Client(mcp_server.build_server()) as client:
        return seen, await client.call_tool("start_vllm_server", arguments)


@pytest.mark.anyio
async def test_the_mcp_tool_and_serve_start_give_the_same_config(monkeypatch, capsys, tmp_path):
    seen, answer = await _start_recorded(monkeypatch, tmp_path, {
        "model": "m", "port": 9002, "served_model_name": "svc", "dtype": "float32", "max_model_len": 2048,
        "max_num_seqs": 3, "max_num_batched_tokens": 1024, "gpu_memory_utilization": 0.5, "kv_cache_space_gib": 2,
        "block_size": 16, "num_draft_tokens": 2, "draft_method": "mtp"})
    assert "recorded, not started" in answer.content[0].text
    code, config, out = _print_command(
        monkeypatch, capsys, "--target", "cpu", "--model", "m", "--port", "9002", "--served-model-name", "svc",
        "--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "3", "--max-num-batched-tokens", "1024",
        "--gpu-memory-utilization", "0.5", "--kv-cache-space", "2", "--block-size", "16", "--draft", "off",
        "--num-draft-tokens", "2", "--draft-method", "mtp", "--work-dir", str(tmp_path / "mcp"))
    assert code == 0, out
    assert seen[0].model_dump(exclude={"chosen_by"}) == config.model_dump(exclude={"chosen_by"})
    assert seen[0].chosen_by == {k: v for k, v in config.chosen_by.items() if k != "draft"}  # the plan's, at launch
    # left out: today's MCP defaults (a free port, cpu, 4096 tokens, 8 sequences, no drafter)
    seen, _ = await _start_recorded(monkeypatch, tmp_path, {"model": "m"})
    (plain,) = seen
    assert (plain.target, plain.max_model_len, plain.max_num_seqs, plain.draft) == ("cpu", 4096, 8, "off")
    assert 1024 <= plain.port <= 65535 and plain.host == "127.0.0.1" and plain.work_dir == str(tmp_path / "mcp")
    # a JSON null means the same as leaving the setting out (issue 41/44: null must mean the default)
    seen, answer = await _start_recorded(monkeypatch, tmp_path, {
        "model": "m", "port": None, "target": None, "max_model_len": None, "max_num_seqs": None, "draft": None})
    assert len(seen) == 1, answer.content[0].text
    (null,) = seen
    assert (null.target, null.max_model_len, null.max_num_seqs, null.draft) == ("cpu", 4096, 8, "off")
    assert 1024 <= null.port <= 65535


@pytest.mark.anyio
@pytest.mark.parametrize(
    "arguments, message",
    [
        # outside the declared boundary: the SDK refuses it before the tool runs, naming the parameter
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization\n  Input should be less than or equal to 0.99"),
        ({"block_size": 0}, "block_size\n  Input should be greater than or equal to 1"),
        # within it: the start gate refuses as serve start does, with the fix
        ({"target": "cpu", "draft": "self", "draft_method": "mtp"}, "leave --draft-method out with --draft self"),
    ],
    ids=["memory-share", "block-size", "draft-method"],
)
async def test_the_mcp_tool_refuses_a_setting_as_serve_start_does(monkeypatch, tmp_path, arguments, message):
    monkeypatch.setenv("GEMMA4_T4_WORK_DIR", str(tmp_path))
    async with Client(mcp_server.build_server()) as client:
        answer = await client.call_tool("start_vllm_server", {"model": "m", "dtype": "float32", **arguments})
    assert answer.is_error and message in answer.content[0].text
    assert mcp_server._OWNED == []  # refused before anything was launched


@pytest.mark.anyio
async def test_the_mcp_tool_takes_no_host_api_key_or_extra_arguments(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMA4_T4_WORK_DIR", str(tmp_path))
    async with Client(mcp_server.build_server()) as client:
        for name, value in (("host", "0.0.0.0"), ("api_key", "k"), ("extra_args", ["--x"]), ("python", "/bin/sh")):
            answer = await client.call_tool("start_vllm_server", {"model": "m", name: value})
            assert answer.is_error and f"takes no argument '{name}'" in answer.content[0].text, name
    assert mcp_server._OWNED == []


LONG_NAME = "a" * 1024  # no "/": a local folder's name, longer than any filesystem's


@pytest.mark.anyio
async def test_a_model_name_too_long_for_a_folder_is_refused_with_a_fix_not_the_filesystems_error(
    monkeypatch, capsys, tmp_path
):
    """A 1,024-character model id without a "/" ended in a raw OSError (File name too long) from the fit
    calculator's look at the disk; every surface now refuses it as a setting, naming it and the fix."""
    words = "has a part longer than 255 bytes, which is neither a hub id nor a folder name"
    code, _, out = _print_command(monkeypatch, capsys, "--target", "t4", "--model", LONG_NAME)
    assert code == 2 and f"model {LONG_NAME[:40]!r}... {words}" in out and "OSError" not in out, out
    code = main(["sagemaker", "deploy", "--dry-run", "--json", "--image-tag", DEFAULT_VLLM_TAG, "--model-id", LONG_NAME])
    out = capsys.readouterr()
    assert code == 2 and f"model_id {LONG_NAME[:40]!r}... {words}" in out.out + out.err
    monkeypatch.setenv("GEMMA4_T4_WORK_DIR", str(tmp_path))
    async with Client(mcp_server.build_server()) as client:
        started = await client.call_tool("start_vllm_server", {"model": LONG_NAME, "target": "t4"})
        planned = (await client.call_tool("get_deployment_config", {"model_id": LONG_NAME})).structured_content
        drafted = await client.call_tool("start_vllm_server", {"model": "m", "draft": LONG_NAME})
    assert started.is_error and words in started.content[0].text
    assert planned["valid"] is False and words in planned["problem"] and "hub id" in planned["fix"]
    assert drafted.is_error and words in drafted.content[0].text
    assert mcp_server._OWNED == []


@pytest.mark.parametrize("given", [None, 7, ["model", "m"]])
def test_settings_that_are_not_a_mapping_are_refused_in_words_not_with_a_raw_error(given):
    for config in (ServerConfig, DeployConfig):
        with pytest.raises(Gemma4T4Error, match=f"^{config.__name__}: ") as info:
            config.model_validate(given)
        assert "mapping" in info.value.fix
