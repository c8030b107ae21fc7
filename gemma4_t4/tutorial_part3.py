"""Part 3's lesson helpers: the notebook's cells stay the calls (grid check, repack, AWQ-style
conversion, serving), and this module holds what used to crowd them: the answers run beside its
budget, the tables that read the learner's own numbers next to the published ones, the figure, and
the part's checks and summary built from its results in one call."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemma4_t4 import notebook as nb
from gemma4_t4.bench.answers import AnswerComparison, compare_answers
from gemma4_t4.bench.published import GRID_26B_Q_PROJ, PART3_L4_EMB4_VS_QAT
from gemma4_t4.bench.results import BenchRun
from gemma4_t4.bench.specs import AnswersSpec, run
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.figures import pyplot
from gemma4_t4.foundation.table import Displayable, Table
from gemma4_t4.host import cpuisa
from gemma4_t4.quant.grid import TINY_WEIGHTS, CompareReport, GridReport
from gemma4_t4.quant.repack import RepackReport
from gemma4_t4.venues.endpoint import Budget, Endpoint
from gemma4_t4.venues.parameters import is_real_number
from gemma4_t4.venues.parts import refuse_while_billing
from gemma4_t4.venues.runtime import RuntimeInfo


class LevelsChanged(Table):
    """The learner's two comparisons (repack, AWQ-style) beside the published grid check, read aloud."""

    def __init__(self, vs_repack: CompareReport, vs_awq: CompareReport, target: str):
        rows: list[dict[str, object]] = [
            {
                "build": f"measured here ({target}): {label}",
                "levels changed %": r.level_changed_pct,
                "bit-identical %": r.bit_identical_pct,
                "weights": r.weights_total,
            }
            for label, r in (("repack, all linears", vs_repack), ("AWQ-style g128, all linears", vs_awq))
        ]
        pub = GRID_26B_Q_PROJ
        rows += [
            {
                "build": f"published: {pub.model} {pub.tensor}, repack",
                "levels changed %": pub.repack_changed_pct,
            },
            {
                "build": f"published: {pub.model} {pub.tensor}, AWQ conversion",
                "levels changed %": pub.awq_changed_pct,
            },
        ]
        super().__init__(rows, "Weights moved to another int4 level")
        self.vs_repack, self.vs_awq = vs_repack, vs_awq

    def notes(self) -> list[str]:
        r, a, pub = self.vs_repack, self.vs_awq, GRID_26B_Q_PROJ
        lines = [
            f"Here: the repack moved {r.level_changed:,} of {r.weights_with_ref_lattice:,} weights off their "
            f"4-bit level; the AWQ-style conversion moved {a.level_changed:,} ({a.level_changed_pct:.3g} %).",
            f"Published ({pub.source.split(' (')[0]}, grid_check.py): in the {pub.model}'s {pub.tensor} "
            f"({pub.weights / 1e6:.1f} M weights) the repack moved {pub.repack_changed_pct:g} %, a classic AWQ "
            f"conversion {pub.awq_changed_pct:g} %.",
        ]
        if r.weights_total < TINY_WEIGHTS:
            lines.append(
                "On the tiny random model this shows the mechanism (a group-128 asymmetric re-quantization "
                "moves weights, the repack none); how many a real AWQ run moves on Google's weights it "
                "cannot show: that is the published 30.3 %."
            )
        return lines


class Repacks(Table):
    """The linear-only and emb4 repacks side by side, with what the size difference means."""

    def __init__(self, linear: RepackReport, emb4: RepackReport):
        super().__init__([*linear.table_rows(), *emb4.table_rows()], f"Repacks ({linear.scale_dtype} scales)")
        self.linear, self.emb4 = linear, emb4

    def notes(self) -> list[str]:
        lin, emb = self.linear, self.emb4
        saved = (lin.bytes_written - emb.bytes_written) / 1e6
        lines = [
            f"emb4 is {emb.bytes_written / lin.bytes_written:.0%} of the linear-only repack ({saved:,.1f} MB "
            f"less): the embeddings and lm_head are 4-bit too, so fewer bytes move per token. Levels moved: "
            f"{lin.levels_changed} and {emb.levels_changed} (lossless).",
            f"Published: emb4 decoded {PART3_L4_EMB4_VS_QAT.ratio:.2f}x faster than the QAT build on a "
            f"SageMaker L4 ({PART3_L4_EMB4_VS_QAT.model}; the series, Part 3).",
        ]
        if lin.weights_quantized < TINY_WEIGHTS:
            lines.append(
                "The tiny model's embeddings are a different share of its weights than E2B's, so its size "
                "ratio is not E2B's; only the direction (emb4 smaller, nothing moved) carries over."
            )
        return lines


@dataclass(repr=False)  # IPython shows the table (Displayable), not the fields
class ServedAnswers(Displayable):
    """The fixed questions asked of the QAT source and of its repack, with their budget (SageMaker)."""

    out_dir: Path
    budget: Budget
    folder: Path | None  # the repack this venue serves; None: none can be served here
    why: str
    exact: bool  # a real model must answer exactly like its source; the tiny one is only counted
    spec: AnswersSpec = field(default_factory=AnswersSpec)
    runs: dict[str, BenchRun] = field(default_factory=dict)
    endpoints: list[Endpoint] = field(default_factory=list)

    def pairs(self, source: str | Path) -> list[tuple[str, Path]]:
        """(label, folder) to serve in turn: the QAT source, then the repack; none without a repack."""
        return [] if self.folder is None else [("qat", Path(source)), ("repack", self.folder)]

    def ask(self, label: str, endpoint: Endpoint) -> None:
        self.runs[label] = run(endpoint, self.spec, self.out_dir / f"answers-{label}", overwrite=True)
        self.endpoints.append(endpoint)

    @property
    def comparison(self) -> AnswerComparison | None:
        return compare_answers(self.runs["qat"], self.runs["repack"]) if len(self.runs) == 2 else None

    def line(self) -> str:
        """ "n/N" identical, or "not measured: why"."""
        return self.comparison.line() if self.comparison else self.why

    def caption(self) -> str:
        return "Answers of the QAT source and of its repack (greedy, the same fixed questions)"

    def table_rows(self) -> list[dict[str, object]]:
        return []

    def notes(self) -> list[str]:
        cmp = self.comparison
        if cmp is None:
            return [
                self.why,
                "Nothing was served here, so nothing about the answers is shown; the grid check and "
                "the repack above hold on every CPU.",
            ]
        lines = [cmp.text()]
        if not cmp.measured:
            return lines
        if cmp.all_identical:
            lines.append(
                f"All {cmp.total} answers are identical, word for word: the repack answers as its source."
            )
        elif self.exact:
            lines.append(
                f"{cmp.total - cmp.identical} of {cmp.total} answers differ on a real model: the repack "
                "is not answering as its source, which the check below refuses."
            )
        else:
            lines.append(
                f"{cmp.identical} of {cmp.total} identical. The tiny random model has near-tied tokens "
                "everywhere, so a different int4 summation order can flip a greedy pick: counted here, "
                "required to match only on a real model (a T4, SageMaker)."
            )
        return lines


def served_answers(
    runtime: RuntimeInfo, work_dir: str | Path, out_dir: str | Path, budget_usd: float
) -> ServedAnswers:
    """What this venue serves next to the QAT source, and the budget its SageMaker endpoints share: the
    emb4 repack off ``cpu``; on ``cpu`` the linear-only repack where vLLM's CPU build has int4."""
    work, exact = Path(work_dir), runtime.target != "cpu"
    # the answers must match their source exactly: on a real model (a GPU, SageMaker); the tiny random
    # model on a CPU has near-ties everywhere, and a different int4 summation order can flip a greedy pick
    if exact:
        folder, why = work / "repack-emb4", "the emb4 repack (int4 linears and 4-bit embeddings)"
    elif (build := cpuisa.cpu_build()).int4_refused:
        folder, why = None, f"not measured: {build.int4_missing}; serve it on a T4 or an AVX-512 CPU"
    else:
        folder, why = (
            work / "repack-linear",
            (
                "the linear-only repack (vLLM's CPU build, int4 linears); "
                "the tiny random model's answers are counted, not required to match"
            ),
        )
    print("serving:", why)
    return ServedAnswers(Path(out_dir), Budget(budget_usd), folder, why, exact)


def local_model(model: str | Path) -> Path:
    """``model`` if it is a folder, else its Hugging Face download (weights, configs, tokenizer; cached)."""
    path = Path(model)
    if path.exists():
        return path
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise Gemma4T4Error("huggingface_hub is not installed", fix="pip install huggingface_hub") from exc
    return Path(
        snapshot_download(str(model), allow_patterns=["*.json", "*.safetensors", "*.jinja", "tokenizer*"])
    )


def dir_bytes(path: str | Path) -> int:
    """Bytes of all files under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def figure(levels: LevelsChanged, repacks: Repacks, awq: RepackReport, source_bytes: int, target: str) -> Any:
    """Two panels: weights moved (measured and published), and checkpoint sizes on disk."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    values = [
        levels.vs_repack.level_changed_pct,
        levels.vs_awq.level_changed_pct,
        GRID_26B_Q_PROJ.awq_changed_pct,
    ]
    ax1.bar(
        ["repack (measured)", "AWQ g128 (measured)", "AWQ (published, 26B q_proj)"],
        values,
        color=["C2", "C3", "#c99"],
    )
    ax1.set(ylabel="% of weights moved to another level", title="Lossless repack vs AWQ-style conversion")
    ax1.tick_params(axis="x", labelrotation=15)
    sizes = {
        "linear int4": repacks.linear.bytes_written,
        "emb4": repacks.emb4.bytes_written,
        "AWQ g128": awq.bytes_written,
        "QAT source (bf16)": source_bytes,
    }
    ax2.barh(list(sizes), [v / 1e6 for v in sizes.values()], color="C0")
    ax2.set(xlabel="MB on disk", title=f"Checkpoint size ({target})")
    return fig


def clean_up(left: list[str], work_dir: str | Path, remove: bool) -> None:
    """Refuse if an endpoint of this part still bills; remove the repacked checkpoints unless kept."""
    refuse_while_billing(left)
    if remove:
        work = Path(work_dir)
        nb.remove_dirs(work / "repack-linear", work / "repack-emb4", work / "awq-g128")


def _checks(
    grid: GridReport, repacks: Repacks, levels: LevelsChanged, answers: ServedAnswers
) -> list[tuple[str, bool, str]]:
    lin, emb, r, a, cmp = repacks.linear, repacks.emb4, levels.vs_repack, levels.vs_awq, answers.comparison
    answered = (cmp is None and answers.folder is None) or bool(
        cmp and cmp.measured and cmp.total > 0 and (cmp.identical == cmp.total or not answers.exact)
    )
    return [
        (
            "the grid check",
            grid.tensors_checked > 0 and grid.on_grid,
            f"{grid.tensors_checked} tensors checked, off the grid: {grid.tensors_off_grid[:3] or '-'}",
        ),
        (
            "the linear repack",
            lin.tensors_quantized > 0 and lin.levels_changed == 0,
            f"{lin.tensors_quantized} tensors packed, {lin.levels_changed} weights moved level",
        ),
        (
            "the emb4 repack",
            emb.tensors_quantized > lin.tensors_quantized and emb.bytes_written < lin.bytes_written,
            f"it packed {emb.tensors_quantized} tensors ({emb.bytes_written:,} B), no more than the linear repack",
        ),
        (
            "the repack's levels changed",
            r.weights_total > 0 and r.level_changed_pct == 0.0,
            f"{r.level_changed_pct} % of {r.weights_total:,} weights moved",
        ),
        (
            "the AWQ-style levels changed",
            is_real_number(a.level_changed_pct),
            f"{a.level_changed_pct!r} is not a positive share of moved weights",
        ),
        ("the answers", answered, answers.line()),
        (
            "the budget and endpoints",
            answers.budget.spent_usd <= answers.budget.usd and all(e.stopped for e in answers.endpoints),
            f"spent ${answers.budget.spent_usd} of ${answers.budget.usd}, or an endpoint is still running",
        ),
    ]


def compare(
    target: str, grid: GridReport, repacks: Repacks, levels: LevelsChanged, answers: ServedAnswers
) -> nb.PartResults:
    """Check every figure of the part (a missing or impossible one is refused with its name and why)."""
    nb.refuse_failed_check(3, _checks(grid, repacks, levels, answers))
    results: dict[str, nb.SummaryValue] = {
        "target": target,
        "tensors on grid": f"{grid.tensors_on_grid}/{grid.tensors_checked}",
        "weights checked": grid.weights_total,
        "repack levels changed": repacks.linear.levels_changed,
        "AWQ-style g128 levels changed %": levels.vs_awq.level_changed_pct,
        "emb4 / linear-only size": repacks.emb4.bytes_written / repacks.linear.bytes_written,
        "identical answers after repack": answers.line(),
    }
    pub, l4 = GRID_26B_Q_PROJ, PART3_L4_EMB4_VS_QAT
    published = {
        f"AWQ levels changed % ({pub.model} {pub.tensor})": pub.awq_changed_pct,
        f"emb4 repack vs QAT decode (SageMaker L4, {l4.model})": round(l4.ratio, 2),
    }
    return nb.PartResults(3, results, [levels], published)
