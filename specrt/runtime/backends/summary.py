"""Logits left in device memory, read through the logits summary graph (:data:`specrt.bundle.contract.SUMMARY_FILE`).

A GPU backend (ONNX Runtime CUDA, TensorRT) keeps each pass's [Q, V] logits where the engine wrote them
and runs the summary graph over them only when a step asks: the top K logits of every row and the
row's log-sum-exp at the sampling temperature come up (~0.5 KB a row instead of 4·V bytes: 600 KB at
152k ids), and one whole row only when they cannot decide its distribution. :class:`SummaryLogits` is
that :class:`~specrt.runtime.backends.base.DeviceLogits`; the engine-specific parts are two callables.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ...bundle import contract as C
from .cuda import DeviceMemory

# (start, rows, 1/T) -> (values [rows, K] float32, ids [rows, K] int, lse [rows] float32): the summary
# graph's outputs over rows start .. start + rows - 1 of a pass's logits
Summarize = Callable[[int, int, float], tuple[np.ndarray, np.ndarray, np.ndarray]]


def row_readers(memory: DeviceMemory, ptr: int, width: int
                ) -> tuple[Callable[[int], np.ndarray], Callable[[int, int], np.ndarray]]:
    """(fetch_row, fetch_logit) copying up a row, or one logit, of float32 [rows, width] logits at
    device address ``ptr``."""

    def fetch(offset: int, n: int) -> np.ndarray:
        out = np.empty(n, np.float32)
        memory.to_host(out, ptr + 4 * offset)
        memory.synchronize()
        return out

    return (lambda i: fetch(i * width, width)), (lambda i, token: fetch(i * width + token, 1))


def summary_buffers(rows: int) -> dict[str, np.ndarray]:
    """Host arrays for the summary graph's outputs over up to ``rows`` rows, by output name."""
    k = C.SUMMARY_TOP_K
    return {C.SUMMARY_VALUES: np.empty((rows, k), np.float32), C.SUMMARY_IDS: np.empty((rows, k), np.int32),
            C.SUMMARY_LSE: np.empty(rows, np.float32)}


def lse_error_bound(vocab: int, lse: np.ndarray, top_scaled: np.ndarray) -> np.ndarray:
    """A bound on |lse - the exact log-sum-exp of logits / T| for the summary graph's float32 result,
    per row, whatever order an engine sums in (``top_scaled``: the row's largest logit / T).

    - the sum: a block of B ids, then ~V / B block sums, each summed in any order: relative error
      <= (B + V / B + 2) u with u = 2^-24 (every weight is >= 0);
    - each weight's exponent x = (z - z_max) / T carries two roundings, and a fast exp is off by
      <= (2 + 1.17 |x|) ulp; both weighted by the weights average <= ln V + 1 nats below the top;
    - 1/T, z_max / T, the log and the final sum: a few ulps of |lse| and |z_max / T|.
    Doubled for engines whose exp is less accurate than CUDA's documented one: ~1e-4 at 152k ids."""
    u = 2.0 ** -24
    nats = math.log(vocab) + 1.0
    block = C.SUMMARY_BLOCK
    summed = (block + vocab / block + 2) * u * 1.01
    weights = (2 * nats + 2 * (2 + 1.17 * nats)) * 2 * u
    scale = (np.abs(lse) + 2 * np.abs(top_scaled) + 1) * 2 * u
    return 2.0 * (summed + weights + scale)


class SummaryLogits:
    """:class:`~specrt.runtime.backends.base.DeviceLogits` over rows ``start`` .. ``start + rows - 1`` of
    a pass's ``width``-wide logits in device memory. ``summarize`` runs the summary graph over such
    rows and returns its outputs on the host; ``fetch_row(i)`` copies the pass's row i up. Both are
    valid until the decoder's next pass, as the logits are; each summary runs once per temperature."""

    max_k = C.SUMMARY_TOP_K

    def __init__(self, rows: int, width: int, summarize: Summarize, fetch_row: Callable[[int], np.ndarray],
                 start: int = 0, fetch_logit: Callable[[int, int], np.ndarray] | None = None) -> None:
        """``fetch_logit(i, token)``: row i's one logit as a float32 array of one (default: from the row)."""
        self.rows, self.width, self.start = rows, width, start
        self.copied_bytes = 0
        self._summarize, self._fetch_row = summarize, fetch_row
        self._fetch_logit = fetch_logit or (lambda i, token: fetch_row(i)[token:token + 1])
        self._summaries: dict[float, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def tail(self, n: int) -> SummaryLogits:
        """The last ``n`` rows (a prefill's last row, not the whole prompt's)."""
        return SummaryLogits(n, self.width, self._summarize, self._fetch_row, self.start + self.rows - n,
                             self._fetch_logit)

    def _summary(self, temperature: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        inv_t = float(np.float32(1.0 / temperature))
        found = self._summaries.get(inv_t)
        if found is None:
            values, ids, lse = self._summarize(self.start, self.rows, inv_t)
            self.copied_bytes += values.nbytes + ids.nbytes + lse.nbytes
            found = self._summaries[inv_t] = (values, ids.astype(np.int64), lse.astype(np.float64))
        return found

    def argmax(self) -> np.ndarray:
        """The top K decide a row's argmax when its largest value is above their smallest: every id with
        that value is then among them (ties to the lower id, as numpy's argmax). Else the row decides."""
        values, ids, _ = self._summary(1.0)
        best = values.max(axis=1)
        out = np.empty(len(values), np.int64)
        for i in range(len(values)):
            if best[i] > values[i].min():
                out[i] = ids[i][values[i] == best[i]].min()
            else:  # K-way tie at the top: ids outside the K may share it
                out[i] = int(np.argmax(self.row(i)))
        return out

    def top(self, k: int, temperature: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if k > self.max_k:
            raise ValueError(f"the summary graph keeps {self.max_k} logits per row, not {k}")
        values, ids, lse = self._summary(temperature)
        err = lse_error_bound(self.width, lse, values.max(axis=1).astype(np.float64) / temperature)
        return ids, values, lse, err

    def row(self, i: int) -> np.ndarray:
        row = self._fetch_row(self.start + i)
        self.copied_bytes += row.nbytes
        return row

    def logit(self, i: int, token: int) -> float:
        value = self._fetch_logit(self.start + i, token)
        self.copied_bytes += value.nbytes
        return float(value[0])
