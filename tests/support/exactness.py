"""What exactness tests compare against: the target's own distribution over short continuations."""

from __future__ import annotations

import numpy as np

from specrt.runtime.masks import causal_mask
from specrt.runtime.sampling import probs_from_logits

PROMPTS = ["def fib(n):", "import os\nimport sys\n", "class Point:\n    def __init__(self"]


def exact_sequence_distribution(gen, prompt_ids, length, cfg) -> dict[tuple[int, ...], float]:
    """P(next `length` tokens) under the target alone, by enumerating the warped support (no cache)."""
    dec = gen.decoders["target"]
    dist = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for seq, pr in dist.items():
            toks = prompt_ids + list(seq)
            cache = dec.new_cache(64)
            logits = dec.forward(cache, np.array(toks), np.arange(len(toks)), causal_mask(len(toks), 0)).logits[-1:]
            p = probs_from_logits(logits, cfg)[0]
            for t in np.flatnonzero(p):
                nxt[seq + (int(t),)] = pr * p[t]
        dist = nxt
    return dist
