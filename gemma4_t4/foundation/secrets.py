"""One masking rule for secrets, wherever they appear: argument lists, environments, free text.

A name is secret when, normalised (upper case, ``-`` as ``_``, leading dashes dropped), a word of it
is SECRET, PASSWORD, PASSWD, CREDENTIAL(S), APIKEY or AUTHORIZATION, or its last word is TOKEN (not
``..._per_token``) or KEY (or it ends in KEY_ID): ``HF_TOKEN``, ``--api-key``, ``AWS_ACCESS_KEY_ID`` are;
``max_num_batched_tokens``, ``first_token_s``, ``--ssl-keyfile`` and a bare ``key`` are not. Covered:
``--api-key K``, ``--api-key=K``, ``NAME=VALUE`` words, ``"NAME": "VALUE"`` in JSON text, ``{NAME: VALUE}``
mappings, ``Bearer ...``, Hugging Face (``hf_...``) and AWS (``AKIA...``) tokens, and any known secret value
inside text (a log line, an error body a server echoed, an MCP answer). The values the package knows are
:func:`known_values`: a key given as an option, and every secret-named variable of the environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

MASK = "***"
V = TypeVar("V")
_WORDS = {"SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY", "AUTHORIZATION"}
_TOKEN_PATTERNS = [
    re.compile(r"\bhf_[A-Za-z0-9]{16,}\b"),  # Hugging Face tokens
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),  # AWS access key ids
    re.compile(r"(?i)(\bBearer\s+)[^\s;,'\"]+"),
]
_MIN_VALUE_LEN = 3  # shorter "secrets" would mask every occurrence of e.g. "1" in a log


def is_secret_name(name: str) -> bool:
    words = [w for w in name.lstrip("-").upper().replace("-", "_").split("_") if w]
    if not words or words == ["KEY"]:
        return False
    if words[-1] == "TOKEN" and words[-2:-1] != ["PER"]:  # HF_TOKEN, --hf-token; not bytes_per_token
        return True
    return bool(_WORDS.intersection(words)) or words[-1] == "KEY" or words[-2:] == ["KEY", "ID"]


def mask_env(env: Mapping[str, V]) -> dict[str, V | str]:
    """A copy of ``env`` with every secret-named value replaced by ``***``."""
    return {k: (MASK if is_secret_name(k) and v not in (None, "") else v) for k, v in env.items()}


def mask_argv(argv: Iterable[str]) -> list[str]:
    """A copy of a command line with the value of every secret option or ``NAME=VALUE`` word masked."""
    out: list[str] = []
    hide_next = False
    for arg in map(str, argv):
        name, equals, _ = arg.partition("=")
        if hide_next:  # the value of `--secret-option VALUE`
            out.append(MASK)
            hide_next = False
        elif equals and (arg.startswith("-") or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)) and is_secret_name(name):
            out.append(f"{name}={MASK}")
        else:
            out.append(arg)
            hide_next = not equals and arg.startswith("--") and is_secret_name(arg)
    return out


def secret_values(argv: Iterable[str] = (), env: Mapping[str, str] | None = None,
                  extra: Iterable[str | None] = ()) -> list[str]:
    """The plain values that :func:`mask_argv` / :func:`mask_env` would hide (to scrub text with)."""
    values: list[str] = [v for v in extra if v]
    argv = [str(a) for a in argv]
    for i, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        # `--name value` only: a `--name=value` word's value may end in KEY/TOKEN (`--x=my-key`)
        if arg.startswith("--") and not equals and is_secret_name(arg) and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif equals and is_secret_name(name):
            values.append(value)
    for key, value in (env or {}).items():
        if is_secret_name(key) and value:
            values.append(str(value))
    return sorted({v for v in values if len(v) >= _MIN_VALUE_LEN and v != MASK}, key=len, reverse=True)


def known_values(extra: Iterable[str | None] = (), env: Mapping[str, str] | None = None) -> list[str]:
    """Every secret value the package knows: ``extra`` (e.g. the bench's API key) and the value of
    every secret-named variable of ``env`` (this process's environment by default: ``HF_TOKEN``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ...), as short as 3 characters."""
    return secret_values(env=os.environ if env is None else env, extra=extra)


def mask_text(text: str, values: Iterable[str | None] = ()) -> str:
    """``text`` with every known secret value (None: none given) and every recognisable token masked."""
    for value in sorted({v for v in values if v and len(v) >= _MIN_VALUE_LEN}, key=len, reverse=True):
        text = text.replace(value, MASK)
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + MASK, text)
    # "api_key": "K" / 'Authorization': 'Bearer K' in a JSON (or repr) body a server echoed
    text = re.sub(r"""(["'])([A-Za-z0-9_-]+)\1(\s*:\s*)(["'])((?:(?!\4)[^\\]|\\.)*)\4""",
                  lambda m: m.group(0)[: m.start(5) - m.start(0)] + MASK + m.group(4)
                  if is_secret_name(m.group(2)) and m.group(5) else m.group(0), text)
    # --api-key K / --api-key=K / NAME=VALUE written into free text
    text = re.sub(r"(--[A-Za-z0-9_-]+)([ =])([^\s;,'\"]+)",
                  lambda m: m.group(1) + m.group(2) + MASK if is_secret_name(m.group(1)) else m.group(0),
                  text)
    return re.sub(r"\b([A-Za-z_][A-Za-z0-9_]*)=([^\s;,'\"]+)",
                  lambda m: m.group(1) + "=" + MASK if is_secret_name(m.group(1)) else m.group(0), text)


def mask(value: Any, values: Iterable[str] = ()) -> Any:
    """Mask a JSON-like value: the string under a secret-named key, secret values in strings, argv-like
    lists. A number or flag under such a name (``api_key_used``) is data, not a secret, and stays."""
    values = list(values)
    if isinstance(value, str):
        return mask_text(value, values)
    if isinstance(value, Mapping):
        return {k: MASK if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v
                else mask(v, values) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = list(value)
        if all(isinstance(x, str) for x in items):
            items = mask_argv(items)
        return [mask(x, values) for x in items]
    return value
