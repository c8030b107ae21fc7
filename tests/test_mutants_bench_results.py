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

from gemma4_t4.bench.metrics import aggregate
from gemma4_t4.bench.results import (
    RECORDS_FILE,
    RUN_FILE,
    SUMMARY_FILE,
    BenchRun,
    ResultsWriter,
    cells_to_csv,
    check_out_dir,
    format_cells,
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
    with pytest.raises(Gemma4T4Error, match="already holds benchmark results") as held:
        check_out_dir(run.dir, overwrite=False)
    assert held.value.fix == "choose a new --out directory (or pass --overwrite to replace a bench run)"
    assert check_out_dir(run.dir, overwrite=True) == run.dir
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(Gemma4T4Error, match=r"--out .*mine is not empty"):
        check_out_dir(tmp_path / "mine", overwrite=False)
    with pytest.raises(Gemma4T4Error, match="holds files the bench did not write") as foreign:
        check_out_dir(tmp_path / "mine", overwrite=True)
    assert foreign.value.fix == "choose a new --out directory"


def test_the_writer_replaces_only_its_own_files_and_marks_the_folder(tmp_path):
    """Re-running into a bench folder with --overwrite removes the old run's files, keeps a user's."""
    first = _decode(tmp_path / "r")
    (first.dir / "mine.txt").write_text("keep")
    (first.dir / "roofline.png").write_text("old plot")
    writer = ResultsWriter(first.dir, RunInfo(workload="decode"), overwrite=True)
    try:
        assert (first.dir / MARKER_NAME).is_file() and (first.dir / "mine.txt").read_text() == "keep"
        assert not (first.dir / "roofline.png").exists() and not (first.dir / SUMMARY_FILE).exists()
        assert (first.dir / RECORDS_FILE).read_text() == ""
        run = json.loads((first.dir / RUN_FILE).read_text())
        assert run["status"] == "running" and run["schema"] == RunInfo().schema_id
    finally:
        writer.close()
    writer.close()  # closing twice is harmless


@pytest.mark.skipif(
    not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no folder can be made"
)
def test_a_folder_that_cannot_be_created_is_one_error_naming_it():
    """An --out where no folder can be made fails with the OS's reason, not a traceback."""
    with pytest.raises(Gemma4T4Error) as error:
        ResultsWriter("/proc/gemma4-t4-out", RunInfo())
    assert error.value.message == "cannot create /proc/gemma4-t4-out: No such file or directory"
    assert error.value.fix == "choose a writable --out directory"


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
    out = run.save(tmp_path / "copy" / "deeper")
    assert out == tmp_path / "copy" / "deeper"
    copy = load_run(out)
    assert copy.run.run_id == run.run.run_id and [c.cell for c in copy.cells] == ["decode-c1"]
    assert (out / "summary.csv").is_file() and run.save() == run.dir


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
    assert ok.table().startswith("cell") and ok.report().table == ok.table()
    stopped = _decode(tmp_path / "s", status="aborted: x")
    assert stopped.caption() == f"decode: not measured: run {stopped.dir} is aborted: x"
    assert stopped.table().startswith(f"not measured: run {stopped.dir} is aborted: x (the cells below")
    report = stopped.report()
    assert (report.status, report.out_dir, report.failed) == ("aborted: x", str(stopped.dir), 0)
    assert report.cells == stopped.cells and report.run == stopped.run
    nameless = _write(tmp_path / "n", [], workload=None)
    assert nameless.caption() == "run"


# ---------------------------------------------------------------- results.py: accessors


def _sweep(tmp_path: Path) -> BenchRun:
    """c=1 and c=8 decode, a load cell, a ttft cell at 512 tokens, a shared-prefix cell."""
    fast, slow = [_record(i, gap=0.01) for i in range(4)], [_record(i, gap=0.04) for i in range(4)]
    return _write(tmp_path / "sweep", [
        (_cell("decode-c1", fast), fast),
        (_cell("decode-c8", slow, concurrency=8), slow),
        (_cell("load-c16", slow, workload="load", concurrency=16), slow),
        (_cell("ttft-512", fast, workload="ttft", input_len=512), fast),
        (_cell("ttft-0", fast, workload="ttft", input_len=0), fast),
        (_cell("prefix", fast, workload="prefix", variant="shared_prefix",
               prefix_cache=PrefixCache(hit_rate=0.75)), fast),
    ])  # fmt: skip


def test_the_decode_accessors_read_each_concurrency(tmp_path):
    run = _sweep(tmp_path)
    per_stream = run.per_stream_by_concurrency()
    assert sorted(per_stream) == [1, 8]
    assert per_stream[1] == pytest.approx(100.0) and per_stream[8] == pytest.approx(25.0)
    assert run.e2el_by_concurrency() == pytest.approx({1: 170.0, 8: 380.0})
    throughput = run.throughput_by_concurrency()
    assert sorted(throughput) == [1, 8, 16]
    assert throughput[1] == pytest.approx(32 / 0.171) and throughput[16] == pytest.approx(32 / 0.381)
    assert run.ttft_by_input_len() == pytest.approx({512: 100.0})
    assert run.prefix_hit_rate() == 0.75
    assert _decode(tmp_path / "plain").prefix_hit_rate() is None
    speed = run.decode_speed()
    assert speed.streamed and speed.per_stream == per_stream and speed.output_tok_s == throughput
    assert speed.e2el_ms == run.e2el_by_concurrency() and run.require_streamed() is run


def test_a_cell_is_found_by_its_facts_or_the_error_lists_the_cells(tmp_path):
    run = _sweep(tmp_path)
    assert run.cell("decode-c8").concurrency == 8
    assert run.cell(workload="decode", concurrency=8).cell == "decode-c8"
    assert run.cell(workload="ttft", input_len=512).cell == "ttft-512"
    assert run.cell(variant="shared_prefix").cell == "prefix"
    with pytest.raises(
        Gemma4T4Error, match=r"^2 cells of .* match; cells: \['decode-c1', 'decode-c8'"
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
    assert error.value.fix.startswith(
        "read its output tok/s and E2EL instead (they time the whole generation)"
    )
    rows = [r.model_dump(by_alias=True) for r in run.rows()]
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
    first, second = (r.model_dump(by_alias=True) for r in run.table_rows())
    assert first == {
        "workload": "decode", "variant": None, "concurrency": 1, "input tokens": 16, "output tokens": 8,
        "ok": 4, "failed": 0, "TTFT ms (median)": pytest.approx(100.0), "TPOT ms (median)": pytest.approx(20.0),
        "per-stream tok/s (median)": pytest.approx(50.0), "E2EL ms (median)": pytest.approx(240.0),
        "output tok/s (all streams)": pytest.approx(32 / 0.241), "prefix cache hit rate": None,
    }  # fmt: skip
    assert second["concurrency"] == "2.5 req/s" and second["variant"] == "poisson"
    assert second["prefix cache hit rate"] == 0.5


# ---------------------------------------------------------------- results.py: the text table


def test_the_text_table_shows_each_cells_medians_and_flags(tmp_path):
    records = [_record(i) for i in range(4)]
    flushed = [_record(i, flush=True) for i in range(4)]
    spec = SpecDecode(acceptance_rate=0.376, mean_accepted_length=2.128, source="/metrics")
    cells = [
        _cell("decode-c1", records, queueing=True, partial=True, spec_decode=spec,
              prefix_cache=PrefixCache(hit_rate=0.5)),
        _cell("open-2", records, concurrency=None, input_len=None, output_len=None,
              open_loop=OpenLoopInfo(offered_rate_rps=2.5, max_in_flight=4, cap_reached=True)),
        _cell("decode-c8-" + "x" * 60, flushed, concurrency=8),
        _cell("drafter-unknown", records, spec_decode=SpecDecode(acceptance_rate=0.5)),
    ]  # fmt: skip
    header, rule, first, second, third, fourth = format_cells(cells).splitlines()
    assert header.split() == ["cell", "c", "in", "out", "ok/fail", "TTFT", "p50", "TTFT", "p90", "TPOT", "p50",
                              "ITL", "p99", "stream", "t/s", "out", "tok/s", "hit", "%"]  # fmt: skip
    assert rule == "-" * len(header)
    assert first.startswith("decode-c1" + " " * 35 + "   1    16    8      4/0     100.0     100.0     20.00")
    assert "50.0" in first and f"{32 / 0.241:,.1f}" in first and " 50.0 [queueing] [partial]" in first
    assert first.endswith("[drafts accepted 38%, mean accepted length 2.13]")
    assert second.startswith("open-2" + " " * 38 + " 2.5/s     -    -      4/0")
    assert second.endswith("[in-flight cap reached]") and "[queueing]" not in second
    assert third.startswith("decode-c8-" + "x" * 34 + "   8")  # the name cut at 44 characters
    assert "       -" in third and third.endswith(
        "[TPOT, ITL, stream t/s not measured: the server delivered 8 tokens in one flush "
        "(4 of 4 requests: every token within 0.00 ms of the first)]"
    )
    assert "drafts accepted" not in fourth and "[" not in fourth


def test_the_text_table_groups_thousands_and_rounds_as_labelled(tmp_path):
    slow = [_record(i, ttft=1.23456, gap=0.001) for i in range(4)]
    line = format_cells([_cell("c", slow)]).splitlines()[2]
    assert "1,234.6" in line and "1.00" in line and "1,000.0" in line
