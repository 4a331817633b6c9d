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

from ...bundle.contract import ModelDims
from ...errors import UnsupportedArchitectureError
from .attention import additive_mask, attend, rotate_half, window_mask

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


class DecoderAdapter(ABC):
    """A causal LM seen as embed → layers → final norm → LM head, each step explicit.

    ``fused``: write the layers with one node per rotary embedding, attention, RMS norm and packed
    projection (:mod:`.fused_ops`, ONNX opset 23) instead of their plain spelling; ``positions`` bounds
    the position ids the graph accepts (its rotary tables have that many rows).
    """

    supports_fused = False

    def __init__(self, model: nn.Module, fused: bool = False, positions: int | None = None) -> None:
        if fused and not self.fused_supported(model.config):
            raise UnsupportedArchitectureError(
                f"{type(self).__name__} has no fused graph for this model; export it with --graph portable")
        self.model = model
        self.fused = fused

    @classmethod
    def fused_supported(cls, config) -> bool:
        """Whether a model of this config has a fused graph (``--graph auto`` picks it when it does)."""
        return cls.supports_fused

    @classmethod
    def check_config(cls, config) -> None:
        """Refuse, in one line naming it, a feature of this config the adapter does not implement."""

    @abstractmethod
    def dims(self) -> ModelDims: ...

    @staticmethod
    @abstractmethod
    def max_positions(config) -> int:
        """Positions a model of this config was built for (learned table size, rope limits)."""

    @abstractmethod
    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor: ...

    def position_context(self, h: torch.Tensor, position_ids: torch.Tensor) -> object:
        """Per-call positional state shared by all layers (rotary cos/sin); None when unused."""
        return None

    def window(self, index: int) -> int | None:
        """Layer ``index``'s sliding attention window (a query attends keys less than this many positions
        back), or None for full attention."""
        return None

    def masks(self, mask: torch.Tensor, position_ids: torch.Tensor, past_len) -> dict[int | None, torch.Tensor]:
        """The mask each kind of layer uses, keyed by window: the contract's mask, narrowed to the window
        for sliding layers (past slot j holds position j, see the contract), additive unless fused."""
        out = {}
        for w in {self.window(i) for i in range(len(self.layers()))}:
            m = mask if w is None else window_mask(mask, position_ids, past_len, w)
            out[w] = m if self.fused else additive_mask(m)
        return out

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


def _rope_parameters(config) -> dict:
    """The config's rope settings (transformers 5 ``rope_parameters``, older ``rope_scaling``); Gemma 3
    keys them by layer type, every other family has one dict."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return rope if all(isinstance(v, dict) for v in rope.values()) and rope else {"": rope}


@register("llama", "mistral", "qwen2", "qwen3", "phi3")
class RotaryDecoderAdapter(DecoderAdapter):
    """Llama-family blocks: pre-norm, rotary q/k, GQA, gated MLP. Qwen2 adds q/k/v biases (in its
    Linears), Qwen3 an RMS norm on each query/key head, Phi-3 packs q|k|v and gate|up in one Linear each.

    Rotary cos/sin come from the model's own ``rotary_emb`` for every position once, as tables the
    graph gathers from: whatever rope scaling the checkpoint uses (llama3, yarn, linear) is then
    exactly Hugging Face's. Scalings that change with the sequence length ("dynamic", "longrope") stay
    exact only up to their original context, so :meth:`max_positions` stops there.
    """

    supports_fused = True
    norm_offset = 0.0  # Gemma's RMS norm scales by (1 + weight)
    sandwich_norms = False  # Gemma: a norm after attention and after the MLP too

    def __init__(self, model: nn.Module, fused: bool = False, positions: int | None = None) -> None:
        self.check_config(model.config)
        super().__init__(model, fused, positions)
        # Fixed per model; the torch backend runs forward every step, so read once here.
        self._windows = [self._layer_window(i) for i in range(len(self.layers()))]
        self._layer_types = [self._rotary_kind(i) for i in range(len(self.layers()))]
        self._tables = self._rotary_tables(positions or self.max_positions(model.config))
        if fused:
            self._packed = [(self._pack_qkv(b.self_attn), self._pack_gate_up(b.mlp)) for b in self.layers()]

    @classmethod
    def fused_supported(cls, config) -> bool:
        # ONNX RotaryEmbedding could rotate part of a head, but nothing here tests it yet.
        return all(r.get("partial_rotary_factor", 1.0) == 1.0 for r in _rope_parameters(config).values()) and \
            getattr(config, "partial_rotary_factor", 1.0) == 1.0

    @classmethod
    def check_config(cls, config) -> None:
        for key in ("use_bidirectional_attention", "attention_chunk_size"):
            if getattr(config, key, None):
                raise UnsupportedArchitectureError(f"{config.model_type} with {key}={getattr(config, key)!r} is "
                                                   "not supported: the contract's attention is causal over the whole past")

    def dims(self) -> ModelDims:
        c = self.model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return ModelDims(num_layers=c.num_hidden_layers, num_heads=c.num_attention_heads,
                         num_kv_heads=c.num_key_value_heads or c.num_attention_heads, head_dim=head_dim,
                         hidden_size=c.hidden_size, vocab_size=self.model.lm_head.out_features)

    @staticmethod
    def max_positions(c) -> int:
        limit = c.max_position_embeddings
        for rope in _rope_parameters(c).values():
            if rope.get("rope_type", rope.get("type")) in ("dynamic", "longrope"):
                original = rope.get("original_max_position_embeddings") or getattr(
                    c, "original_max_position_embeddings", None) or limit
                limit = min(limit, original)
        return limit

    def window(self, index: int) -> int | None:
        return self._windows[index]

    def _layer_window(self, index: int) -> int | None:
        # Qwen2/3 and Gemma mark each layer's window on its attention; Mistral and Phi-3 slide on every layer.
        attn = self.model.model.layers[index].self_attn
        c = self.model.config
        w = attn.sliding_window if hasattr(attn, "sliding_window") else getattr(c, "sliding_window", None)
        return w if w and w < self.max_positions(c) else None

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.model.model.embed_tokens(input_ids)  # Gemma's embedding applies its √hidden scale itself

    def _rotary_kind(self, index: int) -> str | None:
        types = getattr(self.model.config, "layer_types", None)
        rotary = self.model.model.rotary_emb
        # Gemma 3 has one rotary base per layer type (local / global); everyone else one for all layers.
        return types[index] if types and isinstance(getattr(rotary, "rope_type", None), dict) else None

    def _rotary_tables(self, positions: int) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
        """Model's own cos/sin per layer type: (positions, R/2) each, R the rotated width of a head."""
        emb = self.model.model.embed_tokens.weight
        x, pos = emb[:1].unsqueeze(0), torch.arange(positions, device=emb.device).unsqueeze(0)
        out = {}
        for kind in set(self._layer_types):
            kw = {"layer_type": kind} if kind is not None else {}
            with torch.no_grad():
                cos, sin = self.model.model.rotary_emb(x, pos, **kw)
            half = cos.shape[-1] // 2  # rotate_half layout: the two halves repeat the same frequencies
            out[kind] = cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()
        return out

    def position_context(self, h: torch.Tensor, position_ids: torch.Tensor) -> object:
        if self.fused:
            return position_ids
        # (B, Q, 1, R) per layer type: broadcast over the head axis of (B, Q, H, D)
        return {kind: tuple(t[position_ids].repeat(1, 1, 2).unsqueeze(2) for t in table)
                for kind, table in self._tables.items()}

    def layers(self) -> list[nn.Module]:
        return list(self.model.model.layers)

    def _norm(self, norm: nn.Module, h: torch.Tensor) -> torch.Tensor:
        """RMS norm as ``F.rms_norm`` in the fused graph (one RMSNormalization node at opset 23), as the
        model's own module in the portable one."""
        if not self.fused:
            return norm(h)
        eps = getattr(norm, "variance_epsilon", None) or norm.eps
        weight = norm.weight + self.norm_offset if self.norm_offset else norm.weight
        return nn.functional.rms_norm(h, (h.shape[-1],), weight, eps)

    def _head_norms(self, attn: nn.Module, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Qwen3 / Gemma 3: RMS norm over each head of q and k, before rotary. q/k (B, Q, heads, D)."""
        if not hasattr(attn, "q_norm"):
            return q, k
        return self._norm(attn.q_norm, q), self._norm(attn.k_norm, k)

    @staticmethod
    def _qkv(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if hasattr(attn, "qkv_proj"):  # Phi-3: one Linear, q then k then v
            kv = attn.num_key_value_heads * attn.head_dim
            return attn.qkv_proj(x).split([attn.qkv_proj.out_features - 2 * kv, kv, kv], dim=-1)
        return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)

    @staticmethod
    def _act(mlp: nn.Module) -> nn.Module:
        return getattr(mlp, "act_fn", None) or mlp.activation_fn

    def _softcap(self) -> float | None:
        return getattr(self.model.config, "attn_logit_softcapping", None)

    def layer(self, index, h, pos, past_k, past_v, mask_add):
        if self.fused:
            return self._fused_layer(index, h, pos, past_k, past_v, mask_add)
        blk = self.model.model.layers[index]
        attn = blk.self_attn
        d = self.dims().head_dim
        b, q_len, _ = h.shape
        q, k, v = (t.view(b, q_len, -1, d) for t in self._qkv(attn, blk.input_layernorm(h)))
        q, k = self._head_norms(attn, q, k)
        cos, sin = pos[self._layer_types[index]]
        q, k = (self._rotate(t, cos, sin) for t in (q, k))
        out = attn.o_proj(attend(q, k, v, past_k, past_v, mask_add, attn.scaling, self._softcap()))
        return self._residuals(index, h, out) + (k, v)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = cos.shape[-1]
        if r == x.shape[-1]:
            return x * cos + rotate_half(x) * sin
        rot, keep = x[..., :r], x[..., r:]  # partial rotary (Phi-4-mini): only the first r dims turn
        return torch.cat([rot * cos + rotate_half(rot) * sin, keep], dim=-1)

    def _residuals(self, index: int, h: torch.Tensor, attn_out: torch.Tensor) -> tuple[torch.Tensor]:
        """Attention output and MLP into the residual stream (Gemma normalises each before adding)."""
        blk = self.model.model.layers[index]
        if self.sandwich_norms:
            h = h + self._norm(blk.post_attention_layernorm, attn_out)
            return (h + self._norm(blk.post_feedforward_layernorm,
                                   self._feed_forward(index, self._norm(blk.pre_feedforward_layernorm, h))),)
        h = h + attn_out
        return (h + self._feed_forward(index, self._norm(blk.post_attention_layernorm, h)),)

    def _feed_forward(self, index: int, x: torch.Tensor) -> torch.Tensor:
        blk = self.model.model.layers[index]
        if not self.fused:
            return blk.mlp(x)
        gate_up_w, gate_up_b = self._packed[index][1]
        gate, up = nn.functional.linear(x, gate_up_w, gate_up_b).chunk(2, dim=-1)
        return blk.mlp.down_proj(self._act(blk.mlp)(gate) * up)

    @staticmethod
    def _pack_qkv(attn: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        if hasattr(attn, "qkv_proj"):
            return attn.qkv_proj.weight.detach(), None if attn.qkv_proj.bias is None else attn.qkv_proj.bias.detach()
        return _pack([attn.q_proj, attn.k_proj, attn.v_proj])

    @staticmethod
    def _pack_gate_up(mlp: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        if hasattr(mlp, "gate_up_proj"):  # Phi-3: gate then up, already one Linear
            return mlp.gate_up_proj.weight.detach(), None
        return _pack([mlp.gate_proj, mlp.up_proj])

    def _fused_layer(self, index, h, position_ids, past_k, past_v, mask):
        from .fused_ops import attention, rotary

        blk = self.model.model.layers[index]
        attn = blk.self_attn
        qkv_w, qkv_b = self._packed[index][0]
        dims = self.dims()
        b, q_len, _ = h.shape
        kv_width = dims.num_kv_heads * dims.head_dim
        q, k, v = nn.functional.linear(self._norm(blk.input_layernorm, h), qkv_w, qkv_b).split(
            [dims.num_heads * dims.head_dim, kv_width, kv_width], dim=-1)
        if hasattr(attn, "q_norm"):
            qn, kn = self._head_norms(attn, q.view(b, q_len, dims.num_heads, -1), k.view(b, q_len, dims.num_kv_heads, -1))
            q, k = qn.reshape(b, q_len, -1), kn.reshape(b, q_len, -1)
        cos, sin = self._tables[self._layer_types[index]]
        q = rotary(q, position_ids, cos, sin, dims.num_heads)
        k = rotary(k, position_ids, cos, sin, dims.num_kv_heads)
        keys = torch.cat([past_k.reshape(b, -1, kv_width), k], dim=1)
        values = torch.cat([past_v.reshape(b, -1, kv_width), v], dim=1)
        out = attention(q, keys, values, mask, attn.scaling, dims.num_heads, dims.num_kv_heads, self._softcap() or 0.0)
        return self._residuals(index, h, attn.o_proj(out)) + (
            k.view(b, q_len, dims.num_kv_heads, dims.head_dim), v.view(b, q_len, dims.num_kv_heads, dims.head_dim))

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self._norm(self.model.model.norm, h)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.model.lm_head(hidden)
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        return torch.tanh(logits.float() / cap) * cap if cap else logits


@register("gemma2", "gemma3_text")
class GemmaAdapter(RotaryDecoderAdapter):
    """Gemma 2 / Gemma 3 text: √hidden-scaled embedding, (1 + w) RMS norms around both attention and
    MLP, GELU-tanh MLP, alternating sliding-window / global layers, and soft-capped attention scores and
    final logits (Gemma 2); per-head q/k norms and a separate rotary base for local layers (Gemma 3)."""

    norm_offset = 1.0
    sandwich_norms = True


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
    """The exported graph: explicit ids/positions/mask/past in, logits/hidden/new K,V out (see contract).

    ``taps`` (an EAGLE-3 head's target layers, a DFlash draft's): the graph also outputs ``eagle_taps``, the
    hidden states ENTERING those layers (index i = Hugging Face's ``output_hidden_states[i]``; index L, past the
    last layer, is the final normed state as Hugging Face gives it there) concatenated in that order, in the
    graph's dtype, between ``hidden`` and the new K/V.
    """

    def __init__(self, adapter: DecoderAdapter, taps: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.adapter = adapter
        self.model = adapter.model  # registers the parameters with this module
        self.num_layers = adapter.dims().num_layers
        self.taps = tuple(taps)
        if len(set(self.taps)) != len(self.taps) or any(
                isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= self.num_layers for t in self.taps):
            raise ValueError(f"tap layers must be distinct layer indices in [0, {self.num_layers}], got "
                             f"{list(self.taps)}")
        self.eval()  # nn.Module starts in training mode; exporters restore it recursively afterwards

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                past: tuple[torch.Tensor, ...], logits_index: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """``logits_index``: the rows whose logits to compute (contract.LOGITS_INDEX); None: every row's."""
        a = self.adapter
        # A fused graph's attention node takes the boolean mask as it is; sliding layers get theirs narrowed.
        masks = a.masks(attention_mask, position_ids, past[0].shape[1])
        h = a.embed(input_ids, position_ids)
        pos = a.position_context(h, position_ids)
        new: list[torch.Tensor] = []
        entering: dict[int, torch.Tensor] = {}
        for i in range(self.num_layers):
            if i in self.taps:
                entering[i] = h
            h, k, v = a.layer(i, h, pos, past[2 * i], past[2 * i + 1], masks[a.window(i)])
            new += [k, v]
        hidden = a.final_norm(h)
        entering[self.num_layers] = hidden
        logits = a.lm_head(hidden if logits_index is None else hidden.index_select(1, logits_index)).float()
        if self.taps:
            return (logits, hidden, torch.cat([entering[t] for t in self.taps], dim=-1), *new)
        return (logits, hidden, *new)
