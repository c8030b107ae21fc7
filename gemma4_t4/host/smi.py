"""nvidia-smi: the one query and parser of its output. Below both the host model
and the benchmark's telemetry, so recording a result's GPUs loads neither the host model nor the Turing
fix. A probe that fails, hangs or prints garbage is an error with its cause, never read as "no GPU"."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gemma4_t4.foundation.runner import probe_runner

RunFn = Callable[[list[str]], "tuple[int, str] | None"]


def run_probe(cmd: list[str]) -> tuple[int, str] | None:
    """Run a probe command through the package's runner; ``None`` only when it is not installed.
    A hung command answers ``(124, ...)``: that is a failure to report, not a missing tool."""
    if shutil.which(cmd[0]) is None:
        return None
    done = probe_runner(cmd)
    return None if done.missing else (done.returncode, done.stdout + done.stderr)


@dataclass
class HostCommands:
    """What the nvidia-smi probe runs: a command, and a look-up on PATH (the host's real ones by default;
    :class:`gemma4_t4.host.env.Probes` extends these, replaceable in tests)."""

    run: RunFn = run_probe
    which: Callable[[str], str | None] = shutil.which


@dataclass
class GPUInfo:
    index: int
    name: str
    memory_mib: int | None
    compute_capability: str | None  # "7.5"
    driver_version: str | None
    max_sm_clock_mhz: float | None = None
    power_limit_w: float | None = None


def parse_capability(cc: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """"7.5" or (7, 5) -> (7, 5); anything unreadable -> None."""
    if cc is None:
        return None
    if isinstance(cc, tuple):
        return (int(cc[0]), int(cc[1]))
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(cc))
    return (int(m.group(1)), int(m.group(2))) if m else None


SMI_FIELDS = ("index", "name", "memory.total", "compute_cap", "driver_version", "clocks.max.sm", "power.limit")
# every driver answers these; the others are asked one by one when the full query is refused
# (driver 470's nvidia-smi rejects compute_cap with exit 2)
SMI_ESSENTIAL = ("index", "name", "memory.total", "driver_version")
SMI_OPTIONAL = ("compute_cap", "clocks.max.sm", "power.limit")
_DRIVER_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?")
NO_DEVICES = re.compile(r"No devices were found|No NVIDIA GPU", re.I)


def smi_query(fields: Sequence[str], index: int | None = None) -> list[str]:
    """The ``nvidia-smi --query-gpu`` command line for ``fields`` (one CSV line per GPU)."""
    select = [f"--id={index}"] if index is not None else []
    return ["nvidia-smi", *select, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


def parse_smi_csv(out: str, fields: Sequence[str]) -> list[dict[str, str | None]]:
    """``--format=csv,noheader,nounits`` output -> one dict per GPU line; ``[N/A]`` and
    ``[Not Supported]`` become ``None``; lines with another column count (errors) are skipped."""
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    return [{f: (None if not c or c.startswith("[") else c) for f, c in zip(fields, cols, strict=True)}
            for cols in rows if len(cols) == len(fields)]


def _number(text: str | None) -> float | None:
    return float(text) if text and re.fullmatch(r"[\d.]+", text) else None


def _gpu_rows(out: str, fields: Sequence[str]) -> list[dict[str, str | None]]:
    rows = parse_smi_csv(out, fields)
    if not rows and tuple(fields) == SMI_FIELDS:  # simulated hosts may answer only the first five fields
        rows = parse_smi_csv(out, SMI_FIELDS[:5])
    return [r for r in rows if (r.get("index") or "").isdigit()]


def _to_gpu(row: dict[str, str | None]) -> GPUInfo:
    mem = _number(row.get("memory.total"))
    cc = row.get("compute_cap")
    return GPUInfo(int(row["index"] or 0), row.get("name") or "", int(mem) if mem is not None else None,
                   cc if re.fullmatch(r"\d+\.\d+", cc or "") else None, row.get("driver_version"),
                   _number(row.get("clocks.max.sm")), _number(row.get("power.limit")))


@dataclass
class GpuProbe:
    """What nvidia-smi said: installed or not, its GPUs and driver, or why it could not be read (named as
    the host facts name them: :class:`gemma4_t4.host.hostfacts.Facts` takes these fields as they are)."""

    nvidia_smi: bool  # installed
    gpus: list[GPUInfo] = field(default_factory=list)
    driver_version: str | None = None
    gpu_probe_error: str | None = None  # nvidia-smi failed / hung / printed garbage: never read as "no GPU"
    gpu_probe_fix: str | None = None
    nvidia_smi_path: str | None = None


def _smi_failure(code: int, out: str, path: str | None) -> tuple[str, str]:
    """(message, fix) for an nvidia-smi that ran but did not list GPUs."""
    where = f"nvidia-smi ({path})" if path else "nvidia-smi"
    first = next((ln.strip() for ln in out.splitlines() if ln.strip()), "")
    recheck = f"run {path or 'nvidia-smi'} by hand to see it"
    if code == 124:
        return (f"{where} hung: no answer within 20 s (a wedged driver or GPU); it was stopped with its children",
                f"{recheck}; reboot the VM, or reinstall the NVIDIA driver (>= 580) and reboot")
    if code == 9 or "couldn't communicate with the NVIDIA driver" in out:
        return (f"{where} could not talk to the NVIDIA driver (exit {code}: the kernel module is not loaded): "
                f"{first[:200]}", "load or reinstall the NVIDIA driver (sudo modprobe nvidia; on a fresh VM install "
                                  "driver >= 580), then reboot; setup refuses to guess a build meanwhile")
    if code != 0:
        return (f"{where} failed (exit {code}): {first[:200] or 'no output'}",
                f"{recheck}; if it is a stale copy, remove it from PATH; else reinstall the NVIDIA driver")
    if not out.strip():
        return f"{where} printed nothing for a GPU query (exit 0)", f"{recheck}; reinstall the NVIDIA driver"
    return (f"{where} printed output that is not a GPU list: {out.strip()[:160]!r}",
            f"{recheck}; if PATH holds another tool named nvidia-smi, put the driver's first")


def probe_gpu_state(p: HostCommands) -> GpuProbe:
    """Query nvidia-smi without trusting it: fields old drivers lack are asked one by one; "not
    installed" and "no devices" are no GPU; a failure, a hang or garbage is an error with its cause."""
    first = p.run(smi_query(SMI_FIELDS))
    if first is None:
        return GpuProbe(False)
    path = p.which("nvidia-smi")
    code, out = first
    rows = _gpu_rows(out, SMI_FIELDS) if code == 0 else []
    if code != 0 and code != 124 and not NO_DEVICES.search(out):
        # a driver that rejects a field (470: compute_cap): the essential fields, then each optional one
        code, out = p.run(smi_query(SMI_ESSENTIAL)) or (code, out)
        rows = _gpu_rows(out, SMI_ESSENTIAL) if code == 0 else []
        if rows:
            for name in SMI_OPTIONAL:
                extra = p.run(smi_query(("index", name)))
                if extra and extra[0] == 0:
                    values = {r["index"]: r[name] for r in _gpu_rows(extra[1], ("index", name))}
                    for row in rows:
                        row[name] = values.get(row["index"])
    if not rows:
        if NO_DEVICES.search(out) and "\ufffd" not in out:
            return GpuProbe(True, nvidia_smi_path=path)  # nvidia-smi says so: no GPU
        message, fix = _smi_failure(code, out, path)
        return GpuProbe(True, gpu_probe_error=message, gpu_probe_fix=fix, nvidia_smi_path=path)
    gpus = [_to_gpu(r) for r in rows]
    bad = [g.driver_version for g in gpus if not _DRIVER_VERSION.fullmatch(g.driver_version or "")]
    if bad or any("\ufffd" in g.name for g in gpus):
        what = f"driver version {bad[0]!r}" if bad else f"GPU name {gpus[0].name!r}"
        return GpuProbe(True, gpu_probe_error=f"nvidia-smi ({path or 'on PATH'}) reported {what}, which is not what a "
                                              "driver prints (expected e.g. 550.54.15)",
                        gpu_probe_fix="run nvidia-smi by hand; if PATH holds another tool named nvidia-smi, put the "
                                      "driver's first, else reinstall the NVIDIA driver", nvidia_smi_path=path)
    return GpuProbe(True, gpus, next((g.driver_version for g in gpus if g.driver_version), None), nvidia_smi_path=path)
