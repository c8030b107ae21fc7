"""What a user sees of a workload spec: the values a field left out takes, what each workload sends
(its cells: names, prompt counts and lengths, warm-up, rates), and the one-line refusal, with its
fix, of a spec that cannot run. In process, against a prompt factory that records what it is asked
for (no tokenizer, no server)."""

from __future__ import annotations

from typing import ClassVar

import pytest
from pydantic import Field, TypeAdapter, model_validator

from gemma4_t4.bench import specs
from gemma4_t4.bench.prompts import Prompt
from gemma4_t4.bench.registry import (
    REGISTRY,
    AnySpec,
    SpecRefused,
    Streams,
    WorkloadSpec,
    as_list,
    notebook_params,
    spec_for,
    spec_from_options,
    workload,
)
from gemma4_t4.bench.schemas import CellSummary, RequestRecord
from gemma4_t4.bench.specs import (
    AnswersSpec,
    DecodeSpec,
    LoadSpec,
    OpenLoopSpec,
    PrefixSpec,
    SeriesDecodeSpec,
    ServedAt,
    SweepSpec,
    TTFTSpec,
    sweep_rates,
)
from gemma4_t4.errors import Gemma4T4Error


class _Factory:
    """Prompts of exactly the length asked for, each text naming its tag and index; every request
    for prompts is kept, so a test sees how many prompts of which length a workload asked for."""

    def __init__(self) -> None:
        self.asked: list[tuple] = []

    def unique(self, tag: str, count: int, length: int) -> list[Prompt]:
        self.asked.append(("unique", tag, count, length))
        return [Prompt(f"{tag} #{i}", length) for i in range(count)]

    def shared_prefix(
        self, tag: str, groups: int, per_group: int, prefix_len: int, length: int
    ) -> list[list[Prompt]]:
        self.asked.append(("shared", tag, groups, per_group, prefix_len, length))
        return [
            [Prompt(f"{tag} g{g} #{i}", length) for i in range(per_group)] for g in range(groups)
        ]


class _Run:
    api = "completions"


class _Chat:
    api = "chat"


def _refused(build, *needles: str) -> SpecRefused:
    """The refusal ``build()`` raises: a SpecRefused (also a ValueError) whose text has every needle, with a fix."""
    with pytest.raises(SpecRefused) as err:
        build()
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))
    assert err.value.fix
    return err.value


# ---------------------------------------------------------------- a field left out


def test_every_workload_takes_its_documented_values_for_fields_left_out():
    """`bench run --workload X` with no other flag runs the conditions the docs name."""
    decode = DecodeSpec()
    assert (decode.concurrency, decode.input_len, decode.output_len, decode.num_prompts) == (
        [1, 2, 4, 8, 16],
        512,
        128,
        None,
    )
    assert (decode.warmup, decode.seed, decode.nonce) == (2, 0, None)
    loop = OpenLoopSpec(rates=[1.0])
    assert (loop.input_len, loop.output_len, loop.arrival, loop.max_in_flight, loop.num_prompts) == (
        512,
        128,
        "poisson",
        256,
        None,
    )
    sweep = SweepSpec(sweep=3)
    assert (sweep.input_len, sweep.output_len, sweep.sweep, sweep.max_in_flight) == (512, 128, 3, 256)
    series = SeriesDecodeSpec()
    assert (series.input_len, series.output_len, series.num_prompts, series.series_lens) == (
        512,
        16,
        8,
        [16, 512],
    )
    ttft = TTFTSpec()
    assert (ttft.input_lens, ttft.output_len, ttft.num_prompts) == ([256, 512, 1024, 2048, 4096], 16, 16)
    prefix = PrefixSpec()
    assert (prefix.input_len, prefix.prefix_len, prefix.output_len, prefix.num_prompts, prefix.groups) == (
        1024,
        768,
        32,
        32,
        4,
    )
    answers = AnswersSpec()
    assert (answers.concurrency, answers.output_len, answers.api) == ([1], 32, "chat")
    load = LoadSpec()
    assert (load.concurrency, load.input_len, load.output_len) == ([1, 2, 4, 8, 16], 512, 256)
    assert DecodeSpec.api == "completions" and AnswersSpec.prompts is False and DecodeSpec.prompts is True


def test_what_each_workload_is_reported_as():
    """The results call open-loop, sweep and series runs decode runs; the others by their own name."""
    reported = {kind: spec.workload for kind, spec in REGISTRY.items()}
    assert reported == {
        "decode": "decode", "open_loop": "decode", "sweep": "decode", "series_decode": "decode",
        "ttft": "ttft", "prefix": "prefix", "answers": "answers", "load": "load",
    }  # fmt: skip


def test_a_spec_says_its_kind_and_an_mcp_client_picks_the_workload_by_it():
    """`{"kind": "ttft"}` from an MCP client is a TTFTSpec; a workload class keeps its own name and doc."""
    assert [
        REGISTRY[k](**({"rates": [1.0]} if k == "open_loop" else {"sweep": 1} if k == "sweep" else {})).kind
        for k in REGISTRY
    ] == list(REGISTRY)
    adapter = TypeAdapter(AnySpec)
    assert isinstance(adapter.validate_python({"kind": "ttft"}), TTFTSpec)
    assert isinstance(adapter.validate_python({"kind": "open_loop", "rates": [2]}), OpenLoopSpec)
    assert (DecodeSpec.__name__, DecodeSpec.__qualname__, DecodeSpec.__module__) == (
        "DecodeSpec",
        "DecodeSpec",
        "gemma4_t4.bench.specs",
    )
    assert DecodeSpec.__doc__.startswith("Closed-loop decode")
    with pytest.raises(SpecRefused, match="kind"):
        DecodeSpec(kind="ttft")


def test_a_null_from_an_mcp_client_takes_the_default_but_a_given_value_wins():
    """null means "the workload's value"; a value given, even 0-like or the same as the default, is kept."""
    spec = TypeAdapter(AnySpec).validate_python(
        {"kind": "load", "output_len": None, "input_len": 64, "num_prompts": None}
    )
    assert (spec.output_len, spec.input_len, spec.num_prompts) == (256, 64, None)
    assert DecodeSpec(warmup=0).warmup == 0
    assert DecodeSpec(concurrency=[3], output_len=7).model_dump(include={"concurrency", "output_len"}) == {
        "concurrency": [3],
        "output_len": 7,
    }


def test_a_workload_with_no_defaults_of_its_own_takes_the_shared_field_values():
    """A new workload that declares no defaults still builds: every shared field has its value."""

    @workload("toy_plain")
    class ToyPlainSpec(Streams, WorkloadSpec):
        """A stand-in workload: closed-loop streams, nothing else of its own."""

        workload: ClassVar[str] = "toy_plain"

    try:
        spec = ToyPlainSpec()
        assert (spec.output_len, spec.num_prompts, spec.warmup, spec.concurrency) == (None, None, 2, None)
        assert spec.prompt_lens() == [] and spec.longest_output() == 0
        assert spec.pace() == []
        assert ToyPlainSpec.for_venue("t4") == spec and ToyPlainSpec.for_venue("cpu", output_len=None) == spec
        assert spec.follow(_Run(), None, []) == ([], {}) and spec.finish([], {}) == {}
        # its help, its name in errors and tracebacks: the class as written, with its kind added
        assert ToyPlainSpec.__doc__ == "A stand-in workload: closed-loop streams, nothing else of its own."
        assert (ToyPlainSpec.__module__, ToyPlainSpec.__name__) == (__name__, "ToyPlainSpec")
        assert ToyPlainSpec.__qualname__.endswith("<locals>.ToyPlainSpec")
        assert ToyPlainSpec(concurrency=[3, 5]).concurrency == [3, 5]
        cell = spec.unique_cell(_Run(), _Factory(), "toy", "v", 1, 2)  # no prompt length of its own
        assert (cell.input_len, cell.output_len, len(cell.specs)) == (None, None, 2)
        with pytest.raises(NotImplementedError, match="ToyPlainSpec builds no cells"):
            spec.cells(_Run(), None)
    finally:
        REGISTRY.pop("toy_plain")


def test_a_workload_kind_registered_twice_is_refused_naming_both_classes():
    """Two workloads under one `--workload` name would shadow each other: the second is refused."""
    with pytest.raises(TypeError, match=r"workload 'decode' is registered twice \(DecodeSpec, Again\)"):

        @workload("decode")
        class Again(WorkloadSpec):
            workload: ClassVar[str] = "decode"

    assert REGISTRY["decode"] is DecodeSpec


# ---------------------------------------------------------------- venues and notebook parameters


def test_each_venue_has_its_own_values_and_a_given_value_wins():
    """On a T4 (or SageMaker's T4) the series' conditions; on cpu the tiny model's."""
    t4 = DecodeSpec.for_venue("t4")
    assert (t4.concurrency, t4.input_len, t4.output_len, t4.num_prompts) == ([1, 8], 512, 128, 8)
    assert DecodeSpec.for_venue("sagemaker") == t4
    cpu = DecodeSpec.for_venue("cpu", input_len=None, output_len=8)
    assert (cpu.concurrency, cpu.input_len, cpu.output_len, cpu.num_prompts) == ([1, 8], 128, 8, 8)
    assert TTFTSpec.for_venue("cpu").input_lens == [64, 128, 256, 512, 1024]
    assert TTFTSpec.for_venue("sagemaker").input_lens == [512, 1024, 2048, 4096]
    ttft = TTFTSpec.for_venue("t4")
    assert (ttft.input_lens, ttft.output_len, ttft.num_prompts) == ([512, 1024, 2048, 4096], 16, 16)
    assert LoadSpec.for_venue("t4") == LoadSpec()  # a workload without venue values: its defaults everywhere
    with pytest.raises(Gemma4T4Error, match="unknown venue 'T4'") as err:
        LoadSpec.for_venue("T4")
    assert err.value.fix == "use one of: t4, cpu, sagemaker"


def test_notebook_parameters_are_read_by_the_workload_that_declares_them():
    """`-p INPUT_LEN 256 -p TTFT_INPUT_LENS "64 128"`: each read as its workload reads it; None takes the venue's."""
    read = notebook_params(
        "cpu", CONCURRENCY=None, INPUT_LEN=256, OUTPUT_LEN="16", NUM_PROMPTS=None, TTFT_INPUT_LENS="64 128"
    )
    assert read == {
        "CONCURRENCY": [1, 8],
        "INPUT_LEN": 256,
        "OUTPUT_LEN": 16,
        "NUM_PROMPTS": 8,
        "TTFT_INPUT_LENS": [64, 128],
    }
    assert notebook_params("t4") == {}
    with pytest.raises(Gemma4T4Error, match="GROUPS is no workload parameter") as err:
        notebook_params("t4", GROUPS=2)
    assert err.value.fix == "set GROUPS in the parameters cell"
    _refused(lambda: notebook_params("t4", INPUT_LEN=0), "DecodeSpec.input_len = 0 must be at least 1")


# ---------------------------------------------------------------- papermill's forms of a list


@pytest.mark.parametrize(
    ("given", "read"),
    [(None, None), ([2, 3], [2, 3]), ((2, 3), [2, 3]), (4, [4]), (2.5, [2.5]), (" [1, 4] ", [1, 4]), ("1,,4", [1, 4]),
     ("1\t4", [1, 4]), ("", [])],
)  # fmt: skip
def test_a_list_field_reads_the_forms_papermill_gives(given, read):
    assert (
        as_list(
            given, int if not isinstance(given, float) else float, "DecodeSpec", "concurrency", "CONCURRENCY"
        )
        == read
    )


@pytest.mark.parametrize("given", [True, False, "x", "1.5", {1: 4}])
def test_a_value_that_means_no_list_of_integers_is_refused_with_the_forms(given):
    err = _refused(
        lambda: as_list(given, int, "DecodeSpec", "concurrency", "CONCURRENCY"),
        f"DecodeSpec.concurrency: cannot read {given!r} as a list of integers",
    )
    assert err.fix == (
        'give concurrency as a list ([1, 4]), one number (4), or the text "[1, 4]", "1,4" or "1 4"; '
        'with papermill: -p CONCURRENCY 4 or -y "CONCURRENCY: [1, 4]"'
    )


def test_rates_are_numbers_and_the_other_lists_integers():
    """`--rate 0.5,2` is two rates; `--concurrency 1.5` is no stream count; the fix names the notebook parameter."""
    assert OpenLoopSpec(rates="0.5 2").rates == [0.5, 2.0] and OpenLoopSpec(rates=3).rates == [3.0]
    assert SeriesDecodeSpec(series_lens="8,64").series_lens == [8, 64]
    assert TTFTSpec(input_lens="[64]").input_lens == [64]
    _refused(
        lambda: OpenLoopSpec(rates="fast"), "OpenLoopSpec.rates: cannot read 'fast' as a list of numbers"
    )
    err = _refused(
        lambda: TTFTSpec(input_lens="1.5"), "TTFTSpec.input_lens: cannot read '1.5' as a list of integers"
    )
    assert "-p TTFT_INPUT_LENS 4" in err.fix  # the notebooks' name of the field
    err = _refused(lambda: SeriesDecodeSpec(series_lens="a,b"), "as a list of integers")
    assert "-p SERIES_LENS 4" in err.fix  # no notebook parameter: the field's name, upper case


# ---------------------------------------------------------------- refusals, one line with a fix


def test_an_empty_list_is_refused_naming_the_field():
    for build, field in (
        (lambda: DecodeSpec(concurrency=[]), "concurrency"),
        (lambda: TTFTSpec(input_lens=""), "input_lens"),
    ):
        err = _refused(build, f"{field} = [] must be at least 1 value(s)")
        assert err.fix == f"give {field} at least 1 value(s)"


def test_shared_rules_refuse_a_run_that_measures_nothing():
    assert (
        _refused(lambda: DecodeSpec(output_len=0), "DecodeSpec.output_len = 0 must be at least 1").fix
        == "give output_len at least 1"
    )
    assert _refused(lambda: DecodeSpec(output_len=-3), "output_len = -3 must be at least 1")
    assert (
        _refused(lambda: LoadSpec(warmup=-1), "LoadSpec.warmup = -1 must be at least 0").fix
        == "give warmup at least 0"
    )
    assert DecodeSpec(output_len=1, warmup=0).output_len == 1  # the smallest run that measures something
    _refused(lambda: DecodeSpec(num_prompts=0), "DecodeSpec.num_prompts = 0 must be at least 1")


@pytest.mark.parametrize(
    ("build", "line", "fix"),
    [
        (lambda: DecodeSpec(num_prompts=10_001), "DecodeSpec.num_prompts = 10001 must be at most 10000", "give num_prompts at most 10000"),
        (lambda: DecodeSpec(concurrency=[1, 0]), "DecodeSpec.concurrency.1 = 0 must be at least 1", "give each of concurrency at least 1"),
        (lambda: OpenLoopSpec(rates=[]), "OpenLoopSpec.rates = [] must be at least 1 value(s)", "give rates at least 1 value(s)"),
        (lambda: OpenLoopSpec(rates=[1.0] * 65), "must be at most 64 values", "give rates at most 64 values"),
        (lambda: OpenLoopSpec(rates=[1.0, float("nan")]), "OpenLoopSpec.rates.1 = nan must be a finite number", "give each of rates a finite number"),
        (lambda: OpenLoopSpec(rates=[20_000]), "OpenLoopSpec.rates.0 = 20000 must be at most 10000", "give each of rates at most 10000.0"),
        (lambda: OpenLoopSpec(rates=[1], max_in_flight=0), "OpenLoopSpec.max_in_flight = 0 must be at least 1", "give max_in_flight at least 1"),
        (lambda: DecodeSpec(input_len="long"), "DecodeSpec.input_len: Input should be a valid integer", "give input_len as the type DecodeSpec declares"),
        (lambda: SweepSpec(), "SweepSpec.sweep: Field required", "give sweep as the type SweepSpec declares"),
    ],
)  # fmt: skip
def test_a_value_outside_its_limits_is_one_line_naming_the_limit(build, line, fix):
    assert _refused(build, line).fix == fix


def test_an_unknown_field_is_named_with_the_workloads_that_take_it():
    err = _refused(lambda: TTFTSpec(bogus=1), "TTFTSpec has no field 'bogus'")
    assert err.message == "TTFTSpec has no field 'bogus'"  # no workload takes it: nothing more to say
    assert err.fix == "TTFTSpec takes: input_lens, nonce, num_prompts, output_len, seed, warmup"
    err = _refused(
        lambda: AnswersSpec(input_len=8),
        "AnswersSpec has no field 'input_len' (a field of the decode, open_loop, sweep, series_decode, prefix, load workloads)",
    )
    err = _refused(
        lambda: DecodeSpec(sweep=2), "DecodeSpec has no field 'sweep' (a field of the sweep workload)"
    )
    assert "workloads" not in str(err).split("(")[1].split(")")[0]
    _refused(
        lambda: TTFTSpec(arrival="constant"),
        "TTFTSpec has no field 'arrival' (a field of the open_loop, sweep workloads)",
    )


def test_a_workload_class_not_registered_still_refuses_an_unknown_field_in_one_line():
    """A notebook's own `class MyDecode(DecodeSpec)`, not (yet) decorated: a typo is still named, not a crash."""

    class MyDecode(DecodeSpec):
        pass

    err = _refused(lambda: MyDecode(bogus=1), "MyDecode has no field 'bogus'")
    # the fix names the fields it inherited, as DecodeSpec's own fix does (it once named none)
    decode = _refused(lambda: DecodeSpec(bogus=1), "DecodeSpec has no field 'bogus'")
    assert err.fix == decode.fix.replace("DecodeSpec", "MyDecode") and "num_prompts" in err.fix


def test_a_limit_a_new_workload_declares_is_said_in_words():
    """A workload added later with `gt`/`lt`/`max_length`/`min_length` limits gets its limit in words too."""

    @workload("toy_limits")
    class ToyLimitsSpec(WorkloadSpec):
        workload: ClassVar[str] = "toy_limits"
        above: int = Field(1, gt=0)
        below: int = Field(1, lt=5)
        words: list[int] = Field([1], min_length=2, max_length=3)

        @model_validator(mode="after")
        def _not_three(self) -> ToyLimitsSpec:
            if self.above == 3:  # a rule that raises a plain ValueError, not a SpecRefused
                raise ValueError("three is out")
            return self

    try:
        err = _refused(
            lambda: ToyLimitsSpec(above=3, words=[1, 2]), "ToyLimitsSpec.fields: Value error, three is out"
        )
        assert err.fix == "give fields as the type ToyLimitsSpec declares"
        assert (
            _refused(
                lambda: ToyLimitsSpec(above=0, words=[1, 2]), "ToyLimitsSpec.above = 0 must be above 0"
            ).fix
            == "give above above 0"
        )
        assert (
            _refused(
                lambda: ToyLimitsSpec(below=5, words=[1, 2]), "ToyLimitsSpec.below = 5 must be below 5"
            ).fix
            == "give below below 5"
        )
        _refused(lambda: ToyLimitsSpec(words=[1]), "ToyLimitsSpec.words = [1] must be at least 2 value(s)")
        _refused(lambda: ToyLimitsSpec(words=[1, 2, 3, 4]), "must be at most 3 values")
        err = _refused(lambda: ToyLimitsSpec(nope=1), "ToyLimitsSpec has no field 'nope'")
        assert (
            err.fix
            == "ToyLimitsSpec takes: above, below, nonce, num_prompts, output_len, seed, warmup, words"
        )
    finally:
        REGISTRY.pop("toy_limits")


def test_a_spec_refused_inside_the_mcp_tools_arguments_is_a_validation_error():
    """The MCP tool's `spec` argument: a workload's rule surfaces as pydantic's error, naming it."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="3 prompts cannot make 2 groups") as err:
        TypeAdapter(AnySpec).validate_python({"kind": "prefix", "num_prompts": 3, "groups": 2})
    assert err.value.error_count() == 1  # only the workload its kind names is tried


def test_an_mcp_client_is_told_the_kinds_there_are():
    """The tool's schema says `kind` picks the workload; an unknown kind is one error listing the kinds."""
    from pydantic import ValidationError

    schema = TypeAdapter(AnySpec).json_schema()
    assert schema["discriminator"]["propertyName"] == "kind" and set(
        schema["discriminator"]["mapping"]
    ) == set(REGISTRY)
    with pytest.raises(ValidationError) as err:
        TypeAdapter(AnySpec).validate_python({"kind": "nope"})
    assert err.value.error_count() == 1
    assert "does not match any of the expected tags: 'decode', 'open_loop', 'sweep'" in str(err.value)


# ---------------------------------------------------------------- choosing a spec from the CLI's flags


def test_the_cli_flags_choose_the_workload():
    assert type(spec_from_options("decode")) is DecodeSpec
    assert type(spec_from_options("decode", "vllm", rates=[1.0])) is OpenLoopSpec
    assert type(spec_from_options("open_loop", rates=[1.0])) is OpenLoopSpec
    sweep = spec_from_options("decode", sweep=4, input_len=None)
    assert type(sweep) is SweepSpec and sweep.sweep == 4 and sweep.input_len == 512
    series = spec_from_options("decode", "series", output_len=None)
    assert type(series) is SeriesDecodeSpec and series.output_len == 16
    ttft = spec_from_options("ttft", input_len=300)
    assert ttft.input_lens == [300]
    assert spec_from_options("ttft", input_len=300, input_lens=[64, 128]).input_lens == [64, 128]
    assert spec_from_options("prefix", input_len=400).prefix_len == 300


@pytest.mark.parametrize(
    ("workload_", "method", "fields", "line", "fix"),
    [
        ("ttft", None, {"sweep": 2}, "--sweep is for the decode workload and chooses its own rates", "use --workload decode and drop --rate/--concurrency"),
        ("decode", None, {"sweep": 2, "rates": [1.0]}, "--sweep is for the decode workload and chooses its own rates", "use --workload decode and drop --rate/--concurrency"),
        ("decode", None, {"sweep": 2, "concurrency": [1]}, "--sweep is for the decode workload and chooses its own rates", "use --workload decode and drop --rate/--concurrency"),
        ("prefix", None, {"rates": [1.0]}, "--rate is for the decode workload, not prefix", "drop --rate, or use --workload decode"),
        ("ttft", "series", {}, "--method series is a decode method (8 prompts at c=1)", "use --workload decode without --rate/--sweep"),
        ("decode", "series", {"rates": [1.0]}, "--method series is a decode method (8 prompts at c=1)", "use --workload decode without --rate/--sweep"),
        ("decode", "series", {"sweep": 2}, "--method series is a decode method (8 prompts at c=1)", "use --workload decode without --rate/--sweep"),
        ("decode", "guidellm", {}, "unknown method 'guidellm'", "use --method vllm or --method series"),
        ("nope", None, {}, "unknown workload 'nope'", "use one of: decode, open_loop, sweep, series_decode, ttft, prefix, answers, load"),
    ],
)  # fmt: skip
def test_flags_that_do_not_go_together_are_refused_before_anything_runs(workload_, method, fields, line, fix):
    with pytest.raises(Gemma4T4Error) as err:
        spec_from_options(workload_, method, **fields)
    assert (err.value.message, err.value.fix) == (line, fix)


def test_a_flag_left_unset_is_not_a_conflict():
    """The CLI passes every flag, unset ones as None: those choose nothing."""
    assert type(spec_from_options("ttft", None, sweep=None, rates=None, concurrency=None)) is TTFTSpec
    assert type(spec_from_options("decode", "series", rates=None, sweep=None)) is SeriesDecodeSpec
    assert type(spec_for("answers", concurrency=[2])) is AnswersSpec


# ---------------------------------------------------------------- what each workload sends


def test_decode_cells_name_their_conditions_and_default_to_at_least_32_prompts():
    factory = _Factory()
    cells = DecodeSpec(concurrency=[1, 16], input_len=64, output_len=8, warmup=3).cells(_Run(), factory)
    assert [(c.cell, c.concurrency, len(c.specs), len(c.warmup_specs)) for c in cells] == [
        ("decode-c1-in64-out8", 1, 32, 3), ("decode-c16-in64-out8", 16, 64, 16),
    ]  # fmt: skip
    first = cells[0]
    assert (first.workload, first.variant, first.input_len, first.output_len) == ("decode", "decode", 64, 8)
    assert (
        first.specs[0].input_len == 64
        and first.specs[0].max_tokens == 8
        and first.specs[0].api == "completions"
    )
    assert first.warmup_specs[0].request_id.startswith("w-decode-c1-in64-out8")
    (given,) = DecodeSpec(concurrency=[4], num_prompts=5, input_len=16).cells(_Chat(), factory)
    assert len(given.specs) == 5 and given.specs[0].api == "chat"


def test_open_loop_cells_one_per_rate_with_about_30_seconds_of_arrivals():
    """Without --num-prompts an open-loop cell sends ~30 s of requests, 16 at least and 256 at most."""
    factory = _Factory()
    spec = OpenLoopSpec(
        rates=[0.1, 2, 100], arrival="constant", max_in_flight=8, input_len=32, output_len=4, warmup=1
    )
    cells = spec.cells(_Run(), factory)
    assert [(c.cell, c.rate, len(c.specs)) for c in cells] == [
        ("decode-r0.1-constant-in32-out4", 0.1, 16), ("decode-r2-constant-in32-out4", 2.0, 60), ("decode-r100-constant-in32-out4", 100.0, 256),
    ]  # fmt: skip
    cell = cells[1]
    assert (cell.workload, cell.variant, cell.concurrency, cell.input_len, cell.output_len, cell.arrival) == (
        "decode",
        "open_loop",
        8,
        32,
        4,
        "constant",
    )
    assert len(cell.warmup_specs) == 1 and cell.warmup_specs[0].request_id.startswith("w-decode-r2-")
    assert [s.request_id for s in cell.specs[:2]] == [
        "decode-r2-constant-in32-out4-0",
        "decode-r2-constant-in32-out4-1",
    ]
    assert (cell.specs[0].prompt, cell.warmup_specs[0].prompt) == (
        "decode-r2-constant-in32-out4 #0", "w-decode-r2-constant-in32-out4 #0",
    )  # fmt: skip
    assert cell.specs[0].input_len == 32 and cell.specs[0].max_tokens == 4
    assert (
        spec.prompts_at(0.55) == 16
        and spec.prompts_at(0.6) == 18
        and spec.prompts_at(8.5) == 255
        and spec.prompts_at(9) == 256
    )
    assert OpenLoopSpec(rates=[1], num_prompts=5).prompts_at(100) == 5


def test_an_open_loop_longer_than_a_day_is_refused_before_it_starts():
    """The time the arrivals alone take (prompts / rate) is what is checked, summed over the rates."""
    assert OpenLoopSpec(rates=[1.0, 2.0]).expected_s() == 30.0 + 30.0
    assert OpenLoopSpec(rates=[0.5], num_prompts=10).expected_s() == 20.0
    assert OpenLoopSpec(rates=[1.0], num_prompts=86_400 // 10, max_in_flight=4).rates == [1.0]  # 2.4 h
    day = OpenLoopSpec(rates=[0.125, 0.25], num_prompts=7_200)  # exactly 24 h of arrivals: still allowed
    assert day.expected_s() == 86_400
    err = _refused(
        lambda: OpenLoopSpec(rates=[0.1, 0.2], num_prompts=10_000),
        "open_loop at 0.1, 0.2 req/s would send its requests over 42 hours (prompts / rate)",
    )
    assert err.fix == "raise --rate or lower --num-prompts: one run sends its requests within 24 hours"
    _refused(lambda: OpenLoopSpec(rates=[0.1], num_prompts=8_641), "over 24 hours")
    _refused(lambda: OpenLoopSpec(rates=[0.01], num_prompts=10_000), "over 278 hours")
    _refused(lambda: OpenLoopSpec(rates=[0.1], num_prompts=9_181), "over 26 hours")  # 25.503 h, rounded


def test_sweep_rates_lie_evenly_between_the_measured_ends():
    assert sweep_rates(1.0, 5.0, 3) == [2.0, 3.0, 4.0]
    assert sweep_rates(2.0, 3.0, 1) == [2.5]
    for sync, through in ((0.0, 5.0), (-1.0, 5.0), (2.0, 2.0), (3.0, 2.0)):
        with pytest.raises(Gemma4T4Error, match="there is no load range to sweep") as err:
            sweep_rates(sync, through, 2)
        assert err.value.fix == "check the server's --max-num-seqs, or choose rates with --rate"
    with pytest.raises(Gemma4T4Error, match=r"\(2 req/s one at a time, 1.5 req/s all at once\)"):
        sweep_rates(2.0, 1.5, 2)


def test_a_sweep_measures_its_ends_then_the_rates_between():
    factory = _Factory()
    spec = SweepSpec(sweep=2, input_len=16, output_len=4, max_in_flight=10, arrival="constant")
    ends = spec.cells(_Run(), factory)
    assert [(c.cell, c.variant, c.concurrency, len(c.specs)) for c in ends] == [
        ("decode-synchronous-in16-out4", "sweep_synchronous", 1, 32), ("decode-throughput-in16-out4", "sweep_throughput", 10, 32),
    ]  # fmt: skip
    few = SweepSpec(sweep=1, num_prompts=6).cells(_Run(), factory)
    assert [(c.concurrency, len(c.specs)) for c in few] == [(1, 6), (6, 6)]  # all at once: its 6 prompts
    sync = CellSummary(cell="s", workload="decode", variant="sweep_synchronous", request_throughput_req_s=1.0)
    assert spec.follow(_Run(), factory, []) == ([], {})
    assert spec.follow(_Run(), factory, [sync]) == ([], {})  # the all-at-once end is not measured yet
    through = CellSummary(
        cell="t", workload="decode", variant="sweep_throughput", request_throughput_req_s=4.0
    )
    cells, info = spec.follow(_Run(), factory, [sync, through])
    assert [(c.cell, c.variant, c.rate, c.concurrency) for c in cells] == [
        ("decode-r2-constant-in16-out4", "sweep_rate", 2.0, 10), ("decode-r3-constant-in16-out4", "sweep_rate", 3.0, 10),
    ]  # fmt: skip
    assert info["sweep"].model_dump() == {"synchronous_rps": 1.0, "throughput_rps": 4.0, "rates": [2.0, 3.0]}
    # an end with no measured rate (every request failed) is no rate at all: nothing to sweep
    slow = sync.model_copy(update={"request_throughput_req_s": 0.5})
    unmeasured = through.model_copy(update={"request_throughput_req_s": None})
    with pytest.raises(Gemma4T4Error, match="no load range"):
        spec.follow(_Run(), factory, [slow, unmeasured])
    _refused(lambda: SweepSpec(sweep=0), "SweepSpec.sweep = 0 must be at least 1")
    assert _refused(lambda: SweepSpec(sweep=-1), "sweep = -1 must be at least 1").fix == "give sweep at least 1"
    _refused(lambda: SweepSpec(sweep=65), "SweepSpec.sweep = 65 must be at most 64")
    assert SweepSpec(sweep=64).sweep == 64
    assert SweepSpec(sweep=1).sweep == 1


def test_the_series_decode_sends_the_same_prompts_with_a_short_and_a_long_output():
    factory = _Factory()
    spec = SeriesDecodeSpec(series_lens=[8, 64], input_len=32, num_prompts=3, warmup=1)
    cells = spec.cells(_Run(), factory)
    assert [(c.cell, c.variant, c.concurrency, c.output_len, len(c.specs)) for c in cells] == [
        ("decode-series-in32-out8", "series_short", 1, 8, 3), ("decode-series-in32-out64", "series_long", 1, 64, 3),
    ]  # fmt: skip
    assert [s.max_tokens for s in cells[1].specs] == [64, 64, 64] and cells[0].input_len == 32
    assert spec.longest_output() == 64 and DecodeSpec(output_len=100).longest_output() == 100


def test_the_series_figure_is_computed_from_each_sides_records():
    spec = SeriesDecodeSpec(series_lens=[10, 110])
    cells = spec.cells(_Run(), _Factory())

    def record(i: int, wall_s: float) -> RequestRecord:
        return RequestRecord(
            request_id=f"r{i}",
            send_s=0.0,
            first_content_s=0.01,
            last_choice_s=wall_s,
            end_s=wall_s,
            completion_tokens=1,
        )

    measured = {cells[0].cell: [record(0, 1.0)], cells[1].cell: [record(1, 2.0)]}
    figure = spec.finish(cells, measured)["series_decode"]
    assert (figure.short_tokens, figure.long_tokens, figure.decode_tok_s) == (10, 110, pytest.approx(100.0))
    empty = spec.finish(cells, {})["series_decode"]
    assert empty.decode_tok_s is None and (empty.short_tokens, empty.long_tokens) == (10, 110)
    stopped = spec.finish([], {})["series_decode"]  # stopped before its cells: an empty figure, no crash
    assert stopped.decode_tok_s is None and stopped.wall_short_ms is None


def test_the_shortest_series_lengths_are_accepted():
    assert SeriesDecodeSpec(series_lens=[1, 2]).series_lens == [1, 2]


@pytest.mark.parametrize("lens", [[16], [16, 512, 1024], [512, 16], [16, 16]])
def test_series_lengths_that_are_not_short_then_long_are_refused(lens):
    err = _refused(
        lambda: SeriesDecodeSpec(series_lens=lens),
        f"--series-lens {lens} must be SHORT,LONG with SHORT < LONG",
    )
    assert err.fix == "use e.g. --series-lens 16,512"


def test_ttft_cells_one_per_prompt_length():
    factory = _Factory()
    spec = TTFTSpec(input_lens=[64, 256], output_len=4, num_prompts=2, warmup=0)
    cells = spec.cells(_Run(), factory)
    assert [(c.cell, c.input_len, c.concurrency, len(c.specs), len(c.warmup_specs)) for c in cells] == [
        ("ttft-c1-in64-out4", 64, 1, 2, 0), ("ttft-c1-in256-out4", 256, 1, 2, 0),
    ]  # fmt: skip
    assert [s.input_len for s in cells[1].specs] == [256, 256]
    assert (cells[0].workload, cells[0].variant) == ("ttft", "ttft")
    assert spec.prompt_lens() == [64, 256] and DecodeSpec(input_len=300).prompt_lens() == [300]


def test_a_prefix_run_compares_shared_prefixes_with_as_many_unique_prompts():
    factory = _Factory()
    spec = PrefixSpec(input_len=100, prefix_len=60, output_len=4, num_prompts=9, groups=2, warmup=1)
    shared, unique = spec.cells(_Run(), factory)
    assert ("shared", "prefix-c1-in100-p60-out4-shared", 2, 4, 60, 100) in factory.asked  # 9 // 2 a group
    assert (shared.cell, shared.variant, shared.workload, shared.concurrency, len(shared.specs)) == (
        "prefix-c1-in100-p60-out4-shared", "shared_prefix", "prefix", 1, 8,
    )  # fmt: skip
    assert shared.meta == {"prefix_len": 60, "groups": 2, "per_group": 4}
    assert [s.prompt for s in shared.specs[:2]] == [
        "prefix-c1-in100-p60-out4-shared g0 #0",
        "prefix-c1-in100-p60-out4-shared g0 #1",
    ]
    assert len(shared.warmup_specs) == 1 and shared.warmup_specs[0].request_id.startswith(
        "w-prefix-c1-in100-p60-out4"
    )
    assert (unique.cell, unique.variant, len(unique.specs), unique.warmup_specs) == (
        "prefix-c1-in100-p60-out4-unique",
        "unique_prompts",
        8,
        [],
    )
    assert unique.meta == {"prefix_len": 60, "groups": 2, "per_group": 4, "control": True}
    assert (shared.specs[0].request_id, unique.specs[0].request_id) == (
        "prefix-c1-in100-p60-out4-shared-0", "prefix-c1-in100-p60-out4-unique-0",
    )  # fmt: skip
    assert (unique.specs[0].prompt, shared.warmup_specs[0].prompt) == (
        "prefix-c1-in100-p60-out4-unique #0", "w-prefix-c1-in100-p60-out4 #0",
    )  # fmt: skip
    assert (shared.input_len, shared.output_len, unique.workload) == (100, 4, "prefix")
    assert (unique.input_len, unique.output_len, shared.specs[0].max_tokens) == (100, 4, 4)


def test_a_prefix_is_three_quarters_of_the_prompt_unless_given():
    assert PrefixSpec(input_len=401).prefix_len == 300
    assert PrefixSpec(input_len=400, prefix_len=50).prefix_len == 50
    assert PrefixSpec(prefix_len=10).prefix_len == 10 and PrefixSpec().prefix_len == 768
    assert PrefixSpec(num_prompts=4, groups=2).groups == 2  # exactly two a group: each prefix reused once
    _refused(lambda: PrefixSpec(num_prompts=5, groups=3), "5 prompts cannot make 3 groups of at least 2")


def test_answers_are_the_fixed_questions_greedy_at_each_concurrency():
    from gemma4_t4.bench.answers import QUESTIONS

    cells = AnswersSpec(concurrency=[1, 4], output_len=16, warmup=1).cells(_Chat(), None)
    assert [(c.cell, c.concurrency, c.variant, c.workload, c.input_len, c.output_len) for c in cells] == [
        ("answers-c1", 1, "answers", "answers", None, 16), ("answers-c4", 4, "answers", "answers", None, 16),
    ]  # fmt: skip
    first = cells[0].specs[0]
    assert len(cells[0].specs) == len(QUESTIONS) and first.prompt == QUESTIONS[0][0]
    assert (first.request_id, first.max_tokens, first.api, first.ignore_eos, first.payload("m")["temperature"]) == (
        "answers-0",
        16,
        "chat",
        False,
        0.0,
    )
    warm = cells[0].warmup_specs
    assert (
        len(warm) == 4 and warm[2].prompt == "Say the word number 2." and warm[2].request_id == "w-answers-2"
    )
    assert (warm[0].max_tokens, warm[0].ignore_eos, warm[0].api) == (8, False, "chat")
    assert AnswersSpec(warmup=0).cells(_Chat(), None)[0].warmup_specs == []


def test_the_load_test_sends_one_shared_prompt_c_times():
    factory = _Factory()
    cells = LoadSpec(concurrency=[1, 3], input_len=16, output_len=8, warmup=2).cells(_Run(), factory)
    assert factory.asked == [("unique", "load-shared", 1, 16)]  # one prompt, shared by every request
    assert [(c.cell, c.concurrency, len(c.specs), len(c.warmup_specs)) for c in cells] == [
        ("load-c1-in16-out8", 1, 1, 2),
        ("load-c3-in16-out8", 3, 3, 2),
    ]
    cell = cells[1]
    assert (cell.workload, cell.variant, cell.input_len, cell.output_len, cell.meta) == (
        "load",
        "load_shared_prompt",
        16,
        8,
        {"shared_prompt": True},
    )
    assert {s.prompt for s in cell.specs} == {"load-shared #0"} and cell.specs[0].max_tokens == 8
    assert [s.request_id for s in cell.specs] == [
        "load-c3-in16-out8-0",
        "load-c3-in16-out8-1",
        "load-c3-in16-out8-2",
    ]
    warm = cell.warmup_specs[0]
    assert (warm.request_id, warm.prompt, warm.api, warm.max_tokens) == (
        "w-load-c3-in16-out8-0",
        "load-shared #0",
        "completions",
        8,
    )
    (one,) = LoadSpec(concurrency=[4], warmup=1).cells(_Run(), _Factory())
    assert len(one.warmup_specs) == 1  # the one shared prompt warms up as often as asked, not once a stream
    (given,) = LoadSpec(concurrency=[2], num_prompts=5, warmup=0).cells(_Run(), _Factory())
    assert (len(given.specs), given.warmup_specs) == (5, [])


def test_every_request_of_a_run_has_its_own_id_and_no_cell_sends_another_cells_prompts():
    """Records are joined to their requests by id; a prompt sent by two cells would be a cache hit for the second."""
    runs = [
        DecodeSpec(concurrency=[1, 2], num_prompts=2, input_len=8),
        OpenLoopSpec(rates=[1, 2], num_prompts=2, input_len=8),
        SweepSpec(sweep=1, num_prompts=2, input_len=8),
        SeriesDecodeSpec(num_prompts=2, input_len=8),
        TTFTSpec(input_lens=[8, 16], num_prompts=2),
        PrefixSpec(input_len=8, prefix_len=4, num_prompts=4, groups=2),
    ]
    for spec in runs:
        cells = spec.cells(_Run(), _Factory())
        sent = [s for c in cells for s in (*c.specs, *c.warmup_specs)]
        assert len({s.request_id for s in sent}) == len(sent), type(spec).__name__
        assert len({s.prompt for s in sent}) == len(sent), type(spec).__name__


def test_a_cell_can_use_its_own_prompt_and_output_length():
    """A workload's cell of another length than its fields (ttft's lengths, the series' outputs)."""
    spec = DecodeSpec(input_len=64, output_len=8, warmup=0)
    cell = spec.unique_cell(_Run(), _Factory(), "x", "v", 2, 3, length=16, output_len=4)
    assert (cell.input_len, cell.output_len, cell.concurrency, len(cell.specs)) == (16, 4, 2, 3)
    plain = spec.unique_cell(_Run(), _Factory(), "y", "v", 1, 1)
    assert (plain.input_len, plain.output_len, plain.workload) == (64, 8, "decode")


# ---------------------------------------------------------------- running a spec


def test_run_hands_the_spec_and_the_endpoint_to_the_benchmark(monkeypatch, tmp_path):
    """`specs.run(endpoint, spec, dir)`: the endpoint's URL, model, tokenizer, GPU, key and batch reach the run."""
    from gemma4_t4.bench import workloads

    seen = []
    monkeypatch.setattr(workloads, "run_benchmark", lambda args: seen.append(args) or "ran")
    served = ServedAt("http://h:1", "m", tokenizer="tok", gpu="t4", api_key="k", max_num_seqs=4)
    spec = DecodeSpec(concurrency=[1])
    assert (
        specs.run(
            served,
            spec,
            tmp_path,
            label="L",
            model_format="qat",
            overwrite=True,
            progress=False,
            request_timeout_s=5,
        )
        == "ran"
    )
    (args,) = seen
    key = args.api_key.get_secret_value()
    assert (args.base_url, args.model, args.spec, args.out_dir, args.tokenizer, args.gpu, key, args.max_num_seqs) == (
        "http://h:1", "m", spec, str(tmp_path), "tok", "t4", "k", 4,
    )  # fmt: skip
    assert (args.label, args.model_format, args.overwrite, args.progress, args.request_timeout_s) == (
        "L",
        "qat",
        True,
        False,
        5,
    )
    specs.run(ServedAt("http://h:1", "m"), spec, "out")
    plain = seen[1]
    assert (
        plain.tokenizer,
        plain.gpu,
        plain.api_key,
        plain.max_num_seqs,
        plain.label,
        plain.model_format,
    ) == (None,) * 6
    assert (plain.overwrite, plain.progress, plain.request_timeout_s) == (False, True, 600.0)
    with pytest.raises(Gemma4T4Error, match="run\\(\\) takes a workload spec, got dict") as err:
        specs.run(served, {"kind": "decode"}, tmp_path)
    assert err.value.fix == "pass e.g. DecodeSpec(concurrency=[1, 8]) from gemma4_t4.bench.specs"
    assert len(seen) == 2
