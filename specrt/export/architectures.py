"""Per-architecture adapters: run a Hugging Face model's own submodules with explicit KV inputs/outputs.

Each adapter registers the ``model_type`` strings it handles (``@register``); the exporter looks the
config's ``model_type`` up here and never guesses from names or paths. Adding an architecture means
one class here and one tiny config in ``tests/models.py`` (a registry test enforces the latter).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import torch
from torch import nn

from ..contract import ModelDims
from ..errors import UnsupportedArchitectureError

_REGISTRY: dict[str, type["DecoderAdapter"]] = {}


def register(*model_types: str) -> Callable[[type["DecoderAdapter"]], type["DecoderAdapter"]]:
    def deco(cls: type[DecoderAdapter]) -> type[DecoderAdapter]:
        for t in model_types:
            _REGISTRY[t] = cls
        return cls

    return deco


def supported_model_types() -> list[str]:
    return sorted(_REGISTRY)


def adapter_for(model_type: str) -> type["DecoderAdapter"]:
    try:
        return _REGISTRY[model_type]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"architecture {model_type!r} is not supported; supported: {', '.join(supported_model_types())}"
        ) from None


def attend(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, past_k: torch.Tensor,
           past_v: torch.Tensor, mask_add: torch.Tensor, scale: float) -> torch.Tensor:
    """Grouped-query attention over past + new keys with an arbitrary (tree) additive mask.

    q (B, Q, H, D); k_new/v_new (B, Q, Hkv, D); past (B, P, Hkv, D); mask_add (B, 1, Q, P+Q).
    Returns (B, Q, H*D). Query heads are grouped per KV head instead of repeating K/V, so GQA costs
    no copy of the cache.
    """
    b, q_len, n_heads, d = q.shape
    n_kv = k_new.shape[2]
    groups = n_heads // n_kv
    k = torch.cat([past_k, k_new], dim=1).transpose(1, 2)  # (B, Hkv, S, D)
    v = torch.cat([past_v, v_new], dim=1).transpose(1, 2)
    qg = q.transpose(1, 2).reshape(b, n_kv, groups * q_len, d)  # head h = kv * groups + j
    scores = torch.matmul(qg, k.transpose(2, 3)).float() * scale  # (B, Hkv, g*Q, S)
    scores = scores.reshape(b, n_kv, groups, q_len, -1) + mask_add.unsqueeze(2)
    probs = torch.softmax(scores, dim=-1).to(v.dtype).reshape(b, n_kv, groups * q_len, -1)
    out = torch.matmul(probs, v)  # (B, Hkv, g*Q, D)
    return out.reshape(b, n_heads, q_len, d).transpose(1, 2).reshape(b, q_len, n_heads * d)


class DecoderAdapter(ABC):
    """A causal LM seen as embed → layers → final norm → LM head, each step explicit."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @abstractmethod
    def dims(self) -> ModelDims: ...

    @staticmethod
    @abstractmethod
    def max_positions(config) -> int:
        """Positions a model of this config was built for (learned table size or sliding window)."""

    @abstractmethod
    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor: ...

    def position_context(self, h: torch.Tensor, position_ids: torch.Tensor) -> object:
        """Per-call positional state shared by all layers (rotary cos/sin); None when unused."""
        return None

    @abstractmethod
    def layers(self) -> list[nn.Module]: ...

    @abstractmethod
    def layer(self, index: int, h: torch.Tensor, pos: object, past_k: torch.Tensor, past_v: torch.Tensor,
              mask_add: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One block: returns (h, new_k, new_v) with new_k/new_v of shape (B, Q, Hkv, D)."""

    @abstractmethod
    def final_norm(self, h: torch.Tensor) -> torch.Tensor: ...

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@register("llama", "mistral", "qwen2")
class RotaryDecoderAdapter(DecoderAdapter):
    """Llama-family blocks: pre-norm, rotary q/k, GQA, gated MLP (Qwen2 adds q/k/v biases in its Linears)."""

    def dims(self) -> ModelDims:
        c = self.model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return ModelDims(num_layers=c.num_hidden_layers, num_heads=c.num_attention_heads,
                         num_kv_heads=c.num_key_value_heads or c.num_attention_heads, head_dim=head_dim,
                         hidden_size=c.hidden_size, vocab_size=self.model.lm_head.out_features)

    @staticmethod
    def max_positions(c) -> int:
        window = getattr(c, "sliding_window", None)
        if getattr(c, "use_sliding_window", True) is False:
            window = None
        # A sliding window changes attention beyond its width; the contract's full mask would not match.
        return min(c.max_position_embeddings, window) if window else c.max_position_embeddings

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.model.model.embed_tokens(input_ids)

    def position_context(self, h: torch.Tensor, position_ids: torch.Tensor) -> object:
        cos, sin = self.model.model.rotary_emb(h, position_ids)  # (B, Q, D)
        return cos.unsqueeze(2), sin.unsqueeze(2)  # broadcast over the head axis of (B, Q, H, D)

    def layers(self) -> list[nn.Module]:
        return list(self.model.model.layers)

    def layer(self, index, h, pos, past_k, past_v, mask_add):
        blk = self.model.model.layers[index]
        attn = blk.self_attn
        d = self.dims().head_dim
        b, q_len, _ = h.shape
        x = blk.input_layernorm(h)
        q = attn.q_proj(x).view(b, q_len, -1, d)
        k = attn.k_proj(x).view(b, q_len, -1, d)
        v = attn.v_proj(x).view(b, q_len, -1, d)
        cos, sin = pos
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        h = h + attn.o_proj(attend(q, k, v, past_k, past_v, mask_add, attn.scaling))
        h = h + blk.mlp(blk.post_attention_layernorm(h))
        return h, k, v

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.model.norm(h)


@register("gpt2")
class GPT2Adapter(DecoderAdapter):
    """GPT-2: learned absolute positions, fused qkv (Conv1D), LayerNorm, MHA."""

    def dims(self) -> ModelDims:
        c = self.model.config
        return ModelDims(num_layers=c.n_layer, num_heads=c.n_head, num_kv_heads=c.n_head,
                         head_dim=c.n_embd // c.n_head, hidden_size=c.n_embd,
                         vocab_size=self.model.lm_head.out_features)

    @staticmethod
    def max_positions(c) -> int:
        return c.n_positions

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        t = self.model.transformer
        return t.wte(input_ids) + t.wpe(position_ids)

    def layers(self) -> list[nn.Module]:
        return list(self.model.transformer.h)

    def layer(self, index, h, pos, past_k, past_v, mask_add):
        blk = self.model.transformer.h[index]
        attn = blk.attn
        d = self.dims().head_dim
        b, q_len, e = h.shape
        q, k, v = attn.c_attn(blk.ln_1(h)).split(e, dim=2)
        q, k, v = (t.view(b, q_len, -1, d) for t in (q, k, v))
        scale = attn.scaling / (index + 1) if attn.scale_attn_by_inverse_layer_idx else attn.scaling
        h = h + attn.c_proj(attend(q, k, v, past_k, past_v, mask_add, scale))
        h = h + blk.mlp(blk.ln_2(h))
        return h, k, v

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.transformer.ln_f(h)


class DecoderWrapper(nn.Module):
    """The exported graph: explicit ids/positions/mask/past in, logits/hidden/new K,V out (see contract)."""

    def __init__(self, adapter: DecoderAdapter) -> None:
        super().__init__()
        self.adapter = adapter
        self.model = adapter.model  # registers the parameters with this module
        self.num_layers = adapter.dims().num_layers
        self.eval()  # nn.Module starts in training mode; exporters restore it recursively afterwards

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                past: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        a = self.adapter
        # fp32 additive mask: the most negative finite value keeps fully masked rows NaN-free.
        # Created on the mask's device: a CPU tensor here broke every CUDA forward of the torch backend.
        mask_add = torch.zeros(attention_mask.shape, dtype=torch.float32, device=attention_mask.device).masked_fill(
            ~attention_mask, torch.finfo(torch.float32).min)
        h = a.embed(input_ids, position_ids)
        pos = a.position_context(h, position_ids)
        new: list[torch.Tensor] = []
        for i in range(self.num_layers):
            h, k, v = a.layer(i, h, pos, past[2 * i], past[2 * i + 1], mask_add)
            new += [k, v]
        hidden = a.final_norm(h)
        logits = a.lm_head(hidden).float()
        return (logits, hidden, *new)
