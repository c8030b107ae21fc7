"""Atomic file writes: a temporary file in the same folder, fsync, then a rename, so readers
never see half a file and an interrupted write leaves the old file (or nothing) in place; and the
reading side, :func:`read_json_object`, which says why a record someone else left is unreadable."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gemma4_t4.foundation.jsonable import JSONObject, to_jsonable


def atomic_write_bytes(
    path: str | os.PathLike, data: bytes, mode_from: str | os.PathLike | None = None, mode: int | None = None
) -> None:
    """Replace ``path`` with ``data``; copy permission bits from ``mode_from``, or set ``mode``, when given
    (otherwise the file is private to its owner, as ``mkstemp`` makes it). A write that fails (a full
    disk, a file-size limit) removes its temporary file and leaves ``path`` as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode_from is not None:
            shutil.copymode(mode_from, tmp)
        elif mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    atomic_write_text(path, json.dumps(to_jsonable(data), indent=2) + "\n")


class UnreadableJSON(ValueError):
    """A JSON record that exists but holds no JSON object; its text says why, for the message that names it."""


def read_json_object(path: str | os.PathLike) -> JSONObject:
    """The JSON object a record file holds. ``FileNotFoundError`` when there is none; :class:`UnreadableJSON`
    when it is empty (a write cut short: a full disk, or a kill during a write that was not atomic), not
    JSON, not an object, or unreadable."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnreadableJSON(f"cannot be read: {exc.strerror or exc}") from exc
    if not raw.strip():
        raise UnreadableJSON(f"empty ({len(raw)} bytes): a write cut short, e.g. by a full disk")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise UnreadableJSON("not JSON: cut short or overwritten") from exc
    if not isinstance(data, dict):
        raise UnreadableJSON(f"not a JSON object (a {type(data).__name__})")
    return data
