"""What determines a DFlash training run (:class:`DFlashTrainConfig`), validated when made: the draft's shape and
loss, the optimisation, and the data settings handed to the EAGLE-3 data pipeline it reuses (:meth:`data_config`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from ..eagle.config import DTYPES
from ..eagle.train_config import EagleTrainConfig, _int, _real
from ..precision import COMPUTES, parse_device
from .config import MAX_BLOCK

WHO = "dflash train"
CPU_LAYERS, GPU_LAYERS = 1, 5  # a new draft's layers by default: one on a CPU, z-lab's five on a GPU


def default_gamma(block_size: int) -> float:
    """The loss decay of a block of ``block_size``: 1 + 3B/8, the line through the published defaults
    (speculators' 4 at B = 8, SpecForge's 7 at B = 16)."""
    return 1 + 3 * block_size / 8


@dataclass(frozen=True)
class DFlashTrainConfig:
    """Everything that determines a run; recorded verbatim in training.json."""

    steps: int = 2000  # at most; a --time-limit fits fewer
    lr: float = 6e-4  # peak AdamW learning rate (SpecForge's DFlash recipes)
    batch_size: int = 8  # sequences per step
    anchors: int = 32  # blocks per sequence per step, drawn anew each step among its scored positions (SpecForge:
    # up to 512 a sequence of 3072 tokens, one position in six)
    block_size: int = 8  # B: the anchor token then B-1 masks; a step proposes B-1 tokens
    layers: int | None = None  # decoder layers of the draft; None: 1 on a CPU, 5 on a GPU (z-lab's)
    target_layer_ids: tuple[int, ...] | None = None  # after-layer ids fused into fc; None: z-lab's default rule
    gamma: float | None = None  # slot k's loss weighs exp(-(k-1)/gamma); None: default_gamma(block_size)
    seq_len: int = 256  # tokens per training sequence (prompt + continuation, or a text window)
    draft_vocab: int | None = 16384  # as eagle train: the most frequent target ids; None: the whole vocabulary
    num_sequences: int = 1000  # continuations generated from the training prompts in all
    temperature: float = 0.7  # of the training continuations; held-out ones are greedy
    self_prompts: int = 0  # user messages the target writes itself (eagle train's --self-prompts)
    topk: int = 64  # target log-probabilities kept per position (the rest of its mass is one bucket)
    chat_template: bool = True
    data_format: str = "chunks"  # data files: "chunks" (each file one document) or "lines"
    heldout_fraction: float = 0.1  # of the prompts / documents, held out whole
    seed: int = 0
    warmup: float = 0.04  # of the steps, linear from 0 (SpecForge's warmup_ratio); then cosine decay to 0
    grad_clip: float = 1.0  # global gradient-norm clip (SpecForge's max_grad_norm)
    checkpoint_every: int = 100  # steps between resumable checkpoints
    keep_checkpoint: bool = False  # keep out_dir/.train (cache + checkpoint) after a finished run
    dtype: str = "bfloat16"  # the saved draft's weights (z-lab publishes bfloat16); held-out acceptance uses them
    compute: str = "auto"  # matmul precision of generating and training, as eagle train's
    device: str = "auto"  # auto (a CUDA GPU when torch sees one, else the CPU), cpu, cuda or cuda:N
    time_limit: float | None = None  # minutes of wall time for the whole run, as eagle train's

    def __post_init__(self) -> None:
        for name, low, high in (("steps", 1, None), ("batch_size", 1, None), ("anchors", 1, None),
                                ("block_size", 2, MAX_BLOCK), ("seq_len", 4, None), ("num_sequences", 1, None),
                                ("self_prompts", 0, None), ("topk", 1, None), ("seed", 0, None),
                                ("checkpoint_every", 1, None)):
            _int(name, getattr(self, name), low, high, WHO)
        if self.layers is not None:
            _int("layers", self.layers, 1, 16, WHO)
        if self.draft_vocab is not None:
            _int("draft_vocab", self.draft_vocab, 1, None, WHO)
        _real("lr", self.lr, 0.0, 1.0, low_open=True, high_open=True, who=WHO)
        _real("warmup", self.warmup, 0.0, 1.0, low_open=False, high_open=True, who=WHO)
        _real("grad_clip", self.grad_clip, 0.0, math.inf, low_open=True, high_open=True, who=WHO)
        _real("temperature", self.temperature, 0.0, 100.0, low_open=False, high_open=False, who=WHO)
        _real("heldout_fraction", self.heldout_fraction, 0.0, 1.0, low_open=True, high_open=True, who=WHO)
        for name in ("gamma", "time_limit"):
            if getattr(self, name) is not None:
                _real(name, getattr(self, name), 0.0, math.inf, low_open=True, high_open=True, who=WHO)
        if self.target_layer_ids is not None:
            _layer_ids(self.target_layer_ids)
            object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        self._check_choices()

    def _check_choices(self) -> None:
        for name in ("chat_template", "keep_checkpoint"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{WHO}: {name} must be true or false, got {getattr(self, name)!r}")
        for name, value, allowed in (("data_format", self.data_format, ("chunks", "lines")),
                                     ("compute", self.compute, COMPUTES), ("dtype", self.dtype, tuple(DTYPES))):
            if value not in allowed:
                raise ConfigError(f"{WHO}: {name} must be one of {', '.join(allowed)}, got {value!r}")
        if not (isinstance(self.device, str) and self.device):
            raise ConfigError(f"{WHO}: device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        try:
            parse_device(self.device)
        except ConfigError as e:
            raise ConfigError(f"{WHO}: {e}") from None

    @property
    def decay(self) -> float:
        return default_gamma(self.block_size) if self.gamma is None else float(self.gamma)

    def slot_weights(self) -> list[float]:
        """The loss weight of each block slot: 0 for slot 0 (the anchor token, given), exp(-(k-1)/gamma) for k >= 1
        (normalised by their sum over the slots that have a target)."""
        return [0.0] + [math.exp(-(k - 1) / self.decay) for k in range(1, self.block_size)]

    def num_layers(self, device_type: str) -> int:
        return self.layers if self.layers is not None else GPU_LAYERS if device_type == "cuda" else CPU_LAYERS

    def warmup_steps(self, steps: int) -> int:
        return max(1, round(self.warmup * steps))

    def lr_at(self, step: int, steps: int) -> float:
        """Linear warm-up, then cosine decay to 0 over ``steps`` (the planned count), for 0-based ``step``."""
        warm = self.warmup_steps(steps)
        if step < warm:
            return self.lr * (step + 1) / warm
        return self.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

    def data_config(self) -> EagleTrainConfig:
        """The settings eagle train's data pipeline reads (``eagle.data.load_or_build``), from these."""
        return EagleTrainConfig(batch_size=self.batch_size, seq_len=self.seq_len, draft_vocab=self.draft_vocab,
                                ttt_steps=1, seed=self.seed, heldout_fraction=self.heldout_fraction,
                                num_sequences=self.num_sequences, temperature=self.temperature,
                                self_prompts=self.self_prompts, topk=self.topk, chat_template=self.chat_template,
                                data_format=self.data_format, compute=self.compute, device=self.device)


def _layer_ids(ids: Any) -> None:
    if (not isinstance(ids, (list, tuple)) or not ids
            or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids)):
        raise ConfigError(f"{WHO}: target_layer_ids must be a non-empty list of target layer indices >= 0, "
                          f"got {ids!r}")
