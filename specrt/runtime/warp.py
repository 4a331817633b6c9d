"""Warping a row of logits into the next-token distribution (:class:`~specrt.runtime.dist.Dist`).

The dense float64 functions (:func:`~specrt.runtime.sampling.probs_from_logits`, ``sample``,
:func:`~specrt.runtime.acceptance.verify_chain`) are the reference. This module decides the same kept sets
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
- :func:`warp_top` decides the same from a row's top logits and normaliser alone (a row left on a GPU).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .dist import Dist
from .sampling import SamplingConfig

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

    Real-vocabulary bench rows (benchmarks/host-work/real_vocab.py pair, T 0.8, top-p 0.9), ms per row in the
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


def sorted_top(ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    ids, values = sorted_top(ids, values)
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
