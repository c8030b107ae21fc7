"""What vLLM is asked to load for an emb4 build, resolved by vLLM's own code with no server.

A stand-in for serving the 4-bit embedding on vLLM's CPU build, which cannot run it (its
gather-dequantize kernel is Triton-only; see docs/quantization.md). Run as a script in its own
process (vLLM's distributed state is process-wide): ``python vllm_emb4_load_standin.py MODEL_DIR``.
It builds vLLM's engine config from the checkpoint (config.json and its compressed-tensors
``quantization_config``), creates vLLM's Gemma 4 model on the CPU and runs the model loader's
``load_weights`` (the checkpoint-name to parameter mapping and its every-weight-loaded check),
then prints one JSON object: per embedding module the quant method vLLM chose and each
parameter's shape, dtype and whether it holds the checkpoint's tensor bit for bit; the
embedding rows dequantized from vLLM's parameters by a torch copy of vLLM's kernel; and what
vLLM's own embedding lookup does on this build.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def dequant_gather(ids, weight_packed, weight_scale, hidden: int, num_bits: int = 4):
    """A torch copy of vLLM's ``_dequant_gather_kernel`` (compressed_tensors_embedding.py, vLLM
    0.32): unpack each gathered row's int32 words low bits first, subtract 2**(bits-1), times the
    row's group scale."""
    import torch

    pack = 32 // num_bits
    words = weight_packed[ids].to(torch.int64)  # [n, hidden / pack]
    shifts = torch.arange(pack, dtype=torch.int64) * num_bits
    q = ((words[..., None] >> shifts) & ((1 << num_bits) - 1)).reshape(len(ids), -1)[:, :hidden]
    q = q - (1 << (num_bits - 1))
    groups = weight_scale.shape[1]
    scale = weight_scale[ids].to(torch.float32).repeat_interleave(hidden // groups, dim=1)
    return (q.to(torch.float32) * scale).to(weight_scale.dtype)


def main(model_dir: str) -> dict:
    import torch
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.triton_utils import HAS_TRITON
    from vllm.utils.network_utils import get_open_port
    from vllm.utils.torch_utils import set_default_torch_dtype

    # float16: the T4 serving dtype, so the fp16 scales load without conversion
    args = EngineArgs(model=model_dir, max_model_len=256, max_num_seqs=1, enforce_eager=True, dtype="float16")
    vc = args.create_engine_config()
    ckpt = load_file(os.path.join(model_dir, "model.safetensors"))
    src = load_file(os.path.join(os.environ["EMB4_SOURCE"], "model.safetensors")) if os.environ.get("EMB4_SOURCE") else {}
    out: dict = {"quant_config": type(vc.quant_config).__name__, "quant_method": vc.quant_config.get_name(),
                 "has_triton": HAS_TRITON, "modules": {}}
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{get_open_port()}")
        initialize_model_parallel(1, 1)
        loader = get_model_loader(vc.load_config)
        with set_default_torch_dtype(vc.model_config.dtype), torch.device("cpu"):
            model = loader.create_model(vllm_config=vc, model_config=vc.model_config)
        # vLLM's name mapping; it raises when a parameter was left without a checkpoint tensor
        loader.load_weights(model, vc.model_config)
        modules = dict(model.named_modules())
        for name, module in modules.items():
            short = name.removeprefix("model.")
            if short not in ("embed_tokens", "embed_tokens_per_layer", "lm_head"):
                continue
            method = getattr(module, "quant_method", None)
            row = {"class": type(module).__name__, "method": type(method).__name__,
                   "scheme": type(getattr(module, "scheme", None)).__name__, "params": {}}
            for pname, param in module.named_parameters(recurse=False):
                stored = ckpt.get(f"{name}.{pname}")  # vLLM's module names are the checkpoint's
                row["params"][pname] = {
                    "shape": list(param.shape), "dtype": str(param.dtype).removeprefix("torch."),
                    "checkpoint_shape": list(stored.shape) if stored is not None else None,
                    "checkpoint_dtype": str(stored.dtype).removeprefix("torch.") if stored is not None else None,
                    "equal_to_checkpoint": bool(stored is not None and stored.shape == param.shape
                                                and torch.equal(stored.to(param.dtype), param.data)),
                }
            if short.startswith("embed_tokens") and hasattr(module, "weight_packed"):
                ids = torch.arange(module.weight_packed.shape[0])
                deq = dequant_gather(ids, module.weight_packed.data, module.weight_scale.data, module.hidden_size)
                row["standin_rows"] = list(deq.shape)
                reference = src.get(f"{name}.weight")
                if reference is not None:
                    ref = reference.to(torch.float32)
                    got = deq.to(torch.float32)
                    row["bit_identical_pct"] = round(100.0 * float((got == ref).float().mean()), 4)
                    # the value a bf16 model would hold: the QAT source itself, where the scale is exact
                    as_bf16 = deq.to(torch.bfloat16).to(torch.float32)
                    row["bf16_identical_pct"] = round(100.0 * float((as_bf16 == ref).float().mean()), 4)
                    rel = ((got - ref).abs() / ref.abs().clamp_min(1e-30))[ref != 0]
                    row["max_rel_diff"] = float(rel.max()) if rel.numel() else 0.0
                try:  # vLLM's own lookup, the call a forward pass makes
                    module.quant_method.embedding(module, torch.tensor([[2, 5, 7]]))
                    row["vllm_lookup"] = "ok"
                except Exception as exc:  # noqa: BLE001 - reported, the test judges it
                    row["vllm_lookup"] = f"{type(exc).__name__}: {exc}"
            out["modules"][short] = row
    return out


if __name__ == "__main__":
    print("EMB4-STANDIN " + json.dumps(main(sys.argv[1])), flush=True)
