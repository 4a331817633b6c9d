"""Tiny random EAGLE-3 heads written as published heads are laid out: EAGLE's flat layout (config.json +
model.safetensors with fc / midlayer.* / norm / lm_head / d2t / t2d) and the ``speculators`` format
(vllm-project/speculators, the RedHatAI heads: the layer's config nested, weights layers.N.*); see
docs/design/eagle3.md."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from specrt.export.eagle.config import Eagle3Config

from specrt.export.eagle.head import Eagle3Head

H, HEADS, KV, INNER, V, D = 48, 4, 2, 96, 200, 64

def speculators_config(*, taps=(1, 2, 4), vocab: int = V, draft: int = D, hidden: int = H, **top) -> dict:
    """A tiny head's config.json in the speculators layout; ``top`` overrides top-level fields."""
    d = {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "speculators_version": "0.4.0",
         "draft_vocab_size": draft, "norm_before_residual": False, "norm_before_fc": False, "fc_norm": False,
         "norm_output": False, "target_hidden_size": None, "embed_requires_grad": False,
         "eagle_aux_hidden_state_layer_ids": list(taps) if taps else None,
         "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "some/target"}},
         # rms_norm_eps and rope_theta left out: LlamaConfig's defaults (1e-6, 10000) apply
         "transformer_layer_config": {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": 1,
                                      "num_attention_heads": HEADS, "num_key_value_heads": KV,
                                      "intermediate_size": INNER, "vocab_size": vocab,
                                      "max_position_embeddings": 256}}
    d.update(top)
    return d


def random_head(cfg: Eagle3Config, seed: int = 0, **kw) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(cfg, **kw)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "norm" in name:  # non-trivial norm weights, so a norm applied in the wrong place shows
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return head.eval()


def vocab_map(vocab: int = V, draft: int = D, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE's construction (traineagle3/cnets.py): the used target ids sorted, d2t = used[i] - i."""
    used = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:draft].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(draft), t2d


def write_speculators(folder, config: dict, head: Eagle3Head, *, extra: dict | None = None, shards: int = 1):
    """The head's weights under speculators' names (layers.0.*), with the maps and the training-only copies
    of the target's norm and LM head that the format keeps, optionally split over safetensors shards."""
    d2t, t2d = vocab_map(head.cfg.vocab_size, head.cfg.draft_vocab_size)
    state = {k.replace("midlayer.", "layers.0."): v.detach().clone() for k, v in head.state_dict().items()}
    state.update({"d2t": d2t, "t2d": t2d, "verifier_norm.weight": torch.ones(head.cfg.target_hidden_size),
                  "verifier_lm_head.weight": torch.zeros(head.cfg.vocab_size, head.cfg.target_hidden_size),
                  **(extra or {})})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if shards == 1:
        save_file(state, str(folder / "model.safetensors"))
        return folder
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        part = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k] for k in names[i::shards]}, str(folder / part))
        weight_map.update({k: part for k in names[i::shards]})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def config_json(**overrides) -> dict:
    """A tiny head's flat config.json; ``None`` overrides drop a key."""
    d = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
         "hidden_size": H, "intermediate_size": INNER, "num_attention_heads": HEADS, "num_key_value_heads": KV,
         "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
         "vocab_size": V, "draft_vocab_size": D}
    d.update(overrides)
    return {k: v for k, v in d.items() if v is not None}


def write_published(folder, config: dict, state: dict) -> None:
    """Write a head folder directly (not through save_eagle3), as a published checkpoint is laid out."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))


def published_state(cfg: Eagle3Config, seed: int = 0) -> dict:
    d2t, t2d = vocab_map(cfg.vocab_size, cfg.draft_vocab_size, seed)
    return {**random_head(cfg, seed).state_dict(), "d2t": d2t, "t2d": t2d}
