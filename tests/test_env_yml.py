"""environment.yml stays consistent with pyproject.toml and with the doctor's GPU stack."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gemma4_t4.env import GPU_VLLM, VLLM_TORCH, VLLM_TRANSFORMERS_RANGE

REPO = Path(__file__).resolve().parents[1]


def _load():
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return env, project


def test_python_within_requires_python():
    env, project = _load()
    pythons = [d for d in env["dependencies"] if isinstance(d, str) and re.match(r"python\b", d)]
    assert len(pythons) == 1
    version = pythons[0].split("=", 1)[1].strip("=")
    assert Version(version) in SpecifierSet(project["requires-python"])


def test_pip_installs_existing_extras_for_a_t4_user():
    env, project = _load()
    pip_lines = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    installs = [line for line in pip_lines if line.startswith("-e .")]
    assert len(installs) == 1
    extras = set(re.fullmatch(r"-e \.\[([\w,-]+)\]", installs[0]).group(1).split(","))
    assert extras <= set(project["optional-dependencies"]), extras - set(project["optional-dependencies"])
    assert "gpu" in extras and "cpu" not in extras  # both provide vllm; a T4 user wants gpu
    assert {"aws", "mcp", "notebooks"} <= extras
    assert "pip" in env["dependencies"]


def test_gpu_extra_matches_the_doctor_stack():
    _, project = _load()
    gpu = project["optional-dependencies"]["gpu"]
    assert f"vllm=={GPU_VLLM}" in gpu
    assert GPU_VLLM in VLLM_TORCH and GPU_VLLM in VLLM_TRANSFORMERS_RANGE
    pinned = SpecifierSet(next(r for r in gpu if r.startswith("transformers"))[len("transformers"):])
    declared = SpecifierSet(",".join(VLLM_TRANSFORMERS_RANGE[GPU_VLLM]))
    for probe in ("5.15.0", "5.16.0", "5.16.1", "5.19.0", "5.20.9", "5.21.0"):
        assert (Version(probe) in pinned) == (Version(probe) in declared), probe


def test_cuda_index_matches_the_torch_the_gpu_vllm_pins():
    env, _ = _load()
    pip_lines = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    index = VLLM_TORCH[GPU_VLLM][1]
    assert any(line.endswith(f"download.pytorch.org/whl/{index}") for line in pip_lines)
