"""The CUDA-torch fix: the torch part of the host's one install plan (gemma4_t4.host.setup_plan.plan_setup),
the exact pip command where torch alone fixes the host, a refusal naming `gemma4-t4 setup` where it
cannot, and --apply through a stand-in runner (pip never runs for real here)."""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import replace

import pytest

from gemma4_t4.cli import main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host import env, smi
from gemma4_t4.host.swap import CommandResult
from gemma4_t4.host.torchfix import apply_torch_fix, plan_torch_fix, probe_torch_facts

PYTHON = "/venv/bin/python"
CPU_TORCH_ON_T4 = env.Facts(os="Linux", kernel="6", machine="x86_64", python="3.12.3", platform="other",
                            platform_evidence="", nvidia_smi=True,
                            gpus=[smi.GPUInfo(0, "Tesla T4", 15360, "7.5", "595.91.07")], driver_version="595.91.07",
                            torch_version="2.11.0+cpu", cuda_probe_error="torch.cuda.is_available() is False",
                            vllm_distribution="vllm", vllm_version="0.33.0")


def _plan(facts: env.Facts = CPU_TORCH_ON_T4, **changes):
    """The torch fix for ``facts`` with ``changes``, for the venv's interpreter."""
    return plan_torch_fix(replace(facts, **changes), python=PYTHON)


def test_cpu_torch_on_a_gpu_host_needs_the_cu130_build_with_dependencies():
    plan = _plan()
    assert plan.needed and plan.torch_alone and "CPU-only build" in plan.reason
    assert plan.command == ["/venv/bin/python", "-m", "pip", "install", "torch==2.14.0+cu130",
                            "--index-url", "https://download.pytorch.org/whl/cu130"]
    assert "--no-deps" not in plan.command  # --no-deps lost libcudnn in the series
    assert plan.route == "vllm-0.33.0-cu130" and plan.warnings == []


@pytest.mark.parametrize("changes, needed, words", [
    ({"gpus": []}, False, "no NVIDIA GPU"),
    ({"torch_version": "2.14.0+cu130", "torch_cuda": "13.0", "cuda_probe_error": None}, False, "is the build"),
    ({"torch_version": "2.13.0", "torch_cuda": "12.8", "cuda_probe_error": None}, True, "is not the 2.14.0"),
    ({"torch_version": None, "cuda_probe_error": "ImportError: libcudart.so.13"}, True, "libcudart"),
    ({"torch_version": "2.14.0+cu130", "torch_cuda": "13.0"}, False, "will not help"),
])
def test_decisions(changes, needed, words):
    plan = _plan(**changes)
    assert plan.needed is needed and words in plan.reason


def test_a_pre_580_driver_gets_the_cuda_12_build_it_can_run():
    facts = replace(CPU_TORCH_ON_T4, driver_version="535.104.05", vllm_version="0.30.0+cu129")
    plan = _plan(facts)  # the installed 0.30.0+cu129 is a row this driver runs: kept
    assert plan.cuda_variant == "cu129" and plan.torch_version == "2.13.0" and plan.torch_alone
    assert plan.command == ["/venv/bin/python", "-m", "pip", "install", "torch==2.13.0+cu129",
                            "--index-url", "https://download.pytorch.org/whl/cu129"]
    # the CUDA 13 torch on that driver is replaced by the cu129 one
    cu130 = _plan(facts, torch_version="2.13.0+cu130", torch_cuda="13.0")
    assert cu130.needed and "built for CUDA 13.0, but driver 535.104.05 runs the cu129 build" in cu130.reason
    # older than every route in the matrix: refused like setup refuses, with the driver fix
    with pytest.raises(Gemma4T4Error, match="older than every route") as info:
        _plan(driver_version="470.256.02")
    assert ">= 580" in info.value.fix


def test_vllm_0_33_on_a_550_driver_is_refused_naming_setup_with_the_cu129_pair():
    """Before: `pip install torch==2.14.0+cu130` (a build driver 550 cannot load), a warning whose fix
    repeated itself, and --apply ran it."""
    stuck = _plan(driver_version="550.54.15")
    assert stuck.needed and not stuck.torch_alone and stuck.command == []
    assert "cu130" not in stuck.command_line() and "2.14.0" not in stuck.command_line()
    assert stuck.command_line().startswith("gemma4-t4 setup (installs vllm==0.31.0+cu129 with torch 2.13.0+cu129")
    text = stuck.summary()
    assert "torch alone cannot fix this host" in text and text.count("leave --vllm out") == 0
    with pytest.raises(Gemma4T4Error, match="torch alone cannot fix this host") as info:
        apply_torch_fix(stuck, runner=lambda c: pytest.fail("pip must not run"))
    assert info.value.fix.startswith("run gemma4-t4 setup (installs vllm==0.31.0+cu129")
    # asking for 0.33.0 there explicitly: the same refusal setup gives, its fix said once
    with pytest.raises(Gemma4T4Error, match="vLLM 0.33.0 has no build") as info:
        plan_torch_fix(replace(CPU_TORCH_ON_T4, driver_version="550.54.15"), vllm_version="0.33.0")
    assert info.value.fix.count("leave it out") == 1 and "0.31.0, 0.30.0" in info.value.fix


def test_unknown_vllm_is_refused_with_the_list():
    with pytest.raises(Gemma4T4Error, match="vLLM 0.19.0 is not in the install matrix") as info:
        plan_torch_fix(CPU_TORCH_ON_T4, vllm_version="0.19.0")
    assert "0.34.0, 0.33.0, 0.32.0, 0.31.0, 0.30.0" in info.value.fix
    # an installed vLLM the matrix does not know: torch alone is not the fix, setup is
    other = _plan(vllm_version="0.35.0")
    assert not other.torch_alone and other.command_line().startswith("gemma4-t4 setup")


def test_apply_runs_pip_once_and_reports_failure():
    calls = []

    def fake_pip(command):
        calls.append(command)
        return CommandResult(0, "Successfully installed torch-2.14.0+cu130 nvidia-cudnn-cu13-9.13\n")

    result = apply_torch_fix(_plan(), runner=fake_pip)
    assert result.applied and calls == [["/venv/bin/python", "-m", "pip", "install", "torch==2.14.0+cu130",
                                         "--index-url", "https://download.pytorch.org/whl/cu130"]]
    assert "restart" in result.message and "cudnn" in result.output_tail

    with pytest.raises(Gemma4T4Error, match="pip failed") as info:
        apply_torch_fix(_plan(), runner=lambda c: CommandResult(1, "", "No space left"))
    assert "No space left" in str(info.value) and "download.pytorch.org" in info.value.fix

    not_needed = _plan(gpus=[])
    assert apply_torch_fix(not_needed, runner=lambda c: pytest.fail("pip must not run")).applied is False


def test_probe_reads_this_machine_and_the_cli_prints_the_plan(capsys):
    facts = probe_torch_facts()
    assert facts.python == platform.python_version() and facts.torch_version
    assert facts.vllm_version == env.probe().vllm_version  # the same interpreter: the same vLLM
    assert facts.cuda_probe_error in (None, "torch.cuda.is_available() is False")  # imported: no import error
    assert main(["fix-torch", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["applied"] is False and data["plan"]["python"] == sys.executable
    assert data["plan"]["facts"]["torch_version"] == facts.torch_version  # the doctor's facts' shape
    if not facts.gpus:  # this CI machine: CPU torch is correct, nothing to fix
        assert data["plan"]["needed"] is False and data["plan"]["command_line"] == ""


def test_probe_takes_gpus_driver_and_platform_from_the_doctor_probe():
    t4 = env.Probes(run=lambda cmd: (0, "0, Tesla T4, 15360, 7.5, 535.104.05\n"), env={"COLAB_RELEASE_TAG": "x"})
    facts = probe_torch_facts(probes=t4)
    assert facts.driver_version == "535.104.05" and facts.platform == "colab"
    assert [g.name for g in facts.gpus] == ["Tesla T4"]
    plan = plan_torch_fix(facts, vllm_version="0.30.0")
    assert plan.cuda_variant == "cu129" and plan.index_url == "https://download.pytorch.org/whl/cu129"
    no_smi = probe_torch_facts(probes=env.Probes(run=lambda cmd: None))
    assert no_smi.gpus == [] and no_smi.driver_version is None


def test_a_torch_that_fails_to_import_and_a_failed_nvidia_smi():
    """torch is asked in a subprocess (its import error is a fact, never ours); a failed nvidia-smi is
    refused with setup's and the doctor's message and fix, never planned as "no GPU"."""
    t4 = env.Probes(run=lambda cmd: (0, "0, Tesla T4, 15360, 7.5, 595.91.07\n"), env={},
                    version=lambda dist: "0.33.0" if dist == "vllm" else None)
    broken = probe_torch_facts("/venv/bin/python", runner=lambda cmd: CommandResult(
        0, '{"python": "3.11.9", "cuda_probe_error": "ImportError: libcudart.so.13"}\n'), probes=t4)
    assert (broken.python, broken.torch_version) == ("3.11.9", None)
    assert "libcudart.so.13; the plan needs torch 2.14.0+cu130" in plan_torch_fix(broken, python=PYTHON).reason
    assert (broken.vllm_distribution, broken.vllm_version) == ("vllm", "0.33.0")  # not asked: this one's
    other = probe_torch_facts("/other/bin/python", runner=lambda cmd: CommandResult(
        0, '{"python": "3.12.3", "torch_version": "2.14.0+cu130", "vllm_distribution": null, "vllm_version": null}\n'),
        probes=t4)
    assert other.vllm_version is None  # the target has no vLLM, whatever this interpreter has
    absent = probe_torch_facts(runner=lambda cmd: CommandResult(
        0, '{"python": "3.11.9", "cuda_probe_error": "ModuleNotFoundError: No module named \'torch\'"}\n'), probes=t4)
    assert absent.cuda_probe_error == "torch is not installed"
    failed = env.Probes(run=lambda cmd: (9, "NVIDIA-SMI has failed because it couldn't communicate with the "
                                            "NVIDIA driver"), env={})
    facts = probe_torch_facts(runner=lambda cmd: CommandResult(0, "{}\n"), probes=failed)
    with pytest.raises(Gemma4T4Error, match="could not talk to the NVIDIA driver") as info:
        plan_torch_fix(facts)
    assert (info.value.message, info.value.fix) == (facts.gpu_probe_error, facts.gpu_probe_fix)
