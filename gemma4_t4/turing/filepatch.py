"""The file-patch fallback: the tile cap written into vLLM's installed kernel file.

Where this package cannot be installed into vLLM's environment (an AWS vLLM container), ``apply``
appends to ``vllm/v1/attention/ops/triton_unified_attention.py`` one marked block embedding
``smem.py`` and ``tilecap.py`` that runs the plugin's ``install()`` at import (never both: the second
sees the first). The original is backed up first and its SHA-256 recorded in the marker; writes are
atomic; ``apply`` twice is a no-op; ``revert`` checks the backup against the checksum. An untested
vLLM or a changed kernel is refused, as by the plugin, and nothing is written.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.atomic import atomic_write_bytes
from gemma4_t4.turing import smem, tilecap
from gemma4_t4.turing.offline import KERNEL_RELPATH, find_vllm_root, read_vllm_version

PATCH_VERSION = 1
BEGIN = "# >>> gemma4-t4 turing tile cap >>>"
END = "# <<< gemma4-t4 turing tile cap <<<"
BACKUP_SUFFIX = ".gemma4_t4.orig"
_MARKER = re.compile(re.escape(BEGIN) + r" patch (\d+); original sha256 ([0-9a-f]{64})")


@dataclass
class FilePatchStatus:
    path: str
    exists: bool
    patched: bool
    patch_version: int | None
    stale: bool  # patched by another version of this package: revert, then apply
    vllm_version: str
    current_sha256: str | None
    original_sha256: str | None  # recorded in the marker when patched
    backup_path: str
    backup_exists: bool
    backup_matches: bool | None  # backup's checksum equals the recorded original (None: not patched)
    refusal: str | None  # why apply would refuse this file (None: it can be patched)


@dataclass
class FilePatchResult:
    action: str  # applied | already-applied | reverted
    path: str
    backup_path: str
    vllm_version: str
    original_sha256: str
    current_sha256: str
    message: str


def kernel_file(path: str | Path | None = None) -> Path:
    """The kernel file to patch: ``path`` if given, else the installed vLLM's."""
    return Path(path) if path is not None else find_vllm_root() / KERNEL_RELPATH


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + BACKUP_SUFFIX)


def _version_for(path: Path, vllm_version: str | None) -> str:
    parents = path.resolve().parents  # .../vllm/v1/attention/ops/triton_unified_attention.py: vllm is the 4th
    return vllm_version or (read_vllm_version(parents[3]) if len(parents) > 3 else "unknown")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def patch_block(original_sha256: str) -> str:
    """The text appended to vLLM's kernel file."""
    sources = (Path(smem.__file__).read_text(), Path(tilecap.__file__).read_text())
    return (
        f"\n\n{BEGIN} patch {PATCH_VERSION}; original sha256 {original_sha256}\n"
        "# Written by `gemma4-t4 turing apply`: caps the attention tile so every launch fits the GPU's\n"
        "# shared memory (T4 / sm_75). `gemma4-t4 turing revert` restores the original file from\n"
        f"# {KERNEL_RELPATH.name}{BACKUP_SUFFIX}. {tilecap.ENV_DISABLE}=0 turns it off at run time.\n"
        f"_GEMMA4_T4_TILE_CAP_SOURCES = {sources!r}\n\n\n"
        "def _gemma4_t4_install_tile_cap():\n"
        "    import sys\n\n"
        '    namespace = {"__name__": "gemma4_t4_turing_embedded"}\n'
        "    for source in _GEMMA4_T4_TILE_CAP_SOURCES:\n"
        '        exec(compile(source, "<gemma4-t4 tile cap>", "exec"), namespace)\n'
        '    namespace["install"](sys.modules[__name__], origin="file-patch")\n\n\n'
        "_gemma4_t4_install_tile_cap()\n"
        f"{END}\n"
    )


def file_patch_status(path: str | Path | None = None, vllm_version: str | None = None) -> FilePatchStatus:
    """Whether the kernel file is patched, its backup, and whether ``apply`` would refuse it."""
    target = kernel_file(path)
    backup = backup_path(target)
    version = _version_for(target, vllm_version)
    exists = target.is_file()
    data = target.read_bytes() if exists else b""
    text = data.decode("utf-8")
    match = _MARKER.search(text)
    original = match.group(2) if match else None
    patch_version = int(match.group(1)) if match else None
    if not exists:
        refusal = f"{target} does not exist"
    elif match:
        refusal = None
    else:
        problem = tilecap.version_problem(version) or tilecap.structure_problem(text)
        refusal = f"vLLM {version}: {problem}" if problem else None
    return FilePatchStatus(
        path=str(target), exists=exists, patched=match is not None, patch_version=patch_version,
        stale=match is not None and (patch_version != PATCH_VERSION or patch_block(original).strip("\n") not in text),
        vllm_version=version, current_sha256=_sha256(data) if exists else None, original_sha256=original,
        backup_path=str(backup), backup_exists=backup.is_file(),
        backup_matches=None if match is None else backup.is_file() and _sha256(backup.read_bytes()) == original,
        refusal=refusal,
    )


def _permission_error(path: Path, exc: OSError) -> Gemma4T4Error:
    return Gemma4T4Error(
        f"cannot write {path}: {exc.strerror}",
        fix="run it where vLLM's files are writable (as root in the image's Dockerfile, or with sudo)",
    )


def apply_file_patch(path: str | Path | None = None, vllm_version: str | None = None) -> FilePatchResult:
    """Patch vLLM's kernel file (backup first). A second call is a no-op."""
    status = file_patch_status(path, vllm_version)
    target = Path(status.path)
    if not status.exists:
        raise Gemma4T4Error(f"{target} does not exist", fix="pass --path to vLLM's triton_unified_attention.py")
    if status.patched:
        if status.stale:
            raise Gemma4T4Error(
                f"{target} carries a different version of the tile-cap patch",
                fix="gemma4-t4 turing revert, then gemma4-t4 turing apply",
            )
        return FilePatchResult("already-applied", str(target), status.backup_path, status.vllm_version,
                               status.original_sha256 or "", status.current_sha256 or "",
                               "already patched: nothing changed")
    if status.refusal:
        raise Gemma4T4Error(
            f"refusing to patch {target}: {status.refusal}; nothing was changed",
            fix=f"use a tested vLLM ({', '.join(s + '.x' for s in tilecap.TESTED_VLLM_SERIES)}), or set "
            f"{tilecap.ENV_ALLOW_UNTESTED}=1 after "
            "`gemma4-t4 turing verify` passes on this version",
        )
    original = target.read_bytes()
    original_sha = _sha256(original)
    text = original.decode("utf-8")
    patched_text = text + ("" if text.endswith("\n") else "\n") + patch_block(original_sha).lstrip("\n")
    compile(patched_text, str(target), "exec")  # never write a file that would not import
    backup = Path(status.backup_path)
    try:
        atomic_write_bytes(backup, original, mode_from=target)
        atomic_write_bytes(target, patched_text.encode("utf-8"), mode_from=target)
    except PermissionError as exc:
        raise _permission_error(target, exc) from exc
    return FilePatchResult("applied", str(target), str(backup), status.vllm_version, original_sha,
                           _sha256(patched_text.encode("utf-8")), f"patched; original saved to {backup}")


def revert_file_patch(path: str | Path | None = None) -> FilePatchResult:
    """Restore the original kernel file from the backup, checked against the recorded checksum."""
    status = file_patch_status(path)
    target = Path(status.path)
    reinstall = f"pip install --force-reinstall --no-deps 'vllm=={status.vllm_version}'"
    if not status.patched:
        raise Gemma4T4Error(
            f"{target} is not patched: nothing to revert"
            + (f" (a leftover backup is at {status.backup_path})" if status.backup_exists else ""),
            fix="nothing to do; `gemma4-t4 turing status` shows the file's state",
        )
    if not status.backup_exists:
        raise Gemma4T4Error(f"{target} is patched but its backup {status.backup_path} is missing",
                            fix=f"reinstall vLLM's original file: {reinstall}")
    if not status.backup_matches:
        raise Gemma4T4Error(
            f"the backup {status.backup_path} does not match the original's recorded checksum "
            f"{status.original_sha256}; not restoring it",
            fix=f"reinstall vLLM's original file: {reinstall}",
        )
    backup = Path(status.backup_path)
    original = backup.read_bytes()
    try:
        atomic_write_bytes(target, original, mode_from=target)
        backup.unlink()
    except PermissionError as exc:
        raise _permission_error(target, exc) from exc
    # the bytes written are the backup's, which matched the recorded checksum above
    return FilePatchResult("reverted", str(target), str(backup), status.vllm_version, status.original_sha256,
                           status.original_sha256, "original file restored (checksum verified)")
