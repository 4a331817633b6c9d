"""EAGLE-3 draft heads: the PyTorch reference forward (its shape is :mod:`.config`; the checkpoint folder in the
published layouts is :mod:`.checkpoint`).

A head is one decoder layer that reads three of the target's hidden states (fused by ``fc``) next to
the next token's embedding and predicts over a reduced draft vocabulary. The layout, the forward pass
and the tap-layer convention, each with its public source, are in docs/design/eagle3.md; this module
is written from that description. Heads come in EAGLE's flat layout (``LlamaForCausalLMEagle3``, one
layer) or the ``speculators`` format, with the variants its trainer uses, stacked layers included (standard
decoder layers after the first, as vLLM runs them): every variant specrt does not implement is refused
with an :class:`EagleHeadError`, never silently ignored.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from ...errors import ConfigError
from .config import Eagle3Config
from .layers import MidLayer, RMSNorm, StackedLayer, rotary_module


class Eagle3Output(NamedTuple):
    logits: torch.Tensor  # [B, T, draft_vocab]
    hidden: torch.Tensor  # [B, T, H], the next step's features: before the final norm (after: feed_normed)
    key: torch.Tensor  # [B, T, kv_heads, head_dim], only the T new positions (rope applied)
    value: torch.Tensor  # [B, T, kv_heads, head_dim]
    rest: tuple = ()  # a stacked head's later layers: ((key, value), ...) as key and value


class Eagle3Head(nn.Module):
    """The EAGLE-3 head. ``forward`` starts from the target's taps; ``step`` from fused features.

    Shapes: taps [B, T, 3*H_t] (the three tapped target states concatenated in ``tap_layers`` order),
    features [B, T, H], embeds [B, T, H] (token embeddings from the target's frozen table, or from
    ``embed_tokens`` when the checkpoint ships one), position_ids [B, T], attention_mask [B, 1, T, P+T]
    additive (0 = attend, large negative = not; a bool mask, True = attend, is converted), past K/V
    [B, P, kv_heads, head_dim] (the seq-major layout of docs/design/contract.md) or None.
    """

    def __init__(self, cfg: Eagle3Config, *, with_embedding: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        if cfg.tap_norm == "joint":  # speculators' names: input_norm over the concat, fc_norm.i per tap
            self.input_norm = RMSNorm(3 * cfg.target_hidden_size, cfg.rms_norm_eps)
        elif cfg.tap_norm == "each":
            self.fc_norm = nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(3))
        self.midlayer = MidLayer(cfg)
        # keyed "1", "2", ...: the checkpoint names them layers.1.*, as speculators does (layers.0 is the midlayer)
        self.layers = nn.ModuleDict({str(i): StackedLayer(cfg) for i in range(1, cfg.num_layers)})
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if with_embedding else None
        # Not registered as a submodule: it has no weights in the checkpoint, and .half() would round
        # its fp32 inverse frequencies (it moves them to the input's device itself).
        object.__setattr__(self, "rotary", rotary_module(cfg))

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """``fc`` over the taps [B, T, 3*H_t] (normalised first where the head's ``tap_norm`` says so)."""
        if taps.shape[-1] != 3 * self.cfg.target_hidden_size:
            raise ConfigError(f"EAGLE-3 taps have width {taps.shape[-1]}, expected 3 x {self.cfg.target_hidden_size}")
        return self.fc(self.norm_taps(taps))

    def norm_taps(self, taps: torch.Tensor, apply: Any = None) -> torch.Tensor:
        """The taps as ``fc`` reads them; ``apply(norm, x)`` runs each RMS norm (default: the module itself; the
        exported graph passes its single-node form)."""
        apply = apply or (lambda norm, x: norm(x))
        if self.cfg.tap_norm == "joint":
            return apply(self.input_norm, taps)
        if self.cfg.tap_norm == "each":
            return torch.cat([apply(norm, t) for norm, t in zip(self.fc_norm, taps.chunk(3, dim=-1))], dim=-1)
        return taps

    def forward(self, taps, embeds, position_ids, attention_mask, past_key=None, past_value=None,
                past_rest=()) -> Eagle3Output:
        """The first step after a target pass: fuse the taps with ``fc``, then run ``step``."""
        return self.step(self.fuse(taps), embeds, position_ids, attention_mask, past_key, past_value, past_rest)

    def step(self, features, embeds, position_ids, attention_mask, past_key=None, past_value=None,
             past_rest=()) -> Eagle3Output:
        """One step from H-wide features: ``fc(taps)``, or a deeper step's previous ``hidden``. ``past_rest``:
        a stacked head's later layers' past ((key, value), ...), as ``Eagle3Output.rest`` gives them."""
        hidden, k, v, rest = self._layers(features, embeds, position_ids, attention_mask, past_key, past_value,
                                          past_rest)
        return Eagle3Output(self.logits(hidden), hidden, k, v, rest)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., D] of ``hidden`` [..., H], a step's fed-back output (before the final
        norm; after it for a ``feed_normed`` head)."""
        return self.lm_head(hidden if self.cfg.feed_normed else self.norm(hidden))

    def layer(self, features, embeds, position_ids, attention_mask, past: tuple = ()) -> tuple[torch.Tensor, tuple]:
        """``step`` without the LM head: (hidden [B, T, H], ((key, value) of each layer, first to last)); ``past``
        the same per layer, or () for none. Training applies :meth:`logits` to the rows it scores only, which at
        a 16k-id draft vocabulary is most of a step's arithmetic."""
        if past and len(past) != self.cfg.num_layers:
            raise ConfigError(f"EAGLE-3 layer: past for {len(past)} layers, the head has {self.cfg.num_layers}")
        first = past[0] if past else (None, None)
        hidden, k, v, rest = self._layers(features, embeds, position_ids, attention_mask, *first, past[1:])
        return hidden, ((k, v), *rest)

    def _layers(self, features, embeds, position_ids, attention_mask, past_key=None, past_value=None, past_rest=()
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple]:
        h = self.cfg.hidden_size
        if features.shape[-1] != h or embeds.shape[-1] != h or features.shape[:2] != embeds.shape[:2]:
            raise ConfigError(f"EAGLE-3 step: features {tuple(features.shape)} and embeds {tuple(embeds.shape)} "
                              f"must both be [B, T, {h}]")
        b, t = features.shape[:2]
        past = 0 if past_key is None else past_key.shape[1]
        if tuple(attention_mask.shape) != (b, 1, t, past + t):
            raise ConfigError(f"EAGLE-3 step: attention_mask is {tuple(attention_mask.shape)}, expected "
                              f"{(b, 1, t, past + t)}")
        if attention_mask.dtype == torch.bool:
            zero = torch.zeros((), dtype=features.dtype, device=features.device)
            attention_mask = torch.where(attention_mask, zero, torch.finfo(features.dtype).min + zero)
        if self.cfg.sliding_window is not None:  # as the target graphs narrow theirs (past slot j: position j)
            from ..graph.attention import window_mask

            near = window_mask(torch.ones_like(attention_mask, dtype=torch.bool), position_ids, past,
                               self.cfg.sliding_window)
            attention_mask = attention_mask.masked_fill(~near, torch.finfo(attention_mask.dtype).min)
        # every layer has a past or none does: a first layer's cache beside none for the later ones would let them
        # attend to the new rows alone, silently
        if len(past_rest) != (len(self.layers) if past_key is not None else 0):
            raise ConfigError(f"EAGLE-3 step: past for {len(past_rest)} stacked layers, the head has "
                              f"{len(self.layers)}")
        cos, sin = self.rotary(features, position_ids)
        mask = attention_mask.to(features.dtype)
        h, k, v = self.midlayer(embeds, features, cos, sin, mask, past_key, past_value)
        rest = []
        for i, layer in enumerate(self.layers.values()):
            past_k, past_v = past_rest[i] if past_rest else (None, None)
            h, k_i, v_i = layer(h, cos, sin, mask, past_k, past_v)
            rest.append((k_i, v_i))
        return (self.norm(h) if self.cfg.feed_normed else h), k, v, tuple(rest)
