"""The speculative-decoding maths of Leviathan et al. (2023), as pure functions.

alpha: acceptance rate, E over prefixes of beta = sum_x min(p(x), q(x)).
gamma: drafted tokens per target pass.  c: cost of one draft step / cost of one target pass.
verify cost v(r): a target pass over r rows / one over a single row. The paper takes v = 1 (a pass is
memory-bound); on a CPU, and for quantized kernels, extra rows cost time (docs/performance/verify-cost-cpu.md),
so a pass of gamma + 1 rows costs v(gamma + 1) and the best gamma is shorter.
"""

from __future__ import annotations

from typing import Sequence

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


def verify_cost_at(costs: Sequence[float] | None, rows: int) -> float:
    """v(rows) from a measured curve ``costs`` (``costs[r - 1]``: r rows against one; None: v = 1, the paper's
    memory-bound pass); past the curve's end, the line through its last two points."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    if not costs:
        return 1.0
    if rows <= len(costs):
        return float(costs[rows - 1])
    slope = costs[-1] - costs[-2] if len(costs) > 1 else 0.0
    return float(costs[-1] + max(slope, 0.0) * (rows - len(costs)))


def draft_cost(draft_pass_s: float, verify_pass_s: float, verify_rows: int,
               verify_costs: Sequence[float] | None = None) -> float:
    """c measured: one draft pass's time over one row's share of a verify pass of ``verify_rows`` rows that took
    ``verify_pass_s`` (its time over v(verify_rows): the one-row pass it stands for)."""
    if verify_pass_s <= 0:
        raise ValueError(f"verify_pass_s must be > 0, got {verify_pass_s}")
    return draft_pass_s / (verify_pass_s / verify_cost_at(verify_costs, verify_rows))


def moving_average(old: float | None, new: float, weight: float) -> float:
    """An exponential moving average's next value: ``new`` at first (``old`` None), then weighted by ``weight``."""
    return new if old is None else (1 - weight) * old + weight * new


def speedup(alpha: float, gamma: int, c: float, verify_costs: Sequence[float] | None = None,
            one_pass: bool = False) -> float:
    """Expected wall-time improvement over plain decoding: expected_tokens / (gamma * c + v(gamma + 1)),
    with v = 1 unless a measured curve ``verify_costs`` (:func:`verify_cost_at`) is given. ``one_pass``: the
    drafter proposes all gamma tokens in one pass of cost c (a block drafter: DFlash), so c counts once."""
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    return expected_tokens(alpha, gamma) / ((1 if one_pass else gamma) * c + verify_cost_at(verify_costs, gamma + 1))


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64, verify_costs: Sequence[float] | None = None,
                  one_pass: bool = False) -> int:
    """The integer gamma in [1, max_gamma] that maximises :func:`speedup` (smallest one on ties)."""
    if max_gamma < 1:
        raise ValueError(f"max_gamma must be >= 1, got {max_gamma}")
    gains = [speedup(alpha, g, c, verify_costs, one_pass) for g in range(1, max_gamma + 1)]
    return int(np.argmax(gains)) + 1


def verify_costs_from_times(seconds: Sequence[float]) -> tuple[float, ...]:
    """A verify-cost curve from pass times at 1, 2, ... rows: each over the 1-row time, never below the
    curve before it (more rows never cost less; a lower figure is the machine's noise)."""
    if not seconds or seconds[0] <= 0:
        raise ValueError("need a positive 1-row time first")
    return tuple(float(v) for v in np.maximum.accumulate(np.asarray(seconds, np.float64) / seconds[0]))


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
