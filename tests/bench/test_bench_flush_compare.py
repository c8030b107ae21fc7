"""Where a stream came in one flush (or its record is corrupt), every reader of the run says so:
a streamed run compared with a flushed one names the flush where the ratio would be, a run whose
c=1 streamed but c=8 flushed names its c=8 cell, and chunk times that go backwards read as a corrupt
record, never as "one flush (every token within -299.98 ms)"."""

from __future__ import annotations

import json

import pytest
from fakes.fake_openai_server import FakeScript, FakeServer, FakeServerState

from gemma4_t4.bench import compare_runs, run_benchmark
from gemma4_t4.bench.metrics import aggregate
from gemma4_t4.bench.schemas import RequestRecord
from gemma4_t4.cli import main as cli_main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.serving.server_state import free_port

# 128 tokens: the flush floor (12.7 ms) dwarfs parsing one write; 2 ms a token streamed spans ~250 ms
DECODE = {"input_len": 16, "output_len": 128, "num_prompts": 4, "warmup": 1, "sample_metrics": False}
STREAMED = FakeScript(ttft_s=0.02, gap_s=0.002)
FLUSH = "not measured: the server delivered 128 tokens in one flush"


def _decode(server, out, **opts):
    return run_benchmark(server.base_url, "fake-model", "decode", out, progress=False, **(DECODE | opts))


class _FlushFrom(FakeServerState):
    """Streams the first ``streamed`` requests, then delivers every answer in one flush (as vLLM's
    CPU build does under load): the c=1 cell streams, the c=8 cell after it flushes."""

    streamed = 5  # c=1: 1 warm-up + 4 measured

    @property
    def default(self) -> FakeScript:
        return FakeScript(ttft_s=0.02, gap_s=0.002, flush=self.requests > self.streamed)

    @default.setter
    def default(self, _value: FakeScript) -> None:
        pass


def test_a_streamed_run_compared_with_a_flushed_one_names_the_flush(tmp_path, capsys):
    with FakeServer(free_port(), FakeServerState(default=STREAMED)) as streamed:
        a = _decode(streamed, tmp_path / "a", concurrency=[1])
    with FakeServer(free_port(), FakeServerState(default=FakeScript(ttft_s=0.03, flush=True))) as flushing:
        b = _decode(flushing, tmp_path / "b", concurrency=[1])
    assert a.cells[0].buffered is None and a.cells[0].per_stream_tok_s.median > 0 and b.cells[0].buffered
    rows = {r["metric"]: r for r in compare_runs(a.dir, b.dir).table_rows()}
    for metric in ("per_stream_tok_s", "tpot_ms"):
        row = rows[metric]  # no figure of one side beside a blank: the reason, naming the flushed side
        assert (row["A"], row["B"]) == (None, None) and row["B/A [95 % interval]"].startswith(f"B: {FLUSH}")
    assert rows["e2el_ms"]["B/A [95 % interval]"] is not None  # whole requests are still timed
    assert cli_main(["bench", "compare", str(a.dir), str(b.dir)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "per_stream_tok_s" in x)
    assert f"B: {FLUSH}" in line


def test_a_run_whose_c8_flushed_names_its_c8_cell_although_c1_streamed(tmp_path):
    with FakeServer(free_port(), _FlushFrom()) as server:
        run = _decode(server, tmp_path / "r", concurrency=[1, 8])
    c1, c8 = run.cells
    assert c1.buffered is None and c1.per_stream_tok_s.median > 0 and c8.buffered is not None
    assert run.decode_not_measured.startswith(FLUSH) and run.decode_not_measured.endswith(
        f"in cell {c8.cell}"
    )
    speed = run.decode_speed()
    assert speed.per_stream is None and speed.not_measured == run.decode_not_measured
    with pytest.raises(Gemma4T4Error, match=f"{FLUSH}.* in cell {c8.cell}"):
        run.require_streamed()
    rows = run.table_rows()
    assert rows[0]["per-stream tok/s (median)"] > 0 and rows[1]["per-stream tok/s (median)"].startswith(FLUSH)


def _record(i: int, chunks: list[float]) -> RequestRecord:
    return RequestRecord(
        request_id=f"c-{i}", send_s=0.0, first_chunk_s=chunks[0], first_token_s=chunks[0],
        first_content_s=chunks[0], last_choice_s=chunks[-1], end_s=max(chunks), chunk_times_s=chunks,
        completion_tokens=len(chunks), token_source="usage",
    )  # fmt: skip


def test_chunk_times_that_go_backwards_read_as_a_corrupt_record_not_a_flush():
    backwards = _record(0, [0.4 - k * 0.01 for k in range(31)] + [0.1])  # 0.4 s ... 0.1 s: -300 ms
    streamed = _record(1, [0.04 + k * 0.015 for k in range(32)])
    cell = aggregate([backwards, streamed])
    reason = cell.buffered.reason
    assert reason.startswith("not measured: 1 of 2 records are corrupt") and "records.jsonl" in reason
    assert "flush" not in reason and "-" not in reason.split("corrupt")[0]
    assert cell.tpot_ms.n == 0 and cell.per_stream_tok_s.median is None and cell.itl_ms.n == 0


def test_an_edited_records_file_with_backward_chunk_times_is_named_corrupt_by_compare(tmp_path):
    with FakeServer(free_port(), FakeServerState(default=STREAMED)) as server:
        a = _decode(server, tmp_path / "a", concurrency=[1], output_len=8)
        b = _decode(server, tmp_path / "b", concurrency=[1], output_len=8)
    path = b.dir / "records.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for line in lines:
        line["chunk_times_s"] = line["chunk_times_s"][::-1]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = {r["metric"]: r for r in compare_runs(a.dir, b.dir).table_rows()}
    why = rows["per_stream_tok_s"]["B/A [95 % interval]"]
    assert why.startswith("B: not measured: 4 of 4 records are corrupt") and "flush" not in why
