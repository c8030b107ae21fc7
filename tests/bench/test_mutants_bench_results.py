"""What a reader of a results directory sees, pinned figure by figure: the run's own table and
accessors (bench/results.py), `bench compare` of two runs and of two suites (bench/compare.py), and
the published figures set beside measured ones (bench/published.py). Every run here is written
in-process to a temporary folder with known request timings, so each printed figure is known."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest
from fakes.bench_runs import save_run

from gemma4_t4.bench.compare import compare_runs
from gemma4_t4.bench.metrics import aggregate
from gemma4_t4.bench.results import (
    RECORDS_FILE,
    RUN_FILE,
    SUMMARY_FILE,
    BenchRun,
    ResultsWriter,
    cells_to_csv,
    check_out_dir,
    load_run,
    read_records,
)
from gemma4_t4.bench.schemas import (
    CellSummary,
    OpenLoopInfo,
    PrefixCache,
    RequestRecord,
    RunInfo,
    SpecDecode,
)
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.safepaths import MARKER_NAME

# ---------------------------------------------------------------- runs with known timings


def _record(
    i: int, *, n: int = 8, gap: float = 0.02, ttft: float = 0.1, flush: bool = False, error: str | None = None
) -> RequestRecord:
    """One request sent at 0 s: first token at ``ttft`` s, then one token every ``gap`` s (TPOT =
    gap), or all ``n`` tokens in one chunk (a flush); ends 1 ms after its last token."""
    first = ttft
    chunks = [first + 0.5] if flush else [first + k * gap for k in range(n)]
    if error:
        return RequestRecord(request_id=f"r-{i}", send_s=0.0, end_s=0.05, error=error, error_detail="boom")
    return RequestRecord(
        request_id=f"r-{i}", send_s=0.0, first_chunk_s=chunks[0], first_token_s=chunks[0],
        first_content_s=chunks[0], last_choice_s=chunks[-1], end_s=chunks[-1] + 0.001, chunk_times_s=chunks,
        completion_tokens=n, prompt_tokens=16, token_source="usage",
    )  # fmt: skip


def _cell(name: str, records: list[RequestRecord], **facts) -> CellSummary:
    facts = {"workload": "decode", "concurrency": 1, "input_len": 16, "output_len": 8} | facts
    return CellSummary(cell=name, **facts, **aggregate(records).model_dump())


def _write(
    path: Path,
    cells: list[tuple[CellSummary, list[RequestRecord]]],
    *,
    status: str = "complete",
    error: str | None = None,
    **info,
) -> BenchRun:
    """A run directory as `bench run` leaves it: records appended, cells and status written."""
    info = {"workload": "decode", "model": "gemma4"} | info
    writer = ResultsWriter(path, RunInfo(**info))
    for cell, records in cells:
        writer.add_record(cell.cell, "warmup", _record(99, gap=0.5))  # never measured
        for record in records:
            writer.add_record(cell.cell, "measure", record)
        writer.add_cell(cell)
    writer.update_run(status=status, error=error)
    writer.close()
    return load_run(path)


def _decode(path: Path, gap: float = 0.02, flush: bool = False, concurrency: int = 1, **info) -> BenchRun:
    records = [_record(i, gap=gap, flush=flush) for i in range(4)]
    return _write(
        path, [(_cell(f"decode-c{concurrency}", records, concurrency=concurrency), records)], **info
    )


# ---------------------------------------------------------------- results.py: --out


def test_out_is_refused_when_it_is_a_link_or_a_file_naming_which(tmp_path):
    """`bench run --out` on a file or a symbolic link stops before measuring, saying which it is."""
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    os.symlink(tmp_path / "d", tmp_path / "link")
    with pytest.raises(Gemma4T4Error, match="is a file, not a directory") as file_error:
        check_out_dir(tmp_path / "f", overwrite=True)
    assert file_error.value.fix == "choose a directory path for --out (it is created if missing)"
    with pytest.raises(Gemma4T4Error, match="is a symbolic link"):
        check_out_dir(tmp_path / "link", overwrite=True)


def test_a_new_or_empty_out_is_taken_and_a_run_folder_needs_overwrite(tmp_path):
    """A missing or empty folder is used as is; one holding a run is replaced only with --overwrite."""
    assert check_out_dir(tmp_path / "new", overwrite=False) == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    assert check_out_dir(str(tmp_path / "empty"), overwrite=False) == tmp_path / "empty"
    run = _decode(tmp_path / "run")
    with pytest.raises(Gemma4T4Error) as held:
        check_out_dir(run.dir, overwrite=False)
    assert held.value.message == f"--out {run.dir} already holds benchmark results"
    assert held.value.fix == "choose a new --out directory (or pass --overwrite to replace a bench run)"
    assert check_out_dir(run.dir, overwrite=True) == run.dir
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(Gemma4T4Error, match=r"--out .*mine is not empty"):
        check_out_dir(tmp_path / "mine", overwrite=False)
    with pytest.raises(Gemma4T4Error) as foreign:
        check_out_dir(tmp_path / "mine", overwrite=True)
    assert foreign.value.message == (
        f"--out {tmp_path / 'mine'} holds files the bench did not write (no {MARKER_NAME}; no results), "
        "so --overwrite will not write into it"
    )
    assert foreign.value.fix == "choose a new --out directory"
    # results an older version wrote (no marker yet) are still the bench's own
    (run.dir / MARKER_NAME).unlink()
    with pytest.raises(Gemma4T4Error, match="already holds benchmark results"):
        check_out_dir(run.dir, overwrite=False)
    assert check_out_dir(run.dir, overwrite=True) == run.dir


def test_the_writer_replaces_only_its_own_files_and_marks_the_folder(tmp_path):
    """Re-running into a bench folder with --overwrite removes the old run's files, keeps a user's;
    the new run is "running" in the current format, whatever the info it was started from said."""
    first = _decode(tmp_path / "r")
    (first.dir / "mine.txt").write_text("keep")
    (first.dir / "roofline.png").write_text("old plot")
    old = RunInfo(workload="decode", status="complete", schema_id="gemma4_t4.bench/0")
    writer = ResultsWriter(first.dir, old, overwrite=True)
    try:
        assert (first.dir / MARKER_NAME).is_file() and (first.dir / "mine.txt").read_text() == "keep"
        assert not (first.dir / "roofline.png").exists() and not (first.dir / SUMMARY_FILE).exists()
        assert (first.dir / RECORDS_FILE).read_text() == ""
        run = json.loads((first.dir / RUN_FILE).read_text())
        assert run["status"] == "running" and run["schema"] == RunInfo().schema_id
        assert writer.result().run.status == "running"
        assert json.loads((first.dir / MARKER_NAME).read_text())["command"] == "bench run"
    finally:
        writer.close()
    writer.close()  # closing twice is harmless
    with pytest.raises(ValueError):  # a finished run's records are final
        writer.add_record("decode-c1", "measure", _record(9))


@pytest.mark.skipif(
    not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no folder can be made"
)
def test_a_folder_that_cannot_be_created_is_one_error_naming_it():
    """An --out where no folder can be made fails with the OS's reason, not a traceback."""
    with pytest.raises(Gemma4T4Error) as error:
        ResultsWriter("/proc/gemma4-t4-out", RunInfo())
    assert error.value.message == "cannot create /proc/gemma4-t4-out: No such file or directory"
    assert error.value.fix == "choose a writable --out directory"


def test_an_out_under_a_file_is_one_error_and_the_file_stays(tmp_path):
    """No folder can be made under a file: the error names the path and nothing is removed."""
    (tmp_path / "f").write_text("mine")
    with pytest.raises(Gemma4T4Error) as error:
        ResultsWriter(tmp_path / "f" / "run", RunInfo())
    assert error.value.message == f"cannot create {tmp_path / 'f' / 'run'}: Not a directory"
    assert error.value.fix == "choose a writable --out directory"
    assert (tmp_path / "f").read_text() == "mine"


# ---------------------------------------------------------------- results.py: what is written


def test_records_are_written_one_line_each_and_only_measured_ones_are_read_back(tmp_path):
    """records.jsonl holds warm-up and measured requests; a cell's figures come from the measured."""
    run = _decode(tmp_path / "r")
    lines = [json.loads(x) for x in (run.dir / RECORDS_FILE).read_text().splitlines()]
    assert [(x["cell"], x["phase"]) for x in lines] == [("decode-c1", "warmup")] + [
        ("decode-c1", "measure")
    ] * 4
    assert lines[1]["request_id"] == "r-0" and lines[1]["completion_tokens"] == 8
    assert len(run.records) == 5 and [r.request_id for r in run.measured("decode-c1")] == [
        f"r-{i}" for i in range(4)
    ]
    assert run.measured("other") == []


def test_a_torn_last_line_is_skipped_and_a_missing_records_file_reads_empty(tmp_path):
    run = _decode(tmp_path / "r")
    path = run.dir / RECORDS_FILE
    path.write_text(path.read_text() + '{"cell": "decode-c1", "phase": "meas')
    assert len(read_records(path)) == 5
    path.write_text("\n" + path.read_text())
    assert len(read_records(path)) == 5
    assert read_records(tmp_path / "none.jsonl") == []


def test_a_cell_written_twice_keeps_its_last_summary_once(tmp_path):
    records = [_record(i) for i in range(2)]
    writer = ResultsWriter(tmp_path / "r", RunInfo(workload="decode"))
    writer.add_cell(_cell("a", records))
    writer.add_cell(_cell("b", records))
    writer.add_cell(_cell("a", records, output_len=9))
    writer.close()
    assert [(c.cell, c.output_len) for c in writer.result().cells] == [("b", 8), ("a", 9)]
    summary = json.loads((tmp_path / "r" / SUMMARY_FILE).read_text())
    assert [c["cell"] for c in summary["cells"]] == ["b", "a"] and summary["run"]["status"] == "running"
    assert writer.result().dir == tmp_path / "r" and writer.result().status == "running"


def test_update_run_rewrites_run_json_and_the_summarys_digest(tmp_path):
    writer = ResultsWriter(tmp_path / "r", RunInfo(workload="decode", model="m"))
    writer.update_run(status="aborted: KeyboardInterrupt", error="stopped")
    writer.close()
    run = json.loads((tmp_path / "r" / RUN_FILE).read_text())
    assert (run["status"], run["error"], run["model"]) == ("aborted: KeyboardInterrupt", "stopped", "m")
    assert (
        json.loads((tmp_path / "r" / SUMMARY_FILE).read_text())["run"]["status"]
        == "aborted: KeyboardInterrupt"
    )


def test_the_csv_has_one_row_per_cell_with_blanks_for_what_was_not_measured(tmp_path):
    """summary.csv: the scalars, the open-loop rate and prefix hit rate, then each latency statistic."""
    records = [_record(i) for i in range(4)]
    closed = _cell("c1", records, prefix_cache=PrefixCache(hit_rate=0.25))
    open_loop = _cell("r2", records, concurrency=None,
                      open_loop=OpenLoopInfo(offered_rate_rps=2.0, max_in_flight=64))  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(cells_to_csv([closed, open_loop]))))
    assert [r["cell"] for r in rows] == ["c1", "r2"]
    assert rows[0]["prefix_cache_hit_rate"] == "0.25" and rows[0]["offered_rate_rps"] == ""
    assert (
        rows[1]["offered_rate_rps"] == "2.0"
        and rows[1]["concurrency"] == ""
        and rows[1]["prefix_cache_hit_rate"] == ""
    )
    assert float(rows[0]["tpot_ms_median"]) == pytest.approx(20.0) and rows[0]["completed"] == "4"
    assert float(rows[0]["per_stream_tok_s_median"]) == pytest.approx(50.0)
    assert rows[0]["itl_ms_ci_low"] == "" and rows[0]["partial"] == "False"
    header = next(csv.reader(io.StringIO(cells_to_csv([]))))
    assert header[:3] == ["cell", "workload", "variant"] and header[-1] == "per_stream_tok_s_ci_high"
    assert "ttft_ms_p99" in header and len(header) == 16 + 6 * 6
    run = _decode(tmp_path / "r")
    assert (run.dir / "summary.csv").read_bytes().decode() == cells_to_csv(run.cells)


# ---------------------------------------------------------------- results.py: loading and saving


def test_a_folder_without_summary_json_is_refused_naming_it(tmp_path):
    with pytest.raises(Gemma4T4Error, match=r"holds no summary.json") as error:
        BenchRun.load(tmp_path)
    assert error.value.fix == "pass a directory written by gemma4-t4 bench run"


def test_a_run_without_run_json_is_read_from_the_summarys_digest(tmp_path):
    run = _decode(tmp_path / "r", label="my label")
    (run.dir / RUN_FILE).unlink()
    again = load_run(run.dir)
    assert again.run.status == "complete" and again.run.label == "my label" and len(again.cells) == 1


def test_save_writes_the_run_to_another_folder_too(tmp_path):
    run = _decode(tmp_path / "r")
    out = save_run(run, tmp_path / "copy" / "deeper")
    assert out == tmp_path / "copy" / "deeper"
    copy = load_run(out)
    assert copy.run.run_id == run.run.run_id and [c.cell for c in copy.cells] == ["decode-c1"]
    assert (out / "summary.csv").is_file() and save_run(run) == run.dir


# ---------------------------------------------------------------- results.py: complete or not


def test_a_complete_run_is_a_result_and_an_incomplete_one_says_why(tmp_path):
    ok = _decode(tmp_path / "ok")
    assert ok.ok and ok.not_measured is None and ok.require_complete() is ok and ok.status == "complete"
    stopped = _decode(tmp_path / "stopped", status="aborted: server unreachable", error="connection refused")
    assert not stopped.ok
    assert stopped.not_measured == f"run {stopped.dir} is aborted: server unreachable: connection refused"
    with pytest.raises(Gemma4T4Error) as error:
        stopped.require_complete("a decode speed")
    assert error.value.message == (
        f"not measured: run {stopped.dir} is aborted: server unreachable: connection refused, "
        "so it gives no a decode speed"
    )
    assert error.value.fix == (
        "read the run's error (run.json), fix the server or endpoint, and run the benchmark again"
    )


def test_a_run_with_failed_requests_counts_them_and_repeats_no_error_already_in_its_status(tmp_path):
    records = [_record(0), _record(1, error="timeout"), _record(2, error="timeout")]
    cells = [(_cell("a", records), records), (_cell("b", records[1:]), records[1:])]
    run = _write(tmp_path / "r", cells, status="complete with failures", error="complete with failures")
    assert run.failed == 4
    assert run.not_measured == f"run {run.dir} is complete with failures, 4 request(s) failed"
    blank = _write(tmp_path / "b", [], status="")
    assert blank.not_measured == f"run {blank.dir} is unknown status"


def test_captions_and_tables_of_an_incomplete_run_say_it_is_no_result(tmp_path):
    ok = _decode(tmp_path / "ok", label="bf16 c=1", base_url="http://10.0.0.5:8000")
    assert ok.caption() == "bf16 c=1 on http://10.0.0.5:8000"
    assert ok.table() == str(ok) and ok.report().table == ok.table()
    stopped = _decode(tmp_path / "s", status="aborted: x")
    assert stopped.caption() == f"decode: not measured: run {stopped.dir} is aborted: x"
    assert stopped.table().startswith(f"decode: not measured: run {stopped.dir} is aborted: x\n")
    report = stopped.report()
    assert (report.status, report.out_dir, report.failed) == ("aborted: x", str(stopped.dir), 0)
    assert report.cells == stopped.cells and report.run == stopped.run
    nameless = _write(tmp_path / "n", [], workload=None)
    assert nameless.caption() == "run"


# ---------------------------------------------------------------- results.py: accessors


def _sweep(tmp_path: Path) -> BenchRun:
    """c=1 and c=8 decode, a load cell, ttft cells, an open-loop decode cell, a shared-prefix cell."""
    fast, slow = [_record(i, gap=0.01) for i in range(4)], [_record(i, gap=0.04) for i in range(4)]
    return _write(tmp_path / "sweep", [
        (_cell("decode-c1", fast), fast),
        (_cell("decode-c8", slow, concurrency=8), slow),
        (_cell("load-c16", slow, workload="load", concurrency=16), slow),
        (_cell("ttft-512", fast, workload="ttft", input_len=512), fast),
        (_cell("ttft-0", fast, workload="ttft", input_len=0), fast),
        (_cell("decode-2rps", fast, concurrency=None, open_loop=OpenLoopInfo(offered_rate_rps=2.0, max_in_flight=8)),
         fast),
        (_cell("prefix", slow, workload="prefix", variant="shared_prefix",
               prefix_cache=PrefixCache(hit_rate=0.75)), slow),
    ])  # fmt: skip


def test_the_decode_accessors_read_each_concurrency(tmp_path):
    run = _sweep(tmp_path)
    per_stream = run.per_stream_by_concurrency()
    assert sorted(per_stream) == [1, 8]
    assert per_stream[1] == pytest.approx(100.0) and per_stream[8] == pytest.approx(25.0)
    throughput = run.throughput_by_concurrency()
    assert sorted(throughput) == [1, 8, 16]
    assert throughput[1] == pytest.approx(32 / 0.171) and throughput[16] == pytest.approx(32 / 0.381)
    assert run.ttft_by_input_len() == pytest.approx({512: 100.0})
    assert run.prefix_hit_rate() == 0.75
    assert _decode(tmp_path / "plain").prefix_hit_rate() is None
    speed = run.decode_speed()
    assert speed.streamed and speed.per_stream == per_stream and speed.output_tok_s == throughput
    assert speed.e2el_ms == pytest.approx({1: 170.0, 8: 380.0}) and run.require_streamed() is run


def test_a_cell_is_found_by_its_facts_or_the_error_lists_the_cells(tmp_path):
    run = _sweep(tmp_path)
    assert run.cell("decode-c8").concurrency == 8
    assert run.cell(workload="decode", concurrency=8).cell == "decode-c8"
    assert run.cell(workload="ttft", input_len=512).cell == "ttft-512"
    assert run.cell(variant="shared_prefix").cell == "prefix"
    with pytest.raises(
        Gemma4T4Error, match=r"^3 cells of .* match; cells: \['decode-c1', 'decode-c8'"
    ) as error:
        run.cell(workload="decode")
    assert error.value.fix == "name the cell, or give workload/variant/concurrency/input_len"
    with pytest.raises(Gemma4T4Error, match=r"^0 cells"):
        run.cell("decode-c1", concurrency=8)


def test_a_run_whose_later_cell_flushed_names_that_cell_and_gives_no_per_stream_speed(tmp_path):
    streamed, flushed = [_record(i) for i in range(4)], [_record(i, flush=True) for i in range(4)]
    run = _write(tmp_path / "r", [(_cell("decode-c1", streamed), streamed),
                                  (_cell("decode-c8", flushed, concurrency=8), flushed)])  # fmt: skip
    why = run.decode_not_measured
    assert why == (
        "not measured: the server delivered 8 tokens in one flush (4 of 4 requests: every token within "
        "0.00 ms of the first) in cell decode-c8"
    )
    speed = run.decode_speed()
    assert not speed.streamed and speed.per_stream is None and speed.not_measured == why
    assert speed.output_tok_s[8] == pytest.approx(32 / 0.601)
    with pytest.raises(Gemma4T4Error) as error:
        run.require_streamed("a TPOT")
    assert error.value.message == f"{run.dir} gives no a TPOT: {why}"
    assert error.value.fix == (
        "read its output tok/s and E2EL instead (they time the whole generation), "
        "or measure on a server that streams tokens as it makes them (vLLM on a GPU)"
    )
    rows = run.table_rows()
    assert rows[0]["per-stream tok/s (median)"] == pytest.approx(50.0)
    assert rows[1]["TPOT ms (median)"].startswith("not measured: the server delivered 8 tokens")


def test_an_incomplete_run_gives_no_decode_speed(tmp_path):
    with pytest.raises(Gemma4T4Error, match=r"so it gives no decode speed"):
        _decode(tmp_path / "s", status="aborted: x").decode_speed()


def test_the_answers_are_the_first_cell_that_has_any(tmp_path):
    from gemma4_t4.bench.schemas import Answer

    records = [_record(0)]
    answers = [Answer(index=0, question="q", text="Paris")]
    run = _write(tmp_path / "r", [(_cell("none", records, workload="answers"), records),
                                  (_cell("answers", records, workload="answers", answers=answers), records)])  # fmt: skip
    assert [a.text for a in run.answers()] == ["Paris"]
    assert _decode(tmp_path / "d").answers() == []


def test_each_display_row_is_one_cell_with_its_medians(tmp_path):
    records = [_record(i) for i in range(4)]
    open_loop = _cell("r2", records, concurrency=None, workload="open_loop", variant="poisson",
                      open_loop=OpenLoopInfo(offered_rate_rps=2.5, max_in_flight=64),
                      prefix_cache=PrefixCache(hit_rate=0.5))  # fmt: skip
    run = _write(tmp_path / "r", [(_cell("decode-c1", records), records), (open_loop, records)])
    first, second = run.table_rows()
    assert first == {
        "workload": "decode", "variant": None, "concurrency": 1, "input tokens": 16, "output tokens": 8,
        "ok": 4, "failed": 0, "TTFT ms (median)": pytest.approx(100.0), "TPOT ms (median)": pytest.approx(20.0),
        "per-stream tok/s (median)": pytest.approx(50.0), "E2EL ms (median)": pytest.approx(240.0),
        "output tok/s (all streams)": pytest.approx(32 / 0.241), "prefix cache hit rate": None,
    }  # fmt: skip
    assert second["concurrency"] == "2.5 req/s" and second["variant"] == "poisson"
    assert second["prefix cache hit rate"] == 0.5


# ---------------------------------------------------------------- results.py: the text table


def test_the_text_table_is_the_runs_display_with_each_cells_flags_as_a_note(tmp_path):
    records = [_record(i) for i in range(4)]
    flushed = [_record(i, flush=True) for i in range(4)]
    spec = SpecDecode(acceptance_rate=0.376, mean_accepted_length=2.128, source="/metrics")
    cells = [
        _cell("decode-c1", records, queueing=True, partial=True, spec_decode=spec,
              prefix_cache=PrefixCache(hit_rate=0.5)),
        _cell("open-2", records, concurrency=None, input_len=None, output_len=None,
              queueing=True, open_loop=OpenLoopInfo(offered_rate_rps=2.5, max_in_flight=4, cap_reached=True)),
        _cell("decode-c8", flushed, concurrency=8, partial=True),
        _cell("drafter-unknown", records, spec_decode=SpecDecode(acceptance_rate=0.5)),
    ]  # fmt: skip
    run = _write(tmp_path / "r", [(c, records) for c in cells])
    assert run.notes() == [
        "decode-c1: queueing; partial; drafts accepted 38%, mean accepted length 2.13",
        "open-2: queueing; in-flight cap reached",
        "decode-c8: partial",
    ]  # the drafter with no mean accepted length gets no note, not even a blank one
    text = run.table()
    assert text == str(run) and text.endswith("\n".join(run.notes()))
    caption, header, _rule, first, second, third, fourth, *_ = text.splitlines()
    assert caption == "decode" and header.split()[:3] == ["workload", "variant", "concurrency"]
    assert "2.5 req/s" in second and f"{32 / 0.241:,.1f}" in first
    assert "not measured: the server delivered 8 tokens in one flush" in third
    assert fourth.split()[:3] == ["decode", "-", "1"]


def test_the_text_table_groups_thousands(tmp_path):
    slow = [_record(i, ttft=1.23456, gap=0.001) for i in range(4)]
    run = _write(tmp_path / "r", [(_cell("c", slow), slow)])
    line = run.table().splitlines()[3]
    assert "1,234.6" in line and "1,000.0" in line


# ---------------------------------------------------------------- compare.py: two runs


def _rows(comparison) -> dict[str, dict]:
    return {r["metric"]: r for r in comparison.table_rows()}


def test_compare_shows_each_figure_of_a_and_b_and_their_ratio_b_over_a(tmp_path):
    """B decodes twice as fast as A (TPOT 10 ms vs 20 ms), first tokens at the same 100 ms."""
    a, b = _decode(tmp_path / "a", gap=0.02), _decode(tmp_path / "b", gap=0.01)
    comparison = compare_runs(a.dir, b.dir)
    assert comparison.problems == [] and comparison.notes() == []
    assert comparison.caption() == f"B/A ratios (A = {a.dir}, B = {b.dir})"
    (cell,) = comparison.cells
    assert cell.key == ("decode", None, 1, None, 16, 8) and (cell.cell_a, cell.cell_b) == ("decode-c1",) * 2
    rows = _rows(comparison)
    assert list(rows) == ["ttft_ms", "tpot_ms", "e2el_ms", "per_stream_tok_s", "output_throughput_tok_s"]
    ratio = "B/A [95 % interval]"
    assert rows["per_stream_tok_s"]["A"] == pytest.approx(50.0) and rows["per_stream_tok_s"][
        "B"
    ] == pytest.approx(100.0)
    assert (
        rows["per_stream_tok_s"][ratio] == "2.000 [2.000, 2.000]"
        and rows["per_stream_tok_s"]["higher is better"]
    )
    assert rows["tpot_ms"][ratio] == "0.500 [0.500, 0.500]" and rows["tpot_ms"]["higher is better"] is False
    assert rows["ttft_ms"][ratio] == "1.000 [1.000, 1.000]" and rows["ttft_ms"]["A"] == pytest.approx(100.0)
    assert rows["e2el_ms"][ratio] == "0.708 [0.708, 0.708]" and rows["e2el_ms"]["cell"] == "decode-c1"
    throughput = rows["output_throughput_tok_s"]
    assert throughput["A"] == pytest.approx(32 / 0.241) and throughput["B"] == pytest.approx(32 / 0.171)
    assert throughput[ratio] == "1.409 [no interval]" and throughput["higher is better"] is True
    assert comparison.columns == ("cell", "metric", "higher is better", "A", "B", "B/A [95 % interval]")
    # runs already in memory compare the same as their folders
    same = compare_runs(a, b)
    assert _rows(same)["per_stream_tok_s"][ratio] == "2.000 [2.000, 2.000]"
    assert compare_runs(str(a.dir), b).a == str(a.dir)


def test_the_interval_brackets_a_ratio_of_varied_requests(tmp_path):
    """Four requests per side with different speeds: the interval is around the point, not on it."""
    fast = [_record(i, gap=g) for i, g in enumerate((0.008, 0.01, 0.012, 0.011))]
    slow = [_record(i, gap=g) for i, g in enumerate((0.018, 0.02, 0.024, 0.021))]
    a = _write(tmp_path / "a", [(_cell("decode-c1", slow), slow)])
    b = _write(tmp_path / "b", [(_cell("decode-c1", fast), fast)])
    shown = _rows(compare_runs(a.dir, b.dir))["per_stream_tok_s"]["B/A [95 % interval]"]
    point, low, high = (float(x.strip("[],")) for x in shown.split())
    from statistics import median

    expected = median(1 / g for g in (0.008, 0.01, 0.012, 0.011)) / median(
        1 / g for g in (0.018, 0.02, 0.024, 0.021)
    )
    assert low < point < high and point == pytest.approx(expected, abs=1e-3)


def test_cells_that_match_on_their_facts_are_compared_under_both_names(tmp_path):
    records = [_record(i) for i in range(2)]
    a = _write(tmp_path / "a", [(_cell("old-name", records), records)])
    b = _write(tmp_path / "b", [(_cell("new-name", records), records)])
    assert {r["cell"] for r in compare_runs(a.dir, b.dir).table_rows()} == {"old-name vs new-name"}


def test_cells_without_a_partner_are_named_and_nothing_compared_is_a_problem(tmp_path):
    a = _decode(tmp_path / "a", concurrency=1)
    b = _decode(tmp_path / "b", concurrency=8)
    comparison = compare_runs(a.dir, b.dir)
    assert (
        comparison.cells == []
        and comparison.unmatched_a == ["decode-c1"]
        and comparison.unmatched_b == ["decode-c8"]
    )
    assert comparison.problems == [
        "nothing compared: no cell of A matches one of B (same workload, variant, concurrency, rate, input and "
        "output length); A has ['decode-c1'], B has ['decode-c8']"
    ]
    assert comparison.caption().endswith("; " + comparison.problems[0])
    assert comparison.notes() == ["unmatched cells: A ['decode-c1']  B ['decode-c8']"]
    one_more = _write(tmp_path / "c", [(_cell("decode-c1", [_record(0)]), [_record(0)]),
                                       (_cell("decode-c4", [_record(0)], concurrency=4), [_record(0)])])  # fmt: skip
    partly = compare_runs(a.dir, one_more.dir)
    assert partly.problems == [] and partly.notes() == ["unmatched cells: A []  B ['decode-c4']"]
    assert compare_runs(one_more.dir, a.dir).notes() == ["unmatched cells: A ['decode-c4']  B []"]


def test_a_run_that_did_not_complete_gives_no_ratio_and_names_its_side(tmp_path):
    a = _decode(tmp_path / "a")
    b = _decode(tmp_path / "b", status="aborted: server unreachable")
    comparison = compare_runs(a.dir, b.dir)
    assert comparison.cells == [] and comparison.table_rows() == []
    assert comparison.problems == [f"not measured: B: run {b.dir} is aborted: server unreachable"]
    both = compare_runs(b.dir, b.dir)
    assert [p.split(":")[1] for p in both.problems] == [" A", " B"]


def test_a_cell_whose_records_are_gone_shows_why_in_every_figure(tmp_path):
    """summary.json alone can be edited: without records.jsonl no figure is printed from it."""
    a, b = _decode(tmp_path / "a"), _decode(tmp_path / "b")
    (b.dir / RECORDS_FILE).unlink()
    comparison = compare_runs(a.dir, b.dir)
    why = (
        f"B: {b.dir / RECORDS_FILE} holds no measured records of cell decode-c1, so its figures cannot be checked "
        "(summary.json alone can be edited); compare runs with their records.jsonl"
    )
    assert comparison.problems == [f"not measured: {why}"]
    rows = comparison.table_rows()
    assert [r["metric"] for r in rows] == ["ttft_ms", "tpot_ms", "e2el_ms", "per_stream_tok_s"]
    assert all((r["A"], r["B"], r["B/A [95 % interval]"]) == (None, None, why) for r in rows)
    (a.dir / RECORDS_FILE).unlink()
    both = compare_runs(a.dir, b.dir).problems[0]
    assert both.startswith(f"not measured: A: {a.dir / RECORDS_FILE} holds no") and f" / B: {b.dir}" in both


def test_a_streamed_side_against_a_flushed_one_names_the_flush_instead_of_a_decode_ratio(tmp_path):
    a, b = _decode(tmp_path / "a"), _decode(tmp_path / "b", flush=True)
    flush = (
        "not measured: the server delivered 8 tokens in one flush (4 of 4 requests: every token within 0.00 ms "
        "of the first)"
    )
    rows = _rows(compare_runs(a.dir, b.dir))
    for metric in ("tpot_ms", "per_stream_tok_s"):
        assert (rows[metric]["A"], rows[metric]["B"], rows[metric]["B/A [95 % interval]"]) == (
            None,
            None,
            f"B: {flush}",
        )
    assert rows["ttft_ms"]["B/A [95 % interval]"] == "6.000 [6.000, 6.000]"  # whole requests are still timed
    assert rows["e2el_ms"]["B"] == pytest.approx(600.0)
    both = _rows(compare_runs(b.dir, b.dir))
    assert both["tpot_ms"]["B/A [95 % interval]"] == f"A: {flush} / B: {flush}"
    assert _rows(compare_runs(b.dir, a.dir))["per_stream_tok_s"]["B/A [95 % interval]"] == f"A: {flush}"


def test_the_drafter_row_shows_each_sides_acceptance(tmp_path):
    records = [_record(i) for i in range(2)]
    measured = SpecDecode(acceptance_rate=0.376, mean_accepted_length=2.128, source="/metrics")
    a = _write(tmp_path / "a", [(_cell("c", records), records)])
    b = _write(tmp_path / "b", [(_cell("c", records, spec_decode=measured), records)])
    c = _write(tmp_path / "c", [(_cell("c", records, spec_decode=SpecDecode(source="/metrics")), records)])
    drafter = _rows(compare_runs(a.dir, b.dir))["drafter"]
    assert drafter == {"cell": "c", "metric": "drafter", "A": "off",
                       "B": "accepted 37.6%, mean accepted length 2.13"}  # fmt: skip
    assert _rows(compare_runs(c.dir, a.dir))["drafter"]["A"] == "on (/metrics)"
    half = _write(
        tmp_path / "h", [(_cell("c", records, spec_decode=SpecDecode(acceptance_rate=0.5)), records)]
    )
    assert _rows(compare_runs(a.dir, half.dir))["drafter"]["B"] == "on (unavailable)"
    assert "drafter" not in _rows(compare_runs(a.dir, a.dir))


def _answers_run(path: Path, text: str = "Paris", error: str | None = None, **info) -> BenchRun:
    from gemma4_t4.bench.answers import QUESTIONS
    from gemma4_t4.bench.schemas import Answer

    answers = [Answer(index=i, question=q, text=text, error=error) for i, (q, _) in enumerate(QUESTIONS)]
    records = [_record(0)]
    cell = _cell("answers", records, workload="answers", answers=answers)
    return _write(path, [(cell, records)], workload="answers", **info)


def test_answers_runs_compare_their_answers_and_a_missing_record_is_no_problem_there(tmp_path):
    a, b = _answers_run(tmp_path / "a"), _answers_run(tmp_path / "b", text="Paris.")
    (b.dir / RECORDS_FILE).unlink()
    comparison = compare_runs(a.dir, b.dir)
    assert comparison.problems == [] and comparison.answers.identical == 0
    assert (
        comparison.notes() == [comparison.answers.text()] and "identical answers: 0/" in comparison.notes()[0]
    )
    broken = _answers_run(tmp_path / "c", error="timeout")
    errored = compare_runs(a.dir, broken.dir)
    assert errored.problems == [f"answers {errored.answers.line()}"] and errored.answers.line().startswith(
        "not measured"
    )
    assert compare_runs(_decode(tmp_path / "d").dir, _decode(tmp_path / "e").dir).answers is None


# ---------------------------------------------------------------- compare.py: two suites (T4 vs L4)


def _suite_run(
    path: Path,
    model: str = "google/gemma-4-E2B-it",
    gpu: str = "t4",
    gap: float = 0.02,
    ttft: float = 0.1,
    flush: bool = False,
    cells: str = "c1",
    **info,
) -> BenchRun:
    """A remote run of ``model`` declared (and priced) as ``gpu``; decode at c=1 (and c=8 in "c1c8")."""
    made = []
    for c in (1, 8) if cells == "c1c8" else (1,):
        records = [_record(i, gap=gap / c, ttft=ttft, flush=flush) for i in range(4)]
        made.append((_cell(f"decode-c{c}", records, concurrency=c), records))
    info = {"model": model, "base_url": "http://10.0.0.5:8000", "config": {"gpu": gpu}} | info
    return _write(path, made, **info)


def test_a_folder_of_runs_is_a_suite_and_a_run_folder_is_one_run(tmp_path):
    from gemma4_t4.bench.compare import is_suite, load_suite

    one = _suite_run(tmp_path / "suite" / "b-run")
    _suite_run(tmp_path / "suite" / "a-run")
    (tmp_path / "suite" / "notes").mkdir()
    assert (
        is_suite(tmp_path / "suite") and not is_suite(one.dir) and not is_suite(tmp_path / "suite" / "notes")
    )
    assert not is_suite(tmp_path / "nothing-here")
    assert [r.dir.name for r in load_suite(tmp_path / "suite")] == ["a-run", "b-run"]
    assert [r.dir for r in load_suite(one.dir)] == [one.dir]
    for empty in (tmp_path / "suite" / "notes", tmp_path / "nothing-here"):
        with pytest.raises(Gemma4T4Error, match="holds no benchmark results") as error:
            load_suite(empty)
        assert error.value.fix == "pass a results directory or a folder of them"


def test_a_t4_suite_against_an_l4_suite_gives_one_headline_per_model(tmp_path):
    from gemma4_t4.bench.compare import compare_suites

    t4 = _suite_run(tmp_path / "t4" / "e2b", gap=0.02, cells="c1c8")
    _suite_run(tmp_path / "t4" / "e4b", model="google/gemma-4-E4B-it")
    _suite_run(tmp_path / "l4" / "e2b", gpu="l4", gap=0.01, ttft=0.05)
    suite = compare_suites(tmp_path / "t4", tmp_path / "l4")
    (h,) = suite.headlines
    assert h.model == "google/gemma-4-E2B-it" and suite.unmatched_models == ["google/gemma-4-E4B-it"]
    assert (
        h.decode_method == "per-stream c=1"
        and h.decode_a == pytest.approx(50.0)
        and h.decode_b == pytest.approx(100.0)
    )
    assert (h.decode_ratio, h.decode_ci_low, h.decode_ci_high) == pytest.approx((0.5, 0.5, 0.5))
    assert (h.ttft_a_ms, h.ttft_b_ms, h.ttft_ratio) == pytest.approx((100.0, 50.0, 2.0))
    assert h.kind_a.gpu == "t4" and h.kind_b.gpu == "l4" and h.kind_a.model_size == "E2B"
    # priced at the best measured output tok/s: the c=8 cell, on every T4 instance
    best = max(t4.throughput_by_concurrency().values())
    assert best == t4.throughput_by_concurrency()[8]
    assert h.usd_per_mtok_a["sagemaker:ml.g4dn.xlarge"] == pytest.approx(0.736 / (best * 3600) * 1e6)
    assert set(h.usd_per_mtok_b) == {
        "sagemaker:ml.g6.xlarge",
        "ec2:g6.xlarge",
        "gce:g2-standard-4",
        "cloudrun:l4",
    }
    assert h.published.build == "emb4" and h.published.t4_tok_s == 108.5
    rows = suite.table_rows()
    assert [r["model"] for r in rows] == [h.model] * 4
    decode, ttft, usd, published = rows
    ratio = "A/B [95 % interval]"
    assert decode == {"model": h.model, "figure": "decode tok/s (per-stream c=1)", "A": h.decode_a, "B": h.decode_b,
                      ratio: "0.500 [0.500, 0.500]"}  # fmt: skip
    assert ttft["figure"] == "TTFT ms (median)" and ttft[ratio] == "2.000 [no interval]"
    assert (ttft["A"], ttft["B"]) == (pytest.approx(100.0), pytest.approx(50.0))
    assert usd["figure"] == "$/Mtok (at the best output tok/s)"
    assert usd["A"].startswith(
        f"sagemaker:ml.g4dn.xlarge ${h.usd_per_mtok_a['sagemaker:ml.g4dn.xlarge']:.2f}, ec2:"
    )
    assert published == {"model": h.model,
                         "figure": "published (gemma-4-E2B emb4, not our measurement): decode tok/s T4 | L4",
                         "A": 108.5, "B": 141.7, ratio: "0.766"}  # fmt: skip
    assert suite.problems == [] and suite.caption() == f"A = {tmp_path / 't4'}, B = {tmp_path / 'l4'}"
    assert h.caption() == "google/gemma-4-E2B-it: A/B, measured"
    assert suite.notes() == [
        f"{h.model}: published (gemma-4-E2B emb4, not our measurement): identical answers 40/40  [{h.published.source}]",
        "models on one side only: ['google/gemma-4-E4B-it']",
    ]


def test_a_suite_prefers_the_series_decode_method_and_needs_the_same_method_on_both_sides(tmp_path):
    from gemma4_t4.bench.compare import compare_suites
    from gemma4_t4.bench.schemas import SeriesDecode

    series = SeriesDecode(short_tokens=16, long_tokens=512, samples=[40.0, 42.0, 44.0])
    _suite_run(tmp_path / "a" / "r", series_decode=series)
    _suite_run(tmp_path / "b" / "r", gpu="l4", series_decode=SeriesDecode(short_tokens=16, long_tokens=512,
                                                                          samples=[80.0, 84.0, 88.0]))  # fmt: skip
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    assert h.decode_method == "series" and (h.decode_a, h.decode_b, h.decode_ratio) == pytest.approx(
        (42.0, 84.0, 0.5)
    )
    assert h.decode_ci_low <= 0.5 <= h.decode_ci_high
    _suite_run(tmp_path / "c" / "r", gpu="l4")  # per-stream only: not the same method
    (mixed,) = compare_suites(tmp_path / "a", tmp_path / "c").headlines
    assert (mixed.decode_method, mixed.decode_a, mixed.decode_b, mixed.decode_ratio) == (
        None,
        None,
        None,
        None,
    )
    assert mixed.table_rows()[0]["A/B [95 % interval]"] == "not measured on both sides"
    assert mixed.table_rows()[0]["figure"] == "decode tok/s (-)"


def test_a_flushed_side_names_the_flush_where_the_decode_ratio_would_be(tmp_path):
    from gemma4_t4.bench.compare import compare_suites

    _suite_run(tmp_path / "a" / "r")
    flushed = _suite_run(tmp_path / "b" / "r", gpu="l4", flush=True)
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    flush = (
        "not measured: the server delivered 8 tokens in one flush (4 of 4 requests: every token within 0.00 ms "
        f"of the first) ({flushed.dir}, cell decode-c1)"
    )
    assert h.decode_not_measured == [f"B: {flush}"] and h.decode_method is None and h.decode_ratio is None
    assert h.table_rows()[0]["A/B [95 % interval]"] == f"B: {flush}"
    assert h.ttft_ratio is not None  # TTFT is still timed
    (both,) = compare_suites(tmp_path / "b", tmp_path / "b").headlines
    assert [w[:2] for w in both.decode_not_measured] == ["A:", "B:"]
    assert both.table_rows()[0]["A/B [95 % interval]"] == f"A: {flush}; B: {flush}"


def test_a_side_with_no_timed_stream_names_it_where_the_decode_ratio_would_be(tmp_path):
    """A c=1 cell whose requests each streamed one token has no per-stream speed (a tiny random model
    can answer so): the headline names why, as it names a flush, instead of showing a blank."""
    from gemma4_t4.bench.compare import compare_suites

    _suite_run(tmp_path / "a" / "r")
    records = [_record(i, n=1) for i in range(4)]
    one_token = _write(tmp_path / "b" / "r", [(_cell("decode-c1", records), records)], model="google/gemma-4-E2B-it",
                       base_url="http://10.0.0.5:8000", config={"gpu": "l4"})
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    why = f"not measured: no request streamed tokens to time ({one_token.dir}, cell decode-c1)"
    assert h.decode_not_measured == [f"B: {why}"] and h.decode_method is None and h.decode_ratio is None
    assert (h.decode_a, h.decode_b) == (None, None) and h.table_rows()[0]["A/B [95 % interval]"] == f"B: {why}"


def test_an_incomplete_run_in_a_suite_is_named_and_never_averaged_in(tmp_path):
    from gemma4_t4.bench.compare import compare_suites

    _suite_run(tmp_path / "a" / "r")
    stopped = _suite_run(tmp_path / "b" / "r", gpu="l4", status="aborted: x")
    suite = compare_suites(tmp_path / "a", tmp_path / "b")
    (h,) = suite.headlines
    why = f"B: run {stopped.dir} is aborted: x"
    assert h.not_measured == [why] and h.decode_b is None and h.ttft_b_ms is None and h.kind_b is None
    assert h.usd_per_mtok_b == {} and h.unpriced_b is None
    assert suite.problems == [f"google/gemma-4-E2B-it: not measured: {why}"]
    assert h.caption() == f"google/gemma-4-E2B-it: A/B, measured; not measured: {why}"
    assert suite.caption().endswith(f"; google/gemma-4-E2B-it: not measured: {why}")


def test_suites_with_no_model_in_common_compare_nothing_and_say_so(tmp_path):
    from gemma4_t4.bench.compare import compare_suites

    _suite_run(tmp_path / "a" / "r", model="google/gemma-4-E2B-it")
    _suite_run(tmp_path / "b" / "r", model="google/gemma-4-E4B-it", gpu="l4")
    suite = compare_suites(tmp_path / "a", tmp_path / "b")
    assert suite.headlines == [] and suite.table_rows() == []
    assert suite.problems == [
        "nothing compared: no model was run on both sides (one side only: "
        "['google/gemma-4-E2B-it', 'google/gemma-4-E4B-it'])"
    ]


def test_a_tiny_or_unrecorded_run_shows_why_it_has_no_price(tmp_path):
    from gemma4_t4.bench.compare import compare_suites

    _suite_run(tmp_path / "a" / "r", model="tiny-gemma4")
    _suite_run(tmp_path / "b" / "r", model="tiny-gemma4", gpu=None)
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    assert h.usd_per_mtok_a == {} and h.unpriced_a.startswith(
        "no $/Mtok: a tiny random model on T4 is a method"
    )
    assert h.unpriced_b == "no $/Mtok: the run did not record which model and GPU it measured"
    usd = h.table_rows()[2]
    assert (usd["A"], usd["B"]) == (h.unpriced_a, h.unpriced_b) and h.published is None
    assert len(h.table_rows()) == 3 and h.notes() == []


def test_a_suite_with_answers_compares_them_and_an_errored_set_is_a_problem(tmp_path):
    from gemma4_t4.bench.compare import compare_suites

    _answers_run(tmp_path / "a" / "answers", model="m", config={"gpu": "t4"})
    _answers_run(tmp_path / "b" / "answers", model="m", config={"gpu": "l4"}, error="timeout")
    suite = compare_suites(tmp_path / "a", tmp_path / "b")
    (h,) = suite.headlines
    assert h.answers is not None and not h.answers.measured
    assert suite.problems == [f"m: answers {h.answers.line()}"]
    assert suite.notes() == [f"m: {h.answers.text()}"]
    from gemma4_t4.bench.published import headline_rows

    shared = {r["figure"]: r for r in headline_rows(h).table_rows()}["identical answers (share)"]
    assert shared["measured here"] is None  # an errored set is no share of identical answers
    _answers_run(tmp_path / "c" / "answers", model="m", config={"gpu": "l4"})
    (same,) = compare_suites(tmp_path / "a", tmp_path / "c").headlines
    assert same.answers.all_identical and same.notes() == [same.answers.text()]


def test_the_published_sagemaker_row_is_found_by_any_spelling_of_the_served_name():
    from gemma4_t4.bench.compare import published_decode

    assert published_decode("google/gemma-4-E2B-it").t4_tok_s == 108.5  # the row with a T4 figure
    assert published_decode("GEMMA_4_E4B").build == "emb4"
    assert published_decode("gemma-4-E2B", "bf16").l4_tok_s == 51.3  # no T4 figure: still its row
    assert published_decode("gemma-4-26b-a4b").l4_tok_s == 91.5
    assert published_decode("gemma-4-E2B", "fp8") is None and published_decode("llama") is None


# ---------------------------------------------------------------- published.py: lookups


def test_published_lookups_name_what_is_missing():
    from gemma4_t4.bench import published

    with pytest.raises(KeyError) as cell:
        published.gce_t4("qat", 1000, 3)
    assert "no published GCE T4 cell for qat in 1000 c=3; published: [('bf16', 512, 1), (" in str(cell.value)
    assert published.gce_t4("emb4").per_stream_tok_s == 99.94  # defaults: 512 tokens in, one stream
    assert published.gce_t4("bf16", 4096, 16).ttft_ms == 81551
    assert published.published_decode("gemma-4-E2B", "emb4") == published.SAGEMAKER_DECODE[0]
    assert published.published_decode("gemma-4-E2B", "qat").l4_tok_s == 105.1
    assert published.SAGEMAKER_LOAD[2].t4_tok_s == 216.45
    # the load row the cost table prices is E2B emb4's
    assert (published.SAGEMAKER_LOAD[0].model, published.SAGEMAKER_LOAD[0].build) == ("gemma-4-E2B", "emb4")


def test_the_series_headline_ratios_are_the_published_figures_divided():
    from gemma4_t4.bench import published

    assert round(published.PART2_L4_QAT_VS_BF16.ratio, 2) == 2.05
    assert round(published.PART3_L4_EMB4_VS_QAT.ratio, 2) == 1.39
    assert round(published.T4_QAT_VS_BF16_C1.ratio, 2) == 1.79
    assert round(published.T4_QAT_VS_BF16_C8.ratio, 2) == 1.31
    assert round(published.T4_DRAFTER.ms_per_token_off / published.T4_DRAFTER.ms_per_token_on, 2) == 1.34  # 9.9 ms, 7.4


# ---------------------------------------------------------------- published.py: what a run measured on


def test_a_kind_says_why_it_has_no_price_or_none():
    from gemma4_t4.bench.published import Kind

    unrecorded = "no $/Mtok: the run did not record which model and GPU it measured"
    assert Kind(None, "t4").unpriced() == unrecorded and Kind("E2B", None).unpriced() == unrecorded
    assert Kind("tiny", "t4").unpriced() == (
        "no $/Mtok: a tiny random model on T4 is a method check, not a price of serving Gemma 4"
    )
    assert Kind("E2B", None, "NVIDIA B300").unpriced() == (
        "no $/Mtok: NVIDIA B300 is not in the hardware table, so no price is known for it"
    )
    assert Kind("E2B", "cpu").unpriced() == "no $/Mtok: E2B on a CPU is not a priced GPU deployment"
    assert Kind("E2B", "l4").unpriced("t4") == "no $/Mtok: measured on L4, priced as T4"
    assert Kind("E2B", "h100").unpriced() == "no $/Mtok: no price is known for H100"
    assert Kind("E2B", "t4").unpriced() is None and Kind("E2B", "t4").unpriced("t4") is None
    assert Kind("26B-A4B", "l4").unpriced() is None


def test_a_kind_describes_itself_and_is_known_only_with_size_and_gpu():
    from gemma4_t4.bench.published import Kind

    assert Kind("E2B", "t4").known and not Kind("E2B", None).known and not Kind(None, "t4").known
    assert not Kind("E2B", None, "NVIDIA B300").known
    assert Kind("tiny", "cpu").describe() == "a tiny random model on a CPU"
    assert Kind("E4B", "l4").describe() == "E4B on L4"
    assert Kind(None, None).describe() == "an unknown model on unknown hardware"
    assert Kind("E2B", None, "NVIDIA B300").describe() == "E2B on NVIDIA B300 (not in the hardware table)"


def test_the_model_size_is_read_from_the_first_name_that_says_one():
    from gemma4_t4.bench.published import model_size_of

    assert model_size_of("google/gemma-4-E2B-it") == "E2B"
    assert model_size_of(None, "", "/models/gemma_4_26b_a4b_it") == "26B-A4B"
    assert model_size_of("served-name", "/w/models/tiny-gemma4") == "tiny"
    assert model_size_of("gemma-4-12B", "gemma-4-E4B") == "12B" and model_size_of("gemma4-31b") == "31B"
    assert model_size_of("gemma-4-e4b2") is None and model_size_of("xe2b") is None  # part of a longer word
    assert model_size_of() is None and model_size_of(None) is None and model_size_of("gemma4") is None


def _info(**fields) -> BenchRun:
    from gemma4_t4.bench.schemas import ServerInfo

    server = ServerInfo(**fields.pop("server", {}))
    return BenchRun(dir=Path("r"), run=RunInfo(server=server, **fields))


def test_the_kind_of_a_run_comes_from_what_it_recorded():
    from gemma4_t4.bench.published import Kind, measured_kind

    t4 = [{"name": "Tesla T4"}]
    local = "http://127.0.0.1:8000"
    # a local server: the host's first GPU
    assert measured_kind(_info(model="gemma-4-E2B-it", base_url=local, environment={"gpus": t4})) == Kind(
        "E2B", "t4"
    )
    assert measured_kind(
        _info(
            model="e4b",
            base_url="http://localhost:8000",
            environment={"gpus": [{"name": "NVIDIA L4"}, {"name": "Tesla T4"}]},
        )
    ) == Kind("E4B", "l4")
    assert (
        measured_kind(_info(model="e2b", base_url="http://[::1]:8000", environment={"gpus": t4})).gpu == "t4"
    )
    assert measured_kind(
        _info(model="e2b", base_url=local, environment={"gpus": [{"name": "NVIDIA B300"}]})
    ) == Kind("E2B", None, "NVIDIA B300")
    # a local server on a host without an NVIDIA GPU, or one launched for the CPU
    assert measured_kind(_info(model="e2b", base_url=local, server={"backend": "openai-http"})) == Kind(
        "E2B", "cpu"
    )
    launched = {
        "server": {"launch": {"config": {"model": "/w/models/tiny-gemma4", "target": "cpu"}}},
        "gpus": t4,
    }
    assert measured_kind(_info(model="gemma4", base_url=local, environment=launched)) == Kind("tiny", "cpu")
    # the launch record's model, then vLLM's root, then the served name
    named = {"server": {"launch": {"config": {"model": "google/gemma-4-12B-it"}}}, "gpus": t4}
    assert measured_kind(_info(model="e2b", base_url=local, environment=named,
                               server={"root": "e4b"})).model_size == "12B"  # fmt: skip
    assert measured_kind(_info(model="e2b", base_url=local, environment={"gpus": t4},
                               server={"root": "e4b"})).model_size == "E4B"  # fmt: skip
    # a remote endpoint: the GPU it was declared and priced as (local without GPUs and not openai-http too)
    remote = _info(
        model="e2b", base_url="http://10.0.0.5:8000", config={"gpu": "l4"}, environment={"gpus": t4}
    )
    assert measured_kind(remote) == Kind("E2B", "l4")
    assert measured_kind(_info(model="e2b", base_url=local, server={"backend": "sagemaker"})) == Kind(
        "E2B", None
    )
    assert measured_kind(_info()) == Kind(None, None)


def test_a_published_figure_is_the_kind_of_its_row():
    from gemma4_t4.bench import published

    assert published.published_kind(published.gce_t4("qat")) == published.Kind("E2B", "t4")
    assert published.published_kind(published.PART2_L4_QAT_VS_BF16) == published.Kind("E2B", "l4")
    assert published.published_kind(published.published_decode("gemma-4-12B"), "l4") == published.Kind(
        "12B", "l4"
    )
    assert published.published_kind(published.published_decode("gemma-4-E2B")) == published.Kind("E2B", None)


# ---------------------------------------------------------------- published.py: measured beside published


def test_a_figure_beside_the_published_one_gets_a_ratio_only_on_the_same_kind():
    from gemma4_t4.bench.published import Kind, beside

    t4 = Kind("E2B", "t4")
    row = beside("per-stream", 80.0, 72.31, "xbill9/x (GCE, fp16)", "GCE T4", measured_on=t4, published_on=t4)
    assert row == {"figure": "per-stream", "measured here": 80.0, "measured on": "E2B on T4", "published": 72.31,
                   "measured / published": pytest.approx(80.0 / 72.31), "published under": "GCE T4",
                   "source": "xbill9/x"}  # fmt: skip
    other = beside("x", 80.0, 72.31, "s", "GCE T4", measured_on=Kind("E2B", "l4"), published_on=t4)
    assert (
        other["measured / published"] is None
        and other["published under"] == "GCE T4 (published; not comparable)"
    )
    assert beside("x", 80.0, 72.31, "s")["published under"] == "(published; not comparable)"
    assert beside("x", 80.0, 72.31, "s")["measured on"] == "not recorded"
    unknown = Kind(None, "t4")
    assert (
        beside("x", 80.0, 72.31, "s", measured_on=unknown, published_on=unknown)["measured / published"]
        is None
    )
    assert beside("x", 80.0, None, "s", "mine", measured_on=t4)["published under"] == "mine"
    assert (
        beside("x", 80.0, 72.31, "s", measured_on=t4)["measured / published"] is None
    )  # published kind unknown
    flush = "not measured: one flush"
    assert (
        beside("x", flush, 72.31, "s", "c", measured_on=t4, published_on=t4)["measured / published"] is None
    )
    assert beside("x", True, 72.31, "s", "c", measured_on=t4, published_on=t4)["measured / published"] is None
    assert beside("x", 80, 0.0, "s", "c", measured_on=t4, published_on=t4)["measured / published"] is None
    assert beside("x", 80, 40.0, "s", "c", measured_on=t4, published_on=t4)["measured / published"] == 2.0


def _speed(per_stream: dict | None, output: dict, e2el: float = 900.0):
    from gemma4_t4.bench.results import DecodeSpeed

    why = None if per_stream else "not measured: the server sent each answer in one flush"
    return DecodeSpeed(
        per_stream=per_stream, output_tok_s=output, e2el_ms={c: e2el for c in output}, not_measured=why
    )


def test_part2_puts_each_measured_qat_and_bf16_figure_beside_the_published_one():
    from gemma4_t4.bench.published import T4_QAT_VS_BF16_C1, Kind, QatVsBf16

    figures = QatVsBf16(_speed({1: 40.0, 8: 20.0}, {1: 40.0, 8: 160.0}, 1000.0),
                        _speed({1: 72.0, 8: 27.0}, {1: 70.0, 8: 216.0}, 600.0), Kind("E2B", "t4"), "t4")  # fmt: skip
    assert figures.flushed is None and figures.c_max == 8
    assert figures.per_stream == {"bf16": 40.0, "qat": 72.0}
    assert figures.ratio_c1 == pytest.approx(1.8) and figures.ratio_output_c1 == pytest.approx(1.75)
    assert figures.ratio_cmax == pytest.approx(216 / 160)
    assert figures.caption() == "QAT int4 vs bf16, measured here (t4) beside the published figures"
    assert figures.decode_curves() == (
        "per-stream decode tok/s",
        {"bf16": {1: 40.0, 8: 20.0}, "qat": {1: 72.0, 8: 27.0}},
    )
    rows = {r["figure"]: r for r in figures.table_rows()}
    assert list(rows) == [
        "per-stream tok/s bf16, c=1", "per-stream tok/s QAT, c=1", "QAT/bf16 per stream, c=1",
        "QAT/bf16 all streams, c=8 (published: c=8)", "QAT/bf16 single-stream decode (published: on an L4)",
        "output tok/s bf16, c=8", "output tok/s qat, c=8", "QAT/bf16 output tok/s, c=1", "E2EL ms bf16, c=1",
        "E2EL ms qat, c=1",
    ]  # fmt: skip
    mp = "measured / published"
    assert (
        rows["per-stream tok/s bf16, c=1"]["published"],
        rows["per-stream tok/s QAT, c=1"]["published"],
    ) == (40.44, 72.31)
    assert rows["per-stream tok/s QAT, c=1"][mp] == pytest.approx(72.0 / 72.31)
    ratio = rows["QAT/bf16 per stream, c=1"]
    assert ratio["measured here"] == pytest.approx(1.8) and ratio["published"] == pytest.approx(72.31 / 40.44)
    assert (
        ratio[mp] == pytest.approx(1.8 / (72.31 / 40.44))
        and ratio["published under"] == "GCE T4, 512 in / 128 out, c=1"
    )
    all_streams = rows["QAT/bf16 all streams, c=8 (published: c=8)"]
    assert all_streams["measured here"] == pytest.approx(1.35) and all_streams["published"] == pytest.approx(
        215.91 / 164.62
    )
    l4 = rows["QAT/bf16 single-stream decode (published: on an L4)"]
    assert (
        l4["published"] == pytest.approx(105.1 / 51.3) and l4[mp] is None
    )  # published on an L4, measured on a T4
    assert l4["published under"] == "SageMaker ml.g6.xlarge, c=1 (published; not comparable)"
    assert (rows["output tok/s bf16, c=8"]["measured here"], rows["output tok/s bf16, c=8"]["published"]) == (
        160.0,
        164.62,
    )
    assert (rows["output tok/s qat, c=8"]["measured here"], rows["output tok/s qat, c=8"]["published"]) == (
        216.0,
        215.91,
    )
    assert rows["output tok/s qat, c=8"]["published under"] == "GCE T4, 512 in / 128 out, c=8"
    mine = rows["QAT/bf16 output tok/s, c=1"]
    assert mine["measured here"] == pytest.approx(1.75) and mine["published"] is None
    assert mine["published under"] == "measured here (not published)" and mine["measured on"] == "E2B on T4"
    assert mine["source"] == T4_QAT_VS_BF16_C1.source.split(" (")[0]
    assert (rows["E2EL ms bf16, c=1"]["measured here"], rows["E2EL ms qat, c=1"]["measured here"]) == (
        1000.0,
        600.0,
    )


def test_part2_at_other_concurrencies_reads_its_highest_and_shows_no_c8_rows():
    from gemma4_t4.bench.published import Kind, QatVsBf16

    figures = QatVsBf16(_speed({1: 40.0, 4: 30.0}, {1: 40.0, 2: 70.0, 4: 100.0}),
                        _speed({1: 60.0, 4: 45.0}, {1: 60.0, 2: 100.0, 4: 180.0}), Kind("E2B", "t4"), "t4")  # fmt: skip
    assert figures.c_max == 4 and figures.ratio_cmax == pytest.approx(1.8)
    labels = [r["figure"] for r in figures.table_rows()]
    assert "QAT/bf16 all streams, c=4 (published: c=8)" in labels and not any("c=8" in x for x in labels[4:])
    assert len(labels) == 8


def test_part2_where_one_build_flushed_names_the_flush_instead_of_per_stream_figures():
    from gemma4_t4.bench.published import Kind, QatVsBf16

    flush = "not measured: the server sent each answer in one flush"
    for bf16, qat in ((_speed(None, {1: 30.0, 8: 90.0}), _speed({1: 60.0, 8: 20.0}, {1: 33.0, 8: 99.0})),
                      (_speed({1: 60.0, 8: 20.0}, {1: 30.0, 8: 90.0}), _speed(None, {1: 33.0, 8: 99.0}))):  # fmt: skip
        figures = QatVsBf16(bf16, qat, Kind("tiny", "cpu"), "cpu")
        assert figures.flushed == flush and figures.ratio_c1 == flush
        assert figures.per_stream == {"bf16": flush, "qat": flush}
        assert figures.decode_curves() == ("output tok/s, all streams (answers came in one flush)",
                                           {"bf16": bf16.output_tok_s, "qat": qat.output_tok_s})  # fmt: skip
        assert figures.caption() == (
            f"QAT int4 vs bf16, measured here (cpu) beside the published figures; per-stream speed {flush}"
        )
        rows = {r["figure"]: r for r in figures.table_rows()}
        assert rows["QAT/bf16 per stream, c=1"]["measured here"] == flush
        assert rows["QAT/bf16 output tok/s, c=1"]["measured here"] == pytest.approx(1.1)


def test_part2_from_two_runs_refuses_runs_without_a_c1_cell(tmp_path):
    from gemma4_t4.bench.published import Kind, qat_vs_bf16

    bf16 = _suite_run(tmp_path / "bf16", gap=0.02)
    qat = _suite_run(tmp_path / "qat", gap=0.01)
    figures = qat_vs_bf16(bf16, qat, "t4")
    assert figures.measured_on == Kind("E2B", "t4") and figures.venue == "t4"
    assert figures.ratio_c1 == pytest.approx(2.0) and figures.bf16.per_stream == {1: pytest.approx(50.0)}
    c8 = _decode(tmp_path / "c8", concurrency=8)
    with pytest.raises(Gemma4T4Error) as error:
        qat_vs_bf16(c8, qat, "t4")
    assert error.value.message == (
        "Part 2's QAT/bf16 figures are at one stream, but a run measured no c=1 cell (bf16: c=[8], QAT: c=[1])"
    )
    assert error.value.fix == 'measure both with concurrency 1 among the rest, e.g. -p CONCURRENCY "[1, 8]"'
    with pytest.raises(Gemma4T4Error, match=r"\(bf16: c=\[1\], QAT: c=\[8\]\)"):
        qat_vs_bf16(qat, c8, "t4")


def test_part4_puts_its_ttft_and_decode_beside_the_published_qat_cells(tmp_path):
    from gemma4_t4.bench.published import t4_beside

    run = _suite_run(tmp_path / "d", gap=0.01, cells="c1c8")
    table = t4_beside(run, {512: 300.0, 4096: None}, "Part 4")
    assert table.caption() == "Part 4"
    rows = {r["figure"]: r for r in table.table_rows()}
    assert list(rows) == [
        "median TTFT ms at 512 tokens, c=1", "median TTFT ms at 4096 tokens, c=1", "per-stream tok/s, c=1",
        "per-stream tok/s, c=8", "output tok/s, c=8", "median E2EL ms, c=1", "median E2EL ms, c=8",
    ]  # fmt: skip
    mp = "measured / published"
    ttft = rows["median TTFT ms at 512 tokens, c=1"]
    assert (ttft["measured here"], ttft["published"], ttft[mp]) == (300.0, 316, pytest.approx(300 / 316))
    assert ttft["published under"] == "GCE T4, E2B QAT, 512 in, c=1"
    long = rows["median TTFT ms at 4096 tokens, c=1"]
    assert (long["measured here"], long["published"], long[mp]) == (None, 7243, None)
    c1, c8 = rows["per-stream tok/s, c=1"], rows["per-stream tok/s, c=8"]
    assert c1["measured here"] == pytest.approx(100.0) and c1["published"] == 72.31
    assert c8["measured here"] == pytest.approx(800.0) and c8["published"] == 37.83
    assert c8["published under"] == "GCE T4, E2B QAT, 512 in / 128 out, c=8"
    out = rows["output tok/s, c=8"]
    assert (
        out["measured here"] == pytest.approx(run.throughput_by_concurrency()[8])
        and out["published"] == 215.91
    )
    assert (
        out[mp] == pytest.approx(run.throughput_by_concurrency()[8] / 215.91)
        and out["measured on"] == "E2B on T4"
    )
    assert out["published under"] == "GCE T4, E2B QAT, 512 in / 128 out, c=8" and out["source"].startswith(
        "xbill9/"
    )
    e2el = rows["median E2EL ms, c=8"]
    assert e2el["measured here"] == pytest.approx(100 + 7 * 1.25) and e2el["published"] is None
    assert e2el["measured on"] == "E2B on T4"
    assert e2el["published under"] == "end-to-end latency (not published)"
    flushed = _suite_run(tmp_path / "f", flush=True)
    rows = {r["figure"]: r for r in t4_beside(flushed, {}, "Part 4").table_rows()}
    assert rows["per-stream tok/s, c=1"]["measured here"].startswith(
        "not measured: the server delivered 8 tokens"
    )
    assert rows["output tok/s, c=8"]["measured here"] is None


def test_the_published_t4_vs_l4_table_lists_the_rows_with_a_t4_figure():
    from gemma4_t4.bench.published import sagemaker_decode_table

    table = sagemaker_decode_table()
    assert table.caption() == "T4 vs L4 on SageMaker, single-stream decode (published)"
    rows = table.table_rows()
    assert [(r["model"], r["build"]) for r in rows] == [("gemma-4-E2B", "emb4"), ("gemma-4-E4B", "emb4"),
                                                         ("gemma-4-12B", "emb4")]  # fmt: skip
    assert rows[0] == {"model": "gemma-4-E2B", "build": "emb4", "T4 tok/s (published)": 108.5,
                       "L4 tok/s (published)": 141.7, "T4 / L4 (published)": pytest.approx(108.5 / 141.7),
                       "identical answers (published)": "40/40", "source": "xbill9/sagemaker-gemma compare.py"}  # fmt: skip


def test_the_t4_vs_l4_headline_sits_beside_the_published_sagemaker_row(tmp_path):
    from gemma4_t4.bench.compare import compare_suites
    from gemma4_t4.bench.published import headline_rows

    _answers_run(tmp_path / "t4" / "answers", model="google/gemma-4-E2B-it", config={"gpu": "t4"},
                 base_url="http://10.0.0.5:8000")  # fmt: skip
    _suite_run(tmp_path / "t4" / "decode", gap=0.02)
    _answers_run(tmp_path / "l4" / "answers", model="google/gemma-4-E2B-it", config={"gpu": "l4"},
                 base_url="http://10.0.0.6:8000")  # fmt: skip
    _suite_run(tmp_path / "l4" / "decode", gpu="l4", gap=0.01, ttft=0.05)
    (headline,) = compare_suites(tmp_path / "t4", tmp_path / "l4").headlines
    table = headline_rows(headline)
    assert table.caption() == "T4 vs L4, measured here beside the published row"
    rows = {r["figure"]: r for r in table.table_rows()}
    assert list(rows) == ["decode tok/s on the T4 (per-stream c=1)", "decode tok/s on the L4 (per-stream c=1)",
                          "T4 / L4 decode", "T4 / L4 median TTFT", "identical answers (share)"]  # fmt: skip
    mp = "measured / published"
    t4, l4, ratio = (rows[k] for k in list(rows)[:3])
    assert (t4["measured here"], t4["published"], t4[mp]) == (
        pytest.approx(50.0),
        108.5,
        pytest.approx(50 / 108.5),
    )
    assert t4["measured on"] == "E2B on T4" and t4["published under"] == "SageMaker, gemma-4-E2B emb4, c=1"
    assert (l4["measured here"], l4["published"], l4[mp]) == (
        pytest.approx(100.0),
        141.7,
        pytest.approx(100 / 141.7),
    )
    assert ratio["published"] == pytest.approx(108.5 / 141.7) and ratio[mp] == pytest.approx(
        0.5 / (108.5 / 141.7)
    )
    assert ratio["measured on"] == "E2B on T4/L4"
    ttft = rows["T4 / L4 median TTFT"]
    assert ttft["measured here"] == pytest.approx(2.0) and ttft["published"] is None
    assert ttft["measured on"] == "E2B on T4/L4"
    identical = rows["identical answers (share)"]
    assert (identical["measured here"], identical["published"], identical[mp]) == (1.0, 1.0, 1.0)
    assert identical["source"] == "xbill9/sagemaker-gemma compare.py"


def test_a_headline_without_a_published_row_or_of_two_sizes_shows_no_ratio(tmp_path):
    from gemma4_t4.bench.compare import compare_suites
    from gemma4_t4.bench.published import Kind, headline_rows

    _suite_run(tmp_path / "a" / "r", model="gemma-4-31B")
    _suite_run(tmp_path / "b" / "r", model="gemma-4-31B", gpu="l4")
    (headline,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    rows = headline_rows(headline).table_rows()
    assert all(r["published"] is None and r["measured / published"] is None for r in rows)
    assert {r["published under"] for r in rows} == {"not published"} and {r["source"] for r in rows} == {""}
    assert rows[4]["measured here"] is None  # no answers compared
    headline.kind_b = Kind("E4B", "l4")  # sides of two sizes: no T4/L4 kind to compare with
    assert headline_rows(headline).table_rows()[2]["measured on"] == "not recorded"


# ---------------------------------------------------------------- the edges a reader meets less often


def test_records_reach_the_disk_as_they_are_added_so_a_killed_run_keeps_them(tmp_path):
    writer = ResultsWriter(tmp_path / "r", RunInfo(workload="decode"))
    writer.add_record("c", "measure", _record(0))
    try:
        assert [r.request_id for r in read_records(tmp_path / "r" / RECORDS_FILE)] == ["r-0"]
    finally:
        writer.close()


def test_open_loop_cells_match_only_at_the_same_offered_rate(tmp_path):
    records = [_record(i) for i in range(2)]

    def rate(path: Path, rps: float) -> BenchRun:
        loop = OpenLoopInfo(offered_rate_rps=rps, max_in_flight=8)
        return _write(path, [(_cell(f"rate-{rps:g}", records, concurrency=None, open_loop=loop), records)])

    a, same, faster = rate(tmp_path / "a", 2.0), rate(tmp_path / "b", 2.0), rate(tmp_path / "c", 4.0)
    assert compare_runs(a.dir, same.dir).cells[0].key == ("decode", None, None, 2.0, 16, 8)
    assert compare_runs(a.dir, faster.dir).unmatched_b == ["rate-4"]


def test_a_side_with_no_timed_window_shows_no_throughput_ratio(tmp_path):
    """Records without an end time leave no window to divide by: the ratio is blank, never a crash."""
    timed = [_record(i) for i in range(2)]
    untimed = [r.model_copy(update={"end_s": None}) for r in timed]
    a = _write(tmp_path / "a", [(_cell("c", untimed), untimed)])
    b = _write(tmp_path / "b", [(_cell("c", timed), timed)])
    for x, y in ((a, b), (b, a)):
        row = _rows(compare_runs(x.dir, y.dir))["output_throughput_tok_s"]
        assert row["B/A [95 % interval]"] is None and None in (row["A"], row["B"])


def test_an_answers_run_against_a_decode_run_says_one_side_holds_no_answers(tmp_path):
    answers, decode = _answers_run(tmp_path / "a"), _decode(tmp_path / "b")
    comparison = compare_runs(answers.dir, decode.dir)
    assert comparison.answers is not None and comparison.answers.line() == "not measured: B holds no answers"
    assert comparison.problems == ["answers not measured: B holds no answers"]
    assert compare_runs(decode.dir, answers.dir).answers.line() == "not measured: A holds no answers"


def test_answers_cells_of_other_facts_still_compare_their_answers_without_nothing_compared(tmp_path):
    a = _answers_run(tmp_path / "a")
    b = _answers_run(tmp_path / "b")
    summary = json.loads((b.dir / SUMMARY_FILE).read_text())
    summary["cells"][0]["concurrency"] = 4
    (b.dir / SUMMARY_FILE).write_text(json.dumps(summary))
    comparison = compare_runs(a.dir, b.dir)
    assert comparison.cells == [] and comparison.answers.all_identical and comparison.problems == []


def test_a_missing_records_row_keeps_which_way_is_better(tmp_path):
    a, b = _decode(tmp_path / "a"), _decode(tmp_path / "b")
    (b.dir / RECORDS_FILE).unlink()
    better = {r["metric"]: r["higher is better"] for r in compare_runs(a.dir, b.dir).table_rows()}
    assert better == {"ttft_ms": False, "tpot_ms": False, "e2el_ms": False, "per_stream_tok_s": True}


def test_a_build_without_a_published_t4_figure_shows_its_l4_row_and_no_ratio(tmp_path):
    from gemma4_t4.bench.compare import compare_suites

    for side, gpu in (("a", "t4"), ("b", "l4")):
        _suite_run(tmp_path / side / "r", config={"gpu": gpu, "model_format": "bf16"})
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    published = h.table_rows()[3]
    assert published["figure"] == "published (gemma-4-E2B bf16, not our measurement): decode tok/s T4 | L4"
    assert (published["A"], published["B"], published["A/B [95 % interval]"]) == (None, 51.3, None)
    assert h.notes() == [
        f"published (gemma-4-E2B bf16, not our measurement): identical answers -  [{h.published.source}]"
    ]


def test_a_side_without_a_one_stream_cell_has_no_ttft_or_decode_figure(tmp_path):
    from gemma4_t4.bench.compare import compare_suites

    _suite_run(tmp_path / "a" / "r")
    records = [_record(i) for i in range(2)]
    _write(tmp_path / "b" / "r", [(_cell("decode-c8", records, concurrency=8), records)], model="google/gemma-4-E2B-it",
           base_url="http://10.0.0.5:8000", config={"gpu": "l4"})  # fmt: skip
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    assert h.ttft_a_ms == pytest.approx(100.0) and h.ttft_b_ms is None and h.ttft_ratio is None
    assert (
        h.decode_method is None and h.table_rows()[0]["A/B [95 % interval]"] == "not measured on both sides"
    )
    assert h.usd_per_mtok_b  # its c=8 cell is still priced
    (back,) = compare_suites(tmp_path / "b", tmp_path / "a").headlines
    assert back.ttft_ratio is None and back.ttft_b_ms == pytest.approx(100.0)


def test_a_ttft_run_gives_the_ttft_and_a_side_is_priced_at_its_best_cell(tmp_path):
    """The TTFT is the first one-stream cell's (a ttft cell counts); the price is the fastest decode or
    load cell's, as the instances that cell was priced as; an untimed cell is passed over."""
    from gemma4_t4.bench.compare import compare_suites
    from gemma4_t4.bench.schemas import Derived

    def priced(key: str) -> Derived:
        return Derived(usd_per_million_output_tokens={key: 1.0})

    slow_ttft = [_record(i, ttft=0.2) for i in range(2)]
    decode = [_record(i) for i in range(2)]
    load = [_record(i, gap=0.001) for i in range(2)]
    untimed = [r.model_copy(update={"end_s": None}) for r in decode]
    info = {"model": "google/gemma-4-E2B-it", "base_url": "http://10.0.0.5:8000", "config": {"gpu": "t4"}}
    _write(tmp_path / "a" / "r", [
        (_cell("ttft-512", slow_ttft, workload="ttft", input_len=512), slow_ttft),
        (_cell("decode-c1", decode, derived=priced("ec2:g4dn.xlarge")), decode),
        (_cell("load-c16", load, workload="load", concurrency=16, derived=priced("sagemaker:ml.g4dn.xlarge")), load),
        (_cell("decode-c4", untimed, concurrency=4, derived=priced("gce:n1-standard-2+t4")), untimed),
    ], **info)  # fmt: skip
    _suite_run(tmp_path / "b" / "r", gpu="l4")
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    assert h.ttft_a_ms == pytest.approx(200.0)
    assert list(h.usd_per_mtok_a) == ["sagemaker:ml.g4dn.xlarge"]
    best = 16 / 0.108  # the load cell: 8 tokens 1 ms apart after 100 ms, two requests
    assert h.usd_per_mtok_a["sagemaker:ml.g4dn.xlarge"] == pytest.approx(0.736 / (best * 3600) * 1e6)


def test_a_local_run_is_priced_as_the_gpu_it_ran_on(tmp_path):
    from gemma4_t4.bench.compare import compare_suites

    for side, name in (("a", "Tesla T4"), ("b", "NVIDIA L4")):
        _suite_run(tmp_path / side / "r", base_url="http://127.0.0.1:8000", config={},
                   environment={"gpus": [{"name": name}]})  # fmt: skip
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    assert "ec2:g4dn.xlarge" in h.usd_per_mtok_a and "ec2:g6.xlarge" in h.usd_per_mtok_b
    assert (h.kind_a.gpu, h.kind_b.gpu) == ("t4", "l4")


def test_a_local_run_declared_as_another_gpu_is_not_priced_as_that_one(tmp_path):
    """The headline names the host's GPU; the price is that GPU's or none, never the declared one's."""
    from gemma4_t4.bench.compare import compare_suites

    for side, name in (("a", "Tesla T4"), ("b", "NVIDIA L4")):
        _suite_run(tmp_path / side / "r", base_url="http://127.0.0.1:8000", config={"gpu": "l4"},
                   environment={"gpus": [{"name": name}]})  # fmt: skip
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    assert h.kind_a.gpu == "t4" and h.usd_per_mtok_a == {}
    assert h.unpriced_a == "no $/Mtok: measured on T4, priced as L4"
    assert h.kind_b.gpu == "l4" and "ec2:g6.xlarge" in h.usd_per_mtok_b and h.unpriced_b is None


def test_a_series_without_samples_falls_back_to_the_one_stream_cell(tmp_path):
    from gemma4_t4.bench.compare import compare_suites
    from gemma4_t4.bench.schemas import SeriesDecode

    empty = SeriesDecode(short_tokens=16, long_tokens=512)
    _suite_run(tmp_path / "a" / "r", series_decode=empty)
    _suite_run(tmp_path / "b" / "r", gpu="l4", series_decode=empty)
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    assert h.decode_method == "per-stream c=1" and h.decode_ratio == pytest.approx(1.0)


def test_the_plain_refusals_name_what_a_run_does_not_give(tmp_path):
    """Called without saying what for: "a result" and "a per-stream decode speed"."""
    stopped = _decode(tmp_path / "s", status="aborted: x")
    with pytest.raises(Gemma4T4Error) as error:
        stopped.require_complete()
    assert error.value.message == f"not measured: run {stopped.dir} is aborted: x, so it gives no a result"
    flushed = _decode(tmp_path / "f", flush=True)
    with pytest.raises(Gemma4T4Error) as error:
        flushed.require_streamed()
    assert error.value.message.startswith(f"{flushed.dir} gives no a per-stream decode speed: not measured: ")
    with pytest.raises(Gemma4T4Error, match="already holds benchmark results"):
        ResultsWriter(stopped.dir, RunInfo())  # a run folder is replaced only when asked


def test_the_published_rows_are_built_from_the_series_figures_as_printed():
    """mutmut builds the module's tables once, at import: the builders are called here again with the
    series' own figures (GCE run, 512 tokens in), and must give the rows the notebooks print."""
    from gemma4_t4.bench import published

    rows = published._gce("qat", [(512, 8, 215.91, 37.83, 1301), (512, 16, 213.79, 34.69, 5903)])
    assert rows == [published.gce_t4("qat", 512, 8), published.gce_t4("qat", 512, 16)]
    assert [r.note for r in rows] == ["", "queueing (c > max-num-seqs 8)"]  # above vLLM's 8 sequences
    ratio = published._ratio("t4", "GCE T4, 512 in / 128 out, c=1", published.gce_t4("bf16"), published.gce_t4("qat"),
                             "per_stream_tok_s")  # fmt: skip
    assert ratio == published.T4_QAT_VS_BF16_C1 and (ratio.baseline_value, ratio.value) == (40.44, 72.31)
    assert (ratio.model, ratio.baseline, ratio.build, ratio.source) == (
        "gemma-4-E2B",
        "bf16",
        "qat",
        published.GCE_SOURCE,
    )


def test_two_matched_cells_each_show_their_rows_and_an_unmatched_first_cell_stops_nothing(tmp_path):
    records = [_record(i) for i in range(2)]

    def cells(*concurrencies: int) -> list:
        return [(_cell(f"decode-c{c}", records, concurrency=c), records) for c in concurrencies]

    a = _write(tmp_path / "a", cells(8, 1, 4))
    b = _write(tmp_path / "b", cells(1, 4))
    comparison = compare_runs(a.dir, b.dir)
    assert comparison.unmatched_a == ["decode-c8"] and comparison.unmatched_b == []
    assert [r["cell"] for r in comparison.table_rows()] == ["decode-c1"] * 5 + ["decode-c4"] * 5


def test_an_incomplete_a_side_is_named_as_a_in_runs_and_suites(tmp_path):
    from gemma4_t4.bench.compare import compare_suites

    stopped = _suite_run(tmp_path / "a" / "r", status="aborted: x")
    done = _suite_run(tmp_path / "b" / "r", gpu="l4")
    comparison = compare_runs(stopped.dir, done.dir)
    assert (
        comparison.caption()
        == f"B/A ratios (A = {stopped.dir}, B = {done.dir}); not measured: A: run {stopped.dir} is aborted: x"
    )
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    assert (
        h.not_measured == [f"A: run {stopped.dir} is aborted: x"]
        and h.kind_a is None
        and h.kind_b.gpu == "l4"
    )


def test_a_flushed_row_keeps_which_way_is_better(tmp_path):
    a, b = _decode(tmp_path / "a"), _decode(tmp_path / "b", flush=True)
    better = {r["metric"]: r["higher is better"] for r in compare_runs(a.dir, b.dir).table_rows()}
    assert better["tpot_ms"] is False and better["per_stream_tok_s"] is True


def test_a_cell_without_records_still_names_both_cells_and_their_drafters(tmp_path):
    records = [_record(i) for i in range(2)]
    spec = SpecDecode(acceptance_rate=0.5, mean_accepted_length=2.0)
    a = _write(tmp_path / "a", [(_cell("old", records, spec_decode=spec), records)])
    b = _write(tmp_path / "b", [(_cell("new", records, spec_decode=SpecDecode(source="/metrics")), records)])
    (b.dir / RECORDS_FILE).unlink()
    comparison = compare_runs(a.dir, b.dir)
    assert comparison.cells[0].key == ("decode", None, 1, None, 16, 8)
    rows = _rows(comparison)
    assert rows["ttft_ms"]["cell"] == "old vs new"
    assert (rows["drafter"]["A"], rows["drafter"]["B"]) == (
        "accepted 50.0%, mean accepted length 2.00",
        "on (/metrics)",
    )


def test_runs_that_name_no_model_are_compared_as_one_unnamed_model(tmp_path):
    from gemma4_t4.bench.compare import compare_suites

    _suite_run(tmp_path / "a" / "r", model=None)
    _suite_run(tmp_path / "b" / "r", model=None, gpu="l4")
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    assert h.model == "?" and h.decode_ratio == pytest.approx(1.0)


def test_a_suite_compares_its_answers_run_not_its_decode_run(tmp_path):
    """Each side holds a decode run and an answers run of one model: the answers runs are compared;
    an answers run that stopped before any answer is still the one compared (not measured, named)."""
    from gemma4_t4.bench.compare import compare_suites

    model = {"model": "google/gemma-4-E2B-it"}
    for side, gpu in (("a", "t4"), ("b", "l4")):
        _suite_run(tmp_path / side / "1-decode", gpu=gpu)
        _answers_run(tmp_path / side / "2-answers", config={"gpu": gpu}, **model)
    (h,) = compare_suites(tmp_path / "a", tmp_path / "b").headlines
    assert h.answers.measured and h.answers.all_identical
    stopped = _write(tmp_path / "c" / "2-answers", [], workload="answers", status="aborted: x", **model)
    _suite_run(tmp_path / "c" / "1-decode")
    (h,) = compare_suites(tmp_path / "c", tmp_path / "b").headlines
    assert h.answers is not None and h.answers.line() == f"not measured: A: run {stopped.dir} is aborted: x"
    (h,) = compare_suites(tmp_path / "b", tmp_path / "c").headlines
    assert h.answers.line() == f"not measured: B: run {stopped.dir} is aborted: x"
    _suite_run(tmp_path / "d" / "1-decode")  # no answers run on this side: no answers compared
    (h,) = compare_suites(tmp_path / "a", tmp_path / "d").headlines
    assert h.answers is None
    (h,) = compare_suites(tmp_path / "d", tmp_path / "a").headlines
    assert h.answers is None
