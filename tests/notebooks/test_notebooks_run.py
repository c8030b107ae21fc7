"""The notebooks, executed for real on the embedded CPU default, as a learner runs them.

* All four, each executed once, from the learner's install: this tree built as a wheel and installed
  into a clean venv outside the checkout with what the install cells and ``setup()`` install on a host
  without a GPU (the ``learner_venv`` fixture, tests/fakes/learner_venv.py), the notebooks being the ones the
  wheel carries. papermill injects the CPU parameters (prepare-only, into a temporary folder), then that
  venv's ``pytest --nbval-lax`` executes every cell of Parts 2-4 in a fresh kernel (one item per cell; any
  error fails); Part 1 runs through that venv's ``gemma4-t4 run`` (the ``make run`` pipeline), whose
  papermill execution fails on any cell's error too. Each notebook's own assertion cells check its
  numbers; here we also check the ``summary.json`` and plots each one wrote.
* The ``make run`` pipeline (papermill execution, HTML export, index) end to end, on synthetic
  notebooks for its failure modes and on one real notebook (Part 1).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from gemma4_t4.pipeline import PARTS, find_notebooks, load_parameters, parameters_for, run_pipeline

REPO = Path(__file__).resolve().parents[2]
NB_DIR = REPO / "notebooks"
WORK = REPO / ".cache" / "tests" / "notebooks-work"  # tiny models are built once and reused


# what each notebook must have measured on the CPU default (published figures are kept apart)
MEASURED = {
    "01": ["deploy seconds", "query latency ms", "estimated $/hour", "MCP tools"],
    "02": ["output tok/s bf16 c=1", "output tok/s QAT c=1", "E2EL ms QAT c=1", "QAT/bf16 output tok/s ratio c=1",
           "QAT/bf16 all-streams ratio c=8"],
    "03": ["weights checked", "emb4 / linear-only size", "AWQ-style g128 levels changed %"],
    "04": ["output tok/s c=1", "E2EL ms c=1", "best output tok/s", "TTFT growth 64->1024 tokens (x)",
           "prefix cache hit rate"],
}
# on the CPU default: a tiny random model's throughput is never a price; a per-stream figure is a
# positive number where vLLM's CPU build streamed its tokens, else the reason (answers in one flush)
NAMED_NOT_MEASURED = {"04": {"$ per Mtok (measured)": "no $/Mtok: "}}
NUMBER_OR_REASON = {
    "02": ["per-stream tok/s bf16 c=1", "per-stream tok/s QAT c=1", "QAT/bf16 ratio c=1"],
    "04": ["per-stream tok/s c=1"],
}


def _real_numbers(results: dict) -> list[str]:
    return [k for k, v in results.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


# the parts the `make run` pipeline executes here; a notebook runs once per module, so nbval skips them
PIPELINE_PARTS = ["01"]


def _namespace(value):
    """`gemma4-t4 run --json`'s report with attribute access, as the in-process report has it."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: v if k == "summary" else _namespace(v) for k, v in value.items()})
    return [_namespace(v) for v in value] if isinstance(value, list) else value


@pytest.fixture(scope="module")
def installed_notebooks(learner_venv, tmp_path_factory) -> Path:
    """The notebooks folder the learner's wheel installed (with its params/)."""
    shown = learner_venv.run("python", "-c", "from gemma4_t4.pipeline import NOTEBOOKS_DIR; print(NOTEBOOKS_DIR)",
                             cwd=tmp_path_factory.mktemp("where"))
    assert shown.returncode == 0, shown.stderr
    folder = Path(shown.stdout.strip())
    assert str(learner_venv.root) in str(folder.resolve()), f"notebooks not from the learner's venv: {folder}"
    return folder


@pytest.fixture(scope="module")
def part1_pipeline(learner_venv, tmp_path_factory):
    """`make run`'s code path on one real notebook, Part 1 (moto + MCP + the tiny vLLM server), run as
    the learner's `gemma4-t4 run` from a folder outside the checkout: its only execution in this module,
    checked below both as a pipeline run and as one of the four (set up by its first user, so its time
    and nbval's each have their own test timeout)."""
    root = tmp_path_factory.mktemp("pipeline")
    started = time.monotonic()
    done = learner_venv.run("gemma4-t4", "run", "--target", "cpu", *(a for p in PIPELINE_PARTS for a in ("--only", p)),
                            "--out", str(root / "build"), "--json", cwd=root, timeout=3000)
    print(f"\n[learner venv] gemma4-t4 run --only 01: {time.monotonic() - started:.0f} s")
    assert done.stdout.strip(), f"gemma4-t4 run printed nothing (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return _namespace(json.loads(done.stdout))


@pytest.fixture(scope="module")
def nbval_run(learner_venv, installed_notebooks, tmp_path_factory):
    """Prepare the other notebooks with the CPU parameters and execute them under the learner venv's nbval."""
    import papermill

    root = tmp_path_factory.mktemp("nbval")
    prepared, outs = root / "notebooks", root / "out"
    prepared.mkdir()
    params = load_parameters("cpu", installed_notebooks / "params")
    found = find_notebooks(installed_notebooks)
    out_dirs: dict[str, Path] = {}
    for number, source in found.items():
        assert source is not None, f"notebook for part {number} is missing"
        if number in PIPELINE_PARTS:
            continue
        out_dir = out_dirs[number] = outs / source.stem
        papermill.execute_notebook(str(source), str(prepared / source.name), prepare_only=True,
                                   parameters=parameters_for(source, "cpu", out_dir, WORK, params),
                                   kernel_name="python3", progress_bar=False)
    env = dict(learner_venv.env, PYTHONUNBUFFERED="1")
    command = [str(learner_venv.bin / "python"), "-m", "pytest", "--nbval-lax", "--nbval-current-env",
               "--nbval-cell-timeout=900", "-p", "no:cacheprovider", "-q", "-rA", "--rootdir", str(prepared),
               str(prepared)]
    started = time.monotonic()
    result = subprocess.run(command, cwd=prepared, env=env, capture_output=True, text=True, timeout=3000)
    print(f"\n[learner venv] nbval on parts 02-04: {time.monotonic() - started:.0f} s")
    return {"result": result, "out_dirs": out_dirs, "found": found}


@pytest.mark.notebooks
@pytest.mark.slow
@pytest.mark.vllm
# the first user sets the fixture up: three notebooks under nbval took 900+ s on a 2-core machine
# busy with other work (the suite's 900 s default); nbval's own subprocess limit is 3000 s
@pytest.mark.timeout(3100)
def test_all_notebooks_pass_nbval(nbval_run):
    result = nbval_run["result"]
    tail = (result.stdout + result.stderr)[-8000:]
    assert result.returncode == 0, f"nbval failed (exit {result.returncode}):\n{tail}"
    assert " passed" in result.stdout and " failed" not in result.stdout, tail


@pytest.mark.notebooks
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("number", list(PARTS))
def test_each_notebook_wrote_real_results_and_plots(nbval_run, part1_pipeline, number):
    source = nbval_run["found"][number]
    out_dirs = nbval_run["out_dirs"] | {run.number: Path(run.out_dir) for run in part1_pipeline.runs if run.out_dir}
    out_dir = out_dirs[number]
    summary_path = out_dir / "summary.json"
    assert summary_path.exists(), f"{source.name} wrote no summary.json (nbval output tail:\n" \
                                  f"{nbval_run['result'].stdout[-3000:]})"
    summary = json.loads(summary_path.read_text())
    assert summary["part"] == int(number)
    results = summary["results"]
    assert not [k for k in results if "published" in k.lower()], "published figures among measured results"
    missing = [k for k in MEASURED[number] if k not in _real_numbers(results) or results[k] <= 0]
    assert not missing, f"measured figures missing or not positive: {missing} in {results}"
    named = {k: results.get(k) for k, start in NAMED_NOT_MEASURED.get(number, {}).items()
             if not str(results.get(k)).startswith(start)}
    assert not named, f"shown as figures on the CPU default: {named}"
    bad = {k: results.get(k) for k in NUMBER_OR_REASON.get(number, [])
           if not (k in _real_numbers(results) and results[k] > 0) and not str(results.get(k)).startswith("not measured: ")}
    assert not bad, f"neither a figure nor the reason there is none: {bad}"
    assert results["target"] == "cpu"
    assert list(out_dir.rglob("*.png")), f"{source.name} saved no plot"
    SERVED_CHECKS.get(number, lambda _out, _results: None)(out_dir, results)


def _served_int4_repack(out_dir: Path, results: dict) -> None:
    """Part 3 served the linear int4 repack (compressed-tensors) on the real vLLM CPU server and got
    every fixed question answered, as it served the QAT source: the CPU build's int4 serving path. Where
    that build has no int4 kernels (AVX2-only) the part says so instead of a count."""
    from gemma4_t4.bench.results import load_run
    from gemma4_t4.host import cpuisa

    build = cpuisa.cpu_build()  # the probe the notebook's repack_to_serve reads
    if build.int4_refused:
        assert results["identical answers after repack"].startswith(f"not measured: {build.int4_missing}"), results
        return
    for label, folder in (("qat", "tiny-gemma4-qat"), ("repack", "repack-linear")):
        run = load_run(out_dir / f"answers-{label}")
        assert run.run.status == "complete" and Path(run.run.server.root).name == folder, (label, run.run.server)
        assert (run.cells[0].completed, run.cells[0].failed) == (20, 0), label
        assert len(run.answers()) == 20 and all(a.error is None for a in run.answers()), label
    assert re.fullmatch(r"\d+/20", results["identical answers after repack"]), results


def _served_the_tiny_assistant(out_dir: Path, results: dict) -> None:
    """Part 4's drafter step ran vLLM's speculative decoding with the tiny assistant (MTP) on the real
    CPU server: the drafter-on answers carry vLLM's own spec-decode counters, consistent with each other;
    the drafter-off ones have none."""
    from gemma4_t4.bench.results import load_run

    drafter = out_dir / "drafter"
    assert load_run(drafter / "answers-off").cells[0].spec_decode is None  # no drafter: no counters
    on = load_run(drafter / "answers-on")
    assert (on.cells[0].completed, on.cells[0].failed) == (20, 0)
    spec = on.cells[0].spec_decode
    assert spec is not None and spec.source == "/metrics" and spec.drafts > 0, spec
    per_draft = spec.draft_tokens / spec.drafts  # draft tokens per verification step: a whole number
    assert per_draft == int(per_draft) >= 1 and len(spec.per_position_acceptance) == per_draft, spec
    assert 0.0 <= spec.acceptance_rate <= 1.0
    assert spec.mean_accepted_length == pytest.approx(1 + spec.accepted_tokens / spec.drafts)
    assert re.fullmatch(r"\d+/20", results["identical answers, drafter on vs off"]), results


# what each part served on the real vLLM CPU server, checked from its own records
SERVED_CHECKS = {"03": _served_int4_repack, "04": _served_the_tiny_assistant}


# ---------------------------------------------------------------- the pipeline itself


def _synthetic(path: Path, *cells: str) -> None:
    nb = new_notebook(cells=[new_markdown_cell("# synthetic")] + [new_code_cell(c) for c in cells])
    nb.cells[1].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


PARAMS = 'TARGET = "cpu"\nOUT_DIR = "out"\nWORK_DIR = "work"\nCLEANUP = True\nVALUE = 1.0'
SAVE = ("from gemma4_t4 import notebook as nb\n"
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(); ax.plot([1, 2], [VALUE, 2 * VALUE])\n"
        "nb.show_figure(fig, f'{OUT_DIR}/line.png')\n"
        "nb.save_summary(OUT_DIR, part=int(__import__('os').path.basename(OUT_DIR)[:2]), "
        "results={'value': VALUE, 'target': TARGET})")


@pytest.mark.notebooks
def test_pipeline_reports_ok_failed_and_missing_notebooks(tmp_path):
    notebooks, params = tmp_path / "notebooks", tmp_path / "params"
    notebooks.mkdir()
    params.mkdir()
    (params / "cpu.yaml").write_text("all:\n  TARGET: cpu\n'01':\n  VALUE: 3.5\n")
    _synthetic(notebooks / "01_good.ipynb", PARAMS, SAVE)
    _synthetic(notebooks / "02_broken.ipynb", PARAMS, "raise RuntimeError('boom in cell')")
    _synthetic(notebooks / "04_no_summary.ipynb", PARAMS, "x = 1")
    logs: list[str] = []
    report = run_pipeline("cpu", tmp_path / "build", notebooks_dir=notebooks, params_dir=params,
                          work_dir=tmp_path / "work", progress=False, log=logs.append)

    by_part = {r.number: r for r in report.runs}
    assert by_part["01"].status == "ok", by_part["01"].error
    assert by_part["01"].summary["results"] == {"value": 3.5, "target": "cpu"}  # yaml beat the default
    assert by_part["01"].plots == ["notebooks/01_good/line.png"]
    assert Path(by_part["01"].html).read_text().count("<html") == 1
    assert by_part["02"].status == "failed" and "boom in cell" in by_part["02"].error
    assert by_part["03"].status == "missing"
    assert by_part["04"].status == "failed" and "summary.json" in by_part["04"].error
    assert not report.ok and report.missing == ["03"] and report.failed == ["02", "04"]
    index = Path(report.index_md).read_text()
    assert "SOME NOTEBOOKS DID NOT RUN" in index and "Missing" in index and "boom in cell" in index
    assert "<table>" in Path(report.index_html).read_text()
    assert any("MISSING" in line for line in logs)


@pytest.mark.notebooks
def test_pipeline_skips_parts_a_target_does_not_run_and_says_why(tmp_path):
    notebooks, params = tmp_path / "notebooks", tmp_path / "params"
    notebooks.mkdir()
    params.mkdir()
    (params / "sagemaker.yaml").write_text(
        "all:\n  TARGET: sagemaker\n'02':\n  _skip: needs a local GPU\n'03':\n  _skip: x\n'04':\n  _skip: y\n")
    _synthetic(notebooks / "01_good.ipynb", PARAMS, SAVE)
    for name in ("02_gpu_only", "03_gpu_only", "04_gpu_only"):
        _synthetic(notebooks / f"{name}.ipynb", PARAMS, "raise RuntimeError('must not run')")
    report = run_pipeline("sagemaker", tmp_path / "build", notebooks_dir=notebooks, params_dir=params,
                          work_dir=tmp_path / "work", progress=False, export_html=False, log=lambda _m: None)
    by_part = {r.number: r for r in report.runs}
    assert by_part["01"].status == "ok" and by_part["01"].summary["results"]["target"] == "sagemaker"
    assert by_part["02"].status == "skipped" and by_part["02"].error == "needs a local GPU"
    assert report.ok  # skipped by declaration, not by failure
    assert "Skipped for TARGET=sagemaker: needs a local GPU" in Path(report.index_md).read_text()


@pytest.mark.notebooks
def test_cli_run_exits_nonzero_when_notebooks_are_missing(tmp_path):
    """`gemma4-t4 run` on a checkout without notebooks must fail loudly, never succeed."""
    notebooks = tmp_path / "notebooks"
    (notebooks / "params").mkdir(parents=True)
    (notebooks / "params" / "cpu.yaml").write_text("all:\n  TARGET: cpu\n")
    command = [sys.executable, "-m", "gemma4_t4", "run", "--notebooks", str(notebooks),
               "--out", str(tmp_path / "build"), "--no-html"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "missing notebooks: 01, 02, 03, 04" in result.stdout
    assert (tmp_path / "build" / "index.md").exists()


@pytest.mark.notebooks
@pytest.mark.slow
def test_pipeline_executes_a_real_notebook_with_html_and_index(part1_pipeline):
    """`make run`'s code path on one real notebook, Part 1 (the ``part1_pipeline`` run)."""
    report = part1_pipeline
    (run,) = report.runs
    assert run.status == "ok", run.error
    executed = nbformat.read(run.executed, as_version=4)
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    assert executed.metadata["papermill"]["parameters"]["TARGET"] == "cpu"
    assert Path(run.html).stat().st_size > 10_000
    assert run.plots and _real_numbers(run.summary["results"])
    assert "all notebooks ran" in Path(report.index_md).read_text()


# ---------------------------------------------------------------- bad input to `gemma4-t4 run`


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gemma4_t4", "run", *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))


def _one_notebook_checkout(tmp_path: Path, params_text: str) -> Path:
    notebooks = tmp_path / "notebooks"
    (notebooks / "params").mkdir(parents=True)
    (notebooks / "params" / "cpu.yaml").write_text(params_text)
    _synthetic(notebooks / "01_good.ipynb", PARAMS, SAVE)
    return notebooks


@pytest.mark.notebooks
def test_target_flag_is_never_silently_overridden_by_a_params_file(tmp_path):
    notebooks = _one_notebook_checkout(tmp_path, "all:\n  TARGET: t4\n")
    result = _cli("--target", "cpu", "--notebooks", str(notebooks), "--out", str(tmp_path / "build"), "--no-html")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "set TARGET='t4', but TARGET='cpu' was asked for" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "build" / "notebooks").exists()
    # a section naming the same target is fine, and TARGET reaches the notebook as asked
    params = {"all": {"TARGET": "cpu"}}
    values = parameters_for(notebooks / "01_good.ipynb", "cpu", tmp_path, tmp_path, params)
    assert values["TARGET"] == "cpu"


@pytest.mark.notebooks
def test_yaml_syntax_error_and_an_out_that_is_a_file_are_one_line_errors(tmp_path):
    notebooks = _one_notebook_checkout(tmp_path, "all:\n  TARGET: cpu\n  CLEANUP: [true\n")
    result = _cli("--target", "cpu", "--notebooks", str(notebooks), "--out", str(tmp_path / "build"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert "cpu.yaml is not valid YAML at line" in line

    notebooks = _one_notebook_checkout(tmp_path / "ok", "all:\n  TARGET: cpu\n")
    a_file = tmp_path / "results.txt"
    a_file.write_text("keep me")
    for out in (a_file, a_file / "sub"):
        result = _cli("--target", "cpu", "--notebooks", str(notebooks), "--out", str(out))
        assert result.returncode == 2 and "is a file, not a folder" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert a_file.read_text() == "keep me"


@pytest.mark.notebooks
def test_missing_notebooks_folder_names_the_flag(tmp_path):
    result = _cli("--target", "cpu", "--notebooks", str(tmp_path / "nowhere"), "--out", str(tmp_path / "b"))
    assert result.returncode == 2 and "--notebooks DIR" in result.stderr and "Traceback" not in result.stderr


def test_auto_target_follows_the_host():
    from gemma4_t4.host import env
    from gemma4_t4.pipeline import resolve_target

    t4 = env.Probes(run=lambda cmd: (0, "0, Tesla T4, 15360, 7.5, 550.54.15\n"))
    assert resolve_target("auto", t4)[0] == "t4"
    assert resolve_target("auto", env.Probes(run=lambda cmd: None)) == (
        "cpu", "TARGET='auto': no NVIDIA GPU found (nvidia-smi lists none), so the embedded CPU default "
        "(params/cpu.yaml)")
    assert resolve_target("sagemaker", t4)[0] == "sagemaker"


def test_index_html_comes_from_a_markdown_library():
    from gemma4_t4.pipeline import _markdown_to_html

    page = _markdown_to_html("# T\n\n| a | b |\n|---|---|\n| 1 \\| 2 | <x> |\n\n- **bold** [l](x.html)\n", "t")
    assert "<h1>T</h1>" in page and "<table>" in page and "<td>1 | 2</td>" in page
    assert "&lt;x&gt;" in page and "<strong>bold</strong>" in page and '<a href="x.html">l</a>' in page


# ---------------------------------------------------------------- `gemma4-t4 run` killed while a notebook serves


def _serving_checkout(tmp_path: Path, fake_vllm: Path, model_dir: Path) -> tuple[Path, Path, Path]:
    """One notebook whose kernel starts a (FAKE) vLLM server through Endpoint, says where, and waits."""
    notebooks, work, told = tmp_path / "notebooks", tmp_path / "vllm", tmp_path / "serving.json"
    (notebooks / "params").mkdir(parents=True)
    (notebooks / "params" / "cpu.yaml").write_text("all:\n  TARGET: cpu\n")
    serve = (
        "import json, os, pathlib, time\n"
        "from gemma4_t4.venues.endpoint import Endpoint\n"
        "from gemma4_t4.serving.server_config import ServerConfig\n"
        "from gemma4_t4.serving.server_state import free_port\n"
        f"config = ServerConfig(model={str(model_dir)!r}, target='cpu', port=free_port(), work_dir={str(work)!r},"
        f" python={str(fake_vllm)!r}, extra_env={{'FAKE_VLLM_MODE': 'serve'}}, probe_cpu_attention=False)\n"
        "endpoint = Endpoint.local(config, quiet=True)\n"
        f"pathlib.Path({str(told)!r}).write_text(json.dumps({{'port': config.port, 'kernel': os.getpid()}}))\n"
        "time.sleep(300)\n"
    )
    _synthetic(notebooks / "01_serving.ipynb", PARAMS, serve)
    return notebooks, work, told


@pytest.mark.notebooks
@pytest.mark.parametrize("kill", ["SIGTERM to gemma4-t4 run", "SIGKILL of the kernel"])
def test_run_killed_while_a_notebook_serves_leaves_no_server_and_status_tells_the_truth(
    tmp_path, fake_vllm, model_dir, kill
):
    import json
    import signal
    import time

    import psutil

    from gemma4_t4.serving.server import VLLMServer
    from gemma4_t4.serving.server_state import pid_alive

    notebooks, work, told = _serving_checkout(tmp_path, fake_vllm, model_dir)
    env = dict(os.environ, PYTHONPATH=str(REPO), GEMMA4_T4_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.Popen([sys.executable, "-m", "gemma4_t4", "run", "--notebooks", str(notebooks),
                            "--out", str(tmp_path / "build"), "--no-html"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not told.exists() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.2)
        assert told.exists(), run.stderr.read() if run.poll() is not None else "the notebook never served"
        serving = json.loads(told.read_text())
        server = VLLMServer.attach(serving["port"], work)
        assert server.status().state == "running"
        supervisor = server.pid
        if kill.startswith("SIGTERM"):
            run.send_signal(signal.SIGTERM)
        else:
            psutil.Process(serving["kernel"]).kill()
        run.wait(120)
        assert "Traceback" not in run.stderr.read()  # the kernel's own shutdown noise goes to its log
        assert (tmp_path / "build" / "notebooks" / "01_serving" / "kernel.log").exists()
        deadline = time.monotonic() + 30
        while pid_alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pid_alive(supervisor) and not pid_alive(serving["kernel"])
        # the next command: serve status says what is true, and nothing of this server runs
        status = subprocess.run([sys.executable, "-m", "gemma4_t4", "serve", "status", "--port", str(serving["port"]),
                                 "--work-dir", str(work)], capture_output=True, text=True, timeout=120, env=env)
        assert status.returncode == 0 and status.stdout.startswith("stopped"), status.stdout + status.stderr
        leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(fake_vllm) in " ".join(p.info["cmdline"] or [])]
        assert leftovers == []
    finally:
        run.kill()
        with contextlib.suppress(Exception):
            VLLMServer.attach(work_dir=work).stop(grace=2)
