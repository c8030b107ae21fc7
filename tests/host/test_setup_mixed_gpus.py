"""Every GPU on the host is seen: a stand-in ``nvidia-smi`` listing a Tesla P100 (sm_60) first and a
Tesla T4 second. Setup, the doctor, the start gate, fix-torch and the notebooks plan for the T4 (the
package's path) and say why; CUDA_VISIBLE_DEVICES picks another; one it does not list is refused,
never read as GPU 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host import env, smi
from tests.host.test_setup_hosts import _cli, _tool

DRIVER = "550.54.15"
GPUS = [("0", "Tesla P100-PCIE-16GB", "16384", "6.0"), ("1", "Tesla T4", "15360", "7.5")]
ANSWERS = {"index": 0, "name": 1, "memory.total": 2, "compute_cap": 3}


def _smi_line(gpu: tuple[str, ...], fields: list[str]) -> str:
    extra = {"driver_version": DRIVER, "clocks.max.sm": "1590", "power.limit": "70.00"}
    return ", ".join(gpu[ANSWERS[f]] if f in ANSWERS else extra.get(f, "[N/A]") for f in fields)


def _mixed_smi(folder: Path) -> Path:
    """Answers exactly the fields asked, one line per GPU, P100 first (nvidia-smi's PCI order)."""
    cases = []
    for fields in (smi.SMI_FIELDS, smi.SMI_ESSENTIAL, ("index", "compute_cap"), ("index", "clocks.max.sm"),
                   ("index", "power.limit")):
        lines = "\\n".join(_smi_line(g, list(fields)) for g in GPUS)
        cases.append(f'  --query-gpu={",".join(fields)}) printf "{lines}\\n" ;;')
    body = ("#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in\n" + "\n".join(cases)
            + f'\nesac; done\necho "| NVIDIA-SMI {DRIVER}   Driver Version: {DRIVER}   CUDA Version: 12.4 |"\n')
    # the banner only when no query matched: exit right after a query's answer
    body = body.replace(' ;;', '; exit 0 ;;')
    return _tool(folder, body)


def _probes(cuda_visible: str | None = None) -> env.Probes:
    def run(cmd):
        query = next((a.split("=", 1)[1] for a in cmd if a.startswith("--query-gpu=")), None)
        if query is None:
            return 0, f"Driver Version: {DRIVER}   CUDA Version: 12.4\n"
        return 0, "".join(_smi_line(g, query.split(",")) + "\n" for g in GPUS)

    environ = {"HOME": "/h", **({"CUDA_VISIBLE_DEVICES": cuda_visible} if cuda_visible is not None else {})}
    return env.Probes(run=run, env=environ, modules={})


def test_choose_gpu_prefers_the_t4_and_follows_cuda_visible_devices():
    gpus = [smi.GPUInfo(int(i), n, int(m), c, DRIVER) for i, n, m, c in GPUS]
    chosen = env.choose_gpu(gpus)
    assert chosen.gpu.name == "Tesla T4" and chosen.mixed and "T4 is preferred" in chosen.reason
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1" in chosen.reason
    named = env.choose_gpu(gpus, "0")
    assert named.gpu.index == 0 and "CUDA_VISIBLE_DEVICES='0' names GPU 0" in named.reason
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in named.reason  # CUDA's own order may differ on a mixed host
    assert "fastest first" not in env.choose_gpu(gpus, "0", "PCI_BUS_ID").reason
    for bad, words in (("5", "names GPU 5, which nvidia-smi does not list"), ("", "hides every GPU"),
                       ("-1", "hides every GPU"), ("GPU-1234", "not an nvidia-smi index")):
        refused = env.choose_gpu(gpus, bad)
        assert refused.gpu is None and words in refused.error and refused.fix
    same = [smi.GPUInfo(i, "Tesla T4", 15360, "7.5", DRIVER) for i in range(2)]
    assert env.choose_gpu(same).gpu.index == 0 and not env.choose_gpu(same).mixed
    assert env.choose_gpu(same, "GPU-uuid").gpu.index == 0  # any of two identical GPUs plans the same


def test_setup_plans_for_the_t4_not_the_p100_listed_first(tmp_path):
    _mixed_smi(tmp_path / "bin")
    done = _cli(tmp_path, "setup", "--dry-run", "--json", bins=[tmp_path / "bin"])
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads(done.stdout)
    assert plan["host"].startswith("Tesla T4 (sm_75)") and "GPU 1 of 2" in plan["host"]
    assert plan["gpu_index"] == 1 and "T4 is preferred" in plan["gpu_reason"]
    assert not any("older than Turing" in n for n in plan["notes"]) and any("GPUs differ" in n for n in plan["notes"])


def test_cuda_visible_devices_names_the_gpu_setup_plans_for_and_a_missing_one_is_refused(tmp_path):
    from gemma4_t4.host.setup_plan import plan_setup

    with pytest.raises(Gemma4T4Error, match=r"Tesla P100-PCIE-16GB \(sm_60\) is older than Turing") as p100:
        plan_setup(env.probe(_probes("0")), python="py")  # the P100 CUDA_VISIBLE_DEVICES names: refused
    assert "CUDA_VISIBLE_DEVICES=1" in p100.value.fix  # the T4 beside it can serve
    with pytest.raises(Gemma4T4Error, match="names GPU 7, which nvidia-smi does not list") as info:
        plan_setup(env.probe(_probes("7")), python="py")
    assert "one of 0, 1" in info.value.fix


def test_the_doctor_names_the_gpu_it_judges_and_reports_the_mix():
    report = env.doctor(_probes())
    data = report.to_dict()
    assert data["gpu_choice"]["gpu"]["name"] == "Tesla T4" and data["gpu_choice"]["mixed"] is True
    codes = {p.code: p for p in report.problems}
    assert "mixed-gpus" in codes and "CUDA_VISIBLE_DEVICES=1" in codes["mixed-gpus"].fix
    assert "turing" in codes and "gpu-too-old" not in codes  # judged as the T4, not the P100
    assert "multi-gpu" not in codes  # no tensor parallelism across a P100 and a T4
    refused = env.doctor(_probes("3"))
    assert any(p.code == "gpu-choice" and p.severity == "error" for p in refused.problems)


def test_the_gate_fix_torch_and_the_notebook_use_the_same_gpu(capsys):
    from gemma4_t4 import notebook as nb
    from gemma4_t4.host.torchfix import plan_torch_fix, probe_torch_facts
    from gemma4_t4.serving.gate import host_reasons

    host = env.probe(_probes())  # what the gate judges, as the doctor reads it
    assert host.gpu.name == "Tesla T4" and host.compute_capability == "7.5" and host.cuda_gpu_count == 1
    assert any("T4 is preferred" in p.message for p in env.judge(host)[1] if p.code == "mixed-gpus")
    assert not any(r.check == "doctor:gpu-too-old" for r in host_reasons(host))
    torch_plan = plan_torch_fix(probe_torch_facts(probes=_probes()))
    assert "T4 is preferred" in torch_plan.gpu and torch_plan.cuda_variant == "cu129"
    info = nb.runtime_check("auto", allowed=("cpu", "t4"), probes=_probes(), show=False)
    assert info.gpu_name == "Tesla T4" and info.is_t4 and any("uses GPU 1" in n for n in info.notes)
    with pytest.raises(Gemma4T4Error, match="does not list"):
        nb.runtime_check("auto", allowed=("cpu", "t4"), probes=_probes("9"), show=False)
    plan = nb.setup(dry_run=True, probes=_probes())
    assert plan.gpu_index == 1 and "GPU used: " in capsys.readouterr().out


def test_make_run_auto_names_the_gpu_it_chose_on_a_mixed_host():
    from gemma4_t4.pipeline import resolve_target

    def run(cmd):
        if any(a.startswith("--query-gpu") for a in cmd):
            return 0, "".join(f"{g[0]}, {g[1]}, {g[2]}, {g[3]}, {DRIVER}\n" for g in GPUS)
        return 0, f"| NVIDIA-SMI {DRIVER}   Driver Version: {DRIVER}   CUDA Version: 12.4 |\n"

    target, why = resolve_target("auto", env.Probes(run=run, env={"HOME": "/h"}))
    assert target == "t4" and "Tesla T4" in why and "P100" not in why.split("(")[0], why
    # a mix CUDA_VISIBLE_DEVICES names none of: refused before any notebook runs, as its first cell refuses it
    with pytest.raises(Gemma4T4Error, match="does not list"):
        resolve_target("auto", env.Probes(run=run, env={"HOME": "/h", "CUDA_VISIBLE_DEVICES": "9"}))
