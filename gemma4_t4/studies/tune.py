"""``gemma4-t4 tune``: one cached launch profile per GPU, model and versions, measured on the user's GPU.

A tune launches the model once per drafter setting (off, then Google's assistant drafting N = 1..6
tokens), measures decode at 1 and 8 streams, takes the prefill route's bench-prefill verdict, and
writes ONE profile keyed by GPU name, model, vLLM, torch and the fix's version, which
``serve start --target t4`` reads. It is written atomically at the end: an interrupted tune leaves
no profile, and the server it was measuring is stopped by the server context's exit.
"""

from __future__ import annotations

import datetime
import itertools
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, Field

from gemma4_t4.bench import run_benchmark
from gemma4_t4.bench.specs import DecodeSpec
from gemma4_t4.bench.workloads import BenchArgs
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.atomic import atomic_write_json
from gemma4_t4.foundation.table import format_table
from gemma4_t4.serving.launch_profile import (
    CONCURRENCIES,
    DRAFT_TOKENS,
    CellMeasure,
    DraftChoice,
    DraftSetting,
    LaunchProfile,
    PrefillChoice,
    ProfileKey,
    prefill_choice,
    profile_path,
)
from gemma4_t4.serving.server import ServerConfig, start_server
from gemma4_t4.serving.speculative import DEFAULT_NUM_DRAFT_TOKENS

if TYPE_CHECKING:
    from gemma4_t4.bench.results import BenchRun

INPUT_LEN = 256
OUTPUT_LEN = 128
PROMPTS_PER_STREAM = 4  # measured requests per stream: c=1 -> 4, c=8 -> 32
# for the plan's time estimate only (T4, E2B QAT: ~100 tok/s at one stream, t4_speed_anchors.md);
# the profile stores what was measured, never these
LAUNCH_ESTIMATE_S = 120.0
ASSUMED_STREAM_TOK_S = {1: 90.0, 8: 45.0}
DEFAULT_MINUTES = 20.0


class PlanCell(BaseModel):
    """One measurement of the plan: a drafter setting at a concurrency on the decode workload."""

    draft: DraftSetting
    num_draft_tokens: int | None = Field(None, description="None with the drafter off")
    concurrency: int
    workload: str = "decode"
    input_len: int = INPUT_LEN
    output_len: int = OUTPUT_LEN
    num_prompts: int
    estimated_s: float = Field(description="measuring time, the server's launch not included")

    @property
    def setting(self) -> str:
        return "off" if self.draft == "off" else f"N={self.num_draft_tokens}"


class TunePlan(BaseModel):
    key: ProfileKey
    cells: list[PlanCell]
    launches: int
    launch_estimate_s: float
    drafter: str = Field(description="the drafter the 'on' cells use, or why there is none")
    prefill: str = Field(description="what happens for the prefill route")

    @property
    def estimated_s(self) -> float:
        return self.launches * self.launch_estimate_s + sum(c.estimated_s for c in self.cells)


class RunningServer(Protocol):
    @property
    def base_url(self) -> str: ...


ServerFactory = Callable[["ServerConfig"], AbstractContextManager[RunningServer]]
BenchRunner = Callable[["BenchArgs"], "BenchRun"]
PrefillSource = Callable[[ProfileKey, Path], PrefillChoice]


def drafter_for(model: str) -> tuple[bool, str]:
    """(a drafter exists for ``model`` on a T4, what it is or why not), as the launch resolves ``auto``."""
    try:
        plan = ServerConfig(model=model, target="t4", draft="auto").draft_plan()
    except Gemma4T4Error as exc:
        return False, exc.message
    return plan.enabled, plan.reason


def plan(
    model: str, key: ProfileKey, minutes: float = DEFAULT_MINUTES
) -> TunePlan:
    """The measurements a tune makes, each with its estimated time; refuses a plan over ``minutes``."""
    enabled, drafter = drafter_for(model)
    # without a drafter there is nothing to compare: no launch, no cell
    settings: list[tuple[DraftSetting, int | None]] = (
        [("off", None), *(("auto", n) for n in DRAFT_TOKENS)] if enabled else []
    )
    cells = [
        PlanCell(draft=draft, num_draft_tokens=num, concurrency=c, num_prompts=PROMPTS_PER_STREAM * c,
                 estimated_s=round(PROMPTS_PER_STREAM * OUTPUT_LEN / ASSUMED_STREAM_TOK_S[c] + 2.0, 1))
        for draft, num in settings for c in CONCURRENCIES
    ]
    the_plan = TunePlan(
        key=key,
        cells=cells,
        launches=len(settings),
        launch_estimate_s=LAUNCH_ESTIMATE_S,
        drafter=drafter if enabled else f"no drafter, decode is not measured: {drafter}",
        prefill="bench-prefill's cached verdict for this GPU and versions (measured now if absent)",
    )
    need = int(the_plan.estimated_s // 60) + 1  # whole minutes, rounded up
    if not math.isfinite(minutes) or minutes <= 0:
        raise Gemma4T4Error(f"--minutes {minutes!r} must be a positive number of minutes",
                            fix=f"pass --minutes {need} (the plan's estimate)")
    if the_plan.estimated_s > minutes * 60:
        raise Gemma4T4Error(
            f"the tune plan needs about {need} minutes, more than --minutes {minutes:g}",
            fix=f"pass --minutes {need} (or more)",
        )
    return the_plan


def plan_text(the_plan: TunePlan) -> str:
    rows = [
        [c.draft, c.num_draft_tokens or "-", c.concurrency, c.workload, f"{c.input_len}/{c.output_len}",
         c.num_prompts, c.estimated_s]
        for c in the_plan.cells
    ]
    key = the_plan.key
    lines = [
        f"tune plan for {key.model} on {key.gpu} (vLLM {key.vllm}, torch {key.torch}, fix {key.fix}); nothing started",
        f"drafter: {the_plan.drafter}",
    ]
    if rows:
        headers = ["drafter", "N", "concurrency", "workload", "in/out tokens", "prompts", "est. s"]
        lines.append(format_table(headers, rows))
    lines += [
        f"{the_plan.launches} server launches x ~{the_plan.launch_estimate_s:.0f} s each",
        f"prefill route: {the_plan.prefill}",
        f"estimated total: ~{the_plan.estimated_s / 60:.1f} minutes",
    ]
    return "\n".join(lines)


def _measure(cell: PlanCell, run: BenchRun) -> CellMeasure:
    summary = next((c for c in run.cells if c.concurrency == cell.concurrency), None)
    stats = summary.per_stream_tok_s if summary else None
    if summary is not None and summary.buffered is not None:  # no per-stream rate exists to compare
        raise Gemma4T4Error(
            f"the benchmark of drafter {cell.setting} at {cell.concurrency} streams gives no decode speed: "
            f"{summary.buffered.reason}",
            fix="tune on a server that streams its tokens (a GPU server does; vLLM's CPU build may flush)",
        )
    if summary is None or stats is None or None in (stats.median, stats.ci_low, stats.ci_high):
        raise Gemma4T4Error(
            f"the benchmark of drafter {cell.setting} at {cell.concurrency} streams measured no decode speed",
            fix="look at the server log under --work-dir, then run gemma4-t4 tune again",
        )
    spec = summary.spec_decode
    return CellMeasure(
        draft=cell.draft, num_draft_tokens=cell.num_draft_tokens, concurrency=cell.concurrency,
        per_stream_tok_s=stats.median, ci_low=stats.ci_low, ci_high=stats.ci_high,
        output_tok_s=summary.output_throughput_tok_s, acceptance_rate=spec.acceptance_rate if spec else None,
        mean_accepted_length=spec.mean_accepted_length if spec else None,
    )


def decide(cells: list[CellMeasure], concurrency: int) -> DraftChoice:
    """The fastest drafter setting at ``concurrency``, but only when it beats off beyond noise: the
    ratio's conservative 95 % interval (its low end = on's low / off's high) lies above 1. ``cells``: a
    tune's measurements, which hold off and every drafter setting at each concurrency (a cell that
    measured nothing stopped the tune)."""
    mine = [c for c in cells if c.concurrency == concurrency]
    off = next(c for c in mine if c.draft == "off")
    best = max((c for c in mine if c.draft != "off"), key=lambda c: c.per_stream_tok_s)
    ratio = best.per_stream_tok_s / off.per_stream_tok_s
    low, high = best.ci_low / off.ci_high, best.ci_high / off.ci_low
    bounds = {"speedup_ci_low": round(low, 3), "speedup_ci_high": round(high, 3)}
    if low > 1.0:
        return DraftChoice(concurrency=concurrency, draft="auto", num_draft_tokens=best.num_draft_tokens,
                           speedup=round(ratio, 3), **bounds,
                           why=f"drafter N={best.num_draft_tokens}, {ratio:.2f}x at c={concurrency} "
                               f"(95 % {low:.2f}-{high:.2f}x)")
    why = (f"off at c={concurrency}: the best drafter (N={best.num_draft_tokens}, {ratio:.2f}x, "
           f"95 % {low:.2f}-{high:.2f}x) is not beyond noise")
    return DraftChoice(concurrency=concurrency, draft="off", speedup=1.0, **bounds, why=why)


def launch_server(config: ServerConfig) -> AbstractContextManager[RunningServer]:
    """The package's own launch (start gate included); leaving the block stops the server."""
    return start_server(config, timeout=1800.0)


def measured_prefill(key: ProfileKey, work_dir: Path) -> PrefillChoice:
    """bench-prefill's cached verdict for this GPU and versions; measured (and cached) when absent."""
    # lazy: `gemma4-t4 --help` loads this module (cli/tune reads DEFAULT_MINUTES); the prefill route
    # and its benchmark (Triton kernels, plots) load only when a profile is measured
    from gemma4_t4.turing import prefill
    from gemma4_t4.turing.prefill_bench import bench_prefill, require_cuda

    require_cuda()
    device_key = prefill.device_key()
    if prefill.load_verdict(device_key) is None:
        bench_prefill(out_dir=work_dir / "bench_prefill", save_verdict=True)
    return prefill_choice(prefill.verdict_path(device_key))


def tune(
    model: str,
    key: ProfileKey,
    work_dir: str | Path = ".cache/gemma4_t4",
    minutes: float = DEFAULT_MINUTES,
    server_factory: ServerFactory = launch_server,
    bench_runner: BenchRunner = run_benchmark,
    prefill_source: PrefillSource = measured_prefill,
    today: Callable[[], datetime.date] = datetime.date.today,
) -> tuple[LaunchProfile, Path]:
    """Measure the plan on this GPU and write the profile (atomically, at the end). Returns it and its path."""
    the_plan = plan(model, key, minutes)
    work = Path(work_dir)
    measures: list[CellMeasure] = []
    # one launch per drafter setting: the plan lists each setting's cells together
    for (draft, num), cells in itertools.groupby(the_plan.cells, key=lambda c: (c.draft, c.num_draft_tokens)):
        config = ServerConfig(
            model=model, target="t4", draft=draft, num_draft_tokens=num or DEFAULT_NUM_DRAFT_TOKENS,
            work_dir=str(work),
        )
        with server_factory(config) as server:
            for cell in cells:
                decode = DecodeSpec(concurrency=[cell.concurrency], input_len=cell.input_len,
                                    output_len=cell.output_len, num_prompts=cell.num_prompts,
                                    warmup=cell.concurrency)
                args = BenchArgs(base_url=server.base_url, model=config.resolved_name(), spec=decode,
                                 out_dir=str(work / "tune" / f"{cell.setting}-c{cell.concurrency}"),
                                 progress=False, overwrite=True)
                measures.append(_measure(cell, bench_runner(args)))
    prefill = prefill_source(key, work)
    choices = [decide(measures, c) for c in CONCURRENCIES] if measures else []
    profile = LaunchProfile(key=key, measured_on=today().isoformat(), cells=measures, choices=choices,
                            prefill=prefill, drafter=the_plan.drafter)
    path = profile_path(key)
    atomic_write_json(path, profile.model_dump(mode="json"))
    return profile, path
