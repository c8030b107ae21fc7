"""Build the fixed T4 image in AWS (CodeBuild), no local Docker: ``gemma4-t4 sagemaker build-image``.

The stack (ECR repository, S3 bucket for the source bundle, least-privilege CodeBuild role, CodeBuild
project) has fixed names, each created only when missing and tagged ``project=gemma4-t4``, so a run
that stopped half-way is completed by the next one, never duplicated. The build pushes
``gemma4-t4-vllm:<base DLC tag>-g4t4-<package version>`` (its ``image_check`` step fails unless the
Turing fix loads); an image already in ECR under that tag is reused, not rebuilt.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemma4_t4 import __version__
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.cache import cache_root
from gemma4_t4.foundation.jsonable import JSONObject, TypedDict
from gemma4_t4.sagemaker import image as images
from gemma4_t4.sagemaker.aws import (
    ClientFactory,
    Clock,
    Sleep,
    aws_call,
    aws_exceptions,
    client_factory,
    error_code,
    error_message,
    note_undone,
    sleep_ticking,
)
from gemma4_t4.sagemaker.bundle import BUNDLE_FOLDER, source_bundle
from gemma4_t4.sagemaker.cli_recipe import ApiCall
from gemma4_t4.sagemaker.config import PROJECT_TAG, PROJECT_VALUE, PUBLIC_ACCESS_BLOCK, create_bucket_params
from gemma4_t4.sagemaker.cost import usd
from gemma4_t4.sagemaker.upload import remote_sha256

PROJECT_NAME = "gemma4-t4-image"
ROLE_NAME = "gemma4-t4-codebuild-image"
BUILD_IMAGE = "aws/codebuild/standard:7.0"
COMPUTE_TYPE = "BUILD_GENERAL1_LARGE"  # 8 vCPU / 15 GB: the DLC layers are ~8 GB
BUILDSPEC = f"{BUNDLE_FOLDER}/buildspec.yml"
# CodeBuild on-demand list price for BUILD_GENERAL1_LARGE (Linux), USD/minute, and ECR storage,
# USD per GB-month (AWS pricing pages, us-east-2). Estimates, not measurements.
CODEBUILD_USD_PER_MINUTE = 0.020
ECR_USD_PER_GB_MONTH = 0.10
EXPECTED_BUILD_MINUTES = 25.0  # pull ~8 GB, pip install, push ~8 GB
IMAGE_GB = 8.96  # 8.34 GiB, the size the series reported for its patched image
BUILD_TIMEOUT_MINUTES = 90
PHASES = ("SUBMITTED", "QUEUED", "PROVISIONING", "DOWNLOAD_SOURCE", "INSTALL", "PRE_BUILD", "BUILD",
          "POST_BUILD", "UPLOAD_ARTIFACTS", "FINALIZING", "COMPLETED")
FAILED_STATUSES = ("FAILED", "FAULT", "STOPPED", "TIMED_OUT")


@dataclass
class BuildCost:
    minutes: float
    build_usd: float
    storage_usd_per_month: float

    def line(self) -> str:
        return (
            f"estimated cost: ~{usd(self.build_usd)} for a ~{self.minutes:.0f}-minute CodeBuild run "
            f"({COMPUTE_TYPE}, ${CODEBUILD_USD_PER_MINUTE:.3f}/min list price) + ~{usd(self.storage_usd_per_month)}"
            f"/month ECR storage for the ~{IMAGE_GB:.1f} GB image (delete it to stop that)"
        )


def build_cost(minutes: float = EXPECTED_BUILD_MINUTES) -> BuildCost:
    return BuildCost(
        minutes, round(minutes * CODEBUILD_USD_PER_MINUTE, 2), round(IMAGE_GB * ECR_USD_PER_GB_MONTH, 2)
    )


@dataclass
class BuildTarget:
    """Names and URIs of one build; ``account`` is ``<ACCOUNT>`` in a dry run."""

    region: str
    account: str
    tag: str
    base_image: str
    image_uri: str
    bucket: str
    source_key: str


def build_target(region: str, account: str, base_tag: str = images.DEFAULT_VLLM_TAG,
                 bundle_sha256: str | None = None, tag: str | None = None) -> BuildTarget:
    tag = tag or images.fixed_image_tag(base_tag)
    key = f"build/{tag}/source-{(bundle_sha256 or '<SHA256>')[:16]}.zip"
    bucket = (f"gemma4-t4-build-{account}-{region}".lower() if account != images.ACCOUNT_PLACEHOLDER
              else f"gemma4-t4-build-<account>-{region}")
    return BuildTarget(region, account, tag, images.vllm_image_uri(region, base_tag),
                       images.t4_image_uri(account, region, tag), bucket, key)


# -- the plan (also what runs) --------------------------------------------------------------------
def _tags_kv(key: str = "key", value: str = "value") -> list[dict[str, str]]:
    return [{key: PROJECT_TAG, value: PROJECT_VALUE}, {key: "created-by", value: "gemma4-t4 build-image"}]


# The IAM policies and CodeBuild parameters below are sent to AWS as built, never read back: plain JSON.
def role_policy(target: BuildTarget) -> JSONObject:
    """Least privilege: its own logs, its source object, pulling the DLC, pushing one repository."""
    region, account = target.region, target.account
    pull = ["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"]
    push = [*pull, *(f"ecr:{a}" for a in ("InitiateLayerUpload", "UploadLayerPart", "CompleteLayerUpload",
                                          "PutImage"))]
    grants: list[tuple[str | list[str], str]] = [
        (["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
         f"arn:aws:logs:{region}:{account}:log-group:/aws/codebuild/{PROJECT_NAME}*"),
        (["s3:GetObject", "s3:GetObjectVersion"], f"arn:aws:s3:::{target.bucket}/build/*"),
        ("ecr:GetAuthorizationToken", "*"),
        (pull, f"arn:aws:ecr:{region}:{images.dlc_account(region)}:repository/{images.DLC_REPOSITORY}"),
        (push, f"arn:aws:ecr:{region}:{account}:repository/{images.T4_IMAGE_REPOSITORY}"),
    ]
    return {"Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": action, "Resource": res} for action, res in grants]}


def build_env(target: BuildTarget) -> list[JSONObject]:
    env = {"BASE_IMAGE": target.base_image, "TARGET_IMAGE": target.image_uri,
           "DLC_REGISTRY": target.base_image.split("/", 1)[0],
           "OWN_REGISTRY": target.image_uri.split("/", 1)[0]}
    return [{"name": k, "value": v, "type": "PLAINTEXT"} for k, v in env.items()]


def start_build_params(target: BuildTarget) -> JSONObject:
    return {"projectName": PROJECT_NAME, "sourceTypeOverride": "S3",
            "sourceLocationOverride": f"{target.bucket}/{target.source_key}",
            "environmentVariablesOverride": build_env(target)}


def project_definition(target: BuildTarget) -> JSONObject:
    return {
        "name": PROJECT_NAME,
        "description": "gemma4-t4: AWS's vLLM DLC + the Turing attention fix, for SageMaker T4 endpoints",
        "source": {"type": "S3", "location": f"{target.bucket}/{target.source_key}", "buildspec": BUILDSPEC},
        "artifacts": {"type": "NO_ARTIFACTS"},
        "environment": {"type": "LINUX_CONTAINER", "image": BUILD_IMAGE, "computeType": COMPUTE_TYPE,
                        "privilegedMode": True,  # docker build needs it
                        "environmentVariables": build_env(target)},
        "serviceRole": f"arn:aws:iam::{target.account}:role/{ROLE_NAME}",
        "timeoutInMinutes": BUILD_TIMEOUT_MINUTES,
        "tags": _tags_kv(),
    }


def stack_calls(target: BuildTarget, bundle_size: int | None = None) -> list[ApiCall]:
    """Every call build-image makes, in order, with the parameters it sends."""
    return [
        ApiCall("sts", "get_caller_identity", {}, target.region,
                note="your account id (names the bucket and the image)"),
        *_storage_calls(target, bundle_size),
        *_role_calls(target),
        *_codebuild_calls(target),
    ]


def _storage_calls(target: BuildTarget, bundle_size: int | None) -> list[ApiCall]:
    """The ECR repository the image goes to, and the private, tagged bucket holding the source bundle."""
    region = target.region
    bucket = create_bucket_params(target.bucket, region)
    repository = {"repositoryName": images.T4_IMAGE_REPOSITORY, "imageTagMutability": "IMMUTABLE",
                  "imageScanningConfiguration": {"scanOnPush": True}, "tags": _tags_kv("Key", "Value")}
    return [
        ApiCall("ecr", "create_repository", repository, region,
                note="ECR repository for the fixed image (skipped when it exists)"),
        ApiCall("s3api", "create_bucket", bucket, region,
                note="bucket for the source bundle (skipped when it exists)"),
        ApiCall("s3api", "put_public_access_block",
                {"Bucket": target.bucket, "PublicAccessBlockConfiguration": PUBLIC_ACCESS_BLOCK}, region),
        ApiCall("s3api", "put_bucket_tagging",
                {"Bucket": target.bucket, "Tagging": {"TagSet": _tags_kv("Key", "Value")}}, region),
        ApiCall("s3api", "put_object",
                {"Bucket": target.bucket, "Key": target.source_key, "Body": "source.zip",
                 "ChecksumAlgorithm": "SHA256"}, region,
                note=f"the package's wheel + docker/sagemaker-t4 ({bundle_size or '?'} bytes, "
                "skipped when already there)"),
    ]


def _role_calls(target: BuildTarget) -> list[ApiCall]:
    """CodeBuild's service role and its least-privilege policy (IAM is global: no region)."""
    trust = {"Effect": "Allow", "Principal": {"Service": "codebuild.amazonaws.com"}, "Action": "sts:AssumeRole"}
    role = {"RoleName": ROLE_NAME, "AssumeRolePolicyDocument": json.dumps({"Version": "2012-10-17", "Statement": [trust]}),
            "Tags": _tags_kv("Key", "Value")}
    policy = {"RoleName": ROLE_NAME, "PolicyName": "gemma4-t4-build",
              "PolicyDocument": json.dumps(role_policy(target))}
    return [
        ApiCall("iam", "create_role", role, None, note="CodeBuild service role (skipped when it exists)"),
        ApiCall("iam", "put_role_policy", policy, None,
                note="least privilege: own logs, the source object, pull the DLC, push gemma4-t4-vllm"),
    ]


def _codebuild_calls(target: BuildTarget) -> list[ApiCall]:
    """The CodeBuild project, the build, its polling and the check of the pushed image."""
    region = target.region
    return [
        ApiCall("codebuild", "create_project", project_definition(target), region,
                note="CodeBuild project (updated in place when it exists)"),
        ApiCall("codebuild", "start_build", start_build_params(target), region, note=build_cost().line()),
        ApiCall("codebuild", "batch_get_builds", {"ids": ["<BUILD_ID>"]}, region,
                note="poll phase and status"),
        ApiCall("ecr", "describe_images",
                {"repositoryName": images.T4_IMAGE_REPOSITORY, "imageIds": [{"imageTag": target.tag}]},
                region, note="verify the pushed image and record its digest"),
    ]


def build_plan(region: str, base_tag: str = images.DEFAULT_VLLM_TAG) -> list[str]:
    """Dry run: the AWS CLI equivalent of every call; nothing is called (no account lookup)."""
    images.validate_region(region)
    target = build_target(region, images.ACCOUNT_PLACEHOLDER, base_tag)
    return [c.cli() for c in stack_calls(target)]


# -- running it -------------------------------------------------------------------------------------
@dataclass
class BuildResult:
    region: str
    image_uri: str
    tag: str
    status: str  # SUCCEEDED | REUSED | FAILED | ...
    digest: str | None = None
    build_id: str | None = None
    phase: str | None = None
    created: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    cost_line: str = ""

    @property
    def pinned_uri(self) -> str | None:
        """``repo@sha256:...``: what to deploy when the tag must not move."""
        return f"{self.image_uri.rsplit(':', 1)[0]}@{self.digest}" if self.digest else None


class BuildFailed(Gemma4T4Error):
    def __init__(self, result: BuildResult, reason: str):
        tail = "\n".join(f"    {line}" for line in result.log_tail[-20:])
        where = "read the log tail above" if tail else (
            "no build log could be read; open it with: aws codebuild batch-get-builds --region "
            f"{result.region} --ids {result.build_id} (logs.deepLink), or the CodeBuild console's "
            f"{PROJECT_NAME} project")
        super().__init__(
            f"CodeBuild build {result.build_id} ended {result.status} in phase {result.phase}: {reason}"
            + (f"\n  log tail:\n{tail}" if tail else "\n  (no log tail: CloudWatch had none for this build)"),
            fix=f"{where}; nothing was deployed. Re-run build-image after fixing it (the stack is reused)",
        )
        self.result = result


def ensure_stack(target: BuildTarget, bundle: bytes, clients: ClientFactory, result: BuildResult,
                 sleep: Sleep) -> None:
    """Create what is missing (ECR, S3 + bundle, role, project); record created vs reused."""
    calls = {c.operation: c for c in stack_calls(target, len(bundle))}
    region = target.region
    ecr, s3, iam = (clients(s, region) for s in ("ecr", "s3", "iam"))

    def create(client: Any, operation: str, exists: str, what: str) -> None:
        """Make ``what`` with the planned call; AWS answering ``exists`` means it is reused."""
        try:
            getattr(client, operation)(**calls[operation].params)
            result.created.append(what)
        except aws_exceptions() as exc:
            if error_code(exc) != exists:
                raise
            result.reused.append(what)

    create(ecr, "create_repository", "RepositoryAlreadyExistsException", f"ecr:{images.T4_IMAGE_REPOSITORY}")
    create(s3, "create_bucket", "BucketAlreadyOwnedByYou", f"s3:{target.bucket}")
    s3.put_public_access_block(**calls["put_public_access_block"].params)
    s3.put_bucket_tagging(**calls["put_bucket_tagging"].params)
    digest = hashlib.sha256(bundle).hexdigest()
    present = remote_sha256(s3, target.bucket, target.source_key, len(bundle)) == digest
    if not present:
        s3.put_object(Bucket=target.bucket, Key=target.source_key, Body=bundle, Metadata={"sha256": digest},
                      ChecksumAlgorithm="SHA256")
    (result.reused if present else result.created).append(f"s3://{target.bucket}/{target.source_key}")
    create(iam, "create_role", "EntityAlreadyExists", f"iam:{ROLE_NAME}")
    iam.put_role_policy(**calls["put_role_policy"].params)
    cb = clients("codebuild", region)
    for attempt in range(6):  # a new role takes a few seconds to become assumable by CodeBuild
        try:
            # An existing project is reused as is: what varies per build is passed to start_build.
            create(cb, "create_project", "ResourceAlreadyExistsException", f"codebuild:{PROJECT_NAME}")
            return
        except aws_exceptions() as exc:
            assuming = error_code(exc) == "InvalidInputException" and "assume" in error_message(exc).lower()
            if assuming and attempt < 5:
                sleep(2.0 * (attempt + 1))
                continue
            raise


def existing_image(ecr: Any, tag: str) -> str | None:
    """The digest of ``gemma4-t4-vllm:<tag>`` in ECR, or None."""
    try:
        found = ecr.describe_images(repositoryName=images.T4_IMAGE_REPOSITORY, imageIds=[{"imageTag": tag}])
    except aws_exceptions() as exc:
        if error_code(exc) in ("ImageNotFoundException", "RepositoryNotFoundException"):
            return None
        raise
    details = found.get("imageDetails") or []
    return details[0].get("imageDigest") if details else None


def rebuild_tag(ecr: Any, tag: str) -> str:
    """The tag a forced rebuild pushes: ``<tag>-rN`` with the first N >= 2 not in ECR. The repository
    is IMMUTABLE, so pushing the existing tag again would fail after the whole billed build."""
    taken = {t for image in images.fixed_images(ecr) for t in image.get("imageTags", [])}
    n = 2
    while f"{tag}-r{n}" in taken:
        n += 1
    return f"{tag}-r{n}"


# CodeBuild's BatchGetBuilds ``builds[]`` entry, as AWS answers it: the build reads its id, buildStatus
# (IN_PROGRESS, SUCCEEDED, FAILED, STOPPED, ...), currentPhase, phases (phaseType, phaseStatus) and logs
# (groupName, streamName).
def log_tail(logs: Any, build: JSONObject) -> list[str]:
    """The build log's last 40 lines (none where CloudWatch has none)."""
    info = build.get("logs") or {}
    group, stream = info.get("groupName"), info.get("streamName")
    if not group or not stream:
        return []
    try:
        events = logs.get_log_events(logGroupName=group, logStreamName=stream, limit=40,
                                     startFromHead=False).get("events", [])
    except aws_exceptions():
        return []
    return [e.get("message", "").rstrip("\n") for e in events]


def wait_for_build(cb: Any, build_id: str, result: BuildResult, *, poll_s: float = 15.0,
                   progress: bool = True, timeout_s: float = BUILD_TIMEOUT_MINUTES * 60 + 600,
                   sleep: Sleep = time.sleep,
                   monotonic: Clock = time.monotonic) -> JSONObject:
    """Poll the build, showing its phase; returns the final build description."""
    from tqdm.auto import tqdm

    start = monotonic()
    with tqdm(total=len(PHASES), desc="CodeBuild", disable=not progress, leave=True,
              bar_format="{desc}: {n}/{total} phases | {postfix}") as bar:
        status = "IN_PROGRESS"

        def tick() -> None:  # the time waited moves every second, and is true when interrupted
            bar.set_postfix_str(f"{result.phase} {status} {monotonic() - start:.0f} s")

        try:  # an interrupted wait stops the build: nothing is left billing behind it
            while True:
                builds = cb.batch_get_builds(ids=[build_id]).get("builds") or []
                if not builds:
                    raise Gemma4T4Error(f"CodeBuild lost build {build_id}", fix="check the CodeBuild console")
                build = builds[0]
                result.phase = build.get("currentPhase")
                status = build.get("buildStatus", "IN_PROGRESS")
                bar.n = PHASES.index(result.phase) + 1 if result.phase in PHASES else bar.n
                tick()
                if status != "IN_PROGRESS":
                    failed = [p for p in build.get("phases", []) if p.get("phaseStatus") in FAILED_STATUSES]
                    if failed:
                        result.phase = failed[0].get("phaseType")
                    return build
                if monotonic() - start > timeout_s:
                    cb.stop_build(id=build_id)
                    build["buildStatus"] = "TIMED_OUT"
                    return build
                sleep_ticking(sleep, poll_s, tick)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP inside signals.orderly_stop
            tick()
            cb.stop_build(id=build_id)
            result.status = "STOPPED"
            note_undone(exc, f"stopped CodeBuild build {build_id}")
            raise


@contextlib.contextmanager
def build_lock(region: str) -> Iterator[Callable[..., None]]:
    """One build-image at a time per region and repository: two would push the same tag (``-r2`` under
    --force) and the second fails after its whole billed build. Yields a function recording the holder's
    tag and build id for the refusal. An fcntl lock dies with the process, so a killed run never sticks."""
    path = cache_root() / "locks" / f"build-image-{region}-{images.T4_IMAGE_REPOSITORY}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _already_building(region, path) from None
        # what the lock file says about the run holding it (pid, started_at, then tag and build_id)
        holder: JSONObject = {"pid": os.getpid(),
                              "started_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}

        def record(**fields: str) -> None:
            holder.update(fields)
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(holder))
            handle.flush()

        record()
        try:
            yield record
        finally:
            handle.seek(0)
            handle.truncate()  # unlocked when the file closes


def _already_building(region: str, path: Path) -> Gemma4T4Error:
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        holder = {}
    build_id, tag = holder.get("build_id"), holder.get("tag")
    running = f"CodeBuild build {build_id}" if build_id else "its CodeBuild build not started yet"
    return Gemma4T4Error(
        f"build-image is already running for {images.T4_IMAGE_REPOSITORY} in {region} (pid {holder.get('pid', '?')}, "
        f"since {holder.get('started_at', '?')}, {running}" + (f", tag {tag}" if tag else "") + ")",
        fix="wait for it to finish, then re-run (it reuses the image that build pushes)"
        + (f"; follow it with: aws codebuild batch-get-builds --region {region} --ids {build_id}" if build_id else "")
        + f". Two builds at once would push the same tag. Lock: {path}",
    )


def build_t4_image(region: str, base_tag: str = images.DEFAULT_VLLM_TAG, *, force: bool = False,
                   clients: ClientFactory | None = None, poll_s: float = 15.0, progress: bool = True,
                   on_build_succeeded: Callable[[str, str], object] | None = None,
                   sleep: Sleep = time.sleep) -> BuildResult:
    """Create/reuse the stack, run the build, verify the image in ECR and return its digest.
    ``on_build_succeeded(region, tag)`` is for offline runs: moto's CodeBuild runs no Docker, so
    :meth:`LocalAWS.seed_fixed_image` stands in for the push there."""
    images.validate_region(region)
    images.fixed_image_tag(base_tag)  # a base tag that is not pinned is refused before any AWS call
    bundle = source_bundle()
    make = clients or client_factory()
    t0 = time.monotonic()
    with aws_call("GetCallerIdentity"):
        account = make("sts", region).get_caller_identity()["Account"]
    bundle_sha = hashlib.sha256(bundle).hexdigest()
    target = build_target(region, account, base_tag, bundle_sha)
    result = BuildResult(region, target.image_uri, target.tag, "PENDING", cost_line=build_cost().line())
    ecr = make("ecr", region)
    try:  # one build-image per region and repository
        with aws_call(f"build-image in {region}"), build_lock(region) as record:
            digest = existing_image(ecr, target.tag)
            if digest and not force:
                result.status, result.digest = "REUSED", digest
                result.reused.append(f"image:{target.tag}")
                return result
            if digest:  # --force: never push onto a tag the IMMUTABLE repository already holds
                existing = target.tag
                target = build_target(region, account, base_tag, bundle_sha, rebuild_tag(ecr, existing))
                result.image_uri, result.tag = target.image_uri, target.tag
                print(f"--force: {existing} is already in ECR and its tags are immutable; building {target.tag}",
                      file=sys.stderr)
            record(tag=target.tag)
            ensure_stack(target, bundle, make, result, sleep)
            build = _run_build(make("codebuild", region), target, result, record, poll_s, progress, sleep)
            result.status = build.get("buildStatus", "?")
            reason = f"CodeBuild status {result.status}"
            if result.status == "SUCCEEDED":
                if on_build_succeeded:
                    on_build_succeeded(target.region, target.tag)
                result.digest = existing_image(ecr, target.tag)
                if result.digest:
                    return result
                result.status = "FAILED"
                reason = f"the build reported SUCCEEDED but {target.image_uri} is not in ECR"
            result.log_tail = log_tail(make("logs", region), build)
            raise BuildFailed(result, reason)
    finally:
        result.elapsed_s = round(time.monotonic() - t0, 2)


def _run_build(cb: Any, target: BuildTarget, result: BuildResult, record: Callable[..., None], poll_s: float,
               progress: bool, sleep: Sleep) -> Any:
    """Start the CodeBuild build and wait for it; interrupted, the build is stopped (never left running)."""
    started = cb.start_build(**start_build_params(target))["build"]
    result.build_id, result.status = started["id"], "IN_PROGRESS"
    record(build_id=result.build_id)
    try:
        return wait_for_build(cb, result.build_id, result, poll_s=poll_s, progress=progress, sleep=sleep)
    except KeyboardInterrupt as exc:  # interrupted before the wait took over: the build must not run on
        if result.status != "STOPPED":
            cb.stop_build(id=result.build_id)
            result.status = "STOPPED"
            note_undone(exc, f"stopped CodeBuild build {result.build_id}")
        raise


class BuildRecord(TypedDict):
    """``build-image --record FILE``: the image and how to deploy it pinned by digest."""

    image_uri: str
    pinned_uri: str | None
    digest: str | None
    tag: str
    region: str
    status: str
    build_id: str | None
    package_version: str
    recorded_at: str


def build_record(result: BuildResult) -> BuildRecord:
    """What build-image records next to the image: enough to deploy it pinned by digest."""
    return BuildRecord(image_uri=result.image_uri, pinned_uri=result.pinned_uri, digest=result.digest,
                       tag=result.tag, region=result.region, status=result.status, build_id=result.build_id,
                       package_version=__version__,
                       recorded_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))


def ensure_t4_image(region: str, on_build_succeeded: Callable[[str, str], object] | None = None
                    ) -> images.FixedImage:
    """The newest fixed image in ``region``'s ECR, else build one (its cost is printed first)."""
    try:
        return images.find_fixed_image(region)
    except Gemma4T4Error as missing:
        print(f"{missing.message}\nbuilding it: {build_cost().line()}")
    result = build_t4_image(region, on_build_succeeded=on_build_succeeded)
    return images.FixedImage(result.image_uri, result.tag, result.digest, build=result)
