"""What determines an EAGLE-3 training run (:class:`EagleTrainConfig`), validated when made: a leaf the data, the
unrolled loss and the pruning below :mod:`.train` read without importing the orchestrator."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from ..precision import COMPUTES, parse_device
from .config import DTYPES


def _int(name: str, value: Any, low: int, high: int | None = None, who: str = "eagle train") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"{who}: {name} must be an integer {bound}, got {value!r}")


def _real(name: str, value: Any, low: float, high: float, *, low_open: bool, high_open: bool,
          who: str = "eagle train") -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        span = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ConfigError(f"{who}: {name} must be a number in {span}, got {value!r}")


@dataclass(frozen=True)
class EagleTrainConfig:
    """Everything that determines a run; recorded verbatim in training.json."""

    steps: int = 1000
    lr: float = 5e-4  # peak AdamW learning rate (linear warm-up over 5% of the steps, then linear decay)
    batch_size: int = 8  # sequences per step
    seq_len: int = 256  # tokens per training sequence (prompt + continuation, or a text window)
    draft_vocab: int | None = 16384  # at most this many target ids (the most frequent in the training data,
    # end ids always in); None, or >= the target's vocabulary: the full vocabulary, no reduction
    ttt_steps: int = 3  # training-time test depth: unrolled head steps per root, also the held-out chain depth
    seed: int = 0
    heldout_fraction: float = 0.1  # of the prompts / text documents, held out whole (no shared prefixes)
    checkpoint_every: int = 100  # steps between resumable checkpoints
    num_sequences: int = 1000  # continuations generated from the training prompts in all (one each if greedy)
    temperature: float = 0.7  # of the training continuations; 0: greedy. Held-out ones are always greedy
    self_prompts: int = 0  # user messages the target writes itself (eagle_prompts), added to the seed prompts
    topk: int = 64  # target log-probabilities kept per position (the rest of its mass is one bucket)
    chat_template: bool = True  # wrap seed prompts in the tokenizer's chat template when it has one
    data_format: str = "chunks"  # data files: "chunks" (each file one document) or "lines" (one per line)
    loss_decay: float = 0.8  # unrolled step s weighs loss_decay**s (EAGLE-3, traineagle3/main.py:284)
    grad_clip: float = 0.5  # global gradient-norm clip (EAGLE-3 ds_config.json "gradient_clipping")
    init_from_target: bool = True  # lm_head rows and the final norm start as the target's own
    dtype: str = "float16"  # the saved head's float weights; held-out acceptance is measured with them
    keep_checkpoint: bool = False  # keep out_dir/.train (cache + checkpoint) after a finished run
    init: str | None = None  # a head to start from (warm start): its weights and draft vocabulary are kept
    compute: str = "auto"  # matmul precision of generating and training (autocast); auto: bfloat16 where the
    # CPU has it natively (AVX-512 BF16, AMX) and on CUDA GPUs from Ampere on, else float32. Held-out acceptance is
    # always measured in float32
    device: str = "auto"  # where the target generates and the head trains: auto (a CUDA GPU when torch sees one,
    # else the CPU), cpu, cuda or cuda:N. The data cache stays in host memory either way
    layers: int = 1  # decoder layers of a new head: the EAGLE-3 layer, then standard ones (speculators' stacked
    # heads, saved in its format); an --init head keeps its own count
    time_limit: float | None = None  # minutes of wall time for the whole run (eagle_budget): data stops at about half,
    # the step count is fitted to the rest (steps then a maximum) and the run stops at the limit with the head it has

    def __post_init__(self) -> None:
        _int("steps", self.steps, 1)
        _real("lr", self.lr, 0.0, 1.0, low_open=True, high_open=True)
        _int("batch_size", self.batch_size, 1)
        _int("ttt_steps", self.ttt_steps, 1, 16)
        _int("layers", self.layers, 1, 8)
        if self.time_limit is not None:
            _real("time_limit", self.time_limit, 0.0, math.inf, low_open=True, high_open=True)
        _int("seq_len", self.seq_len, self.ttt_steps + 3)  # room for one full chain after a root
        if self.draft_vocab is not None:
            _int("draft_vocab", self.draft_vocab, 1)
        _int("seed", self.seed, 0)
        _real("heldout_fraction", self.heldout_fraction, 0.0, 1.0, low_open=True, high_open=True)
        _int("checkpoint_every", self.checkpoint_every, 1)
        _int("num_sequences", self.num_sequences, 1)
        _int("self_prompts", self.self_prompts, 0)
        _real("temperature", self.temperature, 0.0, 100.0, low_open=False, high_open=False)
        _int("topk", self.topk, 1)
        _real("loss_decay", self.loss_decay, 0.0, 1.0, low_open=True, high_open=False)
        _real("grad_clip", self.grad_clip, 0.0, math.inf, low_open=True, high_open=True)
        for name in ("chat_template", "init_from_target", "keep_checkpoint"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"eagle train: {name} must be true or false, got {getattr(self, name)!r}")
        if self.data_format not in ("chunks", "lines"):
            raise ConfigError(f"eagle train: data_format must be 'chunks' or 'lines', got {self.data_format!r}")
        if self.init is not None and not (isinstance(self.init, str) and self.init):
            raise ConfigError(f"eagle train: init must be a head folder's path, got {self.init!r}")
        if not (isinstance(self.device, str) and self.device):
            raise ConfigError(f"eagle train: device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        try:
            parse_device(self.device)
        except ConfigError as e:
            raise ConfigError(f"eagle train: {e}") from None
        if self.compute not in COMPUTES:
            raise ConfigError(f"eagle train: compute must be one of {', '.join(COMPUTES)}, got {self.compute!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"eagle train: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @property
    def warmup_steps(self) -> int:
        return max(1, self.steps // 20)

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then linear decay towards 0 (EAGLE-3's WarmupDecayLR), for 0-based ``step``."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        return self.lr * (self.steps - step) / max(1, self.steps - self.warmup_steps)
