"""The offline sm_75 proof of the Turing fix, run once per installed vLLM kernel + Triton + fix.

``gemma4_t4.turing.verify`` compiles vLLM's attention kernel for sm_75 with the tile cap (about 2 s,
no GPU). The start gate needs it on a Turing GPU; the result is cached under a key of everything it
depends on, so a new vLLM, Triton, kernel file or tile cap each run it again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.atomic import atomic_write_json
from gemma4_t4.foundation.cache import cache_root
from gemma4_t4.foundation.versions import package_version
from gemma4_t4.turing import offline
from gemma4_t4.turing.verify import gemma4_attention_shapes, verify

PROOF_FORMAT = 1


@dataclass
class TuringProof:
    """Whether the tile cap makes every Gemma 4 launch fit ``arch``; ``proven`` is None when the
    proof could not run here (no vLLM, no Triton)."""

    proven: bool | None
    arch: str
    key: str | None
    cached: bool
    detail: str
    seconds: float | None = None


def cache_dir() -> Path:
    return cache_root()


def proof_key(arch: str, vllm_root: str | Path | None = None) -> tuple[str, dict[str, str]]:
    """(key, what it is made of): the kernel file's hash, vLLM's and Triton's versions, the fix's and
    the check's code, and the attention shapes it covers (a size or an assistant added to the catalog
    is a launch the old proof never compiled)."""
    root = offline.find_vllm_root(vllm_root)
    shapes = hashlib.sha256(repr(gemma4_attention_shapes()).encode())
    parts = {
        "arch": arch,
        "kernel_sha256": offline.sha256_file(root / offline.KERNEL_RELPATH),
        "vllm": offline.read_vllm_version(root),
        "triton": package_version("triton") or "missing",
        "fix_sha256": offline.turing_code_digest("smem.py", "tilecap.py", "verify.py"),
        "shapes_sha256": shapes.hexdigest(),
        "format": str(PROOF_FORMAT),
    }
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return key, parts


def turing_proof(
    arch: str = "sm_75",
    vllm_root: str | Path | None = None,
    cache: Path | None = None,
    verify: Callable[..., Any] = verify,  # gemma4_t4.turing.verify's: (arch, vllm_root=...) -> its report
) -> TuringProof:
    """The proof for the installed vLLM + Triton, from the cache or by running it (then cached)."""
    try:
        key, parts = proof_key(arch, vllm_root)
    except Gemma4T4Error as exc:
        return TuringProof(None, arch, None, False, f"no proof: {exc.message}")
    path = (cache or cache_dir()) / "turing-proof" / f"{arch}-{key[:24]}.json"
    try:
        stored = json.loads(path.read_text())
        if stored.get("key") == key and isinstance(stored.get("ok"), bool):
            return TuringProof(stored["ok"], arch, key, True, stored.get("detail", ""), stored.get("seconds"))
    except (OSError, ValueError, AttributeError):
        pass  # no proof yet, or an unreadable one: run it again
    if parts["triton"] == "missing":
        return TuringProof(None, arch, key, False, "no proof: Triton is not installed (pip install triton)")
    try:
        report = verify(arch, vllm_root=None if vllm_root is None else str(vllm_root))
    except Gemma4T4Error as exc:
        return TuringProof(None, arch, key, False, f"no proof: {exc.message}")
    if report.ok:
        detail = (
            f"proven offline: every Gemma 4 attention launch fits {report.limit_bytes:,} B on {report.arch} "
            f"(vLLM {report.vllm_version}, Triton {report.triton_version})"
        )
    else:
        detail = (
            f"offline proof FAILED on {report.arch}: tile cap {report.patch_action} ({report.patch_reason}); "
            f"{len(report.failures())} launch(es) over {report.limit_bytes:,} B"
        )
    proof = TuringProof(bool(report.ok), arch, key, False, detail, report.seconds)
    try:
        atomic_write_json(
            path,
            {"key": key, "parts": parts, "ok": proof.proven, "detail": detail, "seconds": report.seconds},
        )
    except OSError:
        pass  # a read-only home: the proof holds for this start, it is just not remembered
    return proof
