"""The rows of one forward pass, warped on demand (:class:`LogitRows`), and the acceptance test that reads
them: verification never touches rows past the first rejection, and a row left on a GPU is read through
its summary (top logits, normaliser) unless only the whole row decides.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from ..bundle import contract as C
from .dist import Dist, overlap, top_ids
from .sampling import SamplingConfig
from .warp import sorted_top, warp, warp_top


def _prob_bounds(p: Sequence[Dist], i: int, token: int) -> tuple[float, float] | None:
    return p.prob_bounds(i, token) if isinstance(p, LogitRows) else None


def exceeds(p: Sequence[Dist], i: int, token: int, bar: float) -> bool:
    """p[i](token) > bar, read from bounds on p(token) alone when a row left on a device gives them
    and they decide (the acceptance test of one drafted token: bar = u * q(token))."""
    bounds = _prob_bounds(p, i, token)
    if bounds is not None:
        if bar < bounds[0]:
            return True
        if bar >= bounds[1]:
            return False
    return bar < p[i].prob(token)


def acceptance_beta(p: Sequence[Dist], i: int, q: Dist, token: int) -> float:
    """beta of row i: sum_x min(p(x), q(x)) when p's row is on the host (or cheap to warp); for a row
    left on a device that verification read only at the drafted token, its one-sample estimate
    min(1, p(token) / q(token)), unbiased because the token was drawn from q (exact for a point q)."""
    bounds = _prob_bounds(p, i, token)
    if bounds is None:
        return overlap(p[i], q)
    return min(1.0, 0.5 * (bounds[0] + bounds[1]) / q.prob(token))


DEVICE_TOP_K = C.SUMMARY_TOP_K  # logits per row a device sends up first; most truncated rows are decided by them


class LogitRows:
    """The last rows of one forward pass, warped on demand: row i's :class:`Dist` is built the first
    time it is asked for, so rows that verification never reaches cost nothing.

    The logits are the backend's output buffer, valid until the same decoder runs again; ``valid``
    says whether that is still so, and reading a stale row raises instead of returning garbage.
    With ``device`` (logits left in GPU memory) the rows come from its argmax / top-k summary and a
    whole row is copied up only when the summary cannot decide its distribution."""

    def __init__(self, logits: np.ndarray | None, sampling: SamplingConfig, vocab: int,
                 valid: Callable[[], bool] = lambda: True, device=None, first: int = 0, count: int = 0) -> None:
        self.logits, self.sampling, self.vocab, self._valid = logits, sampling, vocab, valid
        self.device, self.first = device, first
        self._count = len(logits) if logits is not None else count
        self._dists: dict[int, Dist] = {}
        self._argmax: np.ndarray | None = None
        self._bounds: dict[tuple[int, int], tuple[float, float]] = {}  # (row, token) -> bounds on p(token)
        self._summary: tuple[np.ndarray, ...] | None = None  # device top-k ids, logits, log-sum-exp, its error

    def __len__(self) -> int:
        return self._count

    def _check(self) -> None:
        if not self._valid():
            raise RuntimeError("these logits were overwritten by a later forward pass of the same model")

    def _row(self, i: int) -> np.ndarray:
        self._check()
        row = self.logits[i] if self.device is None else self.device.row(self.first + i)
        return row[:self.vocab] if len(row) > self.vocab else row  # a padded embedding's extra ids

    def _top(self, k: int) -> tuple[np.ndarray, ...]:
        self._check()
        if self._summary is None or self._summary[0].shape[1] < k:
            ids, values, lse, err = self.device.top(k, self.sampling.temperature or 1.0)
            self._summary = (ids[self.first:], values[self.first:], lse[self.first:], err[self.first:])
        return self._summary

    def _warp(self, i: int) -> Dist:
        if self.device is None:
            return warp(self._row(i), self.sampling, self.vocab)
        cfg = self.sampling
        if cfg.greedy:
            self._check()
            if self._argmax is None:
                self._argmax = self.device.argmax()[self.first:]
            if self._argmax[i] < self.vocab:
                return Dist.point(int(self._argmax[i]), self.vocab)
            return warp(self._row(i), cfg, self.vocab)  # the best id is a padded one: cut the row
        k = max(DEVICE_TOP_K, cfg.top_k + 1)
        if (cfg.top_k or cfg.top_p < 1.0) and k <= (self.device.max_k or k):
            ids, values, lse, err = self._top(k)
            # A padded row's normaliser counts ids the host row is cut to leave out: not this row's.
            known = self.device.width <= self.vocab
            found = warp_top(ids[i], values[i], float(lse[i]) if known else None, cfg, self.vocab, float(err[i]))
            if found is not None:
                return found
        return warp(self._row(i), cfg, self.vocab)

    def prob_bounds(self, i: int, token: int) -> tuple[float, float] | None:
        """(lo, hi) around row i's p(token), from the device's top logits and normaliser (plus the
        token's one logit when it is not among them), without the whole row; None when the row is,
        or had better be, warped whole (host rows, greedy, truncation: their summaries decide rows)."""
        cfg = self.sampling
        if (self.device is None or cfg.greedy or cfg.top_k or cfg.top_p < 1.0 or i in self._dists
                or token >= self.vocab or self.device.width > self.vocab):
            return None
        if (i, token) not in self._bounds:  # asked twice a row: by the acceptance test and by beta
            ids, values, lse, err = self._top(DEVICE_TOP_K)
            hit = np.flatnonzero(ids[i] == token)
            z = float(values[i][hit[0]]) if hit.size else float(self.device.logit(self.first + i, token))
            p = math.exp(z / cfg.temperature - float(lse[i]))
            self._bounds[i, token] = p * math.exp(-float(err[i])), p * math.exp(float(err[i]))
        return self._bounds[i, token]

    def __getitem__(self, i: int) -> Dist:
        if i < 0:
            i += len(self)
        d = self._dists.get(i)
        if d is None:
            d = self._dists[i] = self._warp(i)
        return d

    def top_logprobs(self, i: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Row i's ``n`` most likely ids and their log-probabilities under the plain softmax (temperature 1,
        no truncation, whatever the sampling config): how a dynamic tree ranks candidates across rows."""
        row = self._row(i)
        ids = top_ids(row, n)
        peak = float(row[ids[0]])
        # exp in the row's own float32 (a ranking needs no more; float64 doubled the call, ~7 rows a tree)
        lse = peak + math.log(float(np.exp(row - peak).sum(dtype=np.float64)))
        return ids, row[ids].astype(np.float64) - lse

    def confident(self, i: int, stop: float) -> bool:
        """Whether row i's most likely id has plain-softmax probability >= ``stop`` (a chain's early stop)."""
        return stop <= 0 or math.exp(float(self.top_logprobs(i, 1)[1][0])) >= stop

    def top(self, i: int, n: int) -> list[int]:
        """Row i's ``n`` highest logits (the plain ranking, whatever the sampling config), ties to the
        lower id."""
        if self.device is not None and n < DEVICE_TOP_K:
            ids, values, *_ = self._top(DEVICE_TOP_K)
            ids, values = sorted_top(ids[i], values[i])
            if values[n - 1] > values[-1] and ids[:n].max() < self.vocab:  # no tie with an id outside
                return ids[:n].tolist()
        return top_ids(self._row(i), n).tolist()
