"""The CUDA-torch fix: the torch part of the host's one install plan (gemma4_t4.host.setup_plan.plan_setup),
the exact pip command where torch alone fixes the host, a refusal naming `gemma4-t4 setup` where it
cannot, and --apply through a stand-in runner (pip never runs for real here)."""

from __future__ import annotations

import json
import sys

import pytest

from gemma4_t4.cli import main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host.swap import CommandResult
from gemma4_t4.host.torchfix import TorchFacts, apply_torch_fix, plan_torch_fix, probe_torch_facts

CPU_TORCH_ON_T4 = TorchFacts(python="/venv/bin/python", torch_version="2.11.0+cpu", torch_cuda_build=None,
                             cuda_available=False, gpu_present=True, driver_version="595.91.07",
                             vllm_version="0.33.0", vllm_torch_pin="2.14.0")


def test_cpu_torch_on_a_gpu_host_needs_the_cu130_build_with_dependencies():
    plan = plan_torch_fix(CPU_TORCH_ON_T4)
    assert plan.needed and plan.torch_alone and "CPU-only build" in plan.reason
    assert plan.command == ["/venv/bin/python", "-m", "pip", "install", "torch==2.14.0+cu130",
                            "--index-url", "https://download.pytorch.org/whl/cu130"]
    assert "--no-deps" not in plan.command  # --no-deps lost libcudnn in the series
    assert plan.route == "vllm-0.33.0-cu130" and plan.warnings == []


@pytest.mark.parametrize("changes, needed, words", [
    ({"gpu_present": False}, False, "no NVIDIA GPU"),
    ({"torch_version": "2.14.0+cu130", "torch_cuda_build": "13.0", "cuda_available": True}, False, "is the build"),
    ({"torch_version": "2.13.0", "torch_cuda_build": "12.8", "cuda_available": True}, True, "is not the 2.14.0"),
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
    plan = plan_torch_fix(facts)  # the installed 0.30.0+cu129 is a row this driver runs: kept
    assert plan.cuda_variant == "cu129" and plan.torch_version == "2.13.0" and plan.torch_alone
    assert plan.command == ["/venv/bin/python", "-m", "pip", "install", "torch==2.13.0+cu129",
                            "--index-url", "https://download.pytorch.org/whl/cu129"]
    # the CUDA 13 torch on that driver is replaced by the cu129 one
    cu130 = plan_torch_fix(TorchFacts(**{**facts.__dict__, "torch_version": "2.13.0+cu130", "torch_cuda_build": "13.0",
                                         "cuda_available": False}))
    assert cu130.needed and "built for CUDA 13.0, but driver 535.104.05 runs the cu129 build" in cu130.reason
    # older than every route in the matrix: refused like setup refuses, with the driver fix
    with pytest.raises(Gemma4T4Error, match="older than every route") as info:
        plan_torch_fix(TorchFacts(**{**CPU_TORCH_ON_T4.__dict__, "driver_version": "470.256.02"}))
    assert ">= 580" in info.value.fix


def test_vllm_0_33_on_a_550_driver_is_refused_naming_setup_with_the_cu129_pair():
    """Before: `pip install torch==2.14.0+cu130` (a build driver 550 cannot load), a warning whose fix
    repeated itself, and --apply ran it."""
    stuck = plan_torch_fix(TorchFacts(**{**CPU_TORCH_ON_T4.__dict__, "driver_version": "550.54.15"}))
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
        plan_torch_fix(TorchFacts(**{**CPU_TORCH_ON_T4.__dict__, "driver_version": "550.54.15"}), vllm_version="0.33.0")
    assert info.value.fix.count("leave it out") == 1 and "0.31.0, 0.30.0" in info.value.fix


def test_unknown_vllm_is_refused_with_the_list():
    with pytest.raises(Gemma4T4Error, match="vLLM 0.19.0 is not in the install matrix") as info:
        plan_torch_fix(CPU_TORCH_ON_T4, vllm_version="0.19.0")
    assert "0.33.0, 0.32.0, 0.31.0, 0.30.0" in info.value.fix
    # an installed vLLM the matrix does not know: torch alone is not the fix, setup is
    other = plan_torch_fix(TorchFacts(**{**CPU_TORCH_ON_T4.__dict__, "vllm_version": "0.34.0"}))
    assert not other.torch_alone and other.command_line().startswith("gemma4-t4 setup")


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


def test_probe_reads_this_machine_and_the_cli_prints_the_plan(capsys):
    facts = probe_torch_facts()
    assert facts.python == sys.executable
    assert facts.torch_version and facts.import_error is None
    assert main(["fix-torch", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["applied"] is False
    if not facts.gpu_present:  # this CI machine: CPU torch is correct, nothing to fix
        assert data["plan"]["needed"] is False and data["plan"]["command_line"] == ""


def test_probe_takes_gpus_driver_and_platform_from_the_doctor_probe():
    from gemma4_t4.host import env

    t4 = env.Probes(run=lambda cmd: (0, "0, Tesla T4, 15360, 7.5, 535.104.05\n"), env={"COLAB_RELEASE_TAG": "x"})
    facts = probe_torch_facts(probes=t4)
    assert facts.gpu_present is True and facts.driver_version == "535.104.05" and facts.platform == "colab"
    assert [g.name for g in facts.gpus] == ["Tesla T4"]
    plan = plan_torch_fix(facts, vllm_version="0.30.0")
    assert plan.cuda_variant == "cu129" and plan.index_url == "https://download.pytorch.org/whl/cu129"
    no_smi = probe_torch_facts(probes=env.Probes(run=lambda cmd: None))
    assert no_smi.gpu_present is False and no_smi.driver_version is None
