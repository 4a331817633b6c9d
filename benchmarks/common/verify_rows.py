"""What a q-row target pass costs against a 1-row one, inside specrt's ONNX Runtime decoder only (IOBinding,
the KV cache written in place), without the sampler, acceptance or drafting around it: the engine's part of
a bench's "verify cost".

    python benchmarks/common/verify_rows.py BUNDLE [BUNDLE ...] [--past 150] [--rows 1,2,4,5,8,9] [--threads 2]
                                            [--profile]

Each bundle's target is fed ``--past`` positions, then each row count 3 warm-up and 25 timed passes at
that past (the passes are not kept); the median per row count, and its ratio to one row. ``--profile``
also runs ONNX Runtime's profiler on a plain session at the first and last row counts and prints the
kernel time per op type (the profiler's overhead inflates each figure; compare the two columns).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile
import time
from typing import Sequence

import numpy as np

from specrt.bundle import contract as C
from specrt.bundle.manifest import load_manifest
from specrt.runtime.backends.onnxruntime import OrtDecoder
from specrt.runtime.masks import causal_mask


def pass_ms(bundle: str, rows: list[int], past: int, threads: int, reps: int = 25) -> dict[int, float]:
    return decoder_ms(OrtDecoder(bundle, load_manifest(bundle).target, threads=threads), rows, past, reps)


def decoder_ms(dec: OrtDecoder, rows: Sequence[int], past: int, reps: int = 25) -> dict[int, float]:
    """Median milliseconds of one q-row pass per q in ``rows``, after ``past`` positions (3 warm-ups each)."""
    cache = dec.new_cache(past + max(rows))
    dec.forward(cache, np.ones(past, np.int64), np.arange(past), causal_mask(past, 0))
    cache.advance(past)
    out = {}
    for q in rows:
        args = (np.ones(q, np.int64), np.arange(past, past + q), np.ones((1, 1, q, past + q), bool))
        for _ in range(3):
            dec.forward(cache, *args)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            dec.forward(cache, *args)
            times.append(time.perf_counter() - t0)
        out[q] = 1e3 * statistics.median(times)
    return out


def op_ms(bundle: str, q: int, past: int, threads: int, reps: int = 25) -> dict[str, float]:
    """Kernel milliseconds per op type of one q-row pass: ORT's profiler on specrt's own decoder (its graph's
    inputs and bindings whatever the layout), the last ``reps`` passes only."""
    import onnxruntime as ort

    real = ort.SessionOptions

    def profiled():
        opts = real()
        opts.enable_profiling, opts.profile_file_prefix = True, os.path.join(tempfile.mkdtemp(), "verify_rows")
        return opts

    ort.SessionOptions = profiled
    try:
        dec = OrtDecoder(bundle, load_manifest(bundle).target, threads=threads)
    finally:
        ort.SessionOptions = real
    decoder_ms(dec, [q], past, reps)
    path = dec.session.end_profiling()
    with open(path) as f:
        events = sorted(json.load(f), key=lambda e: e.get("ts", 0))
    os.remove(path)
    runs = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run"][-reps:]
    by_op: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if (e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
                and any(a <= e["ts"] <= b for a, b in runs)):
            by_op[e["args"]["op_name"]] += e["dur"] / 1e3 / reps
    return dict(by_op)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundles", nargs="+")
    p.add_argument("--past", type=int, default=150)
    p.add_argument("--rows", default="1,2,4,5,8,9")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", action="store_true", help="kernel time per op type at the first and last row counts")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    for bundle in args.bundles:
        ms = pass_ms(bundle, rows, args.past, args.threads)
        print(bundle, " ".join(f"q{q} {v:.2f} ms ({v / ms[rows[0]]:.2f}x)" for q, v in ms.items()))
        if args.profile:
            lo, hi = (op_ms(bundle, q, args.past, args.threads) for q in (rows[0], rows[-1]))
            for op in sorted(hi, key=hi.get, reverse=True)[:8]:
                print(f"  {op:26s} q{rows[0]} {lo.get(op, 0):6.2f} ms  q{rows[-1]} {hi[op]:6.2f} ms")


if __name__ == "__main__":
    main()
