"""The one plain HTTP GET the package uses against a local server (health, /metrics, /v1/models,
/version). Foundation level: the server manager and the benchmark both call it, so neither has to
import the other."""

from __future__ import annotations

import urllib.error
import urllib.request


def http_get(url: str, timeout: float = 2.0, api_key: str | None = None) -> tuple[int, bytes]:
    """``(status, body)``; an HTTP error status is returned, not raised (the caller judges it)."""
    request = urllib.request.Request(url)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
