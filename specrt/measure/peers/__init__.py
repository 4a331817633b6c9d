"""The decoders specrt is measured against, on the same checkpoints, prompts and sampling settings.

A peer is anything with a ``name``, a ``description``, ``encode(prompt) -> ids`` (its own tokenizer, to
check it against specrt's) and ``generate(prompt_ids, max_new_tokens, sampling, seed) -> PeerRun``.
``bench.run_bench`` runs peers inside its repeat loop, interleaved with specrt's methods. Each peer's
module imports its framework lazily: ``hf`` (torch + transformers), ``ortgenai`` (onnxruntime-genai).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol, Sequence

from ...errors import ConfigError
from ...runtime.sampling import SamplingConfig

KINDS = ("hf", "ortgenai")
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


def parse_kinds(values: Iterable[str]) -> tuple[str, ...]:
    """``--compare`` values, each one name or a comma-separated list, in order, without repeats."""
    kinds: list[str] = []
    for value in values:
        for name in (v.strip() for v in value.split(",")):
            if not name:
                continue
            if name not in KINDS:
                raise ConfigError(f"unknown peer {name!r} for --compare; choose from {', '.join(KINDS)}")
            if name not in kinds:
                kinds.append(name)
    return tuple(kinds)


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
