"""Training an EAGLE-3 head (:mod:`specrt.export.eagle.head`) for a frozen target, on data the target makes itself.

Pipeline (``train_eagle``): seed prompts → the target's own continuations (plus optional plain text) → one
cache of the target's three tap states and its top-k log-probabilities over the draft vocabulary → AdamW on
the head with training-time test (``ttt_steps`` unrolled steps, each feeding the head's own output back as
features, under the attention pattern the runtime's chain uses) → held-out acceptance → the head in the
published layout (``save_eagle3``) and ``training.json``. Design, sources and the memory figures are in
docs/design/eagle3.md, section "Training".

Alignment (as the runtime's, docs/design/eagle3.md): head row j pairs the target's taps at position j with
the embedding of token j+1 and is trained towards the target's distribution at position j+1 (which predicts
token j+2).
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypedDict

import torch

from ...bundle.safety import write_atomic
from ...errors import ConfigError, ModelLoadError, OutputPathError, TrainingDivergedError
from .config import tap_layers
from .head import Eagle3Head
from .budget import TimeLimit, data_limits, in_order_tokens, padded_tokens, plan_training
from .checkpoint import config_json, save_eagle3
from .data import (
    BatchSampler,
    Progress,
    SequenceCache,
    data_fingerprint,
    load_or_build,
    read_documents,
    save_atomic,
    scored_rows,
    target_end_ids,
)
from .init import head_config, init_head, new_head, saved_copy
from .prompts import user_turn
from .prune import COUNTS_NAME, write_counts
from .train_config import EagleTrainConfig
from .ttt import evaluate, ttt_loss
from ..quant.gguf import find_gguf, stage_reused
from ..precision import resolve_compute, resolve_device

FORMAT_VERSION = 1
RECORD_NAME = "training.json"
WRITTEN_NAME = "prompts-written.json"  # --self-prompts' prompts
WORK_DIR = ".train"  # inside out_dir: the data cache and the resumable checkpoint, removed at the end unless kept
CACHE_NAME = "cache.pt"
CHECKPOINT_NAME = "checkpoint.pt"
# Fields that change neither the data nor the optimisation (compute: only their rounding; time_limit: a resumed run
# keeps the step count its checkpoint planned): a resumed run may set them differently.
_RESUME_FREE = ("checkpoint_every", "keep_checkpoint", "dtype", "compute", "device", "time_limit")


def optimizer(head: Eagle3Head, cfg: EagleTrainConfig) -> torch.optim.AdamW:
    """AdamW as EAGLE-3 trains (betas 0.9/0.95, no weight decay); :func:`train_step` sets its lr each step."""
    return torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)


def train_step(head: Eagle3Head, opt: torch.optim.Optimizer, embed: torch.Tensor, t2d: torch.Tensor,
               batch: SequenceCache, cfg: EagleTrainConfig, compute: str, step: int) -> list[float]:
    """One update at ``step``'s learning rate: the unrolled steps' KLs (under ``compute``), their decayed sum,
    backward, the gradient-norm clip, AdamW. Returns each unrolled step's mean KL. Head, ``embed``, ``t2d``
    and ``batch`` sit on one device (``SequenceCache.batch(..., device)``)."""
    head.train()
    for group in opt.param_groups:
        group["lr"] = cfg.lr_at(step)
    loss, losses = ttt_loss(head, embed, t2d, batch, cfg, compute)
    value = float(loss.detach())
    if not math.isfinite(value):
        raise TrainingDivergedError(f"eagle train diverged at step {step + 1} (loss {value}); lower lr")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
    opt.step()
    return [float(v.detach()) for v in losses]


# ------------------------------------------------------------------------------------------ the record


def _training_fields(cfg: EagleTrainConfig) -> dict:
    return {k: v for k, v in asdict(cfg).items() if k not in _RESUME_FREE}


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
    time_limit: dict | None  # the plan a --time-limit made, and where it stopped
    time_s: dict
    versions: dict


@dataclass
class _Run:
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


@dataclass
class _Data:
    """The cached training data: the target's sequences, the draft vocabulary, and how long building it took."""

    cached: dict  # load_or_build's record (its "info", "draft_counts", "written" are written beside the head)
    train: SequenceCache
    held: SequenceCache
    d2t: torch.Tensor  # [draft_vocab] int64: draft id -> target id offset
    t2d: torch.Tensor  # [vocab] bool: target ids in the draft vocabulary
    times: dict


@dataclass
class _Trained:
    """Where the optimisation ended: the loss history, the plan it kept and the held-out checks."""

    start: int  # the step a resumed run began at (0: a fresh run)
    history: list[list[float]]  # [steps][ttt_steps] unrolled losses of every step, a resumed run's earlier ones too
    train_s: float
    plan: dict
    stopped_at: int | None  # the step a time limit stopped at
    heldout_init: dict
    heldout: dict


def train_eagle(target_dir: str | os.PathLike, out_dir: str | os.PathLike,
                config: EagleTrainConfig = EagleTrainConfig(), prompts: Sequence[str] | None = None,
                data_files: Sequence[str | os.PathLike] = (), progress: Progress | None = None, *,
                resume: bool = False) -> TrainingRecord:
    """Train an EAGLE-3 head for the frozen target in ``target_dir``; returns the training.json record.

    ``target_dir``: a local Hugging Face model folder or llama.cpp GGUF (nothing is downloaded). ``out_dir``: receives
    ``config.json`` + ``model.safetensors`` (the published layout, ``save_eagle3``, float weights as
    ``config.dtype``) and ``training.json`` (config, data sizes, timing, loss history, held-out acceptance
    before and after training); while training it also holds ``.train/`` (the data cache and a checkpoint of
    head, optimizer, step and RNG every ``config.checkpoint_every`` steps), removed at the end unless
    ``config.keep_checkpoint``. ``prompts``: seed prompts the target continues (default: the shipped
    ``specrt.data.prompts("chat")`` then ``prompts("all")``). ``data_files``: plain-text files or folders
    (``medusa.read_texts``) used as they are, per ``config.data_format``. ``progress(phase, done, total,
    loss)``: see ``Progress``. ``resume``: continue from ``out_dir/.train`` when it holds a checkpoint of
    the same target, data and config (``checkpoint_every``, ``keep_checkpoint`` and ``dtype`` may differ),
    else start afresh; a resumed run ends with the same head as an uninterrupted one. A run that fails or
    is interrupted never leaves a half-written head: the head's files land by rename, after training.

    Example (what ``specrt eagle train MODEL -o HEAD --data notes.txt --steps 500 --draft-vocab 8192`` runs)::

        record = train_eagle("./target", "./head", EagleTrainConfig(steps=500, draft_vocab=8192),
                             data_files=["notes.txt"], progress=callback)
        record["heldout"]["alpha1"], record["heldout"]["tokens_per_pass"]
    """
    if not isinstance(config, EagleTrainConfig):
        raise ConfigError(f"eagle train: config must be an EagleTrainConfig, got {type(config).__name__}")
    t_start = time.perf_counter()  # a time limit counts from here: reading a GGUF is part of the run
    run = _open(target_dir, out_dir, config, prompts, data_files, progress, resume)
    model, end_ids, taps = _load_target(run)
    with torch.random.fork_rng(devices=[]):
        limit = TimeLimit.minutes(run.cfg.time_limit, t_start)
        data = _data(run, model, end_ids, taps, limit)
        head_cfg, head = _start_head(run, model, data)
        embed = model.get_input_embeddings().weight.detach().float().clone()  # frozen: the head holds no table
        del model
        trained = _optimise(run, head, embed, data, limit)
    data.times["train"] = trained.train_s
    record = _record(run, head_cfg, end_ids, taps, data, trained, t_start)
    _write(run, head_cfg, head, end_ids, data, record)
    return record


def _open(target_dir: str | os.PathLike, out_dir: str | os.PathLike, cfg: EagleTrainConfig,
          prompts: Sequence[str] | None, data_files: Sequence[str | os.PathLike], progress: Progress | None,
          resume: bool) -> _Run:
    """Check the inputs and read what is cheap (config, tokenizer, texts, a warm start's head) before any model
    loads; clear a fresh run's work folder."""
    from ..loading import load_config, load_tokenizer
    from .graph import check_eagle_target

    device = resolve_device(cfg.device)  # before anything is read or written
    compute = resolve_compute(cfg.compute, device)
    source = Path(target_dir).expanduser()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"{out} exists and is not a folder")
    gguf = find_gguf(source)
    if gguf is not None:  # a llama.cpp model: trained on as transformers dequantizes it, read once per run
        source = stage_reused(gguf, out / WORK_DIR / "target", reuse=resume)
    if not (source / "config.json").is_file():
        raise ModelLoadError(f"{source} is not a local Hugging Face model folder (no config.json); "
                             "eagle train reads the target from disk and never downloads")
    if prompts is None:
        from ...data import prompts as shipped_prompts

        prompts = shipped_prompts("chat") + shipped_prompts("all")  # user messages, code, prose
    prompts = list(prompts)
    if not all(isinstance(p, str) and p for p in prompts):
        raise ConfigError("eagle train: prompts must be non-empty strings")
    target_config = load_config(str(source))
    check_eagle_target(target_config.model_type)
    tok = load_tokenizer(str(source))
    if cfg.self_prompts:
        user_turn(tok)  # a tokenizer without a chat template is refused before any work
    docs = read_documents(data_files, cfg.data_format)
    init = init_head(cfg.init, target_config) if cfg.init else None
    if init is not None and cfg.layers not in (1, init[0].num_layers):
        raise ConfigError(f"eagle train: --layers {cfg.layers}, but the --init head has {init[0].num_layers} "
                          "layer(s); a warm start keeps its own")
    fingerprint = data_fingerprint(str(source), cfg, prompts, docs, None if init is None else init[2])
    work = out / WORK_DIR
    if not resume and work.exists():  # only specrt's own work folder: a fresh run starts from nothing
        for item in work.iterdir():
            if gguf is None or item.name != "target":  # (the target just read from its GGUF stays)
                shutil.rmtree(item) if item.is_dir() else item.unlink()
    return _Run(cfg, out, work, source, gguf, device, compute, prompts, docs, target_config, tok, init, fingerprint,
                resume, progress or (lambda phase, done, total, loss: None))


def _load_target(run: _Run) -> tuple[Any, list[int], tuple[int, int, int]]:
    """The frozen target on the run's device, its end ids and the layers the head taps."""
    from ..loading import load_causal_lm

    model = load_causal_lm(str(run.source), "float32").to(run.device)
    model.requires_grad_(False)
    end_ids = target_end_ids(str(run.source), run.target_config, run.tok)
    return model, end_ids, tap_layers(run.target_config.num_hidden_layers)


def _data(run: _Run, model: Any, end_ids: list[int], taps: tuple[int, int, int], limit: TimeLimit | None) -> _Data:
    """The target's sequences and their cached taps (built, or read back from the work folder)."""
    cfg = run.cfg
    limits = data_limits(limit, run.work, cfg.seq_len, run.target_config.hidden_size, cfg.topk)
    cached = load_or_build(run.work / CACHE_NAME, run.fingerprint, run.resume, model, run.tok, cfg, run.prompts,
                           run.docs, end_ids, taps, run.report, None if run.init is None else run.init[2:],
                           run.compute, limits)
    return _Data(cached, SequenceCache(**cached["train"]), SequenceCache(**cached["heldout"]), cached["d2t"],
                 cached["t2d"], dict(cached["times"]))


def _start_head(run: _Run, model: Any, data: _Data) -> tuple[Any, Eagle3Head]:
    """A new head shaped after the target (its LM head rows and final norm where ``init_from_target``), or the
    warm start's; on the run's device."""
    if run.init is not None:
        head_cfg, head = run.init[:2]
    else:
        targets = torch.arange(len(data.d2t)) + data.d2t
        head_cfg = head_config(run.target_config, len(data.d2t), run.cfg.layers)
        head = new_head(head_cfg, model, targets, run.cfg.seed, from_target=run.cfg.init_from_target)
    return head_cfg, head.to(run.device)


def _optimise(run: _Run, head: Eagle3Head, embed: torch.Tensor, data: _Data, limit: TimeLimit | None) -> _Trained:
    """Resume or start, fit the step count to a time limit, run the steps (checkpointing), then measure the
    saved copy's held-out acceptance."""
    cfg, device = run.cfg, run.device
    d2t, t2d = data.d2t.to(device), data.t2d.to(device)  # data's own stay on the host, as saved
    opt = optimizer(head, cfg)
    state = _resume_state(run.work, run.fingerprint, cfg) if run.resume else None
    if state is not None:
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start, history, train_s, heldout_init = state["step"], state["history"], state["train_s"], state["init"]
    else:
        t0 = time.perf_counter()
        heldout_init = evaluate(head, embed, d2t, t2d, data.held, cfg)
        data.times["evaluate_init"] = time.perf_counter() - t0
        start, history, train_s = 0, [], 0.0
    sampler = BatchSampler(data.train.length, cfg.batch_size, cfg.seed)
    plan = {"steps": cfg.steps} if state is None else state.get("plan", {"steps": cfg.steps})
    if limit is not None:
        timed = _timed_plan(run, head, opt, embed, t2d, data, sampler, start, plan, limit)
        plan = timed if state is None else {**timed, "steps": plan["steps"]}
    steps = replace(cfg, steps=plan["steps"])  # the schedule the steps follow
    if start:
        run.report("train", start, steps.steps, None)
    weights = [cfg.loss_decay ** s for s in range(cfg.ttt_steps)]  # of each unrolled step's loss
    stopped_at = None
    for step in range(start, steps.steps):
        if limit is not None and step > start and limit.left() < (
                plan["reserve_s"] + plan["s_per_token"] * padded_tokens(sampler.lengths, sampler.batch(step))):
            stopped_at = step  # the head as it is, checked and saved within the limit
            break
        t0 = time.perf_counter()
        losses = train_step(head, opt, embed, t2d, data.train.batch(sampler.batch(step), device), steps,
                            run.compute, step)
        train_s += time.perf_counter() - t0
        history.append(losses)
        if (step + 1) % cfg.checkpoint_every == 0:
            save_atomic({"fingerprint": run.fingerprint, "config": _training_fields(cfg), "step": step + 1,
                         "head": head.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(),
                         "history": history, "train_s": train_s, "init": heldout_init, "plan": plan},
                        run.work / CHECKPOINT_NAME)
        run.report("train", step + 1, steps.steps, sum(w * v for w, v in zip(weights, losses)))
    t0 = time.perf_counter()
    heldout = evaluate(saved_copy(head, cfg.dtype).to(device), embed, d2t, t2d, data.held, cfg, run.report)
    data.times["evaluate"] = time.perf_counter() - t0
    return _Trained(start, history, train_s, plan, stopped_at, heldout_init, heldout)


def _timed_plan(run: _Run, head: Eagle3Head, opt: torch.optim.Optimizer, embed: torch.Tensor, t2d: torch.Tensor,
                data: _Data, sampler: BatchSampler, start: int, plan: dict, limit: TimeLimit) -> dict:
    """The step count and reserve a time limit allows, from steps timed whole on copies (nothing the run keeps
    changes). A resumed run keeps its schedule (its plan's steps) and times only its reserve."""
    cfg = run.cfg
    probe = copy.deepcopy(head)
    probe_opt = optimizer(probe, cfg)
    probe_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # (loading shares the state tensors)

    def probe_step(k: int) -> list[float]:
        return train_step(probe, probe_opt, embed, t2d, data.train.batch(sampler.batch(k), run.device), cfg,
                          run.compute, k)

    return plan_training(probe_step, lambda k: padded_tokens(sampler.lengths, sampler.batch(k)), start, cfg.steps,
                         limit, run.device, plan.get("evaluate_s", data.times.get("evaluate_init")),
                         in_order_tokens(data.held.length.tolist(), cfg.batch_size))


def _record(run: _Run, head_cfg: Any, end_ids: list[int], taps: tuple[int, int, int], data: _Data,
            trained: _Trained, t_start: float) -> TrainingRecord:
    cfg, train, held, history = run.cfg, data.train, data.held, trained.history
    weights = [cfg.loss_decay ** s for s in range(cfg.ttt_steps)]
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
        time_limit=None if cfg.time_limit is None else {**trained.plan, "stopped_at_step": trained.stopped_at,
                                                        "minutes": cfg.time_limit},
        time_s={**data.times, "total_this_run": time.perf_counter() - t_start},
        versions=_versions())


def _write(run: _Run, head_cfg: Any, head: Eagle3Head, end_ids: list[int], data: _Data,
           record: TrainingRecord) -> None:
    """The head, its draft-id counts, the prompts the target wrote and training.json; the work folder removed."""
    out, cached = run.out, data.cached
    save_eagle3(out, head_cfg, head, data.d2t, data.t2d, dtype=run.cfg.dtype)
    if "draft_counts" in cached:
        write_counts(out, cached["draft_counts"], end_ids, f"the {len(data.train)} sequences it trained on")
    else:  # a cache resumed from before 2026-12-05: no counts, and none of an earlier head left beside this one
        (out / COUNTS_NAME).unlink(missing_ok=True)
    if cached.get("written"):  # the prompts the target wrote itself, to read what the head trained on
        (out / WRITTEN_NAME).write_text(json.dumps(cached["written"], indent=0, ensure_ascii=False) + "\n")
    write_atomic(out / RECORD_NAME, json.dumps(record, indent=2, allow_nan=False) + "\n")
    if not run.cfg.keep_checkpoint:
        shutil.rmtree(run.work)


def _device_name(device: torch.device) -> str:
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)


def _resume_state(work: Path, fingerprint: str, cfg: EagleTrainConfig) -> dict | None:
    path = work / CHECKPOINT_NAME
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=True, map_location="cpu")  # a GPU run resumes on the CPU too
    if state["fingerprint"] != fingerprint or state["config"] != _training_fields(cfg):
        same_data = state["fingerprint"] == fingerprint
        reuse = "; delete it to train on the cached data with these settings" if same_data else ""
        raise ConfigError(f"{path} was written by a run with other data or settings; train without resume "
                          f"to start over{reuse}")
    return state
