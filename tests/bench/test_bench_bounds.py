"""What one benchmark run may ask for is bounded, and a long one says so: `--rate 1e-9`,
`num_prompts 1e9` or `--concurrency 100000` are refused where the spec is made (the MCP schema
carries the same limits), a run expected to take minutes says how long before it starts and shows
its progress, and a cell never builds more warm-up prompts than it can have in flight."""

from __future__ import annotations

import json

import pytest
from fakes.bench_cli_args import bench_run_argv

from gemma4_t4.bench.cells import RunOptions
from gemma4_t4.bench.prompts import PromptFactory
from gemma4_t4.bench.registry import spec_for
from gemma4_t4.bench.specs import AnswersSpec, DecodeSpec, OpenLoopSpec, PrefixSpec
from gemma4_t4.bench.workloads import build_args, run_benchmark
from gemma4_t4.cli import main as cli_main
from gemma4_t4.errors import Gemma4T4Error

NOWHERE = "http://127.0.0.1:9"  # nothing listens: a refusal must come before the server is asked


def _one_line_error(capsys, code: int, *needles: str) -> str:
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--rate", "1e-9"], ["rates.0 = 1e-09 must be at least 0.01"]),
        (["--rate", "nan"], ["must be a finite number"]),
        (["--num-prompts", "1000000000"], ["num_prompts = 1000000000 must be at most 10000"]),
        (["--concurrency", "100000", "--num-prompts", "2"], ["concurrency.0 = 100000 must be at most 1024"]),
        (["--rate", "0.01", "--num-prompts", "10000"], ["278 hours", "raise --rate or lower --num-prompts"]),
    ],
)
def test_an_unbounded_run_is_refused_before_anything_is_sent(capsys, tmp_path, flags, needles):
    code = cli_main([*bench_run_argv(NOWHERE, "m", "decode", *flags), "--out", str(tmp_path / "r")])
    err = _one_line_error(capsys, code, *needles)
    assert "fix: give" in err or "fix: raise" in err
    assert "cannot reach" not in err and not (tmp_path / "r").exists()


def test_an_assistant_meets_the_same_limits_in_the_mcp_schema():
    """MCP `run_benchmark {"spec": {"kind": "decode", "num_prompts": 1e9}}` is refused by the schema
    the client is given, before the tool runs."""
    from pydantic import TypeAdapter

    from gemma4_t4 import mcp_server
    from gemma4_t4.bench.registry import any_spec

    schema = json.dumps(TypeAdapter(any_spec()).json_schema())
    assert '"maximum": 10000' in schema and '"minimum": 0.01' in schema and '"maximum": 1024' in schema
    with pytest.raises(Gemma4T4Error, match="num_prompts = 1000000000.0 must be at most 10000"):
        spec_for("decode", num_prompts=1e9)
    assert mcp_server.run_benchmark  # the tool takes AnySpec: the same classes, the same limits


def test_a_run_expected_to_take_minutes_says_so_before_it_starts(capsys, tmp_path):
    """`bench run --rate 0.05` (16 requests, one every 20 s: 5 min) once ran silently; with --json
    it showed no progress either."""
    argv = [*bench_run_argv(NOWHERE, "m", "decode", "--rate", "0.05", "--json"), "--out", str(tmp_path / "r")]
    code = cli_main(argv)
    out, err = capsys.readouterr()
    note = "note: this open_loop run takes at least 5 min: its requests are sent at the offered rate "
    assert code == 2 and err.startswith(note + "(16 requests at 0.05 req/s); progress is shown per request")
    assert "cannot reach" in out  # the note came first, before the server was asked anything


def test_a_long_run_shows_its_progress_even_where_progress_was_off(tmp_path):
    said: list[str] = []
    from gemma4_t4.bench import workloads

    long = build_args(NOWHERE, "m", "decode", tmp_path / "r", rates=[0.05, 0.1], progress=False)
    shown = workloads._announce(long, "this open_loop run", long.spec.pace(), said.append)
    assert shown.progress is True and "at least 8 min" in said[0] and "16 requests at 0.1 req/s" in said[0]
    short = build_args(NOWHERE, "m", "decode", tmp_path / "r", rates=[1.0], progress=False)
    assert workloads._announce(short, "this run", short.spec.pace(), said.append).progress is False
    # a sweep's rates are known once its ends are measured: its rate cells are announced then
    sweep = build_args(NOWHERE, "m", "decode", tmp_path / "r", sweep=2, progress=False)
    assert sweep.spec.pace() == []
    workloads._announce(sweep, "the rest of this sweep run", [(32, 0.04), (32, 0.08)], said.append)
    assert said[1].startswith("note: the rest of this sweep run takes at least 20 min") and len(said) == 2


class _Words:
    """A tokenizer of one token a word (what the prompt builder needs: count, encode, decode)."""

    def __init__(self) -> None:
        self.calls = 0

    def count(self, text: str, chat: bool = False) -> int:
        self.calls += 1
        return len(text.split())

    def encode(self, text: str) -> list[int]:
        return list(range(len(text.split())))

    def decode(self, ids: list[int]) -> str:
        return " ".join("w" for _ in ids)


class _Run(RunOptions):
    api = "completions"


def test_a_cell_warms_up_with_no_more_prompts_than_it_can_have_in_flight():
    """`bench --concurrency 100000 --num-prompts 2` once tokenized 100,000 warm-up prompts, for
    minutes and with no progress, to measure 2 requests."""
    tokenizer = _Words()
    (cell,) = DecodeSpec(concurrency=[1024], num_prompts=2, input_len=16).cells(
        _Run(), PromptFactory(tokenizer)
    )
    assert (len(cell.specs), len(cell.warmup_specs)) == (2, 2) and tokenizer.calls < 20
    (answers,) = AnswersSpec(concurrency=[1024]).cells(_Run(), None)  # 20 questions: 20 in flight at most
    assert (len(answers.specs), len(answers.warmup_specs)) == (20, 20)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"num_prompts": 4, "groups": 4}, "4 prompts cannot make 4 groups of at least 2"),
        ({"num_prompts": 7, "groups": 4}, "7 prompts cannot make 4 groups of at least 2"),
        ({"groups": 0}, "PrefixSpec.groups = 0 must be at least 1"),
        ({"groups": -2}, "PrefixSpec.groups = -2 must be at least 1"),
    ],
)
def test_a_prefix_spec_without_a_reused_prefix_is_refused(fields, needle):
    """One prompt per prefix group reuses no prefix: the comparison would measure nothing."""
    with pytest.raises(Gemma4T4Error, match=needle) as err:
        PrefixSpec(**fields)
    assert err.value.fix
    assert PrefixSpec(num_prompts=8, groups=4).num_prompts == 8  # two a group: each prefix is reused


def test_a_bounded_spec_still_runs_at_its_limits():
    assert OpenLoopSpec(rates=[0.01, 10_000]).rates == [0.01, 10_000]
    assert DecodeSpec(concurrency=[1, 1024], num_prompts=10_000).num_prompts == 10_000
    with pytest.raises(Gemma4T4Error, match="must be at most 1024"):
        run_benchmark(NOWHERE, "m", "decode", "unused", concurrency=[1025])


def test_a_null_field_from_an_mcp_client_takes_the_workloads_default():
    """`{"kind": "decode", "input_len": null}` once reached the run as None, and the run crashed."""
    from pydantic import TypeAdapter

    from gemma4_t4.bench.registry import AnySpec

    spec = TypeAdapter(AnySpec).validate_python({"kind": "decode", "input_len": None, "concurrency": None})
    assert (spec.input_len, spec.concurrency, spec.output_len) == (512, [1, 2, 4, 8, 16], 128)
    prefix = TypeAdapter(AnySpec).validate_python({"kind": "prefix", "input_len": 400, "prefix_len": None})
    assert (prefix.prefix_len, prefix.groups, prefix.num_prompts) == (300, 4, 32)


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"kind": "decode", "num_prompts": 1e9}, "num_prompts = 1000000000.0 must be at most 10000"),
        ({"kind": "open_loop", "rates": [1e-9]}, "rates.0 = 1e-09 must be at least 0.01"),
        ({"kind": "decode", "concurrency": [100000], "num_prompts": 2}, "must be at most 1024"),
    ],
)
def test_mcp_run_benchmark_refuses_an_unbounded_spec_before_it_runs(tmp_path, spec, named):
    import anyio
    from mcp import Client

    from gemma4_t4.mcp_server import build_server

    async def call():
        async with Client(build_server()) as client:
            args = {"base_url": NOWHERE, "model": "m", "out_dir": str(tmp_path / "out"), "spec": spec}
            return await client.call_tool("run_benchmark", args)

    result = anyio.run(call)
    text = result.content[0].text
    assert result.is_error and named in text and "cannot reach" not in text
    assert not (tmp_path / "out").exists()
