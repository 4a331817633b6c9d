"""What verifying r tokens in one target pass costs against one token on a GPU, at real dimensions.

verify_cost.py's question for specrt's GPU path (the torch backend, fp16, each row count's step captured
in a CUDA graph): random weights from the real configs (SmolLM2-135M, Llama-3.2-1B; no download: timing
depends on the shapes alone), a fixed context, median milliseconds of one target pass per row count
(synchronised), the fit t(r) = a + b·r and r* = a/b as verify_cost.py reports them, and the bandwidth
one row achieves. ``--device cpu`` is a dry run (no graphs) for a machine without a GPU.

    python3 benchmarks/gpu/verify_cost_gpu.py --json OUT/verify-cost-gpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT.parents[1]), str(ROOT.parent / "verify-cost")]  # specrt from this tree; verify_cost.fit

ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64)
# The published configs' shapes (tied embeddings both); rope and eps do not move the timing
MODELS = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256),
}


def checkpoint(name: str, folder: Path, layers: int | None = None) -> Path:
    """A random fp16 Llama checkpoint with ``name``'s dimensions, saved to ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = {**MODELS[name], **({"num_hidden_layers": layers} if layers else {})}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=True, max_position_embeddings=4096))
    model.to(torch.float16).save_pretrained(folder)
    return folder


def median_ms(fn, sync, repeats: int) -> float:
    """Median milliseconds of ``fn()`` followed by ``sync()``, after 3 warm-up calls (the first of a row
    count captures its graph)."""
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def decoder_for(source: Path, device: str):
    """specrt's torch decoder over the fp16 checkpoint ``source`` (no bundle: its manifest entry made here),
    CUDA graphs and logits left on the device where ``device`` is cuda."""
    from transformers import AutoConfig

    from specrt.bundle.contract import ModelDims
    from specrt.bundle.manifest import ModelEntry
    from specrt.export.torch_backend import TorchDecoder

    c = AutoConfig.from_pretrained(source)
    dims = ModelDims(c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                     c.hidden_size // c.num_attention_heads, c.hidden_size, c.vocab_size)
    entry = ModelEntry(file="", source=str(source), architecture="llama", dtype="float16", dims=dims)
    return TorchDecoder(source, entry, device=device, use_graphs=device == "cuda", device_logits=True)


def time_rows(source: Path, device: str, context: int, repeats: int, rows=ROWS) -> dict:
    """Median ms of one target pass per row count after ``context`` positions, logits left on the device."""
    import torch

    from specrt.runtime.masks import causal_mask

    dec = decoder_for(source, device)
    dims = dec.entry.dims
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    cache = dec.new_cache(context + max(rows))
    ids = np.random.default_rng(0).integers(0, dims.vocab_size, context + max(rows))
    dec.forward(cache, ids[:context], np.arange(context), causal_mask(context, 0))
    cache.advance(context)
    out = {}
    for r in rows:
        args = (ids[context:context + r], np.arange(context, context + r), causal_mask(r, context))
        out[str(r)] = median_ms(lambda: dec.forward(cache, *args), sync, repeats)
    n_params = sum(p.numel() for p in dec.wrapper.parameters())
    return {"ms": out, "weight_bytes": 2 * n_params, "flops_per_row": 2 * n_params, "context": context,
            "graphs": dec.use_graphs}


def main(argv: list[str] | None = None) -> int:
    from verify_cost import fit

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help=f"[{','.join(MODELS)}]")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--context", type=int, default=128, help="positions already in the cache [128]")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--layers", type=int, help="fewer layers than the config (a quick dry run)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import torch

    report = {"date": date.today().isoformat(), "machine": platform.processor() or platform.machine(),
              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "torch": torch.__version__,
              "backend": "specrt torch backend, fp16, CUDA graph per row bucket" if args.device == "cuda"
              else "specrt torch backend on the CPU (dry run)", "models": {}}
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            row = time_rows(checkpoint(name, Path(tmp), args.layers), args.device, args.context, args.repeats)
        row["fit"] = fit(row)
        report["models"][name] = row
        ratio = row["fit"]["ratio"]
        print(f"{name}: 1 row {row['ms']['1']:.3f} ms, 5 rows {ratio['5']:.2f}x, 16 rows {ratio['16']:.2f}x, "
              f"64 rows {ratio['64']:.2f}x; r* {row['fit']['crossover_rows'] or float('inf'):.1f}; "
              f"{row['fit']['gb_per_s_at_1']:.0f} GB/s at 1 row", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
