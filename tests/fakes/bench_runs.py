"""Writing a loaded run's files again (a copy to edit, or the same folder after editing the model)."""

from __future__ import annotations

import os
from pathlib import Path

from gemma4_t4.bench.results import RUN_FILE, BenchRun, write_summary
from gemma4_t4.foundation.atomic import atomic_write_json


def save_run(run: BenchRun, out_dir: str | os.PathLike | None = None) -> Path:
    """Write run.json, summary.json and summary.csv of ``run`` (its records stay where they are)."""
    path = Path(out_dir) if out_dir is not None else run.dir
    path.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path / RUN_FILE, run.run.to_json())
    write_summary(path, run.run, run.cells)
    return path
