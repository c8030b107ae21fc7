"""The series' PUBLISHED reference results, as data. These were measured by the series' author
on their hardware with ``vllm bench serve`` (random prompts, 8 prompts per cell, prefix caching
on with warm-ups copying prompt #0, so some cells are cache-contaminated); they are not ours.
Every entry carries ``published=True`` and its source."""

from __future__ import annotations

from dataclasses import dataclass

GCE_SOURCE = ("xbill9/gemma4-dev gpu-vllm-t4-2b/benchmarks/runs/2026-09-18-qat-vs-bf16-t4/ "
              "(GCE n1-standard-2 + T4, vLLM 0.29.0 with the hd512 clamp, fp16, max-num-seqs 8, "
              "vllm bench serve random, output 128, --ignore-eos --num-warmups 2, 8 prompts at c=1)")
SAGEMAKER_SOURCE = ("xbill9/sagemaker-gemma compare.py (AWS vLLM DLC 0.30.0, context 8192, us-east-2; "
                    "decode = (512-16)/(wall512 - wall16); load uses one shared prompt)")


@dataclass(frozen=True)
class PublishedResult:
    gpu: str
    model: str
    build: str  # bf16 | qat | emb4
    input_len: int
    concurrency: int
    output_throughput_tok_s: float
    per_stream_tok_s: float
    ttft_ms: float  # mean TTFT as published
    source: str
    published: bool = True
    note: str = ""


def _gce(build: str, rows: list[tuple[int, int, float, float, float]]) -> list[PublishedResult]:
    out = []
    for input_len, c, tput, stream, ttft in rows:
        note = "queueing (c > max-num-seqs 8)" if c > 8 else ""
        out.append(PublishedResult("t4", "gemma-4-E2B", build, input_len, c, tput, stream, ttft, GCE_SOURCE,
                                   note=note))
    return out


GCE_T4_E2B: list[PublishedResult] = (
    _gce("bf16", [(512, 1, 37.04, 40.44, 300), (512, 4, 109.05, 32.25, 791), (512, 8, 164.62, 25.49, 1212),
                  (512, 16, 164.36, 24.97, 7270), (4096, 1, 12.11, 30.00, 7199), (4096, 8, 15.66, 2.53, 16779)])
    + _gce("qat", [(512, 1, 62.27, 72.31, 316), (512, 4, 157.49, 54.50, 937), (512, 8, 215.91, 37.83, 1301),
                   (512, 16, 213.79, 34.69, 5903), (4096, 1, 14.00, 46.18, 7243), (4096, 8, 15.95, 2.59, 16879)])
    + _gce("emb4", [(512, 1, 85.28, 99.94, 252), (512, 4, 183.08, 67.71, 971), (512, 8, 239.64, 44.68, 1394),
                    (512, 16, 237.08, 40.05, 5369), (4096, 1, 15.03, 56.67, 7138), (4096, 8, 16.38, 2.66, 16479)])
)


@dataclass(frozen=True)
class PublishedDecode:
    """Single-stream decode tok/s on SageMaker, T4 (ml.g4dn.xlarge) and L4 (ml.g6.xlarge)."""

    model: str
    build: str
    l4_tok_s: float
    t4_tok_s: float | None
    identical_answers: str | None
    source: str = SAGEMAKER_SOURCE
    published: bool = True


SAGEMAKER_DECODE: list[PublishedDecode] = [
    PublishedDecode("gemma-4-E2B", "emb4", 141.7, 108.5, "40/40"),
    PublishedDecode("gemma-4-E4B", "emb4", 79.9, 65.6, "40/40"),
    PublishedDecode("gemma-4-12B", "emb4", 35.0, 28.5, "40/40"),
    PublishedDecode("gemma-4-E2B", "qat", 105.1, None, None),
    PublishedDecode("gemma-4-E2B", "bf16", 51.3, None, None),
]


@dataclass(frozen=True)
class PublishedLoad:
    """Output tok/s at 16 concurrent requests of 256 tokens on SageMaker, T4 and L4."""

    model: str
    build: str
    t4_tok_s: float
    l4_tok_s: float
    t4_instance: str = "ml.g4dn.xlarge"
    l4_instance: str = "ml.g6.xlarge"
    concurrency: int = 16
    source: str = SAGEMAKER_SOURCE
    published: bool = True


SAGEMAKER_LOAD: list[PublishedLoad] = [
    PublishedLoad("gemma-4-E2B", "emb4", 787.05, 1259.15),
    PublishedLoad("gemma-4-E4B", "emb4", 488.05, 848.95),
    PublishedLoad("gemma-4-12B", "emb4", 216.45, 411.8),
]


def gce_t4(build: str, input_len: int = 512, concurrency: int = 1) -> PublishedResult:
    """The published GCE T4 E2B cell for a build (bf16 | qat | emb4)."""
    for r in GCE_T4_E2B:
        if (r.build, r.input_len, r.concurrency) == (build, input_len, concurrency):
            return r
    have = sorted({(r.build, r.input_len, r.concurrency) for r in GCE_T4_E2B})
    raise KeyError(f"no published GCE T4 cell for {build} in {input_len} c={concurrency}; published: {have}")


def sagemaker_load(model: str = "gemma-4-E2B", build: str = "emb4") -> PublishedLoad:
    for r in SAGEMAKER_LOAD:
        if (r.model, r.build) == (model, build):
            return r
    raise KeyError(f"no published SageMaker load figure for {model} {build}")


def published_results(gpu: str | None = None, build: str | None = None) -> list[PublishedResult]:
    return [r for r in GCE_T4_E2B if (gpu is None or r.gpu == gpu) and (build is None or r.build == build)]
