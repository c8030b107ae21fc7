"""What Parts 2-4 measure on ``TARGET=sagemaker``: each function deploys the endpoints it needs one
at a time (through :func:`gemma4_t4.sagemaker.matrix.run_configs`: budget-capped, every endpoint
deleted before it returns) and measures them through the one benchmark adapter.

- Part 2: :func:`bf16_vs_qat_on_t4` (Google's bf16 build and its QAT int4 build, same T4 endpoint type);
- Part 3: :func:`repack_on_endpoint` (your repacked folder uploaded to S3 and served from there);
- Part 4: :func:`t4_vs_l4` (the same model on ``ml.g4dn.xlarge`` and ``ml.g6.xlarge``), whose two
  run folders ``gemma4-t4 bench compare`` takes.

On ``TARGET=cpu`` the same functions run against :class:`~gemma4_t4.sagemaker.local.LocalAWS`
started with ``runtime_backend`` (moto + the runtime stand-in in front of a real vLLM server).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gemma4_t4.sagemaker.config import DeployConfig
from gemma4_t4.sagemaker.matrix import MatrixResult, endpoint_name, run_configs
from gemma4_t4.sagemaker.upload import upload_model_folder

T4 = "ml.g4dn.xlarge"
L4 = "ml.g6.xlarge"
DEFAULT_BUDGET_USD = 5.0


def _base(region: str, ttl_hours: float = 2.0, **overrides: Any) -> DeployConfig:
    return DeployConfig(region=region, ttl_hours=ttl_hours, **overrides)


def bf16_vs_qat_on_t4(
    region: str = "us-east-2",
    *,
    variant: str = "e2b",
    out_dir: str | Path = "results/02-sagemaker",
    budget_usd: float = DEFAULT_BUDGET_USD,
    workload: str = "decode",
    measure_opts: dict[str, Any] | None = None,
    **run_kwargs: Any,
) -> MatrixResult:
    """Part 2 on AWS: Google's bf16 and QAT int4 builds of ``variant``, each on its own T4 endpoint."""
    from gemma4_t4.models import get_variant

    hub = get_variant(variant).hub
    builds = [("bf16", hub.bf16), ("qat", hub.qat_w4a16_ct)]
    configs = [
        dataclasses.replace(_base(region), model_id=model, name=endpoint_name(f"g4-p2-{label}", variant))
        for label, model in builds
        if model
    ]
    return run_configs(
        configs,
        budget_usd=budget_usd,
        out_dir=out_dir,
        measure_opts={"workload": workload, **(measure_opts or {})},
        **run_kwargs,
    )


def repack_on_endpoint(
    model_dir: str | Path,
    region: str = "us-east-2",
    *,
    out_dir: str | Path = "results/03-sagemaker",
    budget_usd: float = DEFAULT_BUDGET_USD,
    instance_type: str = T4,
    workload: str = "answers",
    bucket: str | None = None,
    measure_opts: dict[str, Any] | None = None,
    progress: bool = True,
    **run_kwargs: Any,
) -> tuple[Any, MatrixResult]:
    """Part 3 on AWS: upload the repacked folder (nothing twice) and serve it from S3 on a T4."""
    upload = upload_model_folder(model_dir, region, bucket=bucket, progress=progress)
    config = _base(
        region,
        instance_type=instance_type,
        model_data_s3_uri=upload.s3_uri,
        served_model_name=Path(model_dir).name.replace(" ", "-")[:64] or "repack",
        name=endpoint_name("g4-p3", Path(model_dir).name or "repack"),
    )
    result = run_configs(
        [config],
        budget_usd=budget_usd,
        out_dir=out_dir,
        measure_opts={"workload": workload, **(measure_opts or {})},
        **run_kwargs,
    )
    return upload, result


def t4_vs_l4(
    model_id: str = "google/gemma-4-E2B-it",
    region: str = "us-east-2",
    *,
    out_dir: str | Path = "results/04-sagemaker",
    budget_usd: float = DEFAULT_BUDGET_USD,
    workload: str = "decode",
    measure_opts: dict[str, Any] | None = None,
    **run_kwargs: Any,
) -> MatrixResult:
    """Part 4 on AWS: the same model on a T4 and an L4 endpoint, in turn; entries[i].out_dir feed
    ``gemma4-t4 bench compare T4_RUN L4_RUN``."""
    configs = [
        dataclasses.replace(
            _base(region),
            model_id=model_id,
            instance_type=instance,
            name=endpoint_name(f"g4-p4-{label}", model_id),
        )
        for label, instance in (("t4", T4), ("l4", L4))
    ]
    return run_configs(
        configs,
        budget_usd=budget_usd,
        out_dir=out_dir,
        measure_opts={"workload": workload, **(measure_opts or {})},
        **run_kwargs,
    )
