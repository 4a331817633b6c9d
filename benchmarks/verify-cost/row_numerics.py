"""Which pass shapes change a target's numbers: the last prompt row's logits computed by an r-row pass (the
prompt's first positions cached by a prefill) against the same row in a prefill of the whole prompt.

    python benchmarks/verify-cost/row_numerics.py BUNDLE [BUNDLE ...] [--rows 1,2,3,5,9,16] [--prompts FILE] [--threads 2]
                                                  [--json OUT]

Per bundle and prompt (the held-out chat prompts in the bundle's template, else the shipped code prompts):
the whole prompt prefilled in one pass, its cache cut back by r rows, and those r rows fed again as one
pass; the largest |logit difference| of the last row against the prefill's, and whether the top token is
the same. If only r = 1 differs, any two multi-row passes compute a row alike, and only one-row passes
(plain decoding's) take other kernels.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import specrt
from specrt.data import prompts as builtin_prompts
from specrt.runtime.masks import causal_mask

ROOT = Path(__file__).resolve().parents[1]  # benchmarks/


def row_figures(gen, prompts: list[str], rows: list[int]) -> dict:
    chat = gen.manifest.tokenizer.chat_template is not None
    dec = gen.decoders["target"]
    diffs: dict[int, list[float]] = {r: [] for r in rows}
    top_same: dict[int, int] = {r: 0 for r in rows}
    for prompt in prompts:
        ids = np.asarray(gen.encode_chat([{"role": "user", "content": prompt}]) if chat else gen.encode(prompt))
        n = len(ids)
        cache = dec.new_cache(n + 1)
        whole = dec.forward(cache, ids, np.arange(n), causal_mask(n, 0)).logits[-1].copy()
        cache.advance(n)
        for r in (r for r in rows if r < n):
            cache.truncate(n - r)
            got = dec.forward(cache, ids[n - r:], np.arange(n - r, n), causal_mask(r, n - r)).logits[-1]
            cache.advance(r)
            diffs[r].append(float(np.abs(got - whole).max()))
            top_same[r] += int(got.argmax() == whole.argmax())
    return {"prompts": len(prompts), "dtype": gen.manifest.target.dtype,
            "quantization": (gen.manifest.target.quantization or {}).get("bits"),
            "graph": gen.manifest.target.graph,
            "max_abs_logit_diff": {str(r): max(d) for r, d in diffs.items() if d},
            "top1_same": {str(r): top_same[r] / len(diffs[r]) for r in rows if diffs[r]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--rows", default="1,2,3,5,9,16")
    ap.add_argument("--prompts", help="a JSON list of prompts [default: by the bundle, see above]")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    out = {}
    for bundle in args.bundles:
        gen = specrt.load(bundle, threads=args.threads)
        chat = gen.manifest.tokenizer.chat_template is not None
        if args.prompts or chat:
            prompts = json.loads(Path(args.prompts or ROOT / "prompts" / "chat-heldout.json").read_text())
        else:
            prompts = builtin_prompts("code")
        out[Path(bundle).name] = row_figures(gen, prompts, rows)
        figures = out[Path(bundle).name]["max_abs_logit_diff"]
        print(Path(bundle).name, "  ".join(f"{r} rows: {d:.2e}" for r, d in figures.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "bundles": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
