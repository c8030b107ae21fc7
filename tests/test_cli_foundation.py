"""The gemma4-t4 CLI: doctor, models, fit and tiny through main([...]), plus the console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gemma4_t4.cli import main


def run_json(capsys, *argv: str) -> tuple[int, object]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_models_json_has_the_published_figures(capsys):
    code, data = run_json(capsys, "models")
    assert code == 0
    by_key = {m["key"]: m for m in data}
    assert list(by_key) == ["e2b", "e4b", "12b", "26b-a4b", "31b"]
    e2b = by_key["e2b"]
    assert e2b["decode_bytes_gb"]["bf16"] == pytest.approx(4.597, abs=0.001)
    assert e2b["decode_bytes_gb"]["qat-w4a16"] == pytest.approx(1.862, abs=0.001)
    assert e2b["t4_roofline_tok_s"]["bf16"] == pytest.approx(69.6)
    assert e2b["t4_roofline_tok_s"]["qat-w4a16"] == pytest.approx(171.9)
    assert by_key["26b-a4b"]["hub"]["qat_w4a16_ct"] is None


def test_models_one_and_unknown(capsys):
    assert main(["models", "E2B"]) == 0
    out = capsys.readouterr().out
    assert "google/gemma-4-E2B-it-qat-w4a16-ct" in out and "KV-shared layers" in out
    assert main(["models", "gemma-4-7b"]) == 2
    assert "e2b" in capsys.readouterr().err


def test_fit_table_text_and_json(capsys):
    assert main(["fit", "--gpu", "t4"]) == 0
    text = capsys.readouterr().out
    assert "gemma-4-26B-A4B" in text and "largest Gemma 4 that fits one T4" in text and "gemma-4-12B" in text
    code, data = run_json(capsys, "fit", "--gpu", "t4")
    assert code == 0 and data["largest_fitting"] == "12b"
    fits = {(r["model"], r["format"]): r["fits"] for r in data["results"]}
    assert len(fits) == 15
    assert fits[("12b", "qat-w4a16")] and fits[("12b", "emb4")]
    assert not any(v for (m, _), v in fits.items() if m in ("26b-a4b", "31b"))


def test_fit_one_model_and_instance(capsys):
    code, data = run_json(capsys, "fit", "--model", "e2b", "--format", "qat", "--context", "16384")
    assert code == 0 and len(data["results"]) == 1
    assert data["results"][0]["fits"] and data["roofline"]["tok_s_spec"] == pytest.approx(171.9, abs=0.1)
    assert data["load_ram"]["peak_ram_gib"] > 10
    code, data = run_json(capsys, "fit", "--instance", "g4dn.12xlarge", "--model", "26b-a4b")
    assert data["num_gpus"] == 4 and any(r["fits"] for r in data["results"])
    code, data = run_json(capsys, "fit", "--format", "gguf")
    assert code == 2 and "bf16" in data["fix"]


def test_doctor_text_and_json(capsys):
    code = main(["doctor"])
    text = capsys.readouterr().out
    assert code in (0, 1) and "Python" in text and "vLLM + transformers" in text
    code, data = run_json(capsys, "doctor")
    assert set(data) >= {"facts", "pair", "problems", "ok"}
    assert code == (0 if data["ok"] else 1)
    if not data["facts"]["nvidia_smi"]:  # this CI machine
        assert any(p["code"] == "no-gpu" and p["fix"] for p in data["problems"])


def test_tiny_builds_and_refuses_to_overwrite(tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "tiny"
    code, data = run_json(capsys, "tiny", str(out), "--variant", "qat")
    assert code == 0 and data["variant"] == "qat"
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    config = json.loads((out / "config.json").read_text())
    assert config["global_head_dim"] != config["head_dim"]
    code, data = run_json(capsys, "tiny", str(out))
    assert code == 2 and "--overwrite" in data["fix"]
    assert (out / "model.safetensors").exists()  # nothing lost


def test_console_script_subprocess():
    script = Path(sys.executable).with_name("gemma4-t4")
    exe = str(script) if script.exists() else shutil.which("gemma4-t4")
    assert exe, "the gemma4-t4 console script is not installed (pip install -e .)"
    done = subprocess.run([exe, "fit", "--gpu", "t4", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["largest_fitting"] == "12b"
    verdicts = {(r["model"], r["format"]): r["fits"] for r in data["results"]}
    assert not any(verdicts[("26b-a4b", f)] for f in ("bf16", "qat-w4a16", "emb4"))
