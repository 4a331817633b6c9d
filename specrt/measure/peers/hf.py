"""Hugging Face transformers ``generate``, plain and assisted (``assistant_model=``), as peers of specrt.

torch and transformers are imported inside the functions: importing this module needs neither.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Sequence

from ...bundle.manifest import id_set
from ...errors import INSTALL_TORCH, ModelLoadError, SpecrtError
from ...runtime.sampling import SamplingConfig
from . import PeerRequest, PeerRun, missing_checkpoint, register_peer, until_end


def _load(folder: Path, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (folder / "config.json").is_file():
        raise ModelLoadError(missing_checkpoint(folder, "--hf-target/--hf-draft"))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    return model, AutoTokenizer.from_pretrained(folder)


def sampling_kwargs(sampling: SamplingConfig) -> dict:
    """``generate`` keywords for specrt's settings, every one explicit: a checkpoint's generation_config.json
    may set do_sample, temperature, top_k (often 50) or a repetition penalty of its own. top_k=0 is off."""
    if sampling.greedy:
        return {"do_sample": False, "repetition_penalty": 1.0}
    return {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "repetition_penalty": 1.0}


class HfPeer:
    """``model.generate`` one prompt at a time (batch 1, as specrt runs), from specrt's prompt ids."""

    def __init__(self, name: str, description: str, model, tokenizer, assistant=None,
                 details: dict | None = None) -> None:
        self.name, self.description, self.details = name, description, details or {}
        self.model, self.tokenizer = model, tokenizer
        self.assist = {} if assistant is None else {"assistant_model": assistant}
        self.end_ids = id_set(model.generation_config.eos_token_id)

    def encode(self, prompt: str) -> list[int]:
        return list(self.tokenizer(prompt)["input_ids"])

    def generate(self, prompt_ids: Sequence[list[int]], max_new_tokens: int, sampling: SamplingConfig,
                 seed: int) -> PeerRun:
        import torch

        kwargs = sampling_kwargs(sampling) | self.assist
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else next(iter(self.end_ids), 0)
        outs, seconds = [], 0.0
        for ids in prompt_ids:
            x = torch.tensor([ids])
            torch.manual_seed(seed)  # like specrt: every prompt of a repeat from the same seed
            t0 = time.perf_counter()
            with torch.no_grad():
                out = self.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                          pad_token_id=pad, **kwargs)
            seconds += time.perf_counter() - t0
            outs.append(until_end(out[0, len(ids):].tolist(), self.end_ids))
        return PeerRun(outs, seconds)


def _vocab(model) -> int:
    return model.config.get_text_config().vocab_size


def hf_peers(target: Path, draft: Path | None, threads: int | None = None, dtype: str = "float32") -> list[HfPeer]:
    """Plain generate on the target, and assisted generation with the draft when there is one."""
    import torch
    import transformers

    if threads:
        torch.set_num_threads(threads)
    model, tok = _load(Path(target), dtype)
    version = f"transformers {transformers.__version__}, torch {torch.__version__}, {dtype}"
    details = {"target": str(target), "dtype": dtype}
    assistant = _load(Path(draft), dtype)[0] if draft is not None else None
    skipped = ""
    if assistant is not None and _vocab(assistant) != _vocab(model):
        # A padded head makes transformers take the pair for two tokenizers, and its universal assisted
        # decoding (5.24) fails when sampling; specrt runs such pairs as one vocabulary.
        skipped = (f"; no assisted generation: the heads have {_vocab(model)} and {_vocab(assistant)} ids, "
                   "which transformers takes for two tokenizers")
        assistant = None
    peers = [HfPeer("hf_generate", f"Hugging Face generate ({version}){skipped}", model, tok, details=details)]
    if assistant is not None:
        peers.append(HfPeer("hf_assisted", f"Hugging Face assisted generation ({version})", model, tok, assistant,
                            details | {"draft": str(draft)}))
    return peers


@register_peer("hf")
def _hf(request: PeerRequest) -> list[HfPeer]:
    missing = [x for x in ("torch", "transformers") if importlib.util.find_spec(x) is None]
    if missing:
        # The export extra's install line (export.pipeline.INSTALL; measure/ does not import export/).
        raise SpecrtError(f"--compare hf needs torch and transformers ({missing[0]} is missing): "
                          f"{INSTALL_TORCH} && pip install 'specrt[export]'")
    return hf_peers(request.target, request.draft, threads=request.threads)
