"""The parameters cell of each notebook part: every value's rule (what it must be, an accepted value as
papermill's ``-p`` writes it), checked before anything is served or billed."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gemma4_t4.bench.registry import notebook_params
from gemma4_t4.catalog.models import VARIANTS, get_variant
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.venues.endpoint import MAX_BUDGET_USD
from gemma4_t4.venues.runtime import AUTO, TARGETS

# Parts 2 and 4 report their figures at one stream (Part 2's QAT/bf16 ratio is per stream at c=1, as
# published): a CONCURRENCY without 1 gets it added, so `-p CONCURRENCY 4` measures [1, 4].
NEEDS_ONE_STREAM = (2, 4)


@dataclass(frozen=True)
class Param:
    """A parameters-cell value's rule: its ``kind``, an accepted value as papermill's ``-p`` writes it, and
    what an accepted value is (the refusal's words)."""

    kind: Literal["target", "size", "path", "flag", "money", "aws", "choice", "answers", "workload"]
    example: str
    what: str
    choices: tuple[str, ...] = ()
    field: str = ""  # "aws": the DeployConfig field whose rule it follows


def _params(targets: tuple[str, ...], sizes: tuple[str, ...], **extra: Param) -> dict[str, Param]:
    folder, built = Param("path", "gemma4_t4_work", "a folder name"), " with a QAT int4 build" if sizes == _QAT_SIZES else ""
    return {"TARGET": Param("target", targets[0], f"one of {', '.join((AUTO, *targets))}", (AUTO, *targets)),
            "OUT_DIR": folder, "WORK_DIR": folder, "CLEANUP": Param("flag", "True", "True or False (papermill's bools)"),
            **({"MODEL_SIZE": Param("size", sizes[0], f"a size{built}: {', '.join(sizes)}", sizes)} if sizes else {}),
            **extra}


_REGION = Param("aws", "us-east-2", "an AWS region SageMaker serves in", field="region")
_AWS = {"REGION": _REGION, "BUDGET_USD": Param("money", "5.0", f"a positive number of US dollars, at most {MAX_BUDGET_USD:,.0f}")}
_WHOLE = "a whole number of at least 1"
_WORKLOAD = {"CONCURRENCY": Param("workload", '"[1, 8]"', f"a list of concurrent streams, each {_WHOLE}"),
             "INPUT_LEN": Param("workload", "512", _WHOLE), "OUTPUT_LEN": Param("workload", "128", _WHOLE),
             "NUM_PROMPTS": Param("workload", "8", _WHOLE)}
_QAT_SIZES = tuple(k for k, v in VARIANTS.items() if v.hub.qat_w4a16_ct)  # Parts 2 and 4 serve the QAT build
PART_PARAMS: dict[int, dict[str, Param]] = {  # every parameter of each part's parameters cell, checked first
    1: _params(("cpu", "sagemaker", "t4"), (), PREFERRED_REGION=_REGION,
               ENDPOINT_NAME=Param("aws", "gemma4-t4-part1", "a SageMaker endpoint name", field="name"),
               MODEL_ID=Param("aws", "google/gemma-4-E2B-it", "a Hugging Face model id", field="model_id"),
               INSTANCE_TYPE=Param("aws", "ml.g4dn.xlarge", "a SageMaker GPU instance type", field="instance_type"),
               TTL_HOURS=Param("aws", "2.0", "a lifetime in hours, above 0 and at most 168", field="ttl_hours")),
    2: _params(TARGETS, _QAT_SIZES, **_WORKLOAD, **_AWS),
    3: _params(TARGETS, tuple(VARIANTS), **_AWS, SCALE_DTYPE=Param("choice", "fp16", "fp16 or bf16", ("fp16", "bf16"))),
    4: _params(TARGETS, _QAT_SIZES, **_WORKLOAD, **_AWS,
               TTFT_INPUT_LENS=Param("workload", '"[512, 1024, 2048, 4096]"', f"a list of prompt lengths, each {_WHOLE}"),
               REFERENCE_ANSWERS=Param("answers", '""', 'empty (""), or the folder of an earlier answers run')),
}

# The workload parameters Parts 2 and 4 declare (their "workload" rules above). What a parameter left at None
# takes on each target, and how a given value is read, belong to the workload class that declares it
# (gemma4_t4.bench.specs: DecodeSpec.venues, TTFTSpec.venues); params/t4.yaml repeats the T4 values
# for `gemma4-t4 run` (a test keeps them equal).
PARAMETERS = {part: tuple(name for name, rule in PART_PARAMS[part].items() if rule.kind == "workload") for part in (2, 4)}


def size_key(value: str) -> str | None:
    """The catalog's key of a size or hub id ("E2B", "google/gemma-4-E2B-it" -> "e2b"); None if it names none."""
    try:
        return get_variant(value).key
    except Gemma4T4Error:
        return None


def is_real_number(value: object) -> bool:
    """True for a finite, strictly positive number (what every measured figure and a budget must be)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def refuse_parameter(name: str, value: object, rule: Param) -> Gemma4T4Error:
    """The one sentence a wrong parameter gets: its name and value, what it must be, an accepted value."""
    return Gemma4T4Error(f"{name}={value!r} is not {rule.what}",
                         fix=f"give e.g. -p {name} {rule.example} to papermill (the same value in the parameters cell)")


def accepted(name: str, value: object, rule: Param) -> bool:
    """Whether ``value`` passes ``rule`` (a workload value as its workload class reads it)."""
    text = str(value).strip().lower() if isinstance(value, str | os.PathLike) else None
    if rule.kind == "choice":  # passed on as written (SCALE_DTYPE)
        return value in rule.choices
    if rule.kind in ("target", "size"):
        return text is not None and (text in rule.choices or (rule.kind == "size" and size_key(text) in rule.choices))
    if rule.kind == "path":
        return bool(text)
    if rule.kind == "answers":
        return value == "" or (bool(text) and Path(str(value)).is_dir())
    if rule.kind == "flag":
        return isinstance(value, bool)
    if rule.kind == "money":
        return is_real_number(value) and value <= MAX_BUDGET_USD  # type: ignore[operator]
    if rule.kind == "aws":
        # lazy: the SageMaker deploy rules load only to check the AWS parameters
        from gemma4_t4.sagemaker.config import DeployConfig

        try:
            DeployConfig(**{rule.field: value})
        except (Gemma4T4Error, TypeError, ValueError):
            return False
        return rule.field != "ttl_hours" or is_real_number(value)  # a number, not text pydantic would read as one
    try:
        read = notebook_params("cpu", **{name: value})[name]  # a given value is read alike on every venue
    except Gemma4T4Error:
        return False
    return not isinstance(value, bool) and all(isinstance(v, int) and v >= 1 for v in (read if isinstance(read, list) else [read]))
