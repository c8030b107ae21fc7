"""The start gate: refuse to launch vLLM on a GPU when the machine cannot succeed.

The series' T4 bring-up failed three ways before it served: a CPU-only torch hid the GPU, the
head-512 attention kernel asked for 98,304 B of shared memory on a 65,536 B device, and the
weight load was OOM-killed on a 7.8 GB VM without swap. Each of those costs minutes of
start-up before vLLM fails, so the gate checks them first and lists *every* reason with its fix.

The machine is judged once, by the doctor (:func:`gemma4_t4.host.env.judge` over ``env.Facts``, the
only facts about the host): its errors refuse a launch in its words, as do its "no GPU" and "no torch"
warnings on a GPU target. The gate adds only what depends on the launch: the Turing fix (active, and
proven offline), RAM + swap for this checkpoint's load peak, tensor parallelism, the GPU fit with the
drafter, disk for a download, and on the CPU target the int4 kernel (:func:`judge_cpu`).
:func:`judge` is pure (:class:`LaunchFacts` in, :class:`GateReason` list out; an unknown finding counts
against starting); :func:`collect_facts` gathers the facts through :class:`GateProbes`, injectable.
``force=True`` launches anyway and says loudly what it overrode.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from gemma4_t4.catalog import assistants, models
from gemma4_t4.catalog.hardware import GPUS, identify_gpu
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import to_jsonable
from gemma4_t4.host import cpuisa, env, smi
from gemma4_t4.serving.proof import turing_proof
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.serving.speculative import catalog_entry
from gemma4_t4.turing.state import status as turing_status

T = TypeVar("T")
GIB = 1024**3
# The head-512 attention launch needs this much shared memory per block with vLLM's default tiles.
ATTENTION_SMEM_NEEDED = 98_304
# Host memory vLLM's three processes hold during a weight load besides the weights themselves
# (CUDA context, torch, tokenizer, pinned buffers). From the series' GCE runs: E2B bf16 peaked at
# 7,252 MiB RAM + 6,205-6,761 MiB swap for 9.5 GiB of weights [inferred from measured peaks].
LOAD_OVERHEAD_BYTES = 4 * GIB
DISK_MARGIN = 1.05  # download temp files and metadata


@dataclass
class TuringFound:
    """Is the Turing attention fix active for vLLM's processes, and proven offline for the installed vLLM +
    Triton? ``None``: could not tell (the gate fails closed)."""

    active: bool | None = None
    proven: bool | None = None
    detail: str | None = None


@dataclass
class ModelFound:
    """The checkpoint of a launch: its size, whether it is on disk, where it is or will be downloaded and the
    free space there, its load peak, and its GPU fit with the drafter counted. ``None``: could not tell."""

    weights_bytes: int | None = None
    weights_on_disk: bool | None = None
    disk_path: str | None = None
    disk_free_bytes: int | None = None
    load_peak_bytes: int | None = None
    gpu_fit_ok: bool | None = None
    gpu_fit_detail: str | None = None
    gpu_fit_fix: str | None = None
    notes: list[str] = field(default_factory=list)  # why a finding is missing


@dataclass
class LaunchFacts:
    """What the gate judges: the host as the doctor found it (``env.Facts``, the package's only model of the
    machine) and what the launch-time probes found. ``notes``: "check: why a finding is missing"."""

    host: env.Facts | None  # None on the CPU target: only the int4 check applies there
    target: str = "t4"
    model: str = ""
    tensor_parallel_size: int = 1
    turing: TuringFound = field(default_factory=TuringFound)
    checkpoint: ModelFound = field(default_factory=ModelFound)
    cpu: cpuisa.CpuBuild | None = None  # vLLM's CPU build, asked only for an int4 checkpoint
    notes: list[str] = field(default_factory=list)


@dataclass
class GateReason:
    check: str  # doctor:CODE | turing | host_memory | tensor_parallel | gpu_memory | disk | cpu_int4
    problem: str
    fix: str

    def line(self) -> str:
        return f"[{self.check}] {self.problem}\n    fix: {self.fix}"


@dataclass
class GateResult:
    ok: bool
    forced: bool
    reasons: list[GateReason]
    facts: LaunchFacts

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


# The doctor's warnings that refuse a launch on a GPU target (the CPU path runs without either)
_BLOCK_A_GPU_LAUNCH = frozenset({"no-gpu", "no-torch"})


def judge(facts: LaunchFacts) -> list[GateReason]:
    """Every reason the launch would fail, each with its fix. Empty list: go."""
    host = facts.host
    assert host is not None  # the GPU target always probes the host
    return [
        *host_reasons(host),
        *_judge_turing(facts, host),
        *_judge_host_memory(facts, host),
        *_judge_tensor_parallel(facts, host),
        *_judge_gpu_memory(facts),
        *_judge_disk(facts),
    ]


def host_reasons(host: env.Facts) -> list[GateReason]:
    """1. the doctor's verdict on the host, in its words: each error, and a missing GPU or torch."""
    return [GateReason(f"doctor:{p.code}", p.message, p.fix or "run gemma4-t4 doctor for details")
            for p in env.judge(host)[1] if p.severity == "error" or p.code in _BLOCK_A_GPU_LAUNCH]


def judge_cpu(facts: LaunchFacts) -> list[GateReason]:
    """(cpu) an int4 checkpoint needs vLLM's int4 CPU kernel (AVX-512 builds only), else its engine
    dies at the first request. An unknown format or CPU build does not refuse: bf16 serves everywhere."""
    build = facts.cpu
    if facts.target != "cpu" or build is None or not build.int4_refused:
        return []
    problem = f"{facts.model} is an int4 (compressed-tensors pack-quantized) checkpoint, but {build.reason}"
    return [GateReason("cpu_int4", problem, cpuisa.INT4_FIX)]


def _judge_turing(facts: LaunchFacts, host: env.Facts) -> list[GateReason]:
    """2. the Turing attention fix, where the device's shared memory is below the kernel's need."""
    # proven offline for the installed vLLM + Triton (a kernel that merely looks known is not
    # enough), and not known to be inactive (a proven fix that is not installed still crashes)
    found = facts.turing
    fix_ok = found.proven is True and found.active is not False
    if fix_ok or not env.needs_turing_fix(host.smem_per_block_optin, host.compute_capability, facts.target):
        return []
    if found.active is True:  # installed, but the offline proof failed or could not run
        outcome = "failed" if found.proven is False else "did not run"
        return [GateReason(
            "turing",
            "the Turing attention fix is active but not proven for this vLLM + Triton (the offline sm_75 "
            f"compile of vLLM's kernel {outcome})" + (f": {found.detail}" if found.detail else ""),
            "run `gemma4-t4 turing verify` and fix what it reports (it needs Triton: pip install "
            "'triton==3.8.0'); a vLLM whose kernel the fix does not know needs a tested vLLM",
        )]
    smem = host.smem_per_block_optin
    limit = f"this GPU allows {smem:,} B" if smem else "a T4 allows 65,536 B"
    state = "is not active" if found.active is False else "could not be confirmed"
    return [GateReason(
        "turing",
        f"the Turing attention fix {state}: Gemma 4's head-512 attention needs {ATTENTION_SMEM_NEEDED:,} B "
        f"of shared memory per block, {limit}, so vLLM would crash with "
        f"OutOfResources" + (f" ({found.detail})" if found.detail else ""),
        "install gemma4-t4 into the Python that runs vLLM (its vllm.general_plugins entry point "
        "loads the fix in every vLLM process) and check with `gemma4-t4 turing status`; "
        "where that is impossible, `gemma4-t4 turing apply` patches the installed vLLM file",
    )]


def _bytes(gib: float | None) -> int | None:
    return None if gib is None else round(gib * GIB)


def _judge_host_memory(facts: LaunchFacts, host: env.Facts) -> list[GateReason]:
    """3. host RAM + swap must hold the weight-load peak."""
    ram, swap = _bytes(host.ram_available_gib), _bytes(host.swap_free_gib)
    peak = facts.checkpoint.load_peak_bytes
    if peak is None or ram is None or swap is None:
        return [GateReason(
            "host_memory",
            "could not estimate host memory for the weight load" + _note(facts, "host_memory", "model"),
            "use a catalog model or a local checkpoint folder, or pass force=True if you know it fits",
        )]
    have = ram + swap
    if have >= peak:
        return []
    if host.platform == "colab":
        fix = "Colab cannot add swap: use the QAT w4a16 checkpoint (smaller load), a smaller model, or a High-RAM runtime"
    else:
        swap_gib = max(16, int(-(-(peak - have) // GIB)) + 2)
        fix = (f"add swap: sudo gemma4-t4 swap create --size {swap_gib}G (or use a machine with "
               "more RAM, or a smaller checkpoint such as the QAT w4a16 one)")
    return [GateReason(
        "host_memory",
        f"RAM available {_gib(ram)} + free swap {_gib(swap)} = {_gib(have)} < {_gib(peak)} needed while loading "
        "the weights; the kernel would OOM-kill vLLM mid-load",
        fix,
    )]


def _judge_tensor_parallel(facts: LaunchFacts, host: env.Facts) -> list[GateReason]:
    """3b. tensor parallelism needs as many GPUs as it names, visible to CUDA (the memory check divides
    the model over them, so it cannot see this itself). No GPU is the doctor's refusal, not this one."""
    tp, count, gpu = facts.tensor_parallel_size, host.cuda_gpu_count, host.gpu
    if tp <= 1 or not count or gpu is None or tp <= count:
        return []
    return [GateReason(
        "tensor_parallel",
        f"--tensor-parallel-size {tp} needs {tp} GPUs, but CUDA sees {count} {gpu.name} GPU{'s' if count > 1 else ''} "
        "here for it: vLLM would wait for workers that never start",
        f"pass --tensor-parallel-size {count} or less (tensor_parallel_size), or run on a machine with {tp} "
        "GPUs of one model (CUDA_VISIBLE_DEVICES must list them all)",
    )]


def _judge_gpu_memory(facts: LaunchFacts) -> list[GateReason]:
    """4. GPU memory per the fit calculator."""
    found = facts.checkpoint
    if found.gpu_fit_ok is True:
        return []
    if found.gpu_fit_ok is False:
        problem = "the model does not fit GPU memory" + (f": {found.gpu_fit_detail}" if found.gpu_fit_detail else "")
    else:
        problem = "could not check that the model fits GPU memory" + _note(facts, "gpu_memory", "model")
    fix = found.gpu_fit_fix or (
        "lower max_model_len (--max-model-len), use the QAT w4a16 checkpoint, or "
        "spread over more T4s (tensor_parallel_size); `gemma4-t4 fit` shows what fits"
    )
    return [GateReason("gpu_memory", problem, fix)]


def _judge_disk(facts: LaunchFacts) -> list[GateReason]:
    """5. disk for the weights when they still need downloading."""
    found = facts.checkpoint
    if found.weights_on_disk is True:
        return []
    if found.weights_bytes is None or found.disk_free_bytes is None:
        return [GateReason(
            "disk",
            "could not check free disk for the weights" + _note(facts, "disk", "model"),
            "download the checkpoint first (hf download MODEL) or point --model at a local folder",
        )]
    if found.disk_free_bytes >= found.weights_bytes * DISK_MARGIN:
        return []
    return [GateReason(
        "disk",
        f"{found.disk_path} has {_gib(found.disk_free_bytes)} free, the weights need "
        f"{_gib(int(found.weights_bytes * DISK_MARGIN))}",
        "free space there, or set HF_HOME to a bigger disk (e.g. a mounted data disk)",
    )]


def _note(facts: LaunchFacts, *checks: str) -> str:
    notes = [n.split(": ", 1)[1] for n in facts.notes if n.split(": ", 1)[0] in checks]
    return f" ({'; '.join(notes)})" if notes else ""


# --------------------------------------------------------------------------------------------
# Collecting facts (I/O), through probes that tests replace
# --------------------------------------------------------------------------------------------


def probe_turing(compute_capability: tuple[int, int] | None) -> TuringFound:
    """Is the Turing fix active for vLLM's processes, and proven offline for the installed vLLM +
    Triton (cached)? The proof runs only for a readable device that needs the fix."""
    status = turing_status()
    found = TuringFound(active=bool(status.active), detail=status.summary)
    if compute_capability is not None and env.needs_turing_fix(None, compute_capability):
        proof = turing_proof("sm_75")  # the devices that need the fix are Turing-class: its limits are proven
        found.proven, found.detail = proof.proven, f"{status.summary}; {proof.detail}"
    return found


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


def probe_cpu_build(config: ServerConfig) -> cpuisa.CpuBuild | None:
    """For an int4 checkpoint: can vLLM's CPU build here run int4 (``gemma4_t4.host.cpuisa``, cached)?"""
    return cpuisa.cpu_build(python=config.python) if model_is_int4(str(config.model)) else None


def local_weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.safetensors"))


def _cached_weights(model: str) -> int | None:
    """The safetensors bytes of ``model`` in the Hugging Face cache; None while it is not downloaded."""
    cached = _hub_cache() / ("models--" + model.replace("/", "--"))
    return local_weights_bytes(cached) if cached.is_dir() and any(cached.rglob("*.safetensors")) else None


def _hub_cache() -> Path:
    return env.hf_hub_cache(os.environ)


def probe_model(config: ServerConfig, host: env.Facts) -> ModelFound:
    """Weights size, load peak, GPU fit and disk for ``config.model`` on ``host``'s GPU."""
    where = Path(config.model)
    entry = catalog_entry(config.model)
    notes, free = [], None
    if where.exists():
        weights, on_disk = local_weights_bytes(where), True
    else:
        where = _hub_cache()
        weights = _cached_weights(config.model)
        on_disk, free = weights is not None, env.free_bytes(str(where))
        if weights is None and entry is not None:
            weights = models.weights_estimate(*entry).checkpoint_bytes
        if weights is None:
            notes.append(f"{config.model} is neither a local folder nor a Gemma 4 catalog hub id")
    peak = weights + LOAD_OVERHEAD_BYTES if weights else None
    if entry is not None:
        peak = int(models.load_ram(*entry).peak_ram_gib * GIB)
    fit = _gpu_fit(config, entry, weights, host)  # the GPU fit's findings, and the checkpoint's
    return replace(fit, weights_bytes=weights, weights_on_disk=on_disk, disk_path=str(where), disk_free_bytes=free,
                   load_peak_bytes=peak, notes=notes + fit.notes)


@dataclass(frozen=True)
class DrafterMemory:
    """What a launch's drafter adds to GPU memory: its weights (None: unknown) and, for a whole-model
    drafter (vLLM ``draft_model``), its own KV cache."""

    weights_bytes: int | None
    own_kv: bool
    detail: str


def drafter_memory(config: ServerConfig, target_weights: int | None) -> DrafterMemory:
    """The drafter ``config.draft_plan()`` chose, sized from its files, the assistant catalog or the
    fit calculator's estimate (``target_weights``: the target's, for ``--draft self``)."""
    plan = config.draft_plan()
    if not plan.enabled:
        return DrafterMemory(0, False, "no drafter")
    own_kv = plan.method == "draft_model"  # an MTP assistant reads the target's KV cache
    name = str(plan.model)
    path = Path(name).expanduser()
    assistant = assistants.assistant_by_id(name)
    entry = catalog_entry(name) if own_kv else None
    if plan.requested == "self":
        weights, source = target_weights, "a second copy of the target's weights"
    elif path.is_dir():
        weights, source = local_weights_bytes(path), f"its safetensors in {path}"
    elif (cached := _cached_weights(name)) is not None:
        weights, source = cached, "its safetensors in the Hugging Face cache"
    elif assistant is not None:
        weights, source = assistant.weights_bytes, "the assistant catalog"
    elif entry is not None:
        estimate = models.weights_estimate(*entry, bool(config.language_model_only))
        weights, source = estimate.total_bytes, f"the fit calculator's {entry[0]} {entry[1]} estimate"
    else:
        return DrafterMemory(None, own_kv, f"drafter {name}: size unknown (not local, not cached, not catalogued)")
    kv = ", plus its own KV cache" if own_kv else ""
    return DrafterMemory(weights, own_kv, f"drafter {name}: {_gib(weights)} from {source}{kv}")


def _gpu_fit(config: ServerConfig, entry: tuple[str, str] | None, weights: int | None, host: env.Facts) -> ModelFound:
    """The fit calculator for a catalog model on a table GPU; else weights + drafter + 1 GiB runtime against
    vLLM's share of the GPU's memory (the host's figure, else the table's; no KV cache estimate), so an
    unknown GPU is never judged as another. The drafter counts too."""
    if host.gpu is not None:
        gpu = identify_gpu(host.gpu.name)
    else:  # no GPU seen (CUDA not working, or a check before the machine has one): the GPU --target t4 is for
        gpu = GPUS["t4"] if config.target == "t4" else None
    target_weights = weights
    if entry is not None:
        target_weights = models.weights_estimate(*entry, bool(config.language_model_only)).total_bytes
    try:
        drafter = drafter_memory(config, target_weights)
    except Gemma4T4Error as exc:
        drafter = DrafterMemory(None, False, f"drafter: {exc.message}")
    if drafter.weights_bytes is None:
        return ModelFound(
            notes=[f"{drafter.detail}: the GPU fit cannot count it"],
            gpu_fit_fix="download the drafter first (its size is read from its files), use --draft auto or "
            "--draft off, or pass force=True if you know it fits",
        )
    with_drafter = f" + {drafter.detail}" if drafter.weights_bytes or drafter.own_kv else ""
    if entry is not None and gpu is not None:
        return _catalog_fit(config, entry, gpu.key, drafter, with_drafter)
    memory = host.gpu.memory_mib * 2**20 if host.gpu and host.gpu.memory_mib else None
    if memory is None and gpu is not None:
        memory = int(gpu.usable_memory_gib * GIB)
    if target_weights is None or memory is None:
        return ModelFound()
    usable = memory * config.gpu_memory_utilization * max(1, config.tensor_parallel_size)
    if entry is None:
        why = "not a catalog model, so KV cache is not estimated"
    else:
        why = (f"{host.gpu.name if host.gpu else None} is not in the hardware table: judged by the {_gib(memory)} the host "
               "reports, KV cache not estimated")
    return ModelFound(
        gpu_fit_ok=target_weights + drafter.weights_bytes + GIB < usable,
        gpu_fit_detail=f"weights {_gib(target_weights)}{with_drafter} + 1 GiB runtime vs {_gib(int(usable))} vLLM may "
        f"use (gpu_memory_utilization {config.gpu_memory_utilization}; {why})",
    )


def _catalog_fit(
    config: ServerConfig, entry: tuple[str, str], gpu: str, drafter: DrafterMemory, with_drafter: str
) -> ModelFound:
    """The fit calculator (weights, KV cache, runtime) for a catalog model on a table GPU."""
    result = models.fit(
        *entry, gpu=gpu, context_len=config.max_model_len, num_gpus=config.tensor_parallel_size,
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
        if with_drafter:
            fix += f"; or --draft off (the drafter counts: {drafter.detail})"
    return ModelFound(
        gpu_fit_ok=result.fits,
        gpu_fit_detail=f"{entry[0]} {entry[1]}{with_drafter} on {gpu}: {result.verdict}",
        gpu_fit_fix=fix,
    )


@dataclass
class GateProbes:
    """Where the gate's facts come from; replace any of them to test the gate without a GPU."""

    host: env.Probes = field(default_factory=env.Probes)  # the doctor's, read with smem=True (CUDA through torch)
    turing: Callable[[tuple[int, int] | None], TuringFound] = probe_turing
    model: Callable[[ServerConfig, env.Facts], ModelFound] = probe_model
    cpu_build: Callable[[ServerConfig], cpuisa.CpuBuild | None] = probe_cpu_build


def _ask(facts: LaunchFacts, check: str, probe: Callable[..., T], *args: object) -> T | None:
    """A probe's finding; one that fails finds nothing, and a note says why (the gate then fails closed)."""
    try:
        return probe(*args)
    except Exception as exc:  # noqa: BLE001 - any probe failure is a note, never a crash of the gate
        facts.notes.append(f"{check}: {type(exc).__name__}: {exc}")
        return None


def collect_facts(config: ServerConfig, probes: GateProbes | None = None) -> LaunchFacts:
    """The host as the doctor reads it, then the launch-time probes; one that fails leaves a note."""
    probes = probes or GateProbes()
    host = env.probe(probes.host, smem=True)  # never raises: what it could not read is what the doctor says
    facts = LaunchFacts(host, config.target, str(config.model), config.tensor_parallel_size)
    facts.turing = _ask(facts, "turing", probes.turing, smi.parse_capability(host.compute_capability)) or TuringFound()
    facts.checkpoint = _ask(facts, "model", probes.model, config, host) or ModelFound()
    facts.notes += [f"model: {note}" for note in facts.checkpoint.notes if note]
    return facts


def check_start(
    config: ServerConfig, force: bool = False, probes: GateProbes | None = None, facts: LaunchFacts | None = None
) -> GateResult:
    """Gate a launch of ``config`` (on the CPU target only :func:`judge_cpu`'s checks). Raises
    :class:`GateRefused` unless every check passes or ``force``."""
    if config.target == "cpu":
        facts = LaunchFacts(None, config.target, str(config.model))
        # a probe that fails leaves the build unknown, and an unknown build never refuses (judge_cpu)
        facts.cpu = _ask(facts, "cpu_int4", (probes or GateProbes()).cpu_build, config)
        reasons = judge_cpu(facts)
    else:
        facts = facts or collect_facts(config, probes)
        facts.tensor_parallel_size = config.tensor_parallel_size
        reasons = judge(facts)
    result = GateResult(ok=not reasons, forced=bool(force and reasons), reasons=reasons, facts=facts)
    if reasons and not force:
        raise GateRefused(result)
    return result
