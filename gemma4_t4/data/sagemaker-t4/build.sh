#!/usr/bin/env bash
# Build the T4 image from AWS's vLLM container on THIS machine and push it to your ECR in REGION.
# Prefer `gemma4-t4 sagemaker build-image --region REGION`, which builds it in AWS CodeBuild (no local
# docker, no ~8 GB push from here). This script is the local fallback and writes the same tag.
# Usage: bash "$(python -c 'import gemma4_t4.sagemaker.bundle as b; print(b.BUILD_DIR)')/build.sh" REGION [BASE_TAG]
# Needs docker and the aws CLI, logged in to an account that can pull the AWS DLC registry, and the
# gemma4-t4 package installed (a wheel is enough): the build context is the bundle build-image uploads.
set -euo pipefail
region="${1:?usage: build.sh REGION [BASE_TAG]}"
tag="${2:-$(python -c "from gemma4_t4.sagemaker.image import resolve_dlc_tag; print(resolve_dlc_tag('$region').tag)")}"  # newest in the registry, else the recorded fallback
base="$(python -c "from gemma4_t4.sagemaker.image import vllm_image_uri; print(vllm_image_uri('$region', '$tag'))")"
account="$(aws sts get-caller-identity --query Account --output text)"
target="$(python -c "from gemma4_t4.sagemaker.image import fixed_image_tag, t4_image_uri; print(t4_image_uri('$account', '$region', fixed_image_tag('$tag')))")"
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
python -c "import sys; from gemma4_t4.sagemaker.bundle import write_build_context; write_build_context(sys.argv[1])" "$context"

aws ecr get-login-password --region "$region" | docker login --username AWS --password-stdin "${base%%/*}"
docker build -f "$context/docker/sagemaker-t4/Dockerfile" --build-arg "BASE_IMAGE=$base" -t "$target" "$context"
aws ecr describe-repositories --region "$region" --repository-names gemma4-t4-vllm >/dev/null 2>&1 \
  || aws ecr create-repository --region "$region" --repository-name gemma4-t4-vllm >/dev/null
aws ecr get-login-password --region "$region" | docker login --username AWS --password-stdin "${target%%/*}"
docker push "$target"
echo "deploy with: gemma4-t4 sagemaker deploy --region $region --image-uri $target"
