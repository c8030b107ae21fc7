"""One masking rule for secrets in anything the benchmark stores or prints: a value whose key
names a secret, and the value after a secret flag in an argument list (``--api-key K`` and
``--api-key=K``). Results carry the fact that a key was used, never the key."""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
_SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password|passwd|authorization|credential)", re.I)
_SECRET_FLAG = re.compile(r"^--?(api[_-]?key|[a-z-]*token|[a-z-]*secret|password)(=.*)?$", re.I)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key)) and not key.lower().endswith(("_tokens", "tokens", "_token_s"))


def redact(value: Any) -> Any:
    """A copy of ``value`` (JSON-like) with every secret replaced by ``***``."""
    if isinstance(value, dict):
        return {
            k: (MASK if v and isinstance(k, str) and is_secret_key(k) and isinstance(v, str) else redact(v))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        mask_next = False
        for item in value:
            if mask_next:
                out.append(MASK)
                mask_next = False
                continue
            if isinstance(item, str) and _SECRET_FLAG.match(item):
                if "=" in item:
                    out.append(item.split("=", 1)[0] + "=" + MASK)
                else:
                    out.append(item)
                    mask_next = True
                continue
            out.append(redact(item))
        return out
    return value
