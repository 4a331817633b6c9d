"""A DFlash draft's graph on ONNX Runtime (contract kind "dflash"): one pass per drafting step, its cache the
context's K/V alone.

Unlike a decoder's, a pass appends the C new context rows to the cache, not its Q query rows (the block is
recomputed every step, never cached), so the draft has a runner of its own rather than a :class:`Decoder`.
The cache is a prefix of one host buffer per layer ([1, max_context, H_kv, D]): past K/V are fed as views."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...bundle import contract as C
from ...bundle.manifest import ModelEntry
from ...errors import BundleError
from ..kvcache import KVCache
from .onnxruntime import _session, io_problem, run_graph


class OrtDFlash:
    """Runs ``entry``'s graph from ``bundle_dir`` with a context cache of ``max_context`` positions."""

    def __init__(self, bundle_dir: Path, entry: ModelEntry, max_context: int, threads: int | None = None) -> None:
        path = Path(bundle_dir) / entry.file
        self.session = _session(path, threads, helper=True)
        problem = io_problem(self.session, entry)
        if problem:
            raise BundleError(f"{entry.file} does not match its manifest entry: {problem}")
        self.entry = entry
        self.dtype = np.dtype(entry.dtype)
        self.cache = KVCache(entry.dims, max_context, self.dtype)
        layers = range(entry.dims.num_layers)
        self._past = [n for i in layers for n in (C.past_key(i), C.past_value(i))]
        self._outputs = [C.LOGITS] + [n for i in layers for n in (C.new_key(i), C.new_value(i))]
        self.passes = 0
        self.forward_s = 0.0

    @property
    def length(self) -> int:
        """Context positions whose K/V the cache holds (0 .. length - 1)."""
        return self.cache.length

    def truncate(self, length: int) -> None:
        self.cache.truncate(min(length, self.cache.length))

    def reset(self, keep: int = 0) -> None:
        """A new generation: the context cut to its first ``keep`` positions, the engine time counted afresh."""
        self.truncate(keep)
        self.passes, self.forward_s = 0, 0.0

    def run(self, block: list[int], start: int, context: np.ndarray) -> np.ndarray:
        """Draft the block ``block`` (slot 0 the last token) at positions start .. start + len(block) - 1, after
        appending ``context`` ([C, tap_width], the target's taps at positions length .. start - 1) to the cache;
        the logits of slots 1 .. len(block) - 1 ([len(block) - 1, D_v], float32)."""
        n, c = self.cache.length, len(context)
        if n + c != start:
            raise RuntimeError(f"the draft's context holds {n} positions and {c} more were given, but the block "
                               f"starts at {start}")
        self.cache.ensure_room(c)
        feeds = {C.INPUT_IDS: np.asarray(block, np.int64)[None],
                 C.POSITION_IDS: np.arange(start, start + len(block), dtype=np.int64)[None],
                 C.DFLASH_CONTEXT: np.ascontiguousarray(context, self.dtype)[None],
                 C.CONTEXT_POSITIONS: np.arange(n, start, dtype=np.int64)[None]}
        for i in range(self.cache.num_layers):  # B = 1: a prefix of the buffer is a contiguous view
            feeds[self._past[2 * i]] = self.cache.keys[i][:, :n]
            feeds[self._past[2 * i + 1]] = self.cache.values[i][:, :n]
        t0 = time.perf_counter()
        logits, *new = run_graph(self.session.run, self.entry.file, self._outputs, feeds)
        self.forward_s += time.perf_counter() - t0
        self.passes += 1
        for i in range(self.cache.num_layers):
            self.cache.keys[i][:, n:start] = new[2 * i]
            self.cache.values[i][:, n:start] = new[2 * i + 1]
        self.cache.advance(c)
        return logits[0]
