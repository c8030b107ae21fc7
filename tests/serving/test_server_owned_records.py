"""An ownership record (under the cache root's ``owned/``) that cannot be read is kept, and named (issue 41)."""

from __future__ import annotations

import pytest

from gemma4_t4.venues import endpoint as endpoints


def test_an_unreadable_ownership_record_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "owned"
    folder.mkdir(parents=True)
    (folder / "local-broken.json").write_bytes(b"")
    with pytest.warns(UserWarning, match="local-broken.json") as caught:  # before: kept without a word
        assert endpoints.reap_orphans() == []
    assert "empty" in str(caught[0].message) and (folder / "local-broken.json").exists()
