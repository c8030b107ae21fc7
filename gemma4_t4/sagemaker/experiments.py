"""What Parts 2-4 measure on ``TARGET=sagemaker``: each function deploys the endpoints it needs one
at a time (through :func:`gemma4_t4.sagemaker.matrix.run_configs`: budget-capped, every endpoint
deleted before it returns) and measures them through the one benchmark adapter.

- Part 2: :func:`bf16_vs_qat_on_t4` (Google's bf16 build and its QAT int4 build, same T4 endpoint type);
- Part 3: :func:`repack_on_endpoint` (your repacked folder uploaded to S3 and served from there);
- Part 4: :func:`t4_vs_l4` (the same model on ``ml.g4dn.xlarge`` and ``ml.g6.xlarge``), whose two
  run folders ``gemma4-t4 bench compare`` takes.

``workload`` is one workload (each entry's ``out_dir`` is then one results directory) or several
(``out_dir`` is then a folder of results directories, one per workload, which is what
``compare_suites`` reads). Each endpoint is measured under the name it serves (vLLM's
``--served-model-name``, not the Hugging Face id: the name its results are recorded, paired by
``compare_suites`` and matched to a published row under), with a local tokenizer for exact
prompt lengths (an endpoint has no ``/tokenize``): the model's Hugging Face id, or the uploaded
folder.

Offline the same functions run against :class:`~gemma4_t4.sagemaker.local.LocalAWS` started with
``runtime_backend`` (moto + the runtime stand-in in front of a real vLLM server).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.config import DeployConfig
from gemma4_t4.sagemaker.matrix import MatrixResult, endpoint_name, measure_endpoint, run_configs
from gemma4_t4.sagemaker.upload import upload_model_folder

T4 = "ml.g4dn.xlarge"
L4 = "ml.g6.xlarge"
DEFAULT_BUDGET_USD = 5.0


Workload = str | Sequence[str]


def _base(region: str, ttl_hours: float = 2.0, **overrides: Any) -> DeployConfig:
    return DeployConfig(region=region, ttl_hours=ttl_hours, **overrides)


def served_name(config: DeployConfig) -> str:
    """The model name the endpoint's vLLM serves (``SM_VLLM_SERVED_MODEL_NAME``)."""
    return config.container_env()["SM_VLLM_SERVED_MODEL_NAME"]


def instance_gpu(instance_type: str) -> str | None:
    """The :data:`gemma4_t4.hardware.PRICES` GPU key of a SageMaker instance type (prices $/Mtok)."""
    from gemma4_t4.hardware import PRICES

    price = PRICES.get(f"sagemaker:{instance_type}")
    return price.gpu if price else None


def measure_workloads(
    endpoint: str,
    region: str,
    out_dir: str | Path,
    *,
    model: str | None = None,
    workloads: Sequence[str] = ("decode",),
    workload_opts: Mapping[str, Mapping[str, Any]] | None = None,
    **opts: Any,
) -> dict[str, Any]:
    """Each workload in turn against ``sagemaker://REGION/ENDPOINT``, into ``out_dir/WORKLOAD``
    (a folder ``compare_suites`` reads). ``opts`` apply to every workload, ``workload_opts[w]``
    to ``w`` only. Returns {workload: BenchRun}."""
    runs = {}
    for workload in workloads:
        merged = {**opts, **dict((workload_opts or {}).get(workload, {}))}
        runs[workload] = measure_endpoint(
            endpoint, region, Path(out_dir) / workload, model=model, workload=workload, **merged
        )
    return runs


def _run(
    configs: list[DeployConfig],
    *,
    workload: Workload,
    budget_usd: float,
    out_dir: str | Path,
    measure_opts: Mapping[str, Any] | None,
    workload_opts: Mapping[str, Mapping[str, Any]] | None,
    tokenizer: Callable[[DeployConfig], str | None],
    measure: Callable[..., Any] | None = None,
    **run_kwargs: Any,
) -> MatrixResult:
    if measure is not None:  # a caller's own measurement: called as run_configs always calls it
        return run_configs(
            configs,
            budget_usd=budget_usd,
            out_dir=out_dir,
            measure=measure,
            measure_opts={"workload": workload, **(measure_opts or {})},
            **run_kwargs,
        )
    workloads = [workload] if isinstance(workload, str) else list(workload)
    if not workloads:
        raise Gemma4T4Error("no workload to measure", fix="pass workload='decode' or a list of workloads")
    by_name = {c.name: c for c in configs}

    def endpoint_measure(
        endpoint: str, region: str, entry_dir: str, *, model: str | None = None, **opts: Any
    ) -> Any:
        config = by_name[endpoint]
        opts = {"gpu": instance_gpu(config.instance_type), **opts}
        if tokenizer(config) and "tokenizer" not in opts:
            opts["tokenizer"] = tokenizer(config)
        name = served_name(config)
        if isinstance(workload, str):
            return measure_endpoint(endpoint, region, entry_dir, model=name, workload=workload, **opts)
        return measure_workloads(
            endpoint, region, entry_dir, model=name, workloads=workloads, workload_opts=workload_opts, **opts
        )

    return run_configs(
        configs,
        budget_usd=budget_usd,
        out_dir=out_dir,
        measure=endpoint_measure,
        measure_opts=dict(measure_opts or {}),
        **run_kwargs,
    )


def entry_runs(result: MatrixResult) -> list[Any]:
    """The measured runs of each entry, in order; refuses a result whose entries did not all
    measure (naming each failure), so a notebook never reports half a comparison."""
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
    return [e.result for e in result.entries]


def result_rows(result: MatrixResult) -> list[dict[str, Any]]:
    """One display row per endpoint of a run: what it served, on what, its status, cost, results."""
    return [
        {
            "endpoint": e.endpoint,
            "model": e.model_id,
            "instance": e.instance_type,
            "status": e.status,
            "estimate $": e.estimate_usd,
            "cost $": e.cost_usd,
            "seconds": e.elapsed_s,
            "results": e.out_dir,
            "error": e.error,
        }
        for e in result.entries
    ]


# every endpoint a part creates is named with its prefix (what the clean-up check looks for)
PART_PREFIX = {2: "g4-p2-", 3: "g4-p3-", 4: "g4-p4-"}


def leftover_endpoints(region: str, part: int) -> list[str]:
    """Endpoints of Part ``part`` (2-4) still in ``region``: the clean-up check, expect []. Works
    whether or not the part's run finished (it lists the region, not the run's record)."""
    from gemma4_t4.sagemaker.ops import list_endpoints

    if part not in PART_PREFIX:
        raise Gemma4T4Error(f"part {part!r} creates no endpoints", fix="pass part=2, 3 or 4")
    return sorted(e.name for e in list_endpoints([region]) if e.name.startswith(PART_PREFIX[part]))


def bf16_vs_qat_on_t4(
    region: str = "us-east-2",
    *,
    variant: str = "e2b",
    out_dir: str | Path = "results/02-sagemaker",
    budget_usd: float = DEFAULT_BUDGET_USD,
    workload: Workload = "decode",
    measure_opts: Mapping[str, Any] | None = None,
    workload_opts: Mapping[str, Mapping[str, Any]] | None = None,
    config: Mapping[str, Any] | None = None,
    **run_kwargs: Any,
) -> MatrixResult:
    """Part 2 on AWS: Google's bf16 and QAT int4 builds of ``variant``, each on its own T4 endpoint
    (entries in that order; each run labelled with its build)."""
    from gemma4_t4.models import get_variant

    hub = get_variant(variant).hub
    builds = [("bf16", hub.bf16), ("qat", hub.qat_w4a16_ct)]
    configs = [
        dataclasses.replace(
            _base(region, **(config or {})), model_id=model, name=endpoint_name(f"g4-p2-{label}", variant)
        )
        for label, model in builds
        if model
    ]
    return _run(
        configs,
        workload=workload,
        budget_usd=budget_usd,
        out_dir=out_dir,
        measure_opts=measure_opts,
        workload_opts=workload_opts,
        tokenizer=lambda c: c.model_id,
        **run_kwargs,
    )


def repack_on_endpoint(
    model_dir: str | Path,
    region: str = "us-east-2",
    *,
    out_dir: str | Path = "results/03-sagemaker",
    budget_usd: float = DEFAULT_BUDGET_USD,
    instance_type: str = T4,
    workload: Workload = "answers",
    bucket: str | None = None,
    measure_opts: Mapping[str, Any] | None = None,
    workload_opts: Mapping[str, Mapping[str, Any]] | None = None,
    config: Mapping[str, Any] | None = None,
    progress: bool = True,
    **run_kwargs: Any,
) -> tuple[Any, MatrixResult]:
    """Part 3 on AWS: upload the repacked folder (nothing twice) and serve it from S3 on a T4."""
    upload = upload_model_folder(model_dir, region, bucket=bucket, progress=progress)
    deploy_config = _base(
        region,
        **{**(config or {}), "instance_type": instance_type},
        model_data_s3_uri=upload.s3_uri,
        served_model_name=Path(model_dir).name.replace(" ", "-")[:64] or "repack",
        name=endpoint_name("g4-p3", Path(model_dir).name or "repack"),
    )
    result = _run(
        [deploy_config],
        workload=workload,
        budget_usd=budget_usd,
        out_dir=out_dir,
        measure_opts=measure_opts,
        workload_opts=workload_opts,
        tokenizer=lambda c: str(model_dir),
        **run_kwargs,
    )
    return upload, result


def t4_vs_l4(
    model_id: str = "google/gemma-4-E2B-it",
    region: str = "us-east-2",
    *,
    out_dir: str | Path = "results/04-sagemaker",
    budget_usd: float = DEFAULT_BUDGET_USD,
    workload: Workload = "decode",
    measure_opts: Mapping[str, Any] | None = None,
    workload_opts: Mapping[str, Mapping[str, Any]] | None = None,
    config: Mapping[str, Any] | None = None,
    served_model_name: str | None = None,
    tokenizer: str | None = None,
    **run_kwargs: Any,
) -> MatrixResult:
    """Part 4 on AWS: the same model on a T4 and an L4 endpoint, in turn; entries[0].out_dir (T4)
    and entries[1].out_dir (L4) feed ``gemma4-t4 bench compare T4_RUN L4_RUN``
    (:func:`gemma4_t4.bench.compare.compare_suites`). ``tokenizer``: a local copy of the model's
    tokenizer (default: its Hugging Face id)."""
    configs = [
        dataclasses.replace(
            _base(region, **(config or {})),
            model_id=model_id,
            instance_type=instance,
            served_model_name=served_model_name,
            name=endpoint_name(f"g4-p4-{label}", model_id),
        )
        for label, instance in (("t4", T4), ("l4", L4))
    ]
    return _run(
        configs,
        workload=workload,
        budget_usd=budget_usd,
        out_dir=out_dir,
        measure_opts=measure_opts,
        workload_opts=workload_opts,
        tokenizer=lambda c: tokenizer or c.model_id,
        **run_kwargs,
    )
