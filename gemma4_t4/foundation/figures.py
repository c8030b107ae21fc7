"""Writing a matplotlib figure: the one backend rule and the one file rule for every plot the package
draws (benchmark plots, the prefill route's curves and verdicts). Foundation level, so the
benchmark and the Turing fix draw the same way without importing each other."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.table import in_notebook


def pyplot() -> Any:
    """``matplotlib.pyplot``, headless (Agg) unless a notebook kernel or MPLBACKEND chose a backend."""
    import matplotlib  # heavy: imported only when a plot is drawn

    if "MPLBACKEND" not in os.environ and "ipykernel" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


PLOT_EXTENSIONS = (".png", ".svg", ".pdf")


def check_plot_path(path: str | os.PathLike) -> Path:
    """A plot file name with an extension the plots are written as, else a clear error."""
    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_EXTENSIONS:
        raise Gemma4T4Error(
            f"cannot write a plot to {path}: {suffix or 'no extension'} is not a plot format",
            fix=f"name the file with one of {', '.join(PLOT_EXTENSIONS)}, e.g. --plot compare.png",
        )
    return Path(path)


def save_figure(fig: Any, path: str | os.PathLike) -> Path:
    check_plot_path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return Path(path)


def show_image(path: str | Path) -> None:
    """Show a PNG another function saved (e.g. the benchmark's plots) inline."""
    path = Path(path)
    if not path.exists():
        raise Gemma4T4Error(f"no plot at {path}", fix="run the step that makes it first")
    if in_notebook():
        from IPython.display import Image, display

        display(Image(filename=str(path)))
    else:
        print(f"plot: {path}")
