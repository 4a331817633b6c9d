"""Loading Hugging Face models and tokenizers from a local folder or a hub id, with clear errors."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelLoadError, UnsupportedArchitectureError
from .graph.architectures import adapter_for

_DTYPES = {"float32": "float32", "float16": "float16"}


def is_path_like(source: str) -> bool:
    return source.startswith((".", "/", "~")) or Path(source).is_absolute() or "\\" in source or source.count("/") > 1


def resolve_source(source: str) -> str:
    """A local folder (must exist and hold config.json) or a hub id passed on to transformers."""
    p = Path(source).expanduser()
    if p.exists():
        if not p.is_dir():
            raise ModelLoadError(f"{source} is a file; pass the model's folder (the one with config.json) or a .gguf file")
        if not (p / "config.json").is_file():
            raise ModelLoadError(f"{source} has no config.json: not a Hugging Face model folder")
        return str(p)
    if is_path_like(source):
        raise ModelLoadError(f"model folder not found: {source}")
    return source  # a hub id such as "Qwen/Qwen2-0.5B"; transformers resolves and caches it


def load_config(source: str):
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"could not load the config of {source!r}: {str(e).splitlines()[0]}") from None
    # unsupported architectures and features fail here, before any weights load
    adapter_for(config.model_type).check_config(config)
    return config


def load_causal_lm(source: str, dtype: str):
    import torch
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    from .quant.gguf import find_gguf

    gguf = find_gguf(source)  # None for a folder or a hub id
    where = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name} if gguf else \
        {"pretrained_model_name_or_path": source}
    try:
        model = AutoModelForCausalLM.from_pretrained(**where, dtype=getattr(torch, _DTYPES[dtype]),
                                                     attn_implementation="eager")
    except ValueError as e:
        # transformers raises ValueError for configs with no causal-LM head (e.g. BERT, T5 encoders).
        raise UnsupportedArchitectureError(f"{source} is not a causal language model: {str(e).splitlines()[0]}") from None
    except (OSError, SafetensorError) as e:  # a truncated or corrupt weights file is a SafetensorError
        raise ModelLoadError(f"could not load the weights of {source!r}: {str(e).splitlines()[0]}") from None
    return model.eval()


def load_tokenizer(source: str):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"could not load the tokenizer of {source!r}: {str(e).splitlines()[0]}") from None
    if not getattr(tok, "is_fast", False):
        raise ModelLoadError(f"the tokenizer of {source!r} is not a fast tokenizer; specrt ships tokenizer.json "
                             "and needs one (convert it with transformers' PreTrainedTokenizerFast)")
    return tok


def load_generation_config(source: str):
    """The model's generation config, or None when it has none (its end ids then come from config.json)."""
    from transformers import GenerationConfig

    if Path(source).is_dir() and not (Path(source) / "generation_config.json").is_file():
        return None
    try:
        return GenerationConfig.from_pretrained(source)
    except OSError:
        if Path(source).is_dir():  # the file is there but unreadable: say so rather than drop its end ids
            raise ModelLoadError(f"could not read {source}/generation_config.json") from None
        return None  # a hub repo without generation_config.json
    except ValueError as e:
        raise ModelLoadError(f"the generation config of {source!r} is invalid: {str(e).splitlines()[0]}") from None
