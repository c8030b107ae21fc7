"""The AWS vLLM Deep Learning Container (DLC) for SageMaker: per-region registry accounts, tag
choice (``0.30.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.1``; floating, ``-soci`` and omni tags are
never chosen automatically) and the driver (``InferenceAmiVersion``) an image's CUDA needs."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from gemma4_t4 import __version__
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import JSONObject
from gemma4_t4.sagemaker.aws import (
    aws_call,
    aws_exceptions,
    client_factory,
    error_code,
    error_message,
)

DLC_REPOSITORY = "vllm"
DEFAULT_DLC_ACCOUNT = "763104351884"
# Regions whose registry account differs from the default, from AWS's DLC region-availability table.
DLC_ACCOUNT_EXCEPTIONS: dict[str, str] = {
    "af-south-1": "626614931356", "ap-east-1": "871362719292", "ap-east-2": "975050140332",
    "ap-northeast-3": "364406365360", "ap-south-2": "772153158452", "ap-southeast-3": "907027046896",
    "ap-southeast-4": "457447274322", "ap-southeast-5": "550225433462", "ap-southeast-7": "590183813437",
    "ca-west-1": "204538143572", "cn-north-1": "727897471807", "cn-northwest-1": "727897471807",
    "eu-central-2": "380420809688", "eu-south-1": "692866216735", "eu-south-2": "503227376785",
    "il-central-1": "780543022126", "me-central-1": "914824155844", "me-south-1": "217643126080",
    "mx-central-1": "637423239942",
}
# Regions served by the default account.
DLC_DEFAULT_ACCOUNT_REGIONS = (
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1", "sa-east-1", "eu-west-1", "eu-west-2",
    "eu-west-3", "eu-central-1", "eu-north-1", "ap-south-1", "ap-northeast-1", "ap-northeast-2",
    "ap-southeast-1", "ap-southeast-2",
)
KNOWN_REGIONS: tuple[str, ...] = tuple(sorted((*DLC_DEFAULT_ACCOUNT_REGIONS, *DLC_ACCOUNT_EXCEPTIONS)))
US_REGIONS: tuple[str, ...] = ("us-east-1", "us-east-2", "us-west-2", "us-west-1")

# Only a recorded FALLBACK, used when the region's registry cannot be read or holds no tag of this
# vLLM release: deploy and build-image look up the newest ``-sagemaker-vN.M`` of the release in the
# registry first (:func:`resolve_dlc_tag`) and label this one "fallback" when they use it. It is the
# revision seen publicly: "for 0.30.0 only ``…-sagemaker-v1.1`` is seen publicly" (third-party code,
# 2026-09-25; reference notes hosts_as_they_are.md, "Added 2026-12-01 (second pass)"). ``-v1.2`` was
# reported as newer once, ``-v1.3`` never seen outside one Dockerfile, and a ``…-sagemaker-v1.4`` tag was
# seen in a public run log (us-east-2, 2026-10-08; third pass, 2026-12-05) without its vLLM release, so
# none of them is the fallback: the registry lookup finds them where they exist.
DEFAULT_VLLM_TAG = "0.30.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.1"
DEFAULT_VLLM_RELEASE = (0, 30, 0)

_TAG = re.compile(
    r"^(?P<version>\d+\.\d+\.\d+)-gpu-py(?P<py>\d+)-cu(?P<cuda>\d{3})-(?P<os>[a-z]+[\d.]+)"
    r"-sagemaker-v(?P<sm>\d+(?:\.\d+)?)$"
)
_AL2023_TAG = re.compile(r"^server-sagemaker-cuda-v(?P<sm>\d+(?:\.\d+){0,2})$")


@dataclass(frozen=True)
class PublishedCuda:
    """The CUDA version AWS publishes for a tag whose name does not say it, and where it says so."""

    cuda: tuple[int, int]
    source: str


# ``server-sagemaker-cuda-vX.Y`` names no CUDA version: only what AWS publishes for a revision is used.
# A revision missing here (and the floating ``-v1``, whose image moves) has no known CUDA, and a deploy
# of it needs an explicit InferenceAmiVersion (:func:`required_ami_version` says so).
# v1.0-v1.4 bundle CUDA 12.9.1 (a CUDA 12 driver runs them, through minor-version compatibility on the
# driver-550 AMI) and v2.0-v2.3 CUDA 13.0.2 (the driver-580 AL2023 AMI only); v2.3 is the newest seen.
_V1_SOURCE = (
    'aws/deep-learning-containers changelog, server-sagemaker-cuda v1.3.0 (2026-05-12): "Bundled versions: '
    'CUDA 12.9.1"; the changelog gives CUDA 12.9.1 for v1.0-v1.4 (read 2026-12-05; reference notes '
    "hosts_as_they_are.md, third pass)"
)
_V2_SOURCE = (
    "aws/deep-learning-containers changelog: server-sagemaker-cuda v2.0 and later bundle CUDA 13.0.2 (newest "
    "seen v2.3, vLLM 0.27.0; read 2026-12-05; reference notes hosts_as_they_are.md, third pass)"
)
AL2023_TAG_CUDA: dict[tuple[int, ...], PublishedCuda] = {
    **{(1, minor): PublishedCuda((12, 9), _V1_SOURCE) for minor in range(5)},
    **{(2, minor): PublishedCuda((13, 0), _V2_SOURCE) for minor in range(4)},
}

# InferenceAmiVersion -> (NVIDIA driver, the CUDA version it ships). The instance default (no AMI
# version) on g4dn is driver 470 / CUDA 11.4. Source: botocore 1.44.8's enum and AWS's docs (reference
# notes notebooks_and_tooling.md §5 and hosts_as_they_are.md "SageMaker", 2026-12-01).
AMI_DRIVERS: dict[str, tuple[int, tuple[int, int]]] = {
    "al2-ami-sagemaker-inference-gpu-2": (535, (12, 2)),
    "al2-ami-sagemaker-inference-gpu-2-1": (535, (12, 2)),
    "al2-ami-sagemaker-inference-gpu-3-1": (550, (12, 4)),
    "al2023-ami-sagemaker-inference-gpu-4-1": (580, (13, 0)),
}
DEFAULT_AMI_CUDA = (11, 4)
# NVIDIA's minor-version compatibility: a CUDA 12.x runtime runs on any driver >= 525 (below 580 too);
# CUDA 13.x needs >= 580 (NVIDIA CUDA compatibility docs; hosts_as_they_are.md, 2026-12-01).
MINOR_COMPAT_DRIVER: dict[int, int] = {12: 525}


def ami_runs_cuda(ami_version: str, cuda: tuple[int, int]) -> bool:
    """Whether ``ami_version``'s driver runs a container built for ``cuda``: natively (its own CUDA is as
    new) or through minor-version compatibility (same major version, driver at or above the floor)."""
    driver, native = AMI_DRIVERS[ami_version]
    if native >= cuda:
        return True
    floor = MINOR_COMPAT_DRIVER.get(cuda[0])
    return native[0] == cuda[0] and floor is not None and driver >= floor


@dataclass(frozen=True)
class ImageTag:
    """A parsed DLC tag. ``sort_key`` orders by vLLM version, then the SageMaker revision."""

    tag: str
    vllm_version: tuple[int, int, int]
    sagemaker_revision: tuple[int, ...]

    @property
    def sort_key(self) -> tuple:
        return (self.vllm_version, self.sagemaker_revision)


def parse_tag(tag: str) -> ImageTag | None:
    """Parse a pinned vLLM DLC tag; ``None`` for floating, ``-soci``, omni or unknown tags."""
    match = _TAG.match(tag)
    if not match:
        return None
    version = tuple(int(p) for p in match["version"].split("."))
    return ImageTag(tag=tag, vllm_version=version,  # type: ignore[arg-type]
                    sagemaker_revision=tuple(int(p) for p in match["sm"].split(".")))


def select_latest_tag(tags: Iterable[str]) -> str:
    """The newest pinned tag by numeric version (never lexical: 0.10 > 0.9)."""
    parsed = [p for p in (parse_tag(t) for t in tags) if p is not None]
    if not parsed:
        raise Gemma4T4Error("no pinned vLLM SageMaker tag among the tags given",
                            fix=f"pass an explicit tag, e.g. {DEFAULT_VLLM_TAG}")
    return max(parsed, key=lambda p: p.sort_key).tag


def dlc_account(region: str) -> str:
    validate_region(region)
    return DLC_ACCOUNT_EXCEPTIONS.get(region, DEFAULT_DLC_ACCOUNT)


def validate_region(region: str) -> None:
    if region not in KNOWN_REGIONS:
        raise Gemma4T4Error(f"unknown or unsupported AWS region {region!r}",
                            fix=f"use one of: {', '.join(KNOWN_REGIONS)}")


def ecr_domain(region: str) -> str:
    return "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"


def vllm_image_uri(region: str, tag: str = DEFAULT_VLLM_TAG) -> str:
    """``<account>.dkr.ecr.<region>.amazonaws.com/vllm:<tag>``."""
    return f"{dlc_account(region)}.dkr.ecr.{region}.{ecr_domain(region)}/{DLC_REPOSITORY}:{tag}"


def image_tag(image_uri: str) -> str:
    return image_uri.rsplit(":", 1)[-1] if ":" in image_uri.rsplit("/", 1)[-1] else "latest"


def al2023_revision(tag: str) -> tuple[int, ...] | None:
    """(1, 3) for ``server-sagemaker-cuda-v1.3`` (and ``-v1.3.0``); None for any other tag."""
    match = _AL2023_TAG.match(tag)
    if not match:
        return None
    parts = [int(p) for p in match["sm"].split(".")]
    while len(parts) > 2 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def image_cuda(image_uri: str) -> tuple[int, int] | None:
    """CUDA version of the image: named in the tag (``cu130`` -> (13, 0)), or for an AL2023
    ``server-sagemaker-cuda-v*`` tag what AWS publishes for it (:data:`AL2023_TAG_CUDA`); None when
    neither says."""
    tag = image_tag(image_uri)
    match = re.search(r"cu(\d{3})", tag)  # a pinned tag's -cu130- too: nothing before it reads cuNNN
    if match:
        return (int(match[1][:-1]), int(match[1][-1]))
    revision = al2023_revision(tag)
    if revision is not None and revision in AL2023_TAG_CUDA:
        return AL2023_TAG_CUDA[revision].cuda
    return None


def required_ami_version(image_uri: str, instance_type: str) -> str | None:
    """The ``InferenceAmiVersion`` whose driver runs the image's CUDA on a GPU instance (a cu130 image
    on g4dn's default driver 470 fails ~6 min in with ``CannotStartContainerError`` and no log group)."""
    if not instance_type.startswith(("ml.g", "ml.p")):
        return None
    cuda = image_cuda(image_uri)
    if cuda is None:
        revision = al2023_revision(image_tag(image_uri))
        if revision is not None:  # a CUDA image whose CUDA AWS has not published (or a floating tag)
            known = ", ".join(f"v{'.'.join(map(str, r))}" for r in AL2023_TAG_CUDA)
            raise Gemma4T4Error(
                f"the CUDA version of {image_tag(image_uri)} is not known (AWS publishes it per revision; "
                f"recorded: {known}), so its driver cannot be chosen",
                fix="pass --inference-ami-version explicitly (e.g. al2023-ami-sagemaker-inference-gpu-4-1 for "
                "CUDA 13, al2-ami-sagemaker-inference-gpu-3-1 for CUDA 12), or use a pinned tag",
            )
        return None
    if cuda <= DEFAULT_AMI_CUDA:
        return None
    # 1. an AMI of the image's CUDA major version that ships that CUDA or newer (the oldest such);
    # 2. one of the same major running it through minor-version compatibility (the newest such);
    # 3. a newer major version's AMI (drivers run older CUDA releases; the oldest such)
    same_major = [(d, ami) for ami, (d, ships) in AMI_DRIVERS.items() if ships[0] == cuda[0] and ships >= cuda]
    compatible = [(d, ami) for ami, (d, ships) in AMI_DRIVERS.items() if ships[0] == cuda[0] and ami_runs_cuda(ami, cuda)]
    newer = [(d, ami) for ami, (d, ships) in AMI_DRIVERS.items() if ships >= cuda]
    if same_major:
        return min(same_major)[1]
    if compatible:
        return max(compatible)[1]
    if newer:
        return min(newer)[1]
    raise Gemma4T4Error(f"no SageMaker inference AMI runs CUDA {cuda[0]}.{cuda[1]} (image {image_uri})",
                        fix="use an image built for CUDA 13.0 or older")


def check_ami_for_image(ami_version: str | None, image_uri: str, instance_type: str) -> None:
    """Refuse an explicit AMI whose driver is too old for the image (caught before any call)."""
    if ami_version is not None and ami_version not in AMI_DRIVERS:
        raise Gemma4T4Error(f"unknown InferenceAmiVersion {ami_version!r}",
                            fix=f"use one of: {', '.join(AMI_DRIVERS)}")
    unpublished = al2023_revision(image_tag(image_uri)) is not None and image_cuda(image_uri) is None
    if ami_version is not None and unpublished:
        return  # AWS has not published its CUDA: the explicit choice is the user's to make
    needed = required_ami_version(image_uri, instance_type)
    if needed is None:
        return
    if ami_version is None:
        raise Gemma4T4Error(
            f"image {image_tag(image_uri)} needs a newer GPU driver than {instance_type}'s default",
            fix=f"set inference_ami_version={needed!r} (or leave it on 'auto')")
    cuda = image_cuda(image_uri)  # known: an image of unknown CUDA needs no AMI (needed is None) or was refused
    if not ami_runs_cuda(ami_version, cuda):
        raise Gemma4T4Error(
            f"{ami_version} (driver {AMI_DRIVERS[ami_version][0]}) cannot run image "
            f"{image_tag(image_uri)}: the container would fail with CannotStartContainerError",
            fix=f"use inference_ami_version={needed!r} (or 'auto')",
        )


def list_vllm_tags(region: str) -> list[str]:
    """Every tag in the regional vLLM DLC repository (needs ECR read permission on it)."""
    ecr = client_factory()("ecr", region)
    tags: list[str] = []
    pages = ecr.get_paginator("list_images").paginate(
        registryId=dlc_account(region), repositoryName=DLC_REPOSITORY, filter={"tagStatus": "TAGGED"})
    for page in pages:
        tags += [i["imageTag"] for i in page.get("imageIds", []) if i.get("imageTag")]
    return sorted(set(tags))


@dataclass
class ResolvedTag:
    """The stock DLC tag a deploy or build uses, and where it came from."""

    tag: str
    source: str  # "registry" | "fallback" | "override"
    reason: str = ""  # why the fallback was used (access denied, not found, ...)
    candidates: int = 0

    @property
    def label(self) -> str:
        if self.source == "fallback":
            return f"{self.tag} (fallback, not found in the registry: {self.reason})"
        if self.source == "registry":
            return f"{self.tag} (newest in the registry of {self.candidates} tags)"
        return f"{self.tag} (given)"


def resolve_dlc_tag(region: str, tag: str | None = None) -> ResolvedTag:
    """The newest pinned ``...-sagemaker-vN.M`` tag (numeric order) of vLLM :data:`DEFAULT_VLLM_RELEASE` in
    ``region``'s DLC registry; an explicit ``tag`` wins. When the registry cannot be read or holds no tag for the
    release, the recorded :data:`DEFAULT_VLLM_TAG` is used, labelled as a fallback with the reason."""
    if tag:
        validate_tag(tag)
        return ResolvedTag(tag, "override")
    validate_region(region)
    try:
        tags = list_vllm_tags(region)
    except aws_exceptions() as exc:
        code = error_code(exc) or type(exc).__name__
        return ResolvedTag(DEFAULT_VLLM_TAG, "fallback", f"{code}: {error_message(exc)}")
    except Gemma4T4Error as exc:  # boto3 missing
        return ResolvedTag(DEFAULT_VLLM_TAG, "fallback", exc.message)
    wanted = [t for t in tags if (p := parse_tag(t)) is not None and p.vllm_version == DEFAULT_VLLM_RELEASE]
    if not wanted:
        version = ".".join(map(str, DEFAULT_VLLM_RELEASE))
        reason = f"no pinned {version} SageMaker tag among {len(tags)} tags"
        return ResolvedTag(DEFAULT_VLLM_TAG, "fallback", reason, len(tags))
    return ResolvedTag(select_latest_tag(wanted), "registry", candidates=len(tags))


class ImageResult(BaseModel):
    """The vLLM container for a region (its URI and tag, how it was chosen, its CUDA), and the
    InferenceAmiVersion whose driver runs its CUDA on an instance type."""

    region: str
    image_uri: str
    tag: str
    source: str = Field(description="default | registry | override")
    cuda: str | None = None
    candidates: int = 0
    instance_type: str
    inference_ami_version: str | None = None


def validate_tag(tag: str) -> None:
    """Refuse a tag that is not a pinned AWS vLLM tag (``latest``, ``../../x``: ECR's tag rule is
    [A-Za-z0-9_.-], and a floating tag would deploy whatever AWS pushes next)."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag) or (
            parse_tag(tag) is None and al2023_revision(tag) is None):
        raise Gemma4T4Error(f"image tag {tag!r} is not a pinned vLLM SageMaker tag",
                            fix=f"use a tag like {DEFAULT_VLLM_TAG} (floating, -soci and omni tags are refused), "
                            "or leave it out for the newest pinned one")


def find_vllm_image(region: str, tag: str | None = None, query_registry: bool = False,
                    instance_type: str = "ml.g4dn.xlarge") -> ImageResult:
    """The vLLM image for ``region``: an explicit tag, the newest in the registry, or the default; and
    the AMI ``instance_type`` needs for it."""
    count = 0
    if tag:
        validate_tag(tag)
        source = "override"
    elif query_registry:
        tags = list_vllm_tags(region)
        tag, source, count = select_latest_tag(tags), "registry", len(tags)
    else:
        tag, source = DEFAULT_VLLM_TAG, "default"
    uri = vllm_image_uri(region, tag)
    cuda = image_cuda(uri)
    return ImageResult(region=region, image_uri=uri, tag=tag, source=source,
                       cuda=f"{cuda[0]}.{cuda[1]}" if cuda else None, candidates=count, instance_type=instance_type,
                       inference_ami_version=required_ami_version(uri, instance_type))


# The derived T4 image: the DLC plus this package (the Turing fix loads as a vLLM plugin).
T4_IMAGE_REPOSITORY = "gemma4-t4-vllm"
FIXED_TAG_MARK = "-g4t4-"  # <base DLC tag>-g4t4-<package version>: the only tags build-image writes
ACCOUNT_PLACEHOLDER = "<ACCOUNT>"  # dry runs name the account they cannot look up


def fixed_image_tag(base_tag: str = DEFAULT_VLLM_TAG) -> str:
    """The ECR tag of the fixed image: base DLC tag + package version (ECR allows [A-Za-z0-9_.-])."""
    if parse_tag(base_tag) is None:
        raise Gemma4T4Error(f"base tag {base_tag!r} is not a pinned vLLM SageMaker tag",
                            fix=f"use a tag like {DEFAULT_VLLM_TAG} (gemma4-t4 sagemaker image --latest)")
    safe_version = re.sub(r"[^A-Za-z0-9_.-]", "_", __version__)
    return f"{base_tag}{FIXED_TAG_MARK}{safe_version}"


def parse_fixed_tag(tag: str) -> tuple[ImageTag, str] | None:
    """(base DLC tag, package version) of a fixed-image tag; None for any other tag."""
    if FIXED_TAG_MARK not in tag:
        return None
    base, version = tag.rsplit(FIXED_TAG_MARK, 1)
    parsed = parse_tag(base)
    if parsed is None or not re.fullmatch(r"[A-Za-z0-9_.-]+", version):
        return None
    return parsed, version


def _version_key(version: str) -> tuple:
    """Numeric parts; a forced rebuild's ``-rN`` suffix counts as N (so ``0.1.0-r3`` > ``0.1.0-r2`` > ``0.1.0``)."""
    return tuple(int(p) if p.isdigit() else int(p[1:]) if re.fullmatch(r"r\d+", p) else -1
                 for p in re.split(r"[._-]", version))


def select_latest_fixed_tag(tags: Iterable[str]) -> str | None:
    """The newest fixed-image tag: by base vLLM version, then SageMaker revision, then package version."""
    parsed = [(t, p) for t in tags if (p := parse_fixed_tag(t)) is not None]
    if not parsed:
        return None
    return max(parsed, key=lambda item: (item[1][0].sort_key, _version_key(item[1][1])))[0]


def carries_turing_fix(image_uri: str) -> bool | None:
    """True for an image build-image made, False for AWS's stock vLLM DLC, None when unknown. The fixed
    image exists only under this repository and tag scheme, and its build fails unless ``image_check``
    passes, so the name is the proof."""
    # ``vllm`` for ``<acct>.dkr.ecr.<region>.amazonaws.com/vllm:<tag>`` (or ``...@sha256:...``)
    repository = image_uri.split("/", 1)[-1].split("@", 1)[0].rsplit(":", 1)[0]
    tag = image_tag(image_uri)
    if repository == T4_IMAGE_REPOSITORY and parse_fixed_tag(tag) is not None:
        return True
    account = image_uri.split(".", 1)[0]
    stock_accounts = (DEFAULT_DLC_ACCOUNT, *DLC_ACCOUNT_EXCEPTIONS.values())
    if repository == DLC_REPOSITORY and account in stock_accounts:
        return False
    return None


def t4_image_uri(account: str, region: str, tag: str | None = None) -> str:
    """Where build-image pushes the derived image (your own account's ECR)."""
    validate_region(region)
    if account != ACCOUNT_PLACEHOLDER and not re.fullmatch(r"\d{12}", account):
        raise Gemma4T4Error(f"AWS account id {account!r} is not 12 digits",
                            fix="pass your 12-digit account id")
    return f"{account}.dkr.ecr.{region}.{ecr_domain(region)}/{T4_IMAGE_REPOSITORY}:{tag or fixed_image_tag()}"


@dataclass
class FixedImage:
    """The fixed image a T4 deploy uses: found in ECR, or built now (``build``, a ``build.BuildResult``)."""

    image_uri: str
    tag: str
    digest: str | None
    build: Any = None


def fixed_images(ecr: Any) -> list[JSONObject]:
    """Every tagged image (ECR's ``imageDetails[]``: registryId, imageDigest, imageTags) of the fixed-image
    repository in ``ecr``'s account (none before it exists)."""
    try:
        pages = ecr.get_paginator("describe_images").paginate(
            repositoryName=T4_IMAGE_REPOSITORY, filter={"tagStatus": "TAGGED"}
        )
        return [image for page in pages for image in page.get("imageDetails", [])]
    except aws_exceptions() as exc:
        if error_code(exc) != "RepositoryNotFoundException":
            raise
        return []


def find_fixed_image(region: str, *, ecr_client: Any = None) -> FixedImage:
    """The newest fixed T4 image in this account's ECR in ``region``; refuses when there is none."""
    validate_region(region)
    ecr = ecr_client or client_factory()("ecr", region)
    with aws_call(f"DescribeImages {T4_IMAGE_REPOSITORY} in {region}"):
        images = fixed_images(ecr)
    by_tag = {t: i for i in images for t in i.get("imageTags", [])}
    tag = select_latest_fixed_tag(by_tag)
    if tag is None:
        raise Gemma4T4Error(
            f"no fixed T4 image in {region}'s ECR ({T4_IMAGE_REPOSITORY}:<base tag>{FIXED_TAG_MARK}<version>): "
            "AWS's stock vLLM container crashes on a T4 at the first prefill (Turing has 64 KiB shared memory, "
            "Gemma 4's attention asks for 96 KiB)",
            fix=f"build it once: gemma4-t4 sagemaker build-image --region {region} (or pass --image-uri of a "
            "fixed image in this region)",
        )
    detail = by_tag[tag]
    account = detail.get("registryId") or ACCOUNT_PLACEHOLDER
    return FixedImage(t4_image_uri(account, region, tag), tag, detail.get("imageDigest"))
