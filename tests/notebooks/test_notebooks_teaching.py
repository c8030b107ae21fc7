"""The notebooks teach: thin cells, prose after every result, terms defined up front, and results
that say what the learner's own numbers mean (on the CPU default and on T4-sized figures).

Static checks read the notebooks' JSON; the display checks build real results from the tiny QAT
checkpoint (conftest's ``tiny_qat_model_dir``) and from stand-in figures of the size a T4 run sees."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import nbformat
import pytest

from gemma4_t4 import tutorial_part1 as part1
from gemma4_t4 import tutorial_part3 as part3
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.quant import awq_requantize, grid_check, grid_compare, repack
from gemma4_t4.sagemaker.deploy import DeployResult
from gemma4_t4.sagemaker.ops import EndpointStatus, InvokeResult
from gemma4_t4.sagemaker.quotas import QuotaReport, QuotaRow

NB_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
# parts still to be reshaped (their cases are expected to fail): none since Parts 2 and 4 were
PENDING: set[str] = set()
PARAMS = [
    pytest.param(
        p,
        id=p.stem,
        marks=[pytest.mark.xfail(strict=False, reason="reshaped separately")]
        if p.stem[:2] in PENDING
        else [],
    )
    for p in NOTEBOOKS
]
MAX_CELL_LINES = 8
MAX_DICT_LINES = 3
# jargon a learner meets (issue "A tutorial that teaches"): used anywhere, defined in the introduction
TERMS = (
    "QAT",
    "w4a16",
    "AWQ",
    "GPTQ",
    "lattice",
    "DLC",
    "InferenceAmiVersion",
    "stand-in",
    "sm_75",
    "prefill",
    "KV cache",
    "E2EL",
    "start gate",
    "FMA",
    "CUTLASS",
    "bootstrap",
)


def _cells(path: Path) -> list:
    return nbformat.read(str(path), as_version=4).cells


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _lines(source: str) -> list[str]:
    return [ln for ln in source.splitlines() if ln.strip()]


def cell_problems(source: str) -> list[str]:
    """What a (non-parameters) code cell must not hold: too many lines, asserts, matplotlib, long dicts."""
    found = [f"{len(_lines(source))} lines"] if len(_lines(source)) > MAX_CELL_LINES else []
    tree = ast.parse(source)
    found += ["assert" for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    found += [
        "import matplotlib"
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        and any("matplotlib" in (a.name or "") for a in n.names)
        or getattr(n, "module", "") == "matplotlib"
    ]
    found += [
        f"a dict of {n.end_lineno - n.lineno + 1} lines"
        for n in ast.walk(tree)
        if isinstance(n, ast.Dict) and n.end_lineno - n.lineno + 1 > MAX_DICT_LINES
    ]
    return found


def is_result_cell(cell) -> bool:
    """A code cell whose output is a result: it ends with an expression shown (not setup()), prints or plots."""
    if cell.cell_type != "code" or {"install", "parameters", "cleanup"} & set(_tags(cell)):
        return False
    body = ast.parse(cell.source).body
    shown = bool(body) and isinstance(body[-1], ast.Expr) and "setup(" not in ast.unparse(body[-1])
    return shown or "print(" in cell.source or "show_figure(" in cell.source


def unexplained_results(cells: list) -> list[str]:
    """Result cells not followed by a markdown cell that reads them (a new step's heading does not)."""
    found = []
    for cell, after in zip(cells, [*cells[1:], None], strict=True):
        if is_result_cell(cell) and (
            after is None or after.cell_type != "markdown" or after.source.startswith("#")
        ):
            found.append(cell.source.splitlines()[0][:70])
    return found


def undefined_terms(cells: list) -> list[str]:
    """Terms used in the body but not defined in the introduction (the cells before "## Install")."""
    install = next(
        i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## Install")
    )
    intro = "\n".join(c.source for c in cells[:install])
    body = "\n".join(c.source for c in cells[install:-1])  # the last cell links the next part
    return [
        t
        for t in TERMS
        if re.search(re.escape(t), body, re.I)
        and not re.search(rf"\*\*[^*]*{re.escape(t)}[^*]*\*\*", intro, re.I)
    ]


@pytest.mark.parametrize("nb_path", PARAMS)
def test_code_cells_are_short_calls(nb_path):
    problems = {
        c.source.splitlines()[0][:60]: cell_problems(c.source)
        for c in _cells(nb_path)
        if c.cell_type == "code" and "parameters" not in _tags(c) and cell_problems(c.source)
    }
    assert not problems, problems


@pytest.mark.parametrize("nb_path", PARAMS)
def test_every_result_is_followed_by_its_reading(nb_path):
    assert unexplained_results(_cells(nb_path)) == []


@pytest.mark.parametrize("nb_path", PARAMS)
def test_the_introduction_defines_the_terms_the_part_uses(nb_path):
    cells = _cells(nb_path)
    assert re.search(r"^### (Words used here|Glossary)", cells[0].source, re.M), (
        "no glossary in the introduction"
    )
    assert undefined_terms(cells) == []


def test_the_static_rules_bite():
    long_cell = "\n".join(f"x{i} = {i}" for i in range(9))
    assert cell_problems(long_cell) == ["9 lines"]
    assert cell_problems("assert x\nimport matplotlib.pyplot as plt") == ["assert", "import matplotlib"]
    assert cell_problems('f({\n  "a": 1,\n  "b": 2,\n})') == ["a dict of 4 lines"]
    result, heading, reading = (
        nbformat.v4.new_code_cell("r = f()\nr"),
        nbformat.v4.new_markdown_cell("## Step 2"),
        nbformat.v4.new_markdown_cell("Look at the first row."),
    )
    assert (
        unexplained_results([result, heading]) == ["r = f()"] and unexplained_results([result, reading]) == []
    )
    intro, install = (
        nbformat.v4.new_markdown_cell("# P\n### Words used here\n- **QAT**: ..."),
        nbformat.v4.new_markdown_cell("## Install"),
    )
    body, last = (
        nbformat.v4.new_markdown_cell("the KV cache grows; QAT"),
        nbformat.v4.new_markdown_cell("## Next"),
    )
    assert undefined_terms([intro, install, body, last]) == ["KV cache"]


# ---------------------------------------------------------------- Part 3's results read the numbers


@pytest.fixture(scope="module")
def part3_results(tiny_qat_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("teaching3")
    src = str(tiny_qat_model_dir)
    linear, emb4 = repack(src, out / "linear"), repack(src, out / "emb4", emb4=True)
    awq_requantize(src, out / "awq")
    return (
        grid_check(src),
        linear,
        emb4,
        grid_compare(src, str(out / "linear")),
        grid_compare(src, str(out / "awq")),
    )


def _t4_sized(report, **more):
    """The same report with figures the size of a T4 run on E2B (billions of weights)."""
    return dataclasses.replace(report, **more)


def test_part3_results_read_the_tiny_models_numbers(part3_results):
    grid, linear, emb4, vs_repack, vs_awq = part3_results
    text = str(grid)
    assert f"Every one of the {grid.weights_total:,} weights" in text and "tiny random test model" in text
    levels = part3.LevelsChanged(vs_repack, vs_awq, "cpu")
    for shown in (str(levels), levels._repr_html_()):
        assert f"the repack moved 0 of {vs_repack.weights_with_ref_lattice:,} weights" in shown
        assert f"moved {vs_awq.level_changed:,} ({vs_awq.level_changed_pct:.3g} %)" in shown
        assert "11.5 M weights" in shown and "30.3 %" in shown and "cannot show" in shown
    repacks = str(part3.Repacks(linear, emb4))
    assert f"emb4 is {emb4.bytes_written / linear.bytes_written:.0%} of the linear-only repack" in repacks
    assert "1.39x" in repacks and "not E2B's" in repacks
    assert "no weight moved to another level: lossless" in str(linear)
    assert "0 of " in str(vs_repack) and "lossless conversion" in str(vs_repack)


def test_part3_results_on_t4_sized_figures_drop_the_tiny_caveat(part3_results):
    grid, linear, emb4, vs_repack, vs_awq = part3_results
    big_grid = _t4_sized(grid, weights_total=4_650_000_000)
    assert "4,650,000,000 weights" in str(big_grid) and "tiny random test model" not in str(big_grid)
    big_repack = _t4_sized(vs_repack, weights_total=4_000_000_000, weights_with_ref_lattice=4_000_000_000)
    big_awq = _t4_sized(
        vs_awq,
        weights_total=4_000_000_000,
        weights_with_ref_lattice=4_000_000_000,
        level_changed=1_212_000_000,
        level_changed_pct=30.3,
    )
    shown = str(part3.LevelsChanged(big_repack, big_awq, "t4"))
    assert "the repack moved 0 of 4,000,000,000 weights" in shown and "moved 1,212,000,000 (30.3 %)" in shown
    assert "cannot show" not in shown
    assert "moved off their 4-bit level" in str(big_awq) and "re-quantized" in str(big_awq)


def test_part3_checks_name_the_figure_that_is_missing(part3_results, tmp_path):
    grid, linear, emb4, vs_repack, vs_awq = part3_results
    answers = part3.ServedAnswers(
        tmp_path, part3.Budget(5.0), None, "not measured: no int4 kernel", exact=False
    )
    repacks, levels = part3.Repacks(linear, emb4), part3.LevelsChanged(vs_repack, vs_awq, "cpu")
    results = part3.compare("cpu", grid, repacks, levels, answers)
    assert results.summary()["results"]["weights checked"] == grid.weights_total
    nan_awq = part3.LevelsChanged(
        vs_repack, dataclasses.replace(vs_awq, level_changed_pct=float("nan")), "cpu"
    )
    with pytest.raises(Gemma4T4Error, match="check failed on the AWQ-style levels changed: nan is not"):
        part3.compare("cpu", grid, repacks, nan_awq, answers)
    assert "Nothing was served here" in str(answers)


# ---------------------------------------------------------------- Part 1's results read the numbers


def _reply(text: str, latency_s: float, tokens: int | None) -> InvokeResult:
    return InvokeResult(
        text=text,
        finish_reason="length",
        latency_s=latency_s,
        usage={"completion_tokens": tokens} if tokens else None,
    )


def test_part1_query_says_where_the_reply_came_from():
    canned = part1.Query("Q?", _reply("Paris. (canned)", 0.004, None), None, "canned (moto)", generated=False)
    tiny = part1.Query("Q?", _reply("teVick", 0.76, 32), None, "tiny Gemma 4 via the runtime stand-in", True)
    real = part1.Query("Q?", _reply("Paris is the capital.", 1.25, 9), None, "the endpoint", True)
    assert "canned stand-in reply (4 ms)" in str(canned) and "nothing about a model" in canned._repr_html_()
    assert "32 tokens in 760 ms from the tiny random Gemma 4" in str(tiny) and "no GPU speed" in str(tiny)
    assert "9 tokens in 1250 ms from Gemma 4 on the endpoint" in str(real)


def test_part1_aws_results_read_their_numbers():
    rows = [
        QuotaRow("us-east-1", "ml.g4dn.xlarge", "q", 0.0),
        QuotaRow("us-east-2", "ml.g4dn.xlarge", "q", 2.0),
    ]
    assert "1 of 2 regions allow at least one ml.g4dn.xlarge endpoint: us-east-2" in str(QuotaReport(rows))
    standin = DeployResult(
        "e", "us-east-2", "InService", True, elapsed_s=0.4, created=["model:e", "endpoint:e"]
    )
    aws = dataclasses.replace(standin, elapsed_s=780.0)
    assert "seconds mean a local stand-in answered" in str(standin)
    assert "InService after 13.0 min" in str(aws) and "stand-in" not in str(aws)
    status = EndpointStatus(
        "e", "us-east-2", True, "InService", usd_per_hour=0.736, expires_at="2026-12-05T09:00Z"
    )
    assert "$0.74/h until deleted" in str(status)
    cost = str(part1.IdleCost(2.0))
    assert "ml.g4dn.xlarge: $1.47 if it lives to its 2 h expiry tag, $17.66 if forgotten for a day" in cost
    assert "Refused before anything" in str(part1.stock_image_on_a_t4("us-east-2"))
