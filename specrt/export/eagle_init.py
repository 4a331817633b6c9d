"""The head an EAGLE-3 training run (:mod:`specrt.export.eagle_train`) starts from: a fresh one shaped after
the target, or a saved one to train further (``--init``), and the copy of it as it will be saved."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError, EagleHeadError
from .eagle import DTYPES, Eagle3Config, Eagle3Head, load_eagle3, tap_layers


def head_config(target_config: Any, draft_vocab_size: int) -> Eagle3Config:
    """A head as wide as the target (it reads the target's embedding table), with the target's attention
    shape, MLP width, norm epsilon and rope base (default rope), and explicit taps for targets of < 7 layers."""
    c = getattr(target_config, "text_config", None) or target_config
    layers = c.num_hidden_layers
    rope = getattr(c, "rope_parameters", None) or {}
    theta = getattr(c, "rope_theta", None) or (rope.get("rope_theta") if isinstance(rope, dict) else None)
    return Eagle3Config(hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                        intermediate_size=c.intermediate_size, vocab_size=c.vocab_size,
                        draft_vocab_size=draft_vocab_size,
                        num_key_value_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
                        head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
                        rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6)), rope_theta=float(theta or 10000.0),
                        max_position_embeddings=int(getattr(c, "max_position_embeddings", 2048)),
                        taps=None if layers >= 7 else tap_layers(layers))


def new_head(cfg: Eagle3Config, model: Any, targets: torch.Tensor, seed: int, *, from_target: bool) -> Eagle3Head:
    """A fresh head (seeded); ``from_target``: its last norm and its lm_head rows (the draft ids' ``targets``)
    start as the target's."""
    torch.manual_seed(seed)
    head = Eagle3Head(cfg)
    if from_target:
        # the head's last step is the target's own: norm, then the target's output rows of the draft ids
        with torch.no_grad():
            head.lm_head.weight.copy_(model.get_output_embeddings().weight[targets].float())
            norm = getattr(getattr(model, "model", None), "norm", None)
            if norm is not None and getattr(norm, "weight", None) is not None:
                head.norm.weight.copy_(norm.weight.float())
    return head


def init_head(path: str, target_config: Any) -> tuple[Eagle3Config, Eagle3Head, torch.Tensor, torch.Tensor]:
    """A warm start's head (specrt's or the published layout), checked against the target, in fp32."""
    try:
        cfg, head, d2t, t2d = load_eagle3(path, target_config)
    except EagleHeadError as e:
        raise ConfigError(f"eagle train --init: {e}") from None
    if head.embed_tokens is not None:
        raise ConfigError(f"eagle train --init: {path} carries its own embedding table; specrt trains heads that "
                          "read the target's")
    layers = (getattr(target_config, "text_config", None) or target_config).num_hidden_layers
    if tuple(cfg.tap_layers_for(layers)) != tuple(tap_layers(layers)):
        raise ConfigError(f"eagle train --init: {path} reads layers {list(cfg.tap_layers_for(layers))}, "
                          f"training feeds {list(tap_layers(layers))}")
    return cfg, head.train(), d2t, t2d


def saved_copy(head: Eagle3Head, dtype: str) -> Eagle3Head:
    """The head as ``save_eagle3`` will write it (weights rounded to ``dtype``), computing in fp32."""
    copy = Eagle3Head(head.cfg)
    copy.load_state_dict({k: v.to(DTYPES[dtype]).float() for k, v in head.state_dict().items()})
    return copy.eval()
