"""build-image against moto (ECR, S3, IAM, STS, CodeBuild): the stack is created once, tagged and
least-privilege, a half-created stack is completed on retry (never duplicated), an image already
in ECR is reused, and a failed build names its phase and log tail. moto's CodeBuild runs no
Docker build, so the push is stood in for by LocalAWS.seed_fixed_image (named as such)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import time
import zipfile
from io import BytesIO

import boto3
import pytest
from botocore.stub import Stubber
from fakes.aws_fixtures import local_aws, local_aws_session  # noqa: F401 - fixtures

from gemma4_t4.cli import main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker import build
from gemma4_t4.sagemaker.aws import client_factory
from gemma4_t4.sagemaker.build import BuildFailed, build_plan, build_t4_image
from gemma4_t4.sagemaker.bundle import source_bundle, write_build_context
from gemma4_t4.sagemaker.image import T4_IMAGE_REPOSITORY, find_fixed_image, fixed_image_tag

REGION = "us-east-2"


def _clear_ecr(region: str = REGION) -> None:
    ecr = boto3.client("ecr", region_name=region)
    try:
        ecr.delete_repository(repositoryName=T4_IMAGE_REPOSITORY, force=True)
    except ecr.exceptions.RepositoryNotFoundException:
        pass


def _stack_counts() -> dict[str, int]:
    ecr, s3 = boto3.client("ecr", region_name=REGION), boto3.client("s3", region_name=REGION)
    iam, cb = boto3.client("iam", region_name=REGION), boto3.client("codebuild", region_name=REGION)
    return {
        "repos": len(ecr.describe_repositories()["repositories"]),
        "buckets": len([b for b in s3.list_buckets()["Buckets"] if b["Name"].startswith("gemma4-t4-build-")]),
        "roles": len([r for r in iam.list_roles()["Roles"] if r["RoleName"] == build.ROLE_NAME]),
        "projects": len(cb.list_projects()["projects"]),
    }


def test_dry_run_plan_names_codebuild_and_ecr_and_calls_nothing(local_aws, capsys):  # noqa: F811
    _clear_ecr()
    plan = "\n".join(build_plan(REGION))
    for call in (
        "aws codebuild create-project",
        "aws codebuild start-build",
        "aws ecr create-repository",
        "aws ecr describe-images",
        "aws iam create-role",
        "aws iam put-role-policy",
        "aws s3api put-object",
    ):
        assert call in plan, call
    assert "<ACCOUNT>" in plan and "privilegedMode" in plan
    assert main(["sagemaker", "build-image", "--dry-run", "--region", REGION]) == 0
    out = capsys.readouterr().out
    assert "CodeBuild" in out and "ECR" in out and "estimated cost" in out
    assert _stack_counts() == {"repos": 0, "buckets": 0, "roles": 0, "projects": 0}


def test_source_bundle_is_deterministic_and_complete():
    first, second = source_bundle(), source_bundle()
    assert first == second
    names = zipfile.ZipFile(BytesIO(first)).namelist()
    version = importlib.metadata.version("gemma4-t4")
    wheel_name = f"gemma4_t4-{version}-py3-none-any.whl"
    assert sorted(names) == sorted(["docker/sagemaker-t4/Dockerfile", build.BUILDSPEC, "docker/sagemaker-t4/build.sh",
                                    wheel_name])
    # the Dockerfile installs the wheel the bundle carries, from the context root CodeBuild is given
    dockerfile = zipfile.ZipFile(BytesIO(first)).read("docker/sagemaker-t4/Dockerfile").decode()
    assert "COPY gemma4_t4-*.whl" in dockerfile and "pyproject.toml" not in dockerfile
    wheel = zipfile.ZipFile(BytesIO(zipfile.ZipFile(BytesIO(first)).read(wheel_name)))
    inside = wheel.namelist()
    for needed in ("gemma4_t4/sagemaker/image_check.py", "gemma4_t4/turing/__init__.py",
                   "gemma4_t4/data/sagemaker-t4/Dockerfile", f"gemma4_t4-{version}.dist-info/RECORD"):
        assert needed in inside, needed
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in inside)
    entry_points = wheel.read(f"gemma4_t4-{version}.dist-info/entry_points.txt").decode()
    assert "[vllm.general_plugins]" in entry_points and "gemma4_t4.turing.plugin:register" in entry_points


@pytest.mark.slow
def test_the_bundled_wheel_installs_with_pip_and_carries_the_plugin(tmp_path):
    """pip itself accepts the wheel build-image makes (RECORD, WHEEL, METADATA), and what it installs
    has the vLLM plugin entry point the image's check loads: the container's install step, off AWS."""
    context = write_build_context(tmp_path / "context")
    (wheel,) = context.glob("gemma4_t4-*.whl")
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--quiet",
                           "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    probe = ("import importlib.metadata as m, gemma4_t4; "
             "print(gemma4_t4.__file__); "
             "print([e.value for e in m.entry_points(group='vllm.general_plugins')])")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                           cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target)})
    assert shown.returncode == 0, shown.stderr
    assert str(target) in shown.stdout and "gemma4_t4.turing.plugin:register" in shown.stdout
    assert (context / "docker" / "sagemaker-t4" / "build.sh").stat().st_mode & 0o111


def test_build_creates_a_tagged_least_privilege_stack_then_reuses_it(local_aws):  # noqa: F811
    _clear_ecr()
    result = build_t4_image(
        REGION,
        poll_s=0,
        progress=False,
        on_build_succeeded=local_aws.seed_fixed_image,
    )
    assert result.status == "SUCCEEDED" and result.digest.startswith("sha256:")
    assert result.tag == fixed_image_tag() and result.image_uri.endswith(
        f"/{T4_IMAGE_REPOSITORY}:{result.tag}"
    )
    assert result.pinned_uri == result.image_uri.rsplit(":", 1)[0] + "@" + result.digest
    assert sorted(r.split(":", 1)[0] for r in result.created) == ["codebuild", "ecr", "iam", "s3", "s3"]
    assert _stack_counts() == {"repos": 1, "buckets": 1, "roles": 1, "projects": 1}

    cb = boto3.client("codebuild", region_name=REGION)
    project = cb.batch_get_projects(names=[build.PROJECT_NAME])["projects"][0]
    assert project["environment"]["privilegedMode"] is True
    assert {"key": "project", "value": "gemma4-t4"} in project["tags"]
    iam = boto3.client("iam", region_name=REGION)
    policy = iam.get_role_policy(RoleName=build.ROLE_NAME, PolicyName="gemma4-t4-build")["PolicyDocument"]
    policy = json.loads(policy) if isinstance(policy, str) else policy
    resources = [s["Resource"] for s in policy["Statement"]]
    assert "*" not in [
        r
        for s in policy["Statement"]
        for r in ([s["Resource"]] if s["Action"] != "ecr:GetAuthorizationToken" else [])
    ]
    assert f"arn:aws:ecr:{REGION}:123456789012:repository/{T4_IMAGE_REPOSITORY}" in resources
    assert not any("FullAccess" in json.dumps(s) for s in policy["Statement"])
    ecr = boto3.client("ecr", region_name=REGION)
    repo = ecr.describe_repositories(repositoryNames=[T4_IMAGE_REPOSITORY])["repositories"][0]
    assert repo["imageTagMutability"] == "IMMUTABLE"

    again = build_t4_image(REGION, poll_s=0, progress=False)  # the tag is in ECR: nothing is rebuilt
    assert again.status == "REUSED" and again.digest == result.digest and again.build_id is None
    assert len(cb.list_builds_for_project(projectName=build.PROJECT_NAME)["ids"]) == 1
    # the deploy side finds exactly this image
    assert find_fixed_image(REGION).image_uri == result.image_uri


def test_half_created_stack_is_completed_on_retry_never_duplicated(local_aws):  # noqa: F811
    _clear_ecr()
    real = client_factory()

    def broken(service, region):
        if service == "codebuild":
            raise RuntimeError("network dropped after the IAM role was created")
        return real(service, region)

    with pytest.raises(RuntimeError):
        build_t4_image(REGION, clients=broken, poll_s=0, progress=False)
    assert _stack_counts() == {"repos": 1, "buckets": 1, "roles": 1, "projects": 0}
    result = build_t4_image(
        REGION,
        poll_s=0,
        progress=False,
        on_build_succeeded=local_aws.seed_fixed_image,
    )
    assert result.status == "SUCCEEDED"
    assert [r.split(":", 1)[0] for r in result.created] == ["codebuild"]  # the rest was reused
    assert {"ecr", "s3", "iam"} <= {r.split(":", 1)[0] for r in result.reused}
    assert _stack_counts() == {"repos": 1, "buckets": 1, "roles": 1, "projects": 1}


def test_failed_build_names_phase_and_log_tail_and_deploys_nothing(local_aws):  # noqa: F811
    _clear_ecr()
    real = client_factory()
    cb = boto3.client("codebuild", region_name=REGION)
    stub = Stubber(cb)
    stub.add_client_error("create_project", service_error_code="ResourceAlreadyExistsException")
    build_id = f"{build.PROJECT_NAME}:abc"
    stub.add_response("start_build", {"build": {"id": build_id, "buildStatus": "IN_PROGRESS"}})
    stub.add_response(
        "batch_get_builds",
        {"builds": [{"id": build_id, "buildStatus": "IN_PROGRESS", "currentPhase": "PRE_BUILD"}]},
    )
    stub.add_response(
        "batch_get_builds",
        {
            "builds": [
                {
                    "id": build_id,
                    "buildStatus": "FAILED",
                    "currentPhase": "COMPLETED",
                    "phases": [
                        {"phaseType": "PRE_BUILD", "phaseStatus": "SUCCEEDED"},
                        {"phaseType": "BUILD", "phaseStatus": "FAILED"},
                    ],
                    "logs": {"groupName": "/aws/codebuild/gemma4-t4-image", "streamName": "abc"},
                }
            ]
        },
    )
    logs = real("logs", REGION)
    now = int(time.time() * 1000)
    logs.create_log_group(logGroupName="/aws/codebuild/gemma4-t4-image")
    logs.create_log_stream(logGroupName="/aws/codebuild/gemma4-t4-image", logStreamName="abc")
    logs.put_log_events(
        logGroupName="/aws/codebuild/gemma4-t4-image",
        logStreamName="abc",
        logEvents=[
            {"timestamp": now, "message": "[FAIL] vllm: vLLM 0.26.0 is not a version the fix supports"},
            {
                "timestamp": now + 1,
                "message": "The command '/bin/sh -c python -m gemma4_t4.sagemaker.image_check' returned 1",
            },
        ],
    )

    def clients(service, region):
        return cb if service == "codebuild" else real(service, region)

    with stub, pytest.raises(BuildFailed) as info:
        build_t4_image(REGION, clients=clients, poll_s=0, progress=False)
    assert info.value.result.phase == "BUILD" and info.value.result.status == "FAILED"
    assert "in phase BUILD" in info.value.message and "image_check' returned 1" in info.value.message
    assert info.value.result.digest is None
    with pytest.raises(Exception, match="no fixed T4 image"):
        find_fixed_image(REGION)  # nothing to deploy


def test_success_without_an_image_in_ecr_is_a_failure(local_aws):  # noqa: F811
    _clear_ecr()
    with pytest.raises(BuildFailed, match="is not in ECR"):
        build_t4_image(REGION, poll_s=0, progress=False)  # moto "succeeds" but nothing was pushed


def test_t4_deploy_without_a_fixed_image_refuses_and_creates_nothing(local_aws):  # noqa: F811
    from gemma4_t4.errors import Gemma4T4Error
    from gemma4_t4.sagemaker import DeployConfig, deploy

    _clear_ecr()
    with pytest.raises(Gemma4T4Error, match="no fixed T4 image") as info:
        deploy(DeployConfig(name="g4-nofix"), progress=False)
    assert "build-image --region us-east-2" in info.value.fix
    sm = boto3.client("sagemaker", region_name=REGION)
    assert sm.list_models()["Models"] == [] and sm.list_endpoints()["Endpoints"] == []
    # the explicit opt-out (a vLLM fixed upstream) gets the stock image without an ECR lookup
    result = deploy(
        DeployConfig(name="g4-optout", allow_unfixed_image=True),
        progress=False,
        poll_s=0,
        ecr_client=object(),
    )
    image = sm.describe_model(ModelName="g4-optout")["PrimaryContainer"]["Image"]
    assert result.success and image.startswith("763104351884.dkr.ecr.us-east-2.amazonaws.com/vllm:")


def test_cli_record_and_mcp_tool_need_confirm(local_aws, tmp_path, capsys):  # noqa: F811
    from gemma4_t4.mcp_server import REGISTRY
    from gemma4_t4.mcp_server import build_t4_image as tool

    _clear_ecr()
    refused = tool(region=REGION)
    assert refused.refused and "confirm=True" in refused.reason and "estimated cost" in refused.cost
    assert any("aws codebuild start-build" in c for c in refused.aws_cli)
    assert _stack_counts() == {"repos": 0, "buckets": 0, "roles": 0, "projects": 0}  # nothing was created
    assert REGISTRY["build_t4_image"].confirm and REGISTRY["build_t4_image"].annotations.destructive_hint
    failed = tool(region=REGION, confirm=True)  # moto's CodeBuild pushes nothing: verified as a failure
    assert not failed.refused and "is not in ECR" in failed.reason

    uri = local_aws.seed_fixed_image()  # the stand-in push, then the CLI finds and records it
    record = tmp_path / "t4-image.json"
    assert main(["sagemaker", "build-image", "--region", REGION, "--record", str(record)]) == 0
    out = capsys.readouterr().out
    assert "REUSED" in out and uri in out
    saved = json.loads(record.read_text())
    assert saved["image_uri"] == uri and saved["pinned_uri"].endswith("@" + saved["digest"])
    assert main(["sagemaker", "build-image", "--region", REGION, "--base-tag", "latest"]) == 2
    assert "not a pinned vLLM SageMaker tag" in capsys.readouterr().err


def test_the_mcp_build_is_bounded_by_a_budget_its_preview_shows(local_aws):  # noqa: F811
    """An assistant's build bills CodeBuild minutes: the preview names the worst case (the project's timeout)
    and a budget_usd below it is refused before anything is created, even with confirm=True."""
    from gemma4_t4.mcp_server import build_t4_image as tool
    from gemma4_t4.sagemaker.build import BUILD_TIMEOUT_MINUTES, CODEBUILD_USD_PER_MINUTE

    _clear_ecr()
    worst = round(BUILD_TIMEOUT_MINUTES * CODEBUILD_USD_PER_MINUTE, 2)
    preview = tool(region=REGION)
    assert f"at most ${worst:.2f}" in preview.cost
    refused = tool(region=REGION, confirm=True, budget_usd=worst / 2)
    assert refused.refused and "over budget_usd" in refused.reason and f"{worst:.2f}" in refused.reason
    assert _stack_counts() == {"repos": 0, "buckets": 0, "roles": 0, "projects": 0}  # nothing was created


def test_an_interrupted_wait_stops_the_build_it_started():
    """Ctrl-C while waiting on CodeBuild stops that build (nothing left billing), then re-raises."""
    cb = boto3.client("codebuild", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(cb)
    build_id = f"{build.PROJECT_NAME}:abc"
    stub.add_response(
        "batch_get_builds",
        {"builds": [{"id": build_id, "buildStatus": "IN_PROGRESS", "currentPhase": "BUILD"}]},
    )
    stub.add_response("stop_build", {"build": {"id": build_id}}, {"id": build_id})

    def interrupted(_s):
        raise KeyboardInterrupt

    with stub, pytest.raises(KeyboardInterrupt):
        build.wait_for_build(cb, build_id, build.BuildResult(REGION, "uri", "tag", "IN_PROGRESS"), progress=False,
                            sleep=interrupted)
    stub.assert_no_pending_responses()


def test_a_second_forced_build_while_one_runs_is_refused_naming_it(local_aws, tmp_path, monkeypatch):  # noqa: F811
    """Two `build-image --force` at once would both build the same -r2 tag (the second push fails on
    the IMMUTABLE repository after its billed build): the second is refused, naming the running one."""
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))
    local_aws.seed_fixed_image(REGION)  # an earlier build's tag: --force builds <tag>-r2
    cb = boto3.client("codebuild", region_name=REGION)
    builds_before = len(cb.list_builds_for_project(projectName=build.PROJECT_NAME)["ids"]) if (
        cb.list_projects()["projects"]
    ) else 0
    refusals: list[Gemma4T4Error] = []

    def meanwhile(region, tag) -> None:  # runs while the first build is under way (its wait has ended)
        with pytest.raises(Gemma4T4Error) as info:
            build_t4_image(REGION, force=True, poll_s=0, progress=False)
        refusals.append(info.value)
        local_aws.seed_fixed_image(region, tag)

    first = build_t4_image(REGION, force=True, poll_s=0, progress=False, on_build_succeeded=meanwhile)

    assert first.status == "SUCCEEDED" and first.tag.endswith("-r2")
    [refusal] = refusals
    assert f"already running for {T4_IMAGE_REPOSITORY} in {REGION}" in refusal.message
    assert f"CodeBuild build {first.build_id}" in refusal.message and first.tag in refusal.message
    assert f"--ids {first.build_id}" in refusal.fix
    assert len(cb.list_builds_for_project(projectName=build.PROJECT_NAME)["ids"]) == builds_before + 1
    # the lock goes with the run: the next build-image runs (and finds the -r2 image)
    assert build_t4_image(REGION, progress=False).status == "REUSED"
