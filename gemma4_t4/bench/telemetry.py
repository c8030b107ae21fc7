"""What the server and the machine said during a run: ``/metrics`` scrapes, NVML samples and
the environment captured into every result.

The Prometheus parser is deliberately small: vLLM's exposition is one sample per line.
"""

from __future__ import annotations

import json
import platform
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gemma4_t4.bench.schemas import GPUTelemetry, PrefixCache, ServerInfo, ServerLoad, SpecDecode
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import JSONObject
from gemma4_t4.foundation.net import http_get
from gemma4_t4.foundation.runner import subprocess_runner
from gemma4_t4.foundation.versions import package_version
from gemma4_t4.host import smi

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class MetricsSnapshot:
    """Summed counters/gauges by metric name, plus the info labels, at one instant."""

    values: dict[str, float]
    info: dict[str, dict[str, str]] = field(default_factory=dict)
    # SPEC_PER_POS by its "position" label: the one labelled series a result breaks down
    per_position: dict[str, float] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        return self.values.get(name)


SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def snapshot_from_text(text: str) -> MetricsSnapshot:
    values: dict[str, float] = {}
    info: dict[str, dict[str, str]] = {}
    per_position: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)  # a comment (#) or a blank line is no sample
        if not match:
            continue
        try:
            value = float(match.group(4))
        except ValueError:
            continue
        name, labels = match.group(1), dict(_LABEL.findall(match.group(3) or ""))
        if name.endswith("_info"):
            info[name] = labels
            continue
        values[name] = values.get(name, 0.0) + value
        if name == SPEC_PER_POS and "position" in labels:
            per_position[labels["position"]] = per_position.get(labels["position"], 0.0) + value
    return MetricsSnapshot(values, info, per_position)


def scrape(base_url: str, api_key: str | None = None, timeout: float = 10.0) -> MetricsSnapshot | None:
    """One ``/metrics`` scrape, or None if the server exposes none (the run goes on without)."""
    try:
        status, body = http_get(base_url.rstrip("/") + "/metrics", timeout=timeout, api_key=api_key)
    except OSError:  # URLError included
        return None
    return snapshot_from_text(body.decode("utf-8", "replace")) if status == 200 else None


PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"


def prefix_cache_delta(before: MetricsSnapshot | None, after: MetricsSnapshot | None) -> PrefixCache:
    """Prefix-cache hit rate measured between two scrapes: Δhits / Δqueries (prompt tokens)."""
    if before is None or after is None:
        return PrefixCache(source="unavailable")
    q0, q1 = before.get(PREFIX_QUERIES), after.get(PREFIX_QUERIES)
    h0, h1 = before.get(PREFIX_HITS), after.get(PREFIX_HITS)
    if None in (q0, q1, h0, h1):
        return PrefixCache(source="not exposed")
    queries, hits = q1 - q0, h1 - h0
    # prefix_caching_enabled is set by the caller, whether or not the counters are exposed
    return PrefixCache(queries=queries, hits=hits, hit_rate=(hits / queries) if queries else None, source="/metrics")


def spec_decode_delta(before: MetricsSnapshot | None, after: MetricsSnapshot | None) -> SpecDecode | None:
    """Acceptance between two scrapes; None when the server exposes no spec-decode counters
    (it drafts nothing: vLLM registers them only with a speculative config)."""
    if after is None or after.get(SPEC_DRAFTS) is None:
        return None
    if before is None or before.get(SPEC_DRAFTS) is None:
        return SpecDecode(source="unavailable")

    def delta(name: str) -> float:
        return (after.get(name) or 0.0) - (before.get(name) or 0.0)

    drafts, draft_tokens, accepted = delta(SPEC_DRAFTS), delta(SPEC_DRAFT_TOKENS), delta(SPEC_ACCEPTED)
    positions, earlier = after.per_position, before.per_position
    per_position = [
        (positions[pos] - earlier.get(pos, 0.0)) / drafts
        for pos in sorted(positions, key=lambda p: int(p) if p.isdigit() else 0)
    ] if drafts else []
    return SpecDecode(
        drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted, source="/metrics",
        acceptance_rate=accepted / draft_tokens if draft_tokens else None,
        mean_accepted_length=1.0 + accepted / drafts if drafts else None,
        per_position_acceptance=per_position,
    )


def cache_config(snapshot: MetricsSnapshot | None) -> dict[str, str]:
    """Prefix caching on/off and block size, from ``vllm:cache_config_info``."""
    if snapshot is None:
        return {}
    labels = snapshot.info.get("vllm:cache_config_info") or {}
    keep = (
        "enable_prefix_caching", "block_size", "cache_dtype", "kv_cache_size_tokens",
        "kv_cache_max_concurrency", "gpu_memory_utilization",
    )
    return {k: labels[k] for k in keep if k in labels}


def check_reachable(base_url: str, model: str | None = None, api_key: str | None = None) -> ServerInfo:
    """Fail before the run if the server is unreachable or does not serve ``model``."""
    try:
        status, body = http_get(base_url.rstrip("/") + "/v1/models", timeout=10.0, api_key=api_key)
    except OSError as exc:  # URLError included
        raise Gemma4T4Error(
            f"cannot reach the server at {base_url}: {exc}",
            fix="start it (gemma4-t4 serve ...) or correct --base-url",
        ) from None
    if status == 401:
        raise Gemma4T4Error(f"{base_url} refused the request (HTTP 401)", fix="pass --api-key")
    if status != 200:
        raise Gemma4T4Error(
            f"{base_url}/v1/models returned HTTP {status}",
            fix="point --base-url at an OpenAI-compatible server",
        )
    try:
        listing = json.loads(body)
        models = listing.get("data", []) if isinstance(listing, dict) else None
    except ValueError:
        raise Gemma4T4Error(
            f"{base_url}/v1/models did not return JSON", fix="point --base-url at an OpenAI-compatible server"
        ) from None
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        raise Gemma4T4Error(
            f"{base_url}/v1/models did not return an OpenAI model list",
            fix="point --base-url at an OpenAI-compatible server (vLLM serves /v1/models)",
        )
    if not models:
        raise Gemma4T4Error(
            f"{base_url}/v1/models lists no model: the server serves nothing yet",
            fix="wait until the server has loaded its model (gemma4-t4 serve status), "
            "or point --base-url at a server that serves one",
        )
    ids = [m.get("id") for m in models]
    if model is not None and model not in ids:
        raise Gemma4T4Error(
            f"the server does not serve {model!r} (it serves {', '.join(map(str, ids))})",
            fix=f"use --model {ids[0]}",
        )
    entry = next((m for m in models if m.get("id") == model), models[0])
    return ServerInfo(
        models=ids, max_model_len=entry.get("max_model_len"), root=entry.get("root"), backend="openai-http"
    )


def server_version(base_url: str, api_key: str | None = None) -> str | None:
    try:
        status, body = http_get(base_url.rstrip("/") + "/version", timeout=5.0, api_key=api_key)
        return json.loads(body).get("version") if status == 200 else None
    except (OSError, ValueError):
        return None


def gpu_inventory() -> list[JSONObject]:
    """GPUs on this machine (none: empty), from the nvidia-smi probe the host model uses too: each its
    name, driver, memory_mib, max_sm_clock_mhz, power_limit_w and compute_cap ("7.5")."""
    gpus = smi.probe_gpu_state(smi.HostCommands()).gpus
    return [{"name": g.name, "driver": g.driver_version, "memory_mib": g.memory_mib,
             "max_sm_clock_mhz": g.max_sm_clock_mhz, "power_limit_w": g.power_limit_w,
             "compute_cap": g.compute_capability} for g in gpus]


def environment_record(server: JSONObject, gpus: list[JSONObject]) -> JSONObject:
    """What every result stores as its environment: captured_at, this client host (Python, platform,
    package versions), the server (an OpenAI-compatible server's base_url, model, version, cache_config
    and launch record, or a SageMaker endpoint's backend, region, endpoint, model and launch) and the GPUs."""
    versions = {name.replace("-", "_"): package_version(name) for name in ("gemma4-t4", "aiohttp", "boto3")}
    client = {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine()}
    return {"captured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "client": client | versions, "server": server,
            "gpus": gpus}


# a GPU sample's keys, and the nvidia-smi field each is read from
SMI_SAMPLE = {
    "sm_clock_mhz": "clocks.sm", "power_w": "power.draw", "throttle_reasons": "clocks_throttle_reasons.active",
    "memory_used_mib": "memory.used", "gpu_util_pct": "utilization.gpu", "temperature_c": "temperature.gpu",
}


def _smi_output(cmd: list[str]) -> str | None:
    done = subprocess_runner(cmd, timeout=5.0)
    return done.stdout if done.ok else None


GPUSample = dict[str, float]  # t, sm_clock_mhz, power_w, throttle_reasons (bit mask), memory_used_mib, ...


def parse_smi_sample(line: str) -> GPUSample | None:
    """One ``nvidia-smi --query-gpu=<SMI_SAMPLE's fields> --format=csv,noheader,nounits`` line -> a
    sample shaped like an NVML one (``[N/A]`` fields become 0; throttle reasons are a hex mask)."""
    rows = smi.parse_smi_csv(line, tuple(SMI_SAMPLE.values()))
    if not rows:
        return None
    sample: GPUSample = {"t": time.time()}
    for key, field_name in SMI_SAMPLE.items():
        raw = rows[0][field_name] or ""
        try:
            sample[key] = int(raw, 16) if key == "throttle_reasons" else float(raw)
        except ValueError:
            sample[key] = 0
    return sample


class _Poller:
    """A daemon thread that keeps ``samples`` once per ``interval_s`` (a subclass's ``_loop``) until stopped."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Any:
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def _join(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)


class GPUSampler(_Poller):
    """GPU samples (SM clock, power, throttle reasons, memory) once per ``interval_s`` in a thread:
    through NVML when ``pynvml`` (nvidia-ml-py) is importable, else by polling ``nvidia-smi``.
    Does nothing without a GPU; ``source`` says which ("nvml", "nvidia-smi" or None)."""

    def __init__(self, interval_s: float = 0.5, smi: Any = _smi_output, use_nvml: bool = True):
        super().__init__(interval_s)
        self._smi = smi
        self.source: str | None = None
        if use_nvml:
            try:
                import pynvml  # nvidia-ml-py

                pynvml.nvmlInit()
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
                self._nvml, self.source = pynvml, "nvml"
            except Exception:  # noqa: BLE001 - no driver, no GPU, no package: fall back to nvidia-smi
                pass
        if self.source is None and self._smi_sample():  # (no nvidia-smi: no sample)
            self.source = "nvidia-smi"

    @property
    def available(self) -> bool:
        return self.source is not None

    def _smi_sample(self) -> GPUSample | None:
        out = self._smi(smi.smi_query(tuple(SMI_SAMPLE.values()), index=0))
        return parse_smi_sample(out.strip().splitlines()[0]) if out and out.strip() else None

    def _sample(self) -> GPUSample | None:
        if self.source == "nvidia-smi":
            return self._smi_sample()
        nv, h = self._nvml, self._handle
        return {
            "t": time.time(),
            "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "throttle_reasons": int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
            "memory_used_mib": nv.nvmlDeviceGetMemoryInfo(h).used / 2**20,
            "gpu_util_pct": nv.nvmlDeviceGetUtilizationRates(h).gpu,
            "temperature_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        }

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self._sample()
                if sample is not None:
                    self.samples.append(sample)
            except Exception:  # noqa: BLE001
                pass
            self._stop.wait(self.interval_s)

    def start(self) -> GPUSampler:
        return super().start() if self.available else self

    def stop(self) -> GPUTelemetry | None:
        self._join()
        if not self.available:
            return None
        summary = summarize_gpu_samples(self.samples)
        summary.source = self.source
        return summary


# NVML clocks-throttle bits that matter on a 70 W T4
_THROTTLE_BITS = {
    0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
}


def summarize_gpu_samples(samples: list[GPUSample]) -> GPUTelemetry:
    if not samples:
        return GPUTelemetry()
    reasons = Counter(name for s in samples for bit, name in _THROTTLE_BITS.items() if s["throttle_reasons"] & bit)
    clocks = sorted(s["sm_clock_mhz"] for s in samples)
    power = [s["power_w"] for s in samples]
    return GPUTelemetry(
        samples=len(samples), sm_clock_mhz_median=clocks[len(clocks) // 2], sm_clock_mhz_min=clocks[0],
        power_w_mean=sum(power) / len(power), power_w_max=max(power),
        memory_used_mib_max=max(s["memory_used_mib"] for s in samples),
        throttled_fraction={k: v / len(samples) for k, v in reasons.items()},
    )


# each ServerLoad peak, and the gauge of /metrics it is the highest sample of
LOAD_GAUGES = {
    "max_running": "vllm:num_requests_running", "max_waiting": "vllm:num_requests_waiting",
    "max_kv_cache_usage": "vllm:kv_cache_usage_perc",
}


class MetricsSampler(_Poller):
    """Polls ``/metrics`` in a thread during a cell, once a second: running/waiting requests, KV usage."""

    def __init__(self, base_url: str, api_key: str | None = None):
        super().__init__(1.0)
        self.base_url, self.api_key = base_url, api_key

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            snap = scrape(self.base_url, self.api_key, timeout=self.interval_s * 2)
            if snap is None:
                continue
            self.samples.append({peak: snap.get(gauge) or 0.0 for peak, gauge in LOAD_GAUGES.items()})

    def stop(self) -> ServerLoad:
        self._join()
        if not self.samples:
            return ServerLoad()
        peaks = {peak: max(s[peak] for s in self.samples) for peak in LOAD_GAUGES}
        return ServerLoad(samples=len(self.samples), **peaks)
