"""Two bundles' DFlash draft passes timed in one process, on the same inputs: blocks of passes of each in turn,
so a drifting machine affects both alike (one session runs at a time: two spinning thread pools would fight for
the cores). It compares graphs of the same draft (fused or not, float or quantized); `specrt bench` measures what
a whole generation gains.

    python benchmarks/dflash/draft_pass.py BUNDLE_A BUNDLE_B --context 150 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specrt.bundle.machine import cpu_name
from specrt.bundle.manifest import load_manifest


def feeds(bundle: Path, context: int) -> tuple[ort.InferenceSession, dict]:
    """The draft's session (2 threads) and one step's inputs: a block after ``context`` cached positions, 2 new."""
    entry = load_manifest(bundle).dflash
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(bundle / entry.file), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    shape = (1, context, entry.dims.num_kv_heads, entry.dims.head_dim)
    inputs = {"input_ids": np.array([[5] + [entry.mask_token_id] * (entry.block_size - 1)]),
              "position_ids": np.arange(context + 2, context + 2 + entry.block_size)[None],
              "dflash_context": rng.standard_normal((1, 2, entry.tap_width)).astype(np.float32),
              "context_positions": np.array([[context, context + 1]])}
    for i in range(entry.dims.num_layers):
        inputs[f"past_key.{i}"] = rng.standard_normal(shape).astype(np.float32)
        inputs[f"past_value.{i}"] = rng.standard_normal(shape).astype(np.float32)
    return session, inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", nargs=2, type=Path)
    parser.add_argument("--context", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--passes", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = [feeds(b, args.context) for b in args.bundles]
    for session, inputs in runs:
        for _ in range(30):
            session.run(None, inputs)
    times: list[list[float]] = [[], []]
    for _ in range(args.rounds):
        for j, (session, inputs) in enumerate(runs):
            for _ in range(args.passes):
                t = time.perf_counter()
                session.run(None, inputs)
                times[j].append(time.perf_counter() - t)
    ms = [1000 * float(np.median(t)) for t in times]
    record = {"config": {"bundles": [str(b) for b in args.bundles], "context": args.context, "rounds": args.rounds,
                         "passes": args.passes, "threads": 2, "machine": cpu_name()},
              "median_ms": dict(zip(["a", "b"], ms)), "b_over_a": ms[1] / ms[0]}
    print(f"{args.bundles[0]}: {ms[0]:.3f} ms, {args.bundles[1]}: {ms[1]:.3f} ms, ratio {ms[1] / ms[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
