"""Attention masks and position offsets in the contract's layout: bool [1, 1, Q, P+Q], True = attend."""

from __future__ import annotations

import numpy as np

_ALL = np.ones(0, dtype=bool)  # grows; read-only views of it are the one-token masks
_TRIL: dict[int, np.ndarray] = {}  # Q -> the [Q, Q] lower triangle a causal pass's new columns hold

# What a tree method needs where a bundle's graphs are causal only (contract.CAUSAL_ONLY_GRAPHS: gqa-static).
TREES_NEED = "tree methods need a bundle exported with --graph gqa (ONNX Runtime) or --graph portable (TensorRT)"


def causal_mask(q_len: int, past_len: int) -> np.ndarray:
    """Every new token sees the whole past and the new tokens up to itself (a chain). Read-only."""
    global _ALL
    if q_len == 1:  # plain decoding's every step: a view, no allocation
        if len(_ALL) <= past_len:
            _ALL = np.ones(max(2 * len(_ALL), past_len + 1, 4096), dtype=bool)
            _ALL.flags.writeable = False
        return _ALL[:past_len + 1].reshape(1, 1, 1, past_len + 1)
    # key j is visible to new token i when j <= past_len + i: one comparison, no tril of a ones array
    return (np.arange(past_len + q_len) <= np.arange(past_len, past_len + q_len)[:, None])[None, None]


def tree_mask(parents: tuple[int, ...] | list[int], past_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(mask [1, 1, N, P+N], depth [N]) for a token tree given each node's parent (-1 = root).

    A node sees the past, its ancestors and itself; its position is past_len + depth.
    Parents must precede their children (topological order).
    """
    n = len(parents)
    mask = np.zeros((n, past_len + n), dtype=bool)
    mask[:, :past_len] = True
    depth = np.zeros(n, dtype=np.int64)
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i}: parent {parent} must be -1 or an earlier node")
        mask[i, past_len + i] = True
        if parent >= 0:
            mask[i, past_len:] |= mask[parent, past_len:]
            depth[i] = depth[parent] + 1
    return mask[None, None], depth


def speculation_mask(past_len: int, prefix_len: int, parents: tuple[int, ...] | list[int] = ()
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(mask [1, 1, m+N, P+m+N], positions [m+N]) for m new context tokens (a causal chain) followed by a
    token tree of N nodes hanging below the last of them (parent -1 = child of that token).

    ``parents=()`` is the plain causal case.
    """
    m, n = prefix_len, len(parents)
    positions = np.arange(past_len, past_len + m + n, dtype=np.int64)
    if not n:
        return causal_mask(m, past_len), positions
    mask = np.zeros((m + n, past_len + m + n), dtype=bool)
    mask[:m, : past_len + m] = causal_mask(m, past_len)[0, 0]
    if n:
        tree, depth = tree_mask(parents, past_len + m)
        mask[m:] = tree[0, 0]
        positions[m:] = past_len + m + depth
    return mask[None, None], positions


def is_causal(mask: np.ndarray, past_len: int) -> bool:
    """Whether ``mask`` [1, 1, Q, past_len + Q] is exactly the causal one: row i sees columns < past_len + i + 1
    (what a causal-only graph computes without a mask); a tree's or an EAGLE expansion's is not."""
    m = mask[0, 0]
    q = m.shape[0]
    if m.shape[1] != past_len + q or not m[:, :past_len].all():
        return False
    tril = _TRIL.get(q)
    if tril is None:
        tril = _TRIL[q] = np.tri(q, dtype=bool)
    return np.array_equal(m[:, past_len:], tril)
