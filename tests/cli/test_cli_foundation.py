"""The gemma4-t4 CLI: doctor, models, fit and tiny through main([...]), plus the console script."""

from __future__ import annotations

import ast
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
    assert "26b-a4b" in text and "largest Gemma 4 that fits one T4" in text and "gemma-4-12B" in text
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


def _simulated_host(monkeypatch, **host) -> None:
    """Run `gemma4-t4 doctor` on a simulated host (fake probes from test_env_doctor: no GPU here)."""
    from gemma4_t4.host import env
    from tests.host.test_env_doctor import fake_probes

    monkeypatch.setattr("gemma4_t4.cli.doctor.doctor", lambda smem=False: env.doctor(fake_probes(**host), smem=smem))


def test_doctor_exit_code_follows_the_host(monkeypatch, capsys):
    _simulated_host(monkeypatch, files={"/sys/class/dmi/id/product_name": "Google Compute Engine\n"})
    assert main(["doctor"]) == 0  # a healthy GCE T4
    text = capsys.readouterr().out
    assert "Tesla T4 (15360 MiB, cc 7.5)" in text and text.rstrip().endswith("OK: no blocking problem")
    _simulated_host(monkeypatch, torch="2.13.0+cpu", torch_cuda=None)  # the series' first T4 failure
    assert main(["doctor"]) == 1
    assert "cpu-torch-on-gpu-host" in capsys.readouterr().out
    code, data = run_json(capsys, "doctor")
    assert code == 1 and data["ok"] is False
    assert [p["code"] for p in data["problems"] if p["severity"] == "error"] == ["cpu-torch-on-gpu-host"]


def test_doctor_on_this_machine_text_and_json(capsys):
    import platform
    import shutil

    code = main(["doctor"])
    text = capsys.readouterr().out
    assert platform.python_version() in text
    assert "vLLM + transformers" in text
    code_json, data = run_json(capsys, "doctor")
    assert code_json == code and set(data) >= {"facts", "pair", "problems", "ok"}
    errors = [p for p in data["problems"] if p["severity"] == "error"]
    assert code == (1 if errors else 0) and data["ok"] is (not errors)
    assert data["facts"]["nvidia_smi"] is (shutil.which("nvidia-smi") is not None)
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


def _commands(parser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], tuple[str, str]]:
    """Every command and subcommand below ``parser``: its help text and its handler's name."""
    found = {}
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for name, sub in action.choices.items():
            handler = sub.get_default("_handler")
            found[(*path, name)] = (sub.format_help(), handler.__qualname__ if handler else "")
            found.update(_commands(sub, (*path, name)))
    return found


def test_a_command_loads_only_its_own_module_and_parses_as_with_every_module_loaded():
    import pkgutil

    from gemma4_t4 import cli
    from gemma4_t4.cli import build_parser

    full = _commands(build_parser())
    modules = {m.name for m in pkgutil.iter_modules(cli.__path__)}
    commands = {path[0] for path in full}
    alone = {name for name in commands if name.replace("-", "_") in modules}
    assert {"setup", "doctor", "fix-torch", "serve", "sagemaker", "bench"} <= alone
    for name in commands:
        lazy = _commands(build_parser(name))
        loaded = {path[0] for path in lazy}
        # a module named after its command is loaded alone (with what else it registers: `models`
        # brings `fit`); every other command loads them all
        assert name in loaded and (loaded < commands if name in alone else loaded == commands), name
        assert {path: full[path] for path in lazy} == lazy, name  # the same help and handlers


def test_setup_starts_without_the_benchmark_or_studies_modules():
    code = ("import sys; from gemma4_t4.cli import main; main(['setup', '--dry-run', '--json']); "
            "print(sorted(m for m in sys.modules if m.startswith(('gemma4_t4.bench', 'gemma4_t4.studies', "
            "'gemma4_t4.cli.'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ast.literal_eval(done.stdout.splitlines()[-1]) == ["gemma4_t4.cli.setup"]


@pytest.mark.parametrize("argv", [["nonsense"], [""], ["--debug", "../setup"]])
def test_an_unknown_command_is_refused_with_every_command_listed(argv, capsys):
    with pytest.raises(SystemExit) as usage:
        main(argv)
    err = capsys.readouterr().err
    assert usage.value.code == 2 and "invalid choice" in err and "Traceback" not in err
    for name in ("bench", "doctor", "fix-torch", "grid-check", "sagemaker", "setup", "tune"):
        assert f"'{name}'" in err, err
