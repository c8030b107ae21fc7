"""Where the package keeps what it measured on this machine: the CPU attention probe's verdict,
the offline sm_75 proof, the prefill route's bench-prefill verdicts.

One root for all of them: ``$GEMMA4_T4_CACHE_DIR``, else ``$XDG_CACHE_HOME/gemma4_t4``, else
``~/.cache/gemma4_t4``; each kind of verdict has its own subfolder.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "GEMMA4_T4_CACHE_DIR"


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gemma4_t4"
