"""Numbers that count only when they are results: runs that did not complete are "not measured"
everywhere they are consumed; `bench compare` fails when nothing was compared; measured/published
ratios only where the measurement is the published condition's kind."""

from __future__ import annotations

import pytest
from fakes.bench_runs import save_run

from gemma4_t4.bench import published
from gemma4_t4.bench.answers import QUESTIONS, compare_answers
from gemma4_t4.bench.compare import compare_runs
from gemma4_t4.bench.results import BenchRun
from gemma4_t4.bench.schemas import Answer, CellSummary, RunInfo, ServerInfo
from gemma4_t4.cli import main as cli_main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.table import table_cells


def _answers(text: str = "Paris", error: str | None = None) -> list[Answer]:
    return [
        Answer(index=i, question=q, text=text, correct=False, error=error)
        for i, (q, _) in enumerate(QUESTIONS)
    ]


def _answers_run(tmp_path, name: str, status: str = "complete", error: str | None = None) -> BenchRun:
    answers = _answers()
    failed = sum(1 for a in answers if a.error)
    cell = CellSummary(
        cell="answers", workload="answers", concurrency=1, completed=len(answers) - failed, failed=failed,
        answers=answers,
    )  # fmt: skip
    run = BenchRun(
        dir=tmp_path / name,
        run=RunInfo(workload="answers", model="m", status=status, error=error),
        cells=[cell],
    )
    save_run(run)
    return run


def _decode_run(
    tmp_path, name: str, model: str, root: str | None, gpus: list, target: str | None
) -> BenchRun:
    launch = {"config": {"model": root, "target": target}} if target else None
    info = RunInfo(
        workload="decode", model=model, base_url="http://127.0.0.1:8000", status="complete",
        server=ServerInfo(models=[model], root=root, backend="openai-http"),
        environment={"server": {"launch": launch}, "gpus": gpus},
    )  # fmt: skip
    return BenchRun(dir=tmp_path / name, run=info, cells=[])


# ---------------------------------------------------------------- complete runs only


def test_an_aborted_answers_run_is_not_measured_never_0_of_20(tmp_path):
    """Notebook 3 on cpu once saved "identical answers after repack: 0/20" for a dead server."""
    good = _answers_run(tmp_path, "good")
    dead = _answers_run(tmp_path, "dead", status="aborted: server unreachable", error="connection refused")
    result = compare_answers(good, dead)
    assert not result.measured and result.total == 0
    assert (
        result.line().startswith("not measured: B: run ") and "aborted: server unreachable" in result.line()
    )
    assert "connection refused" in result.reason and "0/20" not in result.text()
    same = compare_answers(good, _answers_run(tmp_path, "again"))
    assert same.measured and same.line() == "20/20" and same.all_identical


def test_errored_answers_are_not_measured_even_in_a_complete_list():
    result = compare_answers(_answers(), _answers(text="", error="connect_error"))
    assert not result.measured and "B: 20 of 20 answers failed (first: connect_error)" in result.reason
    assert not compare_answers(_answers(), []).measured  # nothing answered is not "0/0"


def test_compare_refuses_incomplete_runs_and_the_cli_exits_non_zero(tmp_path, capsys):
    good = _answers_run(tmp_path, "good")
    stopped = _answers_run(tmp_path, "stopped", status="interrupted (Ctrl-C)")
    comparison = compare_runs(good, stopped)
    assert comparison.cells == [] and comparison.answers is None
    assert comparison.problems == [f"not measured: B: run {stopped.dir} is interrupted (Ctrl-C)"]
    assert cli_main(["bench", "compare", str(good.dir), str(stopped.dir)]) == 1
    assert "not measured: B: run" in capsys.readouterr().out
    assert cli_main(["bench", "compare", str(good.dir), str(_answers_run(tmp_path, "again").dir)]) == 0


def test_compare_with_no_matching_cells_exits_non_zero(tmp_path, capsys):
    a = BenchRun(
        dir=tmp_path / "a",
        run=RunInfo(status="complete"),
        cells=[CellSummary(cell="x", workload="decode", concurrency=1)],
    )
    b = BenchRun(
        dir=tmp_path / "b",
        run=RunInfo(status="complete"),
        cells=[CellSummary(cell="y", workload="decode", concurrency=4)],
    )
    save_run(a), save_run(b)
    assert cli_main(["bench", "compare", str(a.dir), str(b.dir)]) == 1
    out = capsys.readouterr().out
    assert "nothing compared: no cell of A matches one of B" in out and "['x']" in out and "['y']" in out


def test_compare_plot_names_the_supported_extensions(tmp_path, capsys):
    a = _answers_run(tmp_path, "a")
    assert cli_main(["bench", "compare", str(a.dir), str(a.dir), "--plot", str(tmp_path / "x.txt")]) == 2
    err = capsys.readouterr().err
    assert "x.txt" in err and ".txt is not a plot format" in err and ".png, .svg, .pdf" in err
    assert not (tmp_path / "x.txt").exists()


def test_notebook_helpers_and_tables_refuse_or_flag_an_incomplete_run(tmp_path):
    run = BenchRun(
        dir=tmp_path / "r", run=RunInfo(status="complete with failures"),
        cells=[CellSummary(cell="c1", workload="decode", concurrency=1, completed=3, failed=1)],
    )  # fmt: skip
    assert "complete with failures, 1 request(s) failed" in run.not_measured
    with pytest.raises(Gemma4T4Error, match="not measured: run .* complete with failures") as err:
        run.decode_speed()
    assert err.value.fix
    with pytest.raises(Gemma4T4Error, match="not measured: run .* complete with failures"):
        published.qat_vs_bf16(run, run, "cpu")
    assert "not measured: run" in run.table().splitlines()[0]
    # what an incomplete run got is shown, and its caption says it is no result
    assert "not measured: run" in str(run).splitlines()[0] and "not measured: run" in run._repr_html_()
    done = run.model_copy(update={"run": RunInfo(status="complete")})
    assert done.decode_speed().per_stream == {1: None} and not done.table().startswith("not measured")
    assert "not measured" not in str(done).splitlines()[0]


# ---------------------------------------------------------------- measured vs published: same kind only


def test_a_tiny_cpu_run_gets_no_ratio_against_the_published_t4_row(tmp_path):
    """`make run` on cpu once printed "measured 106.0, published 40.4, measured/published 2.62"."""
    tiny = _decode_run(tmp_path, "tiny", "gemma4-bf16", "/w/models/tiny-gemma4", [], "cpu")
    kind = published.measured_kind(tiny)
    assert kind == published.Kind("tiny", "cpu") and kind.describe() == "a tiny random model on a CPU"
    c1 = published.T4_QAT_VS_BF16_C1
    row = published.beside(
        "per-stream tok/s bf16, c=1", 106.0, c1.baseline_value, c1.source, c1.conditions,
        measured_on=kind, published_on=published.published_kind(c1),
    )  # fmt: skip
    assert row["measured / published"] is None and row["published"] == 40.44 and row["measured here"] == 106.0
    assert "published; not comparable" in row["published under"] and row["measured on"] == kind.describe()
    # the notebooks' report table shows no ratio for it
    columns, cells = table_cells([row])
    assert cells[0][columns.index("measured / published")] == "-"


def test_a_t4_e2b_run_gets_its_ratio_and_an_unrecorded_kind_gets_none(tmp_path):
    t4 = _decode_run(
        tmp_path, "t4", "gemma4", "google/gemma-4-E2B-it", [{"name": "Tesla T4", "compute_cap": "7.5"}], "t4"
    )
    assert published.measured_kind(t4) == published.Kind("E2B", "t4")
    c1 = published.gce_t4("qat")
    row = published.beside("x", 80.0, c1.per_stream_tok_s, c1.source, measured_on=published.measured_kind(t4),
                           published_on=published.published_kind(c1))  # fmt: skip
    assert row["measured / published"] == pytest.approx(80.0 / 72.31)
    l4 = _decode_run(tmp_path, "l4", "gemma4", "google/gemma-4-E2B-it", [{"name": "NVIDIA L4"}], "t4")
    assert published.measured_kind(l4).gpu == "l4"
    other_gpu = published.beside("x", 80.0, 72.31, "s", measured_on=published.measured_kind(l4),
                                 published_on=published.published_kind(c1))  # fmt: skip
    assert other_gpu["measured / published"] is None
    assert published.beside("x", 80.0, 72.31, "s")["measured / published"] is None  # kind not recorded
    remote = _decode_run(tmp_path, "r", "served", None, [], None)
    remote.run.base_url = "http://10.0.0.5:8000"
    assert published.measured_kind(remote) == published.Kind(None, None)
