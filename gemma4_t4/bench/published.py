"""The series' PUBLISHED reference results, as data (measured by the series' author, not by us);
every entry carries ``published=True``, its source and conditions, and every published number a
notebook prints comes from here. Checked against the GCE run's REPORT.md and aggregate.py (3
repeats of 8 prompts; throughput the mean over repeats, TTFT the mean of their median TTFT,
per-stream 1000 / the mean median TPOT) and the SageMaker write-up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gemma4_t4.catalog.hardware import PRICES, identify_gpu
from gemma4_t4.catalog.models import VARIANTS
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.table import Displayable, Table

if TYPE_CHECKING:
    from gemma4_t4.bench.results import BenchRun, DecodeSpeed

GCE_SOURCE = ("xbill9/gemma4-dev gpu-vllm-t4-2b/benchmarks/runs/2026-09-18-qat-vs-bf16-t4/ "
              "(GCE n1-standard-2 + T4, us-west2-b, driver 615.71.09; vLLM 0.29.0 with the hd512 clamp, fp16, "
              "max-model-len 16384, max-num-seqs 8; vllm bench serve random, output 128, --ignore-eos "
              "--num-warmups 2, 8 prompts per cell, 3 repeats, mean over repeats)")
GCE_EMB4_SOURCE = ("the series' GCE T4 emb4 sweep (same host, server and client as the 2026-09-18 run; "
                   "its emb4 rows are not in that run's REPORT.md)")
SAGEMAKER_SOURCE = ("xbill9/sagemaker-gemma compare.py (AWS vLLM DLC 0.30.0, context 8192, us-east-2; "
                    "decode = (512-16)/(wall512 - wall16); load uses one shared prompt)")
DRAFTER_SOURCE = ("xbill9/gemma4-dev gpu-vllm-t4-2b-w4a16/article/devto-gemma4-t4-emb4.md, \"Google's Drafter "
                  "for One User\" (vLLM 0.29, GCE T4, greedy, 3 draft tokens)")
GRID_SOURCE = "the series, Part 4 write-up (xbill9/sagemaker-gemma grid_check.py on gemma-4-26B-A4B)"


@dataclass(frozen=True)
class PublishedResult:
    gpu: str
    model: str
    build: str  # bf16 | qat | emb4
    input_len: int
    concurrency: int
    output_throughput_tok_s: float
    per_stream_tok_s: float
    ttft_ms: float  # median TTFT (the mean over 3 repeats of each repeat's median)
    source: str
    published: bool = True
    note: str = ""


def _gce(build: str, rows: list[tuple[int, int, float, float, float]], source: str = GCE_SOURCE) -> list[PublishedResult]:
    return [PublishedResult("t4", "gemma-4-E2B", build, n, c, tput, stream, ttft, source,
                            note="queueing (c > max-num-seqs 8)" if c > 8 else "")
            for n, c, tput, stream, ttft in rows]


GCE_T4_E2B = (
    _gce("bf16", [(512, 1, 37.04, 40.44, 300), (512, 4, 109.05, 32.25, 791), (512, 8, 164.62, 25.49, 1212),
                  (512, 16, 164.36, 24.97, 7270), (4096, 1, 12.11, 30.00, 7199), (4096, 4, 15.16, 6.40, 15304),
                  (4096, 8, 15.66, 2.53, 16779), (4096, 16, 15.46, 2.42, 81551)])
    + _gce("qat", [(512, 1, 62.27, 72.31, 316), (512, 4, 157.49, 54.50, 937), (512, 8, 215.91, 37.83, 1301),
                   (512, 16, 213.79, 34.69, 5903), (4096, 1, 14.00, 46.18, 7243), (4096, 4, 15.82, 7.23, 15391),
                   (4096, 8, 15.95, 2.59, 16879), (4096, 16, 15.75, 2.48, 80119)])
    + _gce("emb4", [(512, 1, 85.28, 99.94, 252), (512, 4, 183.08, 67.71, 971), (512, 8, 239.64, 44.68, 1394),
                    (512, 16, 237.08, 40.05, 5369), (4096, 1, 15.03, 56.67, 7138), (4096, 8, 16.38, 2.66, 16479)],
           GCE_EMB4_SOURCE)
)


T4_INSTANCE, L4_INSTANCE = "ml.g4dn.xlarge", "ml.g6.xlarge"


@dataclass(frozen=True)
class PublishedSageMaker:
    """Output tok/s on SageMaker, T4 (ml.g4dn.xlarge) and L4 (ml.g6.xlarge): single-stream decode
    (``concurrency`` 1) or load (16 concurrent requests of 256 tokens)."""

    model: str
    build: str
    l4_tok_s: float
    t4_tok_s: float | None
    identical_answers: str | None = None
    concurrency: int = 1
    source: str = SAGEMAKER_SOURCE
    published: bool = True


SAGEMAKER_DECODE = [
    PublishedSageMaker("gemma-4-E2B", "emb4", 141.7, 108.5, "40/40"),
    PublishedSageMaker("gemma-4-E4B", "emb4", 79.9, 65.6, "40/40"),
    PublishedSageMaker("gemma-4-12B", "emb4", 35.0, 28.5, "40/40"),
    PublishedSageMaker("gemma-4-26B-A4B", "emb4", 91.5, None),  # the T4 ran out of memory at load
    # the QAT builds with bf16 embeddings ("text-only") that Part 3's repack starts from
    PublishedSageMaker("gemma-4-E2B", "qat-text", 103.0, None),
    PublishedSageMaker("gemma-4-E4B", "qat-text", 62.1, None),
    PublishedSageMaker("gemma-4-12B", "qat-text", 29.0, None),
    PublishedSageMaker("gemma-4-26B-A4B", "qat-text", 65.8, None),
    PublishedSageMaker("gemma-4-E2B", "qat", 105.1, None),
    PublishedSageMaker("gemma-4-E2B", "bf16", 51.3, None),
]


def published_decode(model: str, build: str | None = None) -> PublishedSageMaker | None:
    """The series' SageMaker decode row for a model (any spelling of a served name: the size's name within it,
    case-insensitive), labelled published; without a build, the row that has a T4 figure."""
    name = model.lower().replace("_", "-")
    rows = [p for p in SAGEMAKER_DECODE if p.model.lower() in name and (build is None or p.build == build)]
    return next((p for p in rows if p.t4_tok_s is not None), rows[0] if rows else None)


@dataclass(frozen=True)
class PublishedDrafter:
    """Single-stream greedy decode on a GCE T4 with Google's drafter off and on (vLLM gemma4_mtp)."""

    model: str
    build: str
    draft_tokens: int
    tok_s_off: float
    tok_s_on: float
    ms_per_token_off: float
    ms_per_token_on: float
    acceptance: float  # share of draft tokens accepted
    answers_changed: str  # greedy answers whose length changed, of those compared (fp16 on a T4)
    source: str = DRAFTER_SOURCE
    published: bool = True


# the reference implementation's emb4 repack (int4 embeddings and lm_head) with Google's assistant
T4_DRAFTER = PublishedDrafter("gemma-4-E2B", "emb4", 3, 109.7, 135.0, 9.9, 7.4, 0.38, "3/20")


SAGEMAKER_LOAD = [
    PublishedSageMaker("gemma-4-E2B", "emb4", 1259.15, 787.05, concurrency=16),
    PublishedSageMaker("gemma-4-E4B", "emb4", 848.95, 488.05, concurrency=16),
    PublishedSageMaker("gemma-4-12B", "emb4", 411.8, 216.45, concurrency=16),
]


_GCE_CELLS = {(r.build, r.input_len, r.concurrency): r for r in GCE_T4_E2B}


def gce_t4(build: str, input_len: int = 512, concurrency: int = 1) -> PublishedResult:
    """The published GCE T4 E2B cell for a build (bf16 | qat | emb4)."""
    found = _GCE_CELLS.get((build, input_len, concurrency))
    if found is None:
        raise KeyError(
            f"no published GCE T4 cell for {build} in {input_len} c={concurrency}; published: {sorted(_GCE_CELLS)}"
        )
    return found


@dataclass(frozen=True)
class PublishedRatio:
    """A headline speed-up of the series: two published figures under the same conditions (what
    each claims and in which unit is said where it is declared, below)."""

    gpu: str
    model: str
    baseline: str  # build the ratio divides by
    build: str
    baseline_value: float
    value: float
    conditions: str
    source: str
    published: bool = True

    @property
    def ratio(self) -> float:
        return self.value / self.baseline_value


def _ratio(gpu: str, conditions: str, base: PublishedResult | PublishedSageMaker,
           top: PublishedResult | PublishedSageMaker, attr: str) -> PublishedRatio:
    return PublishedRatio(gpu, base.model, base.build, top.build, getattr(base, attr), getattr(top, attr),
                          conditions, base.source)


# Part 2: Google's QAT int4 decodes 2.05x faster than bf16 on one L4 (SageMaker ml.g6.xlarge):
# single-stream decode tok/s.
PART2_L4_QAT_VS_BF16 = _ratio("l4", "SageMaker ml.g6.xlarge, c=1", published_decode("gemma-4-E2B", "bf16"),
                              published_decode("gemma-4-E2B", "qat"), "l4_tok_s")
# Part 3: the repack with 4-bit embeddings (emb4) adds 1.39x over the QAT build on an L4 - measured on the
# 26B-A4B: single-stream decode tok/s.
PART3_L4_EMB4_VS_QAT = _ratio("l4", "SageMaker ml.g6.xlarge, c=1, gemma-4-26B-A4B",
                              published_decode("gemma-4-26B-A4B", "qat-text"),
                              published_decode("gemma-4-26B-A4B", "emb4"), "l4_tok_s")
# The GCE T4 pair, QAT int4 vs bf16: per-stream decode tok/s at c=1 (1.79x) and output tok/s of all
# streams at c=8 (164.62 -> 215.91 tok/s, 1.31x).
T4_QAT_VS_BF16_C1 = _ratio("t4", "GCE T4, 512 in / 128 out, c=1", gce_t4("bf16"), gce_t4("qat"), "per_stream_tok_s")
T4_QAT_VS_BF16_C8 = _ratio("t4", "GCE T4, 512 in / 128 out, c=8", gce_t4("bf16", concurrency=8),
                           gce_t4("qat", concurrency=8), "output_throughput_tok_s")


@dataclass(frozen=True)
class PublishedGridCheck:
    """Share of weights a conversion moved to another int4 level (Part 3's lossless-repack claim)."""

    model: str
    tensor: str
    weights: float  # as published ("11.5 million")
    repack_changed_pct: float
    awq_changed_pct: float
    source: str = GRID_SOURCE
    published: bool = True


GRID_26B_Q_PROJ = PublishedGridCheck("gemma-4-26B-A4B", "layer 0 q_proj", 11.5e6, 0.0, 30.3)


# ---------------------------------------------------------------- measured beside published


@dataclass(frozen=True)
class Kind:
    """What a figure was measured on: model size ("E2B", ..., "tiny" for the CI model) and GPU class
    ("t4", ..., "cpu"); ``None``: not recorded. ``gpu_name``: a GPU the hardware table lacks, as
    nvidia-smi named it (``gpu`` is then None: compared with and priced as nothing, but named)."""

    model_size: str | None
    gpu: str | None
    gpu_name: str | None = None

    @property
    def known(self) -> bool:
        return self.model_size is not None and self.gpu is not None

    def unpriced(self, priced_gpu: str | None = None) -> str | None:
        """Why a throughput measured on this kind is no $ per million tokens (None: it is one): only
        a real Gemma 4 size on the GPU it is priced as says what serving Gemma 4 costs."""
        if self.model_size is None or (self.gpu is None and not self.gpu_name):
            return "no $/Mtok: the run did not record which model and GPU it measured"
        if self.model_size == "tiny":
            return f"no $/Mtok: {self.describe()} is a method check, not a price of serving Gemma 4"
        if self.gpu is None:
            return f"no $/Mtok: {self.gpu_name} is not in the hardware table, so no price is known for it"
        if self.gpu == "cpu":
            return f"no $/Mtok: {self.describe()} is not a priced GPU deployment"
        if priced_gpu is not None and priced_gpu != self.gpu:
            return f"no $/Mtok: measured on {self.gpu.upper()}, priced as {priced_gpu.upper()}"
        if not any(p.gpu == self.gpu for p in PRICES.values()):
            return f"no $/Mtok: no price is known for {self.gpu.upper()}"
        return None

    def describe(self) -> str:
        model = "a tiny random model" if self.model_size == "tiny" else (self.model_size or "an unknown model")
        if self.gpu == "cpu":
            gpu = "a CPU"
        elif self.gpu:
            gpu = self.gpu.upper()
        else:
            gpu = f"{self.gpu_name} (not in the hardware table)" if self.gpu_name else "unknown hardware"
        return f"{model} on {gpu}"


_SIZE_TOKEN = re.compile(r"(?<![a-z0-9])(e2b|e4b|12b|26b-a4b|31b)(?![a-z0-9])")


def model_size_of(*names: str | None) -> str | None:
    """The Gemma 4 size a served name, model id or model folder names ("tiny" for the CI model)."""
    for name in names:
        if not name:
            continue
        text = str(name).lower().replace("_", "-")
        if "tiny" in text:
            return "tiny"
        found = _SIZE_TOKEN.search(text)
        if found:
            return VARIANTS[found.group(1)].size
    return None


def measured_kind(run: BenchRun) -> Kind:
    """The kind a run measured, from what it recorded: served name, vLLM's model root, the launch
    record, the host's GPUs (a local server) or the GPU a remote run was priced as."""
    info = run.run
    environment = info.environment
    server = environment.get("server") or {}
    launch_config = (server.get("launch") or {}).get("config") or {}
    size = model_size_of(launch_config.get("model"), info.server.root, info.model)
    local = urlsplit(info.base_url or "").hostname in ("127.0.0.1", "localhost", "::1")
    gpus = environment.get("gpus") or []
    if launch_config.get("target") == "cpu":
        gpu = "cpu"
    elif local and gpus:
        name = gpus[0].get("name")
        known = identify_gpu(name)
        return Kind(size, known.key if known else None, None if known else name)
    elif local and info.server.backend == "openai-http":
        gpu = "cpu"  # a server on this host, which has no NVIDIA GPU
    else:
        gpu = info.config.get("gpu")  # a remote endpoint: the GPU it was declared (and priced) as
    return Kind(size, gpu)


def published_kind(row: PublishedResult | PublishedRatio | PublishedSageMaker, gpu: str | None = None) -> Kind:
    """The kind of a published figure (a SageMaker decode row names two GPUs: pass ``gpu``)."""
    return Kind(model_size_of(row.model), gpu or getattr(row, "gpu", None))


def beside(
    label: str,
    measured: float | str | None,
    published: float | None,
    source: str,
    conditions: str = "",
    *,
    measured_on: Kind | None = None,
    published_on: Kind | None = None,
) -> dict[str, object]:
    """One display row: a measured figure (or why it is not measured, e.g. one flush) next to the published one,
    their ratio only where both are the same known kind (model size and GPU class); elsewhere the
    published figure stands alone, labelled, and the row says what was measured on."""
    comparable = measured_on is not None and measured_on.known and measured_on == published_on
    number = isinstance(measured, int | float) and not isinstance(measured, bool)
    ratio = measured / published if comparable and number and published else None  # type: ignore[operator]
    return {
        "figure": label,
        "measured here": measured,
        "measured on": measured_on.describe() if measured_on else "not recorded",
        "published": published,
        "measured / published": ratio,
        "published under": conditions if comparable or published is None else f"{conditions} (published; not comparable)".lstrip(),
        "source": source.split(" (")[0],
    }


# ---------------------------------------------------------------- the notebooks' comparisons, built here


@dataclass
class QatVsBf16(Displayable):
    """Part 2's figures from a bf16 and a QAT decode run (same spec and venue), each beside the
    published one."""

    bf16: DecodeSpeed
    qat: DecodeSpeed
    measured_on: Kind
    venue: str

    @property
    def speeds(self) -> dict[str, DecodeSpeed]:
        return {"bf16": self.bf16, "qat": self.qat}

    @property
    def flushed(self) -> str | None:
        """Why there is no per-stream speed (answers came in one flush), else None."""
        return self.bf16.not_measured or self.qat.not_measured

    @property
    def c_max(self) -> int:
        return max(self.qat.output_tok_s)

    @property
    def per_stream(self) -> dict[str, float | str | None]:
        """Per-stream decode tok/s at c=1 for each build, or why there is none."""
        return {b: self.flushed or (s.per_stream or {}).get(1) for b, s in self.speeds.items()}

    @property
    def ratio_c1(self) -> float | str:
        """QAT/bf16 per-stream at c=1, or why there is none."""
        return self.flushed or self.qat.per_stream[1] / self.bf16.per_stream[1]  # type: ignore[index,operator]

    @property
    def ratio_output_c1(self) -> float:
        return self.qat.output_tok_s[1] / self.bf16.output_tok_s[1]  # type: ignore[operator]

    @property
    def ratio_cmax(self) -> float:
        return self.qat.output_tok_s[self.c_max] / self.bf16.output_tok_s[self.c_max]  # type: ignore[operator]

    def decode_curves(self) -> tuple[str, dict[str, dict[int, float | None]]]:
        """(what is plotted, build -> figure per concurrency): per-stream tok/s, or output tok/s
        where the answers came in one flush."""
        if self.flushed:
            return "output tok/s, all streams (answers came in one flush)", {
                b: s.output_tok_s for b, s in self.speeds.items()}
        return "per-stream decode tok/s", {b: s.per_stream or {} for b, s in self.speeds.items()}

    def caption(self) -> str:
        flushed = f"; per-stream speed {self.flushed}" if self.flushed else ""
        return f"QAT int4 vs bf16, measured here ({self.venue}) beside the published figures{flushed}"

    def table_rows(self) -> list[dict[str, object]]:
        c1, c8, l4, c_max = T4_QAT_VS_BF16_C1, T4_QAT_VS_BF16_C8, PART2_L4_QAT_VS_BF16, self.c_max
        rows = [
            ("per-stream tok/s bf16, c=1", self.per_stream["bf16"], c1.baseline_value, c1),
            ("per-stream tok/s QAT, c=1", self.per_stream["qat"], c1.value, c1),
            ("QAT/bf16 per stream, c=1", self.ratio_c1, c1.ratio, c1),
            (f"QAT/bf16 all streams, c={c_max} (published: c=8)", self.ratio_cmax, c8.ratio, c8),
            ("QAT/bf16 single-stream decode (published: on an L4)", self.ratio_c1, l4.ratio, l4),
        ]
        if c_max == 8:  # the published all-streams figures are at c=8
            rows += [("output tok/s bf16, c=8", self.bf16.output_tok_s[8], c8.baseline_value, c8),
                     ("output tok/s qat, c=8", self.qat.output_tok_s[8], c8.value, c8)]
        # figures the series did not publish: no published value, so no ratio and no comparison of kinds
        rows += [("QAT/bf16 output tok/s, c=1", self.ratio_output_c1, None, c1),
                 *((f"E2EL ms {b}, c=1", s.e2el_ms[1], None, c1) for b, s in self.speeds.items())]
        return [beside(label, m, p, r.source, r.conditions if p is not None else "measured here (not published)",
                       measured_on=self.measured_on, published_on=published_kind(r)) for label, m, p, r in rows]


def qat_vs_bf16(bf16_run: BenchRun, qat_run: BenchRun, venue: str) -> QatVsBf16:
    """Part 2's comparison of two complete decode runs (refused, naming why, for an incomplete one or
    one without the c=1 cell its ratios are taken at)."""
    bf16, qat = bf16_run.decode_speed(), qat_run.decode_speed()
    if 1 not in bf16.output_tok_s or 1 not in qat.output_tok_s:
        raise Gemma4T4Error("Part 2's QAT/bf16 figures are at one stream, but a run measured no c=1 cell "
                            f"(bf16: c={sorted(bf16.output_tok_s)}, QAT: c={sorted(qat.output_tok_s)})",
                            fix='measure both with concurrency 1 among the rest, e.g. -p CONCURRENCY "[1, 8]"')
    return QatVsBf16(bf16, qat, measured_kind(bf16_run), venue)


def t4_beside(decode: BenchRun, ttft_ms: dict[int, float | None], title: str) -> Table:
    """Part 4's decode and TTFT runs, each figure beside the series' GCE T4 E2B QAT cell."""
    speed = decode.decode_speed()
    c1, c8 = gce_t4("qat"), gce_t4("qat", concurrency=8)
    per_stream = speed.per_stream or {}
    # (figure, measured, published, its source, its conditions)
    rows = [(f"median TTFT ms at {n} tokens, c=1", ttft_ms.get(n), gce_t4("qat", n).ttft_ms, c1.source,
             f"GCE T4, E2B QAT, {n} in, c=1") for n in (512, 4096)]
    rows += [(f"per-stream tok/s, c={c}", speed.not_measured or per_stream.get(c), r.per_stream_tok_s, r.source,
              f"GCE T4, E2B QAT, 512 in / 128 out, c={c}") for c, r in ((1, c1), (8, c8))]
    rows.append(("output tok/s, c=8", speed.output_tok_s.get(8), c8.output_throughput_tok_s, c8.source,
                 "GCE T4, E2B QAT, 512 in / 128 out, c=8"))
    rows += [(f"median E2EL ms, c={c}", ms, None, c1.source, "end-to-end latency (not published)")
             for c, ms in speed.e2el_ms.items()]
    kind = {"measured_on": measured_kind(decode), "published_on": published_kind(c1)}
    return Table([beside(*row, **kind) for row in rows], title)


def sagemaker_decode_table() -> Table:
    """The series' published T4 vs L4 single-stream decode rows (what stands alone off SageMaker)."""
    rows = [{"model": r.model, "build": r.build, "T4 tok/s (published)": r.t4_tok_s, "L4 tok/s (published)": r.l4_tok_s,
             "T4 / L4 (published)": r.t4_tok_s / r.l4_tok_s,
             "identical answers (published)": r.identical_answers, "source": r.source.split(" (")[0]}
            for r in SAGEMAKER_DECODE if r.t4_tok_s]
    return Table(rows, "T4 vs L4 on SageMaker, single-stream decode (published)")


def headline_rows(headline: Any) -> Table:
    """A T4-vs-L4 headline (A = T4, B = L4) as rows beside the published SageMaker row; a ratio appears
    only where the runs recorded the published row's model size and GPU."""
    pub = headline.published
    conditions = f"SageMaker, {pub.model} {pub.build}, c=1" if pub else "not published"
    source = pub.source if pub else ""
    kind_a, kind_b = headline.kind_a, headline.kind_b
    both = (Kind(kind_a.model_size, f"{kind_a.gpu}/{kind_b.gpu}")
            if kind_a and kind_b and kind_a.model_size == kind_b.model_size else None)

    answers = headline.answers
    identical = answers.identical / answers.total if answers and answers.measured and answers.total else None
    pub_identical = None
    if pub and pub.identical_answers:
        same, total = (int(x) for x in pub.identical_answers.split("/"))
        pub_identical = same / total
    # (figure, measured, published, measured on, the published row's GPU)
    rows = [
        (f"decode tok/s on the T4 ({headline.decode_method})", headline.decode_a,
         pub.t4_tok_s if pub else None, kind_a, "t4"),
        (f"decode tok/s on the L4 ({headline.decode_method})", headline.decode_b,
         pub.l4_tok_s if pub else None, kind_b, "l4"),
        ("T4 / L4 decode", headline.decode_ratio,
         pub.t4_tok_s / pub.l4_tok_s if pub and pub.t4_tok_s else None, both, "t4/l4"),
        ("T4 / L4 median TTFT", headline.ttft_ratio, None, both, "t4/l4"),
        ("identical answers (share)", identical, pub_identical, both, "t4/l4"),
    ]
    return Table([
        beside(label, measured, published, source, conditions, measured_on=measured_on,
               published_on=published_kind(pub, gpu) if pub else None)
        for label, measured, published, measured_on, gpu in rows
    ], "T4 vs L4, measured here beside the published row")
