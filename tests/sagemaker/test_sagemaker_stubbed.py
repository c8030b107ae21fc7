"""Failure paths real SageMaker produces but moto cannot: botocore Stubber drives quotas,
Creating -> Failed, ResourceLimitExceeded, timeouts and region failover. Every test also
asserts the exact calls made (Stubber fails on any unexpected call)."""

from __future__ import annotations

import datetime as dt

import boto3
import pytest
from botocore.stub import Stubber

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.config import DeployConfig
from gemma4_t4.sagemaker.deploy import DeployFailed, deploy, deploy_with_failover
from gemma4_t4.sagemaker.image import fixed_image_tag
from gemma4_t4.sagemaker.quotas import check_quotas, pick_region

ROLE = "arn:aws:iam::123456789012:role/sm-exec"
NAME = "g4-test"


def _client(service: str, region: str = "us-east-2"):
    return boto3.client(
        service,
        region_name=region,
        aws_access_key_id="x",
        aws_secret_access_key="y",
        endpoint_url=f"https://{service}.{region}.example.invalid",
    )


def _quota_page(values: dict[str, float]) -> dict:
    quotas = [
        {"QuotaName": f"{t} for endpoint usage", "QuotaCode": f"L-{i:08d}", "Value": v, "Adjustable": True}
        for i, (t, v) in enumerate(values.items())
    ]
    quotas.append(
        {"QuotaName": "ml.g4dn.xlarge for training job usage", "QuotaCode": "L-TRAIN", "Value": 9.0}
    )
    return {"Quotas": quotas}


class Clients:
    """A client factory of stubbed clients, one per (service, region)."""

    def __init__(self):
        self.clients: dict[tuple[str, str], tuple[object, Stubber]] = {}

    def stub(self, service: str, region: str) -> Stubber:
        if (service, region) not in self.clients:
            client = _client(service, region)
            stubber = Stubber(client)
            stubber.activate()
            self.clients[(service, region)] = (client, stubber)
        return self.clients[(service, region)][1]

    def __call__(self, service: str, region: str):
        self.stub(service, region)
        return self.clients[(service, region)][0]

    def assert_done(self):
        for _, stubber in self.clients.values():
            stubber.assert_no_pending_responses()


def _fixed_image(region: str = "us-east-2") -> tuple[object, Stubber]:
    """ECR answering the T4 deploy's lookup of the fixed image (a T4 never gets the stock DLC)."""
    ecr = _client("ecr", region)
    stubber = Stubber(ecr)
    _expect_fixed_image(stubber)
    stubber.activate()
    return ecr, stubber


def _expect_fixed_image(stubber: Stubber) -> None:
    tag = fixed_image_tag()
    stubber.add_response(
        "describe_images",
        {
            "imageDetails": [
                {
                    "registryId": "123456789012",
                    "repositoryName": "gemma4-t4-vllm",
                    "imageDigest": "sha256:" + "a" * 64,
                    "imageTags": [tag],
                },
                {
                    "registryId": "123456789012",
                    "repositoryName": "gemma4-t4-vllm",
                    "imageDigest": "sha256:" + "b" * 64,
                    "imageTags": ["0.29.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.3-g4t4-0.0.9", "scratch"],
                },
            ]
        },
        {"repositoryName": "gemma4-t4-vllm", "filter": {"tagStatus": "TAGGED"}},
    )


def _not_found(stubber: Stubber, operation: str) -> None:
    stubber.add_client_error(
        operation,
        service_error_code="ValidationException",
        service_message="Could not find resource.",
        http_status_code=400,
    )


def _expect_preflight(stubber: Stubber) -> None:
    for operation in ("describe_endpoint", "describe_endpoint_config", "describe_model"):
        _not_found(stubber, operation)


def _expect_creates(stubber: Stubber, region: str = "us-east-2", fail_at: str | None = None) -> None:
    arn = f"arn:aws:sagemaker:{region}:123456789012:"
    for operation, key in (
        ("create_model", "ModelArn"),
        ("create_endpoint_config", "EndpointConfigArn"),
        ("create_endpoint", "EndpointArn"),
    ):
        if operation == fail_at:
            stubber.add_client_error(
                operation,
                service_error_code="ResourceLimitExceeded",
                service_message="The account-level service limit 'ml.g4dn.xlarge for "
                "endpoint usage' is 0 Instances",
                http_status_code=400,
            )
            return
        stubber.add_response(operation, {key: arn + operation})
        _describe_created(stubber, operation.removeprefix("create_"))  # the identity recorded at create


# What SageMaker answers when a created resource is described: its CreationTime is the identity that
# a rollback checks again before it deletes (a name alone may by then be another owner's).
CREATED = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)  # a Stubber answers as given: botocore's parsed type


def _describe_created(stubber: Stubber, kind: str, created: dt.datetime = CREATED) -> None:
    arn = "arn:aws:sagemaker:us-east-2:123456789012:"
    answers = {
        "model": ({"ModelName": NAME, "ModelArn": arn + "model/x", "CreationTime": created}, "ModelName"),
        "endpoint_config": ({"EndpointConfigName": NAME, "EndpointConfigArn": arn + "endpoint-config/x",
                             "ProductionVariants": [{"VariantName": "AllTraffic"}], "CreationTime": created},
                            "EndpointConfigName"),
        "endpoint": ({"EndpointName": NAME, "EndpointArn": arn + "endpoint/x", "EndpointStatus": "Creating",
                      "CreationTime": created, "LastModifiedTime": created}, "EndpointName"),
    }
    answer, key = answers[kind]
    stubber.add_response(f"describe_{kind}", answer, {key: NAME})


def _describe(stubber: Stubber, status: str, reason: str | None = None) -> None:
    response = {
        "EndpointName": NAME,
        "EndpointArn": "arn:aws:sagemaker:us-east-2:123456789012:endpoint/x",
        "EndpointConfigName": NAME,
        "EndpointStatus": status,
        "CreationTime": "2026-11-01T00:00:00Z",
        "LastModifiedTime": "2026-11-01T00:00:00Z",
    }
    if reason:
        response["FailureReason"] = reason
    stubber.add_response("describe_endpoint", response, {"EndpointName": NAME})


def _expect_deletes(stubber: Stubber, kinds=("endpoint", "endpoint_config", "model")) -> None:
    keys = {"endpoint": "EndpointName", "endpoint_config": "EndpointConfigName", "model": "ModelName"}
    for kind in kinds:
        _describe_created(stubber, kind)  # still the one this deploy created: deleted
        stubber.add_response(f"delete_{kind}", {}, {keys[kind]: NAME})


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_quotas_by_name_sequential_and_region_pick():
    clients = Clients()
    clients.stub("service-quotas", "us-east-1").add_response(
        "list_service_quotas", _quota_page({"ml.g4dn.xlarge": 0.0}), {"ServiceCode": "sagemaker"}
    )
    clients.stub("service-quotas", "us-east-2").add_client_error(
        "list_service_quotas", service_error_code="AccessDeniedException", service_message="denied"
    )
    clients.stub("service-quotas", "us-west-2").add_response(
        "list_service_quotas",
        _quota_page({"ml.g4dn.xlarge": 2.0, "ml.g6.xlarge": 1.0}),
        {"ServiceCode": "sagemaker"},
    )
    report = check_quotas(["ml.g4dn.xlarge"], ["us-east-1", "us-east-2", "us-west-2"], clients=clients)
    clients.assert_done()
    values = {r.region: r.value for r in report.rows}
    assert values == {"us-east-1": 0.0, "us-east-2": None, "us-west-2": 2.0}  # not the training quota (9)
    assert "AccessDeniedException" in next(r.error for r in report.rows if r.region == "us-east-2")
    assert pick_region(report, "ml.g4dn.xlarge") == "us-west-2"


def test_no_quota_anywhere_is_a_clear_refusal():
    clients = Clients()
    for region in ("us-east-1", "us-west-2"):
        clients.stub("service-quotas", region).add_response(
            "list_service_quotas", _quota_page({"ml.g4dn.xlarge": 0.0})
        )
    report = check_quotas(["ml.g4dn.xlarge"], ["us-east-1", "us-west-2"], clients=clients)
    with pytest.raises(Gemma4T4Error, match="no quota for 'ml.g4dn.xlarge for endpoint usage'") as info:
        pick_region(report, "ml.g4dn.xlarge")
    assert "request-service-quota-increase" in info.value.fix


def test_creating_then_failed_rolls_back_everything():
    sm = _client("sagemaker")
    stubber = Stubber(sm)
    _expect_preflight(stubber)
    _expect_creates(stubber)
    _describe(stubber, "Creating")
    _describe(stubber, "Creating")
    _describe(stubber, "Failed", "CannotStartContainerError. Please ensure the model container starts.")
    _expect_deletes(stubber)
    clock = FakeClock()
    with stubber, pytest.raises(DeployFailed) as info:
        deploy(
            DeployConfig(name=NAME, role_arn=ROLE),
            client=sm,
            ecr_client=_fixed_image()[0],
            poll_s=30,
            progress=False,
            sleep=clock.sleep,
            monotonic=clock.monotonic,
        )
    stubber.assert_no_pending_responses()
    result = info.value.result
    assert result.status == "Failed"
    assert result.rolled_back == [f"endpoint:{NAME}", f"endpoint-config:{NAME}", f"model:{NAME}"]
    assert "CannotStartContainer" in result.failure_reason
    assert "inference_ami_version" in info.value.fix
    stages = [e.stage for e in result.timeline]
    assert stages[:4] == ["validated", "create_model", "create_endpoint_config", "create_endpoint"]
    assert "status Failed" in stages and stages[-1] == "rolled back"
    assert result.elapsed_s == pytest.approx(60.0)


def test_resource_limit_on_create_endpoint_deletes_model_and_config():
    sm = _client("sagemaker")
    stubber = Stubber(sm)
    _expect_preflight(stubber)
    _expect_creates(stubber, fail_at="create_endpoint")
    _expect_deletes(stubber, kinds=("endpoint_config", "model"))  # no endpoint was created
    with stubber, pytest.raises(DeployFailed) as info:
        deploy(
            DeployConfig(name=NAME, role_arn=ROLE), client=sm, ecr_client=_fixed_image()[0], progress=False
        )
    stubber.assert_no_pending_responses()
    assert info.value.result.rolled_back == [f"endpoint-config:{NAME}", f"model:{NAME}"]
    assert info.value.result.created == [f"model:{NAME}", f"endpoint-config:{NAME}"]
    assert "ResourceLimitExceeded" in str(info.value) and "quota" in info.value.fix


def test_timeout_deletes_the_endpoint_that_never_came_up():
    sm = _client("sagemaker")
    stubber = Stubber(sm)
    _expect_preflight(stubber)
    _expect_creates(stubber)
    for _ in range(4):  # t = 0, 100, 200, 300 (= timeout)
        _describe(stubber, "Creating")
    _expect_deletes(stubber)
    clock = FakeClock()
    with stubber, pytest.raises(DeployFailed) as info:
        deploy(
            DeployConfig(name=NAME, role_arn=ROLE),
            client=sm,
            ecr_client=_fixed_image()[0],
            timeout_s=300,
            poll_s=100,
            progress=False,
            sleep=clock.sleep,
            monotonic=clock.monotonic,
        )
    stubber.assert_no_pending_responses()
    assert info.value.result.status == "TimedOut"
    assert f"endpoint:{NAME}" in info.value.result.rolled_back


def test_exception_mid_wait_still_rolls_back():
    sm = _client("sagemaker")
    stubber = Stubber(sm)
    _expect_preflight(stubber)
    _expect_creates(stubber)
    _describe(stubber, "Creating")
    _expect_deletes(stubber)

    def broken_sleep(_seconds: float) -> None:
        raise RuntimeError("network went away")

    with stubber, pytest.raises(DeployFailed, match="network went away") as info:
        deploy(
            DeployConfig(name=NAME, role_arn=ROLE),
            client=sm,
            ecr_client=_fixed_image()[0],
            progress=False,
            sleep=broken_sleep,
        )
    stubber.assert_no_pending_responses()
    assert len(info.value.result.rolled_back) == 3


def test_existing_resource_is_never_overwritten():
    sm = _client("sagemaker")
    stubber = Stubber(sm)
    _describe(stubber, "InService")
    with stubber, pytest.raises(Gemma4T4Error, match="already exists"):
        deploy(
            DeployConfig(name=NAME, role_arn=ROLE), client=sm, ecr_client=_fixed_image()[0], progress=False
        )
    stubber.assert_no_pending_responses()  # nothing created, nothing deleted


def test_region_failover_timeline():
    clients = Clients()
    clients.stub("service-quotas", "us-east-1").add_response(
        "list_service_quotas", _quota_page({"ml.g4dn.xlarge": 0.0})
    )
    for region in ("us-west-2", "us-east-2"):
        clients.stub("service-quotas", region).add_response(
            "list_service_quotas", _quota_page({"ml.g4dn.xlarge": 1.0})
        )
    west = clients.stub("sagemaker", "us-west-2")
    _expect_preflight(west)
    _expect_creates(west, region="us-west-2")
    _expect_fixed_image(clients.stub("ecr", "us-west-2"))
    _describe(west, "Failed", "InsufficientInstanceCapacity: not enough ml.g4dn.xlarge capacity")
    _expect_deletes(west)
    east = clients.stub("sagemaker", "us-east-2")
    _expect_preflight(east)
    _expect_fixed_image(clients.stub("ecr", "us-east-2"))
    _expect_creates(east)
    _describe(east, "InService")
    result = deploy_with_failover(
        DeployConfig(name=NAME, role_arn=ROLE),
        ["us-east-1", "us-west-2", "us-east-2"],
        clients=clients,
        progress=False,
        poll_s=0,
    )
    clients.assert_done()
    assert result.success and result.region == "us-east-2"
    assert [(a.region, a.outcome) for a in result.attempts] == [
        ("us-east-1", "skipped: no quota"),
        ("us-west-2", "capacity"),
        ("us-east-2", "InService"),
    ]
    assert len(result.attempts[1].rolled_back) == 3
    assert any(e.stage == "status Failed" for e in result.attempts[1].timeline)
    assert result.deployment.created[-1] == f"endpoint:{NAME}"


def test_failover_without_quota_anywhere_creates_nothing():
    clients = Clients()
    for region in ("us-east-1", "us-west-2"):
        clients.stub("service-quotas", region).add_response(
            "list_service_quotas", _quota_page({"ml.g4dn.xlarge": 0.0})
        )
    with pytest.raises(Gemma4T4Error, match="nothing was created"):
        deploy_with_failover(
            DeployConfig(name=NAME, role_arn=ROLE), ["us-east-1", "us-west-2"], clients=clients
        )
    assert ("sagemaker", "us-east-1") not in clients.clients  # no SageMaker client was even built


def test_a_rollback_deletes_only_what_this_deploy_created_not_a_re_created_name():
    """Between a create and its rollback someone deleted this deploy's endpoint and config and created their
    own of the same name: the rollback checks each CreationTime recorded at create and leaves theirs alone."""
    sm = _client("sagemaker")
    stubber = Stubber(sm)
    _expect_preflight(stubber)
    _expect_creates(stubber)
    _describe(stubber, "Failed", "CannotStartContainerError")
    theirs = CREATED + dt.timedelta(minutes=3)
    _describe_created(stubber, "endpoint", theirs)  # no delete_endpoint follows: Stubber refuses any other call
    _describe_created(stubber, "endpoint_config", theirs)
    _describe_created(stubber, "model")  # still this deploy's own: deleted
    stubber.add_response("delete_model", {}, {"ModelName": NAME})
    with stubber, pytest.raises(DeployFailed) as info:
        deploy(DeployConfig(name=NAME, role_arn=ROLE), client=sm, ecr_client=_fixed_image()[0], progress=False)
    stubber.assert_no_pending_responses()
    assert info.value.result.rolled_back == [
        f"model:{NAME}",
        f"left alone: endpoint:{NAME} (re-created by another owner since this deploy)",
        f"left alone: endpoint-config:{NAME} (re-created by another owner since this deploy)",
    ]
