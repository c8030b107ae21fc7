"""The mutation scores in docs/ are what the committed records say, and a re-run of survivors
updates a module's record the way its reader expects (scripts/mutation_score.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ms():
    spec = importlib.util.spec_from_file_location("mutation_score", REPO / "scripts" / "mutation_score.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def test_the_docs_table_and_survivors_page_are_written_from_the_records(ms):
    records = ms.committed_records()
    testing = (REPO / "docs" / "testing.md").read_text()
    block = testing[testing.index(ms.TABLE_START) + len(ms.TABLE_START) : testing.index(ms.TABLE_END)]
    fix = "run `.venv/bin/python scripts/mutation_score.py --docs` and commit docs/"
    assert block.strip() == ms.render_table(records).strip(), fix
    assert (REPO / "docs" / "mutation-survivors.md").read_text() == ms.render_survivors(records), fix


def test_every_scored_module_and_test_file_exists(ms):
    for key, target in ms.MODULES.items():
        assert (REPO / target.path).is_file(), key
        for test in target.tests:
            assert (REPO / test.split("::")[0]).is_file(), f"{key}: {test} is named in MODULES but missing"


def test_each_record_counts_add_up(ms):
    for key, record in ms.committed_records().items():
        if record is None:
            continue
        assert sum(record["counts"].values()) == record["mutants"], key
        caught, scored = ms.score(record["counts"])
        assert caught == record["killed"] and scored == record["scored"], key
        # every named equivalent is a survivor of the same record, with a reason
        alive = {s["mutant"] for s in record["survivors"]}
        for mutant, why in record.get("equivalent", {}).items():
            assert mutant in alive and len(why) > 10, (key, mutant)


def _record(ms):
    survivors = [
        {"mutant": f"m.x_f__mutmut_{n}", "status": "survived", "where": "m.py:1", "diff": "-a\n+b\n"} for n in (1, 2, 3)
    ]
    return {"module": "m", "path": "m.py", "mutants": 10, "counts": {"killed": 7, "survived": 3},
            "killed": 7, "scored": 10, "score": 70.0, "survivors": survivors}


def test_a_rerun_that_kills_two_of_three_survivors_raises_the_score_from_70_to_90(ms):
    rerun = {"m.x_f__mutmut_1": "killed", "m.x_f__mutmut_2": "timeout", "m.x_f__mutmut_3": "survived"}
    left = [{"mutant": "m.x_f__mutmut_3", "status": "survived", "where": "m.py:1", "diff": "-a\n+c\n"}]
    merged = ms.merge_rerun(_record(ms), rerun, left, 12.0)
    assert merged["counts"] == {"killed": 8, "timeout": 1, "survived": 1}
    assert (merged["killed"], merged["scored"], merged["score"]) == (9, 10, 90.0)
    assert [s["mutant"] for s in merged["survivors"]] == ["m.x_f__mutmut_3"]
    assert merged["reruns"][-1]["mutants"] == 3 and merged["reruns"][-1]["killed"] == 2


def test_a_rerun_of_a_mutant_killed_before_that_now_survives_lowers_the_score(ms):
    merged = ms.merge_rerun(_record(ms), {"m.x_g__mutmut_9": "survived"},
                            [{"mutant": "m.x_g__mutmut_9", "status": "survived", "where": "m.py:2", "diff": ""}], 1.0)
    assert merged["counts"] == {"killed": 6, "survived": 4} and merged["score"] == 60.0
    assert len(merged["survivors"]) == 4


def test_an_equivalent_survivor_leaves_the_score_and_is_named_with_its_reason(ms):
    record = ms.compact(_record(ms), {"equivalent": {"m.x_f__mutmut_2": "strict=False is zip's default"}, "notes": ""})
    assert ms.adjusted(record) == (7, 9, 1)
    # a named equivalent that a later run killed is dropped with it
    gone = ms.compact({**_record(ms), "survivors": _record(ms)["survivors"][:1]},
                      {"equivalent": {"m.x_f__mutmut_2": "strict=False is zip's default"}})
    assert gone["equivalent"] == {}


def test_the_committed_records_are_json_with_their_module_and_date(ms):
    for path in sorted((REPO / "docs" / "results" / "mutation").glob("*.json")):
        record = json.loads(path.read_text())
        assert record["module"] == path.stem and record["module"] in ms.MODULES
        assert record.get("date"), path.name


def test_every_module_is_in_exactly_one_batch(ms):
    batched = [key for keys in ms.BATCHES.values() for key in keys]
    assert sorted(batched) == sorted(ms.MODULES), set(batched) ^ set(ms.MODULES)
