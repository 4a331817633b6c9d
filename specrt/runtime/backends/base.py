"""The backend interface: the whole contract between the decoding loop and an inference engine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from ...errors import ConfigError
from ...manifest import ModelEntry
from ..kvcache import KVCache


@dataclass(frozen=True)
class DecoderOutput:
    logits: np.ndarray  # (Q, V) float32; a view valid until the next forward of the same decoder
    hidden: np.ndarray  # (Q, H)


class Decoder(Protocol):
    """One model on one engine. ``forward`` reads ``cache.past`` and writes the Q new K/V into
    ``cache.slots``; it never changes ``cache.length`` (the loop decides what becomes valid)."""

    entry: ModelEntry
    provider: str

    def new_cache(self, max_context: int) -> KVCache: ...

    def forward(self, cache: KVCache, input_ids: np.ndarray, position_ids: np.ndarray,
                mask: np.ndarray) -> DecoderOutput: ...


@dataclass(frozen=True)
class BackendInfo:
    name: str
    available: Callable[[], bool]
    factory: Callable[..., Decoder]


_BACKENDS: dict[str, BackendInfo] = {}


def register_backend(name: str, available: Callable[[], bool]) -> Callable[[Callable[..., Decoder]], Callable[..., Decoder]]:
    """Class decorator: ``factory(bundle_dir, entry, threads=...)`` builds a Decoder."""

    def deco(factory: Callable[..., Decoder]) -> Callable[..., Decoder]:
        _BACKENDS[name] = BackendInfo(name, available, factory)
        return factory

    return deco


def available_backends() -> list[str]:
    """Registered backends that can run here, in preference order (registration order)."""
    return [b.name for b in _BACKENDS.values() if b.available()]


def create_decoder(backend: str, bundle_dir: Path, entry: ModelEntry, threads: int | None = None) -> Decoder:
    if backend == "auto":
        names = available_backends()
        if not names:
            raise ConfigError("no inference backend is available; install onnxruntime")
        backend = names[0]
    if backend not in _BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; known: {', '.join(_BACKENDS)}")
    if not _BACKENDS[backend].available():
        raise ConfigError(f"backend {backend!r} is not available on this machine")
    return _BACKENDS[backend].factory(bundle_dir, entry, threads=threads)
