"""The torch side's matmul precision for long CPU work (EAGLE-3 training): float32, or bfloat16 where the CPU
multiplies it natively (a bfloat16 copy of the target to generate with, autocast for the head's step)."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch

COMPUTES = ("auto", "float32", "bfloat16")


def compute_context(compute: str) -> contextlib.AbstractContextManager:
    """Matmuls in ``compute`` ("float32" or "bfloat16", autocast: weights, norms and sums stay fp32) for the
    context: what training the head runs under. bfloat16 is 2.4× float32's matmul rate on a CPU with
    AVX-512 BF16 (Zen 4, 2 cores)."""
    if compute == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX); elsewhere it is emulated, slower
    than float32."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def resolve_compute(compute: str) -> str:
    """``auto``: bfloat16 where the CPU has it natively, else float32."""
    if compute == "auto":
        return "bfloat16" if native_bf16() else "float32"
    return compute


class _Generating:
    """The target as it generates in bfloat16: a bfloat16 copy of its decoder and LM head (weights,
    activations and KV cache all bfloat16: under autocast the rotated keys stay fp32 and the whole cache is
    cast again every step, 40 % of generating). Sampling and the argmax read its logits; the cached
    log-probabilities are the fp32 LM head's on its last hidden state (``_cache``)."""

    def __init__(self, model: Any) -> None:
        self.config = model.config
        self._decoder = copy.deepcopy(model.get_decoder()).to(torch.bfloat16)
        self._lm_head = copy.deepcopy(model.get_output_embeddings()).to(torch.bfloat16)

    def get_decoder(self) -> Any:
        return self._decoder

    def get_output_embeddings(self) -> Any:
        return self._lm_head


def generating(model: Any, compute: str) -> Any:
    """The target to generate training data with: itself (float32), or ``_Generating`` (bfloat16)."""
    return _Generating(model) if compute == "bfloat16" else model
