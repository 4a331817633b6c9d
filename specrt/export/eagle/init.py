"""The head an EAGLE-3 training run (:mod:`specrt.export.eagle.train`) starts from: a fresh one shaped after
the target, or a saved one to train further (``--init``), and the copy of it as it will be saved."""

from __future__ import annotations

from typing import Any

import torch

from ...errors import ConfigError, EagleHeadError
from .config import DTYPES, Eagle3Config, tap_layers
from .head import Eagle3Head
from .checkpoint import load_eagle3, resolve_head


def head_config(target_config: Any, draft_vocab_size: int, num_layers: int = 1) -> Eagle3Config:
    """A head as wide as the target (it reads the target's embedding table), with the target's attention
    shape, MLP width, norm epsilon and rope base (default rope), and explicit taps for targets of < 7 layers;
    ``num_layers`` > 1: standard decoder layers stacked after the EAGLE-3 one."""
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
                        taps=None if layers >= 7 else tap_layers(layers), num_layers=num_layers)


def new_head(cfg: Eagle3Config, model: Any, targets: torch.Tensor, seed: int, *, from_target: bool) -> Eagle3Head:
    """A fresh head (seeded). ``from_target``: it starts as the target's own last steps: its lm_head rows (the
    draft ids' ``targets``) and final norm are the target's, its decoder layer is the target's last layer
    reading the fused features (``fc`` passes the last tap through; the embedding half of q/k/v stays
    random), so at step 0 the head already maps a late residual state to the target's logits. On
    SmolLM2-135M this reached in 100 steps the held-out loss a random layer reached in 200. A stacked head's
    layers are the target's last ones in order (the EAGLE-3 layer the earliest of them)."""
    torch.manual_seed(seed)
    head = Eagle3Head(cfg)
    if from_target:
        with torch.no_grad():
            weight = model.get_output_embeddings().weight  # the head starts on the CPU, the target anywhere
            head.lm_head.weight.copy_(weight[targets.to(weight.device)].float())
            norm = getattr(getattr(model, "model", None), "norm", None)
            if norm is not None and getattr(norm, "weight", None) is not None:
                head.norm.weight.copy_(norm.weight.float())
            _copy_last_layers(head, model)
    return head


def _target_layer_weights(layer: Any, cfg: Eagle3Config) -> dict[str, torch.Tensor]:
    """A Llama-style decoder layer's projections by the head's names (Phi-3's packed ones split; the head
    mirrors the target's attention shape, so its own q and kv widths say where)."""
    attn, mlp = layer.self_attn, layer.mlp
    w = {}
    if hasattr(attn, "qkv_proj"):  # phi3: rows q | k | v
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        packed = attn.qkv_proj.weight
        w["q_proj"], w["k_proj"], w["v_proj"] = packed[:q], packed[q:q + kv], packed[q + kv:]
    else:
        for name in ("q_proj", "k_proj", "v_proj"):
            w[name] = getattr(attn, name).weight
    w["o_proj"] = attn.o_proj.weight
    if hasattr(mlp, "gate_up_proj"):  # phi3: rows gate | up
        gate_up = mlp.gate_up_proj.weight
        w["gate_proj"], w["up_proj"] = gate_up[:gate_up.shape[0] // 2], gate_up[gate_up.shape[0] // 2:]
    else:
        w["gate_proj"], w["up_proj"] = mlp.gate_proj.weight, mlp.up_proj.weight
    w["down_proj"] = mlp.down_proj.weight
    w["input_layernorm"] = layer.input_layernorm.weight
    w["post_attention_layernorm"] = layer.post_attention_layernorm.weight
    return w


def _layer_params(layer: Any, h: int | None = None) -> dict[str, torch.Tensor]:
    """A head layer's weights by the names :func:`_target_layer_weights` gives a target layer's; ``h``: the
    EAGLE-3 layer's width H, whose q/k/v read [embedding ‖ features] (the features half is the target-like part)
    and whose fused features go through ``hidden_norm`` where a target layer has its input norm."""
    attn, mlp = layer.self_attn, layer.mlp
    cut = (lambda w: w[:, h:]) if h else (lambda w: w)
    return {"q_proj": cut(attn.q_proj.weight), "k_proj": cut(attn.k_proj.weight), "v_proj": cut(attn.v_proj.weight),
            "o_proj": attn.o_proj.weight, "gate_proj": mlp.gate_proj.weight, "up_proj": mlp.up_proj.weight,
            "down_proj": mlp.down_proj.weight,
            "input_layernorm": layer.hidden_norm.weight if h else layer.input_layernorm.weight,
            "post_attention_layernorm": layer.post_attention_layernorm.weight}


def _copy_last_layers(head: Eagle3Head, model: Any) -> bool:
    """Start the head's layers as the target's last ones, in order, where every shape matches (a head shaped
    after its target: :func:`head_config`); returns whether it did."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    n, h = head.cfg.num_layers, head.cfg.hidden_size
    if not layers or len(layers) < n or head.fc.weight.shape[1] != 3 * h:
        return False
    pairs = [(_target_layer_weights(layers[len(layers) - n + i], head.cfg), _layer_params(mine, h if i == 0 else None))
             for i, mine in enumerate([head.midlayer, *head.layers.values()])]
    if any(set(w) != set(mine) or any(w[k].shape != mine[k].shape for k in mine) for w, mine in pairs):
        return False
    for w, mine in pairs:
        for name, dest in mine.items():
            dest.copy_(w[name].float())  # the features half of q/k/v: the embedding half keeps its random start
    head.fc.weight.zero_()
    head.fc.weight[:, 2 * h:] = torch.eye(h)  # the last tap (L-3) through, the others learnt from zero
    return True


def init_head(path: str, target_config: Any) -> tuple[Eagle3Config, Eagle3Head, torch.Tensor, torch.Tensor]:
    """A warm start's head (specrt's or the published layout), checked against the target, in fp32."""
    try:
        cfg, head, d2t, t2d = load_eagle3(resolve_head(path), target_config)
    except EagleHeadError as e:
        raise ConfigError(f"eagle train --init: {e}") from None
    if head.embed_tokens is not None:
        raise ConfigError(f"eagle train --init: {path} carries its own embedding table; specrt trains heads that "
                          "read the target's")
    variants = [v for v in cfg.variants if not v.startswith("layers=")]
    if variants:
        raise ConfigError(f"eagle train --init: {path} is a speculators-format variant ({', '.join(variants)}); "
                          "specrt trains the standard EAGLE-3 head (stacked or not)")
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
