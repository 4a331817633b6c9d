"""Tiny random DFlash drafts for a saved tiny target, in z-lab's folder layout (config.json + model.safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from specrt.export.dflash.config import DFlashConfig
from specrt.export.dflash.model import DFlashDraft


def dflash_config_json(target: dict, *, layers: int = 1, block: int = 4, ids: tuple[int, ...] = (1,),
                       mask: int | None = None, **changes) -> dict:
    """z-lab's config.json of a draft for the target whose config dict is ``target``."""
    heads, kv = target["num_attention_heads"], target["num_key_value_heads"]
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block,
            "num_target_layers": target["num_hidden_layers"],
            "dflash_config": {"mask_token_id": target["vocab_size"] - 1 if mask is None else mask,
                              "target_layer_ids": list(ids)},
            "hidden_size": target["hidden_size"], "intermediate_size": 2 * target["hidden_size"],
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
            "head_dim": target["hidden_size"] // heads, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "max_position_embeddings": 256, "vocab_size": target["vocab_size"], **changes}


def save_dflash_draft(folder: Path, target: Path, *, seed: int = 0, draft_vocab: int | None = None,
                      **config) -> Path:
    """A random draft for the saved HF model ``target``; ``draft_vocab``: a random subset of the target's ids as its
    vocabulary (a ``d2t`` tensor, speculators' convention), else the whole vocabulary. Norm weights away from 1."""
    raw = dflash_config_json(json.loads((target / "config.json").read_text()), **config)
    cfg = DFlashConfig.from_json(raw, "test")
    torch.manual_seed(seed)
    draft = DFlashDraft(cfg)
    state = {}
    for name, t in draft.state_dict().items():
        state[name] = (1 + 0.2 * torch.randn_like(t)) if name.endswith("norm.weight") else t.clone()
    if draft_vocab is not None:
        g = torch.Generator().manual_seed(seed)
        used = torch.randperm(cfg.vocab_size, generator=g)[:draft_vocab].sort().values
        state["d2t"] = used - torch.arange(draft_vocab)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder
