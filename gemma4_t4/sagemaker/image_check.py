"""Build-time check for the derived T4 SageMaker image (runs inside ``docker build``, no GPU).

The image is the AWS vLLM container plus this package, whose ``vllm.general_plugins`` entry
point installs the Turing attention fix in every vLLM process. The build fails unless:

1. the entry point is registered (so EngineCore and workers load it, not just the front end);
2. the installed vLLM is a version the fix supports and its kernel file has the structure the
   fix expects (read from disk: nothing is imported, no GPU needed);
3. torch was built with sm_75 kernels (a T4 would otherwise fail at the first launch).

``python -m gemma4_t4.sagemaker.image_check`` prints one line per check and exits 1 on failure.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from gemma4_t4.foundation.versions import package_dir
from gemma4_t4.turing import tilecap

KERNEL_FILE = Path("v1/attention/ops/triton_unified_attention.py")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def plugin_registered() -> Check:
    eps = [
        ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.value.startswith("gemma4_t4")
    ]
    if eps:
        return Check("plugin", True, ", ".join(f"{ep.name} = {ep.value}" for ep in eps))
    return Check(
        "plugin",
        False,
        "no gemma4_t4 entry point in vllm.general_plugins: reinstall this package "
        "with pip (not by copying files)",
    )


def kernel_supported() -> Check:
    version = tilecap.detect_vllm_version()
    problem = tilecap.version_problem(version)
    if problem:
        return Check("vllm", False, problem)
    root = package_dir("vllm")  # top-level lookup only: nothing is imported
    if root is None:
        return Check("vllm", False, "vLLM is not installed in this image")
    kernel = root / KERNEL_FILE
    if not kernel.exists():
        return Check("vllm", False, f"{kernel} is missing")
    problem = tilecap.structure_problem(kernel.read_text(encoding="utf-8"))
    if problem:
        return Check("vllm", False, problem)
    return Check("vllm", True, f"vLLM {version}: {kernel.name} has the structure the fix patches")


def torch_has_sm75() -> Check:
    try:
        import torch
    except ImportError:
        return Check("torch", False, "torch is not installed")
    flags = torch._C._cuda_getArchFlags() if hasattr(torch._C, "_cuda_getArchFlags") else ""
    if "sm_75" in (flags or ""):
        return Check("torch", True, f"torch {torch.__version__} carries sm_75 ({flags})")
    return Check(
        "torch", False, f"torch {torch.__version__} has no sm_75 kernels (arch flags: {flags or 'none'})"
    )


def main() -> int:
    checks = [plugin_registered(), kernel_supported(), torch_has_sm75()]
    for check in checks:
        print(f"[{'ok' if check.ok else 'FAIL'}] {check.name}: {check.detail}")
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
