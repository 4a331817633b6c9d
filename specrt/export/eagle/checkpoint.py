"""An EAGLE-3 head's checkpoint folder in the published layout (``config.json`` + ``model.safetensors``, its
shards, or a ``pytorch_model.bin``; also the ``speculators`` format, :mod:`specrt.export.eagle.speculators`):
reading it, checked name by name and shape by shape against the config and the target (:func:`load_eagle3`),
and writing it (:func:`save_eagle3`). The head itself is :mod:`specrt.export.eagle.head`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ...errors import EagleHeadError
from ..staging import write_weights
from .config import DTYPES, Eagle3Config
from .head import Eagle3Head
from .native import native_json, read_native
from .speculators import config_fields, is_speculators, rename_weights, to_config, to_speculators_names
from .vocab import validate_vocab_map

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
BIN_NAME = "pytorch_model.bin"


def _layer_shapes(cfg: Eagle3Config, prefix: str, width: int) -> dict[str, tuple[int, ...]]:
    """A decoder layer's weights: the midlayer's q, k, v read ``width`` 2H, a stacked layer's H."""
    h, d = cfg.hidden_size, cfg.head_dim
    attn = {"q_proj": (cfg.num_attention_heads * d, width), "k_proj": (cfg.num_key_value_heads * d, width),
            "v_proj": (cfg.num_key_value_heads * d, width), "o_proj": (h, cfg.num_attention_heads * d)}
    if cfg.qk_norm:
        attn.update(q_norm=(d,), k_norm=(d,))
    mlp = {"gate_proj": (cfg.intermediate_size, h), "up_proj": (cfg.intermediate_size, h),
           "down_proj": (h, cfg.intermediate_size)}
    return {f"{prefix}.input_layernorm.weight": (h,), f"{prefix}.post_attention_layernorm.weight": (h,),
            **{f"{prefix}.self_attn.{n}.weight": s for n, s in attn.items()},
            **{f"{prefix}.mlp.{n}.weight": s for n, s in mlp.items()}}


def _expected_shapes(cfg: Eagle3Config) -> dict[str, tuple[int, ...]]:
    h = cfg.hidden_size
    tap_norms = ({"input_norm.weight": (3 * cfg.target_hidden_size,)} if cfg.tap_norm == "joint" else
                 {f"fc_norm.{i}.weight": (cfg.target_hidden_size,) for i in range(3)} if cfg.tap_norm == "each" else {})
    stacked = {k: v for i in range(1, cfg.num_layers) for k, v in _layer_shapes(cfg, f"layers.{i}", h).items()}
    return {"fc.weight": (h, 3 * cfg.target_hidden_size), **tap_norms,
            "midlayer.hidden_norm.weight": (h,), **_layer_shapes(cfg, "midlayer", 2 * h), **stacked,
            "norm.weight": (h,), "lm_head.weight": (cfg.draft_vocab_size, h)}


# what a head folder holds: fetched from the hub, nothing else is (READMEs, training logs, optimizer states)
HEAD_FILES = (CONFIG_NAME, "*.safetensors", WEIGHTS_NAME + ".index.json", BIN_NAME)


def resolve_head(source: str | os.PathLike) -> Path:
    """A local head folder, or a hub id (``owner/name``) fetched into the Hugging Face cache as a target's hub id
    is (its config and weights only). Export and training call this; the runtime reads the local folder."""
    folder = Path(source).expanduser()
    if folder.is_dir():
        return folder
    from ..loading import is_path_like

    text = str(source)
    if folder.exists() or is_path_like(text) or text.count("/") != 1:
        raise EagleHeadError(f"EAGLE-3 head folder not found: {source}")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=text, allow_patterns=list(HEAD_FILES)))
    except (OSError, ValueError) as e:  # the hub's HTTP, offline and repo-id errors derive from these
        raise EagleHeadError(f"EAGLE-3 head {text!r} is neither a local folder nor fetchable from the Hugging Face "
                             f"hub: {str(e).splitlines()[0]}") from None


def _shards(folder: Path, index: Path) -> list[Path]:
    """The files a ``model.safetensors.index.json`` names (heads that ship the embedding table are often
    sharded), each inside ``folder``."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))  # mixed types do not sort: a TypeError, caught below
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise EagleHeadError(f"{index} is not a safetensors index (no weight_map): {e}") from None
    bad = [n for n in names if not isinstance(n, str) or (folder / n).parent != folder or not (folder / n).is_file()]
    if bad:
        raise EagleHeadError(f"{index} names {bad[0]!r}, which is not a file in {folder}")
    return [folder / n for n in names]


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    import pickle

    from safetensors import SafetensorError

    st, bin_, index = folder / WEIGHTS_NAME, folder / BIN_NAME, folder / (WEIGHTS_NAME + ".index.json")
    if st.is_file() or bin_.is_file() or index.is_file():
        try:
            if st.is_file() or index.is_file():
                from safetensors.torch import load_file

                state: dict = {}
                for f in [st] if st.is_file() else _shards(folder, index):
                    state.update(load_file(str(f)))
                return state
            state = torch.load(str(bin_), map_location="cpu", weights_only=True)
        except (SafetensorError, OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as e:
            # what safetensors and torch.load raise for a truncated or corrupt file
            raise EagleHeadError(f"could not read the weights of {folder}: {str(e).splitlines()[0]}") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise EagleHeadError(f"{bin_} is not a state dict of tensors")
        return state
    if (folder / (BIN_NAME + ".index.json")).is_file():
        raise EagleHeadError(f"{folder} holds a sharded {BIN_NAME}; EAGLE-3 heads are read from one .bin file "
                             "or from safetensors")
    raise EagleHeadError(f"{folder} has no {WEIGHTS_NAME} or {BIN_NAME}")


def _check_layout(state: dict[str, torch.Tensor], raw: dict, where: str) -> None:
    """EAGLE-1/2 and other layouts, told apart before the config's shapes are checked."""
    keys = set(state)
    fc = state.get("fc.weight")
    hidden = raw.get("hidden_size") if isinstance(raw, dict) else None
    fused = 3 * (raw.get("target_hidden_size") or hidden) if isinstance(hidden, int) else None
    # EAGLE-1/2's fc reads cat(embedding, feature): 2H inputs (and 3*H_t may equal 2H only by accident)
    fc_2h = (fc is not None and fc.dim() == 2 and fc.shape[1] == 2 * fc.shape[0] and fc.shape[1] != fused)
    if not any(k.startswith("midlayer.") for k in keys):
        if any(k.startswith("layers.") for k in keys):
            if fc_2h or "fc.bias" in keys or not any(k.endswith("hidden_norm.weight") for k in keys):
                raise EagleHeadError(f"{where} is an EAGLE-1/2 checkpoint (layers.N.*, fc over 2H, no midlayer); "
                                     "specrt reads EAGLE-3 heads only")
            raise EagleHeadError(f"{where} stores its decoder layer as layers.N.* but its config.json is not in the "
                                 "speculators format (no speculators_model_type); the flat layout names it midlayer.*")
        raise EagleHeadError(f"{where} has no midlayer.* weights: not an EAGLE-3 head")
    if fc_2h or "fc.bias" in keys:
        raise EagleHeadError(f"{where} has an EAGLE-1/2 fc ({'2H inputs' if fc_2h else 'with a bias'}); "
                             "an EAGLE-3 fc fuses three target states (3 x H_t -> H, no bias)")


def _target_dims(target_config: Any) -> tuple[int, int, int | None]:
    get = target_config.get if isinstance(target_config, dict) else lambda k, default=None: getattr(
        target_config, k, default)
    text = get("text_config")  # multimodal wrappers keep the language model's numbers here
    if text is not None:
        return _target_dims(text)
    hidden, vocab = get("hidden_size"), get("vocab_size")
    if hidden is None or vocab is None:
        raise EagleHeadError("the target config has no hidden_size or vocab_size")
    return hidden, vocab, get("num_hidden_layers")


def check_target(cfg: Eagle3Config, target_config: Any, *, has_embedding: bool = False) -> tuple[int, int, int] | None:
    """Refuse a head made for another target; returns the taps to read from it (None without a layer count)."""
    hidden, vocab, layers = _target_dims(target_config)
    if cfg.target_hidden_size != hidden:
        raise EagleHeadError(f"the head was made for a target of hidden size {cfg.target_hidden_size} (fc takes "
                             f"3 x {cfg.target_hidden_size}); this target's is {hidden}")
    if cfg.vocab_size != vocab:
        raise EagleHeadError(f"the head's vocab_size is {cfg.vocab_size}; this target's is {vocab}")
    if not has_embedding and cfg.hidden_size != hidden:
        raise EagleHeadError(f"the head is {cfg.hidden_size} wide and ships no embed_tokens.weight, so it needs "
                             f"the target's embedding, which is {hidden} wide")
    return None if layers is None else cfg.tap_layers_for(layers)


def load_eagle3(path: str | os.PathLike, target_config: Any = None, *, dtype: torch.dtype = torch.float32
                ) -> tuple[Eagle3Config, Eagle3Head, torch.Tensor, torch.Tensor]:
    """Read a head in the published layout; with ``target_config`` (an HF config or its dict), also
    check that it was made for that target. Returns (config, head in eval mode, d2t int64, t2d bool)."""
    folder = Path(path)
    if not folder.is_dir():
        raise EagleHeadError(f"EAGLE-3 head folder not found: {folder}")
    config_file = folder / CONFIG_NAME
    if not config_file.is_file():
        raise EagleHeadError(f"{folder} has no {CONFIG_NAME}")
    try:
        raw = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EagleHeadError(f"{config_file} is not valid JSON: {e}") from None
    state = _read_weights(folder)
    if is_speculators(raw):
        cfg = read_config(raw)  # the config first: its refusals name the variant, not a weight
        state = rename_weights(state)
        _check_layout(state, raw.get("transformer_layer_config", {}), str(folder))
    else:
        _check_layout(state, raw, str(folder))
        cfg = read_config(raw)

    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}  # derived from the config
    d2t, t2d = state.pop("d2t", None), state.pop("t2d", None)
    embedding = state.pop("embed_tokens.weight", None)
    expected = _expected_shapes(cfg)
    missing = [k for k in expected if k not in state]
    if missing:
        raise EagleHeadError(f"{folder} lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise EagleHeadError(f"{folder} has unexpected weights {', '.join(unexpected[:3])}"
                             f"{' ...' if len(unexpected) > 3 else ''}")
    if embedding is not None:
        expected["embed_tokens.weight"] = (cfg.vocab_size, cfg.hidden_size)
        state["embed_tokens.weight"] = embedding
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise EagleHeadError(f"{name} is {list(state[name].shape)}, the config implies {list(shape)}")
        if not state[name].dtype.is_floating_point:
            raise EagleHeadError(f"{name} is {state[name].dtype}, expected a float tensor")
    d2t, t2d = validate_vocab_map(d2t, t2d, cfg.vocab_size, cfg.draft_vocab_size)
    if target_config is not None:
        check_target(cfg, target_config, has_embedding=embedding is not None)

    head = Eagle3Head(cfg, with_embedding=embedding is not None).to(dtype)
    head.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
    return cfg, head.eval(), d2t, t2d


def read_config(raw: Any) -> Eagle3Config:
    """A published head's ``config.json`` (parsed) as an :class:`Eagle3Config`: the ``speculators`` format
    (:mod:`.speculators`) or EAGLE's flat layout (:mod:`.native`), each refusing what specrt cannot run."""
    return Eagle3Config(**config_fields(raw)) if is_speculators(raw) else read_native(raw)


def flat_layout(cfg: Eagle3Config) -> bool:
    """Whether EAGLE's flat layout can describe ``cfg`` (a tap norm it can; the other variants it cannot)."""
    return not [v for v in cfg.variants if not v.startswith("tap_norm")]


def config_json(cfg: Eagle3Config, torch_dtype: str) -> dict:
    """``cfg`` as the ``config.json`` :func:`save_eagle3` writes: EAGLE's flat layout where it can say it (what
    EAGLE, SpecForge, vLLM and llama.cpp read), else the speculators format (what vLLM reads)."""
    return native_json(cfg, torch_dtype) if flat_layout(cfg) else to_config(cfg, torch_dtype)


def save_eagle3(path: str | os.PathLike, cfg: Eagle3Config, head: Eagle3Head, d2t: torch.Tensor | None,
                t2d: torch.Tensor | None, *, dtype: str = "float32") -> Path:
    """Write ``config.json`` + ``model.safetensors`` in a published layout (float weights as ``dtype``; d2t
    int64, t2d bool): EAGLE's flat one, or the speculators format for what it cannot describe
    (:func:`config_json`). Everything is checked before anything is written, and each file lands by rename,
    so a failure leaves no half-written head."""
    if dtype not in DTYPES:
        raise EagleHeadError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if head.cfg != cfg:
        raise EagleHeadError("the head was built from another config than the one given to save_eagle3")
    d2t, t2d = validate_vocab_map(d2t, t2d, cfg.vocab_size, cfg.draft_vocab_size)
    config_text = json.dumps(config_json(cfg, dtype), indent=2) + "\n"
    state = {k: v.detach().to("cpu", DTYPES[dtype]).contiguous() for k, v in head.state_dict().items()}
    if not flat_layout(cfg):
        state = to_speculators_names(state)
    state["d2t"], state["t2d"] = d2t.contiguous(), t2d.contiguous()

    folder = Path(path)
    try:
        write_weights(folder, state, WEIGHTS_NAME, config_text, CONFIG_NAME)
    except OSError as e:
        raise EagleHeadError(f"could not write the EAGLE-3 head to {folder}: {e}") from None
    return folder
