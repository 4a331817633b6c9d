"""What a row of logits means: the warped next-token distribution, held on the ids that carry its mass.

The dense float64 functions (:func:`~specrt.runtime.sampling.probs_from_logits`, ``sample``,
:func:`~specrt.runtime.verify.verify_chain`) are the reference. This module decides the same kept sets
and draws the same ids for the same uniforms, without [N, V] float64 rows on the hot path:

- greedy is one argmax per row, a point distribution;
- top-k is a partial selection, softmax over the k kept logits only;
- top-p is exact (the sort-based kept set, ties broken by lower id) from a candidate block whose mass
  is checked to reach top-p; on a large vocabulary that check first runs on a bracket of the row's
  total (one max pass over groups of 8 ids, no exp over the row: the top's group alone, then the
  groups near the top), then on the total from one float32 exp pass within its error bound; an edge
  closer to top-p than that bound is decided on float64 weights, and only a block too light for all
  that falls back to the full sort;
- temperature alone keeps every id: one float32 exp over the row, and a two-level inverse CDF
  (block sums, then one block) instead of a cumulative sum over the whole vocabulary;
- :class:`LogitRows` warps a row only when asked, so verification never touches rows past the first
  rejection, and ``max(0, p - q)`` is built for the rejected row alone (:func:`residual`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from typing import Callable, Sequence

import numpy as np

from .. import contract as C
from .sampling import SamplingConfig

# Below this residual mass p and q are equal to rounding; p itself is the limit of norm(max(0, p - q)).
MIN_RESIDUAL_MASS = 1e-12
_BLOCK = 1024  # ids per block of the two-level inverse CDF over a full row
# Top-p candidate blocks: ids within this many nats of the best. The bracket (no exp over the row)
# tries _BRACKET_SPAN; after the exp pass the block widens in small steps until it holds top-p of the mass
# (a wide bell's nucleus sits 8-12 nats down; one step to 16 would sweep in a sixth of the row and its
# sort). Past _MAX_CANDIDATE_SHARE of the row, group scans and top-k read the whole row instead.
# The bracket at 12 nats decides 81 % of the real-vocabulary bench pair's rows at T 0.8 (8 nats: 69 %)
# and still reads only ~70 groups (median) exactly.
_BRACKET_SPAN = 12.0
_TOP_P_SPANS = (4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0)
_GROUP_ROWS = 64  # ids per group whose maximum is taken to skip groups that cannot reach a threshold
# Top-p's bracket bounds every unread group by (its size) x (its maximum's weight): groups of 8 cost the
# same single pass as groups of 64 but bound a bell's tail ~4x too high instead of ~20x (bench rows).
_TOP_P_GROUP_ROWS = 8
# Smaller rows skip the bracket: their exp pass costs no more than its ~30 small numpy calls (ms per
# row, bracket vs not: 8k ids 0.065 vs 0.067 trained-like, 0.123 vs 0.089 gaussian; 32k 0.079 vs 0.121,
# 0.179 vs 0.175), and group their scans by 64 as top-k does.
_BRACKET_MIN_VOCAB = 20_000
# A bracket whose threshold more than this many groups reach is given up before reading them: such a
# block is a flat bell's hundreds of ids, which the bound's slack leaves undecided (bench rows by groups
# reaching 12 nats: < 256: 199 of 199 decided, 256-511: 33 of 39, 512-1023: 3 of 33, more: 0 of 17),
# and reading and sorting them cost ~0.25 ms before the exp pass.
_BRACKET_MAX_GROUPS = 512
_MAX_CANDIDATE_SHARE = 0.125


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


def top_ids(values: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` largest values, largest first, ties to the lower index, by partial
    selection: the same as ``np.argsort(-values, kind="stable")[:n]`` without sorting everything."""
    if n >= len(values):
        return np.argsort(-values, kind="stable")
    kth = np.partition(values, -n)[-n]
    above = np.flatnonzero(values > kth)
    chosen = np.concatenate([above, np.flatnonzero(values == kth)[:n - len(above)]])
    return chosen[np.argsort(-values[chosen], kind="stable")]


class _Groups:
    """A row viewed as ``rows`` x C (id = r * C + c) with each column's maximum: one vectorised
    reduction that tells which columns can hold an id above a threshold, so only those are scanned.
    The ``len % rows`` ids at the end form one extra group."""

    def __init__(self, logits: np.ndarray, rows: int = _GROUP_ROWS) -> None:
        self.logits, self.rows = logits, rows
        self.n = len(logits) // rows * rows
        self.grid = logits[:self.n].reshape(rows, -1)
        maxima = self.grid.max(axis=0)
        self.maxima = np.append(maxima, logits[self.n:].max()) if self.n < len(logits) else maxima

    def _scan(self, cols: np.ndarray, threshold) -> tuple[np.ndarray, np.ndarray]:
        """(ascending ids >= threshold, the other values) over the ascending groups ``cols`` (the extra
        group of the last ids has index C). ``nonzero`` walks rows r (ids r * C ..) in order and
        ascending columns within each, so the ids come out ascending with no sort."""
        width = self.grid.shape[1]
        tail = len(cols) and cols[-1] == width
        cols = cols[:-1] if tail else cols
        read = self.grid[:, cols]
        inside = read >= threshold
        r, c = np.nonzero(inside)
        ids, below = r * width + cols[c], read[~inside]
        if tail:
            last = self.logits[self.n:]
            ids = np.append(ids, self.n + np.flatnonzero(last >= threshold))
            below = np.append(below, last[last < threshold])
        return ids, below

    def _too_many(self, cols: np.ndarray) -> bool:
        return len(cols) * self.rows > _MAX_CANDIDATE_SHARE * len(self.logits)

    def bounds(self, top, temperature: float) -> np.ndarray:
        """A new float32 array: each group's bound on its ids' summed weight exp((z - top) / T), in
        units of ``rows`` (its maximum's weight; the extra group's scaled to its size).

        Float32 (a float64 exp of ~19k maxima costs ~90 us, float32 ~10 us): the exponent
        x = (z - top) / T <= 0 carries a relative error <= 2e-7, so exp(x) is off by a factor
        <= exp(88 * 2e-7) while it is a normal float, and a float32 pairwise sum of them adds
        < _SUM_ERR: callers inflate by 1e-4 and add 1e-37 per id that may have underflowed."""
        x = _weights32(self.maxima, top, temperature)
        if self.n < len(self.logits):
            x[-1] *= np.float32((len(self.logits) - self.n) / self.rows)  # the extra group is smaller
        return x

    def top_group(self, col: int) -> tuple[list[float], int]:
        """(the logits of group ``col``, the id of its first largest one). Python floats: a handful of
        values, for which numpy calls cost more than they compute."""
        width = self.grid.shape[1]
        values = (self.logits[self.n:] if col == width else self.grid[:, col]).tolist()
        r = values.index(max(values))
        return values, self.n + r if col == width else r * width + col

    def at_least(self, threshold) -> np.ndarray:
        """Ascending ids whose logit is >= threshold."""
        cols = np.flatnonzero(self.maxima >= threshold)
        if self._too_many(cols):
            return np.flatnonzero(self.logits >= threshold)  # most columns qualify: one pass is cheaper
        return self._scan(cols, threshold)[0]


def top_k_support(logits: np.ndarray, k: int) -> np.ndarray:
    """Ascending ids whose logit is >= the k-th largest (ties at the boundary all kept, as the reference
    masks ``z < kth``). Selected on the raw logits: dividing float32 values by a temperature in
    float64 keeps their order and their ties, so the kept set is the reference's.

    The k-th largest column maximum is a lower bound of the k-th largest logit (k columns each hold an
    id at least that large), so the ids at or above it hold the whole top k and few others."""
    groups = _Groups(logits)
    if len(groups.maxima) < k:
        return np.flatnonzero(logits >= np.partition(logits, -k)[-k])
    near = groups.at_least(np.partition(groups.maxima, -k)[-k])
    return near[logits[near] >= np.partition(logits[near], -k)[-k]]


def _top_p_keep(p: np.ndarray, top_p: float) -> np.ndarray:
    """Boolean mask over ``p`` (ids ascending) of the tokens top-p keeps: sorted by probability (ties
    to the lower id), a token is dropped when the mass before it already reaches top_p."""
    order = np.argsort(-p, kind="stable")
    sorted_p = p[order]
    keep = np.empty(len(p), bool)
    keep[order] = (np.cumsum(sorted_p) - sorted_p) < top_p
    return keep


def _exp_scaled(logits: np.ndarray, top: np.float32, temperature: float,
                out: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """(exp(logits / T - c) in float32, c): the only exp over a whole row. c = max / T, or c = 0 when
    max / T lies in [-20, 60]: then no weight overflows (a row's sum stays below float32's limit) and
    only ids more than 67 nats below the top underflow, so the subtraction pass is skipped. Most
    callers use the weights only as ratios to each other (a Dist's total); :func:`_top_p_full` mixes
    them with max-relative weights through c. ``out``: a float32 buffer to write into (else a new array)."""
    scaled_top = float(top) / temperature
    if -20.0 <= scaled_top <= 60.0:
        if temperature == 1.0:
            return np.exp(logits, out=out, dtype=np.float32), 0.0
        w = np.multiply(logits, np.float32(1.0 / temperature), out=out, dtype=np.float32)
        return np.exp(w, out=w), 0.0
    w = np.subtract(logits, top, out=out, dtype=np.float32)
    if temperature != 1.0:
        w *= np.float32(1.0 / temperature)
    return np.exp(w, out=w), scaled_top


def _top_p_decided(w: np.ndarray, rest_lo: float, rest_hi: float, top_p: float) -> np.ndarray | None:
    """The kept indices (ascending) of a candidate block of weights ``w`` (the top's weight is 1) when
    the mass of the rest of the row is only known to lie in [rest_lo, rest_hi]; None when that bracket
    leaves the block or a candidate undecided."""
    block = float(w.sum())
    lo, hi = top_p * (block + rest_lo), top_p * (block + rest_hi)
    if block < hi:
        return None  # the block may hold less than top_p of the mass
    if hi < 1.0 - 1e-9:
        # The top alone reaches top_p (the usual case): every other id has at least the top's weight
        # 1 before it, a few ulps less as a cumulative sum computes it, >= hi still. Ties to the lower id.
        return np.array([int(np.argmax(w))])
    order = np.argsort(-w, kind="stable")
    sorted_w = w[order]
    before = np.cumsum(sorted_w)
    before -= sorted_w
    keep = before < lo
    return None if np.count_nonzero(before < hi) != np.count_nonzero(keep) else np.sort(order[keep])


def _weights32(values: np.ndarray, top, temperature: float) -> np.ndarray:
    """exp((values - top) / T) in a new float32 array, for upper bounds: 1/T is capped where float32
    would overflow (T < 1e-30), and a smaller factor only raises the weights of values below the top."""
    x = np.subtract(values, top)
    x *= np.float32(min(1.0 / temperature, 1e30))
    return np.exp(x, out=x)


def _exp_pass_error(offset: float, scaled_top: float) -> float:
    """A bound on the relative error of every weight of :func:`_exp_scaled` that did not underflow:
    its exponent x was rounded twice in float32 (2^-23 |x|, with |x| <= |x_top| + 67 where x_top is
    0 after the subtraction and max / T without it), and numpy's float32 exp adds <= 4 ulp."""
    x_top = 0.0 if offset else abs(scaled_top)
    return (x_top + 67.0 + 5.0) * 2.0 ** -23


def _top_p_exact(logits: np.ndarray, temperature: float, top_p: float, vocab: int,
                 ids: np.ndarray | None = None) -> Dist:
    """Top-p on the float64 probabilities the reference computes, over the whole row. ``ids``: a
    candidate block (every id at or above a logit threshold) that provably holds top-p of the mass
    once the row's exact total is known; only it is sorted then."""
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    p = np.exp(z, out=z)
    p /= p.sum()
    if ids is not None and p[ids].sum() >= top_p:
        return _top_p_dist(ids, p[ids], top_p, vocab)
    kept = np.flatnonzero(_top_p_keep(p, top_p))
    return Dist(kept, p[kept], vocab)


# A float32 pairwise sum (numpy's, in one call or chunks of 8192) of n <= 2^20 positive terms is off by
# < 50 ulp of the exact sum (16 per 128-term leaf, 1 per halving, 1 per chunk).
_SUM_ERR = 4e-6


def _bracket_top_p(logits: np.ndarray, groups: _Groups, best: int, bracket, temperature: float, top_p: float,
                   vocab: int) -> tuple[Dist | None, np.ndarray | None]:
    """Top-p decided from the group maxima, with no exp over the row: (the Dist or None, the ids of
    the block read, if one was: those at or above ``bracket``).

    First the top alone, its group read: most rows of a trained model keep only the top, and the other
    groups' bounds show it in a few small steps (the real-vocabulary bench pair at T 0.8 top-p 0.9:
    83 % keep one id; this decides 57 % of all rows). Then the block within _BRACKET_SPAN nats of the
    top: the groups reaching it are read, every other group counts as if all its ids weighed what its
    maximum weighs. None when that block is so wide that reading it costs a pass over the row, or
    when the unread groups' bounds alone outweigh what the block could hold."""
    top, rows, n = groups.maxima[best], groups.rows, len(logits)
    unread = groups.bounds(top, temperature)
    unread[best] = 0.0
    every = float(unread.sum())  # every other group's bound, within _SUM_ERR
    values, top_id = groups.top_group(best)
    # exp(0) = 1 exactly for the top: the rest of its group's weight (a tie makes it >= 1: undecided).
    others = math.fsum(math.exp((z - float(top)) / temperature) for z in values) - 1.0
    # Every bound (:meth:`_Groups.bounds`) inflated by 1e-4 and 1e-37 per id that may have underflowed.
    if top_p * (1.0 + (every * rows + others) * (1.0 + 1e-4) + n * 1e-37) < 1.0 - 1e-9:
        # Every other id has at least the top's probability before it, and that reaches top_p (the
        # margin covers the reference's float64 rounding).
        return Dist.point(top_id, vocab), None
    cols = np.flatnonzero(groups.maxima >= bracket)
    if groups._too_many(cols) or len(cols) > _BRACKET_MAX_GROUPS:
        return None, None
    near = float(unread[cols].sum(dtype=np.float64))
    # The groups left unread: every group less the near ones, + the float32 sum's error of `every`.
    far = (max(0.0, every - near) + _SUM_ERR * every) * rows
    # The block weighs at most 1 + others + near (within the bounds' 1e-4), and the slack is at least
    # `far`: when that leaves the block short of top_p, reading it is wasted (the bench pair's bell rows).
    if (1.0 + others + near * rows) * (1.0 + 1e-4) * (1.0 - top_p) < top_p * far:
        return None, None
    ids, below = groups._scan(cols, bracket)
    slack = (far + float(_weights32(below, top, temperature).sum(dtype=np.float64))) * (1.0 + 1e-4) + n * 1e-37
    w = np.exp((logits[ids].astype(np.float64) - float(top)) / temperature)  # the reference's weights
    keep = _top_p_decided(w, 0.0, slack, top_p)
    return (None if keep is None else Dist(ids[keep], w[keep], vocab)), ids


def _top_p_full(logits: np.ndarray, temperature: float, top_p: float, vocab: int) -> Dist:
    """Top-p over a whole row, exact.

    Every id outside a candidate block {z >= max z - span} has lower probability than every id inside
    it, so it sorts after all of them and the mass before it is at least the block's mass: when the
    block holds top_p of the mass, nothing outside it is kept and the kept set is decided inside.
    First try (a large vocabulary): the row's total bracketed by reading only the groups near the top
    and bounding the rest by their maxima, no exp over the row (:func:`_bracket_top_p`; decides peaked
    rows, whose tail is far below the top). Otherwise one float32 exp pass gives the total.

    Real-vocabulary bench rows (benchmarks/real_vocab.py pair, T 0.8, top-p 0.9), ms per row in the
    decoding loop (caches cold after the engine's pass; greedy's argmax: 0.07): the top alone decides
    57 % of them (0.20), the bracket 22 % (0.33), the exp pass the rest (0.61)."""
    large = len(logits) >= _BRACKET_MIN_VOCAB
    groups = _Groups(logits, _TOP_P_GROUP_ROWS if large else _GROUP_ROWS)
    best = int(groups.maxima.argmax())  # the method: np.argmax's wrapper costs ~10 us cold
    top = groups.maxima[best]
    bracket = top - np.float32(_BRACKET_SPAN * temperature)
    found = None
    if large:
        dist, found = _bracket_top_p(logits, groups, best, bracket, temperature, top_p, vocab)
        if dist is not None:
            return dist
    e, offset = _exp_scaled(logits, top, temperature, _scratch(len(logits)))
    # Sums of e in units of the top's weight (the candidates' float64 weights are relative to the top).
    unit = float(np.exp(offset - float(top) / temperature))
    rel_err = _exp_pass_error(offset, float(top) / temperature)
    rest_base = None
    for span in _TOP_P_SPANS:
        threshold = top - np.float32(span * temperature)
        if found is not None and threshold >= bracket:  # inside the bracket's block: no group scan
            ids = found[logits[found] >= threshold]
        else:
            ids = groups.at_least(threshold)
        if len(ids) > len(logits) // 2:
            return _top_p_exact(logits, temperature, top_p, vocab)  # a flat row: the full sort
        # The block in float64 (the reference's values), the rest of the row's mass from the float32
        # pass, within its error bound.
        w = np.exp((logits[ids].astype(np.float64) - float(top)) / temperature)
        if rest_base is None:
            # The first block's ids zeroed, then one float32 sum: the rest alone, off by _SUM_ERR of
            # itself (a sum of the row minus the block's was off by ~1e-6 of the row, which undecided
            # ~14 % of the bench pair's top-p 0.95 rows). Wider blocks take their new ids out of it.
            e[ids] = 0.0
            rest = rest_base = float(e.sum()) * unit
        else:
            rest = max(0.0, rest_base - float(e[ids].sum(dtype=np.float64)) * unit)
        err = rel_err * rest + _SUM_ERR * rest_base + len(logits) * 1.2e-38 * unit  # + ids that underflowed
        block = float(w.sum())
        if block < top_p * (block + max(0.0, rest - err)):
            continue  # surely lighter than top-p: widen the block
        keep = _top_p_decided(w, max(0.0, rest - err), rest + err, top_p)
        if keep is not None:
            return Dist(ids[keep], w[keep], vocab)
        return _top_p_exact(logits, temperature, top_p, vocab, ids)  # an edge within the pass's error
    return _top_p_exact(logits, temperature, top_p, vocab)


_local = threading.local()


def _scratch(n: int) -> np.ndarray:
    """A float32 buffer of n values reused by this thread's top-p rows: a fresh 600 KB array per row
    costs page faults (its exp pass ran ~0.5 ms instead of ~0.18 ms when two such arrays were live)."""
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) < n:
        buf = _local.buf = np.empty(n, np.float32)
    return buf[:n]


def _kept_softmax(ids: np.ndarray, values: np.ndarray, cfg: SamplingConfig, vocab: int) -> Dist:
    """Softmax over the kept logits ``values`` of ascending ``ids`` at the config's temperature, in
    float64 as the reference computes it, then its top-p."""
    z = values.astype(np.float64) / cfg.temperature
    p = np.exp(z - z.max())
    return _top_p_dist(ids, p / p.sum(), cfg.top_p, vocab)


def _top_p_dist(ids: np.ndarray, p: np.ndarray, top_p: float, vocab: int) -> Dist:
    """The Dist of ascending ``ids`` with probabilities ``p`` after top-p (none when top_p is 1)."""
    if top_p < 1.0:
        keep = _top_p_keep(p, top_p)
        ids, p = ids[keep], p[keep]
    return Dist(ids, p, vocab)


def warp(logits: np.ndarray, cfg: SamplingConfig, vocab: int) -> Dist:
    """One row of logits [V'] (float32, V' may differ from ``vocab``) → the distribution the reference
    ``probs_from_logits`` gives: greedy one-hot, then temperature, top-k, top-p."""
    if cfg.greedy:
        return Dist.point(int(np.argmax(logits)), vocab)
    if 0 < cfg.top_k < len(logits):
        ids = top_k_support(logits, cfg.top_k)
        return _kept_softmax(ids, logits[ids], cfg, vocab)
    if cfg.top_p < 1.0:
        return _top_p_full(logits, cfg.temperature, cfg.top_p, vocab)
    return Dist(None, _exp_scaled(logits, logits.max(), cfg.temperature)[0], vocab)


def residual(p: Dist, q: Dist) -> Dist:
    """norm(max(0, p - q)): what to sample after rejecting a token drawn from q. Its support is inside
    p's, so a sparse p gives a sparse residual; a full p costs one float64 row, once per rejection."""
    if p.ids is not None:
        r = np.maximum(p.probs_of(p.ids) - q.probs_of(p.ids), 0.0)
        return p if r.sum() < MIN_RESIDUAL_MASS else Dist(p.ids, r, p.vocab)
    r = p.weights.astype(np.float64) / p.total
    if q.ids is None:
        n = min(len(r), len(q.weights))
        r[:n] -= np.divide(q.weights[:n], q.total, dtype=np.float64)
    else:
        inside = q.ids[q.ids < len(r)]
        r[inside] -= q.probs_of(inside)
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
    ids = p.ids if q.ids is None or (p.ids is not None and len(p.ids) <= len(q.ids)) else q.ids
    return float(np.minimum(p.probs_of(ids), q.probs_of(ids)).sum())


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


def _sorted_top(ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A device's top-k of one row, ordered by value then lower id (a device's order among ties is
    its own)."""
    order = np.lexsort((ids, -values))
    return ids[order], values[order]


def warp_top(ids: np.ndarray, values: np.ndarray, lse: float | None, cfg: SamplingConfig, vocab: int,
             lse_err: float = 0.0) -> Dist | None:
    """The distribution :func:`warp` gives, from a row's largest logits alone (``ids``/``values``, the
    k largest, with ``lse`` = log-sum-exp of the whole row / T, exact within ``lse_err``, or None when
    unknown); None when they cannot decide it, i.e. when ids outside them may be kept: no truncation,
    a tie at the block's edge, a block lighter than top-p, or a top-p edge within the normaliser's
    error. Ids outside the block have logits <= its smallest; only ids strictly above that smallest
    value form the block, so everything outside it sorts after everything inside it."""
    ids, values = _sorted_top(ids, values)
    if ids.max() >= vocab:
        return None  # a padded embedding's extra ids: the host row cut to the vocabulary decides
    edge = values[-1]
    if 0 < cfg.top_k < len(values):
        kth = values[cfg.top_k - 1]
        if not kth > edge:
            return None  # ids outside the block may tie with the k-th
        keep = values >= kth
        order = np.argsort(ids[keep])
        return _kept_softmax(ids[keep][order], values[keep][order], cfg, vocab)
    if cfg.top_p < 1.0 and not cfg.top_k and lse is not None:
        keep = values > edge
        order = np.argsort(ids[keep])
        ids, z = ids[keep][order], values[keep][order].astype(np.float64) / cfg.temperature
        w = np.exp(z - z.max())  # the top's weight is 1
        # The row's total in these units is exp(lse - z_max), known within a factor e^(+-lse_err); the
        # block itself is part of it. None when that leaves the block's mass or its edge undecided.
        total, block = math.exp(lse - z.max()), float(w.sum())
        rest_lo = max(0.0, total * math.exp(-lse_err) - block)
        kept = _top_p_decided(w, rest_lo, max(rest_lo, total * math.exp(lse_err) - block), cfg.top_p)
        return None if kept is None else Dist(ids[kept], w[kept], vocab)
    return None  # every id keeps some mass: only the whole row decides


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

    def top(self, i: int, n: int) -> list[int]:
        """Row i's ``n`` highest logits (the plain ranking, whatever the sampling config), ties to the
        lower id."""
        if self.device is not None and n < DEVICE_TOP_K:
            ids, values, *_ = self._top(DEVICE_TOP_K)
            ids, values = _sorted_top(ids[i], values[i])
            if values[n - 1] > values[-1] and ids[:n].max() < self.vocab:  # no tie with an id outside
                return ids[:n].tolist()
        return top_ids(self._row(i), n).tolist()
