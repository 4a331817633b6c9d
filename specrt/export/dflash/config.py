"""A DFlash draft's shape (:class:`DFlashConfig`), read from either published ``config.json``: z-lab's (a Qwen3
config plus ``block_size`` and ``dflash_config``) or the speculators ``dflash`` format (a nested
``transformer_layer_config``); and checked against the target it will run beside (:func:`check_against_target`).
The weights are read in :mod:`.checkpoint`, the draft itself is :mod:`.model`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...bundle import contract as C
from ...errors import DFlashDraftError

MAX_BLOCK = C.MAX_BLOCK  # the longest block specrt drafts (its speculation length is capped at 64 tokens)
EAGLE3_ARCHITECTURES = frozenset({"LlamaForCausalLMEagle3", "Eagle3Speculator"})
# Both formats are Qwen3 configs: an absent field means Qwen3Config's default (transformers fills it so)
QWEN3_HEAD_DIM, QWEN3_EPS, QWEN3_ROPE_THETA, QWEN3_MAX_POSITIONS = 128, 1e-6, 10000.0, 32768
SPECULATORS_BLOCK = 8  # DFlashSpeculatorConfig's default block_size
TARGET_HINT = "it was made for another target; use the DFlash draft published for this target"


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab's ``build_target_layer_ids``, for a config that names no ``target_layer_ids``: one tapped layer per
    draft layer, spread over target layers 1 .. L-3 (L = 36 with 5 draft layers: 1, 9, 17, 25, 33)."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    # Python's round (half to even), as z-lab's code rounds
    return tuple(int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers))


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DFlashDraftError(f"DFlash config: {name} must be a positive integer, got {value!r}; fix config.json")


def _positive_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise DFlashDraftError(f"DFlash config: {name} must be a positive number, got {value!r}; fix config.json")


def _int_list(value: Any, name: str, source: str) -> tuple[int, ...]:
    if (not isinstance(value, (list, tuple)) or not value
            or any(isinstance(i, bool) or not isinstance(i, int) for i in value)):
        raise DFlashDraftError(f"{source}: {name} must be a non-empty list of layer indices, got {value!r}; "
                               "write the target layers the draft was trained on")
    return tuple(value)


@dataclass(frozen=True)
class DFlashConfig:
    """The draft's shape, validated when made. Its layers are Qwen3 decoder layers (GQA, q/k norms, SwiGLU)."""

    hidden_size: int  # the draft's width, also the target's: the block rows are the target's embeddings
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int  # B: the last sampled token then B-1 masks, so a step proposes B-1 tokens
    mask_token_id: int  # the target's embedding row that fills the masked slots (151669 for Qwen3)
    # z-lab convention: id i is the residual stream AFTER target layer i (HF hidden_states[i+1], pre-final-norm),
    # concatenated in this order into fc's input
    target_layer_ids: tuple[int, ...]
    vocab_size: int  # the target's vocabulary: the draft reads its embeddings and its LM head
    max_position_embeddings: int

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "block_size", "vocab_size", "max_position_embeddings"):
            _positive_int(name, getattr(self, name))
        _positive_float("rms_norm_eps", self.rms_norm_eps)
        _positive_float("rope_theta", self.rope_theta)
        if self.num_heads % self.num_kv_heads:
            raise DFlashDraftError(f"DFlash config: num_attention_heads {self.num_heads} is not a multiple of "
                                   f"num_key_value_heads {self.num_kv_heads}; fix config.json")
        if self.head_dim % 2:
            raise DFlashDraftError(f"DFlash config: head_dim {self.head_dim} must be even for rotary embeddings; "
                                   "fix config.json")
        if isinstance(self.mask_token_id, bool) or not isinstance(self.mask_token_id, int) or self.mask_token_id < 0:
            raise DFlashDraftError(f"DFlash config: mask_token_id must be a token id >= 0, got "
                                   f"{self.mask_token_id!r}; fix config.json")
        ids = _int_list(self.target_layer_ids, "target_layer_ids", "DFlash config")
        if min(ids) < 0:
            raise DFlashDraftError(f"DFlash config: target layer ids must be >= 0 (the output of a target layer), "
                                   f"got {list(ids)}; fix config.json")
        object.__setattr__(self, "target_layer_ids", ids)  # frozen: a list from JSON becomes a tuple once, here

    @property
    def feature_width(self) -> int:
        """fc's input: the tapped target states side by side."""
        return len(self.target_layer_ids) * self.hidden_size

    @classmethod
    def from_json(cls, raw: Any, source: str) -> DFlashConfig:
        """A parsed ``config.json`` (``source`` names it in errors): z-lab's layout or speculators' ``dflash``."""
        if not isinstance(raw, dict):
            raise DFlashDraftError(f"{source} is not a JSON object; pass the draft's own config.json")
        refuse_eagle3(raw, source)
        kind = raw.get("speculators_model_type")
        if kind == "dflash":
            return cls(**_speculators_fields(raw, source))
        if kind is not None:
            raise DFlashDraftError(f"{source} is a speculators {kind!r} checkpoint, not a DFlash draft; "
                                   "pass a folder whose speculators_model_type is \"dflash\"")
        architectures = raw.get("architectures")
        named = isinstance(architectures, list) and "DFlashDraftModel" in architectures
        if named or raw.get("dflash_config") is not None:
            return cls(**_zlab_fields(raw, source))
        raise DFlashDraftError(f"{source} is not a DFlash draft config (no dflash_config, DFlashDraftModel "
                               "architecture or speculators_model_type \"dflash\"); pass the draft's own folder")


def refuse_eagle3(raw: dict, source: str) -> None:
    """An EAGLE-3 head's config handed over as a DFlash draft: say so, since both are 'draft heads' on the hub."""
    architectures = raw.get("architectures")
    named = isinstance(architectures, list) and bool(EAGLE3_ARCHITECTURES.intersection(map(str, architectures)))
    if named or "eagle_config" in raw or raw.get("speculators_model_type") == "eagle3":
        raise DFlashDraftError(f"{source} is an EAGLE-3 head, not a DFlash draft; pass it with --eagle")


def _rope_theta(d: dict, source: str) -> float:
    """The rope base: ``rope_theta`` (transformers 4) or ``rope_parameters`` (5). Only Qwen3's default rope."""
    params = d.get("rope_parameters") or {}
    for settings in (params, d.get("rope_scaling") or {}):
        if not isinstance(settings, dict):
            raise DFlashDraftError(f"{source}: rope settings must be an object, got {settings!r}; fix config.json")
        kind = settings.get("rope_type", settings.get("type", "default"))
        if kind != "default":
            raise DFlashDraftError(f"{source}: rope type {kind!r} is not supported (DFlash drafts use Qwen3's "
                                   "default rope); use a draft without rope scaling")
    return d.get("rope_theta", params.get("rope_theta", QWEN3_ROPE_THETA))


def _layer_fields(d: dict, source: str) -> dict[str, Any]:
    """The Qwen3 decoder fields both formats share: z-lab's top level, speculators' transformer_layer_config."""
    missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                           "vocab_size") if k not in d]
    if missing:
        raise DFlashDraftError(f"{source} lacks {', '.join(missing)}; re-download the draft's config.json")
    layer_types = d.get("layer_types") or []
    if d.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
        raise DFlashDraftError(f"{source} has sliding-window layers; specrt runs full-attention DFlash drafts "
                               "only, use one without")
    if d.get("attention_bias"):
        raise DFlashDraftError(f"{source} has attention biases, which DFlash drafts do not; use a draft without")
    if d.get("hidden_act", "silu") != "silu":
        raise DFlashDraftError(f"{source}: activation {d['hidden_act']!r} is not supported (SwiGLU with silu "
                               "only); use another draft")
    heads = d["num_attention_heads"]
    return {"hidden_size": d["hidden_size"], "intermediate_size": d["intermediate_size"],
            "num_layers": d["num_hidden_layers"], "num_heads": heads,
            "num_kv_heads": d.get("num_key_value_heads") or heads, "head_dim": d.get("head_dim", QWEN3_HEAD_DIM),
            "rms_norm_eps": d.get("rms_norm_eps", QWEN3_EPS), "rope_theta": _rope_theta(d, source),
            "vocab_size": d["vocab_size"], "max_position_embeddings": d.get("max_position_embeddings",
                                                                            QWEN3_MAX_POSITIONS)}


def _zlab_fields(raw: dict, source: str) -> dict[str, Any]:
    """z-lab's layout: ``block_size`` at the top (Qwen3, LLaMA drafts) or in ``dflash_config`` (Qwen3.5+);
    ``dflash_config.mask_token_id`` and ``target_layer_ids`` (after-layer ids, absent: z-lab's default rule)."""
    dflash = raw.get("dflash_config") or {}
    if not isinstance(dflash, dict):
        raise DFlashDraftError(f"{source}: dflash_config must be an object, got {dflash!r}; fix config.json")
    fields = _layer_fields(raw, source)
    top, inner = raw.get("block_size"), dflash.get("block_size")
    if top is None and inner is None:
        raise DFlashDraftError(f"{source} has no block_size (top level or in dflash_config); add the block size "
                               "the draft was trained with")
    if top is not None and inner is not None and top != inner:
        raise DFlashDraftError(f"{source} has block_size {top} at the top level but {inner} in dflash_config; "
                               "keep the one the draft was trained with")
    ids = dflash.get("target_layer_ids")
    if ids is None:
        layers = raw.get("num_target_layers")
        if layers is None:
            raise DFlashDraftError(f"{source} has no dflash_config.target_layer_ids nor num_target_layers; add the "
                                   "target layers the draft was trained on")
        _positive_int("num_target_layers", layers)
        _positive_int("num_hidden_layers", fields["num_layers"])
        ids = default_target_layer_ids(layers, fields["num_layers"])
    return {**fields, "block_size": top if top is not None else inner,
            "mask_token_id": _mask_token(dflash.get("mask_token_id"), "dflash_config.mask_token_id", source),
            "target_layer_ids": _int_list(ids, "dflash_config.target_layer_ids", source)}


def _speculators_fields(raw: dict, source: str) -> dict[str, Any]:
    """speculators' ``dflash`` format: the Qwen3 fields nested in ``transformer_layer_config``, and its layer ids
    ``aux_hidden_state_layer_ids`` in vLLM's entering-layer convention, z-lab's ids + 1 (converted back here)."""
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise DFlashDraftError(f"{source} has no transformer_layer_config object; re-download the draft's "
                               "config.json")
    if raw.get("sample_from_anchor"):
        raise DFlashDraftError(f"{source} drafts from the anchor slot too (sample_from_anchor, B tokens a "
                               "step); specrt runs DFlash drafts proposing B-1, use one without it")
    fields = _layer_fields(layer, source)
    target_hidden = raw.get("target_hidden_size")
    if target_hidden is not None and target_hidden != fields["hidden_size"]:
        raise DFlashDraftError(f"{source} has target_hidden_size {target_hidden} but its layers are "
                               f"{fields['hidden_size']} wide; a DFlash draft is as wide as its target, fix it")
    aux = _int_list(raw.get("aux_hidden_state_layer_ids"), "aux_hidden_state_layer_ids", source)
    if min(aux) < 1:
        raise DFlashDraftError(f"{source}: aux_hidden_state_layer_ids {list(aux)} taps the target's embeddings "
                               "(id 0), which z-lab's after-layer ids cannot name; use ids >= 1")
    return {**fields, "block_size": raw.get("block_size", SPECULATORS_BLOCK),
            "mask_token_id": _mask_token(raw.get("mask_token_id"), "mask_token_id", source),
            "target_layer_ids": tuple(i - 1 for i in aux)}  # entering layer i == leaving layer i-1


def _mask_token(value: Any, name: str, source: str) -> Any:
    if value is None:
        raise DFlashDraftError(f"{source} has no {name}; set it to the target's mask row (151669 for Qwen3)")
    return value


def _target_dims(target_config: Any) -> tuple[int, int, int]:
    """(hidden size, vocabulary, layer count) of an HF config object or its dict; a multimodal wrapper's text part."""
    def get(key: str) -> Any:
        return target_config.get(key) if isinstance(target_config, dict) else getattr(target_config, key, None)

    text = get("text_config")
    if text is not None:
        return _target_dims(text)
    dims = get("hidden_size"), get("vocab_size"), get("num_hidden_layers")
    if any(d is None for d in dims):
        raise DFlashDraftError("the target config lacks hidden_size, vocab_size or num_hidden_layers; pass the "
                               "target's config.json")
    return dims


def check_against_target(cfg: DFlashConfig, target_config: Any) -> None:
    """Refuse a draft made for another target, or one specrt cannot run beside it."""
    hidden, vocab, layers = _target_dims(target_config)
    if cfg.hidden_size != hidden:
        raise DFlashDraftError(f"the DFlash draft is {cfg.hidden_size} wide, the target {hidden}: {TARGET_HINT}")
    if cfg.vocab_size != vocab:
        raise DFlashDraftError(f"the DFlash draft's vocabulary has {cfg.vocab_size} tokens, the target's {vocab}: "
                               f"{TARGET_HINT}")
    outside = [i for i in cfg.target_layer_ids if not 0 <= i <= layers - 1]
    if outside:
        raise DFlashDraftError(f"the DFlash draft reads target layer {outside[0]} but the target has {layers} "
                               f"layers (0..{layers - 1}): {TARGET_HINT}")
    if cfg.mask_token_id >= vocab:
        raise DFlashDraftError(f"the DFlash draft's mask token {cfg.mask_token_id} is outside the target's "
                               f"vocabulary (0..{vocab - 1}); set its mask_token_id to a row the target embeds")
    if not 2 <= cfg.block_size <= MAX_BLOCK:
        raise DFlashDraftError(f"the DFlash draft's block size is {cfg.block_size}; specrt runs blocks of 2 to "
                               f"{MAX_BLOCK} tokens, use another draft")
