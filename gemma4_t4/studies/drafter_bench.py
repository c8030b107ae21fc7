"""Speculative decoding off vs on for one model, measured here (notebook 4's drafter step).

Starts the same server without and with a drafter (so it sits above serving and bench), runs
single-stream decode and the fixed-answer questions against each, and returns both sides with vLLM's
acceptance and the greedy answers compared n/N. A side whose runs did not complete is "not measured".
A server already running the same launch without a drafter (the notebook's own) is measured as the
drafter-off side instead of a fresh launch: one model load fewer (minutes on a T4).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from gemma4_t4.bench import run_benchmark
from gemma4_t4.bench.answers import AnswerComparison, compare_answers
from gemma4_t4.bench.results import BenchRun
from gemma4_t4.foundation import signals
from gemma4_t4.foundation.table import Displayable
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.serving.server_state import free_port

if TYPE_CHECKING:
    from gemma4_t4.venues.endpoint import Endpoint


class DrafterSide(BaseModel):
    """One launch (drafter off or on): its single-stream decode figures and vLLM's acceptance."""

    label: str
    draft: str
    tok_s: float | None = None  # output tokens / s at c=1, end to end (robust to tokens streamed in bursts)
    # median inter-token time as streamed, c=1; "not measured: ..." where the answers came in one flush
    tpot_ms: float | str | None = None
    acceptance_rate: float | None = None  # accepted / draft tokens (None: no drafter or no counters)
    mean_accepted_length: float | None = None  # tokens per verification step, bonus token included
    not_measured: str | None = None  # why this side is not a result
    decode: Any = None  # the BenchRun of the decode cell
    answers: Any = None  # the BenchRun of the answers workload


class DrafterComparison(Displayable, BaseModel):
    """Drafter off vs on: speed-up in single-stream tok/s, acceptance, identical answers."""

    off: DrafterSide
    on: DrafterSide
    answers: Any  # AnswerComparison

    @property
    def speedup(self) -> float | None:
        """tok/s on / off at one stream, end to end (not streamed TPOT, which a server sending several
        tokens per chunk, as a CPU build does, makes near zero without being faster)."""
        if self.off.not_measured or self.on.not_measured or not self.off.tok_s or not self.on.tok_s:
            return None
        return self.on.tok_s / self.off.tok_s

    def table_rows(self) -> list[dict[str, str]]:
        def fmt(value: float | str | None, spec: str) -> str:
            return "-" if value is None else value if isinstance(value, str) else format(value, spec)

        return [
            {
                "drafter": side.label,
                "tok/s (c=1)": f"not measured: {side.not_measured}" if side.not_measured else fmt(side.tok_s, ".1f"),
                "streamed TPOT ms": fmt(side.tpot_ms, ".2f"),
                "acceptance": fmt(side.acceptance_rate, ".3f"),
                "mean accepted length": fmt(side.mean_accepted_length, ".2f"),
            }
            for side in (self.off, self.on)
        ]

    def caption(self) -> str:
        return f"speculative decoding, 1 stream: drafter off vs on; {self.line()}"

    def line(self) -> str:
        speedup = self.speedup
        figure = "not measured" if speedup is None else f"{speedup:.2f}x single-stream tok/s"
        return f"drafter on vs off: {figure}; identical answers {self.answers.line()}"


def _side(label: str, draft: str, decode: BenchRun, answers: BenchRun) -> DrafterSide:
    side = DrafterSide(label=label, draft=draft, decode=decode, answers=answers)
    reasons = [run.not_measured for run in (decode, answers) if run.not_measured]
    if reasons:
        side.not_measured = "; ".join(reasons)
        return side
    cell = decode.cells[0]
    side.tok_s = cell.output_throughput_tok_s
    side.tpot_ms = cell.decode_median(cell.tpot_ms)
    if cell.spec_decode is not None:
        side.acceptance_rate = cell.spec_decode.acceptance_rate
        side.mean_accepted_length = cell.spec_decode.mean_accepted_length
    return side


def _measure(url: str, served: str, out: Path, label: str, tokenizer: str | None,
             **workload: int) -> tuple[BenchRun, BenchRun]:
    """One side's single-stream decode and fixed answers."""
    decode = run_benchmark(url, served, "decode", out / f"decode-{label}", concurrency=[1], warmup=1,
                           tokenizer=tokenizer, overwrite=True, progress=False, **workload)
    answers = run_benchmark(url, served, "answers", out / f"answers-{label}", overwrite=True, progress=False)
    return decode, answers


def drafter_on_off(
    config: ServerConfig,
    draft: str,
    out_dir: str | Path,
    *,
    start: Callable[[ServerConfig], Any],
    input_len: int = 128,
    output_len: int = 64,
    num_prompts: int = 8,
    tokenizer: str | None = None,
    running: Endpoint | None = None,
) -> DrafterComparison:
    """Decode at c=1 and the fixed answers with ``draft`` off, then on (``config``'s other settings
    kept; a free port for each). ``start`` launches and waits (the notebook passes its owned start, so
    a killed kernel's server is stopped by its supervisor). ``running``, a server already up with
    ``config`` when that launch has no drafter, is measured as the off side instead of a new launch,
    and stopped before the drafter's side starts (which then has the GPU to itself). Every server is
    stopped before this returns, also on Ctrl-C, SIGTERM or SIGHUP. The drafter is checked before
    anything starts."""
    out = Path(out_dir)
    sides: dict[str, DrafterSide] = {}
    plans = (("off", "off"), ("on", draft))

    def side_config(value: str) -> ServerConfig:
        # a port free now (not one picked minutes earlier), and a chosen_by of its own: each launch's
        # reasons are its own, never written into the caller's config
        # num_draft_tokens=None: the launch's own choice (tune profile, else the size recipe)
        return config.replaced(port=free_port(), draft=value, num_draft_tokens=None,
                                   chosen_by=dict(config.chosen_by))

    for _, value in plans:
        side_config(value).validate()  # a drafter that does not match the target is refused before any launch
    served = config.resolved_name()
    reuse = running if running is not None and config.draft == "off" else None
    if running is not None and reuse is None:
        running.stop()  # it runs a drafter: both sides launch, and the GPU is freed for them first
    with signals.orderly_stop(redeliver=False):
        for label, value in plans:
            name = "drafter off" if label == "off" else f"drafter on ({value})"
            if label == "off" and reuse is not None:
                url, stop = reuse.url, reuse.stop
            else:
                try:
                    server = start(side_config(value))
                except Exception as exc:  # noqa: BLE001 - a side that did not start is "not measured", and says why
                    sides[label] = DrafterSide(label=name, draft=value,
                                               not_measured=f"the server did not start: {str(exc).splitlines()[0]}")
                    continue
                url, stop = server.base_url, server.stop
            try:
                decode, answers = _measure(url, served, out, label, tokenizer, input_len=input_len,
                                           output_len=output_len, num_prompts=num_prompts)
            finally:
                stop()
            sides[label] = _side(name, value, decode, answers)
    if sides["off"].answers is None or sides["on"].answers is None:
        comparison = AnswerComparison.not_measured(
            "; ".join(f"{s.label}: {s.not_measured}" for s in sides.values() if s.answers is None)
        )
    else:
        comparison = compare_answers(sides["off"].answers, sides["on"].answers)
    return DrafterComparison(off=sides["off"], on=sides["on"], answers=comparison)
