"""Attention primitives every traced graph shares (the decoders of architectures.py, the fused ops' torch
bodies, the EAGLE-3 head's graph): grouped-query attention over a cache with any additive mask, the boolean
contract mask narrowed to a window or turned additive, and rope's half rotation. A leaf: imports torch only."""

from __future__ import annotations

import torch


def attend(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, past_k: torch.Tensor,
           past_v: torch.Tensor, mask_add: torch.Tensor, scale: float, softcap: float | None = None) -> torch.Tensor:
    """Grouped-query attention over past + new keys with an arbitrary (tree) additive mask.

    q (B, Q, H, D); k_new/v_new (B, Q, Hkv, D); past (B, P, Hkv, D); mask_add (B, 1, Q, P+Q).
    Returns (B, Q, H*D). Query heads are grouped per KV head instead of repeating K/V, so GQA costs
    no copy of the cache. ``softcap`` (Gemma 2): scores become softcap·tanh(scores / softcap) before the mask.
    """
    b, q_len, n_heads, d = q.shape
    n_kv = k_new.shape[2]
    groups = n_heads // n_kv
    k = torch.cat([past_k, k_new], dim=1).transpose(1, 2)  # (B, Hkv, S, D)
    v = torch.cat([past_v, v_new], dim=1).transpose(1, 2)
    qg = q.transpose(1, 2).reshape(b, n_kv, groups * q_len, d)  # head h = kv * groups + j
    scores = torch.matmul(qg, k.transpose(2, 3)).float() * scale  # (B, Hkv, g*Q, S)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.reshape(b, n_kv, groups, q_len, -1) + mask_add.unsqueeze(2)
    probs = torch.softmax(scores, dim=-1).to(v.dtype).reshape(b, n_kv, groups * q_len, -1)
    out = torch.matmul(probs, v)  # (B, Hkv, g*Q, D)
    return out.reshape(b, n_heads, q_len, d).transpose(1, 2).reshape(b, q_len, n_heads * d)


def window_mask(mask: torch.Tensor, position_ids: torch.Tensor, past_len, window: int) -> torch.Tensor:
    """The boolean contract mask (B, 1, Q, P+Q) narrowed to a sliding window: a query attends keys less than
    ``window`` positions back (past slot j holds position j, see the contract)."""
    keys = torch.cat([torch.arange(past_len, device=mask.device).unsqueeze(0).expand(position_ids.shape[0], -1),
                      position_ids], dim=1)  # (B, S) position of every key
    return mask & (position_ids.unsqueeze(2) - keys.unsqueeze(1) < window).unsqueeze(1)


def additive_mask(mask: torch.Tensor) -> torch.Tensor:
    """Boolean mask (True = attend) → fp32 additive mask. The most negative finite value keeps fully
    masked rows NaN-free; made on the mask's device (a CPU tensor here broke every CUDA forward of the
    torch backend)."""
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(
        ~mask, torch.finfo(torch.float32).min)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the last dim halves: rope's half-split rotation, as Hugging Face Llama does."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
