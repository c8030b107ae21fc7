"""What the start gate tells a user, word for word: every reason's problem and fix, the report and
the override warning, the refusal's error; and which facts decide between them (fix command only
when torch cannot see CUDA, swap size rounding, the Turing limit's wording). Pure: GateFacts in,
reasons out, or check_start / check_cpu_start with stand-in probes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gemma4_t4.host import cpuisa, env
from gemma4_t4.serving.gate import (
    GIB,
    GateFacts,
    GateProbes,
    GateReason,
    GateRefused,
    GateResult,
    check_cpu_start,
    check_start,
    collect_facts,
    judge,
    judge_cpu,
)
from tests.serving.test_gate_judge import GOOD as JUDGE_GOOD

# the judge tests' healthy T4, with round RAM figures so every message below reads exactly
GOOD = JUDGE_GOOD.model_copy(update={"ram_total_bytes": 8 * GIB, "ram_available_bytes": 7 * GIB})

TORCH_FIX = "gemma4-t4 fix-torch --apply"
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


def facts(**changes) -> GateFacts:
    return GOOD.model_copy(update=changes)


def only(reasons: list[GateReason]) -> tuple[str, str, str]:
    assert len(reasons) == 1, reasons
    return reasons[0].check, reasons[0].problem, reasons[0].fix


# --- 1. torch and CUDA ----------------------------------------------------------------------------


def test_torch_missing_names_its_notes_and_the_fix_command():
    f = facts(cuda_available=None, torch_version=None,
              notes=["torch: ImportError: no torch", "model: unrelated", "torch: second"])
    assert only(judge(f, torch_fix_command="pip install torch==2.14.0+cu130")) == (
        "cuda",
        "torch is not installed (or fails to import) in this Python (ImportError: no torch; second)",
        "gemma4-t4 fix-torch --apply  (runs: pip install torch==2.14.0+cu130)",
    )
    assert only(judge(f))[2] == TORCH_FIX


def test_no_gpu_on_the_machine():
    assert only(judge(facts(cuda_available=False, gpu_present=False))) == (
        "cuda",
        "no NVIDIA GPU is visible on this machine (nvidia-smi finds none)",
        "run on a T4 host (Colab: Runtime > Change runtime type > T4 GPU), or serve on CPU with "
        "target='cpu' (CLI: --target cpu)",
    )


def test_cpu_only_torch_build():
    assert only(judge(facts(cuda_available=False, torch_version="2.14.0+cpu", torch_cuda_build=None))) == (
        "cuda",
        "torch 2.14.0+cpu is a CPU-only build, so the GPU is invisible to vLLM",
        TORCH_FIX,
    )


def test_a_cuda_build_that_cannot_use_the_gpu_points_at_the_driver():
    assert only(judge(facts(cuda_available=False))) == (
        "cuda",
        "torch 2.14.0+cu130 (CUDA 13.0) cannot use the GPU: usually a driver older than the CUDA build needs",
        "update the NVIDIA driver (CUDA 13 builds need driver >= 580), or install the torch build matching "
        "your driver (gemma4-t4 fix-torch shows the command)",
    )


def test_cuda_state_unknown_fails_closed():
    assert only(judge(facts(cuda_available=None))) == (
        "cuda",
        "could not find out whether torch sees CUDA",
        "run gemma4-t4 doctor and fix what it reports",
    )


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
                       compute_capability=(8, 9), gpu_name="NVIDIA L4")) == []


# --- 3. host memory -------------------------------------------------------------------------------


def test_host_memory_unknown_names_its_notes():
    f = facts(load_peak_bytes=None, notes=["host_memory: psutil failed", "model: not a catalog id", "disk: x"])
    assert only(judge(f)) == (
        "host_memory",
        "could not estimate host memory for the weight load (psutil failed; not a catalog id)",
        "use a catalog model or a local checkpoint folder, or pass force=True if you know it fits",
    )
    for missing in ("ram_available_bytes", "swap_free_bytes"):
        assert only(judge(facts(**{missing: None})))[0] == "host_memory"


def test_host_memory_short_asks_for_swap_rounded_up_plus_two_gib():
    # 30 GiB and one byte short: 31 GiB rounded up, plus 2
    f = facts(ram_available_bytes=2 * GIB, swap_free_bytes=0, load_peak_bytes=32 * GIB + 1)
    assert only(judge(f)) == (
        "host_memory",
        "RAM available 2.0 GiB + free swap 0.0 GiB = 2.0 GiB < 32.0 GiB needed while loading the weights; "
        "the kernel would OOM-kill vLLM mid-load",
        "add swap: sudo gemma4-t4 swap create --size 33G (or use a machine with more RAM, or a smaller "
        "checkpoint such as the QAT w4a16 one)",
    )
    # exactly 30 GiB short: 32G; a small shortfall still asks for at least 16G
    assert "--size 32G " in only(judge(facts(ram_available_bytes=2 * GIB, swap_free_bytes=0,
                                              load_peak_bytes=32 * GIB)))[2]
    small = only(judge(facts(ram_available_bytes=GIB, swap_free_bytes=GIB, load_peak_bytes=3 * GIB)))
    assert small[1].startswith("RAM available 1.0 GiB + free swap 1.0 GiB = 2.0 GiB < 3.0 GiB needed")
    assert "--size 16G " in small[2]
    # 14 GiB short: 14 + 2 = 16, and 15 GiB short: 17
    assert "--size 16G " in only(judge(facts(ram_available_bytes=GIB, swap_free_bytes=GIB,
                                              load_peak_bytes=16 * GIB)))[2]
    assert "--size 17G " in only(judge(facts(ram_available_bytes=GIB, swap_free_bytes=GIB,
                                              load_peak_bytes=17 * GIB)))[2]


def test_host_memory_exactly_enough_passes_and_ram_plus_swap_both_count():
    assert judge(facts(ram_available_bytes=5 * GIB, swap_free_bytes=7 * GIB, load_peak_bytes=12 * GIB)) == []
    assert only(judge(facts(ram_available_bytes=5 * GIB, swap_free_bytes=7 * GIB,
                            load_peak_bytes=12 * GIB + 1)))[0] == "host_memory"


def test_colab_cannot_add_swap():
    f = facts(platform="colab", ram_available_bytes=2 * GIB, swap_free_bytes=0)
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


# --- 6. doctor ------------------------------------------------------------------------------------


def test_doctor_errors_keep_their_code_message_and_fix():
    errors = [
        env.Problem("error", "old-driver", "driver 470", None),
        env.Problem("error", "bad-pair", "vllm 0.32 with torch 2.10", "pip install vllm==0.33.0"),
    ]
    reasons = judge(facts(doctor_errors=errors))
    assert [(r.check, r.problem, r.fix) for r in reasons] == [
        ("doctor:old-driver", "driver 470", "run gemma4-t4 doctor for details"),
        ("doctor:bad-pair", "vllm 0.32 with torch 2.10", "pip install vllm==0.33.0"),
    ]


def test_reasons_come_in_check_order():
    f = facts(cuda_available=None, turing_fix_active=False, load_peak_bytes=None, gpu_fit_ok=None,
              disk_free_bytes=None, doctor_errors=[env.Problem("error", "x", "y", "z")])
    assert [r.check for r in judge(f)] == ["cuda", "turing", "host_memory", "gpu_memory", "disk", "doctor:x"]


# --- results, reports, refusals -------------------------------------------------------------------


def test_report_override_warning_and_line():
    reason = GateReason("disk", "no room", "free some")
    assert reason.line() == "[disk] no room\n    fix: free some"
    two = [GateReason("turing", "a", "b"), reason]
    refused = GateResult(ok=False, forced=False, reasons=two, facts=GOOD)
    assert refused.report() == "start gate refused to launch vLLM: 2 reason(s)\n[turing] a\n    fix: b\n" + reason.line()
    assert refused.overridden == []
    forced = GateResult(ok=False, forced=True, reasons=two, facts=GOOD)
    assert forced.report().startswith("start gate overridden: 2 reason(s)\n")
    assert forced.overridden == two
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
    """Stand-in probes that must not run (the facts are given) and count the fix-command asks."""

    def __init__(self):
        def fail(*_):
            raise AssertionError("a probe ran although the facts were given")

        super().__init__(torch=fail, turing=fail, host_memory=fail, model=fail, platform=fail,
                         cpu_build=fail, torch_fix_command=self.command)
        self.asked = 0

    def command(self):
        self.asked += 1
        return "pip install torch==2.14.0+cu130"


def test_check_start_asks_for_the_torch_command_only_when_cuda_is_not_seen():
    probes = Recording()
    result = check_start(Config(), probes=probes, facts=GOOD)
    assert (result.ok, result.forced, result.reasons) == (True, False, [])
    assert probes.asked == 0
    with pytest.raises(GateRefused) as refused:
        check_start(Config(), probes=probes, facts=facts(cuda_available=False, torch_cuda_build=None))
    assert probes.asked == 1
    error = refused.value
    assert error.result.ok is False and error.result.forced is False
    assert error.message == (
        "start gate refused to launch vLLM: 1 reason(s)\n[cuda] torch 2.14.0+cu130 is a CPU-only build, so the "
        "GPU is invisible to vLLM\n    fix: gemma4-t4 fix-torch --apply  (runs: pip install torch==2.14.0+cu130)"
    )
    assert error.fix == "fix each reason above, or pass force=True (CLI: --force) to launch anyway"
    assert error.to_dict()["reasons"] == [
        {"check": "cuda", "problem": error.result.reasons[0].problem, "fix": error.result.reasons[0].fix}
    ]
    forced = check_start(Config(), force=True, probes=probes, facts=facts(cuda_available=None))
    assert (forced.ok, forced.forced, [r.check for r in forced.reasons]) == (False, True, ["cuda"])
    assert check_start(Config(), force=True, probes=probes, facts=GOOD).forced is False


def _cpu_probes(answer):
    probes = Recording()
    probes.cpu_build = lambda config: answer
    return probes


def test_cpu_gate_refuses_int4_without_the_kernel_word_for_word():
    config = Config(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="cpu")
    with pytest.raises(GateRefused) as refused:
        check_cpu_start(config, probes=_cpu_probes(GateFacts(model_int4=True, cpu_int4_kernel=False)))
    result = refused.value.result
    assert result.facts.target == "cpu" and result.facts.model == config.model
    assert only(result.reasons) == (
        "cpu_int4",
        "google/gemma-4-E2B-it-qat-w4a16-ct is an int4 (compressed-tensors pack-quantized) checkpoint, but "
        f"vLLM's CPU build here lacks the int4 kernel {cpuisa.INT4_OP}",
        cpuisa.INT4_FIX,
    )
    detail = GateFacts(model_int4=True, cpu_int4_kernel=False, cpu_build_detail="the AVX2 build has no int4 kernel")
    forced = check_cpu_start(config, force=True, probes=_cpu_probes(detail))
    assert (forced.ok, forced.forced) == (False, True)
    assert forced.reasons[0].problem.endswith("checkpoint, but the AVX2 build has no int4 kernel")


@pytest.mark.parametrize(
    "answer",
    [
        GateFacts(model_int4=True, cpu_int4_kernel=True),
        GateFacts(model_int4=False, cpu_int4_kernel=False),
        GateFacts(model_int4=None, cpu_int4_kernel=False),
        GateFacts(model_int4=True, cpu_int4_kernel=None),
    ],
)
def test_cpu_gate_passes_unless_int4_meets_a_build_known_to_lack_the_kernel(answer):
    result = check_cpu_start(Config(target="cpu"), probes=_cpu_probes(answer))
    assert (result.ok, result.forced, result.reasons) == (True, False, [])


def test_the_int4_check_is_the_cpu_targets_only():
    f = GateFacts(target="t4", model="m", model_int4=True, cpu_int4_kernel=False)
    assert judge_cpu(f) == []
    assert [r.check for r in judge_cpu(f.model_copy(update={"target": "cpu"}))] == ["cpu_int4"]


def test_a_failing_cpu_probe_leaves_the_facts_unknown_and_passes():
    def broken(config):
        raise OSError("lscpu missing")

    probes = Recording()
    probes.cpu_build = broken
    result = check_cpu_start(Config(target="cpu"), probes=probes)
    assert result.ok and result.facts.notes == ["cpu_int4: OSError: lscpu missing"]


def test_the_platform_probe_answers_only_when_the_torch_probe_did_not():
    calls = []

    def platform():
        calls.append(1)
        return "colab"

    probes = GateProbes(
        torch=lambda: GateFacts(platform="gce"),
        turing=lambda cc: GateFacts(),
        host_memory=lambda: GateFacts(),
        model=lambda config, device: GateFacts(),
        platform=platform,
    )
    assert collect_facts(Config(), probes).platform == "gce" and calls == []
    probes.torch = lambda: GateFacts()
    assert collect_facts(Config(), probes).platform == "colab" and calls == [1]

    def broken():
        raise RuntimeError("no metadata server")

    probes.platform = broken
    assert collect_facts(Config(), probes).platform is None


# --- the CPU build probe and the platform probe ---------------------------------------------------


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
    plain = gate.probe_cpu_build(Config(model=str(bf16), target="cpu"))
    assert plain.model_int4 is False and plain.model_fields_set == {"model_int4"} and asked == []

    int4 = tmp_path / "int4"
    int4.mkdir()
    config = {"model_type": "gemma4_text", "quantization_config": qconfig.quantization_config(32, [], False)}
    (int4 / "config.json").write_text(json.dumps(config))

    @dataclass
    class WithPython(Config):
        python: str = "/opt/venv/bin/python"

    found = gate.probe_cpu_build(WithPython(model=str(int4), target="cpu"))
    assert (found.model_int4, found.cpu_int4_kernel, found.cpu_build_detail) == (
        True, False, "stand-in: no int4 kernel"
    )
    assert asked == ["/opt/venv/bin/python"]
    gate.probe_cpu_build(Config(model=str(int4), target="cpu"))  # a config without a python: this one's
    assert asked == ["/opt/venv/bin/python", None]


def test_platform_probe_is_the_host_models_platform():
    from gemma4_t4.host import env
    from gemma4_t4.serving import gate

    assert gate.detect_platform() == env.detect_platform(env.Probes())[0]


# --- the device facts read from the host model (facts_from_host) --------------------------------


def _host(gpus, problems=(), **facts_changes):
    from gemma4_t4.host import env

    base = dict(os="Linux", kernel="6.1", machine="x86_64", python="3.11.9", platform="gce",
                platform_evidence="DMI: Google", nvidia_smi=True, gpus=list(gpus),
                torch_version="2.14.0+cu130", torch_cuda="13.0", smem_probed=True,
                smem_per_block_optin=65_536, torch_compute_capability="7.5")
    base.update(facts_changes)
    pair = env.PairStatus(vllm=None, transformers=None, status="missing", detail="stand-in")
    return env.EnvReport(facts=env.Facts(**base), pair=pair, problems=list(problems))


def _gpu(index, name="Tesla T4", memory_mib=15_360, cc="7.5"):
    from gemma4_t4.host import env

    return env.GPUInfo(index=index, name=name, memory_mib=memory_mib, compute_capability=cc, driver_version="580.65")


def test_host_facts_of_a_working_t4():
    from gemma4_t4.host import env
    from gemma4_t4.serving.gate import facts_from_host

    problems = [
        env.Problem("error", "driver-too-old", "driver 535", "update the driver"),
        env.Problem("error", "no-gpu", "covered by the gate itself"),
        env.Problem("error", "cuda-init-failed", "covered"),
        env.Problem("error", "cpu-torch-on-gpu-host", "covered"),
        env.Problem("error", "nvidia-smi-failed", "covered"),
        env.Problem("warning", "old-vllm", "only a warning"),
    ]
    f = facts_from_host(_host([_gpu(0), _gpu(1)], problems))
    assert (f.platform, f.torch_version, f.torch_cuda_build) == ("gce", "2.14.0+cu130", "13.0")
    assert (f.gpu_present, f.gpu_name, f.gpu_count) == (True, "Tesla T4", 2)
    assert f.compute_capability == (7, 5) and f.smem_per_block_optin == 65_536
    assert f.gpu_memory_bytes == 15_360 * 2**20
    assert f.cuda_available is True
    assert f.doctor_errors == [env.Problem("error", "driver-too-old", "driver 535", "update the driver")]
    assert f.notes == []


def test_host_facts_count_only_gpus_like_the_chosen_one_and_note_the_choice():
    from gemma4_t4.serving.gate import facts_from_host

    gpus = [_gpu(0, "NVIDIA L4", 23_034, "8.9"), _gpu(1), _gpu(2)]
    f = facts_from_host(_host(gpus, torch_compute_capability=None))
    assert (f.gpu_name, f.gpu_count, f.compute_capability) == ("Tesla T4", 2, (7, 5))
    assert len(f.notes) == 1 and f.notes[0].startswith("mixed GPUs (0: NVIDIA L4, 1: Tesla T4, 2: Tesla T4): GPU 1")


def test_host_facts_without_cuda_torch_or_gpu():
    from gemma4_t4.serving.gate import facts_from_host

    cpu_torch = facts_from_host(_host([_gpu(0)], torch_version="2.14.0+cpu", torch_cuda=None, smem_probed=False,
                                      torch_compute_capability=None))
    assert cpu_torch.torch_cuda_build is None and cpu_torch.cuda_available is False
    failed = facts_from_host(_host([_gpu(0)], cuda_probe_error="CUDA driver version is insufficient"))
    assert failed.cuda_available is False and failed.notes == ["CUDA driver version is insufficient"]
    no_torch = facts_from_host(_host([_gpu(0)], torch_version=None, torch_cuda=None))
    assert no_torch.cuda_available is None and "cuda_available" not in no_torch.model_fields_set
    no_smi = facts_from_host(_host([], nvidia_smi=False, torch_compute_capability=None, smem_per_block_optin=None))
    assert (no_smi.gpu_present, no_smi.gpu_name, no_smi.gpu_count, no_smi.gpu_memory_bytes) == (False, None, 0, None)
    assert no_smi.cuda_available is False  # no capability read: CUDA did not work
    empty_smi = facts_from_host(_host([], nvidia_smi=True, torch_compute_capability=None))
    assert empty_smi.gpu_present is False
    unknown_memory = facts_from_host(_host([_gpu(0, memory_mib=None)]))
    assert unknown_memory.gpu_memory_bytes is None


# --- small readers: GiB text, model format, host memory, torch probe, HF cache, model probe ---------


def test_gib_text():
    from gemma4_t4.serving.gate import _gib

    assert _gib(None) == "?"
    assert _gib(3 * GIB // 2) == "1.5 GiB"


def test_host_facts_of_a_cpu_torch_that_names_a_cuda_and_of_a_host_without_nvidia_smi():
    from gemma4_t4.serving.gate import facts_from_host

    plus_cpu = facts_from_host(_host([_gpu(0)], torch_version="2.14.0+cpu", torch_cuda="12.8"))
    assert plus_cpu.torch_cuda_build is None
    no_smi = facts_from_host(_host([_gpu(0)], nvidia_smi=False))
    assert no_smi.gpu_present is False


def test_cpu_gate_never_calls_a_passing_start_forced():
    passing = check_cpu_start(Config(target="cpu"), force=True,
                              probes=_cpu_probes(GateFacts(model_int4=False, cpu_int4_kernel=False)))
    assert (passing.ok, passing.forced) == (True, False)
    with pytest.raises(GateRefused) as refused:
        check_cpu_start(Config(target="cpu"), probes=_cpu_probes(GateFacts(model_int4=True, cpu_int4_kernel=False)))
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


def test_host_memory_probe_reads_psutil(monkeypatch):
    from types import SimpleNamespace

    from gemma4_t4.serving import gate

    monkeypatch.setattr(gate.psutil, "virtual_memory", lambda: SimpleNamespace(total=8, available=5))
    monkeypatch.setattr(gate.psutil, "swap_memory", lambda: SimpleNamespace(total=16, free=12))
    found = gate.probe_host_memory()
    assert (found.ram_total_bytes, found.ram_available_bytes, found.swap_total_bytes, found.swap_free_bytes) == (
        8, 5, 16, 12
    )


def test_torch_probe_asks_the_doctor_to_read_the_device_through_torch(monkeypatch):
    from gemma4_t4.host import env
    from gemma4_t4.serving import gate

    asked = []

    def stand_in_doctor(**kwargs):
        asked.append(kwargs)
        return _host([_gpu(0)])

    monkeypatch.setattr(env, "doctor", stand_in_doctor)
    found = gate.probe_torch()
    assert asked == [{"smem": True}]
    assert found.gpu_name == "Tesla T4" and found.cuda_available is True


def test_hf_cache_dir_follows_hf_hub_cache_then_hf_home_then_home(tmp_path, monkeypatch):
    from pathlib import Path

    from gemma4_t4.serving.gate import hf_cache_dir

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hubcache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert hf_cache_dir() == tmp_path / "hubcache"
    monkeypatch.delenv("HF_HUB_CACHE")
    assert hf_cache_dir() == tmp_path / "hfhome" / "hub"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hf_cache_dir() == Path(tmp_path / "home" / ".cache" / "huggingface" / "hub")


def test_model_probe_reads_a_cached_download_and_estimates_a_missing_one(tmp_path, monkeypatch):
    from gemma4_t4.catalog import models
    from gemma4_t4.serving import gate
    from gemma4_t4.serving.server import ServerConfig

    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    model = "google/gemma-4-E2B-it"
    device = GateFacts(gpu_memory_bytes=15 * GIB, gpu_name="Tesla T4")
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

T4_DEVICE = GateFacts(gpu_memory_bytes=15 * GIB, gpu_name="Tesla T4")


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
    from gemma4_t4.serving.gate import _gpu_fit
    from gemma4_t4.serving.server import ServerConfig

    config = ServerConfig(model="someone/x", target="t4", gpu_memory_utilization=0.5)  # 7.5 GiB of 15
    fits = _gpu_fit(config, None, 5 * GIB, T4_DEVICE)
    assert fits.model_fields_set == {"gpu_fit_ok", "gpu_fit_detail"}
    assert fits.gpu_fit_ok is True
    assert fits.gpu_fit_detail == (
        "weights 5.0 GiB + 1 GiB runtime vs 7.5 GiB vLLM may use (gpu_memory_utilization 0.5; not a catalog "
        "model, so KV cache is not estimated)"
    )
    assert _gpu_fit(config, None, int(6.5 * GIB) - 1, T4_DEVICE).gpu_fit_ok is True
    assert _gpu_fit(config, None, int(6.5 * GIB), T4_DEVICE).gpu_fit_ok is False  # exactly full is not room
    assert _gpu_fit(config, None, None, T4_DEVICE).model_fields_set == set()


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
    f = facts(gpu_fit_ok=None, disk_free_bytes=None, notes=["model: not a catalog id", "torch: unrelated"])
    reasons = judge(f)
    assert [(r.check, r.problem) for r in reasons] == [
        ("gpu_memory", "could not check that the model fits GPU memory (not a catalog id)"),
        ("disk", "could not check free disk for the weights (not a catalog id)"),
    ]
