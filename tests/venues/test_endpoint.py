"""The Endpoint: a local vLLM server (here the FAKE vLLM of conftest, which serves /health) or a
SageMaker endpoint (on moto) behind one context manager that stops or deletes what it owns, records
its ownership for the next command, and keeps billed endpoints inside a shared budget."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import psutil
import pytest
from fakes.aws_fixtures import local_aws, local_aws_session  # noqa: F401
from fakes.fake_openai_server import FakeScript, FakeServer, FakeServerState

from gemma4_t4.bench.registry import spec_for
from gemma4_t4.bench.specs import DecodeSpec, PrefixSpec, ServedAt, TTFTSpec, run
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.config import CONTAINER_MODEL_DIR, DeployConfig
from gemma4_t4.serving.server import VLLMServer
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.serving.server_state import free_port, pid_alive
from gemma4_t4.venues import endpoint as endpoints
from gemma4_t4.venues.endpoint import Budget, Endpoint, OwnershipRecord

REPO = Path(__file__).resolve().parents[2]
REGION = "us-east-2"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Ownership records of this test only."""
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _config(model_dir: Path, fake_vllm: Path, work: Path) -> ServerConfig:
    return ServerConfig(model=str(model_dir), target="cpu", port=free_port(), work_dir=str(work),
                        python=str(fake_vllm), extra_env={"FAKE_VLLM_MODE": "serve"}, probe_cpu_attention=False)


def _records(cache: Path) -> list[OwnershipRecord]:
    return [OwnershipRecord.model_validate_json(p.read_text()) for p in sorted((cache / "owned").glob("*.json"))]


# ---------------------------------------------------------------- specs: refused before anything starts


def test_a_spec_typo_or_wrong_type_is_refused_naming_the_field():
    with pytest.raises(Gemma4T4Error, match="'concurency'") as typo:
        DecodeSpec(concurency=[1])
    assert "concurrency" in typo.value.fix
    with pytest.raises(Gemma4T4Error, match="concurrency"):
        DecodeSpec(concurrency="eight")
    with pytest.raises(Gemma4T4Error, match="groups"):  # BenchArgs' own cross-field rule
        PrefixSpec(num_prompts=3, groups=4)
    with pytest.raises(Gemma4T4Error, match="unknown workload"):
        spec_for("decod")
    assert spec_for("ttft", input_lens=[32]) == TTFTSpec(input_lens=[32])


def test_run_takes_a_spec_on_anything_served(tmp_path):
    """``run(served, spec, out)`` on an OpenAI-compatible server (the FAKE one): a typed run comes back."""
    fake = FakeServer(free_port(), FakeServerState(default=FakeScript(ttft_s=0.01, gap_s=0.001))).start()
    try:
        served = ServedAt(fake.base_url, "fake-model")
        result = run(served, DecodeSpec(concurrency=[1, 2], input_len=16, output_len=4, num_prompts=2, warmup=0),
                     tmp_path / "decode", label="fake", progress=False)
        assert result.status == "complete" and set(result.per_stream_by_concurrency()) == {1, 2}
        assert result.run.config["label"] == "fake"
        with pytest.raises(Gemma4T4Error, match="workload spec"):
            run(served, {"workload": "decode"}, tmp_path / "x")
    finally:
        fake.stop()


# ---------------------------------------------------------------- local


def test_a_local_endpoint_stops_its_server_and_drops_its_record_when_the_block_ends(
    fake_vllm, model_dir, tmp_path, own_cache
):
    config = _config(model_dir, fake_vllm, tmp_path / "w")
    with Endpoint.local(config, quiet=True) as served:
        assert served.url == f"http://127.0.0.1:{config.port}" and served.venue == "local"
        assert served.exposes_metrics and served.cost_usd() == 0.0
        (record,) = _records(own_cache)
        assert (record.venue, record.port, record.owner_pid) == ("local", config.port, os.getpid())
        supervisor = served.server.pid
        assert pid_alive(supervisor)
    assert served.stopped and _records(own_cache) == []
    assert VLLMServer.attach(config.port, tmp_path / "w").status().state == "stopped"
    served.stop()  # safe to repeat


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_inside_the_block_stop_the_server_like_ctrl_c(fake_vllm, model_dir, tmp_path, sig):
    work, cache = tmp_path / "w", tmp_path / "cache"
    config = _config(model_dir, fake_vllm, work)
    script = (
        "import json, time\n"
        "from gemma4_t4.venues.endpoint import Endpoint\n"
        "from gemma4_t4.serving.server_config import ServerConfig\n"
        f"config = ServerConfig.model_validate_json({config.model_dump_json()!r})\n"
        "with Endpoint.local(config, quiet=True) as served:\n"
        "    print(json.dumps({'pid': served.server.pid}), flush=True)\n"
        "    time.sleep(300)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO), "GEMMA4_T4_CACHE_DIR": str(cache)})
    try:
        supervisor = json.loads(owner.stdout.readline())["pid"]
        owner.send_signal(sig)
        assert owner.wait(60) == -sig  # the signal is redelivered once the clean-up ran
        deadline = time.monotonic() + 20
        while pid_alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pid_alive(supervisor)
        assert VLLMServer.attach(config.port, work).status().state == "stopped"
        assert list((cache / "owned").glob("*.json")) == []
    finally:
        owner.kill()
        VLLMServer.attach(config.port, work).stop(grace=2)


def test_a_dead_owners_record_is_reaped_and_an_unreadable_one_is_kept(tmp_path, own_cache):
    gone = psutil.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folder = own_cache / "owned"
    folder.mkdir(parents=True)
    dead = OwnershipRecord(venue="local", name="gemma4", url="http://127.0.0.1:1", owner_pid=gone.pid,
                           owner_create_time=1.0, started_at=time.time(), work_dir=str(tmp_path / "none"), port=1)
    (folder / "local-gemma4-1.json").write_text(dead.model_dump_json())
    (folder / "local-broken.json").write_text("{not json")
    reaped = endpoints.reap_orphans()
    assert [(r.name, r.action) for r in reaped] == [("gemma4", "stopped")]
    assert sorted(p.name for p in folder.iterdir()) == ["local-broken.json"]


# ---------------------------------------------------------------- SageMaker (moto)


def _deploy_config(name: str, **more) -> DeployConfig:
    return DeployConfig(name=name, region=REGION, max_model_len=4096, ttl_hours=1.0, **more)


def _live(name: str) -> bool:
    names = [e["EndpointName"] for e in boto3.client("sagemaker", region_name=REGION).list_endpoints()["Endpoints"]]
    return name in names


def test_a_sagemaker_endpoint_is_deleted_when_its_block_ends_and_knows_its_cost(local_aws, own_cache):  # noqa: F811
    with Endpoint.sagemaker(_deploy_config("g4-ep-life"), poll_s=0.05, progress=False) as served:
        assert served.url == f"sagemaker://{REGION}/g4-ep-life" and served.venue == "sagemaker"
        assert _live("g4-ep-life") and served.usd_per_hour > 0 and served.gpu == "t4"
        # its venue: priced at its instance's rate, and never restarted (that would be another billed deploy)
        assert served.price is not None and served.price.key == "sagemaker:ml.g4dn.xlarge"
        assert served.price.usd_per_hour == served.usd_per_hour and not served.can_restart
        assert served.tokenizer == served_model_id() and not served.exposes_metrics
        (record,) = _records(own_cache)
        assert (record.venue, record.name, record.region) == ("sagemaker", "g4-ep-life", REGION)
        time.sleep(0.05)
        # its price times its time up so far, to the second's fraction (seconds up, not a rounded figure)
        low = served.usd_per_hour * (time.monotonic() - served.started) / 3600
        cost = served.cost_usd()
        high = served.usd_per_hour * (time.monotonic() - served.started) / 3600
        assert 0 < low <= cost <= high
    assert not _live("g4-ep-life") and _records(own_cache) == []


def served_model_id() -> str:
    return DeployConfig().model_id


def test_an_exception_in_the_block_still_deletes_the_endpoint(local_aws):  # noqa: F811
    with pytest.raises(RuntimeError, match="measuring broke"), Endpoint.sagemaker(
        _deploy_config("g4-ep-broken"), poll_s=0.05, progress=False
    ):
        raise RuntimeError("measuring broke")
    assert not _live("g4-ep-broken")


def test_the_budget_refuses_an_endpoint_that_does_not_fit_before_deploying_it(local_aws):  # noqa: F811
    budget = Budget(0.40)  # one T4 endpoint's estimate (~$0.31 for 25 min) fits, a second does not
    with Endpoint.sagemaker(_deploy_config("g4-ep-one"), budget=budget, poll_s=0.05, progress=False):
        with pytest.raises(Gemma4T4Error, match="budget") as refused:
            Endpoint.sagemaker(_deploy_config("g4-ep-two"), budget=budget, poll_s=0.05, progress=False)
        assert "raise the budget" in refused.value.fix
        assert not _live("g4-ep-two")
    assert budget.spent_usd <= budget.usd and budget.left_usd == pytest.approx(budget.usd - budget.spent_usd)
    with pytest.raises(Gemma4T4Error, match="positive"):
        Budget(float("nan"))


def test_the_budget_running_out_deletes_the_live_endpoint(local_aws):  # noqa: F811
    budget = Budget(0.35)
    served = Endpoint.sagemaker(_deploy_config("g4-ep-spent"), budget=budget, poll_s=0.05, progress=False,
                                watch_s=0.05)
    served.usd_per_hour = 1e6  # the clock would take minutes to spend $0.35 at the real rate
    deadline = time.monotonic() + 10
    while not served.stopped and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.stopped and "budget" in served.stopped_reason and not _live("g4-ep-spent")


def test_a_name_owned_by_a_live_process_is_refused_before_deploying(local_aws, own_cache):  # noqa: F811
    other = psutil.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        folder = own_cache / "owned"
        folder.mkdir(parents=True)
        held = OwnershipRecord(venue="sagemaker", name="g4-ep-held", url=f"sagemaker://{REGION}/g4-ep-held",
                               owner_pid=other.pid, owner_create_time=other.create_time(), started_at=time.time(),
                               region=REGION)
        (folder / "sagemaker-g4-ep-held.json").write_text(held.model_dump_json())
        with pytest.raises(Gemma4T4Error, match=f"owned by process {other.pid}"):
            Endpoint.sagemaker(_deploy_config("g4-ep-held"), poll_s=0.05, progress=False)
        assert not _live("g4-ep-held")
    finally:
        other.kill()


def test_an_endpoint_a_killed_owner_left_is_deleted_by_the_next_one(local_aws, own_cache):  # noqa: F811
    """kill -9 of the owner runs no clean-up: its record names the endpoint, and the next Endpoint
    (here: the next deploy) finds the owner gone and deletes it."""
    from gemma4_t4.sagemaker.deploy import deploy

    deploy(_deploy_config("g4-ep-orphan"), poll_s=0.05, progress=False)
    gone = psutil.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folder = own_cache / "owned"
    folder.mkdir(parents=True)
    orphan = OwnershipRecord(venue="sagemaker", name="g4-ep-orphan", url=f"sagemaker://{REGION}/g4-ep-orphan",
                             owner_pid=gone.pid, owner_create_time=1.0, started_at=time.time(), region=REGION)
    (folder / "sagemaker-g4-ep-orphan.json").write_text(orphan.model_dump_json())
    assert _live("g4-ep-orphan")
    with Endpoint.sagemaker(_deploy_config("g4-ep-next"), poll_s=0.05, progress=False):
        assert not _live("g4-ep-orphan")
        assert [r.name for r in _records(own_cache)] == ["g4-ep-next"]


def test_the_record_names_the_endpoint_by_its_creation_time(local_aws, own_cache):  # noqa: F811
    with Endpoint.sagemaker(_deploy_config("g4-ep-when"), poll_s=0.05, progress=False):
        (record,) = _records(own_cache)
        created = _sm().describe_endpoint(EndpointName="g4-ep-when")["CreationTime"].timestamp()
        assert record.endpoint_created_at == pytest.approx(created)


@pytest.mark.parametrize("recorded", ["another creation time", "none, the owner died mid-deploy"])
def test_the_reaper_leaves_an_endpoint_deployed_under_a_dead_owners_name_by_someone_else(
    local_aws, own_cache, recorded  # noqa: F811
):
    """The owner died; later someone deployed an endpoint of the same name by hand. The record's
    CreationTime (or, without one, its start) says that endpoint is not the dead owner's."""
    from gemma4_t4.sagemaker.deploy import deploy

    deploy(_deploy_config("g4-ep-reused"), poll_s=0.05, progress=False)
    created = _sm().describe_endpoint(EndpointName="g4-ep-reused")["CreationTime"].timestamp()
    gone = psutil.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folder = own_cache / "owned"
    folder.mkdir(parents=True)
    if recorded == "another creation time":  # the owner's endpoint was created an hour earlier
        more = {"started_at": created - 3700, "endpoint_created_at": created - 3600}
    else:  # the owner's record was written an hour after this endpoint was created
        more = {"started_at": created + 3600}
    orphan = OwnershipRecord(venue="sagemaker", name="g4-ep-reused", url=f"sagemaker://{REGION}/g4-ep-reused",
                             owner_pid=gone.pid, owner_create_time=1.0, region=REGION, **more)
    (folder / "sagemaker-g4-ep-reused.json").write_text(orphan.model_dump_json())
    (reaped,) = endpoints.reap_orphans()
    assert reaped.action.startswith("left alone"), reaped.action
    assert _chain_exists("g4-ep-reused")
    assert _records(own_cache) == []  # the record is settled: nothing of it is left to reap


# ---------------------------------------------------------------- a refusal touches nothing of another owner's


def _sm():
    return boto3.client("sagemaker", region_name=REGION)


def _chain_exists(name: str) -> bool:
    """The endpoint, its config and its model are all there."""
    sm = _sm()
    return (
        _live(name)
        and name in [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]]
        and name in [m["ModelName"] for m in sm.list_models()["Models"]]
    )


def test_a_second_owner_refused_leaves_the_first_owners_endpoint_alone(local_aws, own_cache):  # noqa: F811
    """Two kernels run the same notebook part (one fixed endpoint name): the second is refused, and on
    its way out it must not delete the first one's endpoint, config, model or ownership record."""
    script = (
        "import json, time\n"
        "from gemma4_t4.venues.endpoint import Endpoint\n"
        "from gemma4_t4.sagemaker.config import DeployConfig\n"
        f"config = DeployConfig(name='g4-shared', region={REGION!r}, max_model_len=4096, ttl_hours=1.0)\n"
        "with Endpoint.sagemaker(config, poll_s=0.05, progress=False) as served:\n"
        "    print(json.dumps({'url': served.url}), flush=True)\n"
        "    time.sleep(300)\n"
    )
    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO), "GEMMA4_T4_CACHE_DIR": str(own_cache)})
    try:
        assert json.loads(first.stdout.readline())["url"] == f"sagemaker://{REGION}/g4-shared"
        (held,) = _records(own_cache)
        assert held.owner_pid == first.pid and _chain_exists("g4-shared")
        with pytest.raises(Gemma4T4Error, match=f"owned by process {first.pid}"):
            Endpoint.sagemaker(_deploy_config("g4-shared"), poll_s=0.05, progress=False)
        assert _chain_exists("g4-shared"), "the refused second owner deleted the first one's endpoint"
        assert _records(own_cache) == [held]
        first.send_signal(signal.SIGTERM)  # the first owner's own clean-up still deletes it
        assert first.wait(60) == -signal.SIGTERM
        assert not _live("g4-shared") and _records(own_cache) == []
    finally:
        first.kill()


def test_a_deploy_refused_because_the_name_exists_deletes_nothing(local_aws, own_cache):  # noqa: F811
    """An endpoint of that name deployed without an Endpoint (`sagemaker deploy`, another machine) is
    not recorded; deploy refuses to overwrite it, and that refusal must not delete it either."""
    from gemma4_t4.sagemaker.deploy import deploy

    deploy(_deploy_config("g4-ep-theirs"), poll_s=0.05, progress=False)
    with pytest.raises(Gemma4T4Error, match="already exists"):
        Endpoint.sagemaker(_deploy_config("g4-ep-theirs"), poll_s=0.05, progress=False)
    assert _chain_exists("g4-ep-theirs") and _records(own_cache) == []


def test_a_second_endpoint_of_a_name_in_this_process_is_refused_and_keeps_the_first(local_aws, own_cache):  # noqa: F811
    with Endpoint.sagemaker(_deploy_config("g4-ep-twice"), poll_s=0.05, progress=False) as served:
        (held,) = _records(own_cache)
        with pytest.raises(Gemma4T4Error, match="another Endpoint of this process"):
            Endpoint.sagemaker(_deploy_config("g4-ep-twice"), poll_s=0.05, progress=False)
        assert _chain_exists("g4-ep-twice") and _records(own_cache) == [held] and not served.stopped
    assert not _live("g4-ep-twice") and _records(own_cache) == []


def test_a_local_endpoint_refused_as_owned_starts_and_stops_nothing(fake_vllm, model_dir, tmp_path, own_cache):
    other = psutil.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        config = _config(model_dir, fake_vllm, tmp_path / "w")
        folder = own_cache / "owned"
        folder.mkdir(parents=True)
        held = OwnershipRecord(venue="local", name=config.resolved_name(), url=f"http://127.0.0.1:{config.port}",
                               owner_pid=other.pid, owner_create_time=other.create_time(), started_at=time.time(),
                               work_dir=config.work_dir, port=config.port)
        path = folder / f"local-{config.resolved_name()}-{config.port}.json"
        path.write_text(held.model_dump_json())
        with pytest.raises(Gemma4T4Error, match=f"owned by process {other.pid}"):
            Endpoint.local(config, quiet=True)
        assert not (tmp_path / "w" / "servers").exists(), "a refused owner started (and stopped) a server"
        assert _records(own_cache) == [held]
    finally:
        other.kill()


# ---------------------------------------------------------------- the reaper stops only what its owner started


def test_the_reaper_leaves_a_server_started_later_on_the_dead_owners_port_and_work_dir(
    fake_vllm, model_dir, tmp_path, own_cache
):
    """A killed owner's record names a port and work dir; a server started there by hand afterwards is
    not the owner's (its supervisor is another process) and must keep running."""
    work = tmp_path / "w"
    config = _config(model_dir, fake_vllm, work)
    script = (
        "import json, time\n"
        "from gemma4_t4.venues.endpoint import Endpoint\n"
        "from gemma4_t4.serving.server_config import ServerConfig\n"
        f"config = ServerConfig.model_validate_json({config.model_dump_json()!r})\n"
        "served = Endpoint.local(config, quiet=True)\n"
        "print(json.dumps({'pid': served.server.pid}), flush=True)\n"
        "time.sleep(300)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO), "GEMMA4_T4_CACHE_DIR": str(own_cache)})
    manual = None
    try:
        supervisor = json.loads(owner.stdout.readline())["pid"]
        (record,) = _records(own_cache)
        assert record.server_pid == supervisor and record.server_create_time
        owner.kill()  # SIGKILL: its record stays behind; its supervisor stops the server
        owner.wait(10)
        deadline = time.monotonic() + 30
        while pid_alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pid_alive(supervisor)
        manual = VLLMServer(config)  # `serve start` by hand, same port and work dir
        manual.start(timeout=20)
        (reaped,) = endpoints.reap_orphans()
        assert reaped.action.startswith("left alone") and str(manual.pid) in reaped.action
        assert manual.status().state == "running" and manual.healthy()
        assert _records(own_cache) == []  # the dead owner's record is dropped
    finally:
        owner.kill()
        if manual is not None:
            manual.stop(grace=2)


def test_an_unpriced_instance_is_refused_in_the_same_words_by_an_endpoint_and_the_matrix():
    from gemma4_t4.studies.matrix import configs_plan

    config = DeployConfig(instance_type="ml.g5.xlarge")
    refusals = []
    for refuse in (lambda: endpoints.hourly_rate(config), lambda: configs_plan([config])):
        with pytest.raises(Gemma4T4Error) as refused:
            refuse()
        refusals.append((refused.value.message, refused.value.fix))
    assert refusals == [("no price for ml.g5.xlarge: a budget cannot be enforced",
                         "use an instance type listed in gemma4_t4.catalog.hardware.PRICES")] * 2


def test_a_local_build_under_a_path_with_a_space_is_uploaded_and_served_under_its_folder_name(
    local_aws, tiny_model_dir, tmp_path  # noqa: F811
):
    """Part 3 on SageMaker: the repacked folder's path (here with a space, as a learner's working folder may
    have) is no model id; the endpoint serves the upload under the folder's name."""
    import shutil

    from gemma4_t4.venues import parts

    folder = tmp_path / "My Work" / "build-qat"
    shutil.copytree(tiny_model_dir, folder)
    with parts.sagemaker_endpoint(folder, name="gemma4-qat", part=3, region=REGION, budget=None, gpu="t4",
                                  max_num_seqs=8, max_model_len=4096, poll_s=0.05) as served:
        assert served.tokenizer == str(folder) and _live(served.name)
        model = boto3.client("sagemaker", region_name=REGION).describe_model(ModelName=served.name)
        container = model["PrimaryContainer"]
        assert container["Environment"]["SM_VLLM_MODEL"] == CONTAINER_MODEL_DIR  # the uploaded copy
        assert container["ModelDataSource"]["S3DataSource"]["S3Uri"].startswith("s3://")
    assert not _live(served.name)


def test_an_ownership_record_that_cannot_be_written_leaves_the_endpoint_unchanged(own_cache, monkeypatch):
    """_own refuses having changed nothing: a full disk at the record's write leaves no half-owned Endpoint."""
    def full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(endpoints, "atomic_write_text", full)
    served = Endpoint("local", "m", "http://127.0.0.1:1", "m")
    with pytest.raises(OSError, match="No space"):
        served._own(port=1)
    assert served._record is None and served._owned is None and _records(own_cache) == []
