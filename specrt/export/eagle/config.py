"""An EAGLE-3 head's shape (:class:`Eagle3Config`), validated when made, and the tap-layer rule. The published
formats that describe it are read and written elsewhere: EAGLE's flat layout in :mod:`.native`, the
``speculators`` format in :mod:`.speculators`, either from a folder by :func:`.checkpoint.read_config`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ...errors import EagleHeadError

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


def rope_fields(d: dict) -> dict:
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
