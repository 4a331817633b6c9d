"""A published DFlash draft folder (``config.json`` + ``model.safetensors``), z-lab's layout or the speculators
``dflash`` format, read and checked name by name and shape by shape against its config (:func:`read_draft`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from ...errors import DFlashDraftError
from .config import DFlashConfig, refuse_eagle3

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# What a speculators checkpoint carries beside the draft body: copies of the verifier's embedding and LM head (the
# runtime reads the target's own), their vocabulary maps, and training-only verifier weights
EXTRAS = ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d")
EXTRA_PREFIX = "verifier_"
ANCHOR = "hidden_norm.weight"  # the one body weight whose name no other key ends with: it locates a prefix


def expected_shapes(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """z-lab's key set (no ``model.`` prefix, no biases) and each weight's shape under ``cfg``."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (h, cfg.feature_width), "hidden_norm.weight": (h,),
                                          "norm.weight": (h,)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (cfg.num_heads * d, h),
                       p + "self_attn.k_proj.weight": (cfg.num_kv_heads * d, h),
                       p + "self_attn.v_proj.weight": (cfg.num_kv_heads * d, h),
                       p + "self_attn.o_proj.weight": (h, cfg.num_heads * d),
                       p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter)})
    return shapes


def _read_json(folder: Path) -> dict:
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise DFlashDraftError(f"{folder} has no {CONFIG_NAME}; pass the DFlash draft's own folder")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DFlashDraftError(f"{path} is not valid JSON ({e}); re-download the draft") from None


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = folder / WEIGHTS_NAME
    if not path.is_file():
        raise DFlashDraftError(f"{folder} has no {WEIGHTS_NAME}; DFlash drafts are read from one safetensors file")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:  # a truncated or corrupt file
        raise DFlashDraftError(f"could not read {path} ({str(e).splitlines()[0]}); re-download the draft") from None


def _refuse_eagle3_weights(keys: set[str], folder: Path) -> None:
    """EAGLE-3's flat layout names its decoder layer ``midlayer``; a DFlash draft never has one. Vocabulary maps
    (d2t, t2d) alone mark an EAGLE-3 head only where no DFlash body is there (speculators' DFlash may carry them)."""
    midlayer = any(k.startswith("midlayer.") or ".midlayer." in k for k in keys)
    maps = bool(keys & {"d2t", "t2d"}) and not any(k.endswith(ANCHOR) for k in keys)
    if midlayer or maps:
        raise DFlashDraftError(f"{folder} is an EAGLE-3 head, not a DFlash draft; pass it with --eagle")


def _body(state: dict[str, torch.Tensor], folder: Path) -> dict[str, torch.Tensor]:
    """The draft body under z-lab's names: one consistent prefix (``model.``, say) stripped, the extras dropped."""
    prefixes = {k[:-len(ANCHOR)] for k in state if k == ANCHOR or k.endswith("." + ANCHOR)}
    if len(prefixes) != 1:
        found = "no " + ANCHOR if not prefixes else "several: " + ", ".join(sorted(p + ANCHOR for p in prefixes))
        raise DFlashDraftError(f"{folder} has {found}; it is not one DFlash draft, pass the draft's own folder")
    prefix = prefixes.pop()
    body, stray = {}, []
    for key, tensor in state.items():
        name = key[len(prefix):] if key.startswith(prefix) else key
        if name in EXTRAS or name.startswith(EXTRA_PREFIX) or name.endswith("rotary_emb.inv_freq"):
            continue  # the runtime uses the target's own embedding and head; inv_freq follows from the config
        if key.startswith(prefix):
            body[name] = tensor
        else:
            stray.append(key)
    if stray:
        raise DFlashDraftError(f"{folder} has weights outside the draft body ({', '.join(sorted(stray)[:3])}); "
                               "it is not a DFlash draft checkpoint, pass the draft's own folder")
    return body


def _check_body(body: dict[str, torch.Tensor], cfg: DFlashConfig, folder: Path) -> None:
    expected = expected_shapes(cfg)
    missing = [k for k in expected if k not in body]
    if missing:
        more = " ..." if len(missing) > 3 else ""
        raise DFlashDraftError(f"{folder} lacks {', '.join(missing[:3])}{more}: its weights do not match its "
                               "config.json; re-download the draft")
    unexpected = sorted(set(body) - set(expected))
    if unexpected:
        more = " ..." if len(unexpected) > 3 else ""
        raise DFlashDraftError(f"{folder} has unexpected weights {', '.join(unexpected[:3])}{more}: its weights do "
                               "not match its config.json; re-download the draft")
    for name, shape in expected.items():
        if tuple(body[name].shape) != shape:
            raise DFlashDraftError(f"{folder}: {name} is {list(body[name].shape)}, its config.json implies "
                                   f"{list(shape)}; re-download the draft")
        if not body[name].dtype.is_floating_point:
            raise DFlashDraftError(f"{folder}: {name} is {body[name].dtype}, not a float tensor; re-download the "
                                   "draft")


def read_draft(folder: str | os.PathLike) -> tuple[DFlashConfig, dict[str, torch.Tensor], np.ndarray | None]:
    """A DFlash draft folder as (config, body state dict under z-lab's names, stored dtype, vocabulary map): z-lab's
    layout or the speculators format. The vocabulary map (int64 [D], the ascending target ids of a smaller draft
    vocabulary, from ``d2t``: target id = draft id + d2t) is None where the draft predicts the whole vocabulary.
    An EAGLE-3 head is refused by name, whichever of its config or weights shows it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DFlashDraftError(f"DFlash draft folder not found: {folder}; pass a folder holding {CONFIG_NAME} and "
                               f"{WEIGHTS_NAME}")
    raw = _read_json(folder)
    source = str(folder / CONFIG_NAME)
    if isinstance(raw, dict):
        refuse_eagle3(raw, source)
    state = _read_weights(folder)
    _refuse_eagle3_weights(set(state), folder)  # before the config: an EAGLE-3 config may look like a plain Llama
    cfg = DFlashConfig.from_json(raw, source)
    body = _body(state, folder)
    _check_body(body, cfg, folder)
    return cfg, body, _vocab_map(state, cfg, folder)


def _vocab_map(state: dict[str, torch.Tensor], cfg: DFlashConfig, folder: Path) -> np.ndarray | None:
    """The draft vocabulary's target ids from ``d2t`` (any prefix), checked: ascending, inside the vocabulary."""
    d2t = next((t for k, t in state.items() if k == "d2t" or k.endswith(".d2t")), None)
    if d2t is None:
        return None
    ids = np.arange(d2t.numel(), dtype=np.int64) + d2t.to(torch.int64).numpy().reshape(-1)
    if d2t.dtype.is_floating_point or (len(ids) > 1 and not (np.diff(ids) > 0).all()) or ids[0] < 0 \
            or ids[-1] >= cfg.vocab_size:
        raise DFlashDraftError(f"{folder}: d2t must map draft ids to strictly ascending target ids in "
                               f"[0, {cfg.vocab_size}); re-download the draft")
    return None if len(ids) == cfg.vocab_size else ids
