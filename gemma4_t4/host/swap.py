"""Swap for the weight load: status, and an idempotent, all-or-nothing swap-file creator.

On a 7.8 GB GCE VM vLLM was OOM-killed loading Gemma 4's weights until a 16 GiB swap file existed.
``create_swap`` checks first (enough already? permitted? disk space?), then runs fallocate (or dd),
chmod 600, mkswap and swapon; any failure removes the file it created. ``persist=True`` adds an
/etc/fstab line (after a backup). Colab and unprivileged containers forbid swapon: detected up front
and handled when swapon refuses. Every command goes through an injectable ``runner``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.runner import CommandResult, Runner, subprocess_runner
from gemma4_t4.host import env
from gemma4_t4.host.env import meminfo

# CommandResult, Runner and subprocess_runner stay importable from here (they used to live here).

GIB = 1024**3
MIB = 1024**2
DEFAULT_SWAP_PATH = "/swapfile"
DEFAULT_SWAP_SIZE = "16G"
DISK_HEADROOM_BYTES = 1 * GIB  # never fill the disk to the last byte
CAP_SYS_ADMIN = 21
SWAP_SIGNATURES = (b"SWAPSPACE2", b"SWAP-SPACE")


def parse_size(size: str) -> int:
    """'16G', '512M', '16GiB' or a byte count → bytes (binary units, as fallocate -l reads them)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", size, flags=re.IGNORECASE)
    if not match:
        raise Gemma4T4Error(f"cannot read swap size {size!r}", fix="write it like 16G or 8192M")
    scale = {"": 1, "K": 1024, "M": MIB, "G": GIB, "T": 1024 * GIB}[match.group(2).upper()]
    value = int(float(match.group(1)) * scale)
    if value < 64 * MIB:
        raise Gemma4T4Error(f"swap size {size!r} is too small", fix="use at least 64M (16G for Gemma 4 E2B)")
    return value


def _human(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


@dataclass
class SwapArea:
    path: str
    kind: str
    size_bytes: int
    used_bytes: int
    priority: int


def parse_proc_swaps(text: str) -> list[SwapArea]:
    """/proc/swaps (sizes in KiB) → areas."""
    rows = [line.split() for line in text.splitlines()[1:]]
    return [SwapArea(p[0].replace("\\040", " "), p[1], int(p[2]) * 1024, int(p[3]) * 1024, int(p[4]))
            for p in rows if len(p) >= 5]


@dataclass
class SwapEnvironment:
    """What decides whether this machine lets us add swap."""

    platform: str = "other"  # colab | gce | sagemaker | other
    is_root: bool = False
    sudo_ok: bool = False  # passwordless sudo works
    cap_sys_admin: bool | None = None  # in the bounding set: swapon needs it

    def refusal(self) -> tuple[str, str] | None:
        """(reason, fix) when swapon cannot work here, else None."""
        if self.platform == "colab":
            return ("Colab does not allow swap (swapon fails with 'Operation not permitted')",
                    "on Colab use the QAT w4a16 checkpoint or a High-RAM runtime instead of swap")
        if self.cap_sys_admin is False:
            return ("swapon needs CAP_SYS_ADMIN, which this (unprivileged) container lacks",
                    "create the swap file on the host, or run the container with --cap-add SYS_ADMIN")
        if not (self.is_root or self.sudo_ok):
            return ("creating swap needs root, and passwordless sudo is not available",
                    "run it as root: sudo \"$(which gemma4-t4)\" swap create ...")
        return None

    def prefix(self) -> list[str]:
        return [] if self.is_root else ["sudo", "-n"]


def _cap_in_bounding_set(cap: int, status_text: str | None = None) -> bool | None:
    try:
        text = status_text if status_text is not None else Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(r"^CapBnd:\s*([0-9a-f]+)", text, flags=re.MULTILINE)
    return bool(int(match.group(1), 16) >> cap & 1) if match else None


def detect_swap_environment(runner: Runner = subprocess_runner) -> SwapEnvironment:
    is_root = os.geteuid() == 0
    sudo_ok = not is_root and bool(shutil.which("sudo")) and runner(["sudo", "-n", "true"]).returncode == 0
    return SwapEnvironment(platform=env.detect_platform(env.Probes())[0], is_root=is_root, sudo_ok=sudo_ok,
                           cap_sys_admin=_cap_in_bounding_set(CAP_SYS_ADMIN))


@dataclass
class SwapStatus:
    areas: list[SwapArea]
    total_bytes: int
    used_bytes: int
    ram_total_bytes: int | None
    can_create: bool
    reason: str | None  # why swap can't be created here
    fix: str | None
    platform: str

    def summary(self) -> str:
        lines = [f"swap: {_human(self.total_bytes)} total, {_human(self.used_bytes)} used"
                 + (f"; RAM {_human(self.ram_total_bytes)}" if self.ram_total_bytes else "")]
        lines += [f"  {a.path} ({a.kind}): {_human(a.size_bytes)}, {_human(a.used_bytes)} used"
                  for a in self.areas]
        if not self.can_create:
            lines.append(f"cannot add swap here: {self.reason}\n  fix: {self.fix}")
        return "\n".join(lines)


def read_proc_swaps(proc_swaps: Path = Path("/proc/swaps")) -> list[SwapArea]:
    try:
        return parse_proc_swaps(proc_swaps.read_text())
    except OSError:
        return []


def swap_status(env: SwapEnvironment | None = None, proc_swaps: Path = Path("/proc/swaps")) -> SwapStatus:
    env = env or detect_swap_environment()
    areas = read_proc_swaps(proc_swaps)
    refusal = env.refusal()
    ram = meminfo().get("MemTotal")  # the doctor's reading of RAM
    return SwapStatus(areas, sum(a.size_bytes for a in areas), sum(a.used_bytes for a in areas),
                      None if ram is None else round(ram * GIB), refusal is None, *(refusal or (None, None)),
                      env.platform)


def has_swap_signature(path: Path) -> bool:
    """mkswap writes SWAPSPACE2 in the last 10 bytes of the first page."""
    try:
        with open(path, "rb") as handle:
            for page in (4096, 8192, 16384, 65536):
                handle.seek(page - 10)
                if handle.read(10) in SWAP_SIGNATURES:
                    return True
    except OSError:
        return False
    return False


@dataclass
class SwapResult:
    action: Literal["created", "activated-existing", "already-active", "dry-run"]
    path: str
    size_bytes: int
    commands: list[str] = field(default_factory=list)  # run, or to run (dry run)
    persisted: bool = False
    fstab_line: str | None = None
    fstab_backup: str | None = None
    message: str = ""
    would_refuse: str | None = None  # dry run only: why a real run would refuse

    def summary(self) -> str:
        lines = [self.message]
        if self.commands:
            lines.append("commands (dry run, nothing changed):" if self.action == "dry-run" else "ran:")
            lines += [f"  {c}" for c in self.commands]
        if self.would_refuse:
            lines.append(f"a real run would refuse: {self.would_refuse}")
        return "\n".join(lines)


def _fstab_has(fstab: Path, path: str) -> bool:
    try:
        text = fstab.read_text()
    except OSError:
        return False
    return any(line.split()[:1] == [path] for line in text.splitlines() if not line.lstrip().startswith("#"))


@dataclass
class _Steps:
    """Runs commands with the privilege prefix; records what ran; raises with stderr on failure."""

    runner: Runner
    prefix: list[str]
    dry_run: bool
    ran: list[str] = field(default_factory=list)

    def __call__(self, command: list[str], input: str | None = None, check: bool = True) -> None:
        full = self.prefix + command
        self.ran.append(shlex.join(full) + (f"  <<< {input.strip()!r}" if input else ""))
        if self.dry_run:
            return
        result = self.runner(full, input=input)
        if check and result.returncode != 0:
            raise _StepFailed(command[0], result)


class _StepFailed(Exception):
    def __init__(self, tool: str, result: CommandResult):
        super().__init__(f"{tool} failed ({result.returncode}): {(result.stderr or result.stdout).strip()}")
        self.tool, self.result = tool, result


def _not_permitted(text: str) -> bool:
    return "not permitted" in text.lower() or "permission denied" in text.lower()


def create_swap(size: str = DEFAULT_SWAP_SIZE, path: str = DEFAULT_SWAP_PATH, persist: bool = False,
                dry_run: bool = False, runner: Runner = subprocess_runner, env: SwapEnvironment | None = None,
                proc_swaps: Path = Path("/proc/swaps"), fstab: Path = Path("/etc/fstab"),
                disk_free: Callable[[Path], int] | None = None) -> SwapResult:
    """Make ``path`` an active swap file of ``size`` (idempotent, all or nothing)."""
    size_bytes = parse_size(size)
    swap_path = Path(path).absolute()
    path = str(swap_path)
    env = env or detect_swap_environment(runner)
    steps = _Steps(runner, env.prefix(), dry_run)
    refusal = env.refusal()
    if refusal and not dry_run:
        raise Gemma4T4Error(f"cannot create swap here: {refusal[0]}", fix=refusal[1])
    refusals = [refusal] if refusal else []

    active = {a.path: a for a in read_proc_swaps(proc_swaps)}
    if path in active:
        result = SwapResult("already-active", path, active[path].size_bytes,
                            message=f"{path} is already active swap ({_human(active[path].size_bytes)}); "
                                    "nothing to do")
    elif swap_path.exists():
        _check_reusable(swap_path, size_bytes)
        result = _activate_existing(steps, swap_path, size_bytes)
    else:
        try:
            _check_room(swap_path, size_bytes, disk_free)
        except Gemma4T4Error as short:
            if not dry_run:
                raise
            # A dry run previews the whole plan and names each refusal a real run would meet.
            refusals.append((short.message, short.fix))
        result = _create_new(steps, swap_path, size_bytes)
    if dry_run:  # the same steps, recorded and not run (they all "succeed")
        if result.action != "already-active":
            verb = "activate" if result.action == "activated-existing" else "create"
            result.message = f"would {verb} a {_human(size_bytes)} swap file at {path}"
        result.action = "dry-run"
        result.would_refuse = "; ".join(f"{why} (fix: {fix})" for why, fix in refusals) or None
    return _persist(result, persist, fstab, steps)


def _check_reusable(swap_path: Path, size_bytes: int) -> None:
    """An existing file is only ever activated, never overwritten: it must be a big enough swap file."""
    path = str(swap_path)
    if not swap_path.is_file() or not has_swap_signature(swap_path):
        raise Gemma4T4Error(f"{path} exists and is not a swap file; leaving it untouched",
                            fix="pass another --path, or remove that file yourself if it is not needed")
    if swap_path.stat().st_size < size_bytes:
        raise Gemma4T4Error(
            f"{path} is an inactive swap file of {_human(swap_path.stat().st_size)}, smaller than "
            f"{_human(size_bytes)}",
            fix=f"remove it (sudo rm {path}) and run again, or pass another --path")


def _check_room(swap_path: Path, size_bytes: int, disk_free: Callable[[Path], int] | None) -> None:
    """The folder exists and its disk keeps headroom after the new file."""
    parent = swap_path.parent
    if not parent.is_dir():
        raise Gemma4T4Error(f"folder {parent} does not exist", fix="pass a --path in an existing folder")
    free = (disk_free or (lambda p: shutil.disk_usage(p).free))(parent)
    if free < size_bytes + DISK_HEADROOM_BYTES:
        raise Gemma4T4Error(
            f"not enough free disk for a {_human(size_bytes)} swap file: {parent} has {_human(free)} free "
            f"(need {_human(size_bytes + DISK_HEADROOM_BYTES)} including {_human(DISK_HEADROOM_BYTES)} "
            "headroom)",
            fix="pass a smaller --size, or a --path on a disk with more space")


def _activate_existing(steps: _Steps, swap_path: Path, size_bytes: int) -> SwapResult:
    path = str(swap_path)
    try:
        steps(["chmod", "600", path])
        steps(["swapon", path])
    except _StepFailed as exc:
        raise _swap_error(exc, created=False) from None
    return SwapResult("activated-existing", path, size_bytes if steps.dry_run else swap_path.stat().st_size,
                      message=f"activated the existing swap file {path}")


def _create_new(steps: _Steps, swap_path: Path, size_bytes: int) -> SwapResult:
    """fallocate (dd where fallocate can't make a usable swap file), chmod, mkswap, swapon; any
    failure removes the file, so nothing is left half-done."""
    path = str(swap_path)
    for method in ("fallocate", "dd"):  # dd is never retried: the loop returns or raises
        try:
            steps(["fallocate", "-l", str(size_bytes), path] if method == "fallocate" else
                  ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={size_bytes // MIB}", "status=none"])
            steps(["chmod", "600", path])
            steps(["mkswap", path])
            steps(["swapon", path])
        except _StepFailed as exc:
            steps(["rm", "-f", path], check=False)  # nothing half-done
            text = exc.result.stderr + exc.result.stdout
            retry_with_dd = method == "fallocate" and (
                exc.tool == "fallocate" or (exc.tool == "swapon" and ("invalid argument" in text.lower()
                                                                      or "holes" in text.lower())))
            if retry_with_dd and not _not_permitted(text):
                continue  # filesystems without fallocate support, or holes swapon rejects
            raise _swap_error(exc, created=True) from None
        return SwapResult("created", path, size_bytes,
                          message=f"created and activated a {_human(size_bytes)} swap file at {path}"
                                  + (" (dd: fallocate did not work here)" if method == "dd" else ""))
    raise AssertionError("unreachable: the dd attempt returns or raises")


def _swap_error(exc: _StepFailed, created: bool) -> Gemma4T4Error:
    text = (exc.result.stderr or exc.result.stdout).strip()
    cleaned = " The partly made swap file was removed; nothing changed." if created else ""
    if exc.tool == "swapon" and _not_permitted(text):
        return Gemma4T4Error(
            f"swapon is not permitted here ({text}): this environment (Colab, an unprivileged container) "
            f"forbids swap.{cleaned}",
            fix="add swap on the host (or a VM you control), or use a smaller checkpoint such as QAT w4a16")
    if exc.tool in ("fallocate", "dd") and ("no space" in text.lower()):
        return Gemma4T4Error(f"{exc.tool} ran out of disk space ({text}).{cleaned}",
                             fix="pass a smaller --size, or a --path on a disk with more space")
    return Gemma4T4Error(f"{exc}.{cleaned}", fix="read the error above; run with --dry-run to see every command")


def _persist(result: SwapResult, persist: bool, fstab: Path, steps: _Steps) -> SwapResult:
    """Add the fstab line (backup first) when asked and not there yet (a dry run records the commands
    and the line)."""
    if persist and _fstab_has(fstab, result.path):
        if not steps.dry_run:
            result.persisted = True
            result.message += f"; {fstab} already mounts it at boot"
    elif persist:
        line, backup = f"{result.path} none swap sw 0 0", f"{fstab}.gemma4-t4.bak.{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            steps(["cp", "-p", str(fstab), backup])
            steps(["tee", "-a", str(fstab)], input=line + "\n")
        except _StepFailed as exc:
            raise Gemma4T4Error(f"swap is active, but adding it to {fstab} failed: {exc}",
                                fix=f"add this line to {fstab} yourself: {line}") from None
        result.fstab_line = line
        if not steps.dry_run:
            result.persisted, result.fstab_backup = True, backup
            result.message += f"; added to {fstab} (backup: {backup})"
    result.commands = steps.ran
    return result
