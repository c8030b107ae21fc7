"""One GPU identity (``hardware.identify_gpu``) read the same way by the start gate, the notebooks,
the Endpoint and the published comparisons: every GPU nvidia-smi names maps to its own row of the
hardware table, and a GPU the table does not list is named as unknown and judged by the memory the
host reports, never read as a T4."""

from __future__ import annotations

import pytest

from gemma4_t4 import notebook as nb
from gemma4_t4.bench import published
from gemma4_t4.bench.results import BenchRun
from gemma4_t4.bench.schemas import RunInfo, ServerInfo
from gemma4_t4.catalog import models
from gemma4_t4.catalog.hardware import GPUS, identify_gpu, price_key, price_of_gpu, sagemaker_price
from gemma4_t4.host import env
from gemma4_t4.serving.gate import GIB, ModelFound, probe_model
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.studies import part4
from gemma4_t4.venues.endpoint import Endpoint
from gemma4_t4.venues.runtime import RuntimeInfo

# (nvidia-smi's name, the table key, compute capability, MiB nvidia-smi reports)
KNOWN = [
    ("Tesla T4", "t4", "7.5", 15360),
    ("NVIDIA L4", "l4", "8.9", 23034),
    ("NVIDIA A10G", "a10g", "8.6", 23028),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb", "8.0", 40960),
    ("NVIDIA A100-PCIE-40GB", "a100-40gb", "8.0", 40960),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb", "8.0", 81920),
    ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie", "8.0", 81920),
    ("NVIDIA H100 80GB HBM3", "h100", "9.0", 81559),
    ("NVIDIA H100 PCIe", "h100-pcie", "9.0", 81559),
    ("NVIDIA H200", "h200", "9.0", 143771),
]
# near names of GPUs the table does not list: each must stay unknown, never the row it resembles
UNKNOWN = [
    ("NVIDIA L40S", "8.9", 46068),
    ("NVIDIA A10", "8.6", 23028),
    ("NVIDIA H100 NVL", "9.0", 95830),
    ("NVIDIA RTX 6000 Ada Generation", "8.9", 49140),
    ("Quadro RTX 8000", "7.5", 46080),
]
MODEL = "google/gemma-4-12B-it"  # bf16 12B: fits an A100 but not a T4, so a GPU read as another shows


def _gate_facts(name: str, mib: int, model: str = MODEL) -> ModelFound:
    """What the gate finds of a launch on a host whose nvidia-smi names ``name`` with ``mib`` of memory."""
    from tests.serving.test_gate_judge import host_probes

    host = env.probe(host_probes(gpus=((name, mib, "8.0"),)), smem=True)
    return probe_model(ServerConfig(model=model, target="t4", max_model_len=8192), host)


def _notebook_runtime(name: str, cc: str, mib: int) -> RuntimeInfo:
    def run(cmd):
        if any(a.startswith("--query-gpu") for a in cmd):
            return 0, f"0, {name}, {mib}, {cc}, 580.82.07\n"
        return 0, "Driver Version: 580.82.07   CUDA Version: 13.0\n"

    return nb.runtime_check("t4", allowed=("cpu", "t4"), probes=env.Probes(run=run, env={"HOME": "/h"}, modules={}),
                            show=False)


def _local_run(tmp_path, name: str) -> BenchRun:
    info = RunInfo(
        workload="decode", model="gemma4", base_url="http://127.0.0.1:8000", status="complete",
        server=ServerInfo(models=["gemma4"], root=MODEL, backend="openai-http"),
        environment={"server": {"launch": {"config": {"model": MODEL, "target": "t4"}}}, "gpus": [{"name": name}]},
    )  # fmt: skip
    return BenchRun(dir=tmp_path / "run", run=info, cells=[])


def test_every_row_names_itself_and_no_name_is_claimed_twice():
    names = [n for gpu in GPUS.values() for n in gpu.smi_names]
    assert len(names) == len(set(names))
    for gpu in GPUS.values():
        assert gpu.smi_names, f"{gpu.key} has no nvidia-smi name: identify_gpu can never find it"
        assert all(identify_gpu(n) is gpu for n in gpu.smi_names)
    assert {key for _, key, _, _ in KNOWN} == set(GPUS)  # every row is exercised below
    assert identify_gpu(None) is None and identify_gpu("") is None
    assert identify_gpu("  nvidia a100 80gb  PCIe ") is GPUS["a100-80gb-pcie"]  # case and spacing only


@pytest.mark.parametrize(("name", "key", "cc", "mib"), KNOWN)
def test_the_gate_fits_the_model_on_the_gpu_nvidia_smi_names(name, key, cc, mib):
    facts = _gate_facts(name, mib)
    expected = models.fit("12b", "bf16", gpu=key, context_len=8192, gpu_memory_utilization=0.9, max_num_seqs=8,
                          max_num_batched_tokens=facts_batched(), text_only=True)
    assert facts.gpu_fit_detail == f"12b bf16 on {key}: {expected.verdict}"
    assert facts.gpu_fit_ok is expected.fits
    if key != "t4":  # its own memory: not the T4's verdict
        as_t4 = models.fit("12b", "bf16", gpu="t4", context_len=8192, gpu_memory_utilization=0.9, max_num_seqs=8,
                           max_num_batched_tokens=facts_batched(), text_only=True)
        assert expected.verdict != as_t4.verdict


def facts_batched() -> int:
    return int(ServerConfig(model=MODEL, target="t4").max_num_batched_tokens or models.DEFAULT_MAX_NUM_BATCHED_TOKENS)


@pytest.mark.parametrize(("name", "key", "cc", "mib"), KNOWN)
def test_the_notebooks_runtime_and_endpoint_read_the_same_gpu(name, key, cc, mib):
    runtime = _notebook_runtime(name, cc, mib)
    assert runtime.gpu_name == name and runtime.gpu_key == key and runtime.roofline_gpu == key
    assert any(f"priced and roofline'd as {key}" in n for n in runtime.notes) or key == "t4"
    served = Endpoint("local", "x", "http://127.0.0.1:1", "x", gpu=runtime.gpu_key)
    assert served.price == price_of_gpu(key)
    assert served.price is None or served.price.gpu == key  # priced as itself or not at all, never as a T4


@pytest.mark.parametrize(("name", "key", "cc", "mib"), KNOWN)
def test_the_published_comparison_reads_the_same_gpu(tmp_path, name, key, cc, mib):
    kind = published.measured_kind(_local_run(tmp_path, name))
    assert kind == published.Kind("12B", key) and kind.describe() == f"12B on {key.upper()}"


@pytest.mark.parametrize(("name", "cc", "mib"), UNKNOWN)
def test_an_unknown_gpu_is_named_and_judged_by_its_own_memory_in_the_gate(name, cc, mib):
    assert identify_gpu(name) is None
    facts = _gate_facts(name, mib)
    assert "on t4" not in facts.gpu_fit_detail and name in facts.gpu_fit_detail
    assert f"judged by the {mib / 1024:.1f} GiB the host reports" in facts.gpu_fit_detail
    weights = models.weights_estimate("12b", "bf16", True).total_bytes
    assert facts.gpu_fit_ok is (weights + GIB < mib * 2**20 * 0.9)
    small = _gate_facts(name, 4 * 1024)  # the same name with 4 GiB: refused by what it reports
    assert small.gpu_fit_ok is False and "4.0 GiB the host reports" in small.gpu_fit_detail


@pytest.mark.parametrize(("name", "cc", "mib"), UNKNOWN)
def test_an_unknown_gpu_is_named_and_never_priced_as_a_t4_in_the_notebooks_and_comparisons(tmp_path, name, cc, mib):
    runtime = _notebook_runtime(name, cc, mib)
    assert runtime.gpu_key is None and any(name in n and "not priced" in n for n in runtime.notes)
    assert not any("priced and roofline'd as" in n for n in runtime.notes)
    served = Endpoint("local", "x", "http://127.0.0.1:1", "x", gpu=runtime.gpu_key)
    assert served.price is None
    kind = published.measured_kind(_local_run(tmp_path, name))
    assert kind == published.Kind("12B", None, name) and not kind.known
    assert kind.unpriced(priced_gpu="t4") == f"no $/Mtok: {name} is not in the hardware table, so no price is known for it"
    assert name in kind.describe()
    row = published.beside("x", 80.0, 72.3, "s", measured_on=kind, published_on=published.Kind("12B", "t4"))
    assert row["measured / published"] is None and name in row["measured on"]


def test_the_endpoint_owns_its_venue():
    local = Endpoint("local", "x", "http://127.0.0.1:1", "x", gpu="l4")
    assert local.price is not None and local.price.key == price_key("gce", "g2-standard-4")
    assert local.usd_per_hour == 0.0 and local.cost_usd() == 0.0  # a machine you run: this package bills nothing
    assert not local.can_restart  # no server of this process behind it
    cpu = Endpoint("local", "x", "http://127.0.0.1:1", "x")
    assert cpu.price is None
    # a notebook's $/Mtok row needs an hourly figure: a T4's, which measured_price then refuses to use
    assert part4.price_of(cpu).gpu == "t4"
    t4 = sagemaker_price("ml.g4dn.xlarge")
    assert t4 is not None and t4.key == price_key("sagemaker", "ml.g4dn.xlarge") and t4.gpu == "t4"
    billed = Endpoint("sagemaker", "e", "sagemaker://us-east-2/e", "e", gpu="t4", usd_per_hour=t4.usd_per_hour,
                      price=t4)
    assert billed.price is t4 and not billed.can_restart and part4.price_of(billed) is t4
    assert sagemaker_price("ml.nothing") is None and price_of_gpu("a100-40gb") is None and price_of_gpu(None) is None
