"""Where the limit is: what one pass of each model reads and computes, and what that means per token.

Decoding one token at batch size 1 reads every weight once and the whole KV cache once, and does
about two FLOPs per weight: it is memory-bound, so bytes per generated token divided by the
machine's sustainable bandwidth bounds tokens/s from above (the roofline). Speculation trades more
arithmetic (theory.ops_factor) for fewer passes, so fewer bytes per token.

Per model figures come from the manifest (recorded at export/quantize time, when ``onnx`` is
installed anyway), else from the graph with ``onnx`` if it is importable, else are estimated from the
file size and dtype; ``ModelCost.source`` says which.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bundle.contract import ModelDims

# The per-model costs live with the bundle (export records them); the roofline's callers read them here too.
from ..bundle.files import ModelCost, entry_cost, estimated_cost, file_cost, graph_cost  # noqa: F401
from ..errors import ConfigError


def kv_bytes_per_position(dims: ModelDims, dtype: str) -> int:
    """KV-cache bytes one position holds, read by every later pass: 2 (K and V) · layers · kv heads ·
    head dim · bytes per element."""
    return 2 * dims.num_layers * dims.num_kv_heads * dims.head_dim * np.dtype(dtype).itemsize


def attention_flops_per_token(dims: ModelDims, context: int) -> int:
    """Attention's FLOPs per new token at a context of ``context`` positions: Q·Kᵀ and P·V, each 2 · heads ·
    head dim · context per layer. Not in the graph's matmul count: it grows with the context."""
    if context < 0:
        raise ConfigError(f"context must be >= 0, got {context}")
    return 4 * dims.num_layers * dims.num_heads * dims.head_dim * context


@dataclass(frozen=True)
class PassBytes:
    """Bytes one pass of a model reads: its weights, and its KV cache at the context it runs at."""

    weights: float
    kv: float

    def __post_init__(self) -> None:
        if self.weights < 0 or self.kv < 0:
            raise ValueError(f"bytes must be >= 0, got weights {self.weights}, kv {self.kv}")

    @property
    def total(self) -> float:
        return self.weights + self.kv


def bytes_per_token(tokens: float, target_passes: float, target: PassBytes, draft_passes: float = 0.0,
                    draft: PassBytes | None = None) -> float:
    """(target passes · target bytes + draft passes · draft bytes) / tokens: the memory traffic one
    generated token costs. Plain decoding: one target pass per token."""
    if tokens <= 0:
        raise ValueError(f"tokens must be > 0, got {tokens}")
    if target_passes < 0 or draft_passes < 0:
        raise ValueError(f"passes must be >= 0, got {target_passes}, {draft_passes}")
    if draft_passes and draft is None:
        raise ValueError("draft passes without the draft's bytes")
    return (target_passes * target.total + (draft_passes * draft.total if draft_passes else 0.0)) / tokens


def achieved_gbps(bytes_per_tok: float, tokens_per_second: float) -> float:
    """The bandwidth a method used, in GB/s (1e9 bytes): bytes per token × tokens per second."""
    return bytes_per_tok * tokens_per_second / 1e9


def roofline_tokens_per_second(bandwidth_gbps: float, bytes_per_tok: float) -> float:
    """The most tokens/s a machine with this bandwidth can give when every token reads ``bytes_per_tok``."""
    if bandwidth_gbps <= 0 or bytes_per_tok <= 0:
        raise ValueError(f"bandwidth and bytes per token must be > 0, got {bandwidth_gbps}, {bytes_per_tok}")
    return bandwidth_gbps * 1e9 / bytes_per_tok


def mu(draft: ModelCost, target: ModelCost, draft_dims: ModelDims | None = None,
       target_dims: ModelDims | None = None, context: int = 0) -> float:
    """Draft / target arithmetic operations per token: matmul FLOPs, plus attention at ``context``
    positions where both models' dims are given."""
    d, t = draft.matmul_flops_per_token, target.matmul_flops_per_token
    if context and draft_dims is not None and target_dims is not None:
        d += attention_flops_per_token(draft_dims, context)
        t += attention_flops_per_token(target_dims, context)
    if t <= 0:
        raise ConfigError("the target graph has no matmul with constant weights: cannot compute mu")
    return d / t
