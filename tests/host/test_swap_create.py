"""Swap creation through a fake command runner: nothing here touches the machine's real swap or
/etc/fstab. The fake acts on temporary files only (fallocate makes a sparse file, mkswap writes
the signature, swapon adds the path to a fake /proc/swaps), and can be told to fail a tool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemma4_t4.cli import main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host.swap import (
    GIB,
    CommandResult,
    SwapEnvironment,
    create_swap,
    has_swap_signature,
    parse_proc_swaps,
    parse_size,
    swap_status,
)

ROOT = SwapEnvironment(platform="gce", is_root=True, cap_sys_admin=True)
PROC_HEADER = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"


class FakeRunner:
    """Records commands; performs their effect on tmp files; fails the tools listed in ``fail``."""

    def __init__(self, proc_swaps: Path, fail: dict[str, CommandResult] | None = None):
        self.proc_swaps = proc_swaps
        self.fail = fail or {}
        self.calls: list[list[str]] = []
        if not proc_swaps.exists():
            proc_swaps.write_text(PROC_HEADER)

    def __call__(self, command: list[str], input: str | None = None) -> CommandResult:
        self.calls.append(command)
        args = command[2:] if command[:2] == ["sudo", "-n"] else command
        tool = args[0]
        if tool in self.fail:
            return self.fail[tool]
        if tool == "fallocate":
            with open(args[-1], "wb") as handle:
                handle.truncate(int(args[2]))  # sparse: no real disk used
        elif tool == "dd":
            target = next(a[3:] for a in args if a.startswith("of="))
            count = int(next(a[6:] for a in args if a.startswith("count=")))
            with open(target, "wb") as handle:
                handle.truncate(count * 1024 * 1024)
        elif tool == "mkswap":
            with open(args[1], "r+b") as handle:
                handle.seek(4086)
                handle.write(b"SWAPSPACE2")
        elif tool == "swapon":
            size_kib = Path(args[1]).stat().st_size // 1024
            with open(self.proc_swaps, "a") as handle:
                handle.write(f"{args[1]}\tfile\t{size_kib}\t0\t-2\n")
        elif tool == "rm":
            Path(args[-1]).unlink(missing_ok=True)
        elif tool == "cp":
            Path(args[3]).write_bytes(Path(args[2]).read_bytes())
        elif tool == "tee":
            with open(args[2], "a") as handle:
                handle.write(input or "")
        return CommandResult(0)

    def tools(self) -> list[str]:
        return [c[2] if c[:2] == ["sudo", "-n"] else c[0] for c in self.calls]


@pytest.fixture
def box(tmp_path: Path):
    fstab = tmp_path / "fstab"
    fstab.write_text("UUID=abc / ext4 defaults 0 1\n")
    proc = tmp_path / "proc_swaps"
    return {"path": str(tmp_path / "swapfile"), "fstab": fstab, "proc": proc,
            "runner": FakeRunner(proc), "kw": {"fstab": fstab, "proc_swaps": proc, "disk_free": lambda p: 100 * GIB}}


def test_create_then_idempotent_with_persist_and_fstab_backup(box):
    runner = box["runner"]
    result = create_swap("16G", box["path"], persist=True, runner=runner, env=ROOT, **box["kw"])
    assert result.action == "created" and result.size_bytes == 16 * GIB
    assert runner.tools() == ["fallocate", "chmod", "mkswap", "swapon", "cp", "tee"]
    assert has_swap_signature(Path(box["path"]))
    assert box["fstab"].read_text().endswith(f"{box['path']} none swap sw 0 0\n")
    assert Path(result.fstab_backup).read_text() == "UUID=abc / ext4 defaults 0 1\n"
    # second run: already active, fstab already has it, nothing runs
    runner.calls.clear()
    again = create_swap("16G", box["path"], persist=True, runner=runner, env=ROOT, **box["kw"])
    assert again.action == "already-active" and runner.calls == []
    assert box["fstab"].read_text().count(box["path"]) == 1


def test_no_persist_leaves_fstab_alone(box):
    create_swap("1G", box["path"], runner=box["runner"], env=ROOT, **box["kw"])
    assert box["fstab"].read_text() == "UUID=abc / ext4 defaults 0 1\n"
    assert "cp" not in box["runner"].tools()


def test_full_disk_is_refused_before_anything_runs(box):
    kw = box["kw"] | {"disk_free": lambda p: 10 * GIB}
    with pytest.raises(Gemma4T4Error, match="not enough free disk") as info:
        create_swap("16G", box["path"], runner=box["runner"], env=ROOT, **kw)
    assert "--size" in info.value.fix
    assert box["runner"].calls == [] and not Path(box["path"]).exists()


def test_a_dry_run_on_a_full_disk_shows_the_plan_and_names_every_refusal_a_real_run_would_meet(box):
    kw = box["kw"] | {"disk_free": lambda p: 10 * GIB}
    env = SwapEnvironment(platform="colab", is_root=True, cap_sys_admin=True)
    result = create_swap("16G", box["path"], dry_run=True, runner=box["runner"], env=env, **kw)
    assert result.action == "dry-run" and box["runner"].calls == [] and not Path(box["path"]).exists()
    assert [c.split()[0] for c in result.commands] == ["fallocate", "chmod", "mkswap", "swapon"]
    assert "Colab" in result.would_refuse and "not enough free disk" in result.would_refuse
    assert result.would_refuse.count("pass a smaller --size") == 1 and "\n" not in result.would_refuse
    assert "a real run would refuse: " in result.summary()
    roomy = create_swap("16G", box["path"], dry_run=True, runner=box["runner"], env=ROOT, **box["kw"])
    assert roomy.would_refuse is None


def test_swapon_not_permitted_cleans_up(box):
    runner = FakeRunner(box["proc"], fail={"swapon": CommandResult(
        255, "", f"swapon: {box['path']}: swapon failed: Operation not permitted")})
    with pytest.raises(Gemma4T4Error, match="swapon is not permitted") as info:
        create_swap("2G", box["path"], persist=True, runner=runner, env=ROOT, **box["kw"])
    assert "nothing changed" in str(info.value)
    assert runner.tools() == ["fallocate", "chmod", "mkswap", "swapon", "rm"]
    assert not Path(box["path"]).exists()
    assert box["fstab"].read_text() == "UUID=abc / ext4 defaults 0 1\n"
    assert parse_proc_swaps(box["proc"].read_text()) == []


@pytest.mark.parametrize("env, words", [
    (SwapEnvironment(platform="colab", is_root=True, cap_sys_admin=True), "Colab does not allow swap"),
    (SwapEnvironment(platform="other", is_root=True, cap_sys_admin=False), "CAP_SYS_ADMIN"),
    (SwapEnvironment(platform="gce", is_root=False, sudo_ok=False, cap_sys_admin=True), "needs root"),
])
def test_forbidden_environments_are_refused_up_front(box, env, words):
    with pytest.raises(Gemma4T4Error, match=words) as info:
        create_swap("16G", box["path"], runner=box["runner"], env=env, **box["kw"])
    assert info.value.fix
    assert box["runner"].calls == [] and not Path(box["path"]).exists()
    assert swap_status(env, proc_swaps=box["proc"]).can_create is False


def test_dry_run_prints_commands_and_the_refusal_it_would_meet(box):
    env = SwapEnvironment(platform="colab", is_root=True, cap_sys_admin=True)
    result = create_swap("16G", box["path"], persist=True, dry_run=True, runner=box["runner"], env=env,
                         **box["kw"])
    assert result.action == "dry-run" and box["runner"].calls == []
    assert [c.split()[0] for c in result.commands] == ["fallocate", "chmod", "mkswap", "swapon", "cp", "tee"]
    assert "Colab" in result.would_refuse
    assert not Path(box["path"]).exists()


def test_sudo_prefix_when_not_root(box):
    env = SwapEnvironment(platform="gce", is_root=False, sudo_ok=True, cap_sys_admin=True)
    create_swap("1G", box["path"], runner=box["runner"], env=env, **box["kw"])
    calls = box["runner"].calls
    # every step ran, each through non-interactive sudo (an empty call list must not pass)
    assert [c[2] for c in calls][:4] == ["fallocate", "chmod", "mkswap", "swapon"]
    assert all(c[:2] == ["sudo", "-n"] for c in calls)


def test_dd_fallback_when_fallocate_fails(box):
    runner = FakeRunner(box["proc"], fail={"fallocate": CommandResult(1, "", "fallocate: Operation not supported")})
    result = create_swap("1G", box["path"], runner=runner, env=ROOT, **box["kw"])
    assert result.action == "created" and "dd" in result.message
    assert runner.tools() == ["fallocate", "rm", "dd", "chmod", "mkswap", "swapon"]


def test_existing_files_are_never_overwritten(box):
    other = Path(box["path"])
    other.write_text("precious data")
    with pytest.raises(Gemma4T4Error, match="not a swap file"):
        create_swap("1G", box["path"], runner=box["runner"], env=ROOT, **box["kw"])
    assert other.read_text() == "precious data" and box["runner"].calls == []
    # an inactive swap file (e.g. after a reboot without --persist) is re-activated, not rebuilt
    with open(other, "wb") as handle:
        handle.truncate(2 * GIB)
        handle.seek(4086)
        handle.write(b"SWAPSPACE2")
    result = create_swap("1G", box["path"], runner=box["runner"], env=ROOT, **box["kw"])
    assert result.action == "activated-existing" and box["runner"].tools() == ["chmod", "swapon"]


def test_parse_size_and_proc_swaps():
    assert parse_size("16G") == 16 * GIB and parse_size("512M") == 512 * 2**20 and parse_size("16GiB") == 16 * GIB
    for bad in ("sixteen", "16X", "1M"):
        with pytest.raises(Gemma4T4Error):
            parse_size(bad)
    areas = parse_proc_swaps(PROC_HEADER + "/swapfile\tfile\t16777212\t1024\t-2\n")
    assert areas[0].path == "/swapfile" and areas[0].size_bytes == 16777212 * 1024 and areas[0].used_bytes == 1024 * 1024


def test_cli_dry_run_for_real_changes_nothing(tmp_path, capsys):
    target = tmp_path / "swapfile"
    assert main(["swap", "create", "--size", "1G", "--path", str(target), "--dry-run", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["action"] == "dry-run" and any(c.startswith(("fallocate", "sudo")) for c in data["commands"])
    assert not target.exists()
    assert main(["swap", "status", "--json"]) == 0
    assert "total_bytes" in json.loads(capsys.readouterr().out)
