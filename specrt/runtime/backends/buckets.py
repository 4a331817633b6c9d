"""Shape buckets for CUDA-graph capture: pure bookkeeping, tested on the CPU.

A captured graph replays fixed shapes at fixed addresses, so each verification width Q (γ + 1 or a
tree's node count) is padded up to a bucket, and the attention runs over the whole static cache with
a mask that hides the invalid past and the padding.
"""

from __future__ import annotations

import numpy as np

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def choose_bucket(q_len: int, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> int | None:
    """The smallest bucket >= q_len, or None when q_len is beyond every bucket (run it uncaptured)."""
    return next((b for b in sorted(buckets) if b >= q_len), None)


def static_mask(mask: np.ndarray, past_len: int, max_context: int, bucket: int) -> np.ndarray:
    """Contract mask [1, 1, Q, P+Q] → [1, 1, bucket, max_context + bucket] over (static cache, new rows).

    Past columns beyond ``past_len`` stay hidden; each padding row sees only itself (so its softmax is
    defined) and no real row sees a padding row.
    """
    q_len = mask.shape[2]
    out = np.zeros((bucket, max_context + bucket), dtype=bool)
    out[:q_len, :past_len] = mask[0, 0, :, :past_len]
    out[:q_len, max_context:max_context + q_len] = mask[0, 0, :, past_len:]
    for r in range(q_len, bucket):
        out[r, max_context + r] = True
    return out[None, None]


def pad_to(values: np.ndarray, bucket: int, fill: int = 0) -> np.ndarray:
    """Pad a [Q] vector to [bucket]."""
    out = np.full(bucket, fill, dtype=values.dtype)
    out[: len(values)] = values
    return out
