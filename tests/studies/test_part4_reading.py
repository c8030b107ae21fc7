"""Part 4's readings: the drafter's two speed-ups named apart, the TTFT curve read against the build
the part serves (QAT), and the results' reading of the learner's own numbers on the CPU default and
on stand-in T4 figures. The runs are stand-ins with the accessors the reading uses."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from gemma4_t4.bench.published import gce_t4
from gemma4_t4.bench.results import DecodeSpeed
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.studies import part4
from gemma4_t4.venues.endpoint import Budget

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "04_gemma4_on_t4.ipynb"


@dataclass
class _Run:
    speed: DecodeSpeed | None = None
    ttft: dict[int, float | None] | None = None
    hit_rate: float | None = None

    def decode_speed(self) -> DecodeSpeed:
        return self.speed  # type: ignore[return-value]

    def ttft_by_input_len(self) -> dict[int, float | None]:
        return self.ttft or {}

    def prefix_hit_rate(self) -> float | None:
        return self.hit_rate


def _results(
    target: str, per_stream: dict[int, float | None] | None, ttft: dict[int, float | None]
) -> part4.Results:
    speed = DecodeSpeed(
        per_stream,
        {1: 70.0, 8: 210.0},
        {1: 2000.0, 8: 5000.0},
        None if per_stream else "not measured: the server sent each answer in one flush",
    )
    study = part4.Study(target, "e2b", "t4", Budget(5.0), serves_here=False)
    return part4.Results(study, _Run(speed), _Run(ttft=ttft), _Run(hit_rate=0.5), None, None, None, [], None)  # type: ignore[arg-type]


def test_the_drafter_line_names_each_speed_up():
    line = part4.drafter_line()
    assert "109.7 -> 135.0 tok/s (1.23x the tok/s)" in line  # 135.0 / 109.7
    assert "9.9 -> 7.4 ms (1.34x less time per token)" in line  # the per-token times' ratio
    assert "(1.34x)" not in line and "tok/s (1.34x" not in line


def test_the_ttft_reading_uses_the_build_part4_serves():
    assert part4.PUBLISHED_TTFT_BUILD == "qat"
    assert (
        part4.published_ttft()
        == {512: gce_t4("qat", 512).ttft_ms, 4096: gce_t4("qat", 4096).ttft_ms}
        == {512: 316, 4096: 7243}
    )
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells)
    assert "316 ms at 512 tokens and 7,243 ms at 4,096" in text
    assert "0.3 s at 512" not in text and "7.2 s at 4,096" not in text  # the bf16 figures
    assert 'gce_t4("bf16"' not in text and "E2B bf16" not in text.split("## Step 7")[1].split("## Step 8")[0]


def test_the_t4_reading_puts_the_learners_ttft_and_decode_beside_the_published_qat_run():
    notes = "\n".join(_results("t4", {1: 70.1, 8: 26.0}, {512: 320.0, 4096: 7000.0}).notes())
    assert "TTFT grew 21.9x from 512 to 4096 tokens (8x the tokens)" in notes
    assert "316 -> 7,243 ms for the QAT build on a GCE T4 (23x for 8x the tokens, published)" in notes
    assert "this run decoded 70.1 tok/s; the series measured 72.31" in notes
    assert "50% of prompt tokens from cache: some relief" in notes and "secondary" in notes
    assert "tiny random model" not in notes


def test_the_cpu_reading_says_what_the_tiny_model_shows_and_cannot():
    notes = "\n".join(_results("cpu", None, {64: 40.0, 1024: 400.0}).notes())
    assert "TTFT grew 10.0x from 64 to 1024 tokens (16x the tokens)" in notes
    assert "Per-stream speed is not measured here: not measured: the server sent" in notes
    assert "tiny random model" in notes and "say nothing about a T4" in notes


def test_a_missing_figure_stops_part4_naming_it():
    results = _results("t4", {1: 70.1, 8: 26.0}, {512: 320.0, 4096: None})
    results.study.proof = type(
        "P",
        (),
        {
            "ok": True,
            "launches": [type("L", (), {"shared_bytes_unpatched": 98_304, "shared_bytes_patched": 65_536})()],
        },
    )()
    for run in (results.decode, results.ttft):
        run.ok, run.failed, run.dir = True, 0, Path("x")  # type: ignore[attr-defined]
    results.prefix = None
    with pytest.raises(Gemma4T4Error, match=r"TTFT ms at 4096 tokens is None"):
        results.check([1, 8], [512, 4096])


def test_every_call_the_notebook_makes_on_its_study_and_results_exists():
    """The notebook's calls on its study objects resolve (a missing method fails only when executed)."""
    import re

    cells = json.loads(NOTEBOOK.read_text())["cells"]
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    owners = {"part4": part4, "study": part4.Study, "results": part4.Results, "specs": part4.Specs}
    used = set(re.findall(r"\b(part4|study|results|specs)\.(\w+)", source))
    fields = {**part4.Study.__dataclass_fields__, **part4.Specs.__dataclass_fields__}
    missing = [f"{o}.{a}" for o, a in used if not hasattr(owners[o], a) and a not in fields]
    assert used and not missing, missing
