"""What verifying r tokens in one target pass costs against one token, per bundle, on this machine.

A pass at batch 1 reads every weight once (time W / bandwidth) and computes 2·r FLOPs per weight (time
r·F / throughput). While r stays under the crossover r* = (W / bandwidth) / (F / throughput) the pass is
memory-bound and extra rows are nearly free; past it every row costs its arithmetic. This times the target
alone (the engine's forward call, nothing of the runtime around it: verify_rows.py's timing) at r = 1 .. 16
new rows over a fixed context, fits t(r) = a + b·r by least squares, and reports a, b, t(r)/t(1) and r* = a/b, with the
bandwidth the bundle achieves at r = 1 (weight bytes / t(1)) and the arithmetic rate the extra rows run at
(F / b). ``--gpu NAME:GBPS:TFLOPS`` adds the same model's r* on a device from its datasheet figures.

    python benchmarks/verify-cost/verify_cost.py BUNDLE [BUNDLE ...] --threads 2 \
        --json benchmarks/verify-cost/verify-cost-cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # verify_rows.py, shared by the runners

ROWS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16)


def time_rows(bundle: Path, threads: int | None, context: int, repeats: int) -> dict:
    """Median engine time of one target pass per row count (verify_rows.py's), and how the widest pass's
    logits compare with the same rows fed one at a time."""
    from verify_rows import decoder_ms

    from specrt.bundle.files import entry_cost
    from specrt.bundle.manifest import load_manifest
    from specrt.runtime.backends.onnxruntime import OrtDecoder
    from specrt.runtime.masks import causal_mask

    entry = load_manifest(bundle).target
    target = OrtDecoder(bundle, entry, threads=threads)
    out = decoder_ms(target, ROWS, context, repeats)
    # Whether a kernel's numerics depend on how many rows it multiplies (greedy output can then differ
    # between plain decoding and speculation): the widest pass against its rows fed one at a time.
    r = max(ROWS)
    ids = np.random.default_rng(0).integers(0, entry.dims.vocab_size, context + r)
    cache = target.new_cache(context + r)
    target.forward(cache, ids[:context], np.arange(context), causal_mask(context, 0))
    cache.advance(context)
    wide = target.forward(cache, ids[context:], np.arange(context, context + r), causal_mask(r, context)).logits.copy()
    single = []
    for j in range(context, context + r):
        single.append(target.forward(cache, ids[j:j + 1], np.arange(j, j + 1), causal_mask(1, j)).logits[0].copy())
        cache.advance(1)
    single = np.stack(single)
    cost = entry_cost(bundle, entry)
    q = entry.quantization or {}
    return {"bundle": str(bundle), "precision": f"int{q['bits']}" if q else entry.dtype,
            "format": q.get("format"), "block_size": q.get("block_size"), "accuracy_level": q.get("accuracy_level"),
            "weight_bytes": cost.weight_bytes, "flops_per_row": cost.matmul_flops_per_token, "context": context,
            "ms": {str(r): ms for r, ms in out.items()},
            "rows_vs_single": {"rows": r, "max_abs_logit_diff": float(np.abs(wide - single).max()),
                               "argmax_equal": float((wide.argmax(-1) == single.argmax(-1)).mean())}}


def fit(row: dict) -> dict:
    """t(r) = a + b·r by least squares over the measured rows; what it implies."""
    r = np.array([int(k) for k in row["ms"]], float)
    t = np.array(list(row["ms"].values()))
    b, a = np.polyfit(r, t, 1)
    t1 = row["ms"]["1"]
    return {"fixed_ms": float(a), "per_row_ms": float(b), "crossover_rows": float(a / b) if b > 0 else None,
            "ratio": {k: v / t1 for k, v in row["ms"].items()},
            "gb_per_s_at_1": row["weight_bytes"] / (t1 * 1e-3) / 1e9,
            "gflop_per_s_per_row": row["flops_per_row"] / (b * 1e-3) / 1e9 if b > 0 else None}


def device_crossover(row: dict, spec: str) -> dict:
    """r* on a datasheet device: NAME:GBPS:TFLOPS (the TFLOPS of the precision the bundle's matmuls use)."""
    name, gbps, tflops = spec.split(":")
    memory_s = row["weight_bytes"] / (float(gbps) * 1e9)
    row_s = row["flops_per_row"] / (float(tflops) * 1e12)
    return {"device": name, "gb_per_s": float(gbps), "tflops": float(tflops), "crossover_rows": memory_s / row_s,
            "ratio_5_rows": max(memory_s, 5 * row_s) / max(memory_s, row_s)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", nargs="+", type=Path)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--context", type=int, default=128, help="positions already in the cache [128]")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--gpu", action="append", default=[], metavar="NAME:GBPS:TFLOPS",
                    help="a device's datasheet bandwidth and matmul throughput, for its crossover (repeatable)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = []
    for bundle in args.bundles:
        row = time_rows(bundle, args.threads, args.context, args.repeats)
        row["fit"] = fit(row)
        row["devices"] = [device_crossover(row, g) for g in args.gpu]
        rows.append(row)
        f = row["fit"]
        print(f"{bundle}: {row['precision']}, {row['weight_bytes'] / 1e6:.0f} MB; t(1) {row['ms']['1']:.2f} ms; "
              + " ".join(f"{k}:{v:.2f}" for k, v in f["ratio"].items())
              + f"; a {f['fixed_ms']:.2f} ms + b {f['per_row_ms']:.2f} ms/row, r* {f['crossover_rows'] or 0:.1f}; "
              f"{f['gb_per_s_at_1']:.1f} GB/s at 1 row, {f['gflop_per_s_per_row'] or 0:.0f} GFLOP/s per extra row; "
              f"{row['rows_vs_single']['rows']} rows vs one at a time: max |Δlogit| "
              f"{row['rows_vs_single']['max_abs_logit_diff']:.2e}")
    if args.json:
        args.json.write_text(json.dumps({"date": date.today().isoformat(), "machine": platform.processor()
                                         or platform.machine(), "threads": args.threads, "rows": list(ROWS),
                                         "bundles": rows}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
