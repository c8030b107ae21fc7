"""What the install planner reads of the host model's facts, as an interface below both.

:class:`gemma4_t4.host.env.Facts` is the one record of the host; the planner
(:mod:`gemma4_t4.host.setup_plan`) takes it as an argument, and the host model calls the planner for the doctor's fix line. Naming the
few attributes the planner reads here, below both, keeps the two modules from importing each other
(even for type checking): ``env.Facts`` satisfies these protocols as it is.
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
