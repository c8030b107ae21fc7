"""``gemma4-t4 tiny OUT``: build the tiny random Gemma 4 checkpoint (offline, seconds)."""

from __future__ import annotations

import argparse

from gemma4_t4.cli import Output, add_command
from gemma4_t4.errors import Gemma4T4Error


def _tiny(args: argparse.Namespace) -> Output:
    from gemma4_t4.catalog.tiny import build_tiny_gemma4  # imports torch/transformers only when building

    try:
        info = build_tiny_gemma4(args.out, variant=args.variant, overwrite=args.overwrite)
    except ImportError as exc:
        raise Gemma4T4Error(f"cannot build the tiny model: {exc}",
                            fix="pip install -e '.[model]' (torch, transformers, tokenizers)") from exc
    if info.variant == "drafter":
        text = (f"wrote a tiny random Gemma 4 assistant (MTP drafter, {info.num_parameters:,} parameters, vocab "
                f"{info.vocab_size}) for the default tiny target to {info.path}\nfiles: {', '.join(info.files)}\n"
                f"serve it: gemma4-t4 serve start --target cpu --model TINY_TARGET --draft {info.path}")
    else:
        text = (f"wrote a tiny random Gemma 4 ({info.variant}, {info.num_parameters:,} parameters, vocab "
                f"{info.vocab_size}) to {info.path}\nfiles: {', '.join(info.files)}\n"
                f"serve it: python -m vllm.entrypoints.openai.api_server --model {info.path} "
                f"--served-model-name {info.served_model_name}")
    return Output(info, "\n".join([text, *info.cleanup]))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "tiny", _tiny, help="build the tiny random Gemma 4 checkpoint + tokenizer (offline)",
                    description="Build a tiny random-weight Gemma 4 text model with an offline tokenizer and chat "
                                "template, servable by vLLM's CPU build. Deterministic; written atomically.")
    p.add_argument("out", help="output directory")
    p.add_argument("--variant", choices=["bf16", "qat", "drafter"], default="bf16",
                   help="qat: every Linear and embedding on the int4 group-32 grid (stored as bf16); "
                        "drafter: a tiny gemma4_assistant (MTP drafter) matching the default tiny target")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing OUT (atomically; only a folder gemma4-t4 wrote)")
