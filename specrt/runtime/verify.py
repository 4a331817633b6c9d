"""Exact speculative sampling: accept draft tokens, correct on the first rejection, add a bonus token.

:func:`verify_chain` is the dense reference (float64 [N, V] rows); :func:`accept_chain` is the same rule
on :class:`~specrt.runtime.dist.Dist` rows, which the decoding loop runs. Both draw the same tokens
from the same uniforms.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .dist import MIN_RESIDUAL_MASS, Dist
from .dist import residual as sparse_residual
from .rows import exceeds
from .sampling import sample


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)) for normalised p, q: what to sample after rejecting a token drawn from q
    (p itself when the residual's mass is rounding, see :data:`~specrt.runtime.dist.MIN_RESIDUAL_MASS`)."""
    r = np.maximum(p - q, 0.0)
    mass = r.sum()
    return p if mass < MIN_RESIDUAL_MASS else r / mass


def verify_chain(target_probs: np.ndarray, draft_probs: np.ndarray, draft_tokens: np.ndarray | list[int],
                 rng: np.random.Generator) -> tuple[int, int]:
    """Leviathan et al.'s rule over a chain; the emitted tokens are distributed exactly as the target's.

    target_probs [γ+1, V], draft_probs [γ, V], draft_tokens [γ] (each drawn from its q row).
    Returns (n_accepted, next_token): next_token is the correction on the first rejection, or the
    bonus from target_probs[γ] when all γ are accepted. Greedy = one-hot rows: accept while argmax matches.
    """
    target_probs = target_probs / target_probs.sum(axis=-1, keepdims=True)
    draft_probs = draft_probs / draft_probs.sum(axis=-1, keepdims=True)
    for i, x in enumerate(draft_tokens):
        p_x, q_x = target_probs[i, x], draft_probs[i, x]
        # Accept with probability min(1, p(x)/q(x)); u * q < p avoids dividing by q.
        if rng.random() * q_x < p_x:
            continue
        return i, sample(residual(target_probs[i], draft_probs[i]), rng)
    n = len(draft_tokens)
    return n, sample(target_probs[n], rng)


def accept_chain(p: Sequence[Dist], q: Sequence[Dist], draft_tokens: Sequence[int],
                 rng: np.random.Generator) -> tuple[int, int]:
    """:func:`verify_chain` on distributions held on their supports. ``p[i]`` is read only up to the
    first rejection (a :class:`~specrt.runtime.rows.LogitRows` warps nothing past it), and the
    residual is built for the rejected row alone."""
    for i, x in enumerate(draft_tokens):
        # Accept with probability min(1, p(x)/q(x)); u * q < p avoids dividing by q. A row left on a
        # device is read at x alone when that decides; the whole row only for the residual.
        if exceeds(p, i, x, rng.random() * q[i].prob(x)):
            continue
        return i, sparse_residual(p[i], q[i]).sample(rng)
    return len(draft_tokens), p[len(draft_tokens)].sample(rng)
