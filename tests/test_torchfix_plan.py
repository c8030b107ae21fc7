"""The CUDA-torch fix: decisions from facts, the exact pip command, and --apply through a fake runner
(pip never runs for real here)."""

from __future__ import annotations

import json
import sys

import pytest

from gemma4_t4.cli import main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.swap import CommandResult
from gemma4_t4.torchfix import TorchFacts, apply_torch_fix, plan_torch_fix, probe_torch_facts

CPU_TORCH_ON_T4 = TorchFacts(python="/venv/bin/python", torch_version="2.11.0+cpu", torch_cuda_build=None,
                             cuda_available=False, gpu_present=True, driver_version="595.91.07",
                             vllm_version="0.33.0", vllm_torch_pin="2.14.0")


def test_cpu_torch_on_a_gpu_host_needs_the_cu130_build_with_dependencies():
    plan = plan_torch_fix(CPU_TORCH_ON_T4)
    assert plan.needed and "CPU-only build" in plan.reason
    assert plan.command == ["/venv/bin/python", "-m", "pip", "install", "torch==2.14.0+cu130",
                            "--index-url", "https://download.pytorch.org/whl/cu130"]
    assert "--no-deps" not in plan.command  # --no-deps lost libcudnn in the series
    assert plan.warnings == []


@pytest.mark.parametrize("changes, needed, words", [
    ({"gpu_present": False}, False, "no NVIDIA GPU"),
    ({"torch_version": "2.14.0+cu130", "torch_cuda_build": "13.0", "cuda_available": True}, False, "sees the GPU"),
    ({"torch_version": "2.13.0", "torch_cuda_build": "12.8", "cuda_available": True}, True, "not the 2.14.0"),
    ({"torch_version": None, "import_error": "ImportError: libcudart.so.13"}, True, "libcudart"),
    ({"torch_version": "2.14.0+cu130", "torch_cuda_build": "13.0", "cuda_available": False}, False,
     "will not help"),
])
def test_decisions(changes, needed, words):
    facts = TorchFacts(**{**CPU_TORCH_ON_T4.__dict__, **changes})
    plan = plan_torch_fix(facts)
    assert plan.needed is needed and words in plan.reason


def test_a_pre_580_driver_gets_the_cuda_12_build_it_can_run():
    facts = TorchFacts(**{**CPU_TORCH_ON_T4.__dict__, "driver_version": "535.104.05", "vllm_version": "0.30.0+cu129",
                          "vllm_torch_pin": "2.13.0"})
    plan = plan_torch_fix(facts)
    assert plan.cuda_variant == "cu129" and plan.torch_version == "2.13.0"
    assert plan.command == ["/venv/bin/python", "-m", "pip", "install", "torch==2.13.0+cu129",
                            "--index-url", "https://download.pytorch.org/whl/cu129"]
    assert any("vllm==0.30.0+cu129" in w for w in plan.warnings)
    # the CUDA 13 torch on that driver is replaced by the cu129 one
    cu130 = plan_torch_fix(TorchFacts(**{**facts.__dict__, "torch_version": "2.13.0+cu130", "torch_cuda_build": "13.0",
                                         "cuda_available": False}))
    assert cu130.needed and "built for CUDA 13.0, but driver 535.104.05 runs the cu129 build" in cu130.reason
    # vLLM 0.33.0 on that driver has no torch that helps: said, never torch==2.14.0+cu129
    stuck = plan_torch_fix(TorchFacts(**{**CPU_TORCH_ON_T4.__dict__, "driver_version": "535.104.05"}))
    assert "torch==2.14.0+cu129" not in stuck.command and any("gemma4-t4 setup" in w for w in stuck.warnings)
    # older than every route in the matrix: warned, with the driver fix
    ancient = plan_torch_fix(TorchFacts(**{**CPU_TORCH_ON_T4.__dict__, "driver_version": "470.256.02"}))
    assert any("older than every route" in w and ">= 580" in w for w in ancient.warnings)


def test_unknown_vllm_without_metadata_is_refused():
    facts = TorchFacts(**{**CPU_TORCH_ON_T4.__dict__, "vllm_version": None, "vllm_torch_pin": None})
    with pytest.raises(Gemma4T4Error, match="no known torch build for vLLM 0.19.0"):
        plan_torch_fix(facts, vllm_version="0.19.0")
    # an installed vLLM's own metadata names its torch
    facts = TorchFacts(**{**CPU_TORCH_ON_T4.__dict__, "vllm_version": "0.34.0", "vllm_torch_pin": "2.15.0"})
    assert "torch==2.15.0+cu130" in plan_torch_fix(facts).command


def test_apply_runs_pip_once_and_reports_failure():
    calls = []

    def fake_pip(command):
        calls.append(command)
        return CommandResult(0, "Successfully installed torch-2.14.0+cu130 nvidia-cudnn-cu13-9.13\n")

    result = apply_torch_fix(plan_torch_fix(CPU_TORCH_ON_T4), runner=fake_pip)
    assert result.applied and calls == [["/venv/bin/python", "-m", "pip", "install", "torch==2.14.0+cu130",
                                         "--index-url", "https://download.pytorch.org/whl/cu130"]]
    assert "restart" in result.message and "cudnn" in result.output_tail

    with pytest.raises(Gemma4T4Error, match="pip failed") as info:
        apply_torch_fix(plan_torch_fix(CPU_TORCH_ON_T4), runner=lambda c: CommandResult(1, "", "No space left"))
    assert "No space left" in str(info.value) and "download.pytorch.org" in info.value.fix

    not_needed = plan_torch_fix(TorchFacts(**{**CPU_TORCH_ON_T4.__dict__, "gpu_present": False}))
    assert apply_torch_fix(not_needed, runner=lambda c: pytest.fail("pip must not run")).applied is False


def test_probe_reads_this_machine_and_the_cli_prints_the_command(capsys):
    facts = probe_torch_facts()
    assert facts.python == sys.executable
    assert facts.torch_version and facts.import_error is None
    assert main(["fix-torch", "--vllm", "0.33.0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["applied"] is False
    assert data["plan"]["command_line"].endswith("torch==2.14.0+cu130 --index-url https://download.pytorch.org/whl/cu130")
    if not facts.gpu_present:  # this CI machine: CPU torch is correct, nothing to fix
        assert data["plan"]["needed"] is False


def test_probe_takes_gpu_and_driver_from_the_doctor_probe():
    from gemma4_t4 import env

    t4 = env.Probes(run=lambda cmd: (0, "0, Tesla T4, 15360, 7.5, 535.104.05\n"))
    facts = probe_torch_facts(probes=t4)
    assert facts.gpu_present is True and facts.driver_version == "535.104.05"
    plan = plan_torch_fix(facts, vllm_version="0.30.0")
    assert plan.cuda_variant == "cu129" and plan.index_url == "https://download.pytorch.org/whl/cu129"
    assert any("driver 535.104.05 runs the install matrix's vllm-0.30.0-cu129 route" in w for w in plan.warnings)
    no_smi = probe_torch_facts(probes=env.Probes(run=lambda cmd: None))
    assert no_smi.gpu_present is False and no_smi.driver_version is None


def test_the_doctors_torch_line_follows_the_installed_vllm_and_the_driver():
    from gemma4_t4 import env

    # vLLM 0.32.0 pins torch 2.13.0: a known driver must not swap in 0.33.0's torch
    assert env.torch_fix_command("0.32.0", "580.65") == (
        "pip install torch==2.13.0+cu130 --index-url https://download.pytorch.org/whl/cu130")
    assert env.torch_fix_command("0.30.0", "550.1") == (
        "pip install torch==2.13.0+cu129 --index-url https://download.pytorch.org/whl/cu129")
    # vLLM 0.33.0 on a 550 driver: no torch fixes it alone (and torch 2.14.0+cu129 does not exist)
    assert env.torch_fix_command("0.33.0", "550.1").startswith("gemma4-t4 setup (vLLM 0.33.0 has no build")
