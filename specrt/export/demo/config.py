"""What determines a demo training run (:mod:`specrt.export.demo.train`): the two models' shapes and the run's
settings, validated when made and recorded verbatim in ``training.json``."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch

from ...errors import ConfigError
from . import corpus


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int

    def check(self, name: str) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}.{f.name} must be a positive integer, got {value!r}")
        if self.hidden % self.heads:
            raise ConfigError(f"{name}.hidden ({self.hidden}) must be a multiple of {name}.heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ConfigError(f"{name}.heads ({self.heads}) must be a multiple of {name}.kv_heads ({self.kv_heads})")
        if (self.hidden // self.heads) % 2:
            raise ConfigError(f"{name} head size {self.hidden // self.heads} must be even (rotary embeddings)")

    @classmethod
    def parse(cls, text: str) -> ModelShape:
        """'HIDDEN,LAYERS,HEADS,KV_HEADS,INTERMEDIATE', as the CLI takes it."""
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            values = []
        if len(values) != 5:
            raise ConfigError(f"a model shape is HIDDEN,LAYERS,HEADS,KV_HEADS,INTERMEDIATE, got {text!r}")
        return cls(*values)


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a run; recorded verbatim in training.json."""

    vocab_size: int = 4096
    target: ModelShape = ModelShape(hidden=384, layers=6, heads=6, kv_heads=2, intermediate=1024)
    draft: ModelShape = ModelShape(hidden=128, layers=2, heads=4, kv_heads=1, intermediate=384)
    max_position_embeddings: int = 1024
    seq_len: int = 256
    batch_size: int = 16
    target_steps: int = 2000
    draft_steps: int = 2000
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_fraction: float = 0.05  # a fraction, not a step count, so changing --target-steps never breaks it
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    ce_weight: float = 0.1  # draft loss = (1 - ce_weight) * KL(p_target || q_draft) + ce_weight * CE
    eval_every: int = 250
    eval_batches: int = 8
    val_fraction: float = corpus.VAL_FRACTION
    max_corpus_bytes: int | None = None  # per split; None = the whole stdlib
    seed: int = 0
    threads: int = 2
    device: str = "cpu"

    def __post_init__(self) -> None:
        self.target.check("target")
        self.draft.check("draft")
        _positive_ints(self, "vocab_size", "max_position_embeddings", "seq_len", "batch_size", "target_steps",
                       "draft_steps", "eval_every", "eval_batches", "threads")
        if self.vocab_size <= 258:
            raise ConfigError(f"vocab_size must exceed 258 (256 bytes + <s> + </s>), got {self.vocab_size}")
        if self.seq_len > self.max_position_embeddings:
            raise ConfigError(f"seq_len ({self.seq_len}) must not exceed max_position_embeddings "
                              f"({self.max_position_embeddings})")
        _in_range(self, "lr", 0.0, 1.0, low_open=True)
        _in_range(self, "min_lr_ratio", 0.0, 1.0)
        _in_range(self, "warmup_fraction", 0.0, 1.0, high_open=True)
        _in_range(self, "weight_decay", 0.0, 1.0)
        _in_range(self, "grad_clip", 0.0, math.inf, low_open=True)
        _in_range(self, "ce_weight", 0.0, 1.0)
        _in_range(self, "val_fraction", 0.0, 0.5, low_open=True)
        if self.max_corpus_bytes is not None and self.max_corpus_bytes < 1:
            raise ConfigError(f"max_corpus_bytes must be positive or None, got {self.max_corpus_bytes}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError) as e:
            raise ConfigError(f"device {self.device!r} is not a torch device: {e}") from None

    @classmethod
    def tiny(cls, **overrides: Any) -> TrainConfig:
        """A smoke-test preset: whole pipeline in seconds, models too small to be useful."""
        preset: dict[str, Any] = dict(
            vocab_size=512, target=ModelShape(32, 2, 2, 1, 64), draft=ModelShape(16, 1, 2, 1, 32),
            seq_len=64, batch_size=4, target_steps=20, draft_steps=20, lr=3e-3, warmup_fraction=0.1,
            eval_every=10, eval_batches=2, max_corpus_bytes=300_000)
        return cls(**{**preset, **overrides})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Inverse of ``dataclasses.asdict``, e.g. the ``config`` of a training.json."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        values = dict(data)
        for key in ("target", "draft"):
            if isinstance(values.get(key), dict):
                values[key] = ModelShape(**values[key])
        return cls(**values)


def _positive_ints(cfg: TrainConfig, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _in_range(cfg: TrainConfig, name: str, low: float, high: float, *, low_open: bool = False,
              high_open: bool = False) -> None:
    value = getattr(cfg, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        brackets = ("(" if low_open else "[") + f"{low}, {high}" + (")" if high_open else "]")
        raise ConfigError(f"{name} must be in {brackets}, got {value!r}")
