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


def additive_mask(mask: torch.Tensor) -> torch.Tensor:
    """Boolean mask (True = attend) → fp32 additive mask. The most negative finite value keeps fully
    masked rows NaN-free; made on the mask's device (a CPU tensor here broke every CUDA forward of the
    torch backend)."""
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(
        ~mask, torch.finfo(torch.float32).min)


class DecoderAdapter(ABC):
    """A causal LM seen as embed → layers → final norm → LM head, each step explicit.

    ``fused``: write the layers with one node per rotary embedding, attention, RMS norm and packed
    projection (:mod:`.fused_ops`, ONNX opset 23) instead of their plain spelling; ``positions`` bounds
    the position ids a fused graph accepts (its rotary tables have that many rows).
    """

    supports_fused = False

    def __init__(self, model: nn.Module, fused: bool = False, positions: int | None = None) -> None:
        if fused and not self.supports_fused:
            raise UnsupportedArchitectureError(
                f"{type(self).__name__} has no fused graph; export it with --graph portable")
        self.model = model
        self.fused = fused

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


def _pack(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several Linears reading the same input; the Linears are re-pointed at
    views of it, so packing adds no copy of the weights and Hugging Face's forward still sees the same values."""
    weight = torch.cat([m.weight.detach() for m in linears])
    bias = torch.cat([m.bias.detach() for m in linears]) if linears[0].bias is not None else None
    start = 0
    for m in linears:
        n = m.out_features
        m.weight = nn.Parameter(weight[start:start + n], requires_grad=False)
        if bias is not None:
            m.bias = nn.Parameter(bias[start:start + n], requires_grad=False)
        start += n
    return weight, bias


def _rms_norm(norm: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """Llama-style RMSNorm as ``F.rms_norm`` (one RMSNormalization node at opset 23; fp32 statistics)."""
    return nn.functional.rms_norm(h, (h.shape[-1],), norm.weight, norm.variance_epsilon)


@register("llama", "mistral", "qwen2")
class RotaryDecoderAdapter(DecoderAdapter):
    """Llama-family blocks: pre-norm, rotary q/k, GQA, gated MLP (Qwen2 adds q/k/v biases in its Linears)."""

    supports_fused = True

    def __init__(self, model: nn.Module, fused: bool = False, positions: int | None = None) -> None:
        super().__init__(model, fused, positions)
        act = getattr(model.config, "hidden_act", "silu")
        if fused and act not in ("silu", "swish"):
            raise UnsupportedArchitectureError(f"the fused graph has a SiLU-gated MLP, this model uses {act!r}; "
                                               "export it with --graph portable")
        if fused:
            self._packed = [(_pack([b.self_attn.q_proj, b.self_attn.k_proj, b.self_attn.v_proj]),
                             _pack([b.mlp.gate_proj, b.mlp.up_proj])) for b in self.layers()]
            self._rotary_tables = self._tables(positions or self.max_positions(model.config))

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

    def _tables(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Model's own cos/sin (any rope scaling it applies) for every position: (positions, D/2) each."""
        emb = self.model.model.embed_tokens.weight
        cos, sin = self.model.model.rotary_emb(emb[:1].unsqueeze(0), torch.arange(positions).unsqueeze(0))
        half = cos.shape[-1] // 2  # rotate_half layout: the two halves repeat the same frequencies
        return cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()

    def position_context(self, h: torch.Tensor, position_ids: torch.Tensor) -> object:
        if self.fused:
            return position_ids
        cos, sin = self.model.model.rotary_emb(h, position_ids)  # (B, Q, D)
        return cos.unsqueeze(2), sin.unsqueeze(2)  # broadcast over the head axis of (B, Q, H, D)

    def layers(self) -> list[nn.Module]:
        return list(self.model.model.layers)

    def layer(self, index, h, pos, past_k, past_v, mask_add):
        if self.fused:
            return self._fused_layer(index, h, pos, past_k, past_v, mask_add)
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

    def _fused_layer(self, index, h, position_ids, past_k, past_v, mask):
        from .fused_ops import attention, rotary

        blk = self.model.model.layers[index]
        (qkv_w, qkv_b), (gate_up_w, _) = self._packed[index]
        dims = self.dims()
        b, q_len, _ = h.shape
        kv_width = dims.num_kv_heads * dims.head_dim
        q, k, v = nn.functional.linear(_rms_norm(blk.input_layernorm, h), qkv_w, qkv_b).split(
            [dims.num_heads * dims.head_dim, kv_width, kv_width], dim=-1)
        cos, sin = self._rotary_tables
        q = rotary(q, position_ids, cos, sin, dims.num_heads)
        k = rotary(k, position_ids, cos, sin, dims.num_kv_heads)
        keys = torch.cat([past_k.reshape(b, -1, kv_width), k], dim=1)
        values = torch.cat([past_v.reshape(b, -1, kv_width), v], dim=1)
        out = attention(q, keys, values, mask, blk.self_attn.scaling, dims.num_heads, dims.num_kv_heads)
        h = h + blk.self_attn.o_proj(out)
        gate, up = nn.functional.linear(_rms_norm(blk.post_attention_layernorm, h), gate_up_w).chunk(2, dim=-1)
        h = h + blk.mlp.down_proj(nn.functional.silu(gate) * up)
        return h, k.view(b, q_len, dims.num_kv_heads, dims.head_dim), v.view(b, q_len, dims.num_kv_heads, dims.head_dim)

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return _rms_norm(self.model.model.norm, h) if self.fused else self.model.model.norm(h)


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
        # A fused graph's attention node takes the boolean mask as it is.
        mask_add = attention_mask if a.fused else additive_mask(attention_mask)
        h = a.embed(input_ids, position_ids)
        pos = a.position_context(h, position_ids)
        new: list[torch.Tensor] = []
        for i in range(self.num_layers):
            h, k, v = a.layer(i, h, pos, past[2 * i], past[2 * i + 1], mask_add)
            new += [k, v]
        hidden = a.final_norm(h)
        logits = a.lm_head(hidden).float()
        return (logits, hidden, *new)
