"""The stock DLC tag is looked up in the region's registry at run time (moto's ECR, seeded with
good, floating, -soci, other-release and malformed tags); the recorded constant is used only as
a labelled fallback with the reason, and both dry runs show which it was."""

from __future__ import annotations

import json

import boto3
import pytest
from fakes.aws_fixtures import local_aws, local_aws_session  # noqa: F401 - fixtures

from gemma4_t4.cli import main
from gemma4_t4.sagemaker.image import DEFAULT_DLC_ACCOUNT, DEFAULT_VLLM_TAG, fixed_image_tag, resolve_dlc_tag

REGION = "us-east-2"
BASE = "0.30.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v"
SEEDED = [
    f"{BASE}1.1",
    f"{BASE}1.2",
    f"{BASE}1.9",
    f"{BASE}1.10",  # the newest: numeric, not lexical (1.10 > 1.9)
    f"{BASE}1.11-soci",  # lazy-loading variant: never chosen
    f"{BASE}1.x",  # malformed
    f"{BASE}",  # malformed
    "0.30.0-gpu-py312-cu130-ubuntu24.04-sagemaker",  # floating
    "0.31.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.0",  # another vLLM release
    "latest",
    "0.30.0-omni-gpu-py312-cu130-ubuntu24.04-sagemaker-v2.0",
]


def _seed_dlc(tags: list[str]) -> None:
    ecr = boto3.client("ecr", region_name=REGION)
    ecr.create_repository(repositoryName="vllm", registryId=DEFAULT_DLC_ACCOUNT)
    for i, tag in enumerate(tags):
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": 2,
                "digest": f"sha256:{i:064x}",
            },
            "layers": [],
        }
        ecr.put_image(repositoryName="vllm", imageManifest=json.dumps(manifest), imageTag=tag)


def _dry(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["sagemaker", *argv, "--region", REGION, "--dry-run", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_newest_pinned_tag_of_the_release_is_found_and_shown_by_both_dry_runs(local_aws, capsys):  # noqa: F811
    _seed_dlc(SEEDED)
    resolved = resolve_dlc_tag(REGION)
    assert (resolved.tag, resolved.source, resolved.candidates) == (f"{BASE}1.10", "registry", len(SEEDED))
    deploy = _dry(capsys, "deploy", "--instance-type", "ml.g4dn.xlarge")
    assert deploy["image_tag"].startswith(f"{BASE}1.10 (newest in the registry")
    assert f"gemma4-t4-vllm:{fixed_image_tag(f'{BASE}1.10')}" in "\n".join(deploy["plan"])
    l4 = _dry(capsys, "deploy", "--instance-type", "ml.g6.xlarge")
    assert f"/vllm:{BASE}1.10" in "\n".join(l4["plan"])
    build = _dry(capsys, "build-image")
    assert build["base_tag"].startswith(f"{BASE}1.10 ")
    assert "BASE_IMAGE" in "\n".join(build["plan"]) and f"/vllm:{BASE}1.10" in "\n".join(build["plan"])
    assert resolve_dlc_tag(REGION, f"{BASE}1.2").source == "override"  # an explicit tag wins


@pytest.mark.parametrize(
    "seed",
    [None, [f"{BASE}1.1-soci", "latest", "0.31.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.0"]],
    ids=["no-repository", "nothing-for-the-release"],
)
def test_the_constant_is_only_a_labelled_fallback(local_aws, capsys, seed):  # noqa: F811
    if seed:
        _seed_dlc(seed)
    resolved = resolve_dlc_tag(REGION)
    assert resolved.tag == DEFAULT_VLLM_TAG and resolved.source == "fallback"
    assert (
        "RepositoryNotFoundException" if seed is None else "no pinned 0.30.0 SageMaker tag"
    ) in resolved.reason
    shown = _dry(capsys, "deploy", "--instance-type", "ml.g6.xlarge")["image_tag"]
    assert shown.startswith(f"{DEFAULT_VLLM_TAG} (fallback, not found in the registry: ")
    assert "fallback, not found in the registry" in _dry(capsys, "build-image")["base_tag"]


def test_the_fallback_is_the_tag_seen_publicly_with_its_evidence():
    """For vLLM 0.30.0 only `-sagemaker-v1.1` is seen publicly (reference notes hosts_as_they_are.md,
    "Added 2026-12-01"); `-v1.3` was never seen outside one Dockerfile. The constant, its comment
    and the docs say which tag it is and why."""
    from pathlib import Path

    from gemma4_t4.sagemaker import image

    assert DEFAULT_VLLM_TAG == "0.30.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.1"
    source = Path(image.__file__).read_text()
    comment = source[: source.index("DEFAULT_VLLM_TAG = ")].rsplit("\n\n", 1)[-1]
    assert "FALLBACK" in comment and "-sagemaker-v1.1" in comment and "2026-" in comment
    docs = (Path(__file__).resolve().parents[2] / "docs" / "sagemaker.md").read_text()
    assert f"`image.DEFAULT_VLLM_TAG` (`{DEFAULT_VLLM_TAG}`) is only a recorded\nfallback" in docs


AL2023 = f"{DEFAULT_DLC_ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/vllm:server-sagemaker-cuda-"


@pytest.mark.parametrize(
    ("revision", "cuda", "ami"),
    [(f"v1.{m}", (12, 9), "al2-ami-sagemaker-inference-gpu-3-1") for m in range(5)]
    + [(f"v2.{m}", (13, 0), "al2023-ami-sagemaker-inference-gpu-4-1") for m in range(4)]
    + [("v1.4.0", (12, 9), "al2-ami-sagemaker-inference-gpu-3-1"), ("v2.3.0", (13, 0),
                                                                    "al2023-ami-sagemaker-inference-gpu-4-1")],
)
def test_each_al2023_revision_aws_published_gets_its_cuda_and_the_ami_that_runs_it(revision, cuda, ami):
    """AWS's DLC changelog (read 2026-12-05): server-sagemaker-cuda v1.0-v1.4 bundle CUDA 12.9.1, v2.0 and
    later CUDA 13.0.2 (v2.3 the newest seen). A v1.x image runs on the driver-550 AMI (minor-version
    compatibility); a v2.x image needs the driver-580 AL2023 AMI, and a CUDA-12 AMI is refused for it."""
    from gemma4_t4.errors import Gemma4T4Error
    from gemma4_t4.sagemaker import image

    uri = AL2023 + revision
    assert image.image_cuda(uri) == cuda
    assert image.required_ami_version(uri, "ml.g4dn.xlarge") == ami
    published = image.AL2023_TAG_CUDA[image.al2023_revision(revision.join(["server-sagemaker-cuda-", ""]))]
    assert "changelog" in published.source and "2026-12-05" in published.source
    assert ("CUDA 13.0.2" if cuda == (13, 0) else "CUDA 12.9.1") in published.source
    image.check_ami_for_image(ami, uri, "ml.g4dn.xlarge")
    if cuda[0] == 13:
        with pytest.raises(Gemma4T4Error, match="cannot run image"):
            image.check_ami_for_image("al2-ami-sagemaker-inference-gpu-3-1", uri, "ml.g4dn.xlarge")


@pytest.mark.parametrize("revision", ["v2", "v2.4", "v3.0"])
def test_an_al2023_revision_past_the_recorded_ones_is_never_guessed(revision):
    from gemma4_t4.errors import Gemma4T4Error
    from gemma4_t4.sagemaker import image

    assert image.image_cuda(AL2023 + revision) is None
    with pytest.raises(Gemma4T4Error, match="is not known"):
        image.required_ami_version(AL2023 + revision, "ml.g4dn.xlarge")
