"""One voice on every host: the doctor, ``setup --dry-run``, ``fix-torch`` and the start gate reach the
same verdict on stand-in hosts (a stand-in ``nvidia-smi`` on PATH, or injected probes): a driver that
runs the planned CUDA 12 route, a GPU below sm_75 alone or picked by CUDA_VISIBLE_DEVICES, a P100
beside an L4, Colab's published image (Python 3.13, torch 2.11.0+cu128), an installed vLLM the Turing
fix is not proven on; and ``fix-torch --python`` given what is not a working interpreter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host import env, setup_plan, torchfix
from gemma4_t4.serving import gate
from gemma4_t4.turing import tilecap
from tests.host.test_setup_hosts import DRIVERS, _cli, _gone, _smi, _tool

P100 = ("Tesla P100-PCIE-16GB", "16384", "6.0")
L4 = ("NVIDIA L4", "23034", "8.9")
T4 = ("Tesla T4", "15360", "7.5")
# Colab's published GPU image (googlecolab/backend-info, 2026-08-19): Python 3.13, torch 2.11.0+cu128,
# cuda-compat-12-8; its kernel driver is not published (third-party code says 535/550): 550 here
COLAB_IMAGE = {"python": "3.13.5", "torch": "2.11.0+cu128", "torch_cuda": "12.8", "driver": "550.54.15"}
# the first vLLM series after the ones the Turing fix is proven on (0.34 on 2026-12-05): read from
# tilecap, so widening the proven range moves this host along
UNTESTED_VLLM = f"0.{int(tilecap.TESTED_VLLM_SERIES[-1].split('.')[1]) + 1}.0"


def _probes(gpus, driver="580.82.07", cuda_visible=None, python="3.11.9", torch=None, torch_cuda=None,
            vllm=None, colab=False):
    """A host as data: nvidia-smi's rows (index = position), packages, Python, environment."""

    def run(cmd):
        query = next((a.split("=", 1)[1] for a in cmd if a.startswith("--query-gpu=")), None)
        if query is None:
            return 0, f"| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: 12.4 |\n"
        values = lambda i, g: {"index": str(i), "name": g[0], "memory.total": g[1], "compute_cap": g[2],  # noqa: E731
                               "driver_version": driver}
        return 0, "".join(", ".join(values(i, g).get(f, "[N/A]") for f in query.split(",")) + "\n"
                          for i, g in enumerate(gpus))

    environ = {"HOME": "/h", **({"CUDA_VISIBLE_DEVICES": cuda_visible} if cuda_visible is not None else {}),
               **({"COLAB_RELEASE_TAG": "release-colab_20260819"} if colab else {})}
    files = {"/proc/meminfo": "MemTotal: 16000000 kB\nMemAvailable: 15000000 kB\nSwapTotal: 0 kB\n"}
    if torch:
        files["/t/torch/version.py"] = f"__version__ = '{torch}'\ncuda: Optional[str] = {torch_cuda!r}\n"
    packages = {"vllm": vllm, "transformers": "5.19.0"}
    return env.Probes(run=run, read=files.get, env=environ, version=packages.get, disk_free=lambda p: 200.0,
                      torch_dir=lambda: "/t/torch" if torch else None, modules={},
                      uname=lambda: SimpleNamespace(system="Linux", release="6.1", machine="x86_64"),
                      python_version=lambda: python, cwd=lambda: "/h")


def _errors(report: env.EnvReport) -> dict[str, env.Problem]:
    return {p.code: p for p in report.problems if p.severity == "error"}


# ------------------------------------------------------------------ drivers that run the CUDA 12 route


@pytest.mark.parametrize("driver", ["535", "550", "570"])
def test_a_driver_that_runs_the_planned_route_is_not_too_old_for_the_doctor(tmp_path, driver):
    """Before: driver 550 gave `ERROR driver-too-old` ("older than 580") and NOT READY, though it runs
    the vllm==0.31.0+cu129 route setup plans."""
    _smi(tmp_path / "bin", DRIVERS[driver])
    plan = json.loads(_cli(tmp_path, "setup", "--dry-run", "--json", bins=[tmp_path / "bin"]).stdout)
    doctor = json.loads(_cli(tmp_path, "doctor", "--json", bins=[tmp_path / "bin"]).stdout)
    problems = {p["code"]: p for p in doctor["problems"]}
    assert "driver-too-old" not in problems and not any("older than 580" in p["message"] for p in doctor["problems"])
    route = problems["cuda12-route"]
    assert route["severity"] == "warning" and setup_plan.route_by_key(plan["route"]).label in route["message"]
    # the doctor names exactly what setup runs (setup's own interpreter aside)
    assert plan["commands"][0].split(" -m ", 1)[1] in route["fix"]


# ------------------------------------------------------------------ a GPU below sm_75


def test_a_p100_alone_is_refused_by_setup_fix_torch_doctor_and_gate_in_the_same_words(tmp_path):
    """Before: the doctor said gpu-too-old while `setup --dry-run` planned a multi-GB vLLM install, rc 0."""
    _smi(tmp_path / "bin", DRIVERS["580"], name=P100[0], cc=P100[2])
    words = "Tesla P100-PCIE-16GB (sm_60) is older than Turing"
    setup = _cli(tmp_path, "setup", "--dry-run", "--json", bins=[tmp_path / "bin"])
    assert setup.returncode == 2 and words in setup.stdout and "pip" not in setup.stdout, setup.stdout
    fix = _cli(tmp_path, "fix-torch", "--json", bins=[tmp_path / "bin"])
    assert fix.returncode == 2 and words in fix.stdout, fix.stdout
    doctor = json.loads(_cli(tmp_path, "doctor", "--json", bins=[tmp_path / "bin"]).stdout)
    old = next(p for p in doctor["problems"] if p["code"] == "gpu-too-old")
    refusal = json.loads(setup.stdout)
    assert (old["message"], old["fix"]) == (refusal["message"], refusal["fix"])
    reasons = gate.host_reasons(env.probe(_probes([P100]), smem=True))
    assert any(r.check == "doctor:gpu-too-old" and (r.problem, r.fix) == (old["message"], old["fix"]) for r in reasons)


def test_a_p100_picked_by_cuda_visible_devices_is_refused_and_the_t4_beside_it_named():
    probes = _probes([P100, T4], cuda_visible="0")
    with pytest.raises(Gemma4T4Error, match="older than Turing") as refused:
        setup_plan.plan_setup(env.probe(probes), python="py")
    assert "CUDA_VISIBLE_DEVICES=1" in refused.value.fix
    with pytest.raises(Gemma4T4Error, match="older than Turing"):
        torchfix.plan_torch_fix(env.probe(probes), python="py")
    assert _errors(env.doctor(probes))["gpu-too-old"].message == refused.value.message


# ------------------------------------------------------------------ which GPU (issue 44)


def test_a_p100_beside_an_l4_plans_serves_and_judges_the_l4():
    probes = _probes([P100, L4])
    plan = setup_plan.plan_setup(env.probe(probes), python="py")
    assert plan.gpu_index == 1 and plan.host.startswith("NVIDIA L4 (sm_89)")
    report = env.doctor(probes)
    assert "gpu-too-old" not in _errors(report) and report.facts.gpu.name == "NVIDIA L4"
    assert report.facts.compute_capability == "8.9" and report.facts.cuda_gpu_count == 1


def test_cuda_visible_devices_1_0_plans_for_gpu_1_the_one_vllm_runs_on():
    probes = _probes([P100, L4], cuda_visible="1,0")
    plan = setup_plan.plan_setup(env.probe(probes), python="py")
    assert plan.gpu_index == 1 and "names GPU 1" in plan.gpu_reason
    device = env.probe(probes)
    assert device.gpu.name == "NVIDIA L4" and device.cuda_gpu_count == 1  # the P100 is no tensor-parallel partner
    assert env.probe(_probes([T4, T4], cuda_visible="1,0")).cuda_gpu_count == 2
    assert env.probe(_probes([T4, T4], cuda_visible="1")).cuda_gpu_count == 1
    assert env.probe(_probes([T4, T4], cuda_visible="0,7,1")).cuda_gpu_count == 1


# ------------------------------------------------------------------ Colab's published image


def test_colab_published_image_python_3_13_gets_one_plan_from_every_voice(capsys):
    """Colab's image: Python 3.13, torch 2.11.0+cu128, no vLLM. Python 3.13 is supported: no doctor error,
    no gate refusal for it; the doctor, setup, fix-torch and the notebook's setup() name one route."""
    probes = _probes([T4], driver=COLAB_IMAGE["driver"], python=COLAB_IMAGE["python"], torch=COLAB_IMAGE["torch"],
                     torch_cuda=COLAB_IMAGE["torch_cuda"], colab=True)
    report = env.doctor(probes)
    assert report.facts.platform == "colab" and report.facts.python == "3.13.5"
    assert not _errors(report) and report.ok, report.problems
    assert not gate.host_reasons(report.facts)
    plan = setup_plan.plan_setup(env.probe(probes), python="py")
    assert plan.route == "vllm-0.31.0-cu129" and plan.needed and plan.restart
    fix = torchfix.plan_torch_fix(env.probe(probes), python="py")
    assert fix.route == plan.route and not fix.torch_alone and fix.command_line().startswith("gemma4-t4 setup")
    assert setup_plan.route_by_key(plan.route).label in next(p for p in report.problems if p.code == "cuda12-route").message
    from gemma4_t4 import notebook as nb

    assert nb.setup(dry_run=True, probes=probes).route == plan.route
    for python, refused in (("3.14.0", True), ("3.10.12", True), ("3.11.0", False)):
        report = env.doctor(_probes([T4], python=python))
        assert ("python-version" in _errors(report)) is refused, python


# ------------------------------------------------------------------ a vLLM the Turing fix is not proven on


def test_an_untested_vllm_is_named_by_the_doctor_in_the_gates_words_and_setup_says_why_it_goes():
    """Before: with 0.34.0 on a driver-580 T4 the doctor said "OK: no blocking problem" while the gate
    refused at serve time, and setup planned the downgrade without a word."""
    probes = _probes([T4], torch="2.14.0+cu130", torch_cuda="13.0", vllm=UNTESTED_VLLM)
    words = tilecap.version_problem(UNTESTED_VLLM)
    assert words is not None
    report = env.doctor(probes)
    untested = _errors(report)["vllm-untested"]
    assert untested.message == words and not report.ok
    assert untested.fix.startswith(f"gemma4-t4 setup (installs vllm=={setup_plan.PROVEN_VLLM}")
    reasons = gate.host_reasons(report.facts)
    assert any(r.check == "doctor:vllm-untested" and r.problem == words for r in reasons)
    plan = setup_plan.plan_setup(env.probe(probes), python="py")
    assert plan.needed and any(words in n and f"vllm {UNTESTED_VLLM} is replaced" in n for n in plan.notes)
    # a proven release on the same host: no such error, no such note
    proven = _probes([T4], torch="2.14.0+cu130", torch_cuda="13.0", vllm=setup_plan.PROVEN_VLLM)
    assert "vllm-untested" not in _errors(env.doctor(proven))


# ------------------------------------------------------------------ tensor parallelism (issue 41 medium 3)


def test_the_gate_refuses_tensor_parallelism_over_more_gpus_than_cuda_sees():
    """Before: TP 4 on one T4 passed (the memory check divided the 31B by 4); TP 2 on one GPU too."""
    from tests.serving.test_gate_judge import _facts, t4_gpu

    for tp in (2, 4):
        reasons = gate.judge(_facts(tensor_parallel_size=tp))
        tp_reason = next(r for r in reasons if r.check == "tensor_parallel")
        assert f"--tensor-parallel-size {tp} needs {tp} GPUs, but CUDA sees 1 Tesla T4 GPU" in tp_reason.problem
        assert "--tensor-parallel-size 1 or less" in tp_reason.fix
    two = _facts(gpus=[t4_gpu(0), t4_gpu(1)], tensor_parallel_size=2)
    assert not [r for r in gate.judge(two) if r.check == "tensor_parallel"]
    assert not gate.judge(_facts(tensor_parallel_size=1))


def test_check_start_counts_the_visible_gpus_for_a_31b_launch_with_tp_4():
    from gemma4_t4.serving.server_config import ServerConfig
    from tests.serving.test_gate_judge import GOOD

    config = ServerConfig(model="google/gemma-4-31B-it-qat-w4a16-ct", tensor_parallel_size=4, target="t4")
    with pytest.raises(gate.GateRefused) as refused:
        gate.check_start(config, facts=GOOD)
    assert "needs 4 GPUs, but CUDA sees 1 Tesla T4 GPU" in str(refused.value)


# ------------------------------------------------------------------ the gate's CPU-torch fix (issue 41 low)


def test_the_gates_cpu_torch_fix_names_setup_where_fix_torch_apply_would_refuse():
    """The gate refuses a CPU-only torch in the doctor's words, whose fix is the host plan's: setup where
    fix-torch --apply would refuse, the torch-only pip line where torch alone fixes the host."""
    stuck_host = env.probe(_probes([T4], driver="550.54.15", torch="2.13.0+cpu", vllm="0.34.0"))
    stuck = torchfix.plan_torch_fix(stuck_host, python="python")
    assert not stuck.torch_alone  # fix-torch --apply refuses this host
    cuda = next(r for r in gate.host_reasons(stuck_host) if r.check == "doctor:cpu-torch-on-gpu-host")
    assert "fix-torch --apply" not in cuda.problem and cuda.fix == stuck.command_line()
    alone_host = env.probe(_probes([T4], torch="2.14.0+cpu", vllm="0.34.0"))
    alone = next(r for r in gate.host_reasons(alone_host) if r.check == "doctor:cpu-torch-on-gpu-host")
    assert "fix-torch --apply runs the fix" in alone.problem
    assert alone.fix == "pip install torch==2.14.0+cu130 --index-url https://download.pytorch.org/whl/cu130"


# ------------------------------------------------------------------ fix-torch --python (issue 41 mediums 4, 5)


@pytest.mark.parametrize("python, words", [
    ("/nonexistent", "--python /nonexistent does not exist"),
    ("/bin/sh", "--python /bin/sh is not a Python interpreter"),
    ("/etc/passwd", "--python /etc/passwd is not a Python interpreter"),
])
def test_fix_torch_refuses_what_is_not_a_python_interpreter(tmp_path, python, words):
    """Before: exit 0, this venv's vLLM reported, and a pip command for a non-interpreter printed."""
    _smi(tmp_path / "bin", DRIVERS["580"])
    done = _cli(tmp_path, "fix-torch", "--json", "--python", python, bins=[tmp_path / "bin"])
    assert done.returncode == 2, done.stdout
    error = json.loads(done.stdout)
    assert words in error["message"] and "--python" in error["fix"] and "pip install" not in done.stdout


def test_a_hung_interpreter_is_stopped_with_what_it_started(tmp_path):
    """Before: fix-torch --python HUNG hung forever."""
    pidfile = tmp_path / "child.pid"
    hung = _tool(tmp_path / "bin", f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nwait\n", name="python3")
    started = time.monotonic()
    with pytest.raises(Gemma4T4Error, match="did not answer within"):
        torchfix.probe_torch_facts(str(hung), runner=partial(torchfix.probe_runner, timeout=1.0),
                                   probes=_probes([T4]))
    assert time.monotonic() - started < 30 and _gone(int(pidfile.read_text()))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_fix_torch_ends_the_interpreter_it_probes(tmp_path, sig):
    """Before: the probed interpreter kept running after the CLI was killed."""
    pidfile = tmp_path / "child.pid"
    hung = _tool(tmp_path / "bin", f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 300\n", name="python3")
    environ = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cli = subprocess.Popen([sys.executable, "-m", "gemma4_t4", "fix-torch", "--python", str(hung)], env=environ,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < deadline and cli.poll() is None, "the probe never started"
            time.sleep(0.05)
        cli.send_signal(sig)
        cli.wait(timeout=30)
        assert _gone(int(pidfile.read_text()), within_s=10)
    finally:
        if cli.poll() is None:
            cli.kill()
