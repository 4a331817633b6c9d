"""EAGLE-3 heads in the ``speculators`` format (vllm-project/speculators; the RedHatAI heads on the hub), read
into specrt's :class:`~specrt.export.eagle.config.Eagle3Config` and checkpoint names.

The format nests the decoder layer's shape in ``transformer_layer_config`` (a transformers config written
as a diff against its class defaults, so absent keys take that class's defaults: built here with
transformers itself), keeps the EAGLE-3 fields at the top level and names the layer ``layers.0.*`` where
EAGLE's layout says ``midlayer.*``. Its variants map onto the config: ``norm_before_residual`` as is,
``norm_before_fc`` → ``tap_norm="joint"`` (weight ``input_norm``), ``fc_norm`` → ``tap_norm="each"``
(``fc_norm.0-2``), ``norm_output`` → ``feed_normed``, a sliding layer → ``sliding_window``, a Qwen3 layer →
``qk_norm``, ``num_hidden_layers`` > 1 → ``num_layers`` (stacked standard layers ``layers.1.*`` ..., kept under
those names). What specrt does not implement (layers that slide apart, other than three taps, biases) is
refused in one line. :func:`to_config` and :func:`to_speculators_names` write the format back, for heads the flat
layout cannot describe. Sources and line references: docs/design/eagle3.md, "The speculators format".
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import EagleHeadError
from .config import rope_fields

MODEL_TYPE = "eagle3"
# the target's own final norm and LM head, which speculators keeps beside the head for training
TRAINING_ONLY = ("verifier_norm.weight", "verifier_lm_head.weight")
_OTHER_TYPES = {"eagle": "an EAGLE-1 / HASS head", "dflash": "a DFlash drafter", "mtp": "a multi-token-prediction head"}
# the top-level fields and the speculators defaults they take when absent (Eagle3SpeculatorConfig)
_DEFAULTS = {"draft_vocab_size": 32000, "norm_before_residual": False, "target_hidden_size": None,
             "eagle_aux_hidden_state_layer_ids": None, "norm_before_fc": False, "fc_norm": False,
             "norm_output": False}


def is_speculators(raw: Any) -> bool:
    return isinstance(raw, dict) and "speculators_model_type" in raw


def _layer_config(raw: dict) -> dict:
    """The decoder layer's config with transformers' defaults filled in, as speculators builds it."""
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise EagleHeadError("speculators EAGLE-3 config: transformer_layer_config is missing or not an object")
    # speculators builds a Qwen3 layer when the type is left out (config.py, validate_transformer_config)
    model_type = layer.get("model_type", "qwen3")
    if model_type not in ("llama", "qwen3"):
        raise EagleHeadError(f"speculators EAGLE-3 config: transformer_layer_config has a {model_type!r} decoder "
                             "layer; specrt runs Llama and Qwen3 head layers")
    try:
        if model_type == "llama":
            from transformers import LlamaConfig as config_class
        else:
            from transformers import Qwen3Config as config_class
    except ImportError:
        raise EagleHeadError("a Qwen3 head layer needs transformers >= 4.51 (Qwen3Config)") from None
    try:
        full = config_class(**{k: v for k, v in layer.items() if k != "model_type"}).to_dict()
    except (TypeError, ValueError, KeyError) as e:
        raise EagleHeadError(f"speculators EAGLE-3 config: transformer_layer_config does not read as a {model_type} "
                             f"config: {str(e).splitlines()[0]}") from None
    full["qk_norm"] = model_type == "qwen3"
    types = full.get("layer_types") or []
    if any(t not in ("full_attention", "sliding_attention") for t in types):
        raise EagleHeadError(f"speculators EAGLE-3 config: layer_types {types} name an attention specrt does not run")
    # speculators' trainer slides every layer unless told otherwise (window 2048); layer_types says which
    if len(set(types[:full["num_hidden_layers"]])) > 1:
        raise EagleHeadError(f"speculators EAGLE-3 config: layer_types {types} slide some layers and not others; "
                             "specrt runs stacked layers that all slide or none")
    sliding = types[0] == "sliding_attention" if types else bool(full.get("use_sliding_window"))
    full["window"] = full.get("sliding_window") if sliding else None
    if sliding and (isinstance(full["window"], bool) or not isinstance(full["window"], int) or full["window"] < 1):
        raise EagleHeadError(f"speculators EAGLE-3 config: a sliding layer needs a positive sliding_window, got "
                             f"{full.get('sliding_window')!r}")
    return full


def config_fields(raw: dict) -> dict:
    """``Eagle3Config`` keyword arguments from a speculators ``config.json`` (refusing what specrt cannot run)."""
    kind = raw.get("speculators_model_type")
    if kind != MODEL_TYPE:
        what = _OTHER_TYPES.get(kind, f"a speculators {kind!r} model")
        raise EagleHeadError(f"this speculators checkpoint is {what}, not an EAGLE-3 head")
    top = {k: raw.get(k, default) for k, default in _DEFAULTS.items()}
    for name in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        if not isinstance(top[name], bool):
            raise EagleHeadError(f"speculators EAGLE-3 config: {name} must be true or false, got {top[name]!r}")
    if top["norm_before_fc"] and top["fc_norm"]:
        raise EagleHeadError("speculators EAGLE-3 config: norm_before_fc and fc_norm are both set (they exclude "
                             "each other)")
    taps = top["eagle_aux_hidden_state_layer_ids"]
    if taps is not None and (not isinstance(taps, list) or len(taps) != 3):
        raise EagleHeadError(f"speculators EAGLE-3 config: eagle_aux_hidden_state_layer_ids is {taps!r}; specrt's "
                             "heads fuse exactly three target layers")
    layer = _layer_config(raw)
    if layer["hidden_act"] != "silu":
        raise EagleHeadError(f"speculators EAGLE-3 config: hidden_act {layer['hidden_act']!r} is not supported "
                             "(silu only)")
    for name in ("attention_bias", "mlp_bias"):
        if layer.get(name):
            raise EagleHeadError(f"speculators EAGLE-3 config: {name} is set; that variant is not supported")
    return {"hidden_size": layer["hidden_size"], "num_attention_heads": layer["num_attention_heads"],
            "intermediate_size": layer["intermediate_size"], "vocab_size": layer["vocab_size"],
            "draft_vocab_size": top["draft_vocab_size"], "num_key_value_heads": layer.get("num_key_value_heads"),
            "head_dim": layer.get("head_dim"), "target_hidden_size": top["target_hidden_size"],
            "rms_norm_eps": layer["rms_norm_eps"], **rope_fields(layer),
            "max_position_embeddings": layer["max_position_embeddings"],
            "norm_before_residual": top["norm_before_residual"],
            "taps": None if taps is None else tuple(taps),  # the entering-layer convention, as vLLM's
            "tap_norm": "joint" if top["norm_before_fc"] else "each" if top["fc_norm"] else "none",
            "feed_normed": top["norm_output"], "sliding_window": layer["window"], "qk_norm": layer["qk_norm"],
            "num_layers": layer["num_hidden_layers"]}


def rename_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """speculators' weight names → the published EAGLE-3 layout's (``layers.0.`` → ``midlayer.``; a stacked
    head's ``layers.1.*`` ... stay, as :class:`~specrt.export.eagle.head.Eagle3Head` names them), the training-only
    copies of the target's norm and LM head dropped."""
    return {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
            for k, v in state.items() if k not in TRAINING_ONLY}


def to_config(cfg: Any, torch_dtype: str) -> dict:
    """The speculators ``config.json`` that :func:`config_fields` reads back to ``cfg`` (an ``Eagle3Config``), for
    heads the flat layout cannot describe (stacked layers, the fed-back norm, a window, a Qwen3 layer)."""
    layer = {"model_type": "qwen3" if cfg.qk_norm else "llama", "hidden_size": cfg.hidden_size,
             "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
             "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
             "num_hidden_layers": cfg.num_layers, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
             "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_position_embeddings,
             "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling, "torch_dtype": torch_dtype,
             "layer_types": [("sliding" if cfg.sliding_window else "full") + "_attention"] * cfg.num_layers}
    if cfg.sliding_window:
        layer.update(sliding_window=cfg.sliding_window, use_sliding_window=True)
    return {"architectures": ["Eagle3DraftModel"], "speculators_model_type": MODEL_TYPE,
            "draft_vocab_size": cfg.draft_vocab_size, "norm_before_residual": cfg.norm_before_residual,
            "norm_before_fc": cfg.tap_norm == "joint", "fc_norm": cfg.tap_norm == "each",
            "norm_output": cfg.feed_normed,
            "target_hidden_size": None if cfg.target_hidden_size == cfg.hidden_size else cfg.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": None if cfg.taps is None else list(cfg.taps),
            "speculators_config": {"algorithm": "eagle3"}, "transformer_layer_config": layer}


def to_speculators_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """specrt's weight names → speculators' (``midlayer.`` → ``layers.0.``): :func:`rename_weights` undone."""
    return {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in state.items()}
