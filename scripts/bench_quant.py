"""Benchmark grid-check and repack on a synthetic E2B-sized QAT checkpoint (not a test).

Generates an on-grid bf16 checkpoint of about ``--gb`` GB (sharded, with index) under
.cache/bench-quant/, then measures in fresh subprocesses (so peak RSS is per step):

* ``grid-check`` and ``repack`` (fp16 scales): wall time, MB/s of source read, peak RSS;
* the baseline: compressing the same tensors with compressed-tensors' own
  ``PackedQuantizationCompressor.compress`` (given the scales, reading with safetensors),
  tensor by tensor, wall time and peak RSS.

Times are for the work alone; ``with_imports_s`` adds the step's imports (torch and
compressed-tensors for the baseline, numba's cached kernels for ours).

Everything it generated is deleted at the end (``--keep`` keeps it).

    .venv/bin/python scripts/bench_quant.py --gb 10
    .venv/bin/python scripts/bench_quant.py --gb 1 --gb 4    # RSS flat vs size
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "bench-quant"

# E2B-like text stack: hidden 1536, 35 layers, MLP 6144 (12288 in 20 KV-shared layers), PLE 262144 x 8960.
HIDDEN, LAYERS, MLP, MLP_WIDE, VOCAB, PLE = 1536, 35, 6144, 12288, 262144, 8960


def e2b_like_shapes() -> list[tuple[str, tuple[int, int]]]:
    shapes = [("model.embed_tokens.weight", (VOCAB, HIDDEN)),
              ("model.embed_tokens_per_layer.weight", (VOCAB, PLE)),
              ("model.per_layer_model_projection.weight", (PLE, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        mlp = MLP_WIDE if i >= 15 else MLP
        heads = 512 if (i + 1) % 5 == 0 else 256
        shapes += [(f"{p}.self_attn.q_proj.weight", (8 * heads, HIDDEN)),
                   (f"{p}.self_attn.k_proj.weight", (heads, HIDDEN)),
                   (f"{p}.self_attn.v_proj.weight", (heads, HIDDEN)),
                   (f"{p}.self_attn.o_proj.weight", (HIDDEN, 8 * heads)),
                   (f"{p}.mlp.gate_proj.weight", (mlp, HIDDEN)),
                   (f"{p}.mlp.up_proj.weight", (mlp, HIDDEN)),
                   (f"{p}.mlp.down_proj.weight", (HIDDEN, mlp)),
                   (f"{p}.per_layer_input_gate.weight", (256, HIDDEN)),
                   (f"{p}.per_layer_projection.weight", (HIDDEN, 256))]
    return shapes


def scaled_shapes(gb: float) -> list[tuple[str, tuple[int, int]]]:
    """E2B-like tensors, rows scaled so the bf16 total is about ``gb`` GB."""
    shapes = e2b_like_shapes()
    total = sum(r * c * 2 for _, (r, c) in shapes)
    f = gb * 1e9 / total
    return [(n, (max(8, int(r * f) // 8 * 8), c)) for n, (r, c) in shapes]


def generate(folder: Path, gb: float, seed: int = 0) -> int:
    """Write an on-grid bf16 checkpoint block by block (bounded memory)."""
    sys.path.insert(0, str(REPO))
    from gemma4_t4.quant import lattice
    from gemma4_t4.quant.safetensors_io import PlannedTensor, ShardedWriter

    folder.mkdir(parents=True, exist_ok=True)
    shapes = scaled_shapes(gb)
    plan = [PlannedTensor(n, "BF16", s) for n, s in shapes]
    writer = ShardedWriter(folder, plan, max_shard_bytes=2 * 10**9)
    rng = np.random.default_rng(seed)
    for name, (rows, cols) in shapes:
        step = max(8, (32 * 2**20) // (cols * 2))
        for start in range(0, rows, step):
            n = min(step, rows - start)
            g = cols // 32
            peak = rng.integers(4, 9, size=(n, g))
            scale = (10 ** rng.uniform(-3.5, -1.5, size=(n, g))).astype(np.float32)
            q = np.clip(np.rint(rng.normal(0, 2.2, size=(n, g, 32))), -peak[..., None], np.minimum(peak[..., None], 7))
            q[..., 0] = np.where(peak == 8, -8, peak)
            w = lattice.round_to_dtype((q * scale[..., None]).reshape(n, cols), "bf16")
            writer.write_rows(name, start, lattice.f32_to_bf16_bits(w))
    writer.finish()
    (folder / "config.json").write_text(json.dumps({"model_type": "gemma4_text", "tie_word_embeddings": True}))
    return sum(r * c * 2 for _, (r, c) in shapes)


# step -> (imports, work): the work is timed alone and with its imports (torch + compressed-tensors
# take seconds to import, numba's cached kernels well under one)
STEPS = {
    "grid-check": ("from gemma4_t4.quant import grid_check",
                   "r = grid_check(SRC); assert r.on_grid"),
    "repack": ("from gemma4_t4.quant import repack",
               "r = repack(SRC, DST, emb4=True); assert r.levels_changed == 0"),
    "repack-both-dtypes": ("from gemma4_t4.quant import repack",
                           "r = repack(SRC, DST, emb4=True, compare_scale_dtypes=True); assert r.levels_changed == 0"),
    "ct-compress": ("""
import glob, os
import torch
from safetensors import safe_open
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
torch.set_num_threads(os.cpu_count())
scheme = QuantizationScheme(targets=['Linear'], weights=QuantizationArgs(num_bits=4, type='int', symmetric=True,
                            strategy='group', group_size=32))
""", """
for path in sorted(glob.glob(os.path.join(SRC, '*.safetensors'))):
    with safe_open(path, 'pt') as f:
        for name in f.keys():
            rows = f.get_slice(name).get_shape()[0]
            step = max(8, (32 * 2**20) // (f.get_slice(name).get_shape()[1] * 2))
            for start in range(0, rows, step):  # same 32 MB blocks as ours, so memory is comparable
                w = f.get_slice(name)[start:start + step]
                scale = (w.float().abs().reshape(w.shape[0], -1, 32).amax(-1) / 7.5).to(torch.float16)
                out = PackedQuantizationCompressor.compress({'weight': w.to(torch.float16), 'weight_scale': scale}, scheme)
                del out, w
"""),
}


def run_step(step: str, src: Path, dst: Path) -> dict:
    imports, work = STEPS[step]
    # VmHWM is this process's own peak RSS (ru_maxrss would carry the parent's over exec)
    code = (f"SRC, DST = {str(src)!r}, {str(dst)!r}\nimport time, re\nt0 = time.perf_counter()\n"
            f"{imports}\nt1 = time.perf_counter()\n{work}\nt2 = time.perf_counter()\n"
            "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
            "print('RESULT', t2 - t1, t1 - t0, hwm)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{step} failed:\n{proc.stderr[-3000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")][-1].split()
    return {"seconds": float(line[1]), "import_s": float(line[2]), "peak_rss_mb": int(line[3]) / 1024}


def warm_page_cache(folder: Path) -> None:
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as f:
            while f.read(64 * 2**20):
                pass


def warm_numba() -> None:
    """Compile (and cache) the kernels once so timings exclude JIT compilation."""
    subprocess.run([sys.executable, "-c", "import numpy as np; from gemma4_t4.quant import lattice, pack; "
                    "w = np.ones((8, 64), np.uint16); f, _ = lattice.analyze(w, scale_dtypes=(\"fp16\", \"bf16\"), use_numba=True); "
                    "pack.pack_int4(f.levels, use_numba=True)"], cwd=REPO, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, action="append", help="checkpoint size(s) in GB (default 10)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the generated checkpoints (and reuse ones kept by an earlier --keep run)")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--repeat", type=int, default=2, help="runs per step; the fastest is reported")
    args = parser.parse_args()
    warm_numba()
    results = []
    for gb in args.gb or [10.0]:
        src, dst = CACHE / f"qat-{gb:g}gb", CACHE / f"repacked-{gb:g}gb"
        shutil.rmtree(dst, ignore_errors=True)
        done_marker = src / ".generated"
        try:
            t = time.perf_counter()
            if args.keep and done_marker.is_file():  # a kept checkpoint from an earlier --keep run
                nbytes, gen_s = int(done_marker.read_text()), None
            else:
                shutil.rmtree(src, ignore_errors=True)
                nbytes = generate(src, gb)
                gen_s = round(time.perf_counter() - t, 1)
                done_marker.write_text(str(nbytes))
            row = {"gb": round(nbytes / 1e9, 2), "generate_s": gen_s}
            steps = ("grid-check", "repack", "repack-both-dtypes") + (() if args.skip_baseline else ("ct-compress",))
            runs: dict[str, list[dict]] = {step: [] for step in steps}
            for _ in range(args.repeat):  # best of N, steps interleaved: a slow minute hits every step alike
                for step in steps:
                    shutil.rmtree(dst, ignore_errors=True)
                    warm_page_cache(src)  # every step starts from the same (cached) state
                    runs[step].append(run_step(step, src, dst))
                    print(gb, step, {k: round(v, 2) for k, v in runs[step][-1].items()}, flush=True)
            for step in steps:
                res = min(runs[step], key=lambda r: r["seconds"])
                res["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs[step])
                res["mb_per_s"] = round(nbytes / 1e6 / res["seconds"], 1)
                res["with_imports_s"] = res["seconds"] + res["import_s"]
                row[step] = {k: round(v, 2) for k, v in res.items()}
            if "ct-compress" in row:
                base = row["ct-compress"]
                for step in ("grid-check", "repack", "repack-both-dtypes"):
                    row[f"{step}_speedup_vs_ct"] = round(base["seconds"] / row[step]["seconds"], 2)
                    row[f"{step}_speedup_vs_ct_with_imports"] = round(
                        base["with_imports_s"] / row[step]["with_imports_s"], 2)
            results.append(row)
        finally:
            if not args.keep:
                shutil.rmtree(src, ignore_errors=True)
                shutil.rmtree(dst, ignore_errors=True)
    print(json.dumps({"cpus": __import__("os").cpu_count(), "self_rss_mb":
                      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "results": results}, indent=2))


if __name__ == "__main__":
    main()
