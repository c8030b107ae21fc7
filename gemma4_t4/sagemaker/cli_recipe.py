"""Dry runs: the exact boto3 calls a command would make, printed as equivalent ``aws`` CLI
commands (the series teaches the CLI). Plans are built from the same parameters the real
call sends, so the recipe cannot drift from what runs.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from gemma4_t4.foundation import secrets
from gemma4_t4.foundation.jsonable import JSONValue


@dataclass
class ApiCall:
    """One AWS API call: ``service`` (boto3 client name), ``operation`` (boto3 method), params."""

    service: str
    operation: str
    params: dict[str, JSONValue] = field(default_factory=dict)  # boto3's request parameters
    region: str | None = None
    note: str | None = None  # printed as a comment above the command

    def cli(self) -> str:
        """``aws <service> <operation> --param value ...``; structures are passed as JSON."""
        parts = ["aws", self.service, _kebab(self.operation)]  # boto3 and CLI service names agree
        if self.region:
            parts += ["--region", shlex.quote(self.region)]
        for key, value in _redact(self.params).items():
            flag = "--" + _kebab(key)
            if isinstance(value, bool):
                parts.append(flag if value else "--no-" + flag[2:])
            elif isinstance(value, (dict, list)):
                parts += [flag, shlex.quote(json.dumps(value, separators=(",", ":")))]
            else:
                parts += [flag, shlex.quote(str(value))]
        command = " ".join(parts)
        return f"# {comment_line(self.note)}\n{command}" if self.note else command


def _kebab(name: str) -> str:
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name)
    return re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "-", name).replace("_", "-").lower()


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _redact(v) for k, v in value.items()}
        if "Environment" in out and isinstance(out["Environment"], dict):
            out["Environment"] = secrets.mask_env(out["Environment"])
        return out
    if isinstance(value, list):
        return [_redact(v) for v in value]
    return value


def comment_line(text: str) -> str:
    """One comment line whatever ``text`` holds: a newline in a note must not start a command."""
    return re.sub(r"[\x00-\x1f\x7f]+", " ", text)
