"""GPUs and hourly prices: the one table the roofline, the fit calculator, the benchmark's
cost figures and the SageMaker cost guard all read.

Figures are vendor specifications or published measurements; ``source`` says which.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemma4_t4.errors import Gemma4T4Error


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    compute_capability: tuple[int, int]
    memory_gb: float  # GB = 1e9 bytes, as sold
    usable_memory_gib: float  # what torch reports as total on a typical host
    bandwidth_gb_s: float  # spec
    measured_bandwidth_gb_s: float | None  # stream-measured where published
    smem_per_block_optin: int  # bytes; the Turing attention fix keys on this
    bf16: bool
    fp8: bool
    tdp_w: int
    source: str

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


GPUS: dict[str, GPU] = {
    g.key: g
    for g in [
        GPU("t4", "NVIDIA T4", (7, 5), 16.0, 14.56, 320.0, 277.0, 65_536, False, False, 70,
            "NVIDIA T4 datasheet; 277 GB/s stream figure published by the series"),
        GPU("l4", "NVIDIA L4", (8, 9), 24.0, 22.03, 300.0, None, 101_376, True, True, 72,
            "NVIDIA L4 datasheet"),
        GPU("a10g", "NVIDIA A10G", (8, 6), 24.0, 22.06, 600.0, None, 101_376, True, False, 300,
            "AWS g5 instance documentation"),
        GPU("a100-40gb", "NVIDIA A100 40GB", (8, 0), 40.0, 39.4, 1555.0, None, 166_912, True, False, 400,
            "NVIDIA A100 datasheet"),
        GPU("h100", "NVIDIA H100 SXM", (9, 0), 80.0, 79.1, 3350.0, None, 232_448, True, True, 700,
            "NVIDIA H100 datasheet"),
        GPU("h200", "NVIDIA H200", (9, 0), 141.0, 139.8, 4800.0, None, 232_448, True, True, 700,
            "NVIDIA H200 datasheet"),
    ]
}


def get_gpu(key: str) -> GPU:
    try:
        return GPUS[key.lower()]
    except KeyError:
        raise Gemma4T4Error(
            f"unknown GPU {key!r}", fix=f"use one of: {', '.join(GPUS)}"
        ) from None


@dataclass(frozen=True)
class InstancePrice:
    key: str  # "<platform>:<instance>"
    platform: str  # sagemaker | ec2 | gce | cloudrun | colab
    instance: str
    gpu: str  # key into GPUS
    gpus: int
    usd_per_hour: float
    region: str
    source: str


_AWS = "AWS Price List API, us-east-2, on-demand, fetched 2026-09-30 (published by the series)"
_GCP = "Google Cloud Billing Catalog, on-demand, fetched 2026-09-30 (published by the series)"

PRICES: dict[str, InstancePrice] = {
    p.key: p
    for p in [
        InstancePrice("sagemaker:ml.g4dn.xlarge", "sagemaker", "ml.g4dn.xlarge", "t4", 1, 0.736, "us-east-2", _AWS),
        InstancePrice("sagemaker:ml.g6.xlarge", "sagemaker", "ml.g6.xlarge", "l4", 1, 1.1267, "us-east-2", _AWS),
        InstancePrice("ec2:g4dn.xlarge", "ec2", "g4dn.xlarge", "t4", 1, 0.526, "us-east-2", _AWS),
        InstancePrice("ec2:g6.xlarge", "ec2", "g6.xlarge", "l4", 1, 0.8048, "us-east-2", _AWS),
        InstancePrice("gce:n1-standard-2+t4", "gce", "n1-standard-2 + 1x T4", "t4", 1, 0.4770, "us-east4", _GCP),
        InstancePrice("gce:n1-standard-2+t4:us-west2", "gce", "n1-standard-2 + 1x T4", "t4", 1, 0.5241, "us-west2",
                      _GCP),
        InstancePrice("gce:g2-standard-4", "gce", "g2-standard-4", "l4", 1, 0.7045, "us-central1", _GCP),
        InstancePrice("cloudrun:l4", "cloudrun", "Cloud Run L4", "l4", 1, 1.4209, "us-central1", _GCP),
    ]
}

# SageMaker instance types -> (GPU key, GPU count); used for validation and fit checks.
SAGEMAKER_INSTANCES: dict[str, tuple[str, int]] = {
    "ml.g4dn.xlarge": ("t4", 1),
    "ml.g4dn.2xlarge": ("t4", 1),
    "ml.g4dn.4xlarge": ("t4", 1),
    "ml.g4dn.8xlarge": ("t4", 1),
    "ml.g4dn.12xlarge": ("t4", 4),
    "ml.g4dn.16xlarge": ("t4", 1),
    "ml.g6.xlarge": ("l4", 1),
    "ml.g6.2xlarge": ("l4", 1),
    "ml.g6.4xlarge": ("l4", 1),
    "ml.g6.12xlarge": ("l4", 4),
    "ml.g5.xlarge": ("a10g", 1),
    "ml.g5.2xlarge": ("a10g", 1),
}


def get_price(key: str) -> InstancePrice:
    try:
        return PRICES[key]
    except KeyError:
        raise Gemma4T4Error(f"no price for {key!r}", fix=f"use one of: {', '.join(PRICES)}") from None


def usd_per_million_tokens(usd_per_hour: float, output_tok_s: float) -> float:
    """$ per 1e6 output tokens at a sustained system throughput (state the utilisation)."""
    if output_tok_s <= 0:
        raise Gemma4T4Error("throughput must be positive to price tokens")
    return usd_per_hour / (output_tok_s * 3600.0) * 1e6
