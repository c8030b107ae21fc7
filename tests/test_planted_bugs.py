"""scripts/planted_bugs.py's records stay true to the code: a record whose original text no longer
occurs, occurs twice, or names a test that was renamed would make the script fail (or plant nothing)
only when someone runs it. Checked here without running anything: the texts by reading the files, the
tests by reading the test files' syntax."""

from __future__ import annotations

import ast
import importlib.util
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("planted_bugs", REPO / "scripts" / "planted_bugs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


BUGS = _script().BUGS


@cache
def _test_names(path: str) -> frozenset[str]:
    """The test functions of a test file, as pytest collects them: ``test_*`` at module level and
    in ``Test*`` classes (as ``Class::test``)."""
    tree = ast.parse((REPO / path).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names |= {
                f"{node.name}::{f.name}"
                for f in node.body
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test")
            }
    return frozenset(names)


@pytest.mark.parametrize("bug", BUGS, ids=[f"{n}" for n in range(1, len(BUGS) + 1)])
def test_each_planted_bug_changes_one_place_that_exists(bug):
    text = (REPO / bug.file).read_text()
    assert text.count(bug.original) == 1, (
        f"{bug.file}: {bug.original!r} occurs {text.count(bug.original)} times"
    )
    planted = text.replace(bug.original, bug.bugged)
    assert planted != text, "the bugged text must differ from the code's"
    ast.parse(planted)  # the bug leaves the module importable: a syntax error would be caught by any test
    assert bug.tests, "a bug with no test to catch it"


@pytest.mark.parametrize("bug", BUGS, ids=[f"{n}" for n in range(1, len(BUGS) + 1)])
def test_each_named_test_exists(bug):
    for node in bug.tests:
        path, _, name = node.partition("::")
        assert (REPO / path).is_file() and path.startswith("tests/") and Path(path).name.startswith("test_"), node
        if name:  # a parametrized case is named by its function
            assert name.split("[")[0] in _test_names(path), f"{node}: no such test"


def test_the_nine_behaviours_of_issue_44_each_have_a_record():
    """Issue 44 lists nine user-visible bugs (some with two faces); each face is planted."""
    files = {b.file for b in BUGS if b.issue}
    assert len([b for b in BUGS if b.issue]) >= 9
    assert {
        "gemma4_t4/bench/registry.py",
        "gemma4_t4/bench/specs.py",
        "gemma4_t4/bench/compare.py",
        "gemma4_t4/bench/results.py",
        "gemma4_t4/host/env.py",
        "gemma4_t4/mcp_server.py",
        "gemma4_t4/bench/published.py",
        "gemma4_t4/notebook.py",
    } <= files
