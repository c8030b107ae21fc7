"""The test tiers: `make test-fast` deselects every tier that starts vLLM, compiles for sm_75 or
runs a notebook, and the conftest guard recognises those launches (and lets the named fakes pass)."""

from __future__ import annotations

import re
import sys

from conftest import FAST_TIER_EXCLUDES, REPO, TIER_COMMANDS, _launches, worker_cpu

FAST_TIERS = ("vllm", "compile", "notebooks", "slow")


def test_make_test_fast_deselects_every_slow_tier():
    makefile = (REPO / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if "pytest" in x and "-m" in x and "test-fast" not in x
                and "not " in x)
    for tier in FAST_TIERS:
        assert re.search(rf"not {tier}\b", line), f"make test-fast still runs the {tier} tier: {line}"
    markers = (REPO / "pyproject.toml").read_text()
    for tier in FAST_TIERS:
        assert f'"{tier}:' in markers, f"marker {tier} is not declared"
    assert set(TIER_COMMANDS) == {"vllm", "compile", "notebooks"}


def test_the_guard_watches_exactly_what_make_test_fast_selects():
    """The guard runs in `make test` too, on the tests the fast tier would run: both read one list."""
    makefile = (REPO / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if x.lstrip().startswith("$(BIN)/python -m pytest") and ' -m "' in x)
    deselected = set(re.findall(r"not (\w+)", line))
    assert deselected == set(FAST_TIER_EXCLUDES), line


def test_the_guard_matches_what_runs_not_words_in_a_script():
    """A `-c` script whose source mentions a tier's command (a comment naming turing verify's compile
    pool) runs no such command; a command whose program or module is the tier's does."""
    script = "import multiprocessing  # as turing verify's compile pool; not papermill, not ipykernel_launcher"
    assert not any(_launches(tier, [sys.executable, "-c", script, "/tmp/x"]) for tier in TIER_COMMANDS)
    assert not _launches("vllm", [sys.executable, "-c", "import vllm.entrypoints.openai.api_server"])
    assert _launches("compile", ["/venv/bin/gemma4-t4", "turing", "verify"])
    assert not _launches("compile", ["/venv/bin/gemma4-t4", "turing", "show", "verify"])
    assert _launches("notebooks", ["/venv/bin/papermill", "in.ipynb", "out.ipynb"])
    assert _launches("notebooks", ["papermill", "in.ipynb", "out.ipynb"])


def test_the_guard_tells_a_real_vllm_launch_from_the_fake():
    real = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    supervised = [sys.executable, "-m", "gemma4_t4.serving.supervisor", "spec.json", "--", *real]
    fake = ["/tmp/x/fake_vllm_python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    assert _launches("vllm", real) and _launches("vllm", supervised)
    assert not _launches("vllm", fake) and not _launches("vllm", [sys.executable, "-m", "gemma4_t4", "doctor"])
    assert _launches("compile", [sys.executable, "-m", "gemma4_t4", "turing", "verify", "--arch", "sm_75"])
    assert _launches("notebooks", [sys.executable, "-m", "ipykernel_launcher", "-f", "k.json"])
    assert not _launches("notebooks", [sys.executable, "-m", "gemma4_t4", "models"])


def test_each_xdist_worker_binds_its_vllm_servers_to_its_own_core():
    assert [worker_cpu(f"gw{i}", [1, 0]) for i in range(3)] == [0, 1, 0]
    assert worker_cpu("gw1", [4, 5, 6, 7]) == 5
    # outside xdist, or with one CPU to use, vLLM keeps its own choice
    assert worker_cpu(None, [0, 1]) is None and worker_cpu("gw0", [3]) is None and worker_cpu("master", [0, 1]) is None


def test_each_xdist_worker_has_its_own_package_cache_root():
    """Workers inherit the controller's environment; the root conftest set there is not shared on.
    (Outside xdist there is one process, and its root is the unsuffixed one.)"""
    import os

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    root = os.environ["GEMMA4_T4_CACHE_DIR"]
    assert root.endswith(f"gemma4_t4-cache-{worker}" if worker else "gemma4_t4-cache"), (worker, root)


# The test tree mirrors the package (vllm-project/guidellm's layout): tests/<folder>/ for each package folder,
# tests/mcp/ and tests/notebooks/ for the two surfaces in the package's root, tests/fakes/ for the stand-ins the
# tests share; at tests/ itself only the package-wide checks below.
SURFACE_FOLDERS = {"mcp", "notebooks", "fakes", "data"}
PACKAGE_WIDE = {"test_architecture.py", "test_display.py", "test_docs_run.py", "test_imports_declared.py",
                "test_mutation_docs.py", "test_one_declaration.py", "test_planted_bugs.py", "test_test_tiers.py",
                "test_user_expectations.py"}


def misplaced_tests(tests: list[str], package_folders: set[str]) -> list[str]:
    """Each test file (a path relative to tests/) that is not in a folder named after a package folder or
    surface, and each file at tests/ itself that is not a package-wide check."""
    found = []
    for rel in tests:
        folder, _, name = rel.rpartition("/")
        allowed = folder.split("/")[0] in package_folders | SURFACE_FOLDERS if folder else name in PACKAGE_WIDE
        if not allowed:
            found.append(rel)
    return found


def test_the_layout_check_sees_a_misplaced_test():
    assert misplaced_tests(["test_gate_judge.py", "gate/test_x.py", "serving/test_y.py"], {"serving"}) == [
        "test_gate_judge.py", "gate/test_x.py"]


def test_the_tests_mirror_the_package():
    package = REPO / "gemma4_t4"
    folders = {p.parent.name for p in package.glob("*/__init__.py")}
    tests = [str(p.relative_to(REPO / "tests")) for p in (REPO / "tests").rglob("test_*.py")]
    assert misplaced_tests(tests, folders) == []
    for folder in {t.split("/")[0] for t in tests if "/" in t}:
        assert not (REPO / "tests" / folder / "__init__.py").exists(), "test folders are not packages (unique basenames)"
    names = [t.rsplit("/", 1)[-1] for t in tests]
    assert len(names) == len(set(names)), "two test files share a basename"


def test_make_selects_tests_by_marker_only():
    """`make test` and `make test-fast` run the whole tree and choose by marker, never by file name."""
    for line in (REPO / "Makefile").read_text().splitlines():
        if "-m pytest" in line:
            assert "tests/" not in line and "-k" not in line.split(), line
