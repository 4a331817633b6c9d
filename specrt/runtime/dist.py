"""A next-token distribution held on the ids that carry its mass, and the two things verification builds
from a pair of them: the residual norm(max(0, p - q)) and the overlap sum_x min(p(x), q(x)).

The dense float64 functions (:func:`~specrt.runtime.sampling.probs_from_logits`, ``sample``,
:func:`~specrt.runtime.acceptance.verify_chain`) are the reference: a :class:`Dist` draws the same ids for the
same uniforms without [V] float64 rows on the hot path.
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np

# Below this residual mass p and q are equal to rounding; p itself is the limit of norm(max(0, p - q)).
MIN_RESIDUAL_MASS = 1e-12
_BLOCK = 1024  # ids per block of the two-level inverse CDF over a full row
_SMALL_SUPPORT = 128  # ids up to which a sparse Dist samples in Python

_ONE = np.ones(1)
_ONE.flags.writeable = False


class Dist:
    """A next-token distribution over ``vocab`` ids. ``ids`` (ascending int64) carry ``weights``
    (unnormalised) and every other id has probability 0; ``ids is None`` means the weights cover the
    ids 0..len(weights)-1 (a full row; ids past that have probability 0)."""

    __slots__ = ("ids", "weights", "vocab", "total", "_blocks")

    def __init__(self, ids: np.ndarray | None, weights: np.ndarray, vocab: int) -> None:
        self.ids, self.weights, self.vocab = ids, weights, vocab
        self._blocks: np.ndarray | None = None
        if ids is None:
            self._blocks = _block_cdf(weights)  # the total, and the first level of the inverse CDF
            self.total = float(self._blocks[-1])
        else:
            self.total = float(weights.sum(dtype=np.float64))
        if not self.total > 0:
            raise ValueError("a distribution needs positive mass")

    @classmethod
    def point(cls, token: int, vocab: int) -> "Dist":
        d = cls.__new__(cls)  # every greedy row is one: skip the constructor's reductions
        d.ids, d.weights, d.vocab, d.total, d._blocks = np.array([token], np.int64), _ONE, vocab, 1.0, None
        return d

    @classmethod
    def from_probs(cls, probs: np.ndarray) -> "Dist":
        """A dense probability vector (any scale) as a Dist on its non-zero ids."""
        probs = np.asarray(probs, np.float64)
        ids = np.flatnonzero(probs > 0)
        return cls(ids, probs[ids], len(probs))

    @property
    def support_size(self) -> int:
        return len(self.weights) if self.ids is None else len(self.ids)

    def prob(self, token: int) -> float:
        if self.ids is None:
            return float(self.weights[token]) / self.total if token < len(self.weights) else 0.0
        i = int(np.searchsorted(self.ids, token))
        return float(self.weights[i]) / self.total if i < len(self.ids) and self.ids[i] == token else 0.0

    def probs_of(self, tokens: np.ndarray) -> np.ndarray:
        """Probabilities of ``tokens`` (float64)."""
        tokens = np.asarray(tokens, np.int64)
        if self.ids is None:
            inside = tokens < len(self.weights)
            out = np.zeros(len(tokens))
            out[inside] = self.weights[tokens[inside]]
            return out / self.total
        i = np.minimum(np.searchsorted(self.ids, tokens), len(self.ids) - 1)
        return np.where(self.ids[i] == tokens, self.weights[i], 0.0) / self.total

    def dense(self) -> np.ndarray:
        """float64 [vocab], normalised: for the reference path, statistics and tests, not the hot path."""
        out = np.zeros(self.vocab)
        if self.ids is None:
            out[:len(self.weights)] = self.weights
        else:
            out[self.ids] = self.weights
        return out / self.total

    def sample(self, rng: np.random.Generator) -> int:
        """Inverse CDF over ids in ascending order with ONE uniform, as the reference ``sample`` draws."""
        x = rng.random() * self.total
        if self.ids is not None:
            if len(self.ids) == 1:
                return int(self.ids[0])
            if len(self.ids) <= _SMALL_SUPPORT:
                # The same sequential float64 sums as np.cumsum, in Python: on a few ids numpy's calls
                # cost more than they compute (top-k 50 draws in the decoding loop: 64 -> 52 us).
                j = bisect.bisect_right(list(itertools.accumulate(self.weights.tolist())), x)
            else:
                j = np.searchsorted(np.cumsum(self.weights, dtype=np.float64), x, side="right")
            return int(self.ids[_last_with_mass(self.weights, j)])
        b = int(min(np.searchsorted(self._blocks, x, side="right"), len(self._blocks) - 1))
        start = b * _BLOCK
        block = self.weights[start:start + _BLOCK]
        below = self._blocks[b - 1] if b else 0.0
        cdf = np.cumsum(block, dtype=np.float64)
        # The block was chosen by its pairwise sum; scale into its float64 cumulative sum so the draw
        # inside it is exactly the inverse CDF, with no rounding gap at the block's end.
        j = np.searchsorted(cdf, (x - below) * (cdf[-1] / (self._blocks[b] - below)), side="right")
        if j >= len(block) or block[j] == 0:  # rounding past the block's last id with mass
            j = _last_with_mass(block, j)
        return start + int(j)

    def top(self, n: int) -> np.ndarray:
        """The ``n`` most likely ids, most likely first, ties to the lower id (a stable sort's order)."""
        if self.ids is None:
            return top_ids(self.weights, n)
        return self.ids[top_ids(self.weights, n)]


def _block_cdf(weights: np.ndarray) -> np.ndarray:
    """Cumulative sums (float64) of the sums of consecutive blocks of ``_BLOCK`` weights, each block
    summed pairwise in the weights' own precision (float32 rows: 1e-7 relative, the precision of the
    float32 exp that made the weights, at half the cost of float64 sums)."""
    n = len(weights) // _BLOCK * _BLOCK
    sums = weights[:n].reshape(-1, _BLOCK).sum(axis=1).astype(np.float64)
    if n < len(weights):
        sums = np.append(sums, float(weights[n:].sum()))
    return np.cumsum(sums)


def _last_with_mass(weights: np.ndarray, j: int) -> int:
    """Index j clipped into ``weights`` and moved back to an entry with mass (floating-point edge)."""
    j = min(int(j), len(weights) - 1)
    while j > 0 and weights[j] == 0:
        j -= 1
    return j


_FEW = 8  # up to this many ids, repeated argmax: np.partition costs ~90 us on 16k floats, an argmax ~1 us


def _few_top_ids(values: np.ndarray, n: int) -> np.ndarray | None:
    """``top_ids`` for n <= _FEW by repeated argmax (which returns the first of equal maxima: ties go to the
    lower index, as a stable sort's); None when -inf or NaN would be among them (the general path orders those)."""
    chosen = [int(values.argmax())]
    if not values[chosen[0]] > -np.inf:
        return None
    rest = values.astype(np.float64) if n > 1 else values  # a copy: chosen entries are masked below every value
    while len(chosen) < n:
        rest[chosen[-1]] = -np.inf
        chosen.append(int(rest.argmax()))
        if not rest[chosen[-1]] > -np.inf:
            return None
    return np.array(chosen)


def top_ids(values: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` largest values, largest first, ties to the lower index, by partial
    selection: the same as ``np.argsort(-values, kind="stable")[:n]`` without sorting everything."""
    if n >= len(values):
        return np.argsort(-values, kind="stable")
    few = _few_top_ids(values, n) if n <= _FEW else None
    if few is not None:
        return few
    kth = np.partition(values, -n)[-n]
    above = np.flatnonzero(values > kth)
    chosen = np.concatenate([above, np.flatnonzero(values == kth)[:n - len(above)]])
    return chosen[np.argsort(-values[chosen], kind="stable")]


def residual(p: Dist, q: Dist) -> Dist:
    """norm(max(0, p - q)): what to sample after rejecting a token drawn from q. Its support is inside
    p's, so a sparse p gives a sparse residual; a full p costs one float64 row, once per rejection."""
    if p.ids is not None:
        r = np.maximum(np.divide(p.weights, p.total, dtype=np.float64) - q.probs_of(p.ids), 0.0)
        return p if r.sum() < MIN_RESIDUAL_MASS else Dist(p.ids, r, p.vocab)
    r = p.weights.astype(np.float64) / p.total
    if q.ids is None:
        n = min(len(r), len(q.weights))
        r[:n] -= np.divide(q.weights[:n], q.total, dtype=np.float64)
    else:  # q's own ids index its weights: no lookup (an EAGLE head's q holds 16k-32k of them)
        inside = q.ids < len(r)
        r[q.ids[inside]] -= np.divide(q.weights[inside], q.total, dtype=np.float64)
    np.maximum(r, 0.0, out=r)
    return p if r.sum() < MIN_RESIDUAL_MASS else Dist(None, r, p.vocab)


def overlap(p: Dist, q: Dist) -> float:
    """beta = sum_x min(p(x), q(x)), the acceptance probability of one drafted token; min(p, q) is 0
    outside the smaller support, so only that support is read."""
    if p.ids is None and q.ids is None:  # a statistic (the alpha estimate): float32 is plenty here
        n = min(len(p.weights), len(q.weights))
        both = np.multiply(p.weights[:n], np.float32(1 / p.total), dtype=np.float32)
        np.minimum(both, np.multiply(q.weights[:n], np.float32(1 / q.total), dtype=np.float32), out=both)
        return float(both.sum())
    # the smaller support's own weights, the other's looked up on it
    small, other = (p, q) if q.ids is None or (p.ids is not None and len(p.ids) <= len(q.ids)) else (q, p)
    return float(np.minimum(np.divide(small.weights, small.total, dtype=np.float64), other.probs_of(small.ids)).sum())
