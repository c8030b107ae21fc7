"""GPUs and hourly prices: the one table the roofline, the fit calculator, the benchmark's
cost figures and the SageMaker cost guard all read, and the one way to tell which GPU a host has
(:func:`identify_gpu`: the gate, the notebooks and the published comparisons all ask it).

Figures are vendor specifications or published measurements; ``source`` says which.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemma4_t4.errors import Gemma4T4Error


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    usable_memory_gib: float  # what torch reports as total on a typical host
    bandwidth_gb_s: float  # spec
    measured_bandwidth_gb_s: float | None  # stream-measured where published
    source: str
    # the names nvidia-smi (``--query-gpu=name``) and torch print for this GPU: identify_gpu matches them
    # exactly, so a near name (an L40S beside the L4, an H100 NVL beside the H100) is never read as this one
    smi_names: tuple[str, ...] = ()


# nvidia-smi names: seen printed in public logs, test fixtures and price tables of GPU clouds (read
# 2026-12-02); the A100 and H100 SXM and PCIe cards print different names and, where their memory or
# bandwidth differs, have their own rows. Usable GiB: torch's total_memory on a typical host.
GPUS: dict[str, GPU] = {
    g.key: g
    for g in [
        GPU("t4", "NVIDIA T4", 14.56, 320.0, 277.0,
            "NVIDIA T4 datasheet; 277 GB/s stream figure published by the series", ("Tesla T4",)),
        GPU("l4", "NVIDIA L4", 22.03, 300.0, None, "NVIDIA L4 datasheet", ("NVIDIA L4",)),
        GPU("a10g", "NVIDIA A10G", 22.06, 600.0, None, "AWS g5 instance documentation", ("NVIDIA A10G",)),
        GPU("a100-40gb", "NVIDIA A100 40GB", 39.4, 1555.0, None,
            "NVIDIA A100 datasheet (SXM4 and PCIe: the same 40 GB and 1,555 GB/s)",
            ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB")),
        GPU("a100-80gb", "NVIDIA A100 80GB SXM4", 79.15, 2039.0, None,
            "NVIDIA A100 datasheet; 79.15 GiB as torch reports it", ("NVIDIA A100-SXM4-80GB",)),
        GPU("a100-80gb-pcie", "NVIDIA A100 80GB PCIe", 79.15, 1935.0, None,
            "NVIDIA A100 datasheet; 79.15 GiB as torch reports it", ("NVIDIA A100 80GB PCIe",)),
        GPU("h100", "NVIDIA H100 SXM", 79.1, 3350.0, None, "NVIDIA H100 datasheet", ("NVIDIA H100 80GB HBM3",)),
        GPU("h100-pcie", "NVIDIA H100 PCIe", 79.19, 2000.0, None,
            "NVIDIA H100 datasheet; 79.19 GiB as torch reports it", ("NVIDIA H100 PCIe",)),
        GPU("h200", "NVIDIA H200", 139.8, 4800.0, None, "NVIDIA H200 datasheet", ("NVIDIA H200",)),
    ]
}


def _smi_form(name: str) -> str:
    return " ".join(name.split()).casefold()


_BY_SMI_NAME = {_smi_form(name): gpu for gpu in GPUS.values() for name in gpu.smi_names}


def identify_gpu(smi_name: str | None) -> GPU | None:
    """The table's GPU that nvidia-smi (or torch) names ``smi_name`` ("Tesla T4" -> the T4 row,
    "NVIDIA A100 80GB PCIe" -> ``a100-80gb-pcie``); None for no name or a GPU the table does not
    list. An unknown GPU is never read as another one: callers name it by ``smi_name`` and judge it
    by the memory the host reports."""
    if not smi_name:
        return None
    return _BY_SMI_NAME.get(_smi_form(smi_name))


def get_gpu(key: str) -> GPU:
    try:
        return GPUS[key.lower()]
    except KeyError:
        raise Gemma4T4Error(f"unknown GPU {key!r}", fix=f"use one of: {', '.join(GPUS)}") from None


def price_key(platform: str, instance: str) -> str:
    """The :data:`PRICES` key of an instance type on a platform ("sagemaker", "ml.g4dn.xlarge" ->
    "sagemaker:ml.g4dn.xlarge"): the one spelling every lookup uses."""
    return f"{platform}:{instance}"


@dataclass(frozen=True)
class InstancePrice:
    key: str  # price_key(platform, a short instance name; ":region" where one platform has two)
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
        InstancePrice(price_key("sagemaker", "ml.g4dn.xlarge"), "sagemaker", "ml.g4dn.xlarge", "t4", 1, 0.736, "us-east-2", _AWS),
        InstancePrice(price_key("sagemaker", "ml.g6.xlarge"), "sagemaker", "ml.g6.xlarge", "l4", 1, 1.1267, "us-east-2", _AWS),
        InstancePrice(price_key("ec2", "g4dn.xlarge"), "ec2", "g4dn.xlarge", "t4", 1, 0.526, "us-east-2", _AWS),
        InstancePrice(price_key("ec2", "g6.xlarge"), "ec2", "g6.xlarge", "l4", 1, 0.8048, "us-east-2", _AWS),
        InstancePrice(price_key("gce", "n1-standard-2+t4"), "gce", "n1-standard-2 + 1x T4", "t4", 1, 0.4770, "us-east4", _GCP),
        InstancePrice(price_key("gce", "n1-standard-2+t4:us-west2"), "gce", "n1-standard-2 + 1x T4", "t4", 1, 0.5241, "us-west2",
                      _GCP),
        InstancePrice(price_key("gce", "g2-standard-4"), "gce", "g2-standard-4", "l4", 1, 0.7045, "us-central1", _GCP),
        InstancePrice(price_key("cloudrun", "l4"), "cloudrun", "Cloud Run L4", "l4", 1, 1.4209, "us-central1", _GCP),
    ]
}

# SageMaker instance types -> (GPU key, GPU count); used for validation and fit checks.
SAGEMAKER_INSTANCES: dict[str, tuple[str, int]] = {
    "ml.g4dn.xlarge": ("t4", 1), "ml.g4dn.2xlarge": ("t4", 1), "ml.g4dn.4xlarge": ("t4", 1),
    "ml.g4dn.8xlarge": ("t4", 1), "ml.g4dn.12xlarge": ("t4", 4), "ml.g4dn.16xlarge": ("t4", 1),
    "ml.g6.xlarge": ("l4", 1), "ml.g6.2xlarge": ("l4", 1), "ml.g6.4xlarge": ("l4", 1),
    "ml.g6.12xlarge": ("l4", 4), "ml.g5.xlarge": ("a10g", 1), "ml.g5.2xlarge": ("a10g", 1),
}


def sagemaker_price(instance_type: str) -> InstancePrice | None:
    """The on-demand price of a SageMaker instance type; None where the table has none."""
    return PRICES.get(price_key("sagemaker", instance_type))


def price_of_gpu(gpu: str | None) -> InstancePrice | None:
    """An hourly price for one ``gpu`` (a :data:`GPUS` key): GCE first, then EC2, SageMaker and Cloud
    Run; None for no GPU or one the table prices nowhere (it is then not priced as another GPU)."""
    for platform in ("gce", "ec2", "sagemaker", "cloudrun"):
        for price in PRICES.values():
            if price.gpu == gpu and price.platform == platform and price.gpus == 1:  # no gpu: none matches
                return price
    return None


def usd_per_million_tokens(usd_per_hour: float, output_tok_s: float) -> float:
    """$ per 1e6 output tokens at a sustained system throughput (state the utilisation)."""
    if output_tok_s <= 0:
        raise Gemma4T4Error("throughput must be positive to price tokens")
    return usd_per_hour / (output_tok_s * 3600.0) * 1e6
