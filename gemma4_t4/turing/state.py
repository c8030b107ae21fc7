"""Whether the Turing attention fix reaches vLLM's processes from this environment, by which route
(the vLLM plugin, the file patch), and what the plugin did in this process.

Cheap: imports neither torch nor vLLM (the plugin module is loaded, not run).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.turing import plugin, tilecap
from gemma4_t4.turing.filepatch import FilePatchStatus, file_patch_status


@dataclass
class TuringStatus:
    vllm_version: str | None
    plugin_registered: bool  # the entry point is in the installed package metadata
    plugin_enabled: bool  # not turned off by GEMMA4_T4_TURING_FIX=0 or excluded by VLLM_PLUGINS
    disabled_reason: str | None
    plugin_outcome: plugin.TileCapOutcome | None  # what the plugin did in THIS process (None: not loaded here)
    file_patch: FilePatchStatus | None  # None when vLLM is not installed
    active: bool  # vLLM processes started from this environment get the tile cap (plugin or file patch)
    summary: str


def _plugin_disabled_reason() -> str | None:
    if tilecap.disabled():
        return f"{tilecap.ENV_DISABLE}={os.environ[tilecap.ENV_DISABLE]}"
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and plugin.ENTRY_POINT_NAME not in [p.strip() for p in allowed.split(",")]:
        return f"VLLM_PLUGINS={allowed!r} does not list {plugin.ENTRY_POINT_NAME}"
    return None


def status() -> TuringStatus:
    """Whether the fix will reach vLLM's processes, by which route, and its state here.

    Cheap: imports neither torch nor vLLM. The per-device decision is made inside each vLLM
    process; its log line (``gemma4-t4 turing fix: ...``) says what was done there.
    """
    registered = plugin.entry_point_registered()
    disabled = _plugin_disabled_reason()
    try:
        patch = file_patch_status()
        version: str | None = patch.vllm_version
    except Gemma4T4Error:
        patch, version = None, None
    enabled = registered and disabled is None
    patched = bool(patch and patch.patched and not tilecap.disabled())
    refused = patch is not None and patch.refusal is not None and not patched
    reaches = (enabled or patched) and version is not None and not refused
    if version is None:
        summary = "vLLM is not installed here"
    elif refused:
        summary = f"the fix would refuse this vLLM: {patch.refusal}"
    elif reaches:
        routes = [name for name, on in (("plugin", enabled), ("file patch", patched)) if on]
        summary = (f"active via {' and '.join(routes)}: each vLLM process caps attention tiles if its GPU's "
                   "shared memory needs it")
    else:
        summary = "not active: " + (disabled or "plugin not registered (pip install -e .) and file not patched")
    return TuringStatus(version, registered, enabled, disabled, plugin.outcome(), patch, reaches, summary)
