"""EAGLE-3 heads in EAGLE's own flat layout (``LlamaForCausalLMEagle3``, one Llama layer named ``midlayer``), the
layout SpecForge and vLLM read too: its ``config.json`` read into an :class:`~.config.Eagle3Config`
(:func:`read_native`, every variant specrt does not run refused in one line) and written back
(:func:`native_json`). :func:`.checkpoint.read_config` tells it from the ``speculators`` format."""

from __future__ import annotations

from typing import Any

from ...errors import EagleHeadError
from .config import Eagle3Config, rope_fields

ARCHITECTURE = "LlamaForCausalLMEagle3"
# SafeAILab/SpecForge name it LlamaForCausalLMEagle3, vLLM Eagle3LlamaForCausalLM; EAGLE's own
# training config says LlamaForCausalLM (the weights then tell EAGLE-3 from EAGLE-1/2).
_ARCHITECTURES = {ARCHITECTURE, "Eagle3LlamaForCausalLM", "LlamaForCausalLM"}
_EAGLE12_ARCHITECTURES = {"EagleLlamaForCausalLM", "LlamaForCausalLMEagle"}


def read_native(d: dict) -> Eagle3Config:
    """From a published head's ``config.json``: the flat Llama-style config EAGLE, SpecForge and vLLM
    use (a ``speculators`` config is read by :func:`.speculators.config_fields`)."""
    if not isinstance(d, dict):
        raise EagleHeadError(f"EAGLE-3 config must be a JSON object, got {type(d).__name__}")
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
    return Eagle3Config(hidden_size=d["hidden_size"], num_attention_heads=d["num_attention_heads"],
                        intermediate_size=d["intermediate_size"], vocab_size=d["vocab_size"],
                        draft_vocab_size=d.get("draft_vocab_size"), num_key_value_heads=d.get("num_key_value_heads"),
                        head_dim=d.get("head_dim"), target_hidden_size=d.get("target_hidden_size"),
                        rms_norm_eps=d.get("rms_norm_eps", 1e-6), **rope_fields(d),
                        max_position_embeddings=d.get("max_position_embeddings", 2048),
                        norm_before_residual=d.get("norm_before_residual", False), taps=_taps(d, eagle_config),
                        tap_norm=_flat_tap_norm(d, eagle_config))


def native_json(cfg: Eagle3Config, torch_dtype: str = "float32") -> dict:
    """The published layout's ``config.json``. ``target_hidden_size`` is written only when it differs
    from ``hidden_size``: EAGLE skips loading the target's embedding whenever the key is present."""
    unwritable = [v for v in cfg.variants if not v.startswith("tap_norm")]
    if unwritable:
        raise EagleHeadError(f"the flat EAGLE-3 layout has no fields for {', '.join(unwritable)} "
                             "(speculators-format variants); specrt writes the standard head only")
    d: dict[str, Any] = {
        "architectures": [ARCHITECTURE], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "num_hidden_layers": 1, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size, "tie_word_embeddings": False, "pretraining_tp": 1,
        "torch_dtype": torch_dtype,
    }
    if cfg.target_hidden_size != cfg.hidden_size:
        d["target_hidden_size"] = cfg.target_hidden_size
    if cfg.norm_before_residual:
        d["norm_before_residual"] = True
    if cfg.tap_norm != "none":  # vLLM's and SpecForge's names, read back by read_native
        d["norm_before_fc" if cfg.tap_norm == "joint" else "fc_norm"] = True
    if cfg.taps is not None:
        # both conventions, so vLLM (top level, entering layer i) and SGLang/SpecForge (nested,
        # output of layer i) each read the same layers
        d["eagle_aux_hidden_state_layer_ids"] = list(cfg.taps)
        d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [t - 1 for t in cfg.taps],
                             "use_aux_hidden_state": True}
    return d


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
