"""What a learner gets from a notebook's install cell, proven in a clean virtual environment.

Each notebook's first code cell runs ``pip install "gemma4-t4[EXTRAS] @ git+URL"``. This test reads
that line from every notebook, puts this working tree (its tracked and untracked, non-ignored files,
as a git clone would carry them) in place of the git URL, installs it into a fresh ``python -m venv``
(one venv per distinct install line; pip's cache and this machine's pip configuration are used as a
learner's pip would use its own), and then, in that venv:

- runs every ``import gemma4_t4...`` / ``from gemma4_t4... import ...`` statement the notebooks hold,
  exactly as written (so a missing name fails too);
- runs ``gemma4-t4 --help`` and ``gemma4-t4 doctor --json``: doctor may report problems (exit 1, as its
  help says) but must not crash (no traceback, valid JSON);
- checks the install pulled no CUDA build of torch (no ``nvidia-*`` distribution, no ``+cu`` torch):
  the notebooks install their GPU stack later, in ``setup()``, for the host's driver.

It measures each venv's creation and install time and prints it (``-s`` shows it); nothing is
asserted about time.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import time
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
GIT_SPEC = re.compile(r"^(?P<name>gemma4-t4)(?P<extras>\[[^\]]*\])?\s*@\s*git\+\S+$")

def code_cells(notebook: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]


def install_args(notebook: Path) -> list[str]:
    """The pip arguments of the notebook's install cell: the string items after ``"install"`` in
    the first ``[sys.executable, "-m", "pip", "install", ...]`` list of its code cells."""
    for source in code_cells(notebook):
        lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.List):
                continue
            items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            if "pip" in items and "install" in items:
                rest = items[items.index("install") + 1 :]
                assert all(isinstance(a, str) for a in rest), f"{notebook.name}: non-literal pip argument"
                return rest
    raise AssertionError(f"{notebook.name}: no install cell (`-m pip install ...`) found")


def local_spec(args: list[str], tree: Path) -> list[str]:
    """The same pip arguments with the package's git URL replaced by the local tree."""
    out, replaced = [], 0
    for arg in args:
        match = GIT_SPEC.match(arg)
        if match:
            out.append(f"{match['name']}{match['extras'] or ''} @ {tree.as_uri()}")
            replaced += 1
        else:
            out.append(arg)
    assert replaced == 1, f"expected one `gemma4-t4[...] @ git+URL` requirement in {args}"
    return out


def package_imports(notebook: Path) -> list[str]:
    """Every import statement of gemma4_t4 in the notebook's code cells, as source text."""
    found = []
    for source in code_cells(notebook):
        lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
        for node in ast.walk(ast.parse("\n".join(lines))):
            ours = (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gemma4_t4") or (
                isinstance(node, ast.Import) and any(a.name.split(".")[0] == "gemma4_t4" for a in node.names)
            )
            if ours:
                found.append(ast.unparse(node))
    return found


def test_install_lines_and_imports_are_read_from_the_notebooks():
    """The parsing the slow tests rely on (fast: reads the notebooks only)."""
    assert len(NOTEBOOKS) == 4
    for nb in NOTEBOOKS:
        args = install_args(nb)
        assert any(GIT_SPEC.match(a) for a in args), args
        assert "from gemma4_t4.notebook import setup" in package_imports(nb)
    spec = local_spec(["--quiet", "gemma4-t4[notebooks] @ git+https://example.invalid/x@main"], Path("/t"))
    assert spec == ["--quiet", "gemma4-t4[notebooks] @ file:///t"]


def copy_working_tree(dest: Path) -> Path:
    """Tracked plus untracked, non-ignored files: what a clone of this tree (with its edits) holds."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


LOCAL_SPEC = re.compile(r"^(?P<name>gemma4-t4)(?P<extras>\[[^\]]*\])?\s*@\s*file://\S+$")


def _extras(args: tuple[str, ...]) -> frozenset[str]:
    """The extras of the (local) gemma4-t4 requirement among pip's arguments."""
    (match,) = filter(None, map(LOCAL_SPEC.match, args))
    return frozenset(filter(None, (match["extras"] or "[]")[1:-1].split(",")))


def _pip_install(bin_dir: Path, args: tuple[str, ...], env: dict[str, str]) -> float:
    start = time.monotonic()
    # --no-compile: byte-compiling every installed file changes nothing a learner can see, and costs
    # minutes on a 2-core machine
    done = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off",
         "--no-compile", *args],
        env=env, capture_output=True, text=True, timeout=2400,
    )
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return time.monotonic() - start


def _checks(bin_dir: Path, nb: Path, env: dict[str, str], cwd: Path) -> dict[str, subprocess.CompletedProcess]:
    """What each test below asserts on, run right after the notebook's own install line."""
    script = "\n".join(package_imports(nb)) + "\nimport gemma4_t4, sys\nprint(gemma4_t4.__file__)\n"
    cli = str(bin_dir / "gemma4-t4")
    return {
        "imports": _run([str(bin_dir / "python"), "-c", script], env, cwd),
        "help": _run([cli, "--help"], env, cwd),
        "doctor": _run([cli, "doctor", "--json"], env, cwd),
        "pip list": _run([str(bin_dir / "python"), "-m", "pip", "list", "--format=json"], env, cwd),
    }


@pytest.fixture(scope="module")
def learner_venvs(tmp_path_factory):
    """notebook -> (venv bin folder, the checks run right after its install line). The install lines
    are applied smallest first: a line whose extras contain every extra installed so far goes into the
    same venv (``[notebooks]``, then ``[aws,mcp,notebooks]`` adds what Part 1 needs), any other line
    gets a fresh venv. Each notebook's checks run before a later line installs more, so a notebook
    is judged on exactly what its own line has installed."""
    tree = copy_working_tree(tmp_path_factory.mktemp("tree") / "gemma4_t4")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    cwd = tmp_path_factory.mktemp("cwd")
    lines: dict[tuple[str, ...], list[Path]] = {}
    for nb in NOTEBOOKS:
        lines.setdefault(tuple(local_spec(install_args(nb), tree)), []).append(nb)
    results, bin_dir, installed = {}, None, frozenset()
    start = time.monotonic()
    for args in sorted(lines, key=lambda a: len(_extras(a))):
        if bin_dir is None or not installed <= _extras(args):
            root = tmp_path_factory.mktemp("venv")
            venv.EnvBuilder(with_pip=True, clear=True).create(root)
            bin_dir, installed = root / "bin", frozenset()
        seconds = _pip_install(bin_dir, args, env)
        print(f"\n[learner venv] {' '.join(args)}: installed in {seconds:.0f} s")
        installed = _extras(args)
        for nb in lines[args]:
            results[nb] = (bin_dir, _checks(bin_dir, nb, env, cwd))
    print(f"[learner venv] every install line done in {time.monotonic() - start:.0f} s")
    return results


# (the slow tests carry timeout(3600): creating the venvs is a learner's pip install, many minutes
# on a loaded 2-core machine, and the module fixture's time counts against the first test using it)


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_imports_work_after_its_install_cell(learner_venvs, nb):
    bin_dir, checks = learner_venvs[nb]
    assert package_imports(nb), f"{nb.name} imports nothing from gemma4_t4?"
    done = checks["imports"]
    assert done.returncode == 0, f"{nb.name}: its imports fail after its install cell:\n{done.stderr[-3000:]}"
    assert str(bin_dir.parent) in done.stdout, "imported a gemma4_t4 from outside the learner's venv"


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_cli_help_and_doctor_work_after_the_install_cell(learner_venvs, nb):
    _bin_dir, checks = learner_venvs[nb]
    helped = checks["help"]
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert "doctor" in helped.stdout and "Traceback" not in helped.stderr

    doctor = checks["doctor"]
    assert doctor.returncode in (0, 1), f"doctor exit {doctor.returncode}:\n{doctor.stderr[-3000:]}"
    assert "Traceback" not in doctor.stderr + doctor.stdout
    report = json.loads(doctor.stdout)
    assert "facts" in report and "problems" in report


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_install_cell_pulls_no_cuda_torch(learner_venvs, nb):
    listed = learner_venvs[nb][1]["pip list"]
    assert listed.returncode == 0, listed.stderr
    dists = {d["name"].lower(): d["version"] for d in json.loads(listed.stdout)}
    cuda = sorted(name for name in dists if name.startswith("nvidia-"))
    assert not cuda, f"the install cell pulled CUDA libraries: {cuda}"
    assert "+cu" not in dists.get("torch", ""), f"the install cell pulled a CUDA torch {dists['torch']}"
    assert "gemma4-t4" in dists and "pydantic" in dists

