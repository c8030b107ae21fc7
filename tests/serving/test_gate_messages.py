"""What the start gate tells a user, word for word: every reason's problem and fix, the report and
the override warning, the refusal's error; and which facts decide between them (the doctor's words for
the host, swap size rounding, the Turing limit's wording). Pure: LaunchFacts in, reasons out, or
check_start with stand-in probes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from gemma4_t4.host import cpuisa, env
from gemma4_t4.serving.gate import (
    GIB,
    GateProbes,
    GateReason,
    GateRefused,
    GateResult,
    LaunchFacts,
    check_start,
    host_reasons,
    judge,
    judge_cpu,
)
from tests.serving.test_gate_judge import GOOD as JUDGE_GOOD
from tests.serving.test_gate_judge import NO_CUDA, t4_gpu, with_changes

# the judge tests' healthy T4, with round RAM figures so every message below reads exactly
GOOD = with_changes(JUDGE_GOOD, ram_total_gib=8.0, ram_available_gib=7.0)

TURING_INSTALL = (
    "install gemma4-t4 into the Python that runs vLLM (its vllm.general_plugins entry point loads the fix in "
    "every vLLM process) and check with `gemma4-t4 turing status`; where that is impossible, "
    "`gemma4-t4 turing apply` patches the installed vLLM file"
)
TURING_VERIFY = (
    "run `gemma4-t4 turing verify` and fix what it reports (it needs Triton: pip install 'triton==3.8.0'); "
    "a vLLM whose kernel the fix does not know needs a tested vLLM"
)
GPU_FIT_DEFAULT = (
    "lower max_model_len (--max-model-len), use the QAT w4a16 checkpoint, or spread over more T4s "
    "(tensor_parallel_size); `gemma4-t4 fit` shows what fits"
)


def facts(**changes) -> LaunchFacts:
    return with_changes(GOOD, **changes)


def only(reasons: list[GateReason]) -> tuple[str, str, str]:
    assert len(reasons) == 1, reasons
    return reasons[0].check, reasons[0].problem, reasons[0].fix


# --- 1. the host: the doctor's words --------------------------------------------------------------


def _doctor(f: LaunchFacts) -> dict[str, env.Problem]:
    return {p.code: p for p in env.judge(f.host)[1]}


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"torch_version": None, "torch_cuda": None, "smem_probed": False, "smem_per_block_optin": None,
          "torch_compute_capability": None}, "no-torch"),
        ({"nvidia_smi": False, "gpus": [], **NO_CUDA}, "no-gpu"),
        ({"gpus": [], **NO_CUDA}, "no-gpu"),
        ({"torch_version": "2.14.0+cpu", "torch_cuda": None, **NO_CUDA}, "cpu-torch-on-gpu-host"),
        (NO_CUDA, "cuda-init-failed"),
        ({"gpu_probe_error": "nvidia-smi timed out", "gpu_probe_fix": "reboot", "gpus": [], **NO_CUDA},
         "nvidia-smi-failed"),
    ],
)
def test_a_host_without_a_working_cuda_is_refused_in_the_doctors_words(changes, code):
    f = facts(**changes)
    problem = _doctor(f)[code]
    reason = next(r for r in judge(f) if r.check == f"doctor:{code}")
    assert (reason.problem, reason.fix) == (problem.message, problem.fix)


def test_no_gpu_names_the_cpu_target_and_a_cpu_only_torch_names_the_plans_pip_line():
    assert only(judge(facts(nvidia_smi=False, gpus=[], **NO_CUDA))) == (
        "doctor:no-gpu",
        "no NVIDIA GPU: nvidia-smi is not installed, so only the CPU path (the tiny model on vLLM's CPU build) "
        "can run here",
        "Colab: Runtime > Change runtime type > T4 GPU; GCE: attach an NVIDIA T4 and install the driver; or keep "
        "to the CPU path (--target cpu, or make run)",
    )
    cpu = judge(facts(torch_version="2.14.0+cpu", torch_cuda=None, **NO_CUDA))[0]
    assert cpu.check == "doctor:cpu-torch-on-gpu-host" and cpu.problem.startswith(
        "torch 2.14.0+cpu is a CPU-only build on a host with Tesla T4")
    assert cpu.fix == "pip install torch==2.14.0+cu130 --index-url https://download.pytorch.org/whl/cu130"


def test_only_the_doctors_errors_and_a_missing_gpu_or_torch_refuse():
    # warnings and notes of the doctor (a mixed host, low disk, an unverified pair) never refuse a launch
    mixed = facts(gpus=[t4_gpu(0, "NVIDIA L4", 23_034, "8.9"), t4_gpu(1)], cuda_visible_devices=None)
    assert "mixed-gpus" in _doctor(mixed) and judge(mixed) == []
    low_disk = facts(disks=[env.DiskInfo("HF_HOME", "/h", 1.0)], transformers_version="5.22.0")
    assert {"low-disk"} <= set(_doctor(low_disk)) and judge(low_disk) == []
    assert host_reasons(GOOD.host) == []


# --- 2. the Turing fix ----------------------------------------------------------------------------


def test_an_active_fix_whose_proof_failed_or_did_not_run():
    failed = facts(turing_fix_active=True, turing_fix_proven=False, turing_detail="plugin on; compile failed")
    assert only(judge(failed)) == (
        "turing",
        "the Turing attention fix is active but not proven for this vLLM + Triton (the offline sm_75 compile "
        "of vLLM's kernel failed): plugin on; compile failed",
        TURING_VERIFY,
    )
    assert only(judge(facts(turing_fix_active=True, turing_fix_proven=None)))[1] == (
        "the Turing attention fix is active but not proven for this vLLM + Triton (the offline sm_75 compile "
        "of vLLM's kernel did not run)"
    )


def test_an_inactive_or_unconfirmed_fix_names_the_limit():
    inactive = facts(turing_fix_active=False, turing_fix_proven=None, turing_detail="not registered")
    assert only(judge(inactive)) == (
        "turing",
        "the Turing attention fix is not active: Gemma 4's head-512 attention needs 98,304 B of shared memory "
        "per block, this GPU allows 65,536 B, so vLLM would crash with OutOfResources (not registered)",
        TURING_INSTALL,
    )
    unknown = facts(turing_fix_active=None, turing_fix_proven=None, smem_per_block_optin=None)
    assert only(judge(unknown))[1] == (
        "the Turing attention fix could not be confirmed: Gemma 4's head-512 attention needs 98,304 B of "
        "shared memory per block, a T4 allows 65,536 B, so vLLM would crash with OutOfResources"
    )


def test_a_proven_fix_not_known_inactive_passes_and_a_device_with_enough_memory_needs_none():
    assert judge(facts(turing_fix_active=None, turing_fix_proven=True)) == []
    assert judge(facts(turing_fix_active=False, turing_fix_proven=False, smem_per_block_optin=101_376,
                       torch_compute_capability="8.9", gpus=[t4_gpu(0, "NVIDIA L4", 23_034, "8.9")])) == []


# --- 3. host memory -------------------------------------------------------------------------------


def test_host_memory_unknown_names_its_notes():
    f = facts(load_peak_bytes=None, notes=["host_memory: psutil failed", "model: not a catalog id", "disk: x"])
    assert only(judge(f)) == (
        "host_memory",
        "could not estimate host memory for the weight load (psutil failed; not a catalog id)",
        "use a catalog model or a local checkpoint folder, or pass force=True if you know it fits",
    )
    for missing in ("ram_available_gib", "swap_free_gib"):
        assert only(judge(facts(**{missing: None})))[0] == "host_memory"


def test_host_memory_short_asks_for_swap_rounded_up_plus_two_gib():
    # 30 GiB and one byte short: 31 GiB rounded up, plus 2
    f = facts(ram_available_gib=2.0, swap_free_gib=0.0, load_peak_bytes=32 * GIB + 1)
    assert only(judge(f)) == (
        "host_memory",
        "RAM available 2.0 GiB + free swap 0.0 GiB = 2.0 GiB < 32.0 GiB needed while loading the weights; "
        "the kernel would OOM-kill vLLM mid-load",
        "add swap: sudo gemma4-t4 swap create --size 33G (or use a machine with more RAM, or a smaller "
        "checkpoint such as the QAT w4a16 one)",
    )
    # exactly 30 GiB short: 32G; a small shortfall still asks for at least 16G
    assert "--size 32G " in only(judge(facts(ram_available_gib=2.0, swap_free_gib=0.0,
                                              load_peak_bytes=32 * GIB)))[2]
    small = only(judge(facts(ram_available_gib=1.0, swap_free_gib=1.0, load_peak_bytes=3 * GIB)))
    assert small[1].startswith("RAM available 1.0 GiB + free swap 1.0 GiB = 2.0 GiB < 3.0 GiB needed")
    assert "--size 16G " in small[2]
    # 14 GiB short: 14 + 2 = 16, and 15 GiB short: 17
    assert "--size 16G " in only(judge(facts(ram_available_gib=1.0, swap_free_gib=1.0,
                                              load_peak_bytes=16 * GIB)))[2]
    assert "--size 17G " in only(judge(facts(ram_available_gib=1.0, swap_free_gib=1.0,
                                              load_peak_bytes=17 * GIB)))[2]


def test_host_memory_exactly_enough_passes_and_ram_plus_swap_both_count():
    assert judge(facts(ram_available_gib=5.0, swap_free_gib=7.0, load_peak_bytes=12 * GIB)) == []
    assert only(judge(facts(ram_available_gib=5.0, swap_free_gib=7.0,
                            load_peak_bytes=12 * GIB + 1)))[0] == "host_memory"


def test_colab_cannot_add_swap():
    f = facts(platform="colab", ram_available_gib=2.0, swap_free_gib=0.0)
    assert only(judge(f))[2] == (
        "Colab cannot add swap: use the QAT w4a16 checkpoint (smaller load), a smaller model, or a High-RAM runtime"
    )


# --- 4. GPU memory --------------------------------------------------------------------------------


def test_gpu_fit_messages_and_fixes():
    assert only(judge(facts(gpu_fit_ok=False, gpu_fit_detail=None))) == (
        "gpu_memory", "the model does not fit GPU memory", GPU_FIT_DEFAULT,
    )
    assert only(judge(facts(gpu_fit_ok=False, gpu_fit_detail="too big", gpu_fit_fix="lower it"))) == (
        "gpu_memory", "the model does not fit GPU memory: too big", "lower it",
    )
    assert only(judge(facts(gpu_fit_ok=None, notes=["gpu_memory: drafter size unknown"]))) == (
        "gpu_memory", "could not check that the model fits GPU memory (drafter size unknown)", GPU_FIT_DEFAULT,
    )


# --- 5. disk --------------------------------------------------------------------------------------


def test_disk_messages():
    assert only(judge(facts(disk_free_bytes=None, notes=["disk: statvfs failed"]))) == (
        "disk",
        "could not check free disk for the weights (statvfs failed)",
        "download the checkpoint first (hf download MODEL) or point --model at a local folder",
    )
    assert only(judge(facts(weights_bytes=10 * GIB, disk_free_bytes=10 * GIB))) == (
        "disk",
        "/data/hf has 10.0 GiB free, the weights need 10.5 GiB",
        "free space there, or set HF_HOME to a bigger disk (e.g. a mounted data disk)",
    )
    assert judge(facts(weights_bytes=10 * GIB, disk_free_bytes=int(10.5 * GIB))) == []
    assert judge(facts(weights_on_disk=True, weights_bytes=None, disk_free_bytes=None)) == []


def test_reasons_come_in_check_order():
    f = facts(transformers_version="5.1.0", turing_fix_active=False, load_peak_bytes=None, gpu_fit_ok=None,
              disk_free_bytes=None, tensor_parallel_size=2)
    assert [r.check for r in judge(f)] == [
        "doctor:transformers-too-old", "doctor:vllm-transformers-pair", "turing", "host_memory", "tensor_parallel",
        "gpu_memory", "disk"]


# --- results, reports, refusals -------------------------------------------------------------------


def test_report_override_warning_and_line():
    reason = GateReason("disk", "no room", "free some")
    assert reason.line() == "[disk] no room\n    fix: free some"
    two = [GateReason("turing", "a", "b"), reason]
    refused = GateResult(ok=False, forced=False, reasons=two, facts=GOOD)
    assert refused.report() == "start gate refused to launch vLLM: 2 reason(s)\n[turing] a\n    fix: b\n" + reason.line()
    forced = GateResult(ok=False, forced=True, reasons=two, facts=GOOD)
    assert forced.report().startswith("start gate overridden: 2 reason(s)\n")
    assert forced.override_warning() == (
        "START GATE OVERRIDDEN (force=True): launching although 2 check(s) failed (disk, turing):\n"
        "[turing] a\n    fix: b\n[disk] no room\n    fix: free some"
    )
    assert GateResult(ok=True, forced=False, reasons=[], facts=GOOD).report() == "start gate: all checks passed"


@dataclass
class Config:
    """A stand-in launch configuration: the fields the gate reads besides its probes."""

    model: str = "google/gemma-4-E2B-it-qat-w4a16-ct"
    target: str = "t4"
    python: str | None = None
    tensor_parallel_size: int = 1


class Recording(GateProbes):
    """Stand-in probes that must not run (the facts are given)."""

    def __init__(self):
        def fail(*_):
            raise AssertionError("a probe ran although the facts were given")

        super().__init__(turing=fail, model=fail, cpu_build=fail)
        self.host = None  # type: ignore[assignment]  # env.probe(None) would read this machine


def test_check_start_with_the_facts_given_probes_nothing_and_words_its_refusal():
    probes = Recording()
    result = check_start(Config(), probes=probes, facts=GOOD)
    assert (result.ok, result.forced, result.reasons) == (True, False, [])
    cpu_torch = facts(torch_version="2.14.0+cpu", torch_cuda=None)
    with pytest.raises(GateRefused) as refused:
        check_start(Config(), probes=probes, facts=cpu_torch)
    error = refused.value
    assert error.result.ok is False and error.result.forced is False
    doctor = _doctor(cpu_torch)["cpu-torch-on-gpu-host"]
    assert error.message == (
        f"start gate refused to launch vLLM: 1 reason(s)\n[doctor:cpu-torch-on-gpu-host] {doctor.message}\n"
        f"    fix: {doctor.fix}"
    )
    assert error.fix == "fix each reason above, or pass force=True (CLI: --force) to launch anyway"
    assert error.to_dict()["reasons"] == [
        {"check": "doctor:cpu-torch-on-gpu-host", "problem": doctor.message, "fix": doctor.fix}
    ]
    forced = check_start(Config(), force=True, probes=probes, facts=facts(**NO_CUDA))
    assert (forced.ok, forced.forced, [r.check for r in forced.reasons]) == (False, True, ["doctor:cuda-init-failed"])
    assert check_start(Config(), force=True, probes=probes, facts=GOOD).forced is False


def _build(int4: bool | None, reason: str = f"vLLM's CPU build here lacks the int4 kernel {cpuisa.INT4_OP}"):
    return cpuisa.CpuBuild(isa="avx2", extension="_C_AVX2", library=None, int4=int4, reason=reason)


def _cpu_probes(answer):
    probes = Recording()
    probes.cpu_build = lambda config: answer
    return probes


def test_cpu_gate_refuses_int4_without_the_kernel_word_for_word():
    config = Config(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="cpu")
    with pytest.raises(GateRefused) as refused:
        check_start(config, probes=_cpu_probes(_build(False)))
    result = refused.value.result
    assert result.facts.target == "cpu" and result.facts.model == config.model
    assert only(result.reasons) == (
        "cpu_int4",
        "google/gemma-4-E2B-it-qat-w4a16-ct is an int4 (compressed-tensors pack-quantized) checkpoint, but "
        f"vLLM's CPU build here lacks the int4 kernel {cpuisa.INT4_OP}",
        cpuisa.INT4_FIX,
    )
    detail = _build(False, "the AVX2 build has no int4 kernel")
    forced = check_start(config, force=True, probes=_cpu_probes(detail))
    assert (forced.ok, forced.forced) == (False, True)
    assert forced.reasons[0].problem.endswith("checkpoint, but the AVX2 build has no int4 kernel")


@pytest.mark.parametrize(
    "answer",
    [
        _build(True),
        None,  # not an int4 checkpoint (or its format unknown): the build is not asked
        _build(None),
    ],
)
def test_cpu_gate_passes_unless_int4_meets_a_build_known_to_lack_the_kernel(answer):
    result = check_start(Config(target="cpu"), probes=_cpu_probes(answer))
    assert (result.ok, result.forced, result.reasons) == (True, False, [])


def test_the_int4_check_is_the_cpu_targets_only():
    f = LaunchFacts(None, "t4", "m", cpu=_build(False))
    assert judge_cpu(f) == []
    assert [r.check for r in judge_cpu(dataclasses.replace(f, target="cpu"))] == ["cpu_int4"]


def test_a_failing_cpu_probe_leaves_the_facts_unknown_and_passes():
    def broken(config):
        raise OSError("lscpu missing")

    probes = Recording()
    probes.cpu_build = broken
    result = check_start(Config(target="cpu"), probes=probes)
    assert result.ok and result.facts.notes == ["cpu_int4: OSError: lscpu missing"]


# --- the CPU build probe ---------------------------------------------------


def test_cpu_build_probe_reads_the_model_then_asks_the_build_of_the_configs_python(tmp_path, monkeypatch):
    import json

    from gemma4_t4.quant import config as qconfig
    from gemma4_t4.serving import gate

    asked = []

    def stand_in_cpu_build(python=None):
        asked.append(python)
        return cpuisa.CpuBuild(isa="avx2", extension="_C_AVX2", library=None, int4=False,
                               reason="stand-in: no int4 kernel")

    monkeypatch.setattr(cpuisa, "cpu_build", stand_in_cpu_build)
    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    (bf16 / "config.json").write_text('{"model_type": "gemma4_text"}')
    assert gate.probe_cpu_build(Config(model=str(bf16), target="cpu")) is None and asked == []

    int4 = tmp_path / "int4"
    int4.mkdir()
    config = {"model_type": "gemma4_text", "quantization_config": qconfig.quantization_config(32, [], False)}
    (int4 / "config.json").write_text(json.dumps(config))

    @dataclass
    class WithPython(Config):
        python: str = "/opt/venv/bin/python"

    found = gate.probe_cpu_build(WithPython(model=str(int4), target="cpu"))
    assert (found.int4, found.reason) == (False, "stand-in: no int4 kernel")
    assert asked == ["/opt/venv/bin/python"]
    gate.probe_cpu_build(Config(model=str(int4), target="cpu"))  # a config without a python: this one's
    assert asked == ["/opt/venv/bin/python", None]


# --- the GPUs CUDA shows a launch (env.Facts.cuda_gpu_count, the tensor-parallel check's count) ---


def test_the_gpu_count_is_gpus_like_the_chosen_one_that_cuda_shows():
    two = facts(gpus=[t4_gpu(0), t4_gpu(1)])
    assert two.host.cuda_gpu_count == 2
    mixed = facts(gpus=[t4_gpu(0, "NVIDIA L4", 23_034, "8.9"), t4_gpu(1), t4_gpu(2)])
    assert (mixed.host.gpu.name, mixed.host.cuda_gpu_count) == ("Tesla T4", 2)
    assert facts(gpus=[], nvidia_smi=False).host.cuda_gpu_count == 0
    assert facts(gpus=[t4_gpu(0), t4_gpu(1)], cuda_visible_devices="1").host.cuda_gpu_count == 1
    assert facts(gpus=[t4_gpu(0), t4_gpu(1)], cuda_visible_devices="GPU-abc,GPU-def").host.cuda_gpu_count == 2
    assert facts(gpus=[t4_gpu(0), t4_gpu(1)], cuda_visible_devices="0,-1,1").host.cuda_gpu_count == 1
    tp = judge(facts(gpus=[t4_gpu(0), t4_gpu(1)], cuda_visible_devices="1", tensor_parallel_size=2))
    assert only(tp)[:2] == ("tensor_parallel", "--tensor-parallel-size 2 needs 2 GPUs, but CUDA sees 1 Tesla T4 GPU "
                                               "here for it: vLLM would wait for workers that never start")


# --- small readers: GiB text, model format, host memory, torch probe, HF cache, model probe ---------


def test_gib_text():
    from gemma4_t4.serving.gate import _gib

    assert _gib(None) == "?"
    assert _gib(3 * GIB // 2) == "1.5 GiB"


def test_cpu_gate_never_calls_a_passing_start_forced():
    passing = check_start(Config(target="cpu"), force=True,
                              probes=_cpu_probes(None))
    assert (passing.ok, passing.forced) == (True, False)
    with pytest.raises(GateRefused) as refused:
        check_start(Config(target="cpu"), probes=_cpu_probes(_build(False)))
    assert refused.value.result.forced is False and refused.value.result.ok is False


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized"}}, True),
        ({"quantization_config": {"quant_method": "compressed-tensors", "format": "dense",
                                  "config_groups": {"g0": {"format": "pack-quantized"}, "g1": "x"}}}, True),
        ({"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized",
                                  "config_groups": None}}, False),
        ({"quantization_config": {"quant_method": "awq", "format": "pack-quantized"}}, False),
        ({"quantization_config": "int4"}, False),
        ({"model_type": "gemma4_text"}, False),
        ([1, 2], False),
    ],
)
def test_model_format_from_a_local_config(tmp_path, config, expected):
    import json

    from gemma4_t4.serving.gate import model_is_int4

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_is_int4(str(tmp_path)) is expected


def test_model_format_of_unreadable_folders_and_hub_ids(tmp_path):
    from gemma4_t4.serving.gate import model_is_int4

    assert model_is_int4(str(tmp_path)) is None  # no config.json
    (tmp_path / "config.json").write_text("{not json")
    assert model_is_int4(str(tmp_path)) is None
    assert model_is_int4("google/gemma-4-E2B-it-emb4") is True
    assert model_is_int4("google/gemma-4-E2B-it-qat-w4a16-ct") is True
    assert model_is_int4("google/gemma-4-E2B-it") is False


def test_the_hub_cache_follows_hf_hub_cache_then_hf_home_then_xdg_cache_home_then_home(tmp_path, monkeypatch):
    """One rule for where downloads land (env.hf_hub_cache): the gate's disk and cache checks and the
    doctor's HF_HOME row read it. Before, the gate ignored XDG_CACHE_HOME, which the doctor honours."""
    from pathlib import Path

    from gemma4_t4.serving import gate

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hubcache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gate._hub_cache() == tmp_path / "hubcache"
    monkeypatch.delenv("HF_HUB_CACHE")
    assert gate._hub_cache() == tmp_path / "hfhome" / "hub"
    monkeypatch.delenv("HF_HOME")
    assert gate._hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    assert env.cache_paths(dict(__import__("os").environ), "/w")[0] == ("HF_HOME", str(tmp_path / "xdg" / "huggingface"))
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gate._hub_cache() == Path(tmp_path / "home" / ".cache" / "huggingface" / "hub")


def test_model_probe_reads_a_cached_download_and_estimates_a_missing_one(tmp_path, monkeypatch):
    from gemma4_t4.catalog import models
    from gemma4_t4.serving import gate
    from gemma4_t4.serving.server import ServerConfig

    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    model = "google/gemma-4-E2B-it"
    device = GOOD.host
    # nothing cached, and the cache folder does not exist yet: free space of its nearest parent
    missing = gate.probe_model(ServerConfig(model=model, target="t4"), device)
    assert missing.weights_on_disk is False and missing.disk_path == str(hub)
    assert missing.weights_bytes == models.weights_estimate("e2b", "bf16").checkpoint_bytes
    assert missing.load_peak_bytes == int(models.load_ram("e2b", "bf16").peak_ram_gib * GIB)
    assert missing.disk_free_bytes is not None and missing.notes == []
    snapshot = hub / "models--google--gemma-4-E2B-it" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").write_bytes(b"\0" * 1000)
    (snapshot / "notes.txt").write_bytes(b"\0" * 50)
    cached = gate.probe_model(ServerConfig(model=model, target="t4"), device)
    assert (cached.weights_on_disk, cached.weights_bytes, cached.disk_path) == (True, 1000, str(hub))
    unknown = gate.probe_model(ServerConfig(model="someone/llama", target="t4"), device)
    assert unknown.weights_bytes is None and unknown.weights_on_disk is False
    assert unknown.notes[0] == "someone/llama is neither a local folder nor a Gemma 4 catalog hub id"


# --- the drafter's share of GPU memory (drafter_memory), through a stand-in launch config ----------


@dataclass
class StandInPlan:
    """What ``config.draft_plan()`` answers: the drafter a launch chose."""

    enabled: bool = True
    method: str = "mtp"
    model: str = ""
    requested: str = ""


@dataclass
class DraftConfig:
    """A stand-in launch config whose drafter choice is given (``drafter_memory`` reads only these)."""

    plan: StandInPlan
    language_model_only: bool = False

    def draft_plan(self) -> StandInPlan:
        return self.plan


def test_drafter_memory_of_each_source(tmp_path, monkeypatch):
    from gemma4_t4.catalog import assistants, models
    from gemma4_t4.serving.gate import DrafterMemory, _gib, drafter_memory

    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert drafter_memory(DraftConfig(StandInPlan(enabled=False)), 7 * GIB) == DrafterMemory(0, False, "no drafter")

    target = "google/gemma-4-12B-it-qat-w4a16-ct"
    itself = drafter_memory(DraftConfig(StandInPlan(method="draft_model", model=target, requested="self")), 7 * GIB)
    assert itself == DrafterMemory(
        7 * GIB, True, f"drafter {target}: 7.0 GiB from a second copy of the target's weights, plus its own KV cache"
    )

    assistant = "google/gemma-4-12B-it-qat-q4_0-unquantized-assistant"
    size = assistants.assistant_by_id(assistant).weights_bytes
    assert drafter_memory(DraftConfig(StandInPlan(model=assistant, requested=assistant)), 7 * GIB) == DrafterMemory(
        size, False, f"drafter {assistant}: {_gib(size)} from the assistant catalog"
    )

    whole = "google/gemma-4-E2B-it"
    for text_only in (False, True):
        estimate = models.weights_estimate("e2b", "bf16", text_only).total_bytes
        got = drafter_memory(
            DraftConfig(StandInPlan(method="draft_model", model=whole, requested=whole), language_model_only=text_only),
            7 * GIB,
        )
        assert got == DrafterMemory(
            estimate, True,
            f"drafter {whole}: {_gib(estimate)} from the fit calculator's e2b bf16 estimate, plus its own KV cache",
        )
    assert models.weights_estimate("e2b", "bf16", True).total_bytes != models.weights_estimate("e2b", "bf16", False).total_bytes
    # an MTP assistant that is a catalog model's name is not sized as a whole model
    assert drafter_memory(DraftConfig(StandInPlan(model=whole, requested=whole)), 7 * GIB).weights_bytes is None

    custom = "someone/custom-assistant"
    unknown = DrafterMemory(None, False, f"drafter {custom}: size unknown (not local, not cached, not catalogued)")
    assert drafter_memory(DraftConfig(StandInPlan(model=custom, requested=custom)), 7 * GIB) == unknown
    own = drafter_memory(DraftConfig(StandInPlan(method="draft_model", model=custom, requested=custom)), 7 * GIB)
    assert own.own_kv is True and own.weights_bytes is None
    folder = hub / "models--someone--custom-assistant" / "snapshots" / "x"
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("no weights yet")
    assert drafter_memory(DraftConfig(StandInPlan(model=custom, requested=custom)), 7 * GIB) == unknown
    (folder / "model.safetensors").write_bytes(b"\0" * 3000)
    assert drafter_memory(DraftConfig(StandInPlan(model=custom, requested=custom)), 7 * GIB) == DrafterMemory(
        3000, False, f"drafter {custom}: 0.0 GiB from its safetensors in the Hugging Face cache"
    )


# --- the GPU fit's verdict, detail and fix (_gpu_fit through probe_model's inputs) ----------------

T4_DEVICE = GOOD.host


def test_gpu_fit_fixes_for_a_model_too_big_and_a_context_too_long(tmp_path, monkeypatch):
    import re

    from gemma4_t4.serving.gate import _gpu_fit, catalog_entry
    from gemma4_t4.serving.server import ServerConfig

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    big = "google/gemma-4-26B-A4B-it"
    too_big = _gpu_fit(ServerConfig(model=big, target="t4"), catalog_entry(big), None, T4_DEVICE)
    assert too_big.gpu_fit_ok is False and too_big.gpu_fit_detail.startswith("26b-a4b bf16 on t4: does not fit")
    assert too_big.gpu_fit_fix == (
        "use a 4-bit (QAT w4a16) checkpoint or a smaller model, or spread over more GPUs (tensor_parallel_size); "
        "`gemma4-t4 fit` shows what fits"
    )
    qat = "google/gemma-4-12B-it-qat-w4a16-ct"
    alone = _gpu_fit(ServerConfig(model=qat, target="t4", max_model_len=131072), catalog_entry(qat), None, T4_DEVICE)
    assert alone.gpu_fit_ok is True and alone.gpu_fit_fix is None
    assert alone.gpu_fit_detail.startswith("12b qat-w4a16 on t4: fits")
    assistant = "google/gemma-4-12B-it-qat-q4_0-unquantized-assistant"
    drafted = _gpu_fit(ServerConfig(model=qat, target="t4", max_model_len=131072, draft=assistant),
                       catalog_entry(qat), None, T4_DEVICE)
    drafter = f"drafter {assistant}: 0.8 GiB from the assistant catalog"
    assert drafted.gpu_fit_ok is False
    assert drafted.gpu_fit_detail.startswith(f"12b qat-w4a16 + {drafter} on t4: weights fit, but")
    longest = int(re.search(r"max context (\d+)$", drafted.gpu_fit_detail).group(1))
    assert drafted.gpu_fit_fix == (
        f"lower max_model_len to {longest} or less (--max-model-len), or use a 4-bit checkpoint; `gemma4-t4 fit` "
        f"shows what fits; or --draft off (the drafter counts: {drafter})"
    )


def test_gpu_fit_outside_the_catalog_is_weights_plus_one_gib_within_vllms_share():
    from gemma4_t4.serving.gate import ModelFound, _gpu_fit
    from gemma4_t4.serving.server import ServerConfig

    config = ServerConfig(model="someone/x", target="t4", gpu_memory_utilization=0.5)  # 7.5 GiB of 15
    fits = _gpu_fit(config, None, 5 * GIB, T4_DEVICE)
    assert fits.gpu_fit_ok is True and fits.gpu_fit_fix is None and fits.notes == []
    assert fits.gpu_fit_detail == (
        "weights 5.0 GiB + 1 GiB runtime vs 7.5 GiB vLLM may use (gpu_memory_utilization 0.5; not a catalog "
        "model, so KV cache is not estimated)"
    )
    assert _gpu_fit(config, None, int(6.5 * GIB) - 1, T4_DEVICE).gpu_fit_ok is True
    assert _gpu_fit(config, None, int(6.5 * GIB), T4_DEVICE).gpu_fit_ok is False  # exactly full is not room
    assert _gpu_fit(config, None, None, T4_DEVICE) == ModelFound()


def test_catalog_entry_of_local_folders_and_hub_ids(tmp_path):
    import json

    from gemma4_t4.catalog import models
    from gemma4_t4.serving.gate import catalog_entry

    variant = models.VARIANTS["e2b"]
    size = {"hidden_size": variant.hidden_size, "num_hidden_layers": variant.num_layers}
    nested = tmp_path / "nested"
    nested.mkdir()
    (nested / "config.json").write_text(json.dumps({"text_config": size}))
    assert catalog_entry(str(nested)) == ("e2b", "bf16")
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "config.json").write_text(json.dumps({**size, "quantization_config": {"quant_method": "x"}}))
    assert catalog_entry(str(flat)) == ("e2b", "qat-w4a16")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"hidden_size": 7, "num_hidden_layers": variant.num_layers}))
    assert catalog_entry(str(other)) is None
    assert catalog_entry(str(tmp_path)) is None  # no config.json
    assert catalog_entry("google/gemma-4-E2B-it-emb4") == ("e2b", "emb4")
    assert catalog_entry("google/gemma-4-E2B-it-qat-w4a16-ct") == ("e2b", "qat-w4a16")
    assert catalog_entry("google/gemma-4-E2B-it") == ("e2b", "bf16")


def test_unknown_fit_and_disk_name_the_model_probes_notes_too():
    f = facts(gpu_fit_ok=None, disk_free_bytes=None, notes=["model: not a catalog id", "turing: unrelated"])
    reasons = judge(f)
    assert [(r.check, r.problem) for r in reasons] == [
        ("gpu_memory", "could not check that the model fits GPU memory (not a catalog id)"),
        ("disk", "could not check free disk for the weights (not a catalog id)"),
    ]
