"""What an EAGLE-3 training run (:mod:`.train`) holds as it goes (its inputs, its data, where training ended) and
what it records of itself: ``training.json`` (:class:`TrainingRecord`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict

import torch

from . import budget, forecast as fc
from .checkpoint import config_json
from .data import Progress, SequenceCache, scored_rows
from .train_config import EagleTrainConfig

FORMAT_VERSION = 1


def _versions() -> dict[str, str]:
    import platform

    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


class TrainingRecord(TypedDict):
    """What ``train_eagle`` returns and writes as ``training.json``: JSON all through, so the file and the value agree.
    The blocks below the top level are dicts of plain numbers (their keys: docs/design/eagle3.md, "Training")."""

    format: int
    target: str  # the folder or GGUF trained against
    architecture: str
    config: dict  # EagleTrainConfig as a dict
    head: dict  # the saved head's config.json
    taps: list[int]
    tap_convention: str
    end_ids: list[int]
    draft_vocab_size: int
    data: dict  # sequences, tokens, scored rows and cache bytes, train and held out
    loss: dict  # weights of the unrolled steps, first / last / every step's weighted loss
    heldout_init: dict  # held-out acceptance before training
    heldout: dict  # ... and after, with the saved (dtype-rounded) head
    resumed_from: int | None
    compute: str
    device: str
    time_limit: dict | None  # the plan a --time-limit made, the least it needed, and where and why it stopped
    forecast: dict  # what the run was expected to give, said before training (forecast.forecast)
    verdict: dict  # whether the head pays at a conservative draft cost, and what more would give (forecast.verdict)
    time_s: dict
    versions: dict


@dataclass
class Run:
    """One training run's inputs, checked and read: what every phase below needs."""

    cfg: EagleTrainConfig
    out: Path
    work: Path  # out/.train: the data cache and the resumable checkpoint
    source: Path  # the target's Hugging Face folder (a GGUF's, staged in work/)
    gguf: Path | None
    device: torch.device
    compute: str
    prompts: list[str]
    docs: list[str]
    target_config: Any
    tok: Any
    init: tuple | None  # init_head's (config, head, d2t, t2d) for a warm start
    fingerprint: str
    resume: bool
    report: Progress
    say: Callable[[str], None]  # a line for the user (the CLI: stderr)
    t_start: float  # budget.clock() when the run was called: a time limit counts from here


@dataclass
class Data:
    """The cached training data: the target's sequences, the draft vocabulary, and how long building it took."""

    cached: dict  # load_or_build's record (its "info", "draft_counts", "written" are written beside the head)
    train: SequenceCache
    held: SequenceCache
    d2t: torch.Tensor  # [draft_vocab] int64: draft id -> target id offset
    t2d: torch.Tensor  # [vocab] bool: target ids in the draft vocabulary
    times: dict
    minimum: dict | None  # a time limit's least seconds by what they pay for (forecast.minimum_parts), None: not built


@dataclass
class Trained:
    """Where the optimisation ended: the loss history, the plan it kept and the held-out checks."""

    start: int  # the step a resumed run began at (0: a fresh run)
    history: list[list[float]]  # [steps][ttt_steps] unrolled losses of every step, a resumed run's earlier ones too
    train_s: float
    plan: dict
    stopped_at: int | None  # the step a time limit stopped at
    heldout_init: dict
    heldout: dict
    forecast: dict


def token_rows(train: SequenceCache) -> tuple[float, int]:
    """(tokens a training sequence holds on average, tokens in all): what a step and the data hold, as the
    acceptance curve (``forecast.ANCHORS``) counts them."""
    rows = int(train.length.sum())
    return rows / max(1, len(train)), rows


def build_record(run: Run, head_cfg: Any, end_ids: list[int], taps: tuple[int, int, int], data: Data,
                 trained: Trained) -> TrainingRecord:
    """The run's training.json (timed before the head is saved), with the verdict on the head it trained."""
    cfg, train, held, history = run.cfg, data.train, data.held, trained.history
    weights = [cfg.loss_decay ** s for s in range(cfg.ttt_steps)]
    per_seq, unique = token_rows(train)
    total_s = budget.clock() - run.t_start
    minimum_s = None if data.minimum is None else sum(data.minimum.values())
    limit = None if cfg.time_limit is None else _limit_record(cfg, data, trained, minimum_s)
    time_bound = limit is not None and (limit["stopped_because"] != "all of --steps" or any(
        by == "time" for by in limit["data_stopped"].values()))
    verdict = fc.verdict(trained.heldout, cfg.ttt_steps, fc.trained_rows(len(history), cfg.batch_size, per_seq, unique),
                         per_seq, cfg, minimum_s, time_bound)
    return TrainingRecord(
        format=FORMAT_VERSION, target=str(run.gguf or run.source), architecture=run.target_config.model_type,
        config=asdict(cfg), head=config_json(head_cfg, cfg.dtype), taps=list(taps),
        tap_convention="entering layer i (output_hidden_states[i])", end_ids=end_ids,
        draft_vocab_size=len(data.d2t),
        data={**data.cached["info"], "sequences_train": len(train), "sequences_heldout": len(held),
              "tokens_train": int(train.length.sum()), "tokens_heldout": int(held.length.sum()),
              "scored_train": int(scored_rows(train).sum()), "scored_heldout": int(scored_rows(held).sum()),
              "cache_bytes": train.nbytes() + held.nbytes()},
        loss={"weights": weights, "first": sum(w * v for w, v in zip(weights, history[0])),
              "last": sum(w * v for w, v in zip(weights, history[-1])),
              "history": [sum(w * v for w, v in zip(weights, h)) for h in history]},
        heldout_init=trained.heldout_init, heldout=trained.heldout,
        resumed_from=trained.start or None, compute=run.compute, device=_device_name(run.device),
        time_limit=limit,
        forecast=trained.forecast, verdict=verdict,
        time_s={**data.times, "total_this_run": total_s},
        versions=_versions())


def _limit_record(cfg: EagleTrainConfig, data: Data, trained: Trained, minimum_s: float | None) -> dict:
    """training.json's ``time_limit``: the plan, the least the run needed, and where and why data and training
    stopped (``data_stopped``: each part's cut, "time" or the memory / disk bound, None where it ran whole)."""
    info, plan = data.cached["info"], trained.plan
    why = ("the time limit" if trained.stopped_at is not None
           else "the planned steps, as many as the limit holds" if plan["steps"] < cfg.steps else "all of --steps")
    return {**plan, "stopped_at_step": trained.stopped_at, "stopped_because": why, "minutes": cfg.time_limit,
            "data_stopped": {name: info.get(key) for name, key in (("prompts", "prompts_cut"),
                                                                   ("heldout", "heldout_cut"),
                                                                   ("replies", "generation_cut"),
                                                                   ("text", "text_windows_cut"))},
            "replies_cut_short": info.get("replies_cut_short", 0), "minimum_s": minimum_s, "minimum": data.minimum}


def _device_name(device: torch.device) -> str:
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)
