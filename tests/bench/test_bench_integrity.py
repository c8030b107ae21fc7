"""What the bench prints is what it measured: bogus usage from a server fails the request (never
a crash), ``--out`` never mixes a run into a folder of other files, ``bench compare`` computes
what it prints from the records, answers that came in one flush give no per-stream speed, and
the answer comparison is exact over the questions both runs answered."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from fakes.bench_cli_args import bench_run_argv
from fakes.fake_openai_server import FakeScript, FakeServer, FakeServerState

from gemma4_t4.bench import compare_runs, run_benchmark
from gemma4_t4.bench.answers import QUESTIONS, compare_answers, is_correct
from gemma4_t4.bench.compare import compare_suites
from gemma4_t4.bench.metrics import FLUSH_FLOOR_MS_PER_TOKEN, aggregate, delivered_in_one_flush, median
from gemma4_t4.bench.published import Kind
from gemma4_t4.bench.results import load_run
from gemma4_t4.bench.schemas import Answer, RequestRecord
from gemma4_t4.cli import main as cli_main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.safepaths import MARKER_NAME
from gemma4_t4.serving.server_state import free_port

DECODE = {"concurrency": [1], "input_len": 16, "output_len": 6, "num_prompts": 4, "warmup": 1}


def _decode(server, out, **opts):
    return run_benchmark(server.base_url, "fake-model", "decode", out, progress=False, **(DECODE | opts))


# ---------------------------------------------------------------- (8) bogus usage


@pytest.mark.parametrize(
    "usage, shown",
    [
        ({"completion_tokens": math.nan}, "usage.completion_tokens = NaN"),
        ({"completion_tokens": -5}, "usage.completion_tokens = -5"),
        ({"completion_tokens": "6"}, 'usage.completion_tokens = "6"'),
        ({"prompt_tokens": math.inf}, "usage.prompt_tokens = Infinity"),
        ({"completion_tokens": 10**9}, "more than the 6 asked for"),
    ],
)
def test_bogus_usage_fails_the_requests_naming_what_the_server_sent(tmp_path, capsys, usage, shown):
    """A server sending usage.completion_tokens NaN once crashed `bench run` with a pydantic
    ValidationError ("report it") and left run.json marked complete with zero cells."""
    state = FakeServerState(default=FakeScript(ttft_s=0.001, gap_s=0.001, usage_fields=usage))
    with FakeServer(free_port(), state) as server:
        argv = bench_run_argv(server.base_url, "fake-model", "decode", "--concurrency", "1", "--input-len", "16",
                              "--output-len", "6", "--num-prompts", "3", "--no-plots", "--out", str(tmp_path / "r"))  # fmt: skip
        code = cli_main(argv)
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    assert "Traceback" not in err and "report it" not in out + err and "ValidationError" not in out + err
    run = load_run(tmp_path / "r")
    assert run.status == "complete with failures" and run.not_measured and run.cells
    (cell,) = run.cells
    assert cell.completed == 0 and cell.failed == 3 and cell.errors == {"bad_usage": 3}
    assert shown in cell.error_examples["bad_usage"]


def test_a_run_stopped_by_any_error_is_never_marked_complete(tmp_path, monkeypatch):
    """The crash above once left run.json and summary.json saying "complete" with zero cells."""
    from gemma4_t4.bench import workloads

    def broken(*args, **kwargs):
        raise ValueError("a summary that could not be built")

    monkeypatch.setattr(workloads, "_summarize_cell", broken)
    state = FakeServerState(default=FakeScript(ttft_s=0.001, gap_s=0.001))
    with FakeServer(free_port(), state) as server, pytest.raises(ValueError):
        _decode(server, tmp_path / "r")
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert run["status"] == summary["run"]["status"] == "aborted: ValueError"
    assert "could not be built" in run["error"]


# ---------------------------------------------------------------- (13) --out


def test_out_refuses_a_non_empty_folder_even_dot_without_overwrite(tmp_path, monkeypatch, capsys):
    """`bench run --out .` once wrote its results among the current folder's files."""
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    with FakeServer(free_port(), FakeServerState(default=FakeScript(ttft_s=0.001, gap_s=0.001))) as server:
        argv = bench_run_argv(server.base_url, "fake-model", "decode", "--concurrency", "1", "--input-len", "16",
                              "--output-len", "4", "--num-prompts", "2", "--no-plots", "--out", ".")  # fmt: skip
        assert cli_main(argv) == 2
        assert "--out . is not empty" in capsys.readouterr().err
        # --overwrite does not make a folder of other files the bench's
        assert cli_main(argv + ["--overwrite"]) == 2
        assert "did not write" in capsys.readouterr().err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
        # an empty folder is new enough; a bench folder is replaced with --overwrite, its own files only
        (tmp_path / "empty").mkdir()
        run = _decode(server, tmp_path / "empty")
        assert run.status == "complete" and (tmp_path / "empty" / MARKER_NAME).is_file()
        (tmp_path / "empty" / "mine.txt").write_text("keep")
        (tmp_path / "empty" / "roofline.png").write_text("stale plot of the old run")
        with pytest.raises(Gemma4T4Error, match="already holds benchmark results"):
            _decode(server, tmp_path / "empty")
        again = _decode(server, tmp_path / "empty", overwrite=True)
    assert again.run.run_id != run.run.run_id and load_run(tmp_path / "empty").run.run_id == again.run.run_id
    assert (tmp_path / "empty" / "mine.txt").read_text() == "keep"
    assert not (tmp_path / "empty" / "roofline.png").exists()
    assert len([r for r in load_run(tmp_path / "empty").records if r.phase == "measure"]) == 4


# ---------------------------------------------------------------- (14) compare from the records


def _tamper(run_dir: Path, **medians) -> None:
    path = run_dir / "summary.json"
    data = json.loads(path.read_text())
    for cell in data["cells"]:
        for key, value in medians.items():
            if isinstance(cell.get(key), dict):
                cell[key]["median"] = value
            else:
                cell[key] = value
    path.write_text(json.dumps(data))


def test_compare_prints_figures_from_the_records_not_an_edited_summary(tmp_path, capsys):
    """`bench compare` once printed "-5,000.00" and "nan" from edited summaries beside ratios from records."""
    with FakeServer(free_port(), FakeServerState(default=FakeScript(ttft_s=0.02, gap_s=0.004))) as server:
        a, b = _decode(server, tmp_path / "a"), _decode(server, tmp_path / "b")
    _tamper(a.dir, ttft_ms=-5000.0, tpot_ms=math.nan, output_throughput_tok_s=-1.0)
    _tamper(b.dir, e2el_ms=math.nan, per_stream_tok_s=-5000.0)
    assert cli_main(["bench", "compare", str(a.dir), str(b.dir)]) == 0
    out = capsys.readouterr().out
    assert "-5,000.00" not in out and "nan" not in out.lower() and "-1.00" not in out
    result = compare_runs(a.dir, b.dir)
    ratios = {r.metric: r for r in result.cells[0].ratios}
    true_a = aggregate(load_run(a.dir).measured(a.cells[0].cell))
    assert ratios["ttft_ms"].a == pytest.approx(true_a.ttft_ms.median) and ratios["ttft_ms"].a > 0
    assert ratios["output_throughput_tok_s"].a == pytest.approx(true_a.output_throughput_tok_s)
    # without records there is nothing to check the summary against: refused, naming the file
    (a.dir / "records.jsonl").unlink()
    assert cli_main(["bench", "compare", str(a.dir), str(b.dir)]) == 1
    out = capsys.readouterr().out
    assert "records.jsonl holds no measured records" in out and "-5,000.00" not in out


# ---------------------------------------------------------------- buffered streams


def _record(i: int, chunks: list[float], n: int | None = None, send: float = 0.0) -> RequestRecord:
    return RequestRecord(
        request_id=f"c-{i}", send_s=send, first_chunk_s=chunks[0], first_token_s=chunks[0],
        first_content_s=chunks[0], last_choice_s=chunks[-1], end_s=chunks[-1], chunk_times_s=chunks,
        completion_tokens=n or len(chunks), token_source="usage",
    )  # fmt: skip


def test_the_flush_rule_on_recorded_arrival_times():
    # vLLM's CPU build as recorded: 32 tokens 80 ms after sending, all within 0.25 ms of the first
    cpu_flush = _record(0, [0.080 + k * 0.25e-3 / 31 for k in range(32)])
    # a streaming decoder: 15 ms a token; a drafter's burst of 4 tokens in one chunk, 12 ms apart
    streamed = _record(1, [0.040 + k * 0.015 for k in range(32)])
    drafted = _record(2, [0.040 + k * 0.012 for k in range(8)], n=32)
    one_chunk = _record(3, [0.050], n=12)  # every token in a single chunk
    at_floor = _record(4, [0.0, FLUSH_FLOOR_MS_PER_TOKEN / 1000 * 9], n=10)  # exactly the floor: measured
    assert [delivered_in_one_flush(r) for r in (cpu_flush, streamed, drafted, one_chunk, at_floor)] == [
        True, False, False, True, False,
    ]  # fmt: skip
    failed = cpu_flush.model_copy(update={"error": "timeout"})
    unstreamed = one_chunk.model_copy(update={"streamed": False})
    assert not delivered_in_one_flush(failed) and not delivered_in_one_flush(unstreamed)

    cell = aggregate([cpu_flush, cpu_flush.model_copy(update={"request_id": "c-5"})])
    assert cell.buffered is not None and cell.buffered.requests == 2 and cell.buffered.tokens == 32
    assert cell.tpot_ms.n == 0 and cell.itl_ms.n == 0 and cell.per_stream_tok_s.median is None
    assert cell.e2el_ms.median == pytest.approx(80.25) and cell.output_throughput_tok_s > 0
    assert cell.buffered.reason.startswith("not measured: the server delivered 32 tokens in one flush")
    good = aggregate([streamed])
    assert good.buffered is None and good.tpot_ms.median == pytest.approx(15.0)


def test_a_flushing_server_gets_no_per_stream_speed_anywhere(tmp_path, capsys):
    """`make run` on cpu once printed "per-stream tok/s QAT c=1: 133,935.3" and a 328.8x ratio."""
    flush = FakeServerState(default=FakeScript(ttft_s=0.03, flush=True))  # every chunk in one write
    # 128 tokens: the floor (12.7 ms) dwarfs parsing one write (~20 us a chunk) and a thread switch
    # (5 ms); no /metrics sampler thread competes with the parse
    opts = {"output_len": 128, "sample_metrics": False}
    with FakeServer(free_port(), flush) as server:
        a, b = _decode(server, tmp_path / "a", **opts), _decode(server, tmp_path / "b", **opts)
    (cell,) = a.cells
    assert cell.buffered and cell.per_stream_tok_s.median is None and cell.output_throughput_tok_s > 0
    reason = "not measured: the server delivered 128 tokens in one flush"
    row = a.table_rows()[0]
    assert row["per-stream tok/s (median)"].startswith(reason) and row["TPOT ms (median)"].startswith(reason)
    assert row["E2EL ms (median)"] > 30 and reason in a.table()
    with pytest.raises(Gemma4T4Error, match=reason) as err:
        a.require_streamed()
    assert err.value.fix
    speed = a.decode_speed()
    assert speed.not_measured.startswith(reason) and speed.per_stream is None
    assert speed.output_tok_s[1] > 0 and speed.e2el_ms[1] > 30
    assert cli_main(["bench", "compare", str(a.dir), str(b.dir)]) == 0
    out = capsys.readouterr().out
    rows = {r["metric"]: r for r in compare_runs(a.dir, b.dir).table_rows()}
    per_stream = rows["per_stream_tok_s"]  # no figure on either side, and the reason where the ratio would be
    assert (per_stream["A"], per_stream["B"]) == (None, None) and reason in per_stream["B/A [95 % interval]"]
    assert reason in next(line for line in out.splitlines() if "per_stream_tok_s" in line)
    # output tok/s (all streams) still is measured: a ratio of 3 decimals
    assert re.search(r"output_throughput_tok_s .* \d+\.\d{3} \[no interval\]$", out, re.M)
    # the T4-vs-L4 headline says why it has no decode ratio
    for side in ("ta", "tb"):
        (tmp_path / side).mkdir()
    a.dir.rename(tmp_path / "ta" / "run")
    b.dir.rename(tmp_path / "tb" / "run")
    (headline,) = compare_suites(tmp_path / "ta", tmp_path / "tb").headlines
    assert headline.decode_ratio is None and reason in str(headline)


def test_the_fake_servers_injected_per_token_timings_are_measured(tmp_path):
    # 12 tokens 30 ms apart: only a client stalled for the whole 330 ms could see them bunched
    with FakeServer(free_port(), FakeServerState(default=FakeScript(ttft_s=0.02, gap_s=0.03))) as server:
        run = _decode(server, tmp_path / "r", output_len=12)
    (cell,) = run.cells
    assert cell.buffered is None and cell.tpot_ms.n == 4 and cell.per_stream_tok_s.median > 0
    assert run.decode_speed().not_measured is None


# ---------------------------------------------------------------- no price from a tiny model


def test_only_a_real_model_on_its_priced_gpu_gets_a_price():
    assert Kind("tiny", "cpu").unpriced().startswith("no $/Mtok: a tiny random model on a CPU")
    assert "not a priced GPU" in Kind("E2B", "cpu").unpriced()
    assert "did not record" in Kind(None, "t4").unpriced()
    assert "priced as T4" in Kind("E2B", "l4").unpriced(priced_gpu="t4")
    assert Kind("E2B", "t4").unpriced(priced_gpu="t4") is None


# ---------------------------------------------------------------- answers: exact, over shared questions


def _set(texts: dict[int, str]) -> list[Answer]:
    return [Answer(index=i, question=QUESTIONS[i][0], text=t) for i, t in texts.items()]


def test_answer_total_counts_the_questions_both_runs_answered():
    a = _set({i: "Paris" for i in range(20)})
    b = _set({i: "Paris" for i in range(0, 20, 2)})
    result = compare_answers(a, b)
    assert (result.total, result.identical) == (10, 10) and result.line() == "10/10"
    assert compare_answers(b, a).total == 10


def test_answers_compare_exactly_no_prefix_no_whitespace_folding():
    assert is_correct("Paris.", "Paris") and is_correct("  paris is the capital", "Paris")
    assert not is_correct("Parisian", "Paris") and not is_correct("Par", "Paris")
    for a, b in (("Paris", "Parisian"), ("Parisian", "Paris"), ("Paris", " Paris"), ("Paris", "Paris\n"),
                 ("Paris is", "Paris  is"), ("Paris", "paris")):  # fmt: skip
        result = compare_answers(_set({0: a}), _set({0: b}))
        assert (result.identical, result.differing) == (0, [0]), (a, b)
    assert compare_answers(_set({0: "Paris is"}), _set({0: "Paris  is"})).first_divergence.char == 6
    assert compare_answers(_set({0: " Paris"}), _set({0: " Paris"})).identical == 1


def test_median_is_numpy_linear_on_an_even_count():
    assert median([1.0, 2.0, 10.0, 20.0]) == 6.0


def test_bogus_usage_in_a_whole_sagemaker_reply_fails_the_request_too():
    """The non-streamed SageMaker reply reads usage through the same check."""
    from gemma4_t4.bench.backends import _read_whole
    from gemma4_t4.bench.client import RequestSpec, StreamParser

    spec = RequestSpec("c-0", "hi", 6)
    parser = StreamParser(spec, 0.0)
    body = b'{"choices": [{"text": "ab", "finish_reason": "length"}], "usage": {"completion_tokens": NaN}}'
    _read_whole(parser, body, 0.5)
    record = parser.finish(keep_text=False, now=0.5)
    assert record.error == "bad_usage" and "usage.completion_tokens = NaN" in record.error_detail
    assert aggregate([record]).completed == 0


def _answer(i: int, text: str, correct: bool = False, error: str | None = None) -> Answer:
    return Answer(index=i, question=QUESTIONS[i][0], text=text, correct=correct, error=error)


def test_compare_answers_counts_and_shows_the_first_divergence_in_a_window():
    """The window is 20 characters before the first differing one and 40 from it, for each side."""
    head, tail_a, tail_b = "The answer is " + "a" * 30, "Z" + "b" * 50, "Y" + "c" * 50
    a = [_answer(0, "Paris", True), _answer(1, head + tail_a, True), _answer(2, "144"), _answer(3, "Au", True)]
    b = [_answer(0, "Paris", True), _answer(1, head + tail_b), _answer(2, "144", True), _answer(3, "Ag"),
         _answer(4, "Mars", True)]  # fmt: skip
    result = compare_answers(a, b)
    assert (result.total, result.identical, result.differing) == (4, 2, [1, 3])
    assert (result.correct_a, result.correct_b) == (3, 2)  # over the shared questions only
    assert result.measured and result.reason is None and not result.all_identical and result.line() == "2/4"
    d = result.first_divergence
    assert (d.index, d.question, d.char) == (1, QUESTIONS[1][0], 44)
    assert d.a_context == (head + tail_a)[24:84] == "a" * 20 + "Z" + "b" * 39
    assert d.b_context == "a" * 20 + "Y" + "c" * 39
    assert result.text() == "\n".join([
        "identical answers: 2/4 (correct: A 3, B 2)",
        f"first difference: question 1 ({QUESTIONS[1][0]!r}) at character 44:",
        f"  A: ...{d.a_context!r}",
        f"  B: ...{d.b_context!r}",
    ])  # fmt: skip


def test_a_divergence_near_the_start_shows_the_answer_from_its_first_character():
    d = compare_answers([_answer(5, "nine")], [_answer(5, "nineteen")]).first_divergence
    assert (d.index, d.char, d.a_context, d.b_context) == (5, 4, "nine", "nineteen")
    d = compare_answers([_answer(5, "x" * 10 + "1" + "y" * 60)], [_answer(5, "x" * 10 + "2")]).first_divergence
    assert (d.char, d.a_context, d.b_context) == (10, "x" * 10 + "1" + "y" * 39, "x" * 10 + "2")


def test_first_difference_is_the_first_differing_index_or_the_shorter_length():
    from gemma4_t4.bench.answers import first_difference

    assert [first_difference(a, b) for a, b in (("abc", "abd"), ("abc", "abcde"), ("abcde", "abc"),
                                                ("", "x"), ("same", "same"), ("xbc", "abc"))] == [2, 3, 3, 0, 4, 0]  # fmt: skip


def test_all_identical_answers_and_their_text():
    same = [_answer(0, "Paris", True), _answer(1, "144", True)]
    result = compare_answers(same, list(same))
    assert result.all_identical and result.line() == "2/2" and result.differing == []
    assert result.first_divergence is None
    assert result.text() == "identical answers: 2/2 (correct: A 2, B 2)"


@pytest.mark.parametrize(
    ("a", "b", "reason"),
    [
        ([], [_answer(0, "Paris")], "A holds no answers"),
        ([], [], "A holds no answers; B holds no answers"),
        ([_answer(0, "Paris")], [_answer(0, "", error="timeout"), _answer(1, "144")],
         "B: 1 of 2 answers failed (first: timeout)"),
        ([_answer(0, "", error="reset"), _answer(1, "", error="refused")], [_answer(0, "Paris")],
         "A: 2 of 2 answers failed (first: reset)"),
        ([_answer(0, "Paris")], [_answer(1, "144")], "A and B answered no question in common"),
    ],
)  # fmt: skip
def test_an_answer_comparison_that_is_no_result_says_why(a, b, reason):
    result = compare_answers(a, b)
    assert (result.measured, result.reason) == (False, reason)
    assert (result.total, result.identical, result.correct_a, result.correct_b) == (0, 0, 0, 0)
    assert result.first_divergence is None and result.differing == [] and not result.all_identical
    assert result.line() == f"not measured: {reason}"
    assert result.text() == f"identical answers: not measured: {reason}"


def test_empty_replies_and_answers_without_a_question_text():
    """Two empty replies are the same answer; an answer recorded without its question shows an
    empty question, never a placeholder; an empty reply is never correct."""
    assert compare_answers([_answer(0, "")], [_answer(0, "")]).line() == "1/1"
    d = compare_answers([Answer(index=0, text="a")], [Answer(index=0, text="b")]).first_divergence
    assert (d.question, d.char, d.a_context, d.b_context) == ("", 0, "a", "b")
    assert not is_correct("", "Paris") and not is_correct("   ", "Paris")
    assert is_correct("Xenon.", "Xenon") and is_correct("(Xenon)", "xenon")
