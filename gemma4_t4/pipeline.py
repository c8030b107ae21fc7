"""Execute the four notebooks headlessly and write a report: what ``make run`` does.

Each notebook is executed with papermill from its clean source into ``OUT/notebooks/``, with
the parameters of ``notebooks/params/<target>.yaml`` injected, then exported to HTML. Every
notebook writes its plots and a ``summary.json`` into its own folder
(``OUT/notebooks/<name>/``); the index (``OUT/index.md`` and ``OUT/index.html``) links them.

A missing or failing notebook is reported by name and makes the run fail: never a fake success.
"""

from __future__ import annotations

import json
import re
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.atomic import atomic_write_text
from gemma4_t4.foundation.jsonable import JSONObject, JSONValue
from gemma4_t4.foundation.safepaths import existing_ancestor
from gemma4_t4.foundation.table import format_value, table_cells
from gemma4_t4.host import env
from gemma4_t4.notebook import SUMMARY_FILE
from gemma4_t4.venues import runtime
from gemma4_t4.venues.runtime import AUTO, TARGETS

# The notebooks and their params/ ship with the package (data/notebooks: in a checkout a link to its
# notebooks/ folder, in a wheel a copy of it), so `gemma4-t4 run` needs no checkout.
NOTEBOOKS_DIR = Path(__file__).resolve().parent / "data" / "notebooks"
PARAMS_DIR = NOTEBOOKS_DIR / "params"

# The series, in order. File names are "<number>_<slug>.ipynb"; only the number is fixed.
PARTS: dict[str, str] = {"01": "Part 1: deploy Gemma 4 to SageMaker and drive it through the MCP server",
                         "02": "Part 2: bf16 vs Google's QAT int4 - decode speed, bytes per token, roofline",
                         "03": "Part 3: check the QAT grid, repack to int4 with 4-bit embeddings, serve it",
                         "04": "Part 4: Gemma 4 on a T4 - doctor, fixes, serve, benchmark, what fits, $/Mtok"}

Status = Literal["ok", "failed", "missing", "skipped"]
SKIP_KEY = "_skip"  # in a params section: this part does not run for that target, and why


@dataclass
class NotebookRun:
    """The outcome of one notebook."""

    number: str
    title: str
    status: Status
    source: str | None = None
    executed: str | None = None
    html: str | None = None
    out_dir: str | None = None
    seconds: float = 0.0
    error: str | None = None
    plots: list[str] = field(default_factory=list)
    summary: JSONObject | None = None  # the notebook's summary.json


@dataclass
class PipelineReport:
    target: str
    out: str
    runs: list[NotebookRun]
    index_md: str | None = None
    index_html: str | None = None

    @property
    def ok(self) -> bool:
        ran = [r for r in self.runs if r.status != "skipped"]
        return bool(ran) and all(r.status == "ok" for r in ran)

    @property
    def missing(self) -> list[str]:
        return [r.number for r in self.runs if r.status == "missing"]

    @property
    def failed(self) -> list[str]:
        return [r.number for r in self.runs if r.status == "failed"]


def find_notebooks(notebooks_dir: Path = NOTEBOOKS_DIR) -> dict[str, Path | None]:
    """Map each part number to its notebook, or ``None`` where it does not exist."""
    found: dict[str, Path | None] = dict.fromkeys(PARTS)
    for path in sorted(Path(notebooks_dir).glob("[0-9][0-9]_*.ipynb")):
        number = path.name[:2]
        if number not in PARTS:
            continue
        if found[number] is not None:
            raise Gemma4T4Error(f"two notebooks for part {number}: {found[number].name} and {path.name}",
                                fix="keep one notebook per part number")
        found[number] = path
    return found


def load_parameters(target: str, params_dir: Path = PARAMS_DIR) -> dict[str, JSONObject]:
    """Read ``<target>.yaml``: an ``all`` section plus one section per notebook stem or number."""
    if target not in TARGETS:
        raise Gemma4T4Error(f"unknown target {target!r}", fix=f"use one of {', '.join(TARGETS)}")
    path = Path(params_dir) / f"{target}.yaml"
    if not path.exists():
        raise Gemma4T4Error(f"no parameter file {path}", fix=f"create it (see {Path(params_dir) / 'cpu.yaml'})")
    import yaml  # only when parameters are loaded, not on every CLI start

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise Gemma4T4Error(f"{path} is not valid YAML{where}: {problem}",
                            fix=f"fix that line (compare with {Path(params_dir) / 'cpu.yaml'})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) or v is None for v in data.values()):
        raise Gemma4T4Error(f"{path} must hold a mapping of sections (all, '02', ...) to mappings",
                            fix="see notebooks/params/cpu.yaml")
    return {str(k): (v or {}) for k, v in data.items()}


def parameters_for(notebook: Path, target: str, out_dir: Path, work_dir: Path,
                   params: dict[str, JSONObject]) -> JSONObject:
    """The parameters injected into one notebook: shared, per notebook, then the paths; a params file
    whose TARGET differs from the one asked for is refused, never obeyed."""
    values: JSONObject = {**params.get("all", {}), **params.get(notebook.name[:2], {}),
                          **params.get(notebook.stem, {})}
    values.pop(SKIP_KEY, None)
    declared = values.get("TARGET", target)
    if str(declared).strip().lower() != target:
        raise Gemma4T4Error(f"the parameters for {notebook.name} set TARGET={declared!r}, but TARGET={target!r} "
                            "was asked for",
                            fix=f"remove TARGET from that params file, or set it to {target!r} (each "
                                "params/<target>.yaml is for its own target)")
    values.update(TARGET=target, OUT_DIR=str(out_dir), WORK_DIR=str(work_dir))
    return values


def resolve_target(target: str, probes: Any = None) -> tuple[str, str]:
    """(target, why): ``auto`` chosen as the notebooks' first cell chooses it (the GPU path where the host has
    an NVIDIA GPU it can use, else cpu), so a run is refused here where its notebooks would refuse."""
    if target != AUTO:
        return target, f"--target {target}"
    resolved, why = runtime.resolve_target(AUTO, TARGETS, env.probe(probes))
    return resolved, f"{why} (params/{resolved}.yaml)"


def check_out_dir(out: str | Path, notebooks_dir: Path) -> Path:
    """The output folder, refused before anything runs when it cannot be one, or when the executed
    notebooks (``OUT/notebooks/NN_*.ipynb``) would land on the source notebooks or inside their folder."""
    path = Path(out).expanduser().resolve()
    source = Path(notebooks_dir).expanduser().resolve()
    if path / "notebooks" == source or path == source or source in path.parents:
        raise Gemma4T4Error(
            f"--out {out} would write the executed notebooks over the source notebooks in {source}",
            fix="pass an output folder outside the notebooks, e.g. --out build",
        )
    parent = existing_ancestor(path)
    if not parent.is_dir():
        raise Gemma4T4Error(f"--out {out}: {parent} is a file, not a folder",
                            fix="pass a folder path (it is created if missing), e.g. --out build")
    return path


def run_pipeline(
    target: str = "cpu", out: str | Path = "build", only: Sequence[str] | None = None,
    notebooks_dir: Path = NOTEBOOKS_DIR, params_dir: Path = PARAMS_DIR, work_dir: str | Path | None = None,
    export_html: bool = True, progress: bool = True, cell_timeout: float | None = None,
    log: Callable[[str], None] = print,
) -> PipelineReport:
    """Execute the notebooks for ``target`` (``only``: some part numbers or stems) into ``out/notebooks``
    and write the index; a missing notebook is reported (``status="missing"``), never skipped silently."""
    import papermill

    target, why = resolve_target(target)
    if not Path(notebooks_dir).is_dir():
        raise Gemma4T4Error(f"no notebooks folder at {notebooks_dir}",
                            fix="pass --notebooks DIR, a folder holding the NN_*.ipynb notebooks and params/, or "
                                "leave it out to run the notebooks installed with the package")
    out = check_out_dir(out, notebooks_dir)
    params = load_parameters(target, params_dir)
    found = find_notebooks(notebooks_dir)
    selected = _select(found, only)
    nb_out = out / "notebooks"
    # the notebooks' scratch (models they build, vLLM's state and logs) stays under --out
    work = Path(work_dir).resolve() if work_dir else out / ".work"
    # each notebook's parameters (its outputs in nb_out/STEM), a conflict refused before any notebook runs
    values = {number: parameters_for(found[number], target, nb_out / found[number].stem, work, params)
              for number in selected if found[number] is not None}
    if why.startswith("auto"):
        log(f"TARGET={target} ({why})")
    nb_out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)

    runs: list[NotebookRun] = []
    for number in selected:
        source = found[number]
        title = PARTS[number]
        if source is None:
            log(f"[{number}] MISSING: no notebooks/{number}_*.ipynb")
            runs.append(NotebookRun(number, title, "missing", error=f"no notebook {number}_*.ipynb in {notebooks_dir}"))
            continue
        skip = {**params.get(number, {}), **params.get(source.stem, {})}.get(SKIP_KEY)
        if skip:
            log(f"[{number}] skipped for TARGET={target}: {skip}")
            runs.append(NotebookRun(number, title, "skipped", source=str(source), error=str(skip)))
            continue
        runs.append(_execute(papermill, source, number, values[number], out, export_html, progress, cell_timeout,
                             log))

    report = PipelineReport(target=target, out=str(out), runs=runs)
    report.index_md, report.index_html = write_index(report)
    return report


def _execute(papermill: Any, source: Path, number: str, values: JSONObject, out: Path, export_html: bool,
             progress: bool, cell_timeout: float | None, log: Callable[[str], None]) -> NotebookRun:
    """Execute one notebook into ``out/notebooks`` (its outputs in ``out/notebooks/STEM``) and say how it
    went: failed when a cell raised or when it wrote no summary."""
    nb_out = out / "notebooks"
    executed = nb_out / source.name
    run_dir = nb_out / source.stem
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SUMMARY_FILE).unlink(missing_ok=True)  # a stale summary must not pass for a new one
    log(f"[{number}] executing {source.name} (TARGET={values['TARGET']}) -> {executed}")
    started = time.monotonic()
    run = NotebookRun(number, PARTS[number], "ok", source=str(source), executed=str(executed), out_dir=str(run_dir))
    try:
        papermill.execute_notebook(
            # the kernel works in the notebook's own output folder: the notebooks may sit in an installed
            # package, where nothing may be written
            str(source), str(executed), parameters=values, cwd=str(run_dir), kernel_name="python3",
            progress_bar=progress, execution_timeout=cell_timeout, report_mode=False,
            kernel_manager_class=kernel_logging_to(run_dir / KERNEL_LOG),
        )
    except Exception as exc:  # papermill raises PapermillExecutionError with the failing cell
        run.status = "failed"
        run.error = _short_error(exc)
        log(f"[{number}] FAILED: {run.error}")
    run.seconds = round(time.monotonic() - started, 1)
    try:
        run.summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        pass  # none written (or half of one): a notebook that finished fails below
    run.plots = sorted(str(p.relative_to(out)) for p in run_dir.rglob("*.png"))
    if run.status == "ok" and run.summary is None:
        run.status = "failed"
        run.error = f"the notebook finished but wrote no {SUMMARY_FILE} in {run_dir}"
    if export_html and executed.exists():
        try:
            run.html = str(export_notebook_html(executed))
        except Exception as exc:  # an export problem must not hide the execution result
            log(f"[{number}] HTML export failed: {exc}")
    if run.status == "ok":
        log(f"[{number}] ok in {run.seconds:.0f} s, {len(run.plots)} plot(s)")
    return run


KERNEL_LOG = "kernel.log"


def kernel_logging_to(path: Path) -> type:
    """A kernel manager whose kernel writes its own log (stderr) to ``path``: the run's output stays
    the run's, and a kernel stopped mid-cell (Ctrl-C, SIGTERM) leaves its shutdown noise in the file,
    not a traceback on the terminal."""
    from jupyter_client.manager import AsyncKernelManager

    class KernelLoggingToFile(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: object) -> None:
            with open(path, "ab") as log_file:  # the child keeps its own descriptor
                kw["stderr"] = log_file
                await super()._async_launch_kernel(kernel_cmd, **kw)

    return KernelLoggingToFile


def _select(found: dict[str, Path | None], only: Sequence[str] | None) -> list[str]:
    if not only:
        return list(found)
    chosen = []
    for item in only:
        key = item[:2]
        if key not in found:
            raise Gemma4T4Error(f"no part {item!r}", fix=f"choose among {', '.join(found)}")
        chosen.append(key)
    return sorted(set(chosen))


def _short_error(exc: BaseException) -> str:
    name = getattr(exc, "ename", None) or type(exc).__name__
    value = getattr(exc, "evalue", None) or str(exc)
    cell = getattr(exc, "exec_count", None)
    where = f" in cell [{cell}]" if cell is not None else ""
    text = f"{name}{where}: {value}".strip()
    if not getattr(exc, "ename", None):
        text += "\n" + "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return _ANSI.sub("", text)[:2000]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def export_notebook_html(executed: Path) -> Path:
    """Export an executed notebook to a self-contained HTML file next to it."""
    import nbconvert
    import nbformat

    notebook = nbformat.read(str(executed), as_version=4)
    body, _ = nbconvert.HTMLExporter().from_notebook_node(notebook)
    target = executed.with_suffix(".html")
    atomic_write_text(target, body)
    return target


def write_index(report: PipelineReport) -> tuple[str, str]:
    """Write ``index.md`` and ``index.html`` in ``report.out``; return their paths."""
    out, md = Path(report.out), render_index_markdown(report)
    atomic_write_text(out / "index.md", md)
    atomic_write_text(out / "index.html", _markdown_to_html(md, f"gemma4_t4 notebooks ({report.target})"))
    return str(out / "index.md"), str(out / "index.html")


def render_index_markdown(report: PipelineReport) -> str:
    """The index: one row per notebook, then each one's figures, tables, notes and plots (from its summary)."""
    out = Path(report.out)
    verdict = "all notebooks ran" if report.ok else "SOME NOTEBOOKS DID NOT RUN"
    if report.ok and any(r.status == "skipped" for r in report.runs):
        verdict = "all notebooks for this target ran"
    lines = [
        f"# gemma4_t4 notebooks: TARGET={report.target}", "",
        f"**{verdict}** ({sum(r.status == 'ok' for r in report.runs)}/{len(report.runs)} ok). "
        f"Written {time.strftime('%Y-%m-%d %H:%M:%S %Z')}.", "", "| part | notebook | status | time | HTML |",
        "|---|---|---|---:|---|",
    ]
    for run in report.runs:
        notebook = _link(run.executed, out) or f"{run.number}_*.ipynb"
        lines.append(f"| {run.number} | {notebook} | {run.status} | {run.seconds:.0f} s | "
                     f"{_link(run.html, out, 'html') or '-'} |")
    for run in report.runs:
        lines += ["", f"## {run.title}", ""]
        if run.status == "missing":
            lines.append(f"Missing: {run.error}.")
            continue
        if run.status == "skipped":
            lines.append(f"Skipped for TARGET={report.target}: {run.error}.")
            continue
        if run.error:
            lines += ["Error:", "", "```", run.error, "```", ""]
        summary = run.summary or {}  # save_summary writes every key below; a failed notebook wrote none
        lines += [f"- **{key}**: {_cell(value)}" for key, value in summary.get("results", {}).items()]
        lines += [f"- {key} (published, not measured here): {_cell(value)}"
                  for key, value in summary.get("published", {}).items()]
        for table in summary.get("tables", []):
            lines += ["", f"**{table['title']}**", "", *_md_table(table["rows"])]
        lines += [f"- {note}" for note in summary.get("notes", [])]
        for plot in run.plots:
            lines += ["", f"![{Path(plot).stem}]({plot})"]
    return "\n".join(lines) + "\n"


def _md_table(rows: list[dict[str, JSONValue]]) -> list[str]:
    if not rows:
        return []
    columns, cells = table_cells(rows)
    return [f"| {' | '.join(_cell(c) for c in row)} |" for row in (columns, ["---"] * len(columns), *cells)]


def _cell(value: Any) -> str:
    """One value as a markdown table cell or list item: formatted as every table formats it, ``|`` escaped."""
    return format_value(value).replace("|", "\\|")


def _link(path: str | None, out: Path, text: str | None = None) -> str:
    """A markdown link to a file the run wrote under ``out``, shown as ``text`` or its name; "" for none."""
    return f"[{text or Path(path).name}]({Path(path).relative_to(out)})" if path else ""


def _markdown_to_html(md: str, title: str) -> str:
    """The index's markdown as a standalone HTML page (mistune, which nbconvert itself uses)."""
    import html

    import mistune

    body = mistune.create_markdown(escape=True, plugins=["table"])(md)
    style = "body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}" \
            "td,th{border:1px solid #ccc;padding:.2em .5em}img{max-width:100%}"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n{body}\n</body></html>\n")
