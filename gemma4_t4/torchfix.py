"""The CUDA-torch fix: replace a CPU-only torch with the CUDA build the chosen vLLM was built for.

The series' first T4 failure: vLLM sat on ``torch 2.11.0+cpu``, so the T4 was invisible
(``ImportError: libcudart.so.13``, an empty arch list). The fix reinstalls torch from PyTorch's
wheel index for vLLM's CUDA variant, **with dependencies**: ``--no-deps`` lost ``libcudnn.so.9``.

:func:`plan_torch_fix` decides (not needed on a machine without an NVIDIA GPU, nor when torch is
already the right CUDA build) and builds the pip command; :func:`apply_torch_fix` runs it
through an injectable runner.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass

from pydantic import BaseModel, Field

from gemma4_t4 import env
from gemma4_t4 import setup as setup_plan
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.jsonable import JSONValue
from gemma4_t4.runner import CommandResult, Runner, subprocess_runner
from gemma4_t4.versions import package_requires, package_version

PYTORCH_INDEX = env.PYTORCH_INDEX
# vLLM release → (torch it pins, CUDA variant of its default wheels): one table, shared with doctor.
VLLM_TORCH: dict[str, tuple[str, str]] = env.VLLM_TORCH
DEFAULT_VLLM = env.GPU_VLLM  # the version the package's `gpu` extra pins
MIN_DRIVER = setup_plan.MIN_DRIVER  # oldest Linux driver per CUDA variant (12.x: minor-version compatibility)


class TorchFacts(BaseModel):
    """What torch an interpreter has, and the GPU, driver and vLLM around it (``fix-torch --json``
    writes it with the plan)."""

    python: str = sys.executable
    torch_version: str | None = None
    torch_cuda_build: str | None = None  # torch.version.cuda; None on a CPU-only build
    cuda_available: bool | None = None
    import_error: str | None = None
    gpu_present: bool | None = None
    driver_version: str | None = None
    vllm_version: str | None = None  # the CUDA vLLM installed here, if any
    vllm_torch_pin: str | None = None  # what that vLLM requires, e.g. "2.14.0"


class TorchFixPlan(BaseModel):
    """Whether torch needs replacing and the pip command that does it; ``fix-torch --json`` writes
    it with :func:`torch_fix_dict` (its fields and the command line)."""

    needed: bool
    reason: str
    vllm_version: str
    torch_version: str
    cuda_variant: str
    index_url: str
    command: list[str]
    warnings: list[str] = Field(default_factory=list)
    facts: TorchFacts | None = None

    def command_line(self) -> str:
        return shlex.join(self.command)

    def summary(self) -> str:
        head = "torch fix NEEDED: " if self.needed else "torch fix not needed: "
        lines = [head + self.reason]
        if self.needed:
            lines += [f"command (vLLM {self.vllm_version} → torch {self.torch_version}, {self.cuda_variant}):",
                      f"  {self.command_line()}",
                      "then restart Python (the notebook kernel) so the new torch loads"]
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
    """What torch ``python`` has (asked in a subprocess, so a broken torch can't break us); the
    GPU and driver come from the doctor's nvidia-smi probe."""
    python = python or sys.executable
    done = runner([python, "-c", _PROBE])
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        found = {"import_error": (done.stderr or "no output").strip()[-300:]}
    if "No module named 'torch'" in found.get("import_error", ""):
        found["import_error"] = "torch is not installed"
    facts = TorchFacts.model_validate({**found, "python": python})
    state = env.probe_gpu_state(probes or env.Probes())
    if state.error:  # a failed nvidia-smi is not "no GPU": the same refusal as setup and the doctor
        raise Gemma4T4Error(state.error, fix=state.fix)
    facts.driver_version = state.driver
    facts.gpu_present = bool(state.gpus)
    facts.vllm_version = package_version("vllm")
    if facts.vllm_version is not None:
        facts.vllm_torch_pin = _torch_pin(package_requires("vllm"))
    return facts


def _torch_pin(requirements: list[str]) -> str | None:
    for req in requirements:
        match = re.match(r"torch\s*==\s*([0-9][0-9a-z.]*)", req)
        if match and "extra ==" not in req:
            return match.group(1)
    return None


def _base_version(version: str | None) -> str | None:
    return version.split("+")[0] if version else None


def plan_torch_fix(facts: TorchFacts | None = None, vllm_version: str | None = None,
                   python: str | None = None) -> TorchFixPlan:
    """Decide whether torch needs replacing, and build the pip command that does it."""
    facts = facts or probe_torch_facts(python)
    vllm = vllm_version or facts.vllm_version or DEFAULT_VLLM
    if vllm.split("+")[0] in VLLM_TORCH:
        torch_version, variant = VLLM_TORCH[vllm.split("+")[0]]
    elif facts.vllm_torch_pin and vllm == facts.vllm_version:
        torch_version, variant = facts.vllm_torch_pin, "cu130"  # vLLM >= 0.20 wheels are CUDA 13
    else:
        raise Gemma4T4Error(f"no known torch build for vLLM {vllm}",
                            fix=f"install vLLM first (its metadata names the torch), or use vLLM {DEFAULT_VLLM}")
    driver_note = None
    base = vllm.split("+")[0]
    known = base in setup_plan.known_vllm_versions()
    if facts.driver_version and known:
        try:  # the install matrix row this driver runs (cu130 needs >= 580), as `gemma4-t4 setup` plans it
            route = setup_plan.routes_for_driver(facts.driver_version, base if known else None)[0]
            variant, torch_version = route.variant, route.torch_version
        except Gemma4T4Error as exc:
            driver_note = f"{exc}: torch alone cannot fix this host ({exc.fix}); gemma4-t4 setup replaces vLLM too"
    index = PYTORCH_INDEX.format(variant=variant)
    command = [facts.python or sys.executable, "-m", "pip", "install", *env.torch_install_args(torch_version, variant)]
    plan = TorchFixPlan(needed=False, reason="", vllm_version=vllm, torch_version=torch_version,
                        cuda_variant=variant, index_url=index, command=command, facts=facts)

    if facts.gpu_present is False:
        plan.reason = "no NVIDIA GPU on this machine, so a CPU build of torch is the right one"
        return plan
    if driver_note:
        plan.warnings.append(driver_note)
    elif facts.driver_version and not known and (setup_plan.driver_major(facts.driver_version) or 0) < MIN_DRIVER["cu130"]:
        plan.warnings.append(f"vLLM {base} is not in the install matrix and its torch is a CUDA 13 build, which "
                             f"driver {facts.driver_version} cannot load: run gemma4-t4 setup instead")
    if variant != "cu130" and facts.driver_version and known and not driver_note:
        route = setup_plan.routes_for_driver(facts.driver_version, base)[0]
        plan.warnings.append(f"driver {facts.driver_version} runs the install matrix's {route.key} route, not a CUDA 13 "
                             f"build: gemma4-t4 setup installs {route.label} (vLLM and torch together)")
    has_cuda_build = facts.torch_cuda_build is not None and "+cpu" not in (facts.torch_version or "")
    right_version = _base_version(facts.torch_version) == torch_version
    built_for = f"cu{facts.torch_cuda_build.replace('.', '')}" if facts.torch_cuda_build else None
    if facts.torch_version is None:
        plan.needed, plan.reason = True, facts.import_error or "torch is not installed"
    elif not has_cuda_build:
        plan.needed = True
        plan.reason = (f"torch {facts.torch_version} is a CPU-only build: vLLM cannot see the GPU "
                       f"(vLLM {vllm} wants torch {torch_version} for {variant})")
    elif not right_version:
        plan.needed = True
        plan.reason = (f"torch {facts.torch_version} (CUDA {facts.torch_cuda_build}) is not the {torch_version} "
                       f"vLLM {vllm} was built against")
    elif built_for != variant and variant in setup_plan.MIN_DRIVER:
        plan.needed = True
        plan.reason = (f"torch {facts.torch_version} is built for CUDA {facts.torch_cuda_build}, but driver "
                       f"{facts.driver_version} runs the {variant} build")
    elif facts.cuda_available is False:
        plan.reason = (f"torch {facts.torch_version} is already a CUDA build but cannot use the GPU; "
                       "reinstalling torch will not help")
        plan.warnings.append("check the driver with nvidia-smi (CUDA 13 builds need driver >= 580)")
    else:
        plan.reason = f"torch {facts.torch_version} is the CUDA build vLLM {vllm} needs and sees the GPU"
    return plan


def apply_torch_fix(plan: TorchFixPlan, runner: Runner = subprocess_runner) -> TorchFixResult:
    """Run the plan's pip command (only if the plan says it is needed)."""
    if not plan.needed:
        return TorchFixResult(False, plan, message=f"nothing to do: {plan.reason}")
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
