"""What a user expects of a SageMaker deploy's names and autoscaling range, of a decode cell's size and
of `bench compare`'s ratios, each checked where no other test noticed it going wrong (scripts/planted_bugs.py plants the bugs these
catch). Everything runs in-process: no AWS call, no server."""

from __future__ import annotations

import json

import pytest
from fakes.bench_runs import save_run

from gemma4_t4.bench.cells import RunOptions
from gemma4_t4.bench.compare import compare_runs
from gemma4_t4.bench.prompts import PromptFactory
from gemma4_t4.bench.results import BenchRun
from gemma4_t4.bench.schemas import CellSummary, RequestRecord, RunInfo
from gemma4_t4.bench.specs import DecodeSpec
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.config import DeployConfig, validate_name

# ---------------------------------------------------------------- SageMaker: what a deploy is told


def test_an_endpoint_name_of_64_characters_is_refused_before_aws_sees_it():
    """SageMaker's names hold 63 characters: the 63rd passes, a 64th is refused here with the rule,
    not by AWS halfway through a deploy."""
    validate_name("g" * 63)
    validate_name("g4-" + "t" * 60)
    with pytest.raises(Gemma4T4Error, match="invalid endpoint name") as refused:
        validate_name("g" * 64)
    assert refused.value.fix == "use 1-63 letters, digits and hyphens, starting with a letter or digit"


@pytest.mark.parametrize(("low", "high"), [(2, None), (2, 2), (1, 20), (None, 3)])
def test_an_autoscaling_floor_alone_or_a_fixed_fleet_is_accepted(low, high):
    """`--min-instances 2` alone (the ceiling is then the floor) and min = max are both a fleet that
    autoscaling keeps at that size; neither is refused."""
    DeployConfig(min_instances=low, max_instances=high)


@pytest.mark.parametrize(
    ("low", "high", "words"),
    [(3, 2, "min_instances=3, max_instances=2: need 1 <= min <= max <= 20"),
     (1, 21, r"max_instances=21 must be in 1\.\.20"), (0, 1, r"min_instances=0 must be in 1\.\.20")],
)
def test_an_autoscaling_range_outside_1_to_20_or_upside_down_is_refused(low, high, words):
    with pytest.raises(Gemma4T4Error, match=words):
        DeployConfig(min_instances=low, max_instances=high)


# ---------------------------------------------------------------- the benchmark's specs


class _Words:
    """A tokenizer of one token a word: what the prompt builder needs to make exact-length prompts."""

    def count(self, text: str, chat: bool = False) -> int:
        return len(text.split())

    def encode(self, text: str) -> list[int]:
        return list(range(len(text.split())))

    def decode(self, ids: list[int]) -> str:
        return " ".join("w" for _ in ids)


class _Completions(RunOptions):
    api = "completions"


def test_a_decode_cell_measures_32_prompts_or_4_per_stream_unless_told():
    """docs/benchmarks.md: a decode cell sends max(32, 4 x c) prompts when --num-prompts is not given,
    enough for a median at one stream and 4 requests a stream at 16; --num-prompts is taken as given."""
    spec = DecodeSpec(concurrency=[1, 8, 16], input_len=16, output_len=4)
    cells = spec.cells(_Completions(), PromptFactory(_Words()))
    assert {c.concurrency: len(c.specs) for c in cells} == {1: 32, 8: 32, 16: 64}
    (given,) = DecodeSpec(concurrency=[16], num_prompts=5, input_len=16).cells(
        _Completions(), PromptFactory(_Words())
    )
    assert len(given.specs) == 5


# ---------------------------------------------------------------- bench compare


def _run(folder, gap_s: float) -> BenchRun:
    """A complete c=1 decode run of 4 requests of 20 tokens, one every ``gap_s`` seconds, one request
    after another: its output tok/s is 1 / gap_s."""
    run = BenchRun(
        dir=folder,
        run=RunInfo(workload="decode", model="m", status="complete"),
        cells=[
            CellSummary(cell="decode-c1", workload="decode", variant="decode", concurrency=1, completed=4)
        ],
    )
    save_run(run)
    lines, start = [], 0.0
    for i in range(4):
        chunks = [start + (k + 1) * gap_s for k in range(20)]
        record = RequestRecord(
            request_id=f"decode-c1-{i}", send_s=start, first_chunk_s=chunks[0], first_token_s=chunks[0],
            first_content_s=chunks[0], last_choice_s=chunks[-1], end_s=chunks[-1], chunk_times_s=chunks,
            completion_tokens=20, token_source="usage",
        )  # fmt: skip
        lines.append(json.dumps({"cell": "decode-c1", "phase": "measure"} | record.model_dump(mode="json")))
        start = chunks[-1]
    (folder / "records.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_bench_compare_reads_every_ratio_as_b_over_a(tmp_path):
    """`bench compare A B` heads its ratio column B/A: a B twice as fast shows 2.0 for output tok/s and
    per-stream tok/s, and 0.5 for the time per token, never the inverse."""
    a, b = _run(tmp_path / "a", 0.02), _run(tmp_path / "b", 0.01)
    rows = {r["metric"]: r for r in compare_runs(a.dir, b.dir).table_rows()}
    throughput = rows["output_throughput_tok_s"]
    assert (throughput["A"], throughput["B"]) == (pytest.approx(50.0), pytest.approx(100.0))
    assert throughput["B/A [95 % interval]"].startswith("2.000")
    assert float(rows["per_stream_tok_s"]["B/A [95 % interval]"].split()[0]) == pytest.approx(2.0, rel=0.01)
    assert float(rows["tpot_ms"]["B/A [95 % interval]"].split()[0]) == pytest.approx(0.5, rel=0.01)
