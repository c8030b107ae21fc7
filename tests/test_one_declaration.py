"""The vLLM settings are declared once (``foundation.launch_record.VLLMSettings``, which the local server's
``ServerSettings`` and SageMaker's ``DeployConfig`` extend), and their CLI flags and MCP parameters are built by
one builder each (``launch_record.add_setting_flags``, ``mcp_boundary.offered``); the CLI and the MCP tool deploy
through one flow (``sagemaker.deploy.run_deploy``). Each check reads the package's source and shows first, on a
small sample, that it finds what it looks for."""

from __future__ import annotations

import ast
from pathlib import Path

from gemma4_t4.foundation.launch_record import VLLMSettings, declared

PACKAGE = Path(__file__).resolve().parents[1] / "gemma4_t4"
HOME = "gemma4_t4/foundation/launch_record.py"  # the declaration and the flag builder
SETTINGS = set(VLLMSettings.model_fields)
# A class declaring this many of the ten as fields is the settings written again, whatever it calls them.
REDECLARED_AT = 5
# Flags spelt like a vLLM setting's outside the builder, each with why it is another thing.
FOREIGN_FLAGS = {
    ("gemma4_t4/cli/models.py", "--gpu-memory-utilization"): "gemma4-t4 fit's what-if input to the fit "
    "calculator (no server is launched), with the T4 launch's 0.9 as its default",
    ("gemma4_t4/cli/models.py", "--max-num-seqs"): "gemma4-t4 fit's what-if input to the fit calculator",
}
# Fields named like a vLLM setting and described, each with why it is another thing.
FOREIGN_FIELDS = {
    ("gemma4_t4/bench/args.py", "BenchOptions", "max_num_seqs"): "the measured server's value, read to label the "
    "cells above it as queueing; a benchmark launches nothing",
    ("gemma4_t4/studies/tune.py", "PlanCell", "num_draft_tokens"): "one cell of the tune plan: a value it measures",
}


def _flag(name: str) -> str:
    return declared(VLLMSettings.model_fields[name]).get("flag", "--" + name.replace("_", "-"))


FLAGS = {_flag(name) for name in SETTINGS}


def _is_setting_call(value: ast.expr | None) -> bool:
    """A field declared as a user's setting: ``setting(...)``, ``Field(..., description=...)``, or a dataclass
    ``field(metadata=...)`` (the old way of carrying help)."""
    if not isinstance(value, ast.Call):
        return False
    name = value.func.id if isinstance(value.func, ast.Name) else getattr(value.func, "attr", "")
    keywords = {k.arg for k in value.keywords}
    return name == "setting" or (name == "Field" and "description" in keywords) or (
        name == "field" and "metadata" in keywords)


def settings_declared_twice(sources: dict[str, str]) -> list[str]:
    """Each class, but VLLMSettings, that declares a vLLM setting as a user's setting, or that declares
    :data:`REDECLARED_AT` or more of them as fields."""
    found = []
    for path, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ClassDef) or node.name == "VLLMSettings":
                continue
            fields = {s.target.id: s.value for s in node.body
                      if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            mine = sorted(set(fields) & SETTINGS)
            again = [name for name in mine
                     if _is_setting_call(fields[name]) and (path, node.name, name) not in FOREIGN_FIELDS]
            if again or len(mine) >= REDECLARED_AT:
                found.append(f"{path}: {node.name} declares {', '.join(again or mine)}")
    return found


def flags_built_elsewhere(sources: dict[str, str]) -> list[str]:
    """Each ``add_argument`` of a vLLM setting's flag outside the one builder (and :data:`FOREIGN_FLAGS`)."""
    found = []
    for path, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
                continue
            flags = {a.value for a in node.args if isinstance(a, ast.Constant) and a.value in FLAGS}
            found += [f"{path}:{node.lineno} {flag}" for flag in sorted(flags)
                      if path != HOME and (path, flag) not in FOREIGN_FLAGS]
    return found


def mcp_parameters_written_by_hand(sources: dict[str, str]) -> list[str]:
    """Each parameter named like a vLLM setting in a function registered as an MCP tool (``@tool(...)``): the
    tools take those only through ``takes_settings(offered(...))``, generated from the declaration."""
    found = []
    for path, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.FunctionDef):
                continue
            if not any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "tool" for d in node.decorator_list):
                continue
            arguments = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
            found += [f"{path}: {node.name}({a.arg})" for a in arguments if a.arg in SETTINGS]
    return found


def _package() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE.parent)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


SAMPLE = '''
class VLLMSettings(BaseModel):
    max_model_len: int | None = setting(None, "tokens", assistant_sets())

class Deploy(VLLMSettings):
    region: str = setting("us-east-2", "AWS region", assistant_sets())

class Again(BaseModel):
    dtype: str | None = Field(None, description="vLLM's --dtype")

@dataclass
class Old:
    max_num_seqs: int = field(default=4, metadata={"help": "concurrent sequences"})

@dataclass
class Record:
    served_model_name: str
    dtype: str
    max_model_len: int
    max_num_seqs: int
    gpu_memory_utilization: float

class Measured(BaseModel):
    dtype: str  # a measurement, not a setting

def register(p):
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--prompt")

@tool(CREATES)
def start(model: str, max_num_seqs: int = 8) -> None: ...

@tool(CREATES)
@takes_settings(offered(ServerConfig, sagemaker=False))
def generated(*, timeout_s: float = 1.0, **settings: object) -> None: ...
'''


def test_the_finders_find_a_setting_declared_again_and_a_flag_or_parameter_written_by_hand():
    sample = {"gemma4_t4/sample.py": SAMPLE}
    assert settings_declared_twice(sample) == [
        "gemma4_t4/sample.py: Again declares dtype",
        "gemma4_t4/sample.py: Old declares max_num_seqs",
        "gemma4_t4/sample.py: Record declares dtype, gpu_memory_utilization, max_model_len, max_num_seqs, "
        "served_model_name",
    ]
    assert flags_built_elsewhere(sample) == ["gemma4_t4/sample.py:27 --max-model-len"]
    assert flags_built_elsewhere({HOME: SAMPLE}) == []  # the builder itself
    assert mcp_parameters_written_by_hand(sample) == ["gemma4_t4/sample.py: start(max_num_seqs)"]


def test_each_vllm_setting_is_declared_in_one_class():
    assert settings_declared_twice(_package()) == []
    classes = {(path, node.name) for path, source in _package().items() for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.ClassDef)}
    assert {(path, name) for path, name, _ in FOREIGN_FIELDS} <= classes, "a stale exception must leave"
    assert len(SETTINGS) == 10  # served name, dtype, lengths, sequences, GPUs, memory share, args, env, drafter


def test_their_flags_are_built_by_the_one_builder_only():
    assert flags_built_elsewhere(_package()) == []
    found = {(path, flag) for path, source in _package().items() for flag in FLAGS if f'"{flag}"' in source}
    assert set(FOREIGN_FLAGS) <= found, "an exception whose flag is gone must leave FOREIGN_FLAGS"


def test_their_mcp_parameters_come_from_the_declaration_only():
    assert mcp_parameters_written_by_hand(_package()) == []


DEPLOYERS = {"deploy", "deploy_in_background", "deploy_with_failover"}  # what run_deploy chooses between


def deploys_outside_the_flow(sources: dict[str, str]) -> list[str]:
    """Each call of a deployer by name (not through ``run_deploy``) in the CLI's and the MCP server's source."""
    return [f"{path}:{node.lineno} {node.func.id}" for path, source in sources.items()
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in DEPLOYERS]


def test_the_cli_and_the_mcp_tool_deploy_through_the_one_flow():
    sample = "def tool():\n    run = run_deploy(config, act=True)\n    return deploy(config, wait=False)\n"
    assert deploys_outside_the_flow({"sample.py": sample}) == ["sample.py:3 deploy"]
    adapters = {path: source for path, source in _package().items()
                if path in ("gemma4_t4/cli/sagemaker.py", "gemma4_t4/mcp_server.py")}
    assert len(adapters) == 2 and all("run_deploy(" in source for source in adapters.values())
    assert deploys_outside_the_flow(adapters) == []


def test_a_settings_limits_are_declared_once_and_an_assistants_bound_only_narrows_them():
    """A setting's limits are its pydantic constraint (``setting(ge=..., le=...)``), which every config, flag and
    MCP parameter obeys; the assistant's rule may add a stricter bound (max_model_len >= 256), never repeat one."""
    from gemma4_t4.foundation.launch_record import ServerSettings, assistant_boundary, user_settings
    from gemma4_t4.sagemaker.config import DeployConfig

    for model in (ServerSettings, DeployConfig):
        for name, field in user_settings(model).items():
            own = {key: getattr(rule, key) for rule in field.metadata for key in ("ge", "gt", "le")
                   if hasattr(rule, key)}
            rule = assistant_boundary(field) or {}
            if "ge" in rule:
                assert rule["ge"] > own.get("ge", own.get("gt", float("-inf"))), f"{model.__name__}.{name}"
            if "le" in rule:
                assert rule["le"] < own.get("le", float("inf")), f"{model.__name__}.{name}"
