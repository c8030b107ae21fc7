"""Past one endpoint on moto: a local model folder uploaded to S3 (checksummed, multipart,
resumable, never twice) and served as uncompressed model data; Application Auto Scaling
registered on deploy and removed on delete; tensor parallelism from the fit calculator on
multi-T4 hosts; the matrix run's cost estimate and hard budget stop."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from pathlib import Path

import boto3
import pytest
from fakes.aws_fixtures import local_aws, local_aws_session  # noqa: F401 - fixtures

from gemma4_t4.bench.specs import DecodeSpec
from gemma4_t4.cli import main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker import DeployConfig, delete_endpoint, deploy, invoke
from gemma4_t4.sagemaker.config import auto_tensor_parallel
from gemma4_t4.sagemaker.upload import MIN_PART_SIZE, scan_folder, upload_model_folder
from gemma4_t4.studies.matrix import EndpointHandling, configs_plan, matrix_configs, run_configs
from gemma4_t4.venues.parts import endpoint_name

REGION = "us-east-2"


def _model_dir(tmp_path: Path, big: int = 11 * 1024 * 1024) -> Path:
    folder = tmp_path / "tiny-emb4"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gemma4"}')
    (folder / "model.safetensors").write_bytes(os.urandom(big))
    (folder / ".DST.partial-1").write_text("left over by a killed run")  # never uploaded
    return folder


def _objects(bucket: str) -> dict[str, int]:
    s3 = boto3.client("s3", region_name=REGION)
    return {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}


# -- S3 upload -----------------------------------------------------------------------------------------
def test_upload_is_checksummed_multipart_and_never_repeated(local_aws, tmp_path):  # noqa: F811
    folder = _model_dir(tmp_path)
    first = upload_model_folder(folder, REGION, part_size=MIN_PART_SIZE, progress=False)
    assert first.s3_uri.startswith("s3://gemma4-t4-models-123456789012-us-east-2/models/tiny-emb4-")
    assert [(f.name, f.status) for f in first.files] == [
        ("config.json", "uploaded"),
        ("model.safetensors", "uploaded"),
    ]
    assert first.files[1].parts == 3 and first.bytes_uploaded == first.total_bytes
    keys = _objects(first.bucket)
    assert keys == {first.prefix + "config.json": 24, first.prefix + "model.safetensors": 11 * 1024 * 1024}
    s3 = boto3.client("s3", region_name=REGION)
    body = s3.get_object(Bucket=first.bucket, Key=first.prefix + "model.safetensors")["Body"].read()
    assert body == (folder / "model.safetensors").read_bytes()
    head = s3.head_object(Bucket=first.bucket, Key=first.prefix + "model.safetensors")
    assert head["Metadata"]["sha256"] == hashlib.sha256(body).hexdigest()

    second = upload_model_folder(folder, REGION, part_size=MIN_PART_SIZE, progress=False)
    assert second.s3_uri == first.s3_uri and second.bytes_uploaded == 0
    assert {f.status for f in second.files} == {"skipped"}

    (folder / "config.json").write_text('{"model_type": "gemma4", "changed": 1}')
    third = upload_model_folder(folder, REGION, part_size=MIN_PART_SIZE, progress=False)
    assert third.prefix != first.prefix  # content-addressed: a changed build never overwrites the old one


def test_interrupted_multipart_upload_resumes(local_aws, tmp_path):  # noqa: F811
    folder = _model_dir(tmp_path)
    files = scan_folder(folder)
    from gemma4_t4.sagemaker.upload import default_prefix, ensure_bucket

    s3 = boto3.client("s3", region_name=REGION)
    bucket, prefix = "resume-bucket", default_prefix(folder, files)
    ensure_bucket(s3, bucket, REGION)
    key = prefix + "model.safetensors"
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata={"sha256": files[1].sha256})
    part1 = (folder / "model.safetensors").read_bytes()[:MIN_PART_SIZE]
    s3.upload_part(
        Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=part1
    )  # then "killed"

    result = upload_model_folder(folder, REGION, bucket=bucket, part_size=MIN_PART_SIZE, progress=False)
    big = result.files[1]
    assert big.status == "resumed" and big.parts == 3
    assert result.bytes_uploaded == result.total_bytes - MIN_PART_SIZE  # part 1 was not sent again
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert body == (folder / "model.safetensors").read_bytes()
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_bad_model_folders_are_refused(tmp_path):
    with pytest.raises(Gemma4T4Error, match="does not exist"):
        scan_folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(Gemma4T4Error, match="no config.json"):
        scan_folder(tmp_path / "empty")
    with pytest.raises(Gemma4T4Error, match="5 MiB"):
        upload_model_folder(tmp_path, REGION, part_size=1024)


def test_deploy_model_dir_serves_uncompressed_s3_data(local_aws, tmp_path, capsys):  # noqa: F811
    folder = _model_dir(tmp_path, big=1024)
    assert main(["sagemaker", "deploy", "--name", "g4-repack", "--model-dir", str(folder), "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "aws s3 cp" in dry and "--checksum-algorithm SHA256" in dry and ".DST.partial" not in dry
    assert not [b for b in boto3.client("s3", region_name=REGION).list_buckets()["Buckets"]]  # dry: nothing

    assert main(["sagemaker", "deploy", "--name", "g4-repack", "--model-dir", str(folder), "--json"]) == 0
    capsys.readouterr()
    container = boto3.client("sagemaker", region_name=REGION).describe_model(ModelName="g4-repack")[
        "PrimaryContainer"
    ]
    source = container["ModelDataSource"]["S3DataSource"]
    assert source["S3DataType"] == "S3Prefix" and source["CompressionType"] == "None"
    assert source["S3Uri"].startswith("s3://gemma4-t4-models-123456789012-us-east-2/models/tiny-emb4-")
    assert container["Environment"]["SM_VLLM_MODEL"] == "/opt/ml/model"
    assert sorted(k.rsplit("/", 1)[-1] for k in _objects(source["S3Uri"].split("/")[2])) == [
        "config.json",
        "model.safetensors",
    ]


# -- autoscaling ----------------------------------------------------------------------------------------
def _targets() -> list[dict]:
    aas = boto3.client("application-autoscaling", region_name=REGION)
    return aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]


def test_autoscaling_registered_on_deploy_and_removed_on_delete(local_aws):  # noqa: F811
    config = DeployConfig(name="g4-scale", min_instances=1, max_instances=3, scaling_target=5.0)
    result = deploy(config, progress=False, poll_s=0)
    assert result.usd_per_hour == pytest.approx(3 * 0.736)  # the estimate is at the maximum
    assert result.created[0] == "autoscaling:endpoint/g4-scale/variant/AllTraffic"
    [target] = _targets()
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 3)
    assert target["ScalableDimension"] == "sagemaker:variant:DesiredInstanceCount"
    aas = boto3.client("application-autoscaling", region_name=REGION)
    [policy] = aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == 5.0 and tracking["ScaleInCooldown"] == 600
    assert (
        tracking["PredefinedMetricSpecification"]["PredefinedMetricType"]
        == "SageMakerVariantInvocationsPerInstance"
    )

    deleted = delete_endpoint("g4-scale", REGION)
    assert deleted.deleted[0] == "autoscaling:endpoint/g4-scale/variant/AllTraffic"
    assert _targets() == []
    again = delete_endpoint("g4-scale", REGION)  # idempotent
    assert again.deleted == []


def test_bad_scaling_ranges_are_refused():
    for low, high in ((0, 2), (3, 2), (1, 50)):
        with pytest.raises(Gemma4T4Error, match="_instances"):
            DeployConfig(min_instances=low, max_instances=high)


# -- tensor parallelism on multi-T4 hosts -----------------------------------------------------------------
def test_tensor_parallel_from_the_fit_calculator():
    assert auto_tensor_parallel("google/gemma-4-E2B-it", "ml.g4dn.12xlarge") == 1
    assert auto_tensor_parallel("google/gemma-4-26B-A4B-it", "ml.g4dn.12xlarge") > 1
    assert auto_tensor_parallel("google/gemma-4-31B-it", "ml.g4dn.12xlarge") == 4
    assert auto_tensor_parallel("google/gemma-4-31B-it", "ml.g4dn.xlarge") == 1  # one GPU: nothing to split
    assert auto_tensor_parallel("/opt/ml/model", "ml.g4dn.12xlarge") == 1  # unknown model: no guess
    env = DeployConfig(
        model_id="google/gemma-4-31B-it", instance_type="ml.g4dn.12xlarge", tensor_parallel_size=0
    ).container_env()
    assert env["SM_VLLM_TENSOR_PARALLEL_SIZE"] == "4"
    assert "SM_VLLM_TENSOR_PARALLEL_SIZE" not in DeployConfig(tensor_parallel_size=0).container_env()


# -- the matrix run -------------------------------------------------------------------------------------------
MODELS = ["google/gemma-4-E2B-it", "google/gemma-4-E4B-it"]


def test_matrix_plan_estimates_each_model():
    plan = configs_plan(matrix_configs(MODELS, DeployConfig()))
    assert [e.endpoint for e in plan.entries] == ["g4-matrix-gemma-4-e2b-it", "g4-matrix-gemma-4-e4b-it"]
    assert plan.entries[0].estimate_usd == pytest.approx(0.736 * 25 / 60, abs=1e-3)
    assert endpoint_name("g4", "x" * 100).__len__() <= 63


SPECS = {"decode": DecodeSpec(concurrency=[1], input_len=32, output_len=8)}


def test_matrix_deploys_measures_and_deletes_each_in_turn(local_aws, tmp_path):  # noqa: F811
    seen: list[tuple[str, list[str]]] = []

    def measure(endpoint, entry_dir):
        sm = boto3.client("sagemaker", region_name=REGION)
        seen.append((endpoint.name, [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]]))
        local_aws.queue_chat_replies([f"reply from {endpoint.served_name}"])
        return invoke(endpoint.name, REGION, f"hello {endpoint.served_name}").text

    result = run_configs(
        matrix_configs(MODELS, DeployConfig()), SPECS, budget=5.0, out_dir=tmp_path, measure=measure,
        how=EndpointHandling(poll_s=0, progress=False),
    )  # fmt: skip
    assert [e.status for e in result.entries] == ["measured", "measured"]
    assert seen == [
        ("g4-matrix-gemma-4-e2b-it", ["g4-matrix-gemma-4-e2b-it"]),  # one endpoint at a time
        ("g4-matrix-gemma-4-e4b-it", ["g4-matrix-gemma-4-e4b-it"]),
    ]
    assert [e.result for e in result.entries] == [f"reply from {m.rsplit('/', 1)[-1]}" for m in MODELS]
    assert [e.out_dir for e in result.entries] == [str(tmp_path / e.endpoint) for e in result.entries]
    assert boto3.client("sagemaker", region_name=REGION).list_endpoints()["Endpoints"] == []
    assert len(result.deleted) == 6  # endpoint, config and model of each


def _recording_client(operations: list[str]):
    """A real boto3 client to moto that records each SageMaker operation it is asked to call."""
    sm = boto3.client("sagemaker", region_name=REGION)
    sm.meta.events.register("before-call.sagemaker.*", lambda model, **_: operations.append(model.name))
    return sm


def test_matrix_budget_stops_before_and_during(local_aws, tmp_path):  # noqa: F811
    operations: list[str] = []
    none = run_configs(
        matrix_configs(MODELS, DeployConfig()), SPECS, budget=0.05, out_dir=tmp_path,
        measure=lambda endpoint, entry_dir: None,
        how=EndpointHandling(client=_recording_client(operations), progress=False),
    )  # fmt: skip
    assert [e.status for e in none.entries] == ["skipped: budget", "skipped: budget"]
    assert "would cost" in none.stopped_reason and none.spent_usd == 0
    assert "CreateEndpoint" not in operations and "CreateModel" not in operations

    def measure(endpoint, entry_dir):
        endpoint.started -= 3600.0  # up for an hour already: far past the budget
        import time

        for _ in range(200):  # the budget's watch deletes the endpoint under the benchmark
            if not boto3.client("sagemaker", region_name=REGION).list_endpoints()["Endpoints"]:
                raise RuntimeError("endpoint vanished")
            time.sleep(0.05)
        return "finished"

    result = run_configs(
        matrix_configs(MODELS, DeployConfig()), SPECS, budget=0.5, out_dir=tmp_path, measure=measure,
        how=EndpointHandling(poll_s=0, watch_s=0.05, progress=False),
    )  # fmt: skip
    assert result.entries[0].status == "stopped: budget" and "endpoint vanished" in result.entries[0].error
    assert result.entries[0].cost_usd >= 0.5
    assert result.entries[1].status == "skipped: budget"
    assert "budget $0.50 spent" in result.stopped_reason
    assert boto3.client("sagemaker", region_name=REGION).list_endpoints()["Endpoints"] == []


def test_the_budget_refuses_the_second_endpoint_before_deploying_it(local_aws, tmp_path):  # noqa: F811
    """A T4 (~$0.31 for 25 min) fits $0.40; the L4 after it (~$0.47) does not: it is never created."""
    from gemma4_t4.venues.endpoint import Budget

    model = "google/gemma-4-E2B-it"
    configs = [
        DeployConfig(region=REGION, model_id=model, instance_type=instance, name=endpoint_name(f"g4-p4-{gpu}", model))
        for gpu, instance in (("t4", "ml.g4dn.xlarge"), ("l4", "ml.g6.xlarge"))
    ]
    operations: list[str] = []
    budget = Budget(0.40)
    result = run_configs(
        configs, SPECS, budget=budget, out_dir=tmp_path, measure=lambda endpoint, entry_dir: endpoint.name,
        how=EndpointHandling(client=_recording_client(operations), poll_s=0, progress=False),
    )  # fmt: skip
    t4, l4 = result.entries
    assert (t4.status, l4.status) == ("measured", "skipped: budget")
    assert "g4-p4-l4-gemma-4-e2b-it would cost ~$0.47" in result.stopped_reason
    assert operations.count("CreateEndpoint") == 1 and operations.count("CreateModel") == 1
    assert budget.spent_usd == t4.cost_usd and l4.cost_usd == 0
    assert boto3.client("sagemaker", region_name=REGION).list_endpoints()["Endpoints"] == []


@pytest.mark.parametrize(
    "specs,named",
    [
        ({}, "no workload to measure"),
        ({"decode": {"concurency": [1]}}, "specs['decode'] is a dict, not a workload spec"),
        ({"decode": "decode"}, "specs['decode'] is a str"),
        ({"../up": DecodeSpec()}, "'../up' is not a plain folder name"),
    ],
)
def test_a_spec_mistake_is_refused_before_anything_is_created(local_aws, tmp_path, specs, named):  # noqa: F811
    operations: list[str] = []
    config = DeployConfig(region=REGION, model_id="google/gemma-4-E2B-it", name="g4-p2-bf16-e2b")
    with pytest.raises(Gemma4T4Error, match=re.escape(named)):
        run_configs([config], specs, budget=5.0, out_dir=tmp_path,
                    how=EndpointHandling(client=_recording_client(operations)))  # fmt: skip
    assert operations == []  # not even a lookup, let alone CreateEndpoint
    assert boto3.client("s3", region_name=REGION).list_buckets()["Buckets"] == []  # nothing uploaded


@pytest.mark.parametrize(
    "settings,named",
    [
        ({"poll_s": -1}, "poll_s -1 must be a number of seconds, 0 or more"),
        ({"poll_s": float("nan")}, "poll_s nan must be"),
        ({"watch_s": 0}, "watch_s 0 must be a number of seconds, more than 0"),
        ({"watch_s": "5"}, "watch_s '5' must be"),
        ({"request_timeout_s": float("inf")}, "request_timeout_s inf must be"),
        ({"request_timeout_s": True}, "request_timeout_s True must be"),
    ],
)
def test_a_wrong_endpoint_handling_is_refused_when_it_is_built(settings, named):
    with pytest.raises(Gemma4T4Error, match=re.escape(named)) as err:
        EndpointHandling(**settings)
    assert err.value.fix.startswith("e.g. ")


def test_endpoint_handling_is_one_frozen_value_shared_by_every_run():
    fast = EndpointHandling(poll_s=0, watch_s=0.05, request_timeout_s=None)
    assert (fast.poll_s, fast.watch_s, fast.request_timeout_s, fast.progress) == (0, 0.05, None, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.poll_s = 1  # type: ignore[misc]
    default = EndpointHandling()
    assert (default.poll_s, default.watch_s, default.request_timeout_s) == (15.0, 5.0, 600.0)
    assert (default.client, default.progress, default.overwrite) == (None, True, False)


def test_a_misspelt_spec_field_is_refused_when_the_spec_is_built():
    with pytest.raises(Gemma4T4Error, match="DecodeSpec has no field 'concurency'") as err:
        DecodeSpec(concurency=[1])
    assert "concurrency" in err.value.fix


def test_an_orphaned_endpoint_is_deleted_by_the_next_owner(local_aws, tmp_path, monkeypatch):  # noqa: F811
    """A process killed outright leaves its endpoint and ownership record; the next
    Endpoint.sagemaker sees the owner is gone and deletes the endpoint before deploying its own."""
    import subprocess
    import sys

    from gemma4_t4.venues.endpoint import Endpoint, OwnershipRecord, owned_dir, owned_records

    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))
    orphan = DeployConfig(name="g4-orphan", region=REGION)
    deploy(orphan, progress=False, poll_s=0)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is now a process that no longer runs
    owned_dir().mkdir(parents=True)
    (owned_dir() / "sagemaker-g4-orphan.json").write_text(
        OwnershipRecord(
            venue="sagemaker", name="g4-orphan", url=f"sagemaker://{REGION}/g4-orphan", owner_pid=dead.pid,
            owner_create_time=1.0, started_at=1.0, region=REGION,
        ).model_dump_json()
    )  # fmt: skip
    sm = boto3.client("sagemaker", region_name=REGION)
    assert [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]] == ["g4-orphan"]

    with Endpoint.sagemaker(
        DeployConfig(name="g4-next", region=REGION), poll_s=0, progress=False
    ) as endpoint:
        assert [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]] == ["g4-next"]
        assert [r.name for _, r in owned_records()] == ["g4-next"]  # the orphan's record is gone
    assert endpoint.stopped and sm.list_endpoints()["Endpoints"] == []
    assert owned_records() == []


def test_a_matrix_interrupted_while_measuring_notes_the_endpoint_it_deleted(local_aws, tmp_path, monkeypatch):  # noqa: F811
    """Ctrl-C (or SIGTERM/SIGHUP through gemma4_t4.foundation.signals) during a measurement: the endpoint is
    deleted and the interrupt carries what was deleted, for the command's last line."""
    from gemma4_t4.sagemaker.aws import undone

    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))  # its own ownership records

    def measure(endpoint, entry_dir):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as info:
        run_configs(
            matrix_configs(MODELS[:1], DeployConfig()), SPECS, budget=5.0, out_dir=tmp_path, measure=measure,
            how=EndpointHandling(poll_s=0, progress=False),
        )  # fmt: skip
    name = "g4-matrix-gemma-4-e2b-it"
    assert undone(info.value) == [f"deleted endpoint {name}, endpoint config {name}, model {name} in {REGION}"]
    assert boto3.client("sagemaker", region_name=REGION).list_endpoints()["Endpoints"] == []
    owned = tmp_path / "cache" / "owned"
    assert not owned.exists() or not list(owned.rglob("*.json")), list(owned.rglob("*"))
