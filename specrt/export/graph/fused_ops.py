"""Rotary embedding and grouped-query attention as single ONNX nodes (opset 23), keeping the contract.

The plain graph spells each of them out in ~10-20 small nodes per layer (split, neg, concat, transposes,
a where over the mask); ONNX Runtime's CPU cost per node, not the arithmetic, then decides a small
model's step. These are ``torch.library`` ops whose PyTorch bodies are the reference (what the torch
backend and tracing run) and whose ONNX translations are the standard ``RotaryEmbedding`` and
``Attention`` operators over 3-D (B, S, heads·D) tensors: no transposes, K/V heads grouped, the
boolean tree mask used as it is. The export's parity check compares the result with Hugging Face's own
forward, so a wrong body or translation is refused there.
"""

from __future__ import annotations

import torch

from .attention import additive_mask, attend, rotate_half

FUSED_OPSET = 23  # RotaryEmbedding, Attention and RMSNormalization entered the standard in opset 23


@torch.library.custom_op("specrt::rotary", mutates_args=())
def rotary(x: torch.Tensor, position_ids: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
           num_heads: int) -> torch.Tensor:
    """Half-split ("rotate_half") rotary embedding of x (B, S, heads·D) at position_ids (B, S);
    cos/sin_cache (positions, D/2)."""
    b, s, _ = x.shape
    xh = x.view(b, s, num_heads, -1)
    cos = cos_cache[position_ids].unsqueeze(2).to(x.dtype).repeat(1, 1, 1, 2)  # (B, S, 1, D)
    sin = sin_cache[position_ids].unsqueeze(2).to(x.dtype).repeat(1, 1, 1, 2)
    return (xh * cos + rotate_half(xh) * sin).reshape(b, s, -1)


@rotary.register_fake
def _(x, position_ids, cos_cache, sin_cache, num_heads):
    return torch.empty_like(x)


@torch.library.custom_op("specrt::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
              num_heads: int, kv_heads: int, softcap: float = 0.0) -> torch.Tensor:
    """q (B, Q, H·D); k/v (B, T, Hkv·D) past and new together; mask (B, 1, Q, T) bool, True = attend;
    ``softcap`` > 0 soft-caps the scores (Gemma 2). Returns (B, Q, H·D)."""
    b, q_len, _ = q.shape
    d = q.shape[2] // num_heads
    keys, values = (x.view(b, x.shape[1], kv_heads, d) for x in (k, v))
    # The plain graph's attention with an empty "new" part: k/v already hold past and new together.
    return attend(q.view(b, q_len, num_heads, d), keys[:, :0], values[:, :0], keys, values,
                  additive_mask(mask), scale, softcap or None)


@attention.register_fake
def _(q, k, v, mask, scale, num_heads, kv_heads, softcap=0.0):
    return torch.empty_like(q)


def translation_table() -> dict:
    """``custom_translation_table`` for ``torch.onnx.export(dynamo=True)``: each op to its one ONNX node."""
    from onnxscript import opset23 as op

    def rotary_onnx(x, position_ids, cos_cache, sin_cache, num_heads: int):
        return op.RotaryEmbedding(x, cos_cache, sin_cache, position_ids, num_heads=num_heads)

    def attention_onnx(q, k, v, mask, scale: float, num_heads: int, kv_heads: int, softcap: float = 0.0):
        y, _, _, _ = op.Attention(q, k, v, mask, q_num_heads=num_heads, kv_num_heads=kv_heads, scale=scale,
                                  softcap=softcap)
        return y

    return {torch.ops.specrt.rotary.default: rotary_onnx, torch.ops.specrt.attention.default: attention_onnx}
