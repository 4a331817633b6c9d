"""Where and in what precision the torch side does its long work (EAGLE-3 training): the device (the CPU, or a
CUDA GPU when there is one), and float32 or bfloat16 where the device multiplies it natively (a bfloat16 copy
of the target to generate with, autocast for the head's step)."""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any

import torch

from ..errors import ConfigError, TrainingDivergedError

COMPUTES = ("auto", "float32", "bfloat16")


def parse_device(device: str) -> torch.device | None:
    """``device`` as torch names it (None for ``auto``), refused in one line unless the CPU or a CUDA GPU."""
    if device == "auto":
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {device!r}: specrt trains on the CPU or a CUDA GPU (auto, cpu, cuda, cuda:N)")
    return dev


def resolve_device(device: str) -> torch.device:
    """``auto``: the first CUDA GPU when torch sees one, else the CPU; ``cpu``, ``cuda`` or ``cuda:N`` as named,
    refused in one line when torch cannot use it."""
    dev = parse_device(device)
    if dev is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is a CPU build" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ConfigError(f"device {device!r}: {why} (torch {torch.__version__}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device {device!r}: torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    return dev


def compute_context(compute: str, device: torch.device | str = "cpu") -> contextlib.AbstractContextManager:
    """Matmuls in ``compute`` ("float32" or "bfloat16", autocast: weights, norms and sums stay fp32) on
    ``device``'s type for the context: what training the head runs under. bfloat16 is 2.4× float32's matmul
    rate on a CPU with AVX-512 BF16 (Zen 4, 2 cores)."""
    if compute == "bfloat16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX); elsewhere it is emulated, slower
    than float32."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def resolve_compute(compute: str, device: torch.device | str = "cpu") -> str:
    """``auto``: bfloat16 where ``device`` multiplies it natively (a CPU with AVX-512 BF16 or AMX, a CUDA GPU
    from Ampere on), else float32."""
    if compute != "auto":
        return compute
    dev = torch.device(device)
    if dev.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float32"
    return "bfloat16" if native_bf16() else "float32"


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


def apply_update(module: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, grad_clip: float,
                 diverged: str, hint: str) -> float:
    """The update every trainer here makes: backward, the gradient-norm clip at ``grad_clip``, the optimizer's step;
    returns the loss's value. A loss that is not finite raises ``TrainingDivergedError`` first: "``diverged`` (loss
    VALUE); ``hint``"."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise TrainingDivergedError(f"{diverged} (loss {value}); {hint}")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), grad_clip)
    opt.step()
    return value
