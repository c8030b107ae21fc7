"""What the install planner reads of the host model's facts, as an interface below both: the planner
takes :class:`gemma4_t4.host.env.Facts` and the host model calls the planner, so naming the attributes
here keeps the two from importing each other (``env.Facts`` satisfies these protocols as it is).
"""

from __future__ import annotations

from typing import Protocol

from gemma4_t4.host.smi import GPUInfo


class ChosenGpu(Protocol):
    """Which GPU the plan is for, and why (``env.GpuChoice``)."""

    @property
    def gpu(self) -> GPUInfo | None: ...
    @property
    def reason(self) -> str: ...
    @property
    def mixed(self) -> bool: ...
    @property
    def error(self) -> str | None: ...
    @property
    def fix(self) -> str | None: ...


class HostFacts(Protocol):
    """The host facts an install plan depends on (``env.Facts``)."""

    @property
    def platform(self) -> str: ...
    @property
    def gpus(self) -> list[GPUInfo]: ...
    @property
    def gpu_choice(self) -> ChosenGpu: ...
    @property
    def driver_version(self) -> str | None: ...
    @property
    def gpu_probe_error(self) -> str | None: ...
    @property
    def gpu_probe_fix(self) -> str | None: ...
    @property
    def vllm_distribution(self) -> str | None: ...
    @property
    def vllm_version(self) -> str | None: ...
    @property
    def torch_version(self) -> str | None: ...
    @property
    def torch_cuda(self) -> str | None: ...
