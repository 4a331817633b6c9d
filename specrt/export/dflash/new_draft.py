"""A new DFlash draft for a target (:mod:`.train`): its shape (:func:`draft_shape`), its mask token
(:func:`choose_mask_token`), and the files it is written to, z-lab's layout that :func:`.checkpoint.read_draft` reads
back (:func:`config_json`, :func:`save_draft`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ...errors import ConfigError, DFlashDraftError
from ..staging import write_weights
from .checkpoint import CONFIG_NAME, WEIGHTS_NAME
from .config import DFlashConfig, default_target_layer_ids
from .train_config import WHO, DFlashTrainConfig


def text_config(target_config: Any) -> Any:
    """A multimodal target's text part (``get_text_config``), else the config itself."""
    get_text = getattr(target_config, "get_text_config", None)
    return get_text() if callable(get_text) else target_config


def draft_shape(target_config: Any, cfg: DFlashTrainConfig, device_type: str) -> dict:
    """The new draft's DFlashConfig fields but ``mask_token_id``: its layers as wide as the target's (hidden, heads,
    kv heads, head dim, MLP), ``cfg.num_layers`` of them, the target's rope base and norm epsilon, and z-lab's
    tapped layers for that count unless ``cfg.target_layer_ids`` names them."""
    t = text_config(target_config)
    h, heads, layers = t.hidden_size, t.num_attention_heads, t.num_hidden_layers
    n = cfg.num_layers(device_type)
    ids = cfg.target_layer_ids or default_target_layer_ids(layers, n)
    if max(ids) > layers - 2:
        raise ConfigError(f"{WHO}: target layer {max(ids)} cannot be tapped: the target has {layers} layers and the "
                          f"last one's output reaches Hugging Face only after the final norm; use 0..{layers - 2}")
    rope = getattr(t, "rope_parameters", None) or {}
    shape = {"hidden_size": h, "intermediate_size": t.intermediate_size, "num_layers": n, "num_heads": heads,
             "num_kv_heads": getattr(t, "num_key_value_heads", None) or heads,
             "head_dim": getattr(t, "head_dim", None) or h // heads,
             "rms_norm_eps": float(getattr(t, "rms_norm_eps", None) or 1e-6),
             "rope_theta": float(getattr(t, "rope_theta", None) or rope.get("rope_theta") or 10000.0),
             "block_size": cfg.block_size, "target_layer_ids": tuple(ids), "vocab_size": t.vocab_size,
             "max_position_embeddings": getattr(t, "max_position_embeddings", None) or 32768}
    DFlashConfig(**shape, mask_token_id=0)  # its own checks (an odd head_dim, say), before anything runs
    return shape


def choose_mask_token(vocab_size: int, tokenizer_size: int, counts: torch.Tensor) -> tuple[int, str]:
    """(the mask token, why): the first row past the tokenizer's ids where the target's vocabulary has spare rows
    (z-lab's Qwen3 drafts: 151669), else the id rarest in the training data (``counts`` per id; ties: the highest)."""
    if vocab_size > tokenizer_size:
        return tokenizer_size, f"row {tokenizer_size}, the first of the target's rows past its tokenizer (unused)"
    rarest = vocab_size - 1 - int(torch.argmin(counts.flip(0)))
    return rarest, (f"id {rarest}, the rarest in the training data ({int(counts[rarest])} of {int(counts.sum())} "
                    "tokens): the target's vocabulary has no spare row")


def plan_line(shape: dict, cfg: DFlashTrainConfig, device: torch.device, compute: str) -> str:
    ids = list(shape["target_layer_ids"])
    return (f"{WHO}: a {shape['num_layers']}-layer draft ({shape['hidden_size']} wide, {shape['num_heads']} heads / "
            f"{shape['num_kv_heads']} kv x {shape['head_dim']}, MLP {shape['intermediate_size']}) reading target "
            f"layers {ids} (output_hidden_states {[i + 1 for i in ids]}), blocks of {cfg.block_size} "
            f"({cfg.block_size - 1} drafts a pass), loss decay gamma {cfg.decay:g}; on {device}, {compute} matmuls")


def draft_share(shape: dict, draft_vocab: int, target_config: Any) -> float:
    """A block row's cost in the draft against a token row's in the target, from the weights each multiplies: the
    draft's layers (as wide as the target's), its LM head over the draft vocabulary, and fc's share of a context row."""
    t = text_config(target_config)
    h, d = shape["hidden_size"], shape["head_dim"]
    attn = 2 * h * shape["num_heads"] * d + 2 * h * shape["num_kv_heads"] * d
    layer = attn + 3 * h * shape["intermediate_size"]
    target = t.num_hidden_layers * layer + t.vocab_size * h
    return (shape["num_layers"] * layer + draft_vocab * h + len(shape["target_layer_ids"]) * h * h) / target


def config_json(cfg: DFlashConfig, num_target_layers: int, dtype: str, draft_vocab: int | None = None) -> dict:
    """z-lab's ``config.json`` of a draft: a Qwen3 config plus ``block_size``, ``num_target_layers`` and
    ``dflash_config`` (mask token, after-layer target ids); ``draft_vocab_size`` where its vocabulary is reduced."""
    raw = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": cfg.block_size,
           "num_target_layers": num_target_layers,
           "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)},
           "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
           "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
           "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
           "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position_embeddings,
           "layer_types": ["full_attention"] * cfg.num_layers, "sliding_window": None, "attention_bias": False,
           "hidden_act": "silu", "tie_word_embeddings": False, "vocab_size": cfg.vocab_size, "torch_dtype": dtype}
    return raw if draft_vocab is None else {**raw, "draft_vocab_size": draft_vocab}


def save_draft(folder: str | os.PathLike, config: dict, state: dict[str, torch.Tensor],
               d2t: torch.Tensor | None) -> Path:
    """Write ``config.json`` (:func:`config_json`) and ``model.safetensors``: the body ``state`` as given, plus ``d2t``
    (int64 [D], speculators' convention: draft id j is target id j + d2t[j]) where the vocabulary is reduced. Each
    file lands by rename: a failure leaves no half-written draft."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    if d2t is not None:
        tensors["d2t"] = d2t.to(torch.int64).cpu().contiguous()
    folder = Path(folder)
    try:
        write_weights(folder, tensors, WEIGHTS_NAME, json.dumps(config, indent=2) + "\n", CONFIG_NAME)
    except OSError as e:
        raise DFlashDraftError(f"could not write the DFlash draft to {folder}: {e}") from None
    return folder
