"""Logit processing shared by target and draft, and sampling from a probability vector.

Exactness needs the SAME warping (temperature, top-k, top-p) on p and q before acceptance, so both
models go through :func:`probs_from_logits` with one :class:`SamplingConfig`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

# A temperature below this is greedy: 1/T no longer fits a float32 below ~3e-39, and logits times 1/T overflow
# it from ~1e-36 (the summary graph, the float32 exp pass); any two float32 logits that differ at all (by
# more than ~1e-27 at any magnitude a model produces) differ by thousands of nats at it, so the softmax
# already is the argmax's point mass.
GREEDY_BELOW = 1e-30


def is_real(value: object) -> bool:
    """An int or float (numpy's too), not a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 = greedy (one-hot argmax), as is any below :data:`GREEDY_BELOW` (stored as 0.0);
    top_k 0 = off; top_p 1 = off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t = self.temperature
        if not is_real(t) or not math.isfinite(t) or t < 0:
            raise ConfigError(f"temperature must be a finite number >= 0, got {t!r}")
        if t < GREEDY_BELOW:
            object.__setattr__(self, "temperature", 0.0)
        if not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
            raise ConfigError(f"top_k must be a non-negative integer, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs_from_logits(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Logits [N, V] → probabilities [N, V] in float64 after temperature, top-k and top-p."""
    logits = np.asarray(logits, dtype=np.float64)
    if cfg.greedy:
        out = np.zeros_like(logits)
        out[np.arange(logits.shape[0]), logits.argmax(axis=-1)] = 1.0
        return out
    z = logits / cfg.temperature
    if 0 < cfg.top_k < z.shape[-1]:
        kth = np.partition(z, -cfg.top_k, axis=-1)[:, -cfg.top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    z = z - z.max(axis=-1, keepdims=True)
    probs = np.exp(z)
    probs /= probs.sum(axis=-1, keepdims=True)
    if cfg.top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(probs, order, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p: a token is dropped when the mass
        # before it already reaches top_p (the most likely token is always kept).
        before = np.cumsum(sorted_p, axis=-1) - sorted_p
        drop = np.zeros_like(probs, dtype=bool)
        np.put_along_axis(drop, order, before >= cfg.top_p, axis=-1)
        probs = np.where(drop, 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from an unnormalised non-negative vector by inverse CDF (one uniform per draw)."""
    cdf = np.cumsum(probs)
    total = cdf[-1]
    if not total > 0:
        raise ValueError("cannot sample from a distribution with no mass")
    return int(min(np.searchsorted(cdf, rng.random() * total, side="right"), len(cdf) - 1))
