"""The demo pair at fp32, fp16, int8 and int4 (target and draft), next to ONNX Runtime GenAI on the same
weights, in one run.

    python benchmarks/demo/quantized_demo.py [--work DIR] [--json benchmarks/demo/quantized-demo-cpu.json]

specrt: the demo checkpoints (demo/hf) exported at fp32 and fp16 (default, fused graphs), and `specrt
quantize` of the fp32 export at int8 and int4 (block 32), plus int4 of the portable (plain-op) graphs to
show what fusing buys; methods none and draft (γ 4). ONNX Runtime GenAI: its own model
builder on demo/hf/target at int4 and fp32, plain decoding (`og.Generator`). Greedy, the 8 shipped
code prompts × 128 new tokens; every configuration runs once per round, rounds interleaved, medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "demo" / "hf"


def bundles(work: Path) -> dict[str, Path]:
    from specrt.export.exporter import ExportOptions, export_bundle
    from specrt.export.quant.quantize import QuantizeOptions, quantize_bundle

    out = {"fp32": work / "fp32", "fp16": work / "fp16", "int8": work / "int8", "int4": work / "int4",
           "int4-portable": work / "int4-portable"}
    floats = {"fp32": ("float32", "auto"), "fp16": ("float16", "auto"), "fp32-portable": ("float32", "portable")}
    for name, (dtype, graph) in floats.items():
        folder = out.get(name, work / name)
        if not (folder / "specrt.json").exists():
            export_bundle(str(HF / "target"), str(HF / "draft"), folder,
                          ExportOptions(dtype=dtype, graph=graph, force=True))
    for name, src, bits in (("int8", "fp32", 8), ("int4", "fp32", 4), ("int4-portable", "fp32-portable", 4)):
        if not (out[name] / "specrt.json").exists():
            quantize_bundle(work / src, out[name], QuantizeOptions(bits=bits, block_size=32, force=True))
    return out


def verify_cost(gen, past: int = 100, widths: tuple[int, ...] = (1, 2, 5, 8), repeats: int = 200) -> dict[str, float]:
    """Target pass time at Q = 1, 2, 5, 8 over a past of ``past`` tokens, relative to Q = 1 (medians of
    ``repeats`` calls): speculation pays only while verifying Q tokens costs about one pass."""
    import numpy as np

    from specrt.runtime.masks import causal_mask

    dec = gen.decoders["target"]
    cache = dec.new_cache(past + max(widths))
    cache.length = past
    times = {}
    for q in widths:
        ids, pos, mask = np.ones(q, np.int64), np.arange(past, past + q), causal_mask(q, past)
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dec.forward(cache, ids, pos, mask)
            runs.append(time.perf_counter() - t0)
        times[q] = statistics.median(runs)
    return {f"Q={q}": times[q] / times[1] for q in widths} | {"Q=1 ms": times[1] * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/specrt-qd-fused"))
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "demo" / "quantized-demo-cpu.json")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    import specrt
    from specrt.bundle.manifest import load_manifest
    from specrt.data import prompts as builtin_prompts
    from specrt.measure.peers.ortgenai import BuildSpec, OrtGenaiPeer, build_model
    from specrt.runtime.sampling import SamplingConfig

    prompts = builtin_prompts("code")
    gens = {name: specrt.load(path) for name, path in bundles(args.work).items()}
    # The builder's defaults at int4 (blocks of 32, int8 activations) are what `specrt quantize` uses.
    peers = {f"ortgenai-{p}": OrtGenaiPeer(build_model(HF / "target", BuildSpec(p), args.work / "peers").path)
             for p in ("int4", "fp32")}
    prompt_ids = [gens["fp32"].encode(p) for p in prompts]
    rates: dict[str, list[float]] = {}
    tokens: dict[str, list[list[int]]] = {}
    alphas: dict[str, list[float]] = {}
    for gen in gens.values():
        gen.generate(prompts[0], max_new_tokens=8, method="none")
    for r in range(args.rounds):
        for name, gen in gens.items():
            for method in ("none", "draft"):
                t0, n, outs, acc, drafted = time.perf_counter(), 0, [], 0, 0
                for p in prompts:
                    res = gen.generate(p, max_new_tokens=args.max_new_tokens, method=method)
                    n, acc, drafted = n + res.stats.new_tokens, acc + res.stats.accepted, drafted + res.stats.drafted
                    outs.append(res.token_ids)
                key = f"specrt {name} {method}"
                rates.setdefault(key, []).append(n / (time.perf_counter() - t0))
                tokens.setdefault(key, outs)
                if drafted:
                    alphas.setdefault(key, []).append(acc / drafted)
        for name, peer in peers.items():
            run = peer.generate(prompt_ids, args.max_new_tokens, SamplingConfig(), seed=r)
            rates.setdefault(name, []).append(run.tokens_per_second)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items()), file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rates.items()}
    base = med["ortgenai-int4"]
    result = {
        "config": {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
                   "greedy": True, "gamma": 4, "block_size": 32,
                   "graphs": {name: load_manifest(g.bundle).target.graph for name, g in gens.items()}},
        "tokens_per_second": med,
        "over_ortgenai_int4": {k: v / base for k, v in med.items()},
        "acceptance": {k: statistics.median(v) for k, v in alphas.items()},
        "greedy_draft_equals_none": {name: tokens[f"specrt {name} draft"] == tokens[f"specrt {name} none"]
                                     for name in gens},
        "verify_cost_over_one_token": {name: verify_cost(g) for name, g in gens.items()},
        "bytes": {name: {role: (e.quantization or {}).get("bytes_after") or
                         (g.bundle / e.file).stat().st_size for role, e in load_manifest(g.bundle).models.items()}
                  for name, g in gens.items()},
        "parity": {name: {role: (e.quantization or {}).get("parity") for role, e in load_manifest(g.bundle).models.items()}
                   for name, g in gens.items() if name.startswith("int")},
    }
    args.json.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["over_ortgenai_int4"], indent=1))
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
