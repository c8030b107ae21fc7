"""The file-patch fallback, on a COPY of the installed vLLM kernel (the real .venv file is never touched).

GEMMA4_T4_VLLM_ROOT (a ``vllm`` package folder unpacked from a wheel) copies that release's files instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.turing.filepatch import (
    BEGIN,
    apply_file_patch,
    backup_path,
    file_patch_status,
    revert_file_patch,
)
from gemma4_t4.turing.offline import KERNEL_RELPATH, find_vllm_root, read_vllm_version

COPIED = ("_version.py", "v1/kv_cache_interface.py", "v1/attention/ops/triton_attention_helpers.py", str(KERNEL_RELPATH))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def vllm_copy(tmp_path) -> Path:
    """A minimal copy of the installed ``vllm`` package folder: version, kernel and its helpers."""
    installed = find_vllm_root(os.environ.get("GEMMA4_T4_VLLM_ROOT"))
    root = tmp_path / "site-packages" / "vllm"
    for rel in COPIED:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(installed / rel, root / rel)
    return root


@pytest.fixture(autouse=True)
def installed_file_untouched():
    kernel = find_vllm_root() / KERNEL_RELPATH
    before = sha(kernel)
    yield
    assert sha(kernel) == before and not backup_path(kernel).exists()


def test_apply_status_idempotent_revert(vllm_copy):
    kernel = vllm_copy / KERNEL_RELPATH
    original = kernel.read_bytes()
    assert not file_patch_status(kernel).patched

    result = apply_file_patch(kernel)
    assert result.action == "applied" and result.vllm_version == read_vllm_version(vllm_copy)
    assert backup_path(kernel).read_bytes() == original
    text = kernel.read_text()
    assert text.startswith(original.decode()) and text.count(BEGIN) == 1
    state = file_patch_status(kernel)
    assert state.patched and state.backup_matches and not state.stale
    assert state.original_sha256 == hashlib.sha256(original).hexdigest()

    patched = kernel.read_bytes()
    assert apply_file_patch(kernel).action == "already-applied"
    assert kernel.read_bytes() == patched

    result = revert_file_patch(kernel)
    assert result.action == "reverted"
    assert kernel.read_bytes() == original and not backup_path(kernel).exists()
    with pytest.raises(Gemma4T4Error, match="not patched: nothing to revert"):
        revert_file_patch(kernel)


def test_patched_file_installs_the_cap_when_vllm_imports_it(vllm_copy):
    pytest.importorskip("triton")
    from gemma4_t4.turing import tilecap
    from gemma4_t4.turing.offline import load_kernel_module

    apply_file_patch(vllm_copy / KERNEL_RELPATH)
    # The offline loader executes the patched file as vLLM would, with a T4-like platform (sm_75).
    module = load_kernel_module(vllm_copy, capability=(7, 5)).module
    outcome = getattr(module, tilecap.OUTCOME_ATTR)
    assert outcome["action"] == "capped" and outcome["origin"] == "file-patch"
    assert getattr(module._get_tile_size, tilecap.MARK) is not None
    # the plugin arriving second in the same process sees the file patch and changes nothing more
    again = tilecap.install(module, origin="plugin", device={"platform": "cuda", "capability": (7, 5),
                                                             "limit": 65_536, "limit_source": "target"},
                            vllm_version=read_vllm_version(vllm_copy), log=False)
    assert again["action"] == "already-active" and "file-patch" in again["reason"]


def test_unknown_version_is_refused_and_nothing_written(vllm_copy):
    version_file = vllm_copy / "_version.py"
    version_file.write_text(version_file.read_text().replace(read_vllm_version(vllm_copy), "0.40.0"))
    kernel = vllm_copy / KERNEL_RELPATH
    before = kernel.read_bytes()
    with pytest.raises(Gemma4T4Error, match=r"vLLM 0\.40\.0 is not a tested version") as info:
        apply_file_patch(kernel)
    assert "nothing was changed" in str(info.value)
    assert kernel.read_bytes() == before and not backup_path(kernel).exists()


def test_changed_kernel_is_refused(vllm_copy):
    kernel = vllm_copy / KERNEL_RELPATH
    kernel.write_text(kernel.read_text().replace("def _get_tile_size(", "def _select_tile("))
    before = kernel.read_bytes()
    version = re.escape(read_vllm_version(vllm_copy))
    with pytest.raises(Gemma4T4Error, match=rf"vLLM {version}: _get_tile_size\(\) is missing"):
        apply_file_patch(kernel)
    assert kernel.read_bytes() == before and not backup_path(kernel).exists()


def test_revert_without_or_with_a_bad_backup(vllm_copy):
    kernel = vllm_copy / KERNEL_RELPATH
    apply_file_patch(kernel)
    backup = backup_path(kernel)
    backup.write_bytes(backup.read_bytes() + b"# edited\n")
    with pytest.raises(Gemma4T4Error, match="does not match the original's recorded checksum"):
        revert_file_patch(kernel)
    backup.unlink()
    with pytest.raises(Gemma4T4Error, match="backup .* is missing") as info:
        revert_file_patch(kernel)
    assert f"pip install --force-reinstall --no-deps 'vllm=={read_vllm_version(vllm_copy)}'" in info.value.fix


def test_cli_apply_and_revert_with_path(vllm_copy):
    kernel = vllm_copy / KERNEL_RELPATH
    original = sha(kernel)

    def cli(*args):
        run = subprocess.run([sys.executable, "-m", "gemma4_t4", "turing", *args, "--json"],
                             capture_output=True, text=True, timeout=120)
        return run.returncode, json.loads(run.stdout)

    code, data = cli("apply", "--path", str(kernel))
    assert code == 0 and data["action"] == "applied"
    code, data = cli("apply", "--path", str(kernel))
    assert code == 0 and data["action"] == "already-applied"
    code, data = cli("revert", "--path", str(kernel))
    assert code == 0 and data["action"] == "reverted" and data["current_sha256"] == original
    code, data = cli("revert", "--path", str(kernel))
    assert code == 2 and "nothing to revert" in data["message"] and data["fix"]
