"""Safe output folders for every command that writes one (repack, requant-awq, tiny; bench and run can reuse it).

A target must not be, contain, or lie inside a source (``--overwrite`` of the source's parent would
remove it); ``--overwrite`` only removes a folder carrying this package's marker (:data:`MARKER_NAME`);
output is built in a hidden sibling ``.DST.partial-XXXX`` recording its owner PID and renamed into place
when complete (a partial left by a hard kill is removed, and named, by the next run into the target);
free space is checked first. Everything raises :class:`Gemma4T4Error` with a fix; nothing here prints.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shlex
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from gemma4_t4 import __version__
from gemma4_t4.errors import Gemma4T4Error, os_fix
from gemma4_t4.foundation import signals
from gemma4_t4.foundation.atomic import UnreadableJSON, atomic_write_text, read_json_object

MARKER_NAME = ".gemma4_t4-output.json"  # in every finished output folder
PARTIAL_OWNER = ".gemma4_t4-partial.json"  # in every folder being built: who builds it
MARKER_KEY = "gemma4_t4_output"
FREE_SPACE_MARGIN = 64 * 2**20  # metadata, side files, the filesystem's own reserve
NO_OWNER_GRACE_S = 60.0  # a partial without an owner file is stale once this old (its creator died at birth)


def _real(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


def refuse_overlap(
    target: str | os.PathLike, sources: Iterable[str | os.PathLike], what: str = "DST"
) -> None:
    """Refuse a ``target`` that is, contains, or lies inside any of ``sources`` (symlinks resolved)."""
    t = _real(target)
    for src in sources:
        s = _real(src)
        if t == s:
            relation = "is"
        elif s.is_relative_to(t):
            relation = "contains"
        elif t.is_relative_to(s):
            relation = "is inside"
        else:
            continue
        raise Gemma4T4Error(
            f"{what} {target} {relation} the source {src}; writing there could destroy the source",
            fix=f"choose a {what} outside the source folder (e.g. a sibling folder)",
        )


def write_marker(folder: str | os.PathLike, command: str, **details: object) -> None:
    """Mark ``folder`` as written by this package (``--overwrite`` may later replace it). Written
    atomically: a full disk leaves no marker rather than an empty one that would block every retry."""
    payload = {
        MARKER_KEY: True,
        "command": command,
        "version": __version__,
        "created_unix": round(time.time(), 3),
        **details,
    }
    # 0o644: readable like the files beside it (a temporary file starts private to its owner)
    atomic_write_text(
        Path(folder) / MARKER_NAME, json.dumps(payload, indent=1, default=str) + "\n", mode=0o644
    )


def marker_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder``'s marker is not a marker of this package (empty, not JSON, another shape,
    unreadable), or None when there is none or it is valid."""
    try:
        data = read_json_object(Path(folder) / MARKER_NAME)
    except FileNotFoundError:
        return None
    except UnreadableJSON as exc:
        return str(exc)
    return None if data.get(MARKER_KEY) is True else f"no {MARKER_KEY!r}: true in it"


def is_owned(folder: str | os.PathLike, legacy_names: Iterable[str] = ()) -> bool:
    """``folder`` carries this package's marker (or a legacy report file only this package writes)."""
    folder = Path(folder)
    if (folder / MARKER_NAME).is_file() and marker_problem(folder) is None:
        return True
    return any((folder / name).is_file() for name in legacy_names)


def holds_nothing(folder: str | os.PathLike) -> bool:
    """``folder`` is empty, or holds only an empty marker: what a full disk left when the marker was
    written in place (before it was written atomically). Removing that file loses no byte, so such a
    folder counts as empty; a marker with any content is judged by :func:`marker_problem` instead."""
    entries = list(Path(folder).iterdir())
    if not entries:
        return True
    only = entries[0]
    return (
        len(entries) == 1
        and only.name == MARKER_NAME
        and not only.is_symlink()
        and only.is_file()
        and only.stat().st_size == 0
    )


def not_owned_reason(folder: str | os.PathLike) -> str:
    """Why ``folder`` does not show that this package wrote it, for a refusal's message."""
    problem = marker_problem(folder)
    return f"its {MARKER_NAME} is corrupt: {problem}" if problem else f"no {MARKER_NAME}"


def check_target(
    target: str | os.PathLike,
    *,
    overwrite: bool,
    sources: Iterable[str | os.PathLike] = (),
    what: str = "DST",
    legacy_names: Iterable[str] = (),
) -> Path:
    """Validate an output folder before any work: not a file or symlink, no overlap with a source; an
    existing one only with ``overwrite`` and only when this package wrote it (or it is empty)."""
    path = Path(target)
    refuse_overlap(path, sources, what)
    if path.is_symlink():
        raise Gemma4T4Error(
            f"{what} {path} is a symbolic link", fix=f"give the real folder as {what}, or a new path"
        )
    if path.exists() and not path.is_dir():
        raise Gemma4T4Error(
            f"{what} {path} is a file, not a folder", fix=f"choose a new folder path for {what}"
        )
    parent = existing_ancestor(path.parent)
    if not parent.is_dir():
        raise Gemma4T4Error(f"{parent} (a parent of {what}) is a file", fix=f"choose a {what} in a folder")
    if path.exists():
        if not overwrite:
            raise Gemma4T4Error(f"{path} already exists", fix=f"choose a new {what} or pass --overwrite")
        # A corrupt marker is not ownership: this package writes its marker atomically, so it never
        # leaves one half-written, and a file's name alone proves nothing about who made the folder
        # (another tool, a copy, a hand edit). So --overwrite refuses such a folder, naming the marker;
        # only a folder holding nothing but an empty marker counts as empty (removing it loses nothing).
        if not holds_nothing(path) and not is_owned(path, legacy_names):
            raise Gemma4T4Error(
                f"{path} was not written by gemma4-t4, as far as its marker shows ({not_owned_reason(path)}), "
                "so --overwrite will not remove it",
                fix=f"choose a new {what}, or remove the folder yourself (rm -r {shlex.quote(str(path))}) if you are "
                "sure it holds nothing you need",
            )
    return path


def existing_ancestor(path: Path) -> Path:
    """``path`` itself or the nearest folder above it that exists (``/`` at worst)."""
    path = path.absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def free_bytes(path: str | os.PathLike) -> int:
    return shutil.disk_usage(existing_ancestor(Path(path))).free


def ensure_free_space(
    path: str | os.PathLike, need_bytes: int, what: str = "the output"
) -> None:
    """Refuse to start when the filesystem of ``path`` has less than ``need_bytes`` (+ margin) free."""
    free, margin = free_bytes(path), FREE_SPACE_MARGIN
    if free < need_bytes + margin:
        where = existing_ancestor(Path(path))
        raise Gemma4T4Error(
            f"not enough free space for {what}: needs {(need_bytes + margin) / 1e9:,.2f} GB, "
            f"{free / 1e9:,.2f} GB free on the filesystem of {where}",
            fix="free some space there, or choose a target on a disk with more room",
        )


def os_error(exc: OSError, what: str) -> Gemma4T4Error:
    """A clear message for the file-system failures a user can act on; the fix is :func:`.errors.os_fix`'s."""
    reason = {
        errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk is full",
        errno.EFBIG: "a file-size limit was reached", errno.EROFS: "the location is read-only",
        errno.EACCES: "permission denied", errno.EPERM: "permission denied",
    }.get(exc.errno or -1) or exc.strerror or str(exc)
    where = f" ({exc.filename})" if exc.filename else ""
    return Gemma4T4Error(f"cannot write {what}: {reason}{where}", fix=os_fix(exc) or "check the path and the disk")


_OS_ERROR_IN_TEXT = re.compile(r"\(os error (\d+)\)")  # how Rust writers (safetensors) report errno


def write_error(exc: BaseException, what: str) -> Gemma4T4Error | None:
    """:func:`os_error` for an ``OSError``, or for a library error that wraps one only in its text
    (safetensors' ``SafetensorError: ... No space left on device (os error 28)``); None otherwise."""
    if isinstance(exc, OSError):
        return os_error(exc, what)
    if (found := _OS_ERROR_IN_TEXT.search(str(exc))) is None:
        return None
    return os_error(OSError(code := int(found.group(1)), os.strerror(code)), what)


# partial outputs: owned by a PID, found again after a hard kill


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused PID apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return start is None or (current := _proc_start(pid)) is None or current == start


def partial_prefix(target: Path) -> str:
    return f".{target.name}.partial-"


def backup_prefix(target: Path) -> str:
    return f".{target.name}.old-"


def make_partial(target: str | os.PathLike) -> Path:
    """Create the hidden sibling folder a build is written into, recording its owner."""
    target = Path(target)
    missing = [p for p in target.absolute().parents if not p.exists()]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=partial_prefix(target), dir=target.parent))
        owner = {
            "made_parents": [str(p) for p in missing],  # removed again if the build is discarded
            "pid": os.getpid(),
            "start": _proc_start(os.getpid()),
            "host": socket.gethostname(),
            "target": str(target),
            "created_unix": round(time.time(), 3),
        }
        (tmp / PARTIAL_OWNER).write_text(json.dumps(owner) + "\n")
    except OSError as exc:
        for parent in missing:
            with contextlib.suppress(OSError):
                os.rmdir(parent)
        raise os_error(exc, f"into {target.parent}") from exc
    return tmp


def _owner(folder: Path) -> dict | None:
    """The owner record of a partial build, or None when it is missing or unreadable."""
    try:
        return read_json_object(folder / PARTIAL_OWNER)
    except (OSError, ValueError):  # missing, or not a JSON object (UnreadableJSON)
        return None


def discard_partial(tmp: Path) -> None:
    """Remove a partial build and the (then empty) parent folders its run created."""
    made = (_owner(tmp) or {}).get("made_parents", [])
    shutil.rmtree(tmp, ignore_errors=True)
    for parent in made:  # deepest first
        with contextlib.suppress(OSError):
            os.rmdir(parent)  # only when empty


def _owner_alive(folder: Path) -> bool:
    owner = _owner(folder)
    if owner is None or not isinstance(owner.get("pid"), int):
        # no owner yet: a run that is creating it right now, or one that died at birth
        try:
            age = time.time() - folder.stat().st_mtime
        except OSError:
            return False
        return age < NO_OWNER_GRACE_S
    if owner.get("host") not in (None, socket.gethostname()):
        return True  # a shared filesystem: another machine's run may be alive; never touch it
    start = owner.get("start")
    return _alive(owner["pid"], start if isinstance(start, str) else None)


def clean_stale(target: str | os.PathLike, legacy_names: Iterable[str] = ()) -> list[str]:
    """Remove ``.DST.partial-*`` folders whose owning process is gone, and settle ``.DST.old-*``
    backups left by a run killed while swapping in a new build (restored when DST is missing,
    removed when DST is there). Returns what it did, as lines for the command's output: removed
    partials, then removed backups, then the restored one."""
    target = Path(target)
    legacy = tuple(legacy_names)
    removed: list[str] = []
    backups_removed: list[str] = []
    restored: list[str] = []
    try:
        entries = sorted(target.parent.iterdir())
    except OSError:  # no such folder (yet), or not a folder
        return []
    for entry in entries:
        if (
            entry.name.startswith(partial_prefix(target))
            and entry.is_dir()
            and not entry.is_symlink()
            and not _owner_alive(entry)
        ):
            shutil.rmtree(entry, ignore_errors=True)
            if not entry.exists():
                removed.append(f"removed stale partial output {entry} (left by an interrupted run)")
    backups = [
        e for e in entries if e.name.startswith(backup_prefix(target)) and e.is_dir() and not e.is_symlink()
    ]
    for entry in reversed(backups):  # newest first (the entries are sorted by name)
        if not is_owned(entry, legacy):
            continue
        if not target.exists():
            entry.rename(target)
            restored.append(f"restored {target} from {entry.name} (a run was killed while replacing it)")
        else:
            shutil.rmtree(entry, ignore_errors=True)
            if not entry.exists():
                backups_removed.append(
                    f"removed stale backup {entry} (left by a run interrupted while replacing its target)"
                )
    return removed + backups_removed + restored


@contextlib.contextmanager
def partial_build(target: Path, overwrite: bool, need_bytes: int, what: str, command: str,
                  **details: object) -> Iterator[Path]:
    """Build ``target`` in a partial sibling that the block fills (its free space checked first): when
    the block ends, it is marked as ``command``'s output, made readable to others and renamed into
    place; a failure or a stop signal removes it, and a file-system failure becomes a
    :class:`Gemma4T4Error` naming ``what``."""
    with signals.orderly_stop():
        tmp = make_partial(target)  # first: a read-only target fails here, naming it
        try:
            ensure_free_space(tmp, need_bytes, what)
            yield tmp
            write_marker(tmp, command, **details)
            tmp.chmod(0o755)  # mkdtemp makes it private; an output is meant to be shared
            (tmp / PARTIAL_OWNER).unlink()
            swap_into_place(tmp, target, overwrite)
        except BaseException as exc:
            discard_partial(tmp)
            plain = isinstance(exc, Exception) and not isinstance(exc, Gemma4T4Error)
            clear = write_error(exc, what) if plain else None
            if clear is not None:
                raise clear from exc
            raise


def swap_into_place(tmp: Path, target: Path, overwrite: bool) -> None:
    """Rename the finished ``tmp`` to ``target``; an existing target is moved aside first and
    removed after (a kill in between leaves a backup the next run restores or removes)."""
    if target.exists() and not overwrite:  # appeared while we worked (another run into the same DST)
        raise Gemma4T4Error(
            f"{target} appeared while this build was written", fix="choose a new DST or pass --overwrite"
        )
    if target.exists():
        backup = target.with_name(f"{backup_prefix(target)}{int(time.time())}-{os.getpid()}")
        target.rename(backup)
        tmp.rename(target)
        shutil.rmtree(backup, ignore_errors=True)
    else:
        tmp.rename(target)
