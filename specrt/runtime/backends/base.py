"""The backend interface: the whole contract between the decoding loop and an inference engine."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Protocol

import numpy as np

from ...bundle.manifest import ModelEntry
from ...errors import ConfigError
from ..kvcache import KVCache


class DeviceLogits(Protocol):
    """Logits (Q, V) left in device memory after a pass, valid until the decoder's next pass: the host
    asks for what a step needs (argmax ids, a few top logits and the normaliser) instead of copying
    every row, and copies a whole row only when a distribution needs one."""

    copied_bytes: int  # device-to-host bytes copied so far
    width: int  # logits per row (V); may exceed the vocabulary the host cuts rows to
    max_k: int | None  # the most ids ``top`` can return; None: any

    def argmax(self) -> np.ndarray:
        """(Q,) int64; ties to the lower id."""

    def top(self, k: int, temperature: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids (Q, k) int64, their logits (Q, k) float32, log-sum-exp of logits / temperature (Q,)
        float64, a bound on that log-sum-exp's error (Q,) float64: 0 where it was computed in float64),
        any order among the k."""

    def row(self, i: int) -> np.ndarray:
        """Row i, float32 (V,), copied to the host."""

    def logit(self, i: int, token: int) -> float:
        """Row i's logit of ``token`` alone, copied to the host."""

    def tail(self, n: int) -> "DeviceLogits":
        """The last ``n`` rows alone, as a DeviceLogits: what a summary then covers."""


@dataclass(frozen=True)
class DecoderOutput:
    logits: np.ndarray | None  # (Q, V) float32, valid until the next forward; None when left on the device
    hidden: np.ndarray  # (Q, H)
    copied_bytes: int = 0  # brought from device memory to the host for this output (0 on CPU backends)
    device_logits: DeviceLogits | None = None  # set when ``logits`` stayed in device memory
    # The graph's further outputs by contract name (a target's eagle_taps: (Q, T*H)), valid until the next forward.
    extra: Mapping[str, np.ndarray] = field(default_factory=dict)
    # Seconds inside the engine's own run call, without the backend's binding and bookkeeping around it
    # (host work); None: the backend does not tell them apart, and its whole forward counts as the engine's.
    engine_s: float | None = None


class Decoder(Protocol):
    """One model on one engine. ``forward`` reads the cache's first ``length`` entries and writes the Q
    new K/V right after them; it never changes ``cache.length`` (the loop decides what becomes valid)."""

    entry: ModelEntry
    provider: str
    # One line for --stats on a GPU: "CUDA graphs: ..." when verify steps replay captured graphs, else why they
    # run eagerly; None where graphs do not apply (the CPU).
    graph_status: str | None

    def new_cache(self, max_context: int) -> KVCache: ...

    def forward(self, cache: KVCache, input_ids: np.ndarray, position_ids: np.ndarray,
                mask: np.ndarray) -> DecoderOutput: ...

    # A backend that runs EAGLE-3 (a target's eagle_taps output, a head's extra inputs) also takes
    # ``forward(..., extra={name: (Q, width) array})`` and sets ``supports_eagle = True``. Every backend
    # takes ``forward(..., logits_rows=R)`` for an entry with ``logits_index``: it may return the last R
    # rows' logits only (ONNX Runtime does) or all Q; callers read the last R.


class Heads(Protocol):
    """Medusa heads: hidden [1, Q, H] → (top-k ids [1, Q, heads, k] int64, log-probs [1, Q, heads, k])."""

    def __call__(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class BackendInfo:
    name: str
    available: Callable[[], bool]
    factory: Callable[..., Decoder]
    heads: Callable[..., Heads] | None = None
    accepts: Callable[[Path], bool] | None = None  # "auto" skips a backend that cannot run this bundle


_BACKENDS: dict[str, BackendInfo] = {}


def register_backend(name: str, available: Callable[[], bool], heads: Callable[..., Heads] | None = None,
                     accepts: Callable[[Path], bool] | None = None
                     ) -> Callable[[Callable[..., Decoder]], Callable[..., Decoder]]:
    """Class decorator: ``factory(bundle_dir, entry, threads=..., role=..., low_memory=...)`` builds a Decoder;
    ``heads(bundle_dir, file, threads=...)`` runs Medusa heads; ``accepts(bundle_dir)`` says whether
    "auto" may pick this backend for a bundle (e.g. TensorRT only once engines were built)."""

    def deco(factory: Callable[..., Decoder]) -> Callable[..., Decoder]:
        _BACKENDS[name] = BackendInfo(name, available, factory, heads, accepts)
        return factory

    return deco


def register_external(name: str, target: str, available: Callable[[], bool]) -> None:
    """A backend that lives outside the runtime (the torch side's), registered by its dotted name
    ``"package.module:Class"`` so that the runtime never imports it: the module is imported on first use.
    ``Class(bundle_dir, entry, threads=...)`` builds the Decoder."""

    def factory(bundle_dir, entry, threads=None, role="target", low_memory=None):
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)(bundle_dir, entry, threads=threads)

    factory.__doc__ = f"{target} (imported when first used)"
    _BACKENDS[name] = BackendInfo(name, available, factory)


# Backends "auto" may pick, in preference order; torch needs an explicit --backend torch.
AUTO_ORDER = ("tensorrt", "onnxruntime")


def available_backends() -> list[str]:
    """Registered backends that can run here, "auto"'s candidates first."""
    names = [b.name for b in _BACKENDS.values() if b.available()]
    return sorted(names, key=lambda n: AUTO_ORDER.index(n) if n in AUTO_ORDER else len(AUTO_ORDER))


def _backend(name: str, bundle_dir: Path | None = None) -> BackendInfo:
    if name == "auto":
        names = [n for n in available_backends() if n in AUTO_ORDER
                 and (bundle_dir is None or _BACKENDS[n].accepts is None or _BACKENDS[n].accepts(bundle_dir))]
        if not names:
            raise ConfigError("no inference backend is available; install onnxruntime")
        name = names[0]
    if name not in _BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(_BACKENDS)}")
    if not _BACKENDS[name].available():
        raise ConfigError(f"backend {name!r} is not available on this machine")
    return _BACKENDS[name]


# Intra-op threads one session may ask for: ONNX Runtime starts every one it is given (100000 hung the process)
# and more than a few per core only contend; 256 leaves room to experiment on any machine of today.
MAX_THREADS = max(256, 4 * (os.cpu_count() or 1))


def check_threads(threads: object) -> int | None:
    """``threads`` as intra-op threads: None or 0 (the backend's default, one per core) or 1..MAX_THREADS;
    else a ConfigError."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or not 0 <= threads <= MAX_THREADS:
        shown = threads if isinstance(threads, (int, np.integer)) else repr(threads)
        raise ConfigError(f"threads must be an integer in [1, {MAX_THREADS}] (0 or none: one per core), got {shown}")
    return int(threads)


def create_decoder(backend: str, bundle_dir: Path, entry: ModelEntry, threads: int | None = None,
                   role: str = "target", low_memory: bool | None = None) -> Decoder:
    """``role``: "target", or "draft" for a model run between target passes (a CPU backend keeps its threads
    from competing with the target's). ``low_memory``: a session that trades speed for no second copy of
    the weights (ONNX Runtime on CPU; None: when the default one would not fit; other backends ignore it)."""
    threads = check_threads(threads)
    return _backend(backend, bundle_dir).factory(bundle_dir, entry, threads=threads, role=role, low_memory=low_memory)


def create_heads(backend: str, bundle_dir: Path, file: str, threads: int | None = None) -> Heads:
    threads = check_threads(threads)
    info = _backend(backend, bundle_dir)
    if info.heads is None:
        raise ConfigError(f"backend {info.name!r} cannot run Medusa heads")
    return info.heads(bundle_dir, file, threads=threads)
