"""Matplotlib PNGs for a results directory: tok/s vs concurrency, TTFT vs input length, prefix
cache on/off, roofline, and A/B bars with ratios. Headless (Agg) unless a notebook set a backend."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from gemma4_t4.bench.compare import RunComparison, compare_runs
from gemma4_t4.bench.published import QatVsBf16
from gemma4_t4.bench.results import PLOT_FILES, BenchRun, DecodeSpeed, load_run
from gemma4_t4.foundation.figures import check_plot_path, pyplot, save_figure


def _title(run: BenchRun, what: str) -> str:
    label = run.run.label or run.run.model or ""
    title = f"{what} — {label}" if label else what
    if run.not_measured:  # a plot of a run that did not complete says so on its face
        title += f"\nNOT MEASURED: run {run.status}"
    return title


def _note(ax: Any, text: str, xy: tuple[Any, Any], dy: int = 8, **style: str) -> None:
    ax.annotate(text, xy, textcoords="offset points", xytext=(0, dy), ha="center", fontsize=8, **style)


def _throughput(run: BenchRun, ax: Any) -> bool:
    cells = sorted(
        (c for c in run.cells if c.workload == "decode" and c.completed and c.concurrency is not None),
        key=lambda c: c.concurrency,
    )
    if not cells:
        return False
    xs = [c.concurrency for c in cells]
    ax.plot(xs, [c.output_throughput_tok_s for c in cells], "o-", label="system output tok/s")
    buffered = next((c.buffered for c in cells if c.buffered), None)
    if buffered is None:
        ax.plot(xs, [c.per_stream_tok_s.median for c in cells], "s--", label="per-stream tok/s (median)")
    else:  # answers came in one flush: there is no per-stream speed to draw, and the plot says why
        ax.text(
            0.02, 0.02, f"per-stream tok/s {buffered.reason}", transform=ax.transAxes, fontsize=7, wrap=True
        )
    for c in cells:
        if c.queueing:
            _note(ax, "queueing", (c.concurrency, c.output_throughput_tok_s or 0), color="tab:red")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set(
        xlabel="concurrent requests",
        ylabel="tokens / s",
        title=_title(run, f"Decode: in {cells[0].input_len} / out {cells[0].output_len}"),
    )
    ax.grid(alpha=0.3)
    ax.legend()
    return True


def _ttft(run: BenchRun, ax: Any) -> bool:
    # a cell whose replies were all empty text has no TTFT (tiny random models do that): not plotted
    cells = sorted(
        (c for c in run.cells if c.workload == "ttft" and c.completed and c.ttft_ms.median is not None),
        key=lambda c: (c.concurrency or 0, c.input_len or 0),
    )
    if not cells:
        return False
    for conc, same_conc in itertools.groupby(cells, lambda c: c.concurrency or 0):  # cells are in that order
        group = list(same_conc)
        xs = [c.input_len for c in group]
        med = [c.ttft_ms.median or 0.0 for c in group]  # not None: the cells were chosen for it
        low = [m - (c.ttft_ms.ci_low or m) for m, c in zip(med, group, strict=True)]
        high = [(c.ttft_ms.ci_high or m) - m for m, c in zip(med, group, strict=True)]
        ax.errorbar(xs, med, yerr=[low, high], fmt="o-", capsize=3, label=f"median TTFT, c={conc} (95 % CI)")
        ax.plot(xs, [c.ttft_ms.p90 for c in group], "x:", alpha=0.6, label=f"p90, c={conc}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(
        xlabel="input length (tokens)",
        ylabel="time to first token (ms)",
        title=_title(run, "TTFT vs input length (unique prompts)"),
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return True


def _prefix(run: BenchRun, ax: Any) -> bool:
    cells = [c for c in run.cells if c.workload == "prefix" and c.completed]
    if not cells:
        return False
    labels, values, colors = [], [], []
    for c in sorted(cells, key=lambda c: (c.concurrency or 0, c.variant or "")):
        hit = c.prefix_cache.hit_rate
        hits = f"\nhits {hit * 100:.0f} %" if hit is not None else ""
        labels.append(f"c={c.concurrency}\n{c.variant}{hits}")
        values.append(c.ttft_ms.median or 0)
        colors.append("tab:green" if c.variant == "shared_prefix" else "tab:gray")
    ax.bar(range(len(values)), values, color=colors)
    ax.set_xticks(range(len(values)), labels, fontsize=8)
    ax.set(ylabel="median TTFT (ms)", title=_title(run, "Prefix cache: shared prefixes vs unique prompts"))
    ax.grid(alpha=0.3, axis="y")
    return True


def _roofline(run: BenchRun, ax: Any) -> bool:
    # a cell with no per-stream speed (answers that came in one flush) has nothing to place under the roof
    cells = [
        c for c in run.cells if c.derived.roofline and c.derived.roofline.per_stream_tok_s and not c.buffered
    ]
    if not cells:
        return False
    roofs = [c.derived.roofline for c in cells]
    roof = roofs[0]
    xs = list(range(len(cells)))
    ax.bar(xs, [r.per_stream_tok_s or 0 for r in roofs], label="measured per stream")
    ax.axhline(
        roof.ceiling_tok_s,
        color="tab:red",
        ls="--",
        label=f"ceiling {roof.ceiling_tok_s:.0f} tok/s ({roof.bandwidth_gb_s:.0f} GB/s ÷ "
        f"{roof.bytes_per_token / 1e9:.3f} GB/token)",
    )
    for x, r in zip(xs, roofs, strict=True):
        if r.efficiency is not None:
            _note(ax, f"{r.efficiency * 100:.0f} %", (x, r.per_stream_tok_s), dy=4)
    ax.set_xticks(
        xs,
        [
            f"c={c.concurrency}"
            if c.concurrency is not None
            else f"{c.open_loop.offered_rate_rps if c.open_loop else None:g}/s"
            for c in cells
        ],
    )
    ax.set(ylabel="decode tokens / s per stream", title=_title(run, f"Roofline on {roof.gpu}"))
    ax.legend(fontsize=8)
    return True


def _rate(run: BenchRun, ax: Any) -> bool:
    """Open-loop cells: TTFT (median, p90) and delivered output tok/s against the offered request rate."""
    cells = sorted(
        (c for c in run.cells if c.open_loop and c.completed), key=lambda c: c.open_loop.offered_rate_rps
    )
    if not cells:
        return False
    xs = [c.open_loop.offered_rate_rps for c in cells]
    ax.plot(xs, [c.ttft_ms.median for c in cells], "o-", label="TTFT median")
    ax.plot(xs, [c.ttft_ms.p90 for c in cells], "s--", label="TTFT p90")
    ax.set(xlabel=f"offered load (requests / s, {cells[0].open_loop.arrival} arrivals)", ylabel="TTFT (ms)")
    ax.grid(alpha=0.3)
    right = ax.twinx()
    tok_s = [c.output_throughput_tok_s for c in cells]
    right.plot(xs, tok_s, "^:", color="tab:green", label="output tok/s (right)")
    right.set_ylabel("output tokens / s")
    for c, x in zip(cells, xs, strict=True):
        if c.open_loop.cap_reached:
            _note(ax, "in-flight cap", (x, c.ttft_ms.median or 0), color="tab:red")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    ax.set_title(_title(run, f"Open loop: in {cells[0].input_len} / out {cells[0].output_len}"))
    return True


def plot_run(out_dir: str | os.PathLike | BenchRun) -> list[Path]:
    """Every plot that the run's cells support, written next to its results. Each drawing function
    draws on the axes it is given, or says False when the run has no cell it draws."""
    run = load_run(out_dir)
    made = []
    drawings = (_throughput, _rate, _ttft, _prefix, _roofline)  # in PLOT_FILES' order
    for draw, name in zip(drawings, PLOT_FILES, strict=True):
        fig, ax = pyplot().subplots(figsize=(7, 4.2))  # every run plot's size
        if draw(run, ax):
            made.append(save_figure(fig, run.dir / name))
        else:
            pyplot().close(fig)
    return made


def plot_compare(
    a: str | os.PathLike | BenchRun,
    b: str | os.PathLike | BenchRun,
    path: str | os.PathLike,
    metric: str = "per_stream_tok_s",
    comparison: RunComparison | None = None,
) -> Path | None:
    """A/B bars of one metric's median per matched cell, labelled with B/A and its interval
    (``None`` where nothing was compared: no matched cell, or a run that did not complete)."""
    check_plot_path(path)
    cmp_ = comparison or compare_runs(a, b)  # a run that did not complete: no cells compared
    rows = [(cell, next(r for r in cell.ratios if r.metric == metric)) for cell in cmp_.cells]
    rows = [(c, r) for c, r in rows if r.a is not None and r.b is not None]
    if not rows:
        return None
    fig, ax = pyplot().subplots(figsize=(max(6, 1.6 * len(rows)), 4.2))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r.a for _, r in rows], width=0.4, label="A")
    ax.bar([x + 0.2 for x in xs], [r.b for _, r in rows], width=0.4, label="B")
    for x, (_, r) in enumerate(rows):
        text = f"{r.ratio:.2f}x" if r.ratio else ""
        if r.ci_low is not None:
            text += f"\n[{r.ci_low:.2f}, {r.ci_high:.2f}]"
        _note(ax, text, (x, max(r.a, r.b)), dy=4)
    ax.set_xticks(list(xs), [c.cell_a[:28] for c, _ in rows], rotation=20, ha="right", fontsize=8)
    ax.set(ylabel=metric, title=f"A/B {metric} (median): B/A with 95 % interval")
    ax.margins(y=0.2)
    ax.legend()
    return save_figure(fig, path)


def _curve(ax: Any, points: dict[Any, Any], style: str, **options: Any) -> None:
    """One line through ``points`` (x: y, in the dict's order)."""
    ax.plot(list(points), list(points.values()), style, **options)


def plot_qat_vs_bf16(
    figures: QatVsBf16,
    ceilings: dict[str, float],
    published: dict[str, float],
    gpu: str,
    model: str,
    venue: str,
) -> Any:
    """Part 2's figure (returned, not saved: the notebook shows and saves it): the measured decode
    curves per build on the left; on the right each build's decode ceiling on ``gpu`` with the
    series' published T4 per-stream figure on it."""
    what, curves = figures.decode_curves()
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(11, 4))
    for label, curve in curves.items():
        measured = {c: v for c, v in sorted(curve.items()) if v is not None}
        _curve(left, measured, "o-", label=f"{label} (measured, {venue})")
    left.set(xlabel="concurrent streams", ylabel="tok/s", title=f"Decode speed: {what}")
    left.grid(alpha=0.3)
    left.legend()
    right.bar(
        list(ceilings), list(ceilings.values()), color="#bbb", label=f"{gpu.upper()} ceiling (spec bandwidth)"
    )
    shown = [f for f in ceilings if f in published]
    right.scatter(shown, [published[f] for f in shown], color="C3", zorder=3, label="published GCE T4, c=1")
    for f, ceiling in ceilings.items():
        _note(right, f"{ceiling:.0f}", (f, ceiling), dy=3)
    right.set(ylabel="tok/s per stream", title=f"{model} on {gpu.upper()}: ceiling vs published T4")
    right.margins(y=0.15)
    right.legend()
    return fig


def plot_t4_part(
    speed: DecodeSpeed,
    ttft_ms: dict[int, float | None],
    published_ttft: dict[int, float],
    fits: list[Any],
    gpu: str,
    venue: str,
) -> Any:
    """Part 4's figure (returned, not saved): decode per stream and all streams, TTFT against the
    published curve of the same build, and what fits one GPU (weights against its budget)."""
    fig, (dec, ttft, fit) = pyplot().subplots(1, 3, figsize=(15, 4))
    # no per-stream speed (answers that came in one flush): an empty line whose legend says so
    per_stream = speed.per_stream or {}
    why = " (answers came in one flush)" if speed.not_measured else ""
    label = "per stream" if per_stream else f"per stream: not measured{why}"
    _curve(dec, per_stream, "o-", label=label)
    _curve(dec, speed.output_tok_s, "s-", label="all streams")
    dec.set(xlabel="concurrent streams", ylabel="output tok/s", title=f"Decode ({venue}, measured)")
    dec.legend(fontsize=8, loc="upper left")
    _curve(ttft, ttft_ms, "o-", label=f"measured ({venue})")
    _curve(ttft, published_ttft, "x--", color="C3", label="published GCE T4, E2B QAT")
    ttft.set(
        xlabel="input tokens",
        ylabel="median TTFT ms",
        xscale="log",
        yscale="log",
        title="TTFT vs prompt length",
    )
    ttft.legend(fontsize=8)
    fit.barh(
        [f.model for f in fits], [f.weights_gib for f in fits], color=["C2" if f.fits else "C3" for f in fits]
    )
    fit.axvline(fits[0].budget_gib, color="k", linestyle="--", label=f"{gpu} budget (0.9 x usable)")
    fit.set(xlabel="weights GiB (int4)", title=f"What fits one {gpu} (green: fits at 8k)")
    fit.legend(loc="lower right")
    return fig
