"""Every result a notebook shows displays itself: an HTML table in Jupyter (``_repr_html_``) and a
text table elsewhere (``str``), with the values it holds. Each result is built from small real
inputs (a benchmark run against the fake server, the tiny QAT checkpoint, the catalog, the
committed H200 prefill measurements), never from a stand-in of the result itself."""

from __future__ import annotations

import dataclasses
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fakes.fake_openai_server import FakeScript, FakeServer, FakeServerState

from gemma4_t4 import notebook as nb
from gemma4_t4 import quant
from gemma4_t4 import tutorial_part1 as part1
from gemma4_t4.bench import compare_runs, published, run_benchmark
from gemma4_t4.bench.answers import AnswerComparison, Divergence
from gemma4_t4.bench.compare import (
    CellComparison,
    Headline,
    Ratio,
    RunComparison,
    compare_suites,
    published_decode,
)
from gemma4_t4.bench.pricing import CostTable, measured_price
from gemma4_t4.bench.schemas import SpecDecode
from gemma4_t4.catalog import models
from gemma4_t4.catalog.hardware import PRICES
from gemma4_t4.cli.turing import bench_prefill_text, verify_text
from gemma4_t4.foundation.table import Displayable, Table, pairs, text_table
from gemma4_t4.sagemaker import cost, ops, quotas
from gemma4_t4.sagemaker.deploy import DeployResult, TimelineEvent
from gemma4_t4.serving.server_state import free_port
from gemma4_t4.studies.ttft_route import TtftOnOffReport
from gemma4_t4.turing import smem
from gemma4_t4.turing.prefill_bench import PrefillBenchReport, decide
from gemma4_t4.turing.verify import LaunchCheck, VerifyReport

REPO = Path(__file__).resolve().parents[1]
DECODE = {"concurrency": [1, 2], "input_len": 16, "output_len": 6, "num_prompts": 4, "warmup": 1}


class _Cells(HTMLParser):
    """The caption, header cells and body cells of one HTML table (what a browser would show)."""

    def __init__(self, page: str):
        super().__init__()
        self.caption, self.head, self.body, self._where, self._text = "", [], [], None, None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        if tag in ("caption", "th", "td"):
            self._where, self._text = tag, ""

    def handle_data(self, data):
        if self._text is not None:
            self._text += data

    def handle_endtag(self, tag):
        if tag == self._where:
            {"caption": lambda t: setattr(self, "caption", t), "th": self.head.append,
             "td": self.body.append}[tag](self._text)  # fmt: skip
            self._where, self._text = None, None


def together(*results: Displayable, title: str | None = None) -> Table:
    """Several results of one kind in one table (e.g. two repacks), each contributing its rows."""
    return Table([row for result in results for row in result.table_rows()], title=title)


def _shown(result: Displayable) -> tuple[_Cells, str]:
    """(the HTML table parsed, the text table), after checking both show the same columns."""
    assert isinstance(result, Displayable)
    page, text = result._repr_html_(), str(result)
    assert page.startswith("<table>") and page.endswith("</table>")
    cells = _Cells(page)
    table = text_table(*result.table_parts())  # the text display
    assert cells.head and all(h in table for h in cells.head) and all(v in table for v in cells.body), table
    assert not cells.caption or table.splitlines()[0] == cells.caption
    assert text == table or type(result).__str__ is not Displayable.__str__
    printed: list[str] = []

    class Printer:  # IPython's pretty printer hands the text display to .text
        def text(self, value):
            printed.append(value)

    result._repr_pretty_(Printer(), False)
    assert printed == [text]
    return cells, text


# ---------------------------------------------------------------- benchmark runs and comparisons


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two complete decode runs and a TTFT run against the fake server (streamed tokens: 20 ms apart,
    so even a client stalled by a busy machine sees a stream, not one flush)."""
    root = tmp_path_factory.mktemp("runs")
    state = FakeServerState(default=FakeScript(ttft_s=0.01, gap_s=0.02))
    with FakeServer(free_port(), state) as server:
        a = run_benchmark(server.base_url, "fake-model", "decode", root / "a" / "run", progress=False,
                          label="bf16", **DECODE)
        b = run_benchmark(server.base_url, "fake-model", "decode", root / "b" / "run", progress=False,
                          label="qat", **DECODE)
        ttft = run_benchmark(server.base_url, "fake-model", "ttft", root / "ttft", progress=False,
                             input_lens=[32, 64], output_len=2, num_prompts=2, warmup=0)
    return {"a": a, "b": b, "ttft": ttft, "root": root}


def test_a_benchmark_run_shows_one_row_per_cell_with_its_figures(runs):
    run = runs["a"]
    cells, text = _shown(run)
    assert cells.caption == f"bf16 on {run.run.base_url}"
    assert "output tok/s (all streams)" in cells.head and "per-stream tok/s (median)" in cells.head
    assert len(cells.body) == 2 * len(cells.head)  # c=1 and c=2
    concurrency = cells.head.index("concurrency")
    assert [cells.body[concurrency], cells.body[len(cells.head) + concurrency]] == ["1", "2"]
    throughput = run.throughput_by_concurrency()[1]
    assert f"{throughput:,.3g}" in text or f"{throughput:,.1f}" in text


def test_comparisons_show_their_ratios(runs):
    comparison = compare_runs(runs["a"].dir, runs["b"].dir)
    cells, text = _shown(comparison)
    assert "B/A ratios" in cells.caption and {"metric", "A", "B", "B/A [95 % interval]"} <= set(cells.head)
    assert "per_stream_tok_s" in cells.body
    assert re.search(r"per_stream_tok_s .* \d+\.\d{3} \[\d+\.\d{3}, \d+\.\d{3}\]$", text, re.M)  # ratio [interval]
    suite = compare_suites(runs["a"].dir.parent, runs["b"].dir.parent)
    cells, _ = _shown(suite)
    (headline,) = suite.headlines
    assert {"model", "figure", "A/B [95 % interval]"} <= set(cells.head)
    assert len(cells.body) == len(cells.head) * len(headline.table_rows())  # each model's headline rows
    cells, _ = _shown(headline)
    assert cells.body[0].startswith("decode tok/s") and "TTFT ms (median)" in cells.body


def test_a_comparison_shows_the_same_in_html_as_in_text():
    """The HTML display of a comparison once left out what its text showed: the prices, the
    published row and its source, the answers compared, a drafter's acceptance, unmatched cells."""
    answers = AnswerComparison(20, 19, 18, 17, Divergence(3, "What is 12 squared?", 9, "is 144.", "is 1444."), [3])
    pub = published_decode("gemma-4-E2B-it")
    headline = Headline("gemma-4-E2B-it", "series", 80.0, 100.0, 0.8, 0.75, 0.85, 300.0, 250.0, 1.2, answers,
                        {"ml.g4dn.xlarge": 2.74}, {}, pub, not_measured=["B: run l4/old is interrupted"],
                        unpriced_b="not priced: measured on a CPU")  # fmt: skip
    flushed = "A: not measured: the server delivered 128 tokens in one flush"
    on = SpecDecode(drafts=10, draft_tokens=30, accepted_tokens=15, acceptance_rate=0.5, mean_accepted_length=2.5,
                    source="/metrics")  # fmt: skip
    ratios = [Ratio("per_stream_tok_s", True, 48.2, 96.3, 1.998, 1.9, 2.1),
              Ratio("tpot_ms", False, not_measured=flushed)]  # fmt: skip
    runs = RunComparison("off", "on", [CellComparison(("decode",), "c1", "c1", ratios, None, on)], ["c8"], [], answers)
    said_by_both = ["identical answers: 19/20 (correct: A 18, B 17)",
                    "first difference: question 3 ('What is 12 squared?') at character 9:", "B: ...'is 1444.'"]
    for result, said in [
        (headline, ["not measured: B: run l4/old is interrupted", "0.800 [0.750, 0.850]", "1.200 [no interval]",
                    "ml.g4dn.xlarge $2.74", "not priced: measured on a CPU", "108.5", "141.7", "0.766",
                    "published (gemma-4-E2B emb4, not our measurement): decode tok/s T4 | L4",
                    f"published (gemma-4-E2B emb4, not our measurement): identical answers 40/40  [{pub.source}]"]),
        (runs, ["1.998 [1.900, 2.100]", flushed, "accepted 50.0%, mean accepted length 2.50",
                "unmatched cells: A ['c8']  B []"]),
    ]:  # fmt: skip
        cells, text = _shown(result)
        page = "\n".join([cells.caption, *cells.head, *cells.body])
        for figure in said + said_by_both:
            assert figure in page and figure in text, figure


def test_part2_and_part4_tables_put_each_measured_figure_beside_the_published_one(runs):
    qat_vs_bf16 = published.qat_vs_bf16(runs["a"], runs["b"], venue="cpu")
    cells, _ = _shown(qat_vs_bf16)
    assert "QAT int4 vs bf16, measured here (cpu)" in cells.caption
    assert {"figure", "measured here", "published", "measured / published"} <= set(cells.head)
    figures = cells.body[:: len(cells.head)]
    assert figures[0] == "per-stream tok/s bf16, c=1" and "E2EL ms qat, c=1" in figures
    published_col = cells.head.index("published")
    c1 = published.T4_QAT_VS_BF16_C1
    assert cells.body[published_col] == f"{c1.baseline_value:,.3g}"  # the published bf16 figure, c=1
    assert qat_vs_bf16.ratio_output_c1 > 0 and qat_vs_bf16.c_max == 2
    what, curves = qat_vs_bf16.decode_curves()
    assert what == "per-stream decode tok/s" and set(curves["qat"]) == {1, 2}

    beside = published.t4_beside(runs["a"], runs["ttft"].ttft_by_input_len(), "Part 4 beside published")
    cells, _ = _shown(beside)
    assert cells.caption == "Part 4 beside published"
    assert "median TTFT ms at 512 tokens, c=1" in cells.body and "median E2EL ms, c=2" in cells.body
    assert cells.body[cells.head.index("measured / published")] == "-"  # a fake server is no T4 E2B
    _shown(published.sagemaker_decode_table())


def test_the_cost_table_prices_the_published_rows_and_says_why_a_tiny_run_has_none(runs):
    price = PRICES["gce:n1-standard-2+t4"]
    table = CostTable(price, measured_price(runs["a"], price), "cpu")
    cells, _ = _shown(table)
    rows = [cells.body[i: i + len(cells.head)] for i in range(0, len(cells.body), len(cells.head))]
    assert len(rows) == 3 and rows[0][0].startswith("published: SageMaker ml.g4dn.xlarge (T4)")
    assert rows[2][0].startswith("measured here (cpu): no $/Mtok")  # the fake model is not priced
    assert rows[2][-1].startswith("no $/Mtok")


# ---------------------------------------------------------------- int4 builds


def test_grid_repack_and_compare_reports_show_their_figures(tiny_qat_model_dir, tmp_path):
    grid = quant.grid_check(str(tiny_qat_model_dir))
    cells, text = _shown(grid)
    assert f"{grid.tensors_on_grid}/{grid.tensors_checked} tensors on the grid" in cells.caption
    assert cells.head == ["name", "shape", "groups", "groups_off_grid", "max_deviation_levels"]
    assert cells.body[0] == grid.tensors[0].name
    assert len(grid.tensors) <= 8 or f"first 8 of {len(grid.tensors)} rows" in text.splitlines()[0]
    linear = quant.repack(tiny_qat_model_dir, tmp_path / "linear", scale_dtype="fp16")
    emb4 = quant.repack(tiny_qat_model_dir, tmp_path / "emb4", emb4=True, scale_dtype="fp16")
    cells, _ = _shown(together(linear, emb4, title="Repacks"))
    assert cells.caption == "Repacks" and cells.body[:: len(cells.head)] == ["lattice", "lattice + emb4"]
    assert cells.body[cells.head.index("levels changed")] == "0"
    compared = quant.grid_compare(str(tiny_qat_model_dir), str(tmp_path / "linear"))
    cells, _ = _shown(compared)
    assert cells.body[cells.head.index("levels changed %")] == "0"


# ---------------------------------------------------------------- Turing


def _launch(head: int) -> LaunchCheck:
    """One T4 launch of a Gemma 4 layer, from the shared-memory model (tile 64 unpatched, the cap patched)."""
    limit = 65_536
    unpatched = smem.attention_smem_bytes(64, 16, head)
    tile = smem.fitting_tile(64, 16, head, 2, limit, (7, 5))
    patched = smem.attention_smem_bytes(tile, 16, head)
    return LaunchCheck(model="E2B", layer="global", case="prefill", head_size=head, num_q_heads=8, num_kv_heads=1,
                       path="2d", block_m=16, block_q=2, tile_size=tile, tile_size_unpatched=64,
                       shared_bytes_unpatched=unpatched, shared_bytes_patched=patched, model_bytes=patched,
                       limit_bytes=limit, ok=patched <= limit)  # fmt: skip


def test_the_sm75_proof_shows_each_launch_unpatched_and_patched():
    launches = [_launch(256), _launch(512)]
    report = VerifyReport(ok=all(c.ok for c in launches), arch="sm_75", capability=(7, 5), limit_bytes=65_536,
                          vllm_version="0.33.0", kernel_file="triton_unified_attention.py", kernel_sha256="0" * 64,
                          triton_version="3.5.0", patch_action="capped", patch_reason="T4", model_exact=True,
                          changed_launches=2, compiles=0, seconds=0.0, launches=launches)  # fmt: skip
    cells, _ = _shown(report)
    assert "on sm_75: limit 65,536 B" in cells.caption and "all fit: True" in cells.caption
    row = cells.body[len(cells.head):]
    assert row[cells.head.index("head")] == "512" and row[cells.head.index("fits")] == "yes"
    assert row[cells.head.index("bytes unpatched")] == str(launches[1].shared_bytes_unpatched)


def test_turing_verify_prints_the_proofs_own_table_and_its_verdict():
    over = dataclasses.replace(_launch(512), ok=False)  # a launch over the limit: the CLI says FAIL
    fits = VerifyReport(ok=True, arch="sm_75", capability=(7, 5), limit_bytes=65_536, vllm_version="0.33.0",
                        kernel_file="k.py", kernel_sha256="0" * 64, triton_version="3.5.0", patch_action="capped",
                        patch_reason="T4", model_exact=True, changed_launches=1, compiles=2, seconds=3.0,
                        launches=[_launch(512)])  # fmt: skip
    text = verify_text(fits)
    assert str(fits) in text and text.endswith("PASS: every patched launch fits")
    header, _, row = str(fits).splitlines()[1:4]
    assert header.split()[4:7] == ["q/kv", "path", "BLOCK_M"] and row.split()[4:7] == ["8/1", "2d", "16"]
    failed = verify_text(fits.model_copy(update={"ok": False, "launches": [over], "model_exact": None}))
    assert failed.endswith("FAIL: a patched launch exceeds the limit or the tile cap refused this vLLM")
    assert "smem model not checked (an estimate above sm_75)" in failed
    (failed_row,) = [line for line in failed.splitlines() if "8/1" in line]
    assert row.endswith("yes") and failed_row.endswith("no")


def test_the_prefill_verdict_shows_one_row_per_head_from_the_committed_h200_rows():
    measured = json.loads((REPO / "docs/results/turing_prefill_h200.json").read_text())["rows"]
    by = {(r["path"].split(" ")[0], r["head_size"], r["seq_len"]): r for r in measured if r["batch"] == "single"}
    rows = [{"model": "E2B", "layer": "global", "head_size": head, "num_q_heads": route["num_q_heads"],
             "num_kv_heads": route["num_kv_heads"], "window": None, "seq_len": n,
             "route_max_abs_err": route["max_abs_err"], "route_ms": route["ms"], "route_finite": route["finite"],
             "triton_max_abs_err": triton["max_abs_err"], "triton_ms": triton["ms"],
             "speedup": round(triton["ms"] / route["ms"], 2)}
            for (path, head, n), route in by.items() if path == "torch-mem-efficient"
            for triton in [by[("vllm-triton", head, n)]]]  # fmt: skip
    report = PrefillBenchReport(key={"gpu": "NVIDIA H200", "capability": "9.0", "vllm": "0.33.0"},
                                tile_cap="no-change", kernel_sha256="0" * 64, heads=decide(rows), rows=rows)
    cells, _ = _shown(report)
    assert "NVIDIA H200 (9.0), vLLM 0.33.0" in cells.caption
    # bench-prefill prints every measured step above the same verdict table, and where it wrote them
    printed = bench_prefill_text(report.model_copy(update={"key": report.key | {"torch": "2.11", "triton": "3.6"},
                                                           "plot": "p.png"}), "out")  # fmt: skip
    measured, verdict, wrote = printed.split("\n\n")
    assert measured.startswith("measured: torch 2.11, Triton 3.6") and len(measured.splitlines()) == 3 + len(rows)
    assert verdict == str(report) and wrote == "wrote out/bench_prefill.json, p.png"
    assert cells.head == ["head", "use_route", "min_tokens", "why"]
    head_512 = cells.body[cells.body.index("512"):][:4]
    assert head_512[1] == "yes" and "faster" in head_512[3]


def test_the_ttft_route_curve_shows_each_input_length():
    rows = [{"input_len": 512, "ttft_ms_route_off": 120.0, "ttft_ms_route_on": 60.0, "speedup": 2.0},
            {"input_len": 1024, "ttft_ms_route_off": 300.0, "ttft_ms_route_on": None, "speedup": None}]
    report = TtftOnOffReport(rows=rows, route_on_active=False, route_on_log=["no-change"], route_off_log=["disabled"],
                             results={})  # fmt: skip
    cells, _ = _shown(report)
    assert "route NOT active (log: no-change)" in cells.caption
    assert cells.body == ["512", "120.0", "60", "2", "1024", "300.0", "-", "-"]


# ---------------------------------------------------------------- the catalog and SageMaker


def test_fit_tables_and_rooflines_show_the_catalog_figures():
    fits = models.fit_table("t4", context_len=8192)
    assert isinstance(fits, list) and models.largest_fitting(fits) is not None
    cells, _ = _shown(fits)
    assert cells.caption == "1 x t4, 8,192 context: what fits"
    assert cells.head == ["model", "format", "weights_gib", "kv_token_capacity", "fits", "verdict"]
    assert len(cells.body) == len(cells.head) * len(fits) and cells.body[0] == fits[0].model
    roofline = models.decode_roofline("e2b", "qat-w4a16", "t4")
    cells, _ = _shown(roofline)
    assert cells.body[:2] == ["t4", "qat-w4a16"] and cells.body[3] == f"{roofline.tok_s_spec:,.1f}"


def test_sagemaker_results_show_themselves():
    report = quotas.QuotaReport([quotas.QuotaRow("us-east-2", "ml.g4dn.xlarge", "ml.g4dn.xlarge for endpoint usage", 2.0),
                                 quotas.QuotaRow("us-east-1", "ml.g4dn.xlarge", "q", None, error="AccessDenied")])
    cells, _ = _shown(report)
    assert cells.caption == "ml.g4dn.xlarge for endpoint usage" and cells.body[-2] == "AccessDenied"  # [-1]: the note
    result = DeployResult("gemma4-t4", "us-east-2", "InService", True, elapsed_s=12.5,
                                 timeline=[TimelineEvent(0.0, "create_model"), TimelineEvent(12.5, "InService")])
    cells, _ = _shown(result)
    assert cells.caption == "gemma4-t4: InService in 12.5 s" and cells.body[-3] == "InService"  # [-1]: the note
    status = ops.EndpointStatus("gemma4-t4", "us-east-2", True, "InService", instance_types=["ml.g4dn.xlarge"])
    cells, _ = _shown(status)
    assert cells.body[:4] == ["gemma4-t4", "us-east-2", "InService", "ml.g4dn.xlarge"]
    estimates = [cost.estimate("ml.g4dn.xlarge"), cost.estimate("ml.g6.xlarge")]
    cells, _ = _shown(together(*estimates, title="prices"))
    day = cells.body[cells.head.index("$ if forgotten for a day")]
    assert day == f"{24 * estimates[0].usd_per_hour:,.3g}"
    session = part1.MCPSession(["get_endpoint_status"], [part1.MCPCall("delete_endpoint", {}, False, {"refused": True})])
    cells, _ = _shown(session)
    assert cells.body == ["delete_endpoint", "no", "{'refused': True}"]
    cells, _ = _shown(pairs({"instance_type": "ml.g4dn.xlarge"}, "Deployment"))
    assert cells.body == ["instance_type", "ml.g4dn.xlarge"]


def test_show_table_prints_a_result_as_its_text_outside_jupyter(capsys):
    table = Table([{"a": 1.5, "b": None, "c": True}], "t")
    nb.show_table(table)
    assert capsys.readouterr().out == str(table) + "\n" == "t\na    b  c\n---  -  ---\n1.5  -  yes\n"
    assert "&lt;b&gt;" in Table([{"x": "<b>"}])._repr_html_()  # values are escaped


def test_the_summary_takes_a_result_that_displays_itself(tmp_path):
    nb.save_summary(tmp_path, part=9, results={"x": 1.0}, tables=[Table([{"a": 1}], "a table")])
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["tables"] == [{"title": "a table", "rows": [{"a": 1}]}]
