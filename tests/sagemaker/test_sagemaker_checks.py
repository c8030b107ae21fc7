"""The smaller missing checks, each with its message: a failed build with no log tail says where
the log is; links in --model-dir; the matrix dry run warns over budget; --scaling-target alone,
an unknown --failover region and --model-data that does not exist are refused; reap treats an
unreadable expiry as expired; an interrupted multipart upload says how to resume or abort it; the
MCP tools' typed parameters refuse "yes" as a confirmation, privileged ports and negative lengths."""

from __future__ import annotations

import datetime as dt
import json
import os
import re

import boto3
import pytest
from fakes.aws_fixtures import local_aws, local_aws_session  # noqa: F401 - fixtures

from gemma4_t4.cli import main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker import DeployConfig, deploy
from gemma4_t4.sagemaker.build import BuildFailed, BuildResult
from gemma4_t4.sagemaker.config import EXPIRES_TAG, PROJECT_TAG, PROJECT_VALUE
from gemma4_t4.sagemaker.reaper import reap
from gemma4_t4.sagemaker.upload import MIN_PART_SIZE, scan_folder, upload_model_folder

REGION = "us-east-2"


def _run(capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["sagemaker", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_failed_build_without_a_log_tail_says_where_the_log_is():
    failed = BuildFailed(
        BuildResult(REGION, "img", "tag", "FAILED", build_id="gemma4-t4-image:abc", phase="BUILD"),
        "CodeBuild status FAILED",
    )
    assert "read the log tail above" not in failed.fix
    assert f"aws codebuild batch-get-builds --region {REGION} --ids gemma4-t4-image:abc" in failed.fix
    assert "no log tail" in failed.message
    with_tail = BuildResult(REGION, "img", "tag", "FAILED", build_id="b", log_tail=["E: pip failed"])
    assert "read the log tail above" in BuildFailed(with_tail, "x").fix


def test_links_out_of_the_model_folder_or_to_hidden_files_are_refused_by_name(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "weights.safetensors").write_bytes(b"x" * 10)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / ".env").write_text("HF_TOKEN=hf_secret")
    (model / "shards").symlink_to(outside, target_is_directory=True)  # rglob alone skips it silently
    (model / "notes.txt").symlink_to(model / ".env")
    with pytest.raises(Gemma4T4Error) as info:
        scan_folder(model)
    assert "shards -> " in info.value.message and "(outside the folder)" in info.value.message
    assert "notes.txt -> " in info.value.message and "hidden file" in info.value.message
    assert "cp -L" in info.value.fix
    (model / "shards").unlink()
    (model / "notes.txt").unlink()
    (model / "alias.json").symlink_to(model / "config.json")  # a link inside the folder is fine
    assert [f.name for f in scan_folder(model)] == ["alias.json", "config.json"]


def test_matrix_dry_run_warns_when_the_estimate_exceeds_the_budget(capsys):
    models = "google/gemma-4-E2B-it,google/gemma-4-E4B-it"
    code, text = _run(capsys, "matrix", "--models", models, "--budget-usd", "0.5", "--dry-run", "--json")
    warning = json.loads(text)["warning"]
    assert code == 0 and "exceeds the budget $0.50" in warning and "only the first 1 of 2" in warning
    code, text = _run(capsys, "matrix", "--models", models, "--budget-usd", "50", "--dry-run", "--json")
    assert json.loads(text)["warning"] is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--scaling-target", "8"], "--scaling-target applies only to an autoscaled endpoint"),
        (["--failover", "us-east-2,mars-1"], "unknown or unsupported AWS region 'mars-1'"),
    ],
    ids=["scaling-target-alone", "failover-typo"],
)
def test_deploy_dry_run_refuses_what_the_real_run_would_ignore_or_fail(capsys, argv, message):
    code, text = _run(capsys, "deploy", "--dry-run", *argv)
    assert code == 2 and message in text
    assert _run(capsys, "deploy", "--dry-run", "--scaling-target", "8", "--max-instances", "2")[0] == 0


@pytest.mark.parametrize(
    "uri, missing",
    [
        ("s3://missing-bucket/models/x/", "bucket 'missing-bucket' does not exist"),
        ("s3://real-bucket/models/none/", "config.json does not exist"),
    ],
)
def test_model_data_that_does_not_exist_is_refused_before_any_create(local_aws, uri, missing):  # noqa: F811
    boto3.client("s3", region_name=REGION).create_bucket(
        Bucket="real-bucket", CreateBucketConfiguration={"LocationConstraint": REGION}
    )
    with pytest.raises(Gemma4T4Error, match=missing) as info:
        deploy(DeployConfig(name="g4-data", model_data_s3_uri=uri), progress=False)
    assert "--model-dir" in info.value.fix
    sm = boto3.client("sagemaker", region_name=REGION)
    assert sm.list_models()["Models"] == [] and sm.list_endpoints()["Endpoints"] == []


def test_reap_treats_an_unreadable_expiry_as_expired_and_says_so(local_aws):  # noqa: F811
    deploy(DeployConfig(name="g4-garbled", ttl_hours=48), poll_s=0.05, progress=False)
    sm = boto3.client("sagemaker", region_name=REGION)
    arn = sm.describe_endpoint(EndpointName="g4-garbled")["EndpointArn"]
    sm.add_tags(ResourceArn=arn, Tags=[{"Key": EXPIRES_TAG, "Value": "tomorrow-ish"}])
    assert {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=arn)["Tags"]}[PROJECT_TAG] == PROJECT_VALUE
    preview = reap([REGION], dry_run=True, now=dt.datetime.now(dt.UTC))
    (decision,) = preview.decisions
    assert decision.action == "delete" and "'tomorrow-ish' does not parse" in decision.reason
    assert "treated as expired" in decision.reason
    assert reap([REGION]).deleted == ["g4-garbled"]
    assert sm.list_endpoints()["Endpoints"] == []


class _InterruptingS3:
    """moto's S3 client, with Ctrl-C arriving during the second part upload."""

    def __init__(self, real):
        self.real, self.parts = real, 0

    def upload_part(self, **kwargs):
        self.parts += 1
        if self.parts == 2:
            raise KeyboardInterrupt
        return self.real.upload_part(**kwargs)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_an_interrupted_multipart_upload_says_how_to_resume_or_abort(local_aws, tmp_path, capsys):  # noqa: F811
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(os.urandom(2 * MIN_PART_SIZE + 10))
    s3 = boto3.client("s3", region_name=REGION)
    with pytest.raises(KeyboardInterrupt):
        upload_model_folder(
            folder,
            REGION,
            bucket="up-bucket",
            part_size=MIN_PART_SIZE,
            progress=False,
            s3_client=_InterruptingS3(s3),
        )
    note = capsys.readouterr().err
    (pending,) = s3.list_multipart_uploads(Bucket="up-bucket")["Uploads"]
    assert "interrupted after 1 part(s)" in note and "re-running the same command resumes" in note
    assert (
        f"aws s3api abort-multipart-upload --bucket up-bucket --key {pending['Key']} "
        f"--upload-id {pending['UploadId']}"
    ) in note
    resumed = upload_model_folder(folder, REGION, bucket="up-bucket", part_size=MIN_PART_SIZE, progress=False)
    assert [f.status for f in resumed.files] == ["skipped", "resumed"]  # config.json went up before
    assert s3.list_multipart_uploads(Bucket="up-bucket").get("Uploads", []) == []


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "tool, args, field",
    [
        ("delete_endpoint", {"name": "x", "confirm": "yes"}, "confirm"),
        ("delete_endpoint", {"name": "x", "confirm": 1}, "confirm"),
        ("stop_vllm_server", {"port": 22, "confirm": False}, "port"),
        ("start_vllm_server", {"model": "m", "port": 70000}, "port"),
        ("start_vllm_server", {"model": "m", "max_model_len": -5}, "max_model_len"),
        ("get_deployment_config", {"max_num_seqs": 0}, "max_num_seqs"),
    ],
)
async def test_mcp_typed_parameters_refuse_bad_values_before_the_tool_runs(
    tool, args, field, monkeypatch, tmp_path
):
    from mcp import Client

    from gemma4_t4 import mcp_server

    monkeypatch.setenv("GEMMA4_T4_WORK_DIR", str(tmp_path))
    async with Client(mcp_server.build_server()) as client:
        schema = {t.name: t.input_schema for t in (await client.list_tools()).tools}[tool]
        result = await client.call_tool(tool, args)
    assert result.is_error, result
    text = result.content[0].text
    assert "validation error" in text and field in text, text  # refused by the SDK, before the body ran
    limits = json.dumps(schema["properties"][field])
    assert any(k in limits for k in ('"minimum"', '"exclusiveMinimum"', '"boolean"')), limits
    assert mcp_server._OWNED == []  # nothing was launched


def test_broken_and_looping_links_in_a_model_folder_are_refused_by_name(tmp_path):
    from gemma4_t4.sagemaker.upload import scan_folder

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model-00002-of-00002.safetensors").symlink_to(tmp_path / "gone.safetensors")
    (model / "loop").symlink_to(model / "loop")
    with pytest.raises(Gemma4T4Error) as info:
        scan_folder(model)
    text = str(info.value)
    assert "model-00002-of-00002.safetensors" in text and "loop" in text and "broken" in text


def test_an_expiry_extended_in_another_iso_form_is_read_not_reaped():
    import datetime as dt

    from gemma4_t4.sagemaker.config import EXPIRES_TAG
    from gemma4_t4.sagemaker.cost import parse_expiry

    when = dt.datetime(2099, 1, 1, tzinfo=dt.UTC)
    for raw in ("2099-01-01T00:00:00Z", "2099-01-01T00:00:00+00:00", "2099-01-01T00:00:00"):
        assert parse_expiry({EXPIRES_TAG: raw}) == when, raw
    assert parse_expiry({EXPIRES_TAG: "next tuesday"}) is None


@pytest.mark.parametrize(
    ("amount", "shown"),
    [(0.0001, "$0.0001"), (0.000123, "$0.00012"), (0.005, "$0.005"), (0.31, "$0.31"), (0.736, "$0.74"),
     (5, "$5.00"), (0, "$0.00")],
)  # fmt: skip
def test_money_keeps_significant_digits_for_small_amounts(amount, shown):
    from gemma4_t4.sagemaker.cost import usd

    assert usd(amount) == shown


def test_a_tiny_matrix_budget_is_shown_with_its_digits_never_as_zero(local_aws, tmp_path, capsys):  # noqa: F811
    code, text = _run(
        capsys, "matrix", "--models", "google/gemma-4-E2B-it", "--budget-usd", "0.0001",
        "--instance-type", "ml.g4dn.xlarge", "--region", REGION, "--out", str(tmp_path / "m"),
    )  # fmt: skip
    assert code == 1, text  # refused before any deploy: the estimate does not fit
    assert "hard budget $0.0001" in text and "exceeds the budget $0.0001" in text
    assert "$0.0001 of the $0.0001 budget is left" in text
    assert re.search(r"(budget|of the|of) \$0\.00(?![0-9])", text) is None, text  # no budget shown as zero
    assert boto3.client("sagemaker", region_name=REGION).list_endpoints()["Endpoints"] == []
