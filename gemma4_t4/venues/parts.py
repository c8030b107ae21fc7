"""What the notebooks' ``TARGET=sagemaker`` steps share: the instance each GPU is deployed on, the
name of every endpoint a part creates, and the clean-up check that lists what a part left."""

from __future__ import annotations

import re

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.ops import list_endpoints

INSTANCE_OF_GPU = {"t4": "ml.g4dn.xlarge", "l4": "ml.g6.xlarge"}  # the instance a part deploys for each GPU


# every endpoint a part creates is named with its prefix (what the clean-up check looks for)
PART_PREFIX = {2: "g4-p2-", 3: "g4-p3-", 4: "g4-p4-"}


def endpoint_name(prefix: str, model_id: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", model_id.rsplit("/", 1)[-1].lower()).strip("-")
    return f"{prefix}-{slug}"[:63].rstrip("-")


def leftover_endpoints(region: str, part: int) -> list[str]:
    """Endpoints of Part ``part`` (2-4) still in ``region``: the clean-up check, expect []. Works
    whether or not the part's run finished (it lists the region, not the run's record)."""
    if part not in PART_PREFIX:
        raise Gemma4T4Error(f"part {part!r} creates no endpoints", fix="pass part=2, 3 or 4")
    return sorted(e.name for e in list_endpoints([region]) if e.name.startswith(PART_PREFIX[part]))
