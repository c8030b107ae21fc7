"""A real generation check: prompts with known answers, and rejection of degenerate text.

"Any non-empty reply" is not health: a broken deploy once answered ": ok: ok: ok ...". Each
probe must contain its expected answer and the reply must not be repetitive or garbled.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Probe:
    prompt: str
    expected: str  # regex, matched case-insensitively
    label: str


PROBES: tuple[Probe, ...] = (
    Probe("What is 17 + 25? Reply with only the number.", r"\b42\b", "arithmetic"),
    Probe("What is the capital of France? Reply with one word.", r"\bparis\b", "fact"),
)


def degenerate_reasons(text: str) -> list[str]:
    """Why ``text`` looks like a broken model; empty when it looks like language."""
    stripped = text.strip()
    if not stripped:
        return ["empty reply"]
    reasons = []
    if "\ufffd" in stripped:
        reasons.append("contains replacement characters (broken decoding)")
    alnum = sum(c.isalnum() for c in stripped)
    if alnum < 0.4 * len(stripped.replace(" ", "")):
        reasons.append("mostly punctuation or symbols")
    words = re.findall(r"\w+|[^\w\s]", stripped.lower())
    # the shortest n-gram repeated back to back 4+ times: ": ok: ok: ok: ok"
    repeated = next((words[i : i + n] for n in (1, 2, 3, 4) for i in range(len(words) - 4 * n + 1)
                     if words[i : i + n] * 4 == words[i : i + 4 * n]), None)
    if repeated:
        reasons.append(f"repeats {' '.join(repeated)!r} back to back")
    content = [w for w in words if w.isalnum()]
    if len(content) >= 12 and len(set(content)) / len(content) < 0.3:
        reasons.append(f"only {len(set(content))} distinct words in {len(content)}")
    return reasons


@dataclass
class ProbeResult:
    label: str
    prompt: str
    reply: str
    passed: bool
    reasons: list[str] = field(default_factory=list)


@dataclass
class HealthReport:
    healthy: bool
    probes: list[ProbeResult]
    summary: str


def assess(probe: Probe, reply: str) -> ProbeResult:
    reasons = degenerate_reasons(reply)
    if not re.search(probe.expected, reply, flags=re.IGNORECASE):
        reasons.append(f"expected answer /{probe.expected}/ not in reply")
    return ProbeResult(probe.label, probe.prompt, reply[:500], not reasons, reasons)


def check_health(ask: Callable[[str], str]) -> HealthReport:
    """Send each of :data:`PROBES` through ``ask`` (prompt -> reply text) and judge the replies."""
    results = []
    for probe in PROBES:
        try:
            reply = ask(probe.prompt)
        except Exception as exc:  # noqa: BLE001 - a failed request is an unhealthy probe, not a crash
            results.append(ProbeResult(probe.label, probe.prompt, "", False, [f"request failed: {exc}"]))
            continue
        results.append(assess(probe, reply))
    passed = sum(r.passed for r in results)
    healthy = passed == len(results)
    failures = "; ".join(f"{r.label}: {', '.join(r.reasons)}" for r in results if not r.passed)
    summary = f"{passed}/{len(results)} probes passed" + (f" ({failures})" if failures else "")
    return HealthReport(healthy, results, summary)
