"""The start gate's safety margins, each at its edge: values just inside and just outside the margin,
through the gate's injected probes (GateProbes: a stand-in host for the doctor's probe, stand-in launch
probes), so a margin dropped or shrunk is noticed.

- disk: a download needs the weights plus 5 % free (temporary files, metadata);
- host memory: a checkpoint the catalog does not know loads with 4 GiB besides its weights;
- GPU memory: a checkpoint the catalog does not know needs its weights plus 1 GiB of runtime within
  vLLM's share (gpu_memory_utilization) of the GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gemma4_t4.serving.gate import GIB, GateProbes, GateRefused, ModelFound, TuringFound, check_start
from gemma4_t4.serving.server_config import ServerConfig
from tests.serving.test_gate_judge import host_probes, model_on_a_roomy_disk

MODEL = "google/gemma-4-E2B-it-qat-w4a16-ct"
WEIGHTS = 8 * GIB
DOWNLOAD = 20 * GIB  # 5 % of it is exactly 1 GiB: the margin's edge is a whole number of bytes
MIB = 1024**2


def _probes(*, ram_and_swap: int = 64 * GIB, gpu_memory_bytes: int = 15 * GIB, model=None) -> GateProbes:
    """A T4 host with the fix active, ``ram_and_swap`` bytes of available RAM (no swap) and a GPU reporting
    ``gpu_memory_bytes``, as /proc/meminfo and nvidia-smi would say (kB and MiB)."""
    kb = ram_and_swap // 1024
    host = host_probes(gpus=(("Tesla T4", gpu_memory_bytes // MIB, "7.5"),), meminfo_kb=(kb, kb, 0, 0))
    return GateProbes(host=host, turing=lambda cc: TuringFound(active=True, proven=True),
                      model=model or model_on_a_roomy_disk)


def _checks(config: ServerConfig, probes: GateProbes) -> list[str]:
    try:
        check_start(config, probes=probes)
    except GateRefused as refused:
        return [r.check for r in refused.result.reasons]
    return []


def _download(free: int | None, on_disk: bool = False):
    """The model probe's answer for 20 GiB of weights still to download onto a disk with ``free`` bytes."""

    def probe(config, host) -> ModelFound:
        return ModelFound(
            weights_bytes=DOWNLOAD,
            weights_on_disk=on_disk,
            disk_path="/data/hf",
            disk_free_bytes=free,
            load_peak_bytes=12 * GIB,
            gpu_fit_ok=True,
        )

    return probe


@pytest.mark.parametrize(
    ("free", "refused"),
    [
        (21 * GIB, False),  # exactly weights + 5 %: enough
        (21 * GIB + MIB, False),
        (21 * GIB - 1, True),  # one byte short of the margin
        (int(DOWNLOAD * 1.04), True),  # more than the weights, less than the margin
        (DOWNLOAD + MIB, True),
    ],
    ids=["at-margin", "inside", "just-outside", "4-percent", "weights-only"],
)
def test_disk_needs_the_weights_plus_five_percent(free, refused):
    config = ServerConfig(model=MODEL, target="t4")
    assert _checks(config, _probes(model=_download(free))) == (["disk"] if refused else [])


def test_free_disk_that_could_not_be_read_refuses():
    config = ServerConfig(model=MODEL, target="t4")
    assert _checks(config, _probes(model=_download(None))) == ["disk"]


def test_weights_already_on_disk_need_no_free_space():
    config = ServerConfig(model=MODEL, target="t4")
    assert _checks(config, _probes(model=_download(0, on_disk=True))) == []


@pytest.fixture
def local_checkpoint(tmp_path) -> Path:
    """A local checkpoint the catalog does not know: one sparse 8 GiB safetensors file (no config.json)."""
    folder = tmp_path / "my-model"
    folder.mkdir()
    with open(folder / "model.safetensors", "wb") as f:
        f.truncate(WEIGHTS)
    return folder


@pytest.mark.parametrize(
    ("have", "refused"),
    [
        (WEIGHTS + 4 * GIB, False),  # weights + 4 GiB load overhead: enough
        (WEIGHTS + 4 * GIB - MIB, True),  # 1 MiB short
        (WEIGHTS + 2 * GIB, True),  # more than the weights, less than the overhead
    ],
    ids=["at-margin", "just-outside", "weights-only"],
)
def test_host_memory_needs_the_weights_plus_the_load_overhead(local_checkpoint, have, refused):
    config = ServerConfig(model=str(local_checkpoint), target="t4")
    probes = _probes(ram_and_swap=have, gpu_memory_bytes=64 * GIB)  # the GPU is never the limit here
    assert _checks(config, probes) == (["host_memory"] if refused else [])


@pytest.mark.parametrize(
    ("spare", "refused"),
    [
        (MIB, False),  # vLLM's share holds the weights + 1 GiB runtime with 1 MiB to spare
        (0, True),  # exactly weights + 1 GiB is not enough (strictly less is required)
        (-MIB, True),
        (-GIB // 2, True),  # the weights fit, the runtime's 1 GiB does not
    ],
    ids=["inside", "at-margin", "just-outside", "weights-only"],
)
def test_gpu_memory_needs_the_weights_plus_one_gib_of_runtime(local_checkpoint, spare, refused):
    # half the GPU for vLLM: the share is exact in binary, so the edge is exact too
    config = ServerConfig(model=str(local_checkpoint), target="t4", gpu_memory_utilization=0.5)
    gpu_memory = 2 * (WEIGHTS + GIB + spare)
    assert gpu_memory * 0.5 > WEIGHTS  # the weights alone always fit: only the margin decides
    probes = _probes(ram_and_swap=64 * GIB, gpu_memory_bytes=gpu_memory)
    assert _checks(config, probes) == (["gpu_memory"] if refused else [])
