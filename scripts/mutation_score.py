"""Mutation score of the core modules (``make mutation``; not part of ``make test`` or CI).

mutmut 3 mutates one module at a time and runs, for each mutant, only the tests of that module's
fast test files that execute the mutated function (the ``vllm``, ``compile``, ``notebooks``,
``slow`` and ``gpu`` tiers are deselected by ``[tool.mutmut] pytest_add_cli_args``). Where a
module is only partly in scope (the SageMaker delete plan in ``sagemaker/ops.py``, the install plan of
``setup_plan.py``) only the listed functions' mutants are run and scored.

    python scripts/mutation_score.py                  # every module, in order
    python scripts/mutation_score.py turing.smem      # one or more modules by key
    python scripts/mutation_score.py --jobs 4 --out build/mutation

Each module writes ``OUT/<key>.json`` (counts, every survivor with file:line and the diff) and the
run writes ``OUT/summary.md``. The score is killed / (killed + survived + timeout + suspicious);
a timeout counts as a kill, as mutmut's own score does (a mutant that hangs the tests is caught).
The tool's ``mutants/`` work folder is rebuilt for every module (mutmut keeps one per checkout).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = "mutants"  # mutmut's fixed work folder, relative to the checkout


@dataclass(frozen=True)
class Target:
    path: str
    tests: tuple[str, ...]
    # None: every function of the module; else the functions (``Class.*`` for a class's methods)
    functions: tuple[str, ...] | None = None


# module key -> the module, its fast test files, and the part of it in scope
MODULES: dict[str, Target] = {
    "turing.smem": Target("gemma4_t4/turing/smem.py", ("tests/turing/test_turing_smem.py", "tests/turing/test_mutants_turing.py")),
    # the plugin tests that load vLLM's kernel module (its `kernel` fixture) take 10-20 s per mutant on
    # a 2-core box, and test_turing_filepatch.py runs the CLI in subprocesses (mutants there are not
    # seen): the fast ones below plus a stand-in kernel module (test_mutants_turing.py) cover it
    "turing.tilecap": Target(
        "gemma4_t4/turing/tilecap.py",
        (
            "tests/turing/test_mutants_turing.py",
            "tests/turing/test_turing_plugin.py::test_cpu_platform_changes_nothing_and_imports_nothing",
            "tests/turing/test_turing_plugin.py::test_changed_kernel_is_refused",
            "tests/turing/test_turing_plugin.py::test_structure_check_on_the_installed_kernel",
            "tests/turing/test_turing_plugin.py::test_plugin_entry_point_and_status",
        ),
    ),
    "setup.plan": Target(
        "gemma4_t4/host/setup_plan.py",
        ("tests/host/test_setup_plan.py", "tests/host/test_mutants_setup_plan.py"),
        functions=(
            "InstallRoute.*",
            "known_vllm_versions",
            "route_by_key",
            "PipStep.*",
            "SetupPlan.*",
            "driver_major",
            "check_vllm_choice",
            "routes_for_driver",
            "pip_command",
            "route_steps",
            "plan_setup",
            "_plan_route",
            "_older_driver_notes",
            "base_version",
            "local_version",
            "_installed",
            "_missing",
        ),
    ),
    "bench.metrics": Target(
        "gemma4_t4/bench/metrics.py",
        ("tests/bench/test_bench_metrics.py", "tests/bench/test_bench_integrity.py", "tests/bench/test_bench_metrics_edges.py"),
    ),
    "bench.answers": Target(
        "gemma4_t4/bench/answers.py",
        ("tests/bench/test_bench_metrics.py", "tests/bench/test_bench_trust.py", "tests/bench/test_bench_integrity.py"),
    ),
    "quant.grid": Target(
        "gemma4_t4/quant/grid.py",
        ("tests/quant/test_quant_repack.py", "tests/quant/test_quant_verdicts.py", "tests/quant/test_quant_io.py",
         "tests/quant/test_mutants_quant_grid.py"),
    ),
    "secrets": Target("gemma4_t4/foundation/secrets.py", ("tests/foundation/test_secrets_rule.py",)),
    "gate": Target(
        "gemma4_t4/serving/gate.py", ("tests/serving/test_gate_judge.py", "tests/serving/test_gate_margins.py", "tests/serving/test_gate_messages.py")
    ),
    "sagemaker.delete_plan": Target(
        "gemma4_t4/sagemaker/ops.py",
        ("tests/sagemaker/test_sagemaker_moto.py", "tests/sagemaker/test_sagemaker_scale.py", "tests/sagemaker/test_sagemaker_checks.py",
         "tests/sagemaker/test_sagemaker_ownership.py"),
        functions=(
            "_config_models",
            "_other_endpoints_uses",
            "plan_delete",
            "_delete_call",
            "delete_plan",
        ),
    ),
    # the modules the notebooks, the CLI and the MCP server reach, beyond the nine above
    "bench.registry": Target(
        "gemma4_t4/bench/registry.py",
        ("tests/bench/test_bench_args.py", "tests/bench/test_bench_bounds.py", "tests/bench/test_mutants_bench_specs.py"),
    ),
    "bench.specs": Target(
        "gemma4_t4/bench/specs.py",
        ("tests/bench/test_bench_args.py", "tests/bench/test_bench_bounds.py", "tests/bench/test_bench_client.py",
         "tests/notebooks/test_notebook_params.py", "tests/bench/test_mutants_bench_specs.py"),
    ),
    "bench.compare": Target(
        "gemma4_t4/bench/compare.py",
        ("tests/bench/test_bench_integrity.py", "tests/bench/test_bench_trust.py", "tests/bench/test_bench_flush_compare.py",
         "tests/test_display.py", "tests/bench/test_mutants_bench_results.py"),
    ),
    "bench.results": Target(
        "gemma4_t4/bench/results.py",
        ("tests/bench/test_bench_integrity.py", "tests/bench/test_bench_metrics.py", "tests/bench/test_bench_trust.py",
         "tests/studies/test_part2_reading.py", "tests/studies/test_part4_reading.py", "tests/bench/test_reliability_bench.py",
         "tests/bench/test_mutants_bench_results.py"),
    ),
    "bench.published": Target(
        "gemma4_t4/bench/published.py",
        ("tests/bench/test_bench_integrity.py", "tests/bench/test_bench_trust.py", "tests/test_display.py",
         "tests/studies/test_part2_reading.py", "tests/studies/test_part4_reading.py", "tests/bench/test_mutants_bench_results.py"),
    ),
    "host.env": Target(
        "gemma4_t4/host/env.py",
        ("tests/host/test_env_doctor.py", "tests/host/test_setup_host_verdicts.py", "tests/host/test_setup_mixed_gpus.py",
         "tests/catalog/test_gpu_identity.py", "tests/host/test_setup_hosts.py", "tests/host/test_mutants_host.py"),
    ),
    "host.setup": Target(
        "gemma4_t4/host/setup.py",
        ("tests/host/test_setup_apply.py", "tests/host/test_setup_plan.py", "tests/host/test_setup_host_verdicts.py",
         "tests/host/test_setup_one_plan.py", "tests/host/test_mutants_host.py"),
    ),
    "sagemaker.config": Target(
        "gemma4_t4/sagemaker/config.py",
        ("tests/sagemaker/test_sagemaker_config.py", "tests/sagemaker/test_sagemaker_settings.py", "tests/sagemaker/test_sagemaker_checks.py",
         "tests/mcp/test_mcp_boundary.py", "tests/sagemaker/test_mutants_sagemaker.py"),
    ),
    "sagemaker.deploy": Target(
        "gemma4_t4/sagemaker/deploy.py",
        ("tests/sagemaker/test_sagemaker_moto.py", "tests/sagemaker/test_sagemaker_stubbed.py", "tests/sagemaker/test_sagemaker_checks.py",
         "tests/sagemaker/test_sagemaker_config.py", "tests/sagemaker/test_reliability_sagemaker.py", "tests/sagemaker/test_mutants_sagemaker.py"),
    ),
    "mcp_boundary": Target("gemma4_t4/mcp_boundary.py", ("tests/mcp/test_mcp_boundary.py", "tests/mcp/test_mutants_mcp.py")),
    "mcp_server": Target(
        "gemma4_t4/mcp_server.py",
        ("tests/mcp/test_mcp_server.py", "tests/mcp/test_mcp_boundary.py", "tests/mcp/test_reliability_mcp.py",
         "tests/serving/test_serve_settings.py", "tests/mcp/test_mutants_mcp.py"),
    ),
    "notebook": Target(
        "gemma4_t4/notebook.py",
        ("tests/notebooks/test_notebook_params.py", "tests/notebooks/test_notebook_venues.py", "tests/test_display.py",
         "tests/bench/test_bench_trust.py", "tests/notebooks/test_mutants_notebook.py"),
    ),
    "venues.endpoint": Target(
        "gemma4_t4/venues/endpoint.py",
        ("tests/venues/test_endpoint.py", "tests/serving/test_server_owned_records.py", "tests/notebooks/test_mutants_notebook.py"),
    ),
}

# ``--batch NAME``: groups of modules measured together, each small enough for one sitting on a 2-core
# machine (the docs table gives each batch's measured time)
BATCHES: dict[str, tuple[str, ...]] = {
    "turing": ("turing.smem", "turing.tilecap"),
    "quant": ("quant.grid",),
    "bench": ("bench.metrics", "bench.answers", "bench.registry", "bench.specs"),
    "results": ("bench.compare", "bench.results", "bench.published"),
    "host": ("setup.plan", "host.env", "host.setup", "gate"),
    "sagemaker": ("sagemaker.delete_plan", "sagemaker.config", "sagemaker.deploy"),
    "surfaces": ("secrets", "mcp_boundary", "mcp_server", "notebook", "venues.endpoint"),
}

KILLED = ("killed", "timeout", "caught by type check")
# a mutant no fast test executes ("no tests") counts against the score, as a survivor does
COUNTED = (*KILLED, "survived", "no tests", "suspicious", "segfault")


def score(counts: dict[str, int]) -> tuple[int, int]:
    """(caught, scored) from a module's status counts."""
    return sum(counts.get(s, 0) for s in KILLED), sum(counts.get(s, 0) for s in COUNTED)


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def mutant_globs(target: Target) -> list[str]:
    """mutmut's names: ``pkg.mod.x_func__mutmut_3``, ``pkg.mod.xǁClassǁmethod__mutmut_3``."""
    mod = module_name(target.path)
    if target.functions is None:
        return [f"{mod}.*"]
    globs = []
    for name in target.functions:
        if "." in name:
            cls, method = name.split(".", 1)
            globs.append(f"{mod}.x\u01c1{cls}\u01c1{method}__mutmut_*")
        else:
            globs.append(f"{mod}.x_{name}__mutmut_*")
    return globs


def function_lines(source: str) -> dict[str, int]:
    """'func' / 'Class.method' -> the line of its ``def`` (top-level functions and methods only,
    the ones mutmut mutates)."""
    lines: dict[str, int] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines[node.name] = node.lineno
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines[f"{node.name}.{item.name}"] = item.lineno
    return lines


def function_of(mutant: str) -> str:
    """'pkg.mod.xǁClassǁmethod__mutmut_3' -> 'Class.method'; 'pkg.mod.x_func__mutmut_3' -> 'func'."""
    tail = mutant.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]
    if tail.startswith("x\u01c1"):
        return tail[2:].replace("\u01c1", ".")
    return tail.removeprefix("x_")


def mutated_line(source_lines: list[str], def_line: int, diff: str) -> int:
    """The file line of the diff's first removed line. The diff is of the function alone, so its hunk
    header gives an estimate (relative to the ``def``); the nearest line with the removed text wins,
    the estimate when the text is not found verbatim."""
    estimate, removed, offset = def_line, None, 0
    for line in diff.splitlines():
        if line.startswith("@@"):
            start = int(line.split()[1].lstrip("-").split(",")[0])
            estimate, offset = def_line + start - 1, 0
        elif line.startswith(("---", "+++")):
            continue
        elif line.startswith("-"):
            removed = line[1:].strip()
            estimate += offset
            break
        elif line.startswith(" "):
            offset += 1
    if not removed:
        return estimate
    matches = [n for n in range(def_line, len(source_lines) + 1) if source_lines[n - 1].strip() == removed]
    return min(matches, key=lambda n: abs(n - estimate)) if matches else estimate


def worker(key: str, jobs: int, out: Path, only: list[str] | None = None) -> int:
    """Runs in its own process (mutmut keeps its configuration and results in module globals)."""
    target = MODULES[key]
    # mutmut forks each mutant's test run from a process that has already run numba's parallel
    # kernels (quant.grid's tests); numba's default GNU OpenMP pool then raises SIGTERM in the fork
    # ("fork() called from a process already using GNU OpenMP"), which mutmut can only call
    # "suspicious". The workqueue layer resets itself after a fork.
    os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
    # torch's own GNU OpenMP pool has the same fork hazard: a mutant's tests forked after torch ran a
    # multi-threaded op waited forever in gomp_team_barrier_wait_end (seen in gdb). One OpenMP thread,
    # set before torch loads, makes no pool to inherit.
    os.environ["OMP_NUM_THREADS"] = "1"
    # quant.grid's progress-bar tests draw tqdm bars. tqdm's default lock is a multiprocessing lock,
    # one semaphore shared by every process forked from here: a mutant's test run killed while it held
    # it (mutmut's timeout) leaves every later one waiting forever (seen in gdb: a test process in
    # SemLock.acquire). A thread lock is each forked process's own; no monitor thread takes it either.
    import threading

    from tqdm import tqdm

    tqdm.monitor_interval = 0
    tqdm.set_lock(threading.RLock())
    from mutmut import configuration

    config = configuration.config()
    config.only_mutate = [target.path]
    config.pytest_add_cli_args_test_selection = [t for t in target.tests if (REPO / t.split("::")[0]).exists()]

    from mutmut.__main__ import cli
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    started = time.monotonic()
    try:
        cli(["run", "--max-children", str(jobs), *(only or mutant_globs(target))], standalone_mode=False)
    except SystemExit as stop:
        if stop.code not in (0, None):
            print(f"mutmut run for {key} stopped with {stop.code}", file=sys.stderr)
            return 1
    seconds = time.monotonic() - started

    data = SourceFileMutationData(path=Path(target.path))
    data.load()
    globs = only or mutant_globs(target)
    import fnmatch

    statuses = {
        name: status_by_exit_code[code]
        for name, code in data.exit_code_by_key.items()
        if any(fnmatch.fnmatch(name, g) for g in globs)
    }
    source = (REPO / target.path).read_text()
    source_lines = source.splitlines()
    defs = function_lines(source)
    survivors = []
    for name, status in sorted(statuses.items()):
        if status in KILLED:
            continue
        diff = get_diff_for_mutant(name, path=target.path)
        line = mutated_line(source_lines, defs.get(function_of(name), 1), diff)
        survivors.append({"mutant": name, "status": status, "where": f"{target.path}:{line}", "diff": diff})
    counts: dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    out.mkdir(parents=True, exist_ok=True)
    previous = out / f"{key}.json"
    if only and previous.exists():
        # a re-run of some mutants (usually last run's survivors, after new tests) updates the module's
        # full-run record: the module's code is unchanged, so mutants killed before stay killed
        record = merge_rerun(json.loads(previous.read_text()), statuses, survivors, seconds)
        write_atomically(previous, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        return 0
    killed, scored = score(counts)
    record = {
        "module": key,
        "path": target.path,
        "functions": list(target.functions) if target.functions else "all",
        "tests": config.pytest_add_cli_args_test_selection,
        "mutants": len(statuses),
        "counts": counts,
        "killed": killed,
        "scored": scored,
        "score": round(100.0 * killed / scored, 1) if scored else None,
        "seconds": round(seconds, 1),
        "jobs": jobs,
        **provenance(target),
        "survivors": survivors,
    }
    write_atomically(out / f"{key}.json", json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return 0


def provenance(target: Target) -> dict:
    """When, where and on which code a record was measured: the docs table names all three."""
    import hashlib
    import platform

    cpu = "unknown CPU"
    flags = ""
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        flags = next(line for line in info.splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    isa = "AMX" if " amx_tile" in flags else "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "?"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": f"{cpu} ({isa}, {os.cpu_count()} cores)",
        "python": platform.python_version(),
        # the module's own text: a record whose module changed since is stale, and the table says so
        "module_sha256": hashlib.sha256((REPO / target.path).read_bytes()).hexdigest()[:12],
    }


def merge_rerun(record: dict, statuses: dict[str, str], survivors: list[dict], seconds: float) -> dict:
    """The full-run record with some mutants' statuses replaced by a later run's."""
    was = {s["mutant"]: s["status"] for s in record["survivors"]}
    counts = dict(record["counts"])
    for name, status in statuses.items():
        old = was.get(name, "killed")
        counts[old] = counts.get(old, 0) - 1
        counts[status] = counts.get(status, 0) + 1
    counts = {k: v for k, v in counts.items() if v > 0}
    kept = [s for s in record["survivors"] if s["mutant"] not in statuses]
    killed, scored = score(counts)
    reruns = [*record.get("reruns", []), {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "mutants": len(statuses),
        "killed": sum(1 for st in statuses.values() if st in KILLED),
        "seconds": round(seconds, 1),
    }]
    return {**record, "counts": counts, "killed": killed, "scored": scored,
            "score": round(100.0 * killed / scored, 1) if scored else None,
            "reruns": reruns, "survivors": sorted(kept + survivors, key=lambda s: s["mutant"])}


# The committed records (compact: a survivor's mutated line, not its whole diff) that docs/testing.md's
# table and docs/mutation-survivors.md are written from by ``--docs``; ``--publish`` copies OUT's there.
RECORDS = REPO / "docs" / "results" / "mutation"
TESTING_MD = REPO / "docs" / "testing.md"
SURVIVORS_MD = REPO / "docs" / "mutation-survivors.md"
TABLE_START = "<!-- mutation table: written by `scripts/mutation_score.py --docs` from docs/results/mutation; not by hand -->"
TABLE_END = "<!-- end of mutation table -->"


def changed_text(diff: str) -> str:
    return " / ".join(d[1:].strip() for d in diff.splitlines() if d.startswith("+") and not d.startswith("+++"))


def compact(record: dict, committed: dict | None) -> dict:
    """OUT's record as committed: survivors by their mutated text; a committed record's equivalents and
    notes (written by people, with reasons) are kept where their mutants still survive."""
    survivors = [
        {"mutant": s["mutant"], "status": s["status"], "where": s["where"], "change": s.get("change") or changed_text(s["diff"])}
        for s in record["survivors"]
    ]
    alive = {s["mutant"] for s in survivors}
    equivalent = {m: why for m, why in (committed or {}).get("equivalent", {}).items() if m in alive}
    return {**{k: v for k, v in record.items() if k != "survivors"}, "equivalent": equivalent,
            "notes": (committed or {}).get("notes", ""), "survivors": survivors}


def adjusted(record: dict) -> tuple[int, int, int]:
    """(caught, scored, equivalent): equivalent survivors are named and left out of the score."""
    caught, scored = score(record["counts"])
    alive = {s["mutant"] for s in record["survivors"]}
    equivalent = sum(1 for m in record.get("equivalent", {}) if m in alive)
    return caught, scored - equivalent, equivalent


def committed_records() -> dict[str, dict | None]:
    return {key: json.loads((RECORDS / f"{key}.json").read_text()) if (RECORDS / f"{key}.json").exists() else None
            for key in MODULES}


def current(record: dict) -> str:
    import hashlib

    digest = record.get("module_sha256")
    if not digest:
        return "not recorded"
    now = hashlib.sha256((REPO / record["path"]).read_bytes()).hexdigest()[:12]
    return "yes" if now == digest else "module changed since"


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def render_table(records: dict[str, dict | None]) -> str:
    rows = [
        "| module | file | mutants | killed | not killed (survived or reached by no test) | of them equivalent | score | score, equivalents left out | measured | CPU | time | record current |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---|",
    ]
    total_caught = total_scored = 0
    for key, r in records.items():
        path = MODULES[key].path
        if r is None:
            rows.append(f"| `{key}` | `{path}` | | | | | not measured yet | | | | | |")
            continue
        caught, scored, equivalent = adjusted(r)
        total_caught, total_scored = total_caught + caught, total_scored + scored
        left = len(r["survivors"])
        runs = r.get("seconds")
        time_text = f"{minutes(runs)} (`--jobs {r.get('jobs', '?')}`)" if runs else ""
        if r.get("reruns"):
            time_text += f" + {len(r['reruns'])} re-run(s) of survivors, {minutes(sum(x['seconds'] for x in r['reruns']))}"
        rows.append(
            f"| `{key}` | `{path}` | {r['mutants']} | {caught} | {left} | {equivalent} | "
            f"{100.0 * caught / max(scored + equivalent, 1):.1f} % | {100.0 * caught / max(scored, 1):.1f} % | {r.get('date', '')} | {r.get('cpu', '')} | {time_text} | {current(r)} |"
        )
    if total_scored:
        rows.append(f"| **all measured** | | | {total_caught} | | | | {100.0 * total_caught / total_scored:.1f} % | | | | |")
    rows += ["", "Batches (`make mutation MUTATION_ARGS=\"--batch NAME\"`), with the time their latest full runs took:", "",
             "| batch | modules | mutants | full-run time measured | modules not measured yet |", "|---|---|---:|---|---|"]
    for name, keys in BATCHES.items():
        done = [records[k] for k in keys if records.get(k) and records[k].get("seconds")]
        missing = [k for k in keys if not (records.get(k) and records[k].get("seconds"))]
        rows.append(
            f"| `{name}` | {', '.join(f'`{k}`' for k in keys)} | {sum(r['mutants'] for r in done) or ''} | "
            f"{minutes(sum(r['seconds'] for r in done)) if done else ''} | {', '.join(f'`{k}`' for k in missing)} |"
        )
    rows += ["", "Each module's tests (a mutant runs only those of them that execute its function):", "",
             "| module | in scope | fast test files |", "|---|---|---|"]
    for key, target in MODULES.items():
        scope = "all functions" if target.functions is None else ", ".join(f"`{f}`" for f in target.functions)
        tests = ", ".join(f"`{t.removeprefix('tests/')}`" for t in target.tests)
        rows.append(f"| `{key}` | {scope} | {tests} |")
    return "\n".join(rows)


def render_survivors(records: dict[str, dict | None]) -> str:
    lines = [
        "# Mutation survivors",
        "",
        "Written by `scripts/mutation_score.py --docs` from the records in `docs/results/mutation/`; not by hand.",
        "What survives, per module, in its latest record (docs/testing.md gives the scores and how they are",
        "measured). Each line: `file:line` (status) the mutant's name, then the mutated code; an equivalent",
        "mutant (no input can tell it apart) carries its reason.",
    ]
    for key, r in records.items():
        if r is None:
            continue
        lines += ["", f"## {key} ({r.get('date', 'date not recorded')}; record current: {current(r)})", ""]
        if r.get("notes"):
            lines += [r["notes"], ""]
        if not r["survivors"]:
            lines.append("None survive.")
        for s in r["survivors"]:
            why = r.get("equivalent", {}).get(s["mutant"])
            tail = f" — equivalent: {why}" if why else ""
            lines.append(f"- {s['where']} ({s['status']}) `{s['mutant']}`: {s['change']}{tail}")
    return "\n".join(lines) + "\n"


def write_docs(records: dict[str, dict | None]) -> None:
    text = TESTING_MD.read_text()
    start, end = text.index(TABLE_START), text.index(TABLE_END)
    write_atomically(TESTING_MD, text[: start + len(TABLE_START)] + "\n" + render_table(records) + "\n" + text[end:])
    write_atomically(SURVIVORS_MD, render_survivors(records))


def publish(keys: list[str], out: Path) -> list[str]:
    RECORDS.mkdir(parents=True, exist_ok=True)
    done = []
    for key in keys:
        source = out / f"{key}.json"
        if not source.exists():
            continue
        target = RECORDS / f"{key}.json"
        committed = json.loads(target.read_text()) if target.exists() else None
        record = compact(relocate(json.loads(source.read_text())), committed)
        write_atomically(target, json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        done.append(key)
    return done


def write_atomically(path: Path, text: str) -> None:
    """A record or a docs page is whole or not written: a run stopped mid-write (SIGTERM, Ctrl-C) leaves
    the previous file, never half of one. Imported here, not at the top: the package must not be in
    ``sys.modules`` before mutmut puts its mutated copy first on the path."""
    from gemma4_t4.foundation.atomic import atomic_write_text

    atomic_write_text(path, text)


def relocate(record: dict) -> dict:
    """Recompute each survivor's file:line from its diff against the module as it is now."""
    source = (REPO / record["path"]).read_text()
    lines, defs = source.splitlines(), function_lines(source)
    for s in record["survivors"]:
        if "diff" in s:
            s["where"] = f"{record['path']}:{mutated_line(lines, defs.get(function_of(s['mutant']), 1), s['diff'])}"
    return record


def summary(records: list[dict], out: Path) -> str:
    rows = [
        "| module | mutants | killed | survived | timeout | no tests | score | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    killed = scored = 0
    for r in records:
        c = r["counts"]
        caught, counted = score(c)
        killed, scored = killed + caught, scored + counted
        rows.append(
            f"| {r['module']} | {r['mutants']} | {c.get('killed', 0)} | {c.get('survived', 0)} | "
            f"{c.get('timeout', 0)} | {c.get('no tests', 0)} | {100.0 * caught / max(counted, 1):.1f} % | "
            f"{r['seconds']} |"
        )
    if scored:
        rows.append(f"| **all** | {sum(r['mutants'] for r in records)} | | | | | {100.0 * killed / scored:.1f} % | |")
    lines = ["# Mutation score", "", *rows, "", "## Survivors", ""]
    for r in records:
        for s in r["survivors"]:
            changed = [d for d in s["diff"].splitlines() if d.startswith("+") and not d.startswith("+++")]
            lines.append(f"- {s['where']} ({s['status']}) `{s['mutant']}`: {' / '.join(c[1:].strip() for c in changed)}")
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"module keys (default: all): {', '.join(MODULES)}")
    parser.add_argument("--batch", choices=list(BATCHES), help="measure one batch of modules (see docs/testing.md)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "mutation")
    parser.add_argument("--report", action="store_true", help="only rebuild OUT/summary.md from OUT's module records")
    parser.add_argument("--only", nargs="+", metavar="MUTANT", help="re-run only these mutant names (one module)")
    parser.add_argument("--publish", action="store_true",
                        help="copy OUT's records of these modules to docs/results/mutation and rewrite the docs")
    parser.add_argument("--docs", action="store_true",
                        help="rewrite docs/testing.md's table and docs/mutation-survivors.md from docs/results/mutation")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = args.out if args.out.is_absolute() else REPO / args.out
    if args.worker:
        return worker(args.worker, args.jobs, out, args.only)
    if args.batch:
        args.modules = [*args.modules, *BATCHES[args.batch]]
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; known: {', '.join(MODULES)}")
    keys = args.modules or list(MODULES)
    if args.publish or args.docs:
        if args.publish:
            print("published:", ", ".join(publish(keys, out)) or "nothing (no records in OUT)")
        write_docs(committed_records())
        print(f"wrote {TESTING_MD.relative_to(REPO)}'s table and {SURVIVORS_MD.relative_to(REPO)}")
        return 0
    if args.report:
        records = [relocate(json.loads((out / f"{k}.json").read_text())) for k in keys if (out / f"{k}.json").exists()]
        print(summary(records, out))
        return 0
    records = []
    started = time.monotonic()
    for key in keys:
        # a fresh work folder per module: its mutated files and recorded test map are per run
        shutil.rmtree(REPO / WORK, ignore_errors=True)
        print(f"== {key}: {MODULES[key].path}", flush=True)
        done = subprocess.run(
            [sys.executable, __file__, "--worker", key, "--jobs", str(args.jobs), "--out", str(out),
             *(["--only", *args.only] if args.only else [])],
            cwd=REPO,
        )
        if done.returncode != 0:
            print(f"mutation run for {key} failed (exit {done.returncode})", file=sys.stderr)
            return done.returncode
        records.append(json.loads((out / f"{key}.json").read_text()))
    print(summary(records, out))
    print(f"total {time.monotonic() - started:.0f} s; per-module records in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
