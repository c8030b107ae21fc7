"""Part 2 of the notebook series (bf16 vs Google's QAT int4): the decode ceilings, the host's RAM
verdict, and the comparison that reads the learner's own numbers, checks them, plots itself and
writes the part's summary. The notebook makes one short call per step; the reasoning lives here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gemma4_t4.bench.plots import plot_qat_vs_bf16
from gemma4_t4.bench.published import (
    PART2_L4_QAT_VS_BF16,
    T4_QAT_VS_BF16_C1,
    T4_QAT_VS_BF16_C8,
    QatVsBf16,
    published_kind,
    qat_vs_bf16,
)
from gemma4_t4.bench.results import BenchRun
from gemma4_t4.catalog.models import Roofline, decode_roofline, load_ram
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.table import Displayable
from gemma4_t4.venues.endpoint import Budget, Endpoint
from gemma4_t4.venues.parameters import is_real_number
from gemma4_t4.venues.parts import FIX, PartStudy, refuse_unmeasured

FORMATS = ("bf16", "qat-w4a16", "emb4")
SERVED = {"bf16": "bf16", "qat": "qat-w4a16"}  # the builds Part 2 serves -> their roofline format


@dataclass(repr=False)  # the text display is the table (Displayable), not the fields
class Ceilings(Displayable):
    """Step 1's table: the per-stream decode ceiling (bandwidth / bytes per token) of each format on
    this GPU and on the T4 and L4, with what it means for the learner's GPU."""

    model_size: str
    gpu: str  # the GPU this runtime measures on (or the series' T4 on a CPU)
    target: str
    rows: list[Roofline]

    def table_rows(self) -> list[object]:
        return [row for r in self.rows for row in r.table_rows()]

    def caption(self) -> str:
        return f"Gemma 4 {self.model_size.upper()}: decode ceiling at batch 1"

    def ceiling(self, fmt: str) -> Roofline:
        """``fmt``'s ceiling on this runtime's GPU."""
        return next(r for r in self.rows if r.format == fmt and r.gpu == self.gpu)

    def notes(self) -> list[str]:
        bf16, qat = self.ceiling("bf16"), self.ceiling("qat-w4a16")
        lines = [
            f"On {self.gpu.upper()} ({bf16.spec_bandwidth_gb_s:.0f} GB/s) one decoded token reads "
            f"{bf16.bytes_per_token / 1e9:.2f} GB in bf16 and {qat.bytes_per_token / 1e9:.2f} GB as QAT int4: at "
            f"most {bf16.tok_s_spec:.1f} vs {qat.tok_s_spec:.1f} tok/s per stream, a "
            f"{bf16.bytes_per_token / qat.bytes_per_token:.2f}x ceiling ratio from bytes alone."
        ]
        if self.gpu == "t4":
            c1 = T4_QAT_VS_BF16_C1
            lines.append(
                f"The series measured {c1.baseline_value:.1f} and {c1.value:.1f} tok/s on a GCE T4 (published): "
                f"{c1.baseline_value / bf16.tok_s_spec:.0%} and {c1.value / qat.tok_s_spec:.0%} of these ceilings; "
                "fixed per-step work (kernel launches, sampling, scheduling) takes the rest."
            )
        if self.target == "cpu":
            lines.append(
                "On the CPU default these are T4 figures by arithmetic only: the tiny model below is "
                "measured on this CPU and is never compared with them."
            )
        return lines


def ceilings(model_size: str, gpu: str, target: str) -> Ceilings:
    """The ceilings of every format on ``gpu``, the T4 and the L4 (each GPU once)."""
    gpus = dict.fromkeys([gpu, "t4", "l4"])
    return Ceilings(
        model_size, gpu, target, [decode_roofline(model_size, f, g) for g in gpus for f in FORMATS]
    )


@dataclass(repr=False)
class RamVerdict(Displayable):
    """What this host's RAM (and swap) will load, checked before any download: vLLM's loader reads
    the checkpoint's tensors into process memory while the engine processes start, so the peak is
    about the checkpoint plus the processes (``catalog.models.load_ram``, fitted to the series' GCE
    peaks). Free Colab (about 12.7 GiB of RAM, no swap) is below E2B bf16's peak."""

    model_size: str
    ram_gib: float | None
    swap_gib: float | None
    target: str = "t4"

    def table_rows(self) -> list[dict[str, object]]:
        host = None if self.ram_gib is None else self.ram_gib + (self.swap_gib or 0.0)
        needs = {build: load_ram(self.model_size, fmt, host) for build, fmt in SERVED.items()}
        return [
            {
                "build": build,
                "checkpoint GiB": need.checkpoint_gib,
                "load peak GiB": need.peak_ram_gib,
                "this host: RAM + swap GiB": host,
                "verdict": need.advice,
            }
            for build, need in needs.items()
        ]

    def caption(self) -> str:
        return f"Gemma 4 {self.model_size.upper()}: host RAM needed to load each build"

    def notes(self) -> list[str]:
        lines = []
        if self.target == "cpu":
            lines.append(
                f"On the CPU default this part serves a tiny model of a few MB instead: the table is what "
                f"{self.model_size.upper()} itself would need on this host."
            )
        elif self.target == "sagemaker":
            lines.append(
                "On TARGET='sagemaker' the endpoint's own host (ml.g4dn.xlarge, 16 GiB) loads the model, not this one."
            )
        lines.append(
            "This host's RAM is not known: the peaks above are what loading needs."
            if self.ram_gib is None
            else "A build whose peak is above this host's RAM + swap is OOM-killed while loading (the series' "
            "7.5 GB n1-standard-2 was, until it added 16 GiB of swap). On free Colab (about 12.7 GiB, no swap) "
            "that is the bf16 build: serve it on a larger host or add swap where the host allows it."
        )
        return lines


@dataclass
class Study(PartStudy):
    """Part 2's run, with this host's RAM verdict."""

    host: RamVerdict

    def ceilings(self) -> Ceilings:
        return ceilings(self.model_size, self.gpu, self.target)

    def ram(self) -> RamVerdict:
        return self.host

    def compare(
        self, bf16_run: BenchRun, qat_run: BenchRun, concurrency: Sequence[int], endpoints: Sequence[Endpoint]
    ) -> Comparison:
        """The two runs compared and read; refused, naming the figure, where one is missing or impossible."""
        result = Comparison(qat_vs_bf16(bf16_run, qat_run, venue=self.target), self.ceilings(), self.target)
        result.check([bf16_run, qat_run], concurrency, self.budget, endpoints)
        return result


def study(target: str, model_size: str, runtime: Any, budget_usd: float) -> Study:
    """Part 2's study for the notebook's ``runtime`` (its GPU and host RAM)."""
    facts = runtime.facts
    host = RamVerdict(model_size, facts.ram_total_gib, facts.swap_total_gib, target)
    return Study(target, model_size, runtime.roofline_gpu, Budget(budget_usd), host)


@dataclass(repr=False)
class Comparison(Displayable):
    """QAT vs bf16 as measured here, beside the published figures, with the reading of the learner's
    own numbers under the table."""

    figures: QatVsBf16
    ceilings: Ceilings
    target: str

    def table_rows(self) -> list[object]:
        return list(self.figures.table_rows())

    def caption(self) -> str:
        return self.figures.caption()

    @property
    def on_series_t4(self) -> bool:
        """Measured on the published condition's kind (E2B on a T4): only then are ratios compared."""
        return self.figures.measured_on == published_kind(T4_QAT_VS_BF16_C1)

    def notes(self) -> list[str]:
        f, c1, c8, l4 = self.figures, T4_QAT_VS_BF16_C1, T4_QAT_VS_BF16_C8, PART2_L4_QAT_VS_BF16
        lines = []
        if f.flushed:
            lines.append(
                f"Per-stream speed is not measured here: {f.flushed}. The figures that are real are output "
                f"tok/s over the run and E2EL; QAT/bf16 output tok/s at c=1 is {f.ratio_output_c1:.2f}x."
            )
        else:
            q, b = f.per_stream["qat"], f.per_stream["bf16"]
            lines.append(f"QAT decoded {q:.1f} tok/s per stream at c=1 and bf16 {b:.1f}: {f.ratio_c1:.2f}x.")
            if self.target != "cpu":
                qc, bc = self.ceilings.ceiling("qat-w4a16"), self.ceilings.ceiling("bf16")
                lines.append(
                    f"{q:.1f} tok/s is {q / qc.tok_s_spec:.0%} of this GPU's {qc.tok_s_spec:.0f} tok/s QAT "
                    f"decode ceiling ({self.ceilings.gpu.upper()}), bf16's {b:.1f} is {b / bc.tok_s_spec:.0%} "
                    f"of {bc.tok_s_spec:.0f}."
                )
        lines.append(
            f"With {f.c_max} streams QAT/bf16 output tok/s is {f.ratio_cmax:.2f}x: each weight read now serves "
            f"{f.c_max} tokens, so bytes per token matter less and compute more. The series measured "
            f"{c8.baseline_value:.1f} vs {c8.value:.1f} tok/s at 8 streams on a GCE T4 ({c8.ratio:.2f}x, published)."
        )
        if self.target == "cpu":
            lines.append(
                "On the CPU default both builds are the same tiny random model stored in bf16, so these ratios "
                "show the method and run-to-run noise, not QAT's speed-up; on a T4 bytes per token set it "
                f"(published: {c1.ratio:.2f}x per stream)."
            )
        elif self.on_series_t4:
            lines.append(
                f"The series measured {c1.baseline_value:.1f} -> {c1.value:.1f} tok/s per stream on a GCE T4 "
                f"({c1.ratio:.2f}x, published); the measured / published column compares yours."
            )
        else:
            lines.append(
                f"This is {f.measured_on.describe()}, not the series' E2B on a T4: the published T4 figures "
                "stand beside yours, not compared with them."
            )
        lines.append(
            f"Part 2's original run on a SageMaker L4 measured QAT at {l4.ratio:.2f}x bf16 (published)."
        )
        return lines

    def plot(self) -> Any:
        """The decode curves and the ceilings with the published T4 points (a figure to show and save)."""
        ceilings = {fmt: self.ceilings.ceiling(fmt).tok_s_spec for fmt in SERVED.values()}
        published = {"bf16": T4_QAT_VS_BF16_C1.baseline_value, "qat-w4a16": T4_QAT_VS_BF16_C1.value}
        return plot_qat_vs_bf16(
            self.figures,
            ceilings,
            published,
            self.ceilings.gpu,
            self.ceilings.model_size.upper(),
            self.target,
        )

    def check(
        self,
        runs: Sequence[BenchRun],
        concurrency: Sequence[int],
        budget: Budget,
        endpoints: Sequence[Endpoint],
    ) -> None:
        """Refuse a run that measured nothing, or a figure that cannot be, with one sentence naming it."""
        refuse_unmeasured(runs, self.figures.speeds, concurrency, {}, budget)
        for build, speed in self.figures.speeds.items():
            self._below_ceiling(build, speed.per_stream or {})
        running = [e.url for e in endpoints if not e.stopped]
        if running:
            raise Gemma4T4Error(f"still running after its step: {running}", fix="run the Cleaning up cell")

    def _below_ceiling(self, build: str, per_stream: dict[int, float | None]) -> None:
        """A per-stream speed above the bandwidth ceiling is a measurement error, not a fast GPU."""
        one = per_stream.get(1)
        if self.target == "cpu" or self.figures.flushed or not is_real_number(one):
            return
        ceiling = self.ceilings.ceiling(SERVED[build])
        if one > ceiling.tok_s_spec * 1.05:  # type: ignore[operator]
            raise Gemma4T4Error(
                f"{build} per-stream tok/s at c=1 is {one:.1f}, above {ceiling.gpu.upper()}'s "
                f"{ceiling.tok_s_spec:.1f} tok/s bandwidth ceiling: that cannot be measured",
                fix=FIX,
            )

    def summary(self) -> dict[str, Any]:
        """``nb.save_summary``'s keyword arguments: the measured figures (checked above), the published ones."""
        f, c_max = self.figures, self.figures.c_max
        results = {
            "target": self.target,
            "per-stream tok/s bf16 c=1": f.per_stream[
                "bf16"
            ],  # or "not measured: ..." (answers in one flush)
            "per-stream tok/s QAT c=1": f.per_stream["qat"],
            "QAT/bf16 ratio c=1": f.ratio_c1,
            "output tok/s bf16 c=1": f.bf16.output_tok_s[1],
            "output tok/s QAT c=1": f.qat.output_tok_s[1],
            "E2EL ms bf16 c=1": f.bf16.e2el_ms[1],
            "E2EL ms QAT c=1": f.qat.e2el_ms[1],
            "QAT/bf16 output tok/s ratio c=1": f.ratio_output_c1,
            f"QAT/bf16 all-streams ratio c={c_max}": f.ratio_cmax,
        }
        published = {
            "QAT/bf16 per stream c=1 (GCE T4)": round(T4_QAT_VS_BF16_C1.ratio, 2),
            "QAT/bf16 all streams c=8 (GCE T4)": round(T4_QAT_VS_BF16_C8.ratio, 2),
            "QAT/bf16 decode (SageMaker L4)": round(PART2_L4_QAT_VS_BF16.ratio, 2),
        }
        return {"part": 2, "results": results, "published": published, "tables": [self]}
