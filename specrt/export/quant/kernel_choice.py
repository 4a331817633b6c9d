"""``--kernel auto``: which int8 format a target runs faster on this machine, by timing both.

The two int8 formats trade places from one CPU to another (SmolLM2-135M, 2 cores): on an AVX-512 Xeon the
integer kernel's 5-row verify pass cost 1.42x its one-row pass against MatMulNBits' 1.68x, and its
``eagle-tree`` ran 1.13x faster; on an AMD Zen 4 its one-row pass was 1.25x slower and a 4-row pass 1.5x
slower (docs/performance/int8-integer-kernel-cpu.md). A fixed default is wrong on one of them, so ``auto``
quantizes the target both ways and times the graphs themselves, here, at the row count the bundle's
decoding will mostly run: one row for a bundle with nothing to draft with, a verify pass of
:data:`VERIFY_ROWS` where a draft model, an EAGLE-3 head or Medusa heads propose. Engine time only.
"""

from __future__ import annotations

import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ...bundle.machine import cpu_name
from ...bundle.manifest import Manifest, ModelEntry
from ...errors import ConfigError

CANDIDATES = ("nbits", "integer")
VERIFY_ROWS = 4  # eagle-tree's passes on SmolLM2 verify 3-4 rows (2.5 nodes + the root), a chain at γ 3 four
CONTEXT = 64  # cached positions under the timed passes (a chat turn's)
BLOCKS = 4  # alternating blocks per candidate; the first pass of each block is not counted
PASSES = 5  # timed passes per block


@dataclass(frozen=True)
class KernelTiming:
    """Median engine milliseconds of a pass per candidate kernel at each timed row count."""

    rows: int  # the row count the choice weighs
    ms: dict[str, dict[int, float]]
    together: bool = True  # both sessions loaded at once (else one at a time: too large for two)

    @property
    def chosen(self) -> str:
        return min(self.ms, key=lambda kernel: (self.ms[kernel][self.rows], CANDIDATES.index(kernel)))

    def record(self) -> dict:
        return {"chosen": self.chosen, "rows": self.rows, "context": CONTEXT,
                "ms": {k: {str(r): round(v, 3) for r, v in t.items()} for k, t in self.ms.items()},
                "measure": "median engine ms of one target pass on this machine, both graphs alternating"
                + ("" if self.together else ", each loaded afresh per block")}


def decisive_rows(manifest: Manifest) -> int:
    """The row count a bundle's decoding mostly verifies: one without a proposer, else :data:`VERIFY_ROWS`."""
    proposes = manifest.draft is not None or manifest.eagle is not None or manifest.medusa is not None
    return VERIFY_ROWS if proposes else 1


def time_graphs(folders: dict[str, Path], entry: ModelEntry, rows: int) -> KernelTiming:
    """Time one pass of ``entry``'s graph in each of ``folders`` (kernel -> folder) at 1 and ``rows`` rows over
    :data:`CONTEXT` cached positions, the candidates taking turns in blocks so that a slow spell of the machine
    lands on both alike. Both sessions stay loaded when twice their bytes fit in the memory available; else each
    block loads its candidate afresh (a large model: slower to time, never two copies in memory)."""
    from ...bundle import contract as C
    from ...runtime.backends.onnxruntime import available_memory

    counts = sorted({1, rows})
    total = sum(C.graph_bytes(folder / entry.file) for folder in folders.values())
    free = available_memory()
    together = free is None or 2 * total < free
    loaded = {k: _loaded(folder, entry, counts) for k, folder in folders.items()} if together else {}
    times: dict[str, dict[int, list[float]]] = {k: {r: [] for r in counts} for k in folders}
    for _ in range(BLOCKS):
        for kernel, folder in folders.items():
            decoder, cache = loaded[kernel] if together else _loaded(folder, entry, counts)
            for r in counts:
                args = (np.ones(r, np.int64), np.arange(CONTEXT, CONTEXT + r), np.ones((1, 1, r, CONTEXT + r), bool))
                for i in range(PASSES + 1):
                    t0 = time.perf_counter()
                    decoder.forward(cache, *args)
                    if i:  # the block's first pass warms what the other graph's passes evicted
                        times[kernel][r].append(time.perf_counter() - t0)
            del decoder, cache
    return KernelTiming(rows, {k: {r: 1e3 * statistics.median(v) for r, v in t.items()} for k, t in times.items()},
                        together)


def _loaded(folder: Path, entry: ModelEntry, counts: list[int]):
    """A session of ``folder``'s graph and a cache holding :data:`CONTEXT` positions, room for the widest pass."""
    from ...runtime.backends.onnxruntime import OrtDecoder
    from ...runtime.masks import causal_mask

    decoder = OrtDecoder(folder, entry, threads=None)
    cache = decoder.new_cache(CONTEXT + max(counts))
    decoder.forward(cache, np.ones(CONTEXT, np.int64), np.arange(CONTEXT), causal_mask(CONTEXT, 0))
    cache.advance(CONTEXT)
    return decoder, cache


def quantize_by_timing(entry: ModelEntry, tmp: Path, rows: int,
                       quantize: Callable[[Path, str], dict],
                       progress: Callable[[str], None] | None = None) -> dict:
    """Quantize ``entry``'s graph with each candidate kernel (``quantize(out, kernel)`` writes one and returns
    its record), time them (:func:`time_graphs`) and keep the faster as ``tmp / entry.file``: its record, with the
    timings under ``kernel_choice``. A candidate the graph cannot take (the integer rewrite refuses float16
    graphs and opsets before 18) is left out, with the reason; then the other is kept untimed."""
    folders = {k: tmp / f".kernel-{k}" for k in CANDIDATES}
    try:
        records, refused = {}, {}
        for kernel, folder in folders.items():
            folder.mkdir()
            if progress:
                progress(f"target: int8 on {'MatMulNBits' if kernel == 'nbits' else 'the integer kernel'} "
                         "(--kernel auto: timing both)")
            try:
                records[kernel] = quantize(folder / entry.file, kernel)
            except ConfigError as e:
                if kernel == "nbits":  # the default format's own refusal is the user's to see
                    raise
                refused[kernel] = str(e)
        if refused:
            chosen, choice = "nbits", {"chosen": "nbits", "refused": refused}
        else:
            if progress:
                progress(f"target: timing both int8 graphs at 1 and {rows} rows")
            timing = time_graphs(folders, entry, rows)  # nothing refused: both were written
            chosen, choice = timing.chosen, {**timing.record(), "cpu": cpu_name()}
        for item in folders[chosen].iterdir():  # the graph and, past 2 GB, its external data
            shutil.move(str(item), str(tmp / item.name))
        return {**records[chosen], "kernel": chosen, "kernel_choice": choice}
    finally:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)


def describe_choice(choice: dict) -> str:
    """One line: what ``auto`` chose and the times it chose by (or why there was nothing to time)."""
    if "ms" not in choice:
        why = "; ".join(f"{k}: {reason.split(' (')[0]}" for k, reason in choice.get("refused", {}).items())
        return f"--kernel auto kept {choice['chosen']}, the only format this graph takes ({why})"
    rows = choice["rows"]
    times = ", ".join(f"{k} {t['1']:.2f}" + (f"/{t[str(rows)]:.2f}" if rows != 1 else "")
                      for k, t in choice["ms"].items())
    return f"--kernel auto chose {choice['chosen']} (ms per pass at 1{f'/{rows}' if rows != 1 else ''} rows: {times})"
