"""What exactness tests compare against: the target's own distribution over short continuations."""

from __future__ import annotations

import numpy as np

from specrt.check.verify import exact_distribution
from specrt.runtime.masks import causal_mask

PROMPTS = ["def fib(n):", "import os\nimport sys\n", "class Point:\n    def __init__(self"]


def exact_sequence_distribution(gen, prompt_ids, length, cfg) -> dict[tuple[int, ...], float]:
    """P(next `length` tokens) under the target alone, by enumerating the warped support (no cache)."""
    return exact_distribution(gen, list(prompt_ids), length, cfg)


def tree_pass_logits(bundle) -> tuple[np.ndarray, np.ndarray]:
    """One verify pass over a branching mask after a 6-token past, then the kept path compacted and one token
    decoded from it: the target's logits of both passes, for comparing two graphs of the same model."""
    import specrt

    dec = specrt.load(bundle, threads=1).decoders["target"]
    cache = dec.new_cache(64)
    dec.forward(cache, np.arange(3, 9), np.arange(6), causal_mask(6, 0))
    cache.length = 6
    mask = causal_mask(3, 6)
    mask[0, 0, 2, 7] = False  # node 2 is a sibling of node 1, not its child
    tree = dec.forward(cache, np.array([5, 7, 11]), np.array([6, 7, 7]), mask).logits.copy()
    cache.compact(6, [0, 2])  # keep nodes 0 and 2: node 2's K/V move one row left
    after = dec.forward(cache, np.array([13]), np.array([8]), causal_mask(1, 8)).logits.copy()
    return tree, after
