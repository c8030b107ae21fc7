"""SIGTERM and SIGHUP during the commands that own AWS resources unwind exactly like Ctrl-C: the
CLI's deploy and matrix delete the endpoint they created, build-image stops its CodeBuild build,
and the MCP server, signalled during deploy_endpoint(wait=True), rolls the deploy back and exits.

Each command runs in its own process against moto, behind the stall proxy (moto would report
InService / SUCCEEDED at once); the signal is sent once the resource exists in moto."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from fakes.aws_fixtures import local_aws, local_aws_session  # noqa: F401 - fixtures
from fakes.sagemaker_stall_proxy import StallProxy

from gemma4_t4.sagemaker.image import T4_IMAGE_REPOSITORY

REPO = Path(__file__).resolve().parents[2]
REGION = "us-east-2"
SIGNALS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGHUP, id="SIGHUP")]


def _sagemaker_left() -> dict[str, list[str]]:
    sm = boto3.client("sagemaker", region_name=REGION)
    return {
        "endpoints": [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]],
        "configs": [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]],
        "models": [m["ModelName"] for m in sm.list_models()["Models"]],
    }


def _wait_until(predicate, what: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the command ended (rc {proc.returncode}) before {what}:\n{out}\n{err}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _env(local_aws, proxy: StallProxy, tmp_path: Path) -> dict[str, str]:  # noqa: F811
    return {
        **os.environ,
        **local_aws.env(),
        "AWS_ENDPOINT_URL_SAGEMAKER": proxy.url,
        "AWS_ENDPOINT_URL_CODEBUILD": proxy.url,
        "PYTHONPATH": str(REPO),
        "GEMMA4_T4_WORK_DIR": str(tmp_path),
        "GEMMA4_T4_CACHE_DIR": str(tmp_path / "cache"),  # the endpoints' ownership records
    }


def _clear_fixed_images() -> None:
    ecr = boto3.client("ecr", region_name=REGION)
    try:
        ecr.delete_repository(repositoryName=T4_IMAGE_REPOSITORY, force=True)
    except ecr.exceptions.RepositoryNotFoundException:
        pass


COMMANDS = {
    "deploy": ["deploy", "--name", "g4-signal", "--instance-type", "ml.g4dn.xlarge"],
    "matrix": [
        "matrix",
        "--models",
        "google/gemma-4-E2B-it",
        "--budget-usd",
        "5",
        "--instance-type",
        "ml.g4dn.xlarge",
    ],
    "build-image": ["build-image"],
}


@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_cli_signal_unwinds_like_ctrl_c(local_aws, tmp_path, command, sig):  # noqa: F811
    if command == "build-image":
        _clear_fixed_images()  # so the build really starts
    argv = [*COMMANDS[command], "--region", REGION, "--json"]
    if command == "matrix":
        argv += ["--out", str(tmp_path / "matrix")]
    with StallProxy(local_aws.endpoint_url) as proxy:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gemma4_t4", "sagemaker", *argv],
            env=_env(local_aws, proxy, tmp_path),
            cwd=tmp_path,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            if command == "build-image":
                started = proxy.wait_for("BatchGetBuilds")  # the build exists and is being waited on
                build_id = started["ids"][0]
            else:
                _wait_until(lambda: _sagemaker_left()["endpoints"], "the endpoint exists in moto", proc)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        assert proc.returncode == -sig, (proc.returncode, out, err)  # ends the way its sender expects
        assert "Traceback" not in err
        # one last line says what the command undid before it ended
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"interrupted ({sig.name}) after "), err
        if command == "build-image":
            assert {"id": build_id} in proxy.requests("StopBuild"), proxy.operations()
            assert last.endswith(f": stopped CodeBuild build {build_id}"), last
        else:
            name = "g4-signal" if command == "deploy" else "g4-matrix-gemma-4-e2b-it"
            assert last.endswith(
                f": deleted endpoint {name}, endpoint config {name}, model {name} in {REGION}"
            ), last
            assert _sagemaker_left() == {"endpoints": [], "configs": [], "models": []}
            assert "DeleteEndpoint" in proxy.operations()
            owned = tmp_path / "cache" / "owned"
            assert not owned.exists() or not list(owned.iterdir())  # no ownership record left behind


@pytest.mark.anyio
@pytest.mark.parametrize("sig", SIGNALS)
async def test_mcp_server_signalled_during_a_deploy_rolls_back_and_exits(local_aws, tmp_path, sig):  # noqa: F811
    import anyio
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.shared.exceptions import MCPError

    with StallProxy(local_aws.endpoint_url) as proxy:
        env = _env(local_aws, proxy, tmp_path)
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "gemma4_t4.mcp_server"], env=env, cwd=str(REPO)
        )
        errlog = tmp_path / "server-stderr.log"
        answers: list = []
        with open(errlog, "w") as log:
            async with Client(stdio_client(params, errlog=log)) as client:

                async def deploy() -> None:
                    try:
                        answers.append(
                            await client.call_tool(
                                "deploy_endpoint",
                                {
                                    "name": "g4-mcp-signal",
                                    "instance_type": "ml.g4dn.xlarge",
                                    "wait": True,
                                    "confirm": True,
                                },
                            )
                        )
                    except MCPError as exc:  # the server may exit before its "cancelled" answer is read
                        answers.append(exc)

                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(deploy)
                    with anyio.fail_after(120):
                        while not _sagemaker_left()["endpoints"]:
                            await anyio.sleep(0.1)
                        while len(proxy.requests("DescribeEndpoint")) < 2:  # preflight, then the wait
                            await anyio.sleep(0.05)
                    server = _server_pid(tmp_path)
                    os.kill(server, sig)
                    with anyio.fail_after(120):
                        while _alive(server):
                            await anyio.sleep(0.1)
                    tasks.cancel_scope.cancel()  # the server is gone: its answer may never arrive
    assert all(isinstance(a, Exception) or a.is_error for a in answers), answers  # never a success
    assert _sagemaker_left() == {"endpoints": [], "configs": [], "models": []}
    assert "DeleteEndpoint" in proxy.operations()
    assert "Traceback" not in errlog.read_text()


def _server_pid(tmp_path: Path) -> int:
    """The MCP server's pid: the one child of this test process running gemma4_t4.mcp_server."""
    import psutil

    children = [
        p
        for p in psutil.Process().children(recursive=True)
        if "gemma4_t4.mcp_server" in " ".join(p.cmdline())
    ]
    assert len(children) == 1, children
    return children[0].pid


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _StallClock:
    """A fake clock whose sleep advances it; the interrupt lands when 15 s have been waited, the
    moment the wait's first poll interval ends."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.now >= 15.0:
            raise KeyboardInterrupt


def _last_bar(err: str) -> str:
    return [line for line in err.replace("\r", "\n").splitlines() if line.strip()][-1]


def test_an_interrupted_endpoint_wait_shows_the_time_waited(capsys):
    from gemma4_t4.sagemaker.deploy import wait_in_service

    class Creating:
        def describe_endpoint(self, EndpointName: str) -> dict:  # noqa: N803 - boto3's spelling
            return {"EndpointStatus": "Creating"}

    clock = _StallClock()
    with pytest.raises(KeyboardInterrupt):
        wait_in_service(Creating(), "g4", 1800, poll_s=15, sleep=clock.sleep, monotonic=clock.monotonic)
    assert "| 15/1800 s of the timeout" in _last_bar(capsys.readouterr().err)


def test_an_interrupted_build_wait_shows_the_time_waited_and_notes_the_stop(capsys):
    from gemma4_t4.sagemaker import build
    from gemma4_t4.sagemaker.aws import undone

    class Building:
        stopped: list[str] = []

        def batch_get_builds(self, ids: list[str]) -> dict:
            return {"builds": [{"id": ids[0], "buildStatus": "IN_PROGRESS", "currentPhase": "BUILD"}]}

        def stop_build(self, id: str) -> dict:  # noqa: A002 - boto3's spelling
            self.stopped.append(id)
            return {}

    clock = _StallClock()
    cb = Building()
    result = build.BuildResult(REGION, "uri", "tag", "IN_PROGRESS")
    with pytest.raises(KeyboardInterrupt) as info:
        build.wait_for_build(cb, "b:1", result, poll_s=15, sleep=clock.sleep, monotonic=clock.monotonic)
    assert _last_bar(capsys.readouterr().err).endswith("BUILD IN_PROGRESS 15 s")
    assert cb.stopped == ["b:1"] and result.status == "STOPPED"
    assert undone(info.value) == ["stopped CodeBuild build b:1"]
