"""What a notebook part serves with: the context of its endpoint and, on ``TARGET=sagemaker``, the
instance each GPU is deployed on, the name of every endpoint a part creates, the endpoint itself and
the clean-up check that lists what a part left; and what Parts 2 and 4 share: their study's base and
the check that refuses a run which measured nothing."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gemma4_t4.catalog.models import VARIANTS
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.venues.endpoint import Budget, Endpoint
from gemma4_t4.venues.parameters import is_real_number, size_key
from gemma4_t4.venues.runtime import check_target

if TYPE_CHECKING:
    from gemma4_t4.bench.results import BenchRun, DecodeSpeed
    from gemma4_t4.bench.specs import WorkloadSpec

# what a refused figure tells the learner to do
FIX = "run the notebook again from the top; if it repeats, see docs/benchmarks.md"

# The context a part's server gets unless its workloads need more: the tiny CPU model's runs are short;
# on a GPU 8,192 tokens, the context check_model_size's fit check judges a size at.
CPU_CONTEXT = 2048
GPU_CONTEXT = 8192

INSTANCE_OF_GPU = {"t4": "ml.g4dn.xlarge", "l4": "ml.g6.xlarge"}  # the instance a part deploys for each GPU


# every endpoint a part creates is named with its prefix (what the clean-up check looks for)
PART_PREFIX = {2: "g4-p2-", 3: "g4-p3-", 4: "g4-p4-"}


def endpoint_name(prefix: str, model_id: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", model_id.rsplit("/", 1)[-1].lower()).strip("-")
    return f"{prefix}-{slug}"[:63].rstrip("-")


def leftover_endpoints(region: str, part: int) -> list[str]:
    """Endpoints of Part ``part`` (2-4) still in ``region``: the clean-up check, expect []. Works
    whether or not the part's run finished (it lists the region, not the run's record)."""
    # lazy: the SageMaker modules (boto3) load only on TARGET=sagemaker
    from gemma4_t4.sagemaker.ops import list_endpoints

    if part not in PART_PREFIX:
        raise Gemma4T4Error(f"part {part!r} creates no endpoints", fix="pass part=2, 3 or 4")
    return sorted(e.name for e in list_endpoints([region]) if e.name.startswith(PART_PREFIX[part]))


def refuse_while_billing(left: Sequence[str]) -> None:
    """Refuse to end a part while one of its SageMaker endpoints still bills (each part's clean-up check)."""
    if left:
        raise Gemma4T4Error(f"still billing: {', '.join(left)}", fix="delete each with: gemma4-t4 sagemaker delete NAME --yes")


@dataclass
class PartStudy:
    """A part's run: the target, model size, the GPU its figures are read against and the USD budget its
    billed endpoints share (set up here so no cell handles money)."""

    target: str
    model_size: str
    gpu: str
    budget: Budget  # BUDGET_USD, shared by the part's billed endpoints

    clean_up = staticmethod(refuse_while_billing)


def refuse_unmeasured(runs: Sequence[BenchRun], speeds: Mapping[str, DecodeSpeed], concurrency: Sequence[int],
                      figures: Mapping[str, object], budget: Budget) -> None:
    """Refuse, in one sentence naming it, a run that did not complete, a decode run measured at other
    concurrencies than asked for, a figure (its ``speeds`` and ``figures``) that is not a positive number,
    or endpoints that spent more than the budget."""
    for run in runs:
        if not run.ok or run.failed:
            raise Gemma4T4Error(f"the {run.dir.name} run did not complete ({run.failed} failed requests): "
                                "its figures measure nothing", fix=FIX)
    measured = dict(figures)
    for label, speed in speeds.items():
        if set(speed.output_tok_s) != set(concurrency):
            raise Gemma4T4Error(f"{label} measured c={sorted(speed.output_tok_s)}, not the CONCURRENCY "
                                f"{list(concurrency)} asked for", fix=FIX)
        for what, values in (("output tok/s", speed.output_tok_s), ("E2EL ms", speed.e2el_ms),
                             ("per-stream tok/s", speed.per_stream or {})):
            measured |= {f"{label} {what} at c={c}": v for c, v in values.items()}
    for name, value in measured.items():
        if not is_real_number(value):
            raise Gemma4T4Error(f"{name} is {value!r}: a measured figure must be a positive number", fix=FIX)
    if budget.spent_usd > budget.usd:
        raise Gemma4T4Error(f"the endpoints spent ${budget.spent_usd:.2f}, over BUDGET_USD ${budget.usd:.2f}",
                            fix="delete what is left: gemma4-t4 sagemaker delete NAME --yes")


def context_for(target: str, model: str | Path, serves: Sequence[WorkloadSpec] = (),
                max_model_len: int | None = None) -> int:
    """The context an endpoint serves ``serves`` with: ``max_model_len``, else the target's (2,048 tokens on
    the CPU default, 8,192 on a GPU: the context the fit check judged), raised to the longest prompt plus
    output the workloads send; refused where that exceeds ``max_model_len`` or the model's positions."""
    needed = max((max(s.prompt_lens(), default=0) + s.longest_output() for s in serves), default=0)
    limit = model_positions(model)
    wanted = max(CPU_CONTEXT if check_target(target) == "cpu" else GPU_CONTEXT, needed)
    context = max_model_len or (min(wanted, limit) if limit else wanted)
    if needed > context:
        held = f"max_model_len={context}" if max_model_len else f"the {limit} positions {Path(str(model)).name} holds"
        raise Gemma4T4Error(f"the workloads send up to {needed} tokens (prompt + output), more than {held}",
                            fix=f"shorten INPUT_LEN or TTFT_INPUT_LENS to fit {context} tokens with the output")
    return context


def model_positions(model: str | Path) -> int | None:
    """The positions ``model`` holds: a local folder's config.json, else the catalog's size; None if unknown."""
    config = Path(model) / "config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        return (data.get("text_config") or {}).get("max_position_embeddings") or data.get("max_position_embeddings")
    size = size_key(str(model))
    return VARIANTS[size].max_position_embeddings if size else None


def sagemaker_endpoint(model: str | Path, *, name: str, part: int | None, region: str, budget: Budget | None,
                       gpu: str, max_num_seqs: int, max_model_len: int, poll_s: float) -> Endpoint:
    """A billed endpoint serving ``model`` (a local folder is uploaded to S3 first) on ``gpu``'s instance."""
    # lazy: the SageMaker modules (deploy, S3 upload) load only on TARGET=sagemaker
    from gemma4_t4.sagemaker.config import DeployConfig
    from gemma4_t4.sagemaker.cost import usd

    if gpu not in INSTANCE_OF_GPU:
        raise Gemma4T4Error(f"no SageMaker instance for gpu={gpu!r}", fix=f"use one of {', '.join(INSTANCE_OF_GPU)}")
    folder = Path(model)
    # a local build (Part 3's repack) is served from S3 under its folder's name, checked before any upload
    local = folder.is_dir()
    config = DeployConfig(
        region=region, instance_type=INSTANCE_OF_GPU[gpu], model_id=folder.name if local else str(model),
        served_model_name=name, max_num_seqs=max_num_seqs, max_model_len=max_model_len, ttl_hours=2.0,
        name=endpoint_name(PART_PREFIX.get(part or 0, "g4-nb-") + gpu, name),
    )
    tokenizer = None
    if local:
        # lazy: the SageMaker modules (deploy, S3 upload) load only on TARGET=sagemaker
        from gemma4_t4.sagemaker.upload import upload_model_folder

        upload = upload_model_folder(folder, region)
        print(f"{folder.name}: {len(upload.files)} files, {upload.total_bytes / 1e9:.2f} GB at {upload.s3_uri}")
        config = config.replaced(model_data_s3_uri=upload.s3_uri)
        tokenizer = str(folder)
    started = time.monotonic()
    served = Endpoint.sagemaker(config, budget=budget, tokenizer=tokenizer, poll_s=poll_s)
    print(f"{config.instance_type} endpoint {config.name} InService in {time.monotonic() - started:.0f} s, "
          f"serving {served.served_name} ({served.usd_per_hour:.2f} $/h; budget left: "
          + (f"{usd(budget.left_usd)})" if budget else "none set)"))
    return served
