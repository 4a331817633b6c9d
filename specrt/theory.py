"""The speculative-decoding maths of Leviathan et al. (2023), as pure functions.

alpha: acceptance rate, E over prefixes of beta = sum_x min(p(x), q(x)).
gamma: drafted tokens per target pass.  c: cost of one draft step / cost of one target pass.
"""

from __future__ import annotations

import numpy as np


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per target pass] = (1 - alpha^(gamma+1)) / (1 - alpha); gamma + 1 when alpha = 1."""
    _check_alpha(alpha)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected wall-time improvement over plain decoding: expected_tokens / (gamma * c + 1)."""
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """The integer gamma in [1, max_gamma] that maximises :func:`speedup` (smallest one on ties)."""
    if max_gamma < 1:
        raise ValueError(f"max_gamma must be >= 1, got {max_gamma}")
    gains = [speedup(alpha, g, c) for g in range(1, max_gamma + 1)]
    return int(np.argmax(gains)) + 1


def acceptance_rate(p: np.ndarray, q: np.ndarray) -> float:
    """beta = sum_x min(p(x), q(x)) for two probability vectors over the same vocabulary."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {p.shape} and {q.shape}")
    return float(np.minimum(p, q).sum(axis=-1))


def ops_factor(alpha: float, gamma: int, mu: float) -> float:
    """How many times the arithmetic operations of plain decoding speculation spends (Leviathan et al.
    2023, Eq. 11): (1 - alpha)(gamma mu + gamma + 1) / (1 - alpha^(gamma+1)).

    mu: draft / target arithmetic operations per token. Each pass verifies gamma + 1 tokens on the target
    and drafts gamma on the draft, and yields expected_tokens of them. At alpha = 1 the limit is
    (gamma mu + gamma + 1) / (gamma + 1)."""
    if mu < 0:
        raise ValueError(f"mu must be >= 0, got {mu}")
    return (gamma * mu + gamma + 1.0) / expected_tokens(alpha, gamma)


def oracle_tokens(alpha: float) -> float:
    """E[tokens per target pass] with unlimited gamma: 1 / (1 - alpha), the ceiling expected_tokens
    approaches as gamma grows (inf at alpha = 1)."""
    _check_alpha(alpha)
    return float("inf") if alpha == 1.0 else 1.0 / (1.0 - alpha)
