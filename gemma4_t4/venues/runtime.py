"""Where a notebook part runs: its TARGET (``cpu``, ``t4`` or ``sagemaker``; ``auto`` chosen by the host) and
the host facts behind it, as :class:`RuntimeInfo`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gemma4_t4.catalog.hardware import identify_gpu
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host import env, smi

TARGETS = ("cpu", "t4", "sagemaker")
AUTO = "auto"  # the notebooks' default: the GPU path where there is an NVIDIA GPU, else the CPU default


@dataclass
class RuntimeInfo:
    """What the notebook is running on (the doctor's host facts), checked against what TARGET needs."""

    target: str  # the resolved target: cpu | t4 | sagemaker
    requested: str  # what the parameters cell said (auto, cpu, ...)
    reason: str  # why ``target`` was chosen
    facts: env.Facts
    packages: dict[str, str | None]
    notes: list[str] = field(default_factory=list)

    @property
    def gpu(self) -> smi.GPUInfo | None:
        """The GPU the part uses: env.choose_gpu's (CUDA_VISIBLE_DEVICES, else a T4), never just the first."""
        return self.facts.gpu

    @property
    def gpu_name(self) -> str | None:
        return self.gpu.name if self.gpu else None

    @property
    def compute_capability(self) -> str | None:
        return self.gpu.compute_capability if self.gpu else None

    @property
    def gpu_memory_gib(self) -> float | None:
        return round(self.gpu.memory_mib / 1024, 1) if self.gpu and self.gpu.memory_mib else None

    @property
    def serves_on_this_gpu(self) -> bool:
        """The part serves on this machine's GPU (TARGET 't4'): host changes (CUDA torch, swap) apply."""
        return self.target == "t4"

    @property
    def is_t4(self) -> bool:
        return self.compute_capability == "7.5" or bool(self.gpu_name and "T4" in self.gpu_name)

    @property
    def gpu_key(self) -> str | None:
        """The detected GPU's key in the hardware table; None without a GPU or for one it does not list."""
        gpu = identify_gpu(self.gpu_name)
        return gpu.key if gpu else None

    @property
    def roofline_gpu(self) -> str:
        """The GPU the roofline and fit tables describe: the detected one, else the series' T4."""
        return self.gpu_key or "t4"


def resolve_target(target: str, allowed: Sequence[str], facts: env.Facts, auto_gpu: str = "t4") -> tuple[str, str]:
    """(target, why) for the parameters cell's TARGET; ``auto`` picks by the host."""
    value = str(target).strip().lower()
    if value == "t4" and "t4" not in allowed and auto_gpu in allowed:
        # "t4" is this machine's GPU in Parts 2-4; a part that uses no local GPU (Part 1) runs where its
        # auto would, and never reads it as "deploy a T4 on AWS" (that bills: TARGET='sagemaker' says it)
        return auto_gpu, (f"TARGET='t4' (this machine's GPU) is not used by this part: it runs on {auto_gpu!r}; "
                          "a T4 on AWS is TARGET='sagemaker' with its instance type")
    if value != AUTO:
        return check_target(value, allowed), f"TARGET={value!r} was set in the parameters cell"
    if facts.gpus:
        choice = facts.gpu_choice
        if choice.error:  # GPUs differ and CUDA_VISIBLE_DEVICES names none of them: no guess
            raise Gemma4T4Error(choice.error, fix=choice.fix)
        gpu = choice.gpu
        assert gpu is not None  # a choice without an error names a GPU
        chosen = check_target(auto_gpu, allowed)
        if chosen == "cpu":
            return chosen, (f"TARGET='auto': {gpu.name} found, but this part runs on the local stand-ins "
                            "unless you choose another TARGET explicitly (it would bill)")
        return chosen, f"TARGET='auto': {gpu.name} found (nvidia-smi), so the GPU path"
    return check_target("cpu", allowed), ("TARGET='auto': no NVIDIA GPU found (nvidia-smi lists none), so the "
                                          "embedded CPU default")


def check_target(target: str, allowed: Sequence[str] = TARGETS) -> str:
    value = str(target).strip().lower()
    if value not in allowed:
        raise Gemma4T4Error(f"TARGET={target!r} is not supported by this notebook",
                            fix=f"set TARGET to 'auto' or one of {', '.join(repr(a) for a in allowed)} "
                                "in the parameters cell")
    return value
