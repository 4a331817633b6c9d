"""An EAGLE-3 head with one more decoder layer that changes nothing: the new layer's ``o_proj`` and ``down_proj`` are
zero, so its residual stream passes through and the head drafts exactly as before, while it costs what a stacked
head costs. The start of "a second layer at equal data" (docs/performance/smollm2-eagle3-cpu.md) and a way to
price a layer on real dimensions without training one.

    python benchmarks/eagle/stack_head.py benchmarks/heads/smollm2-135m-instruct head2   # then eagle train --init head2

Written with ``save_eagle3``: in the speculators format (stacked layers have no field in EAGLE's flat layout).
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from specrt.export.eagle.head import Eagle3Head
from specrt.export.eagle.checkpoint import load_eagle3, save_eagle3


def stacked(head: Eagle3Head, seed: int = 0) -> Eagle3Head:
    """``head`` with a layer more: its q/k/v and gate/up random (std 0.02), its norms ones, its outputs zero."""
    cfg = dataclasses.replace(head.cfg, num_layers=head.cfg.num_layers + 1)
    torch.manual_seed(seed)
    out = Eagle3Head(cfg)
    new = out.layers[str(cfg.num_layers - 1)]
    with torch.no_grad():
        for name, p in new.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
            elif "norm" not in name:
                p.normal_(0.0, 0.02)
    out.load_state_dict({**out.state_dict(), **head.state_dict()})
    return out.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("head", help="a head folder (either published layout)")
    ap.add_argument("out", help="the folder to write")
    ap.add_argument("--dtype", default="float16", choices=["float32", "float16", "bfloat16"])
    args = ap.parse_args()
    _, head, d2t, t2d = load_eagle3(args.head)
    grown = stacked(head)
    save_eagle3(args.out, grown.cfg, grown, d2t, t2d, dtype=args.dtype)
    print(f"wrote {args.out}: {grown.cfg.num_layers} layers, the last one passing its input through")


if __name__ == "__main__":
    main()
