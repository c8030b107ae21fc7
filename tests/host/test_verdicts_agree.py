"""One judge of the machine: ``gemma4-t4 doctor``, ``setup`` (its plan), ``fix-torch`` (its plan) and the
start gate over the same stand-in hosts (a T4 on drivers 470-580, a P100 alone or picked by
CUDA_VISIBLE_DEVICES, mixed GPUs, no GPU, a broken nvidia-smi, Colab's image, a full disk, low RAM, an
untested vLLM) reach the same verdict: a host setup refuses is refused by fix-torch, the doctor and the
gate in the same words and with the same fix, and no voice refuses a host another one plans for."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host import env, setup_plan, torchfix
from gemma4_t4.serving import gate
from gemma4_t4.serving.server_config import ServerConfig
from tests.host.test_setup_host_verdicts import COLAB_IMAGE, L4, P100, T4, UNTESTED_VLLM, _probes
from tests.host.test_setup_hosts import DRIVERS

# the doctor's errors that are refusals of the host itself: no install plan can serve it
HOST_REFUSALS = {"nvidia-smi-failed", "gpu-choice", "gpu-too-old", "driver-too-old"}


def _device(gpus, cuda_visible=None, torch_cuda=None):
    """torch's reading of CUDA's device 0 on that host (``doctor --smem`` and the gate read it)."""
    index = int(cuda_visible.split(",")[0]) if cuda_visible else 0
    if not torch_cuda or not gpus or index >= len(gpus):
        return lambda: {"error": "torch.cuda.is_available() is False"}
    cc = gpus[index][2]
    return lambda: {"smem_per_block_optin": 65_536 if cc == "7.5" else 101_376, "compute_capability": cc}


def host(gpus=(T4,), *, smi="ok", platform=None, meminfo=None, disk_gb=200.0, **changes) -> env.Probes:
    """A stand-in host (``test_setup_host_verdicts._probes``) with torch's CUDA reading, and optionally a
    broken nvidia-smi, a cloud platform, /proc/meminfo and the free disk changed."""
    probes = _probes(list(gpus), **changes)
    files = {
        "/proc/meminfo": meminfo
        or "MemTotal: 16000000 kB\nMemAvailable: 15000000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n"
    }
    if platform == "gce":
        files["/sys/class/dmi/id/product_name"] = "Google Compute Engine"
    environ = dict(probes.env) | ({"SM_CURRENT_HOST": "algo-1"} if platform == "sagemaker" else {})
    run = (
        probes.run
        if smi == "ok"
        else (lambda cmd: (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"))
    )
    read = probes.read
    return dataclasses.replace(
        probes,
        run=run,
        env=environ,
        read=lambda path: files.get(path, read(path)),
        disk_free=lambda path: disk_gb,
        which=lambda name: f"/usr/bin/{name}",
        cuda_device=_device(list(gpus), changes.get("cuda_visible"), changes.get("torch_cuda")),
    )


HOSTS = {
    **{f"t4-driver-{d}": host(driver=DRIVERS[d]) for d in ("470", "525", "535", "550", "570", "580")},
    "t4-driver-470-gce": host(driver=DRIVERS["470"], platform="gce"),
    "t4-driver-470-sagemaker": host(driver=DRIVERS["470"], platform="sagemaker"),
    "t4-driver-550-cpu-torch": host(driver=DRIVERS["550"], torch="2.13.0+cpu", vllm="0.34.0"),
    "t4-cpu-torch-vllm-0.34": host(torch="2.14.0+cpu", vllm="0.34.0"),
    "t4-serving-ready": host(torch="2.14.0+cu130", torch_cuda="13.0", vllm="0.34.0"),
    "t4-untested-vllm": host(torch="2.14.0+cu130", torch_cuda="13.0", vllm=UNTESTED_VLLM),
    "t4-vllm-cpu": host(vllm="0.32.0+cpu"),
    "p100-alone": host([P100]),
    "p100-on-driver-470": host([P100], driver=DRIVERS["470"]),  # one refusal: the GPU (the doctor said two)
    "p100-picked-beside-a-t4": host([P100, T4], cuda_visible="0"),
    "p100-beside-an-l4": host([P100, L4]),
    "mixed-names-a-missing-gpu": host([P100, L4], cuda_visible="3"),
    "two-t4s": host([T4, T4]),
    "cpu-only": host([], smi="missing"),
    "nvidia-smi-broken": host(smi="broken"),
    "colab-image": host(
        driver=COLAB_IMAGE["driver"],
        python=COLAB_IMAGE["python"],
        torch=COLAB_IMAGE["torch"],
        torch_cuda=COLAB_IMAGE["torch_cuda"],
        colab=True,
    ),
    "full-disk": host(torch="2.14.0+cu130", torch_cuda="13.0", vllm="0.34.0", disk_gb=3.0),
    "low-ram": host(
        torch="2.14.0+cu130",
        torch_cuda="13.0",
        vllm="0.34.0",
        meminfo="MemTotal: 4000000 kB\nMemAvailable: 3000000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n",
    ),
}
HOSTS["cpu-only"] = dataclasses.replace(HOSTS["cpu-only"], run=lambda cmd: None)  # no nvidia-smi at all

Words = tuple[str, str | None]  # (message, fix)


@dataclass
class Verdicts:
    """What each voice says about one host: a refusal's words, or None where it plans / passes."""

    doctor: dict[str, Words]  # the doctor's errors by code
    setup: Words | None
    fix_torch: Words | None
    gate: dict[str, Words]  # the gate's host reasons by doctor code
    setup_line: str | None  # what `gemma4-t4 setup` installs here (None where it refuses)


def _refusal(plan) -> Words | None:
    try:
        plan()
    except Gemma4T4Error as refused:
        return refused.message, refused.fix
    return None


def verdicts(probes: env.Probes) -> Verdicts:
    facts = env.probe(probes, smem=True)
    report = env.doctor(probes, smem=True)
    config = ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4")
    stand_ins = gate.GateProbes(
        host=probes,
        turing=lambda cc: gate.TuringFound(True, True),
        model=lambda config, host: gate.ModelFound(gpu_fit_ok=True, weights_on_disk=True, load_peak_bytes=0),
    )
    try:
        reasons = gate.check_start(config, probes=stand_ins).reasons
    except gate.GateRefused as refused:
        reasons = refused.result.reasons
    setup = _refusal(lambda: setup_plan.plan_setup(facts, python="python"))
    return Verdicts(
        doctor={p.code: (p.message, p.fix) for p in report.problems if p.severity == "error"},
        setup=setup,
        fix_torch=_refusal(lambda: torchfix.plan_torch_fix(facts, python="python")),
        gate={
            r.check.removeprefix("doctor:"): (r.problem, r.fix)
            for r in reasons
            if r.check.startswith("doctor:")
        },
        setup_line=None if setup else setup_plan.setup_line(setup_plan.plan_setup(facts, python="python")),
    )


def disagreements(v: Verdicts) -> list[str]:
    """Every way the four voices differ on one host (empty: one verdict)."""
    found = []
    if v.setup != v.fix_torch:
        found.append(f"setup refuses {v.setup} but fix-torch {v.fix_torch}")
    refusals = {code: words for code, words in v.doctor.items() if code in HOST_REFUSALS}
    if v.setup is not None and v.setup not in refusals.values():
        found.append(f"setup refuses {v.setup}; the doctor's refusals say {refusals}")
    if v.setup is None and refusals:
        found.append(f"the doctor refuses {refusals}, setup plans {v.setup_line}")
    for code, words in v.doctor.items():
        if v.gate.get(code) != words:
            found.append(f"the doctor's {code} is {words}, the gate's {v.gate.get(code)}")
    if extra := set(v.gate) - set(v.doctor) - {"no-gpu", "no-torch"}:
        found.append(f"the gate refuses for {extra}, which the doctor does not call errors")
    if v.setup_line and any(
        f and f.startswith("gemma4-t4 setup (") and f != v.setup_line for _, f in v.doctor.values()
    ):
        found.append(f"a doctor fix names another install than setup's {v.setup_line}")
    return found


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_doctor_setup_fix_torch_and_the_gate_agree(name):
    assert disagreements(verdicts(HOSTS[name])) == []


def test_the_hosts_cover_refusals_plans_and_a_ready_t4():
    said = {name: verdicts(probes) for name, probes in HOSTS.items()}
    refused = {name for name, v in said.items() if v.setup}
    assert {
        "t4-driver-470",
        "t4-driver-470-gce",
        "t4-driver-470-sagemaker",
        "p100-alone",
        "p100-on-driver-470",
        "p100-picked-beside-a-t4",
        "mixed-names-a-missing-gpu",
        "nvidia-smi-broken",
    } == refused
    assert said["t4-serving-ready"].gate == {} and said["cpu-only"].gate.keys() == {"no-gpu", "no-torch"}
    assert said["t4-driver-470-gce"].setup[1] == setup_plan.DRIVER_FIX["gce"]
    assert said["t4-driver-470"].setup[1] == setup_plan.DRIVER_IMAGE_FIX
    assert "vllm-untested" in said["t4-untested-vllm"].gate and "gpu-too-old" in said["p100-alone"].gate
    assert (
        "gpu-too-old" in said["p100-on-driver-470"].doctor
        and "driver-too-old" not in said["p100-on-driver-470"].doctor
    )


def test_a_disagreement_is_found():
    """The comparison fails on hosts judged as before: on a GCE T4 with driver 470 the doctor named the
    Deep Learning VM image while setup refused with the generic driver fix (and the doctor's message
    carried setup's fix line inside it); the gate said "cuda" in its own words where the doctor said
    cpu-torch-on-gpu-host."""
    agreed = verdicts(HOSTS["t4-driver-470-gce"])
    old_setup = dataclasses.replace(
        agreed,
        setup=(agreed.setup[0], setup_plan.DRIVER_IMAGE_FIX),
        fix_torch=(agreed.setup[0], setup_plan.DRIVER_IMAGE_FIX),
    )
    assert disagreements(old_setup) == [
        f"setup refuses {old_setup.setup}; the doctor's refusals say "
        f"{ {'driver-too-old': agreed.doctor['driver-too-old']} }"
    ]
    cpu_torch = verdicts(HOSTS["t4-cpu-torch-vllm-0.34"])
    own_words = dataclasses.replace(
        cpu_torch,
        gate={
            "cuda": (
                "torch 2.14.0+cpu is a CPU-only build, so the GPU is invisible to vLLM",
                "gemma4-t4 fix-torch --apply",
            )
        },
    )
    found = disagreements(own_words)  # the doctor's errors missing, and a refusal the doctor never made
    assert any(d.startswith("the doctor's cpu-torch-on-gpu-host is") for d in found)
    assert "the gate refuses for {'cuda'}, which the doctor does not call errors" in found
    assert disagreements(dataclasses.replace(agreed, fix_torch=None))[0].startswith("setup refuses")
