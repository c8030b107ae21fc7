"""What a learner gets from a notebook's install cell, proven in a clean virtual environment.

Each notebook's first code cell runs ``pip install "gemma4-t4[EXTRAS] @ git+URL"``. The shared
``learner_venv`` fixture (tests/fakes/learner_venv.py) builds this working tree into a wheel, installs it into
a fresh ``python -m venv`` outside the checkout with each install line's own arguments and extras, read
from the cells (pip's cache and this machine's pip configuration are used as a learner's pip would use
its own), and right after each line, in that venv:

- runs every ``import gemma4_t4...`` / ``from gemma4_t4... import ...`` statement the notebooks hold,
  exactly as written (so a missing name fails too);
- runs ``gemma4-t4 --help`` and ``gemma4-t4 doctor --json``: doctor may report problems (exit 1, as its
  help says) but must not crash (no traceback, valid JSON);
- checks the install pulled no CUDA build of torch (no ``nvidia-*`` distribution, no ``+cu`` torch):
  the notebooks install their GPU stack later, in ``setup()``, for the host's driver.

The same venv then runs each install cell's ``setup()`` (the CPU route) and the four notebooks
(tests/notebooks/test_notebooks_run.py). Its build times are printed (``-s`` shows them); nothing is asserted
about time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes.learner_venv import NOTEBOOKS, extras, install_args, package_imports, with_wheel

REPO = Path(__file__).resolve().parents[2]


def test_install_lines_and_imports_are_read_from_the_notebooks():
    """The parsing the slow tests rely on (fast: reads the notebooks only)."""
    assert len(NOTEBOOKS) == 4
    lines = set()
    for nb in NOTEBOOKS:
        args = install_args(nb)
        lines.add(extras(args))
        assert "from gemma4_t4.notebook import setup" in package_imports(nb)
    # one venv takes every line in turn, each judged on what it installed: their extras must nest
    ordered = sorted(lines, key=len)
    assert all(a <= b for a, b in zip(ordered, ordered[1:], strict=False)), ordered
    spec = with_wheel(["--quiet", "gemma4-t4[notebooks] @ git+https://example.invalid/x@main"], Path("/t/g.whl"))
    assert spec == ["--quiet", "gemma4-t4[notebooks] @ file:///t/g.whl"]


# (the slow tests carry timeout(3600): building the venv is a learner's pip install plus setup(), many
# minutes on a loaded 2-core machine, and the session fixture's time counts against the first test using it)


@pytest.fixture(scope="module")
def learner_venvs(learner_venv):
    """notebook -> (venv bin folder, the checks run right after its install line)."""
    print(f"\n[learner venv] {learner_venv.root}: " + ", ".join(f"{k} {v:.0f} s" for k, v in learner_venv.seconds.items()))
    return {nb: (learner_venv.bin, learner_venv.checks[nb.stem]) for nb in NOTEBOOKS}


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



@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_wheel_carries_what_the_cli_reads_at_run_time(learner_venv, tmp_path):
    """From the wheel, outside the checkout: the notebooks and params `gemma4-t4 run` executes are this
    tree's, and the T4 image's build bundle is made from the installed package (no source tree asked for)."""
    probe = ("from gemma4_t4.pipeline import NOTEBOOKS_DIR; from gemma4_t4.sagemaker import bundle; "
             "import io, zipfile; names = zipfile.ZipFile(io.BytesIO(bundle.source_bundle())).namelist(); "
             "print(NOTEBOOKS_DIR); print(sorted(names))")
    shown = learner_venv.run("python", "-c", probe, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-3000:]
    folder, names = shown.stdout.strip().splitlines()
    assert folder.startswith(str(learner_venv.root))
    for source in [*NOTEBOOKS, *(REPO / "notebooks" / "params").glob("*.yaml")]:
        installed = Path(folder) / source.relative_to(REPO / "notebooks")
        assert installed.read_bytes() == source.read_bytes(), f"the wheel's {installed.name} differs from the tree's"
    assert "docker/sagemaker-t4/Dockerfile" in names and "-py3-none-any.whl" in names
    helped = learner_venv.run("gemma4-t4", "sagemaker", "build-image", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "--dry-run" in helped.stdout, helped.stderr
    planned = learner_venv.run("gemma4-t4", "sagemaker", "build-image", "--dry-run", "--region", "us-east-2",
                               cwd=tmp_path)
    assert planned.returncode == 0 and "aws codebuild start-build" in planned.stdout, planned.stdout + planned.stderr
    assert "checkout" not in planned.stdout + planned.stderr
