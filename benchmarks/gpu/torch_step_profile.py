"""Where one target pass of specrt's torch backend spends its time on a GPU, at SmolLM2-135M's dimensions.

The H200 run (docs/performance/smollm2-eagle-h200.md) found a target pass of ~4.8 ms inside `specrt bench`
against 3.3 ms for its CUDA graph's replay alone. This times, per row count, the whole `TorchDecoder.forward`
(synchronised) against the replay alone, and lists the host-side operations of the forward by self CPU time
(torch.profiler), so the difference has names. Random fp16 weights (verify_cost_gpu.py's checkpoint): timing
depends on shapes alone. ``--device cpu`` is a dry run.

    python3 benchmarks/gpu/torch_step_profile.py --json OUT/torch-step-profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT.parents[1]), str(ROOT)]  # specrt from this tree; verify_cost_gpu.py beside this file


def profile(source: Path, device: str, context: int, repeats: int, rows=(1, 4, 12)) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    from verify_cost_gpu import decoder_for, median_ms

    from specrt.runtime.masks import causal_mask

    dec = decoder_for(source, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    cache = dec.new_cache(context + 64)  # room for the widest bucket a row count rounds up to (else it runs eagerly)
    ids = np.random.default_rng(0).integers(0, dec.entry.dims.vocab_size, context + max(rows))
    dec.forward(cache, ids[:context], np.arange(context), causal_mask(context, 0))
    cache.advance(context)
    out: dict = {"rows": {}}
    for r in rows:
        args = (ids[context:context + r], np.arange(context, context + r), causal_mask(r, context))
        forward_ms = median_ms(lambda: dec.forward(cache, *args), sync, repeats)
        graph = next((g for (c, _), g in dec.graphs.items() if c == id(cache) and g.ids.shape[1] >= r), None)
        replay_ms = median_ms(graph.graph.replay, sync, repeats) if graph is not None else None
        out["rows"][str(r)] = {"forward_ms": forward_ms, "replay_ms": replay_ms}
        print(f"{r} rows: forward {forward_ms:.3f} ms, replay alone "
              f"{'-' if replay_ms is None else f'{replay_ms:.3f}'} ms", flush=True)
    args = (ids[context:context + 1], np.arange(context, context + 1), causal_mask(1, context))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        for _ in range(repeats):
            dec.forward(cache, *args)
            sync()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
    print(table)
    out["profile_1_row"] = table
    return out


def main(argv: list[str] | None = None) -> int:
    from verify_cost_gpu import checkpoint

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--layers", type=int, help="fewer layers than SmolLM2's 30 (a quick dry run)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        report = profile(checkpoint("smollm2-135m", Path(tmp), args.layers), args.device, args.context,
                         args.repeats)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
