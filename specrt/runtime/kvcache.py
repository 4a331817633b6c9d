"""A preallocated KV cache per model whose ``length`` is the only truth.

Layout per layer: [1, max_context, H_kv, D] (seq-major, see docs/design/contract.md), so the past
``[:, :length]`` and the slots for Q new tokens ``[:, length:length+Q]`` are contiguous byte ranges
(``ptr`` and ``ptr + length * row_bytes``) that a backend binds directly: the graph reads the past and
writes the new K/V in place, with no copy.
Rolling back a rejected chain is ``length = n``: O(1), nothing is erased.
"""

from __future__ import annotations

import numpy as np

from ..bundle.contract import ModelDims
from ..errors import ContextLengthError


class CacheLength:
    """The part every cache shares whatever holds its buffers (host arrays, device tensors)."""

    def __init__(self, max_context: int) -> None:
        self.max_context = max_context
        self.length = 0

    def ensure_room(self, q_len: int) -> None:
        """Raise (never truncate) when Q new entries would not fit after the current length."""
        if self.length + q_len > self.max_context:
            raise ContextLengthError(f"{self.length} cached + {q_len} new positions exceed the max context "
                                     f"of {self.max_context}")

    def advance(self, n: int) -> None:
        """Make ``n`` entries written into the slots valid."""
        self.ensure_room(n)
        self.length += n

    def truncate(self, length: int) -> None:
        """Roll back to ``length`` valid entries (O(1): later entries are simply overwritten next time)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length

    @staticmethod
    def check_keep(keep: np.ndarray, start: int, max_context: int) -> None:
        if keep.size and (np.any(np.diff(keep) <= 0) or keep[0] < 0 or start + keep[-1] >= max_context):
            raise ValueError(f"keep must be increasing offsets inside the cache, got {keep.tolist()}")


class KVCache(CacheLength):
    """``heads_major``: [1, H_kv, max_context, D] per layer instead, the one buffer a GroupQueryAttention
    graph reads and writes in place (contract.GQA_GRAPH); a position's rows are then H_kv strided slices."""

    def __init__(self, dims: ModelDims, max_context: int, dtype: str | np.dtype, heads_major: bool = False) -> None:
        super().__init__(max_context)
        self.heads_major = heads_major
        shape = ((1, dims.num_kv_heads, max_context, dims.head_dim) if heads_major
                 else (1, max_context, dims.num_kv_heads, dims.head_dim))
        self.keys = [np.zeros(shape, dtype=dtype) for _ in range(dims.num_layers)]
        self.values = [np.zeros(shape, dtype=dtype) for _ in range(dims.num_layers)]
        # Host addresses never move: backends bind past/slots as base + length * row_bytes, no views.
        self.row_bytes = dims.num_kv_heads * dims.head_dim * np.dtype(dtype).itemsize
        self.key_ptrs = [k.ctypes.data for k in self.keys]
        self.value_ptrs = [v.ctypes.data for v in self.values]

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def compact(self, start: int, keep: np.ndarray | list[int]) -> None:
        """Move the entries at ``start + keep[j]`` to ``start + j`` and set length = start + len(keep).

        Used after tree verification: the accepted path's nodes are scattered among the tree's
        slots and must become contiguous. ``keep`` is increasing, so rows only move left.
        """
        keep = np.asarray(keep, dtype=np.int64)
        self.check_keep(keep, start, self.max_context)
        # keep[j] >= j, and once a row moves every later one does: rows before the first gap stay put (most
        # tree steps keep a prefix of the slots, the top child or none, and then nothing is copied).
        moved = np.flatnonzero(keep != np.arange(keep.size))
        if moved.size:
            first = int(moved[0])
            src, dst = start + keep[first:], slice(start + first, start + keep.size)
            for buf in (*self.keys, *self.values):
                if self.heads_major:
                    buf[:, :, dst] = buf[:, :, src]
                else:
                    buf[:, dst] = buf[:, src]  # fancy indexing reads all sources before writing
        self.length = start + keep.size
