"""The vLLM general plugin that installs the Turing tile cap in every vLLM process.

Registered in pyproject.toml under the entry-point group ``vllm.general_plugins``. vLLM calls
:func:`register` once per process: in the API server / ``LLM(...)`` front end, in the EngineCore
process and in every worker, i.e. wherever attention kernels are launched. A patch applied only
in a notebook cell would not reach the spawned EngineCore.

It also installs the tensor-core prefill route on sm_7x GPUs (:mod:`.prefill`).

Set ``GEMMA4_T4_TURING_FIX=0`` to turn the tile cap off and ``GEMMA4_T4_TC_PREFILL=0`` to turn the
prefill route off; vLLM's ``VLLM_PLUGINS`` allow-list also applies.
"""

from __future__ import annotations

from gemma4_t4.foundation.jsonable import TypedDict
from gemma4_t4.host import cpuattn
from gemma4_t4.turing import prefill, tilecap

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_NAME = "gemma4_t4_turing"
ENTRY_POINT_VALUE = "gemma4_t4.turing.plugin:register"



class TileClamp(TypedDict):
    """One launch whose KV tile the cap made smaller."""

    head_size: int
    is_prefill: bool
    block_m: int
    tile_from: int
    tile_to: int
    shared_bytes: int
    limit_bytes: int


class TileCapOutcome(prefill.RouteOutcome, total=False):
    """What :func:`gemma4_t4.turing.tilecap.install` did in one process (tilecap itself stays
    standard-library only, so its shape is written down here): an install's outcome (``action``:
    capped / no-change / already-active / disabled / refused, always with its reason, vLLM version
    and origin) and what the tile cap found and changed."""

    device: prefill.DeviceInfo | None
    clamps: list[TileClamp]
    pid: int


_outcome: TileCapOutcome | None = None
_prefill_outcome: prefill.RouteOutcome | None = None


def register() -> None:
    """vLLM's hook: install the tile cap and the prefill route where this process's device needs them.

    Never raises."""
    global _outcome, _prefill_outcome
    if _outcome is not None:  # vLLM may load plugins more than once per process
        return
    _outcome = tilecap.install(origin="plugin")
    _prefill_outcome = prefill.install(origin="plugin")
    cpuattn.install_from_env()  # CPU servers: the attention set-up the start probe chose (no-op unset)


def outcome() -> TileCapOutcome | None:
    """What :func:`register` did in this process (None if vLLM has not loaded the plugin here)."""
    return TileCapOutcome(**_outcome) if _outcome is not None else None


def entry_point_registered() -> bool:
    """Whether the installed package metadata exposes the plugin to vLLM."""
    from importlib.metadata import entry_points

    return any(ep.name == ENTRY_POINT_NAME and ep.value == ENTRY_POINT_VALUE
               for ep in entry_points(group=ENTRY_POINT_GROUP))
