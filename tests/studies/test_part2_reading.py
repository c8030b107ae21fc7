"""Part 2's results read the learner's own numbers: the ceilings, the host RAM verdict and the QAT vs
bf16 comparison, on the CPU default (a tiny model, answers in one flush) and on stand-in T4 figures."""

from __future__ import annotations

import pytest

from gemma4_t4.bench.published import Kind, QatVsBf16
from gemma4_t4.bench.results import DecodeSpeed
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.studies import part2
from gemma4_t4.venues.endpoint import Budget

FLUSH = "not measured: the server sent each answer in one flush"


def _speed(per_stream: dict[int, float | None] | None, output: dict[int, float | None]) -> DecodeSpeed:
    return DecodeSpeed(
        per_stream=per_stream,
        output_tok_s=output,
        e2el_ms={c: 900.0 for c in output},
        not_measured=None if per_stream else FLUSH,
    )


def _t4(bf16: float = 40.4, qat: float = 72.3) -> part2.Comparison:
    figures = QatVsBf16(
        _speed({1: bf16, 8: 20.6}, {1: bf16, 8: 164.6}),
        _speed({1: qat, 8: 27.0}, {1: qat, 8: 215.9}),
        Kind("E2B", "t4"),
        "t4",
    )
    return part2.Comparison(figures, part2.ceilings("e2b", "t4", "t4"), "t4")


def _cpu() -> part2.Comparison:
    figures = QatVsBf16(
        _speed(None, {1: 30.0, 8: 90.0}), _speed(None, {1: 33.0, 8: 99.0}), Kind("tiny", "cpu"), "cpu"
    )
    return part2.Comparison(figures, part2.ceilings("e2b", "t4", "cpu"), "cpu")


def test_the_t4_reading_puts_the_learners_numbers_against_this_gpus_ceiling():
    notes = "\n".join(_t4().notes())
    assert "QAT decoded 72.3 tok/s per stream at c=1 and bf16 40.4: 1.79x." in notes
    assert (
        "72.3 tok/s is 42% of this GPU's 172 tok/s QAT decode ceiling (T4), bf16's 40.4 is 58% of 70."
        in notes
    )
    assert "164.6 vs 215.9 tok/s at 8 streams on a GCE T4 (1.31x, published)" in notes
    assert "the measured / published column compares yours" in notes and "2.05x bf16 (published)" in notes
    assert "72.3 tok/s is 42%" in str(_t4()) and "72.3 tok/s is 42%" in _t4()._repr_html_()  # both displays
    mine = "\n".join(_t4(bf16=45.0, qat=90.0).notes())  # the reading is computed, not quoted
    assert "90.0 tok/s is 52% of this GPU's 172" in mine and "2.00x" in mine


def test_the_cpu_reading_says_what_the_tiny_model_shows_and_cannot():
    notes = "\n".join(_cpu().notes())
    assert "Per-stream speed is not measured here" in notes and "output tok/s at c=1 is 1.10x" in notes
    assert "same tiny random model stored in bf16" in notes and "not QAT's speed-up" in notes
    assert "% of this GPU's" not in notes  # a CPU run is never read against a T4 ceiling
    ceilings = "\n".join(part2.ceilings("e2b", "t4", "cpu").notes())
    assert "T4 figures by arithmetic only" in ceilings


def test_the_ceilings_read_the_published_t4_run_against_them():
    notes = "\n".join(part2.ceilings("e2b", "t4", "t4").notes())
    assert "4.60 GB in bf16 and 1.86 GB as QAT int4: at most 69.6 vs 171.9 tok/s per stream" in notes
    assert "40.4 and 72.3 tok/s on a GCE T4 (published): 58% and 42% of these ceilings" in notes
    l4 = "\n".join(part2.ceilings("e2b", "l4", "t4").notes())  # another GPU: its own ceilings, no T4 claim
    assert l4.startswith("On L4") and "GCE T4" not in l4


def test_free_colab_ram_loads_the_qat_build_but_not_bf16():
    verdict = part2.RamVerdict("e2b", 12.7, 0.0, "t4")
    rows = {r["build"]: r["verdict"] for r in verdict.table_rows()}
    assert "below the ~13.5 GiB load peak" in rows["bf16"] and "no swap needed" in rows["qat"], rows
    assert "free Colab" in " ".join(verdict.notes())


def test_a_missing_or_impossible_figure_stops_the_run_naming_it():
    comparison = _t4()
    with pytest.raises(Gemma4T4Error, match=r"qat per-stream tok/s at c=1 is 190.0, above T4's 171.9 tok/s"):
        _t4(qat=190.0)._below_ceiling("qat", {1: 190.0})
    comparison.figures.bf16.output_tok_s[8] = None
    with pytest.raises(Gemma4T4Error, match=r"bf16 output tok/s at c=8 is None: a measured figure must be"):
        comparison.check(
            [], [1, 8], part2.Study("t4", "e2b", "t4", Budget(5.0), part2.RamVerdict("e2b", None, None)).budget, []
        )


def test_the_summary_is_the_checked_figures_and_the_published_ones_apart():
    summary = _t4().summary()
    assert summary["results"]["QAT/bf16 ratio c=1"] == pytest.approx(72.3 / 40.4)
    assert summary["results"]["QAT/bf16 all-streams ratio c=8"] == pytest.approx(215.9 / 164.6)
    assert summary["published"] == {
        "QAT/bf16 per stream c=1 (GCE T4)": 1.79,
        "QAT/bf16 all streams c=8 (GCE T4)": 1.31,
        "QAT/bf16 decode (SageMaker L4)": 2.05,
    }


def test_the_clean_up_refuses_while_an_endpoint_of_the_part_still_bills():
    part2.Study.clean_up([])  # nothing left: the part ends
    with pytest.raises(Gemma4T4Error, match=r"still billing: gemma4-qat"):
        part2.Study.clean_up(["gemma4-qat"])


def test_every_call_the_notebook_makes_on_its_study_and_comparison_exists():
    """The notebook's calls on its study objects resolve (a missing method fails only when executed)."""
    import json
    import re
    from pathlib import Path

    cells = json.loads(
        (Path(__file__).resolve().parents[2] / "notebooks" / "02_bf16_vs_qat.ipynb").read_text()
    )["cells"]
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    owners = {"part2": part2, "study": part2.Study, "comparison": part2.Comparison}
    used = set(re.findall(r"\b(part2|study|comparison)\.(\w+)", source))
    missing = [
        f"{o}.{a}" for o, a in used if not hasattr(owners[o], a) and a not in part2.Study.__dataclass_fields__
    ]
    assert used and not missing, missing


def test_ipythons_text_display_is_the_table_with_its_reading():
    """IPython's text form (what papermill and a terminal show) is the table and its notes, not the
    dataclass's field dump."""
    from IPython.lib.pretty import pretty

    shown = pretty(_t4())
    assert shown.startswith("QAT int4 vs bf16") and "72.3 tok/s is 42%" in shown
    assert pretty(part2.RamVerdict("e2b", 12.7, 0.0, "t4")).startswith("Gemma 4 E2B: host RAM")
    assert pretty(part2.ceilings("e2b", "t4", "t4")).startswith("Gemma 4 E2B: decode ceiling")
