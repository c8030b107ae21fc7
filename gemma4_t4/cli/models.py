"""``gemma4-t4 models`` (the Gemma 4 catalog) and ``gemma4-t4 fit`` (memory fit on a GPU)."""

from __future__ import annotations

import argparse

from gemma4_t4.catalog import models as m
from gemma4_t4.catalog.hardware import GPUS, SAGEMAKER_INSTANCES
from gemma4_t4.cli import Output, add_command
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.table import format_pairs, format_table

# ---------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------


def _models(args: argparse.Namespace) -> Output:
    if args.name:
        info = m.model_info(args.name)
        return Output(info, _model_text(info))
    infos = [m.model_info(k) for k in m.VARIANTS]
    rows = [
        [i.name, f"{i.params.published.total:.2f}", f"{i.layers} ({i.full_attention_layers})", i.hidden_size,
         f"{i.q_heads}/{i.kv_heads_sliding}/{i.kv_heads_global}", i.sliding_window, i.kv_shared_layers,
         f"{i.decode_bytes_gb['bf16']:.3f}", f"{i.decode_bytes_gb['qat-w4a16']:.3f}",
         f"{i.decode_bytes_gb['emb4']:.3f}", f"{i.t4_roofline_tok_s['bf16']:.1f}",
         f"{i.t4_roofline_tok_s['qat-w4a16']:.1f}", f"{i.t4_roofline_tok_s['emb4']:.1f}"]
        for i in infos
    ]
    text = format_table(
        ["model", "params B", "layers (full)", "hidden", "q/kv/kv-glob", "window", "kv-shared",
         "GB/tok bf16", "qat", "emb4", "T4 tok/s bf16", "qat", "emb4"],
        rows, right=range(1, 13),
    )
    text += ("\n\nGB/tok: bytes one decoded token reads (batch 1); T4 tok/s: the 320 GB/s bandwidth ceiling "
             "per stream.\nDetails and hub ids: gemma4-t4 models NAME")
    return Output(infos, text)


def _model_text(i: m.ModelInfo) -> str:
    p = i.params
    lines = [
        ("model", f"{i.name} ({i.model_type})"),
        ("layers", f"{i.layers}: {i.full_attention_layers} full, {i.layer_pattern}"),
        ("hidden", i.hidden_size),
        ("heads", f"{i.q_heads} q / {i.kv_heads_sliding} kv sliding / {i.kv_heads_global} kv global"
                  + (" (k_eq_v on global layers)" if i.attention_k_eq_v else "")),
        ("head_dim", f"{i.head_dim} sliding / {i.global_head_dim} global"),
        ("sliding window", i.sliding_window), ("MLP", i.mlp), ("KV-shared layers", i.kv_shared_layers),
        ("per-layer embeddings", i.ple),
        ("vocab", f"{i.vocab_size:,} (tied embeddings)" if i.tie_word_embeddings else f"{i.vocab_size:,}"),
        ("max positions", f"{i.max_position_embeddings:,}"), ("towers", i.towers),
        ("params (published)", f"{p.published.total:.2f} B"
                               + (f", ~{p.published.active} B active" if p.published.active else "")),
        ("params (derived)", f"body {p.body / 1e9:.3f} B, embed {p.embed / 1e9:.3f} B, PLE {p.ple / 1e9:.3f} B, "
                             f"towers {p.towers / 1e9:.3f} B"),
        ("GB per token", ", ".join(f"{f} {v:.3f}" for f, v in i.decode_bytes_gb.items())),
        ("T4 roofline tok/s", ", ".join(f"{f} {v:.1f}" for f, v in i.t4_roofline_tok_s.items())),
        ("hub bf16", i.hub.bf16),
        ("hub qat-w4a16", i.hub.qat_w4a16_ct or "none from Google (repack q4_0-unquantized)"),
        ("hub q4_0-unquantized", i.hub.qat_q4_0_unquantized), ("hub gguf", i.hub.qat_q4_0_gguf),
        ("community emb4", i.hub.community_emb4),
    ]
    lines += [("note", n) for n in i.notes]
    return format_pairs(lines)


# ---------------------------------------------------------------------------------------
# fit
# ---------------------------------------------------------------------------------------


def _resolve_gpus(args: argparse.Namespace) -> tuple[str, int]:
    if args.instance:
        name = args.instance if args.instance.startswith("ml.") else f"ml.{args.instance}"
        if name not in SAGEMAKER_INSTANCES:
            raise Gemma4T4Error(f"unknown instance {args.instance!r}",
                                fix=f"use one of: {', '.join(k[3:] for k in SAGEMAKER_INSTANCES)}")
        return SAGEMAKER_INSTANCES[name]
    return args.gpu, args.gpus


def _fit(args: argparse.Namespace) -> Output:
    gpu, num_gpus = _resolve_gpus(args)
    everything = m.fit_table(gpu, args.context, num_gpus, gpu_memory_utilization=args.gpu_memory_utilization,
                             max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                             text_only=args.text_only, overhead_gib=args.overhead_gib)
    formats = [m.normalize_format(args.format)] if args.format else m.FORMATS
    models = [m.get_variant(args.model).key] if args.model else m.VARIANTS
    results = m.FitTable(r for r in everything if r.model in models and r.format in formats)
    best = m.largest_fitting(everything)
    where = f"{num_gpus}x {gpu.upper()}" if num_gpus > 1 else f"one {gpu.upper()}"
    if best:
        best_formats = ", ".join(r.format for r in everything if r.model == best.model and r.fits)
        summary = (f"largest Gemma 4 that fits {where} at {args.context:,} tokens: "
                   f"{m.VARIANTS[best.model].name} ({best_formats})")
    else:
        summary = f"no Gemma 4 size fits {where} at {args.context:,} tokens"
    data = {"gpu": gpu, "num_gpus": num_gpus, "context_len": args.context, "results": results,
            "largest_fitting": best.model if best else None, "summary": summary}
    notes = results[0].notes if len(results) == 1 else []
    lines = [str(results), *(f"  note: {n}" for n in notes)]
    if args.model and args.format:
        r = results[0]
        data["load_ram"] = m.load_ram(r.model, r.format)
        data["roofline"] = m.decode_roofline(r.model, r.format, gpu)
        lines.append(f"  load: {data['load_ram'].advice}")
    return Output(data, "\n".join([*lines, summary]))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "models", _models, help="the Gemma 4 family: shapes, hub ids, bytes per token",
                    description="List the Gemma 4 sizes, or show one (e2b, E4B, gemma-4-12b, 26b-a4b, 31b).")
    p.add_argument("name", nargs="?", help="a size such as e2b or google/gemma-4-E2B-it")

    p = add_command(subparsers, "fit", _fit, help="will a Gemma 4 build fit a GPU? weights, KV cache, context",
                    description="Estimate weights + KV cache + overhead per GPU. With no --model, a table of "
                                "every size x format on that GPU.")
    p.add_argument("--gpu", default="t4", type=str.lower, choices=sorted(GPUS),
                   help="GPU type, any case (default %(default)s)")
    p.add_argument("--gpus", type=int, default=1, help="number of GPUs (tensor parallel), e.g. 4 for g4dn.12xlarge")
    p.add_argument("--instance", help="an AWS instance type instead of --gpu/--gpus, e.g. g4dn.12xlarge")
    p.add_argument("--model", help="one size (e2b, e4b, 12b, 26b-a4b, 31b); default all")
    p.add_argument("--format", help=f"one of {', '.join(m.FORMATS)}; default all")
    p.add_argument("--context", type=int, default=8192, help="max model length in tokens (default 8192)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-num-batched-tokens", type=int, default=m.DEFAULT_MAX_NUM_BATCHED_TOKENS)
    p.add_argument("--text-only", action="store_true", help="--language-model-only: do not load the towers")
    p.add_argument("--overhead-gib", type=float, default=m.DEFAULT_OVERHEAD_GIB,
                   help="CUDA context + activations + graphs per GPU (default %(default)s)")
