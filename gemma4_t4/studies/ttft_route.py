"""The user's own TTFT curve with the tensor-core prefill route off and on (notebook 4, on a T4).

Starts the same server with ``GEMMA4_T4_TC_PREFILL=0`` and ``=1`` (so it sits above serving and
bench), runs the ``ttft`` workload against each and plots both curves. What the route did, read from
each server's log, is recorded next to the numbers: a curve where it could not activate says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from gemma4_t4.bench.specs import ServedAt, TTFTSpec, run
from gemma4_t4.foundation.figures import pyplot, save_figure
from gemma4_t4.foundation.jsonable import TypedDict
from gemma4_t4.foundation.table import Displayable
from gemma4_t4.serving.server import VLLMServer
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.turing import prefill

ROUTE_LINE = re.compile(r"gemma4-t4 turing prefill: (?P<action>[\w-]+): (?P<reason>.*?) \[vLLM")
MODES = (("route-off", "0"), ("route-on", "1"))


class TtftRow(TypedDict):
    """One input length: the median TTFT with the route off and on, and off / on."""

    input_len: int
    ttft_ms_route_off: float | None
    ttft_ms_route_on: float | None
    speedup: float | None


class TtftOnOffReport(Displayable, BaseModel):
    """The TTFT route curve: median TTFT per input length with the route off and on."""

    rows: list[TtftRow]
    route_on_active: bool  # the route-on server's log says the route was installed
    route_on_log: list[str]
    route_off_log: list[str]
    results: dict[str, str]  # mode -> results dir
    plot: str | None = None

    def caption(self) -> str:
        active = "active" if self.route_on_active else f"NOT active (log: {', '.join(self.route_on_log) or '-'})"
        return f"median TTFT (ms), tensor-core prefill route off vs on; route {active}"

    def table_rows(self) -> list[TtftRow]:
        return self.rows


def ttft_route_on_off(
    config: ServerConfig,
    spec: TTFTSpec,
    out_dir: str | Path,
    server_factory: Callable[[ServerConfig], VLLMServer] = VLLMServer,
    progress: bool = True,
) -> TtftOnOffReport:
    """TTFT vs input length with the route off, then on (``config.max_model_len`` must fit the longest
    input + output); returns medians per length and the plot path."""
    out = Path(out_dir)
    medians: dict[str, dict[int, float | None]] = {}  # mode -> median TTFT per input length
    routes: dict[str, list[str]] = {}  # mode -> the route's actions in its server's log
    for mode, value in MODES:
        cfg = config.replaced(extra_env={**config.extra_env, prefill.ENV_SWITCH: value})
        with server_factory(cfg) as server:
            served = ServedAt(server.base_url, cfg.resolved_name())
            result = run(served, spec, out / mode, label=f"TTFT, tensor-core prefill {mode}", progress=progress)
            log = Path(server.log_path)
            log_text = log.read_text(errors="replace") if log.exists() else ""
        medians[mode] = dict(result.ttft_by_input_len())
        # the route's install action in each process that logged one (routed, no-change, refused, ...)
        routes[mode] = [m["action"] for m in ROUTE_LINE.finditer(log_text)]
    rows: list[TtftRow] = []
    for n in sorted(set(medians["route-off"]) | set(medians["route-on"])):
        off, on = medians["route-off"].get(n), medians["route-on"].get(n)
        speedup = round(off / on, 2) if off and on else None
        rows.append({"input_len": n, "ttft_ms_route_off": off, "ttft_ms_route_on": on, "speedup": speedup})
    active = "routed" in routes["route-on"]
    return TtftOnOffReport(
        rows=rows,
        route_on_active=active,
        route_on_log=routes["route-on"],
        route_off_log=routes["route-off"],
        results={mode: str(out / mode) for mode, _ in MODES},
        plot=str(plot_on_off(rows, out / "ttft_route_on_off.png", active)),
    )


def plot_on_off(rows: list[TtftRow], path: Path, active: bool) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = [r["input_len"] for r in rows]
    ax.plot(xs, [r["ttft_ms_route_off"] for r in rows], "o--", label="Triton (GEMMA4_T4_TC_PREFILL=0)")
    on_label = "tensor-core prefill route" + ("" if active else " (did NOT activate on this machine)")
    ax.plot(xs, [r["ttft_ms_route_on"] for r in rows], "s-", label=on_label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="input length (tokens)", ylabel="median time to first token (ms)",
           title="TTFT with the tensor-core prefill route off and on")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)
