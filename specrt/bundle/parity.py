"""How close two sets of logits must be: the export's parity check and `specrt verify` share it.

An absolute tolerance means nothing for a real model whose logits span tens of units, so the error
is measured against each reference row's own scale, and the distributions are compared as well:

- ``rel``: max |got - ref| / scale, with scale = max(std of the reference row, 1 logit); the floor
  keeps near-flat rows of tiny random models from turning rounding into a failure.
- ``kl``: max over rows of KL(softmax(ref) || softmax(got)), in nats.
- ``top1``: share of rows whose best token is the reference's (a figure, not a gate: near-ties flip
  legitimately; ``rel`` bounds how far any logit can move).

numpy only: the runtime side (``specrt verify``) imports it without torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class ParityTolerance:
    """The most a correct graph may differ from an fp32 PyTorch reference."""

    rel: float
    kl: float

    def to_json(self) -> dict[str, float]:
        return asdict(self)


# Measured (benchmarks/scale/scale-check.json): correct fp32 graphs stay below rel 1e-5; fp16 graphs of
# Llama-3.2-1B / Qwen3-0.6B dimensions below rel 3e-3, KL 1e-5. Bugs (a dropped q/k norm, wrong rope
# scaling, swapped layers) land at rel >= 0.1 on the test models.
PARITY_TOLERANCE = {
    "float32": ParityTolerance(rel=1e-3, kl=1e-5),
    "float16": ParityTolerance(rel=2e-2, kl=1e-3),
}


# A position is decisive when the reference's best logit leads its second by at least this (a 1.65x
# probability ratio): there a quantized graph's top-1 must agree; near-ties flip under any rounding. The
# quantize gate and `specrt verify` count agreement at the same positions.
DECISIVE_LOGIT_GAP = 0.5


def decisive(logits: np.ndarray) -> np.ndarray:
    """Boolean per row of ``logits`` [..., V] (or of its top logits, any order): best leads second by the gap."""
    top2 = np.partition(logits, -2, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0] >= DECISIVE_LOGIT_GAP


def row_scale(ref: np.ndarray) -> np.ndarray:
    """Per-row scale the error is measured against: the row's standard deviation, at least 1."""
    return np.maximum(ref.astype(np.float64).std(axis=-1), 1.0)


def log_softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of logits (..., V) in float64."""
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def row_kl(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(got)) in nats for each row of logits (..., V), in float64."""
    lp, lq = log_softmax(ref), log_softmax(got)
    return (np.exp(lp) * (lp - lq)).sum(axis=-1)


def compare_logits(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """``abs``, ``rel``, ``kl`` and ``top1`` of ``got`` against ``ref`` over rows (..., V)."""
    ref = ref.reshape(-1, ref.shape[-1])
    got = got.reshape(-1, got.shape[-1])
    diff = np.abs(got.astype(np.float64) - ref)
    return {"abs": float(diff.max()), "rel": float((diff.max(axis=-1) / row_scale(ref)).max()),
            "kl": float(row_kl(ref, got).max()), "top1": float((ref.argmax(-1) == got.argmax(-1)).mean())}


def within(figures: dict[str, float], tol: ParityTolerance) -> bool:
    """Whether one comparison passes (NaN never does)."""
    return bool(figures["rel"] <= tol.rel and figures["kl"] <= tol.kl)


def worst(parity: dict[str, dict[str, float]]) -> dict[str, float]:
    """The worst figure of each kind over a manifest's parity cases (lowest ``top1``, highest the rest)."""
    kinds = {k for figures in parity.values() for k in figures}
    return {k: (min if k == "top1" else max)(f[k] for f in parity.values() if k in f) for k in sorted(kinds)}


def describe(parity: dict[str, dict[str, float]], tolerance: dict[str, float]) -> str:
    """One line: the worst figures and the tolerance they passed (old bundles: max |diff| only)."""
    w = worst(parity)
    if "rel" not in w:
        return f"max |ORT - PyTorch| {w.get('abs', float('nan')):.2e} (tolerance {tolerance.get('abs', 0):g})"
    return (f"vs PyTorch fp32: max rel {w['rel']:.1e}, KL {w['kl']:.1e}, top-1 {w['top1']:.0%} "
            f"(tolerance rel {tolerance['rel']:g}, KL {tolerance['kl']:g})")
