"""The decoders specrt is measured against, on the same checkpoints, prompts and sampling settings.

A peer is anything with a ``name``, a ``description``, ``encode(prompt) -> ids`` (its own tokenizer, to
check it against specrt's) and ``generate(prompt_ids, max_new_tokens, sampling, seed) -> PeerRun``.
``bench.run_bench`` runs peers inside its repeat loop, interleaved with specrt's methods.

Peer kinds register themselves (:func:`register_peer`, as runtime backends do): a factory turns one
:class:`PeerRequest` into the kind's peers. Each kind's module imports its framework lazily, so
registering costs nothing: ``hf`` (torch + transformers), ``ortgenai`` (onnxruntime-genai), ``llamacpp``
(llama-cpp-python).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence

from ...bundle.manifest import ModelEntry
from ...errors import ConfigError
from ...runtime.sampling import SamplingConfig

# How every peer counts: it stops at its end-of-sequence id as specrt does; new tokens are those produced,
# the end id excluded (specrt's count), so a peer that ends early is timed on the tokens it made.
COUNTING = "peers stop at the end-of-sequence id, as specrt does; new tokens = those produced, the end id excluded"


@dataclass(frozen=True)
class PeerRun:
    """One pass of a peer over the prompt set."""

    token_ids: list[list[int]]  # new tokens per prompt, the end id excluded
    seconds: float  # generation only: not tokenizing, not detokenizing

    @property
    def tokens_per_second(self) -> float:
        return sum(len(t) for t in self.token_ids) / self.seconds


class Peer(Protocol):
    name: str
    description: str
    details: dict  # facts for the JSON report: precision, build, checkpoint

    def encode(self, prompt: str) -> list[int]: ...

    def generate(self, prompt_ids: Sequence[list[int]], max_new_tokens: int, sampling: SamplingConfig,
                 seed: int) -> PeerRun: ...


@dataclass(frozen=True)
class PeerRequest:
    """What a peer is built from: the bundle's source checkpoints and the settings of ``--compare``."""

    target: Path  # Hugging Face checkpoint of the bundle's target
    draft: Path | None  # ... of its draft, where the bundle has one
    entry: ModelEntry  # the bundle's target: a peer that builds its own model matches its precision
    threads: int | None = None
    precision: str | None = None  # --peer-precision, for kinds registered with precision=True
    cache_dir: Path | None = None  # --peer-cache: where a kind keeps what it builds [default: its own]
    on_progress: Callable[[str], None] | None = None  # one line at a time while a kind builds
    gguf: Path | None = None  # --peer-gguf: the llama.cpp model file [default: the target's source, if a GGUF]


@dataclass(frozen=True)
class PeerKind:
    name: str
    factory: Callable[[PeerRequest], list[Peer]]
    precision: bool = False  # builds its own model, at PeerRequest.precision when one is given


_PEERS: dict[str, PeerKind] = {}


def register_peer(name: str, precision: bool = False
                  ) -> Callable[[Callable[[PeerRequest], list[Peer]]], Callable[[PeerRequest], list[Peer]]]:
    """Decorator: ``factory(request) -> [Peer, ...]`` is the ``--compare NAME`` kind (one kind may give several
    peers, e.g. plain and assisted generation). ``precision``: the kind takes ``--peer-precision``."""

    def deco(factory: Callable[[PeerRequest], list[Peer]]) -> Callable[[PeerRequest], list[Peer]]:
        _PEERS[name] = PeerKind(name, factory, precision)
        return factory

    return deco


def peer_kinds() -> tuple[str, ...]:
    """The registered kinds, in registration order."""
    return tuple(_PEERS)


def _kind(name: str) -> PeerKind:
    if name not in _PEERS:
        raise ConfigError(f"unknown peer {name!r} for --compare; choose from {', '.join(_PEERS)}")
    return _PEERS[name]


def parse_kinds(values: Iterable[str]) -> tuple[str, ...]:
    """``--compare`` values, each one name or a comma-separated list, in order, without repeats."""
    kinds: list[str] = []
    for value in values:
        for name in (v.strip() for v in value.split(",")):
            if name and name not in kinds:
                kinds.append(_kind(name).name)
    return tuple(kinds)


def create_peers(kinds: Sequence[str], request: PeerRequest) -> list[Peer]:
    """The peers of ``kinds`` in order, each kind built by its registered factory."""
    infos = [_kind(k) for k in kinds]
    if request.precision and not any(info.precision for info in infos):
        takes = " or ".join(k.name for k in _PEERS.values() if k.precision)
        raise ConfigError(f"--peer-precision applies to --compare {takes}")
    return [peer for info in infos for peer in info.factory(request)]


def until_end(ids: Sequence[int], end_ids: Iterable[int]) -> list[int]:
    """The ids before the first end id (a peer's sequence may end with one; specrt's never does)."""
    ends = set(end_ids)
    out: list[int] = []
    for t in ids:
        if t in ends:
            break
        out.append(int(t))
    return out


def missing_checkpoint(checkpoint: Path, flag: str) -> str:
    state = "has no config.json" if checkpoint.is_dir() else "does not exist"
    return (f"the comparison needs the Hugging Face checkpoint the bundle was exported from; {checkpoint} {state} "
            f"(pass {flag})")


# Importing a peer module registers its kind (none imports its framework until a peer is built).
from . import hf as _hf  # noqa: E402,F401
from . import llamacpp as _llamacpp  # noqa: E402,F401
from . import ortgenai as _ortgenai  # noqa: E402,F401
