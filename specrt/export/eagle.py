"""EAGLE-3 draft heads: the config and a PyTorch reference forward (the checkpoint folder in the published
layout is :mod:`specrt.export.eagle_checkpoint`).

A head is one decoder layer that reads three of the target's hidden states (fused by ``fc``) next to
the next token's embedding and predicts over a reduced draft vocabulary. The layout, the forward pass
and the tap-layer convention, each with its public source, are in docs/design/eagle3.md; this module
is written from that description. Heads come in EAGLE's flat layout (``LlamaForCausalLMEagle3``, one
layer) or the ``speculators`` format, with the variants its trainer uses, stacked layers included (standard
decoder layers after the first, as vLLM runs them): every variant specrt does not implement is refused
with an :class:`EagleHeadError`, never silently ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from ..errors import ConfigError, EagleHeadError
from .eagle_layers import MidLayer, RMSNorm, StackedLayer, rotary_module

ARCHITECTURE = "LlamaForCausalLMEagle3"
# SafeAILab/SpecForge name it LlamaForCausalLMEagle3, vLLM Eagle3LlamaForCausalLM; EAGLE's own
# training config says LlamaForCausalLM (the weights then tell EAGLE-3 from EAGLE-1/2).
_ARCHITECTURES = {ARCHITECTURE, "Eagle3LlamaForCausalLM", "LlamaForCausalLM"}
_EAGLE12_ARCHITECTURES = {"EagleLlamaForCausalLM", "LlamaForCausalLMEagle"}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TAP_NORMS = ("none", "joint", "each")
STATIC_ROPES = ("linear", "llama3", "yarn")  # rope scalings whose frequencies do not depend on the length


def tap_layers(num_layers: int) -> tuple[int, int, int]:
    """The default target layers whose hidden states feed ``fc``, in concatenation order.

    Index i is the residual stream ENTERING target layer i (0-based): the output of layer i-1, which
    is Hugging Face's ``output_hidden_states[i]`` (index 0 is the embeddings). For L >= 7 layers this
    is (2, L//2, L-3), what EAGLE, vLLM and SGLang capture by default. Below 7 those collide (L = 6
    gives 2, 3, 3) and the published engines would gather fewer than three states, so specrt uses
    (1, L//2, L-1) for 4 <= L <= 6 and refuses smaller targets. A head trained for such a target must
    record its taps explicitly (``Eagle3Config.taps``). This is the one place the rule lives.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int):
        raise EagleHeadError(f"the target's layer count must be an integer, got {num_layers!r}")
    if num_layers >= 7:
        return (2, num_layers // 2, num_layers - 3)
    if num_layers >= 4:
        return (1, num_layers // 2, num_layers - 1)
    raise EagleHeadError(f"an EAGLE-3 head taps three distinct target layers; a target of {num_layers} "
                         "layer(s) has too few (need at least 4)")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EagleHeadError(f"EAGLE-3 config: {name} must be a positive integer, got {value!r}")


def _flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise EagleHeadError(f"EAGLE-3 config: {name} must be true or false, got {value!r}")


def _positive_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise EagleHeadError(f"EAGLE-3 config: {name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class Eagle3Config:
    """The head's shape. ``None`` fields take the published defaults in ``__post_init__``."""

    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int | None = None  # defaults to vocab_size (no reduced vocabulary)
    num_key_value_heads: int | None = None  # defaults to num_attention_heads
    head_dim: int | None = None  # defaults to hidden_size // num_attention_heads
    target_hidden_size: int | None = None  # defaults to hidden_size; fc takes 3 * this
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0  # the head's own rope, not the target's (see the design doc)
    # a static rope scaling (STATIC_ROPES: its "rope_type" and parameters, as transformers reads them), or None
    rope_scaling: dict | None = field(default=None, hash=False)
    max_position_embeddings: int = 2048
    norm_before_residual: bool = False  # vLLM's variant: the residual is hidden_norm(features)
    taps: tuple[int, int, int] | None = None  # explicit tap layers (entering-layer convention)
    # speculators-format variants (docs/design/eagle3.md, "The speculators format"): an RMSNorm on the taps
    # before fc, over the 3*H_t concat ("joint", its norm_before_fc) or per tap ("each", its fc_norm); and the
    # final norm's output fed to the next step instead of the pre-norm state (its norm_output, "EAGLE 3.1")
    tap_norm: str = "none"
    feed_normed: bool = False
    sliding_window: int | None = None  # the head attends keys less than this many positions back (speculators)
    qk_norm: bool = False  # a Qwen3-style layer: an RMSNorm over each query and key head before rope (speculators)
    # decoder layers: the EAGLE-3 layer (midlayer), then num_layers - 1 standard ones reading its H-wide output
    # (speculators' num_hidden_layers, weights layers.1.* ...); every layer shares the rope, mask and window
    num_layers: int = 1

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
                     "max_position_embeddings", "num_layers"):
            _positive_int(name, getattr(self, name))
        fill = object.__setattr__  # frozen: defaults are filled once, here
        if self.draft_vocab_size is None:
            fill(self, "draft_vocab_size", self.vocab_size)
        if self.num_key_value_heads is None:
            fill(self, "num_key_value_heads", self.num_attention_heads)
        if self.target_hidden_size is None:
            fill(self, "target_hidden_size", self.hidden_size)
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise EagleHeadError(f"EAGLE-3 config: hidden_size {self.hidden_size} is not divisible by "
                                     f"num_attention_heads {self.num_attention_heads}; set head_dim")
            fill(self, "head_dim", self.hidden_size // self.num_attention_heads)
        for name in ("draft_vocab_size", "num_key_value_heads", "target_hidden_size", "head_dim"):
            _positive_int(name, getattr(self, name))
        if self.draft_vocab_size > self.vocab_size:
            raise EagleHeadError(f"EAGLE-3 config: draft_vocab_size {self.draft_vocab_size} is larger than "
                                 f"vocab_size {self.vocab_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise EagleHeadError(f"EAGLE-3 config: num_attention_heads {self.num_attention_heads} is not a "
                                 f"multiple of num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise EagleHeadError(f"EAGLE-3 config: head_dim {self.head_dim} must be even for rotary embeddings")
        _positive_float("rms_norm_eps", self.rms_norm_eps)
        _positive_float("rope_theta", self.rope_theta)
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type") if isinstance(self.rope_scaling, dict) else None
            if kind not in STATIC_ROPES:
                raise EagleHeadError(f"EAGLE-3 config: rope type {kind!r} is not supported (default, "
                                     f"{', '.join(STATIC_ROPES)}: frequencies that do not change with the length)")
            _positive_float("rope scaling factor", self.rope_scaling.get("factor"))
        for name in ("norm_before_residual", "feed_normed", "qk_norm"):
            _flag(name, getattr(self, name))
        if self.tap_norm not in TAP_NORMS:
            raise EagleHeadError(f"EAGLE-3 config: tap_norm must be one of {', '.join(TAP_NORMS)}, "
                                 f"got {self.tap_norm!r}")
        if self.sliding_window is not None:
            _positive_int("sliding_window", self.sliding_window)
        if self.taps is not None:
            taps = tuple(self.taps)
            if (len(taps) != 3 or any(isinstance(t, bool) or not isinstance(t, int) for t in taps)
                    or taps[0] < 1 or not taps[0] < taps[1] < taps[2]):
                raise EagleHeadError("EAGLE-3 config: tap layers must be three strictly increasing layer "
                                     f"indices >= 1, got {list(self.taps)}")
            fill(self, "taps", taps)

    def tap_layers_for(self, num_layers: int) -> tuple[int, int, int]:
        """The taps to read from a target of ``num_layers`` layers: the explicit ones, else the default."""
        if self.taps is None:
            return tap_layers(num_layers)
        if self.taps[-1] > num_layers - 1:
            raise EagleHeadError(f"the head taps target layer {self.taps[-1]} but the target has only "
                                 f"{num_layers} layers: it was made for another target")
        return self.taps

    @property
    def variants(self) -> tuple[str, ...]:
        """The variants of EAGLE-3 as EAGLE publishes it that this head uses (speculators', vLLM's, SpecForge's)."""
        return tuple(name for name, on in ((f"tap_norm={self.tap_norm}", self.tap_norm != "none"),
                                           ("feed_normed", self.feed_normed),
                                           (f"sliding_window={self.sliding_window}", self.sliding_window),
                                           ("qk_norm", self.qk_norm),
                                           (f"layers={self.num_layers}", self.num_layers > 1)) if on)

    @classmethod
    def from_json(cls, d: dict) -> Eagle3Config:
        """From a published head's ``config.json``: the flat Llama-style config EAGLE, SpecForge and vLLM
        use, or the ``speculators`` format (:mod:`specrt.export.eagle_speculators`)."""
        if not isinstance(d, dict):
            raise EagleHeadError(f"EAGLE-3 config must be a JSON object, got {type(d).__name__}")
        if "speculators_model_type" in d:
            from .eagle_speculators import config_fields

            return cls(**config_fields(d))
        archs = d.get("architectures") or []
        if not isinstance(archs, list):
            raise EagleHeadError(f"EAGLE-3 config: architectures must be a list, got {archs!r}")
        if any(a in _EAGLE12_ARCHITECTURES for a in archs):
            raise EagleHeadError(f"architecture {archs[0]} is an EAGLE-1/2 head; specrt reads EAGLE-3 heads only")
        if archs and not any(a in _ARCHITECTURES for a in archs):
            raise EagleHeadError(f"architecture {archs[0]} is not an EAGLE-3 Llama head (expected {ARCHITECTURE})")
        if d.get("model_type", "llama") != "llama":
            raise EagleHeadError(f"EAGLE-3 config: model_type {d['model_type']!r} is not supported (llama only)")
        for name in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
            if d.get(name) is None:
                raise EagleHeadError(f"EAGLE-3 config has no {name}")
        if d.get("num_hidden_layers", 1) != 1:
            raise EagleHeadError(f"EAGLE-3 config: num_hidden_layers is {d['num_hidden_layers']}; the flat layout "
                                 "holds one layer (midlayer): specrt reads stacked heads in the speculators format")
        if d.get("hidden_act", "silu") != "silu":
            raise EagleHeadError(f"EAGLE-3 config: hidden_act {d['hidden_act']!r} is not supported (silu only)")
        # variants that change the weights or the forward: refused, not ignored
        for name in ("attention_bias", "mlp_bias", "use_sliding_window"):
            if d.get(name):
                raise EagleHeadError(f"EAGLE-3 config: {name} is set; that variant is not supported")
        # SpecForge's norm_output (default true) is whether the LM head reads norm(h); false has no final norm
        if d.get("norm_output", True) is not True:
            raise EagleHeadError("EAGLE-3 config: norm_output is false; that variant is not supported")
        eagle_config = d.get("eagle_config") or {}
        if not isinstance(eagle_config, dict):
            raise EagleHeadError(f"EAGLE-3 config: eagle_config must be an object, got {eagle_config!r}")
        if eagle_config.get("use_aux_hidden_state", True) is not True:
            raise EagleHeadError("EAGLE-3 config: eagle_config.use_aux_hidden_state is false (a head without "
                                 "fc); not supported")
        return cls(hidden_size=d["hidden_size"], num_attention_heads=d["num_attention_heads"],
                   intermediate_size=d["intermediate_size"], vocab_size=d["vocab_size"],
                   draft_vocab_size=d.get("draft_vocab_size"), num_key_value_heads=d.get("num_key_value_heads"),
                   head_dim=d.get("head_dim"), target_hidden_size=d.get("target_hidden_size"),
                   rms_norm_eps=d.get("rms_norm_eps", 1e-6), **_rope(d),
                   max_position_embeddings=d.get("max_position_embeddings", 2048),
                   norm_before_residual=d.get("norm_before_residual", False), taps=_taps(d, eagle_config),
                   tap_norm=_flat_tap_norm(d, eagle_config))

    def to_json(self, torch_dtype: str = "float32") -> dict:
        """The published layout's ``config.json``. ``target_hidden_size`` is written only when it differs
        from ``hidden_size``: EAGLE skips loading the target's embedding whenever the key is present."""
        unwritable = [v for v in self.variants if not v.startswith("tap_norm")]
        if unwritable:
            raise EagleHeadError(f"the flat EAGLE-3 layout has no fields for {', '.join(unwritable)} "
                                 "(speculators-format variants); specrt writes the standard head only")
        d: dict[str, Any] = {
            "architectures": [ARCHITECTURE], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "num_hidden_layers": 1, "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings, "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size, "tie_word_embeddings": False, "pretraining_tp": 1,
            "torch_dtype": torch_dtype,
        }
        if self.target_hidden_size != self.hidden_size:
            d["target_hidden_size"] = self.target_hidden_size
        if self.norm_before_residual:
            d["norm_before_residual"] = True
        if self.tap_norm != "none":  # vLLM's and SpecForge's names, read back by from_json
            d["norm_before_fc" if self.tap_norm == "joint" else "fc_norm"] = True
        if self.taps is not None:
            # both conventions, so vLLM (top level, entering layer i) and SGLang/SpecForge (nested,
            # output of layer i) each read the same layers
            d["eagle_aux_hidden_state_layer_ids"] = list(self.taps)
            d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [t - 1 for t in self.taps],
                                 "use_aux_hidden_state": True}
        return d


def _rope(d: dict) -> dict:
    """``rope_theta`` and ``rope_scaling`` from a config: transformers 5 writes ``rope_parameters``, older
    configs ``rope_theta`` and ``rope_scaling``. Static scalings only (linear, llama3, yarn: what vLLM applies
    to a head's rope from its config); "dynamic" and "longrope" change with the length and are refused."""
    params = d.get("rope_parameters")
    scaling = None
    for source in (d.get("rope_scaling"), params):
        if source is None:
            continue
        if not isinstance(source, dict):
            raise EagleHeadError(f"EAGLE-3 config: rope settings must be an object, got {source!r}")
        kind = source.get("rope_type", source.get("type", "default"))
        if kind == "default":
            continue
        found = {"rope_type": kind, **{k: v for k, v in source.items() if k not in ("rope_type", "type", "rope_theta")}}
        if kind not in STATIC_ROPES:
            raise EagleHeadError(f"EAGLE-3 config: rope type {kind!r} is not supported (default, "
                                 f"{', '.join(STATIC_ROPES)})")
        if scaling is not None and found != scaling:
            raise EagleHeadError("EAGLE-3 config: rope_scaling and rope_parameters disagree")
        scaling = found
    theta = d.get("rope_theta")
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    # absent: HF Llama's default, what EAGLE and vLLM use
    return {"rope_theta": 10000.0 if theta is None else theta, "rope_scaling": scaling}


def _flat_tap_norm(d: dict, eagle_config: dict) -> str:
    """A norm on the taps before fc in the flat layout, named as vLLM and SpecForge name it: ``norm_before_fc``
    (top level, or in NVIDIA's ``eagle_config``; weight ``input_norm``) and ``fc_norm`` (``fc_norm.0-2``)."""
    joint = bool(d.get("norm_before_fc") or eagle_config.get("norm_before_fc"))
    each = bool(d.get("fc_norm"))
    if joint and each:
        raise EagleHeadError("EAGLE-3 config: norm_before_fc and fc_norm are both set (they exclude each other)")
    return "joint" if joint else "each" if each else "none"


def _taps(d: dict, eagle_config: dict) -> tuple[int, ...] | None:
    top = d.get("eagle_aux_hidden_state_layer_ids")  # vLLM: entering-layer indices, used as is
    nested = eagle_config.get("eagle_aux_hidden_state_layer_ids")  # SGLang/SpecForge: layer outputs
    for name, ids in (("eagle_aux_hidden_state_layer_ids", top), ("eagle_config.eagle_aux_hidden_state_layer_ids",
                                                                   nested)):
        if ids is not None and (not isinstance(ids, list)
                                or any(isinstance(i, bool) or not isinstance(i, int) for i in ids)):
            raise EagleHeadError(f"EAGLE-3 config: {name} must be a list of integers, got {ids!r}")
    from_nested = None if nested is None else tuple(i + 1 for i in nested)
    if top is not None and from_nested is not None and tuple(top) != from_nested:
        raise EagleHeadError(f"EAGLE-3 config: eagle_aux_hidden_state_layer_ids {top} (entering layer i) and "
                             f"eagle_config's {nested} (output of layer i) name different layers")
    return tuple(top) if top is not None else from_nested


# ---------------------------------------------------------------------------------------------------
# The reference module (its layers: eagle_layers.py). Parameter names are the published checkpoint's keys.


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
            from .architectures import window_mask

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
