"""The vLLM general plugin (entry-point group ``vllm.general_plugins`` in pyproject.toml) that installs
the Turing tile cap and, on sm_7x, the tensor-core prefill route (:mod:`.prefill`) in every vLLM process.

vLLM calls :func:`register` in the front end, the EngineCore and every worker, wherever attention runs
(a patch applied in a notebook cell would not reach the spawned EngineCore). ``GEMMA4_T4_TURING_FIX=0``
and ``GEMMA4_T4_TC_PREFILL=0`` turn them off; vLLM's ``VLLM_PLUGINS`` allow-list also applies.
"""

from __future__ import annotations

from gemma4_t4.foundation.jsonable import TypedDict
from gemma4_t4.turing import cpuattn, prefill, tilecap

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
    """What :func:`.tilecap.install` did in one process (``action``: capped / no-change / already-active
    / disabled / refused), written down here because tilecap stays standard-library only."""

    device: prefill.DeviceInfo | None
    clamps: list[TileClamp]
    pid: int


_outcome: TileCapOutcome | None = None


def register() -> None:
    """vLLM's hook: install the tile cap and the prefill route where this device needs them. Never raises."""

    global _outcome
    if _outcome is not None:  # vLLM may load plugins more than once per process
        return
    _outcome = tilecap.install(origin="plugin")
    prefill.install(origin="plugin")  # its outcome is logged (one line per process)
    cpuattn.install_from_env()  # CPU servers: the attention set-up the start probe chose (no-op unset)


def outcome() -> TileCapOutcome | None:
    """What :func:`register` did in this process (None if vLLM has not loaded the plugin here)."""
    return TileCapOutcome(**_outcome) if _outcome is not None else None


def entry_point_registered() -> bool:
    """Whether the installed package metadata exposes the plugin to vLLM."""
    from importlib.metadata import entry_points

    return any(ep.name == ENTRY_POINT_NAME and ep.value == ENTRY_POINT_VALUE
               for ep in entry_points(group=ENTRY_POINT_GROUP))
