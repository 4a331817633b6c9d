"""The EAGLE-3 reference head's building blocks (:class:`specrt.export.eagle.head.Eagle3Head` assembles them):
RMS norm, SwiGLU MLP, rope, attention over a cache, the EAGLE-3 layer (``midlayer``) and a stacked head's
standard later layers. Parameter names are the published checkpoint's keys."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from .config import Eagle3Config


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # statistics in fp32, as HF Llama does, then back to the input dtype
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF Llama's rope on [B, T, heads, d] (rotate-half pairing: i with i + d/2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


class Attention(nn.Module):
    """q, k, v read the first layer's 2H-wide [embedding ‖ features] input (``width`` 2H), or a stacked layer's
    H-wide one; the output is H wide."""

    def __init__(self, cfg: Eagle3Config, width: int) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(width, self.heads * d, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        if cfg.qk_norm:  # Qwen3's attention: each head of q and k normalised, then rotated
            self.q_norm, self.k_norm = RMSNorm(d, cfg.rms_norm_eps), RMSNorm(d, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x, cos, sin, mask, past_key, past_value):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim)
        keys = k if past_key is None else torch.cat([past_key, k], dim=1)
        values = v if past_value is None else torch.cat([past_value, v], dim=1)
        group = self.heads // self.kv_heads  # query head i reads KV head i // group (HF repeat_kv)
        keys, values = keys.repeat_interleave(group, dim=2), values.repeat_interleave(group, dim=2)
        scores = torch.einsum("bqhd,bshd->bhqs", q, keys) / math.sqrt(self.head_dim) + mask
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = torch.einsum("bhqs,bshd->bqhd", probs, values).reshape(b, t, self.heads * self.head_dim)
        return self.o_proj(out), k, v


class MidLayer(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # for the token embedding
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # for the fused features
        self.self_attn = Attention(cfg, 2 * cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, embeds, features, cos, sin, mask, past_key, past_value):
        normed = self.hidden_norm(features)
        # the residual is the H-wide features, not the 2H concat the attention reads
        residual = normed if self.norm_before_residual else features
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # embedding first
        attn, k, v = self.self_attn(x, cos, sin, mask, past_key, past_value)
        h = residual + attn
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


class StackedLayer(nn.Module):
    """A stacked head's later layer: a standard pre-norm Llama (or Qwen3) decoder layer on the H-wide stream, as
    speculators builds ``layers.1`` on (its ``decoder_layer_class``)."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, mask, past_key, past_value):
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, past_key, past_value)
        h = x + attn
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


def rotary_module(cfg: Eagle3Config) -> nn.Module:
    """transformers' own Llama rotary module, built from the head's dimensions and rope (a static scaling
    included: its cos/sin carry yarn's attention factor, as vLLM's and speculators' do)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    llama = LlamaConfig(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
                        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                        intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size, num_hidden_layers=1,
                        rope_theta=float(cfg.rope_theta),
                        rope_scaling=None if cfg.rope_scaling is None else dict(cfg.rope_scaling),
                        max_position_embeddings=cfg.max_position_embeddings)
    return LlamaRotaryEmbedding(config=llama)
