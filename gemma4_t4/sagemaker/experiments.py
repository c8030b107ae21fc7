"""What Parts 2-4 measure on ``TARGET=sagemaker``: each function deploys the endpoints it needs one
at a time (through :func:`gemma4_t4.sagemaker.matrix.run_configs`: each endpoint an
:class:`~gemma4_t4.serving.endpoint.Endpoint` under one :class:`~gemma4_t4.serving.endpoint.Budget`, deleted before
the next is deployed, whatever happens) and runs the caller's workload specs on each.

- Part 2: :func:`bf16_vs_qat_on_t4` (Google's bf16 build and its QAT int4 build, same T4 endpoint type);
- Part 3: :func:`repack_on_endpoint` (your repacked folder uploaded to S3 and served from there);
- Part 4: :func:`t4_vs_l4` (the same model on ``ml.g4dn.xlarge`` and ``ml.g6.xlarge``), whose two
  run folders ``gemma4-t4 bench compare`` takes.

``specs`` maps a workload label to a :mod:`gemma4_t4.bench.specs` spec, e.g. ``{"decode":
DecodeSpec(concurrency=[1, 8]), "ttft": TTFTSpec(input_lens=[128, 1024])}``; each entry's
``out_dir`` is a folder of results directories, one per label (what ``compare_suites`` reads), and
its ``runs`` the runs by label. ``how`` (an :class:`~gemma4_t4.sagemaker.matrix.EndpointHandling`)
says how every endpoint is deployed and measured: client, polling, budget watch, progress, overwrite,
request timeout. Specs, labels, budget and deploy settings are all checked before anything is
uploaded or deployed. Each endpoint is measured under the name it serves (vLLM's
``--served-model-name``, not the Hugging Face id: the name its results are recorded, paired by
``compare_suites`` and matched to a published row under), with a local tokenizer for exact prompt
lengths (an endpoint has no ``/tokenize``): the model's Hugging Face id, or the uploaded folder.

Offline the same functions run against :class:`~gemma4_t4.sagemaker.local.LocalAWS` started with
``runtime_backend`` (moto + the runtime stand-in in front of a real vLLM server).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gemma4_t4.bench.specs import WorkloadSpec
from gemma4_t4.catalog.hardware import sagemaker_price
from gemma4_t4.catalog.models import get_variant
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.config import DeployConfig
from gemma4_t4.sagemaker.matrix import (
    EndpointHandling,
    MatrixResult,
    Measure,
    check_budget,
    check_specs,
    configs_plan,
    endpoint_name,
    run_configs,
)
from gemma4_t4.sagemaker.ops import list_endpoints
from gemma4_t4.sagemaker.upload import UploadResult, upload_model_folder
from gemma4_t4.serving.endpoint import Budget

if TYPE_CHECKING:
    from gemma4_t4.bench.results import BenchRun

T4 = "ml.g4dn.xlarge"
L4 = "ml.g6.xlarge"
INSTANCE_OF_GPU = {"t4": T4, "l4": L4}  # the instance a part deploys for each GPU
DEFAULT_MAX_NUM_SEQS = 4
DEFAULT_TTL_HOURS = 2.0  # `reap` deletes an endpoint a killed run left after this


def served_name(config: DeployConfig) -> str:
    """The model name the endpoint's vLLM serves (``SM_VLLM_SERVED_MODEL_NAME``)."""
    return config.container_env()["SM_VLLM_SERVED_MODEL_NAME"]


def instance_gpu(instance_type: str) -> str | None:
    """The :data:`gemma4_t4.catalog.hardware.PRICES` GPU key of a SageMaker instance type (prices $/Mtok)."""
    price = sagemaker_price(instance_type)
    return price.gpu if price else None


def _checked_before_deploying(
    specs: Mapping[str, WorkloadSpec], budget: Budget | float, configs: list[DeployConfig]
) -> None:
    # everything a billed deploy (or an upload) would otherwise find wrong only later
    check_specs(specs)
    if not isinstance(budget, Budget):
        check_budget(budget)
    configs_plan(configs)


def entry_runs(result: MatrixResult) -> list[dict[str, BenchRun]]:
    """The measured runs of each entry (workload label -> run), in order; refuses a result whose
    entries did not all measure (naming each failure), so a notebook never reports half a
    comparison."""
    failed = [
        f"{e.endpoint}: {e.status}" + (f" ({e.error})" if e.error else "")
        for e in result.entries
        if e.status != "measured"
    ]
    if failed:
        raise Gemma4T4Error(
            "not every endpoint was measured: "
            + "; ".join(failed)
            + (f"; {result.stopped_reason}" if result.stopped_reason else ""),
            fix="read the error (gemma4-t4 sagemaker logs NAME shows an endpoint's log), raise the budget "
            "if it stopped there, and run the cell again (every endpoint was deleted)",
        )
    return [e.runs for e in result.entries]


@dataclass(frozen=True)
class ResultRow:
    """One display row per endpoint of a run: what it served, on what, its status, cost, results."""

    endpoint: str
    model: str
    instance: str
    status: str
    estimate_usd: float
    cost_usd: float
    seconds: float
    results: str | None
    error: str | None


def result_rows(result: MatrixResult) -> list[ResultRow]:
    """One :class:`ResultRow` per endpoint of a run (``nb.show_table`` shows them)."""
    return [
        ResultRow(
            endpoint=e.endpoint,
            model=e.model_id,
            instance=e.instance_type,
            status=e.status,
            estimate_usd=e.estimate_usd,
            cost_usd=e.cost_usd,
            seconds=e.elapsed_s,
            results=e.out_dir,
            error=e.error,
        )
        for e in result.entries
    ]


# every endpoint a part creates is named with its prefix (what the clean-up check looks for)
PART_PREFIX = {2: "g4-p2-", 3: "g4-p3-", 4: "g4-p4-"}


def leftover_endpoints(region: str, part: int) -> list[str]:
    """Endpoints of Part ``part`` (2-4) still in ``region``: the clean-up check, expect []. Works
    whether or not the part's run finished (it lists the region, not the run's record)."""
    if part not in PART_PREFIX:
        raise Gemma4T4Error(f"part {part!r} creates no endpoints", fix="pass part=2, 3 or 4")
    return sorted(e.name for e in list_endpoints([region]) if e.name.startswith(PART_PREFIX[part]))


def bf16_vs_qat_on_t4(
    region: str = "us-east-2",
    *,
    variant: str = "e2b",
    specs: Mapping[str, WorkloadSpec],
    budget: Budget | float,
    out_dir: str | Path = "results/02-sagemaker",
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    ttl_hours: float = DEFAULT_TTL_HOURS,
    served_model_name: str | None = None,
    tokenizer: str | None = None,
    measure: Measure | None = None,
    how: EndpointHandling = EndpointHandling(),
) -> MatrixResult:
    """Part 2 on AWS: Google's bf16 and QAT int4 builds of ``variant``, each on its own T4 endpoint
    (entries in that order). ``tokenizer``: a local tokenizer for both (default: each build's id)."""
    hub = get_variant(variant).hub
    builds = [("bf16", hub.bf16), ("qat", hub.qat_w4a16_ct)]
    configs = [
        DeployConfig(
            region=region,
            instance_type=T4,
            model_id=model,
            name=endpoint_name(f"g4-p2-{label}", variant),
            max_num_seqs=max_num_seqs,
            ttl_hours=ttl_hours,
            served_model_name=served_model_name,
        )
        for label, model in builds
        if model
    ]
    _checked_before_deploying(specs, budget, configs)
    return run_configs(
        configs, specs, budget=budget, out_dir=out_dir, measure=measure, tokenizer=tokenizer, how=how
    )


def repack_on_endpoint(
    model_dir: str | Path,
    region: str = "us-east-2",
    *,
    specs: Mapping[str, WorkloadSpec],
    budget: Budget | float,
    out_dir: str | Path = "results/03-sagemaker",
    instance_type: str = T4,
    bucket: str | None = None,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    ttl_hours: float = DEFAULT_TTL_HOURS,
    measure: Measure | None = None,
    how: EndpointHandling = EndpointHandling(),
) -> tuple[UploadResult, MatrixResult]:
    """Part 3 on AWS: upload the repacked folder (nothing twice) and serve it from S3 on a T4; the
    folder is the tokenizer. Specs and settings are checked before the upload."""
    folder_name = Path(model_dir).name
    config = DeployConfig(
        region=region,
        instance_type=instance_type,
        model_data_s3_uri="s3://checked-before-upload/",  # the real URI once uploaded
        served_model_name=folder_name.replace(" ", "-")[:64] or "repack",
        name=endpoint_name("g4-p3", folder_name or "repack"),
        max_num_seqs=max_num_seqs,
        ttl_hours=ttl_hours,
    )
    _checked_before_deploying(specs, budget, [config])
    upload = upload_model_folder(model_dir, region, bucket=bucket, progress=how.progress)
    result = run_configs(
        [dataclasses.replace(config, model_data_s3_uri=upload.s3_uri)],
        specs,
        budget=budget,
        out_dir=out_dir,
        measure=measure,
        tokenizer=str(model_dir),
        how=how,
    )
    return upload, result


def t4_vs_l4(
    model_id: str = "google/gemma-4-E2B-it",
    region: str = "us-east-2",
    *,
    specs: Mapping[str, WorkloadSpec],
    budget: Budget | float,
    out_dir: str | Path = "results/04-sagemaker",
    served_model_name: str | None = None,
    tokenizer: str | None = None,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    ttl_hours: float = DEFAULT_TTL_HOURS,
    measure: Measure | None = None,
    how: EndpointHandling = EndpointHandling(),
) -> MatrixResult:
    """Part 4 on AWS: the same model on a T4 and an L4 endpoint, in turn; entries[0].out_dir (T4)
    and entries[1].out_dir (L4) feed ``gemma4-t4 bench compare T4_RUN L4_RUN``
    (:func:`gemma4_t4.bench.compare.compare_suites`). ``tokenizer``: a local copy of the model's
    tokenizer (default: its Hugging Face id)."""
    configs = [
        DeployConfig(
            region=region,
            model_id=model_id,
            instance_type=instance,
            served_model_name=served_model_name,
            name=endpoint_name(f"g4-p4-{label}", model_id),
            max_num_seqs=max_num_seqs,
            ttl_hours=ttl_hours,
        )
        for label, instance in (("t4", T4), ("l4", L4))
    ]
    _checked_before_deploying(specs, budget, configs)
    return run_configs(
        configs, specs, budget=budget, out_dir=out_dir, measure=measure, tokenizer=tokenizer, how=how
    )
