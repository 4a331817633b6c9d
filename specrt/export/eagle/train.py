"""Training an EAGLE-3 head (:mod:`specrt.export.eagle.head`) for a frozen target, on data the target makes itself.

Pipeline (``train_eagle``): seed prompts → the target's own continuations (plus optional plain text) → one
cache of the target's three tap states and its top-k log-probabilities over the draft vocabulary → AdamW on
the head with training-time test (``ttt_steps`` unrolled steps, each feeding the head's own output back as
features, under the attention pattern the runtime's chain uses) → held-out acceptance → the head in the
published layout (``save_eagle3``) and ``training.json`` (:mod:`.record`). A time limit bounds it all
(:mod:`.budget`); what the run can be expected to give is said before it trains and judged after
(:mod:`.forecast`). Design, sources and the memory figures are in
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
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from ...bundle.safety import write_atomic
from ...errors import ConfigError, ModelLoadError, OutputPathError
from .config import tap_layers
from .head import Eagle3Head
from . import budget, forecast as fc
from .budget import TimeLimit, data_limits, in_order_tokens, padded_tokens, plan_training
from .checkpoint import save_eagle3
from .data import (
    BatchSampler,
    Progress,
    SequenceCache,
    data_fingerprint,
    first_batches,
    gen_batch,
    load_or_build,
    read_documents,
    save_atomic,
    target_end_ids,
)
from .init import head_config, init_head, new_head, saved_copy
from .prompts import DRAWS_PER_PROMPT, user_turn
from .prune import COUNTS_NAME, write_counts
from .record import Data, Run, Trained, TrainingRecord, build_record, token_rows
from .train_config import EagleTrainConfig
from .ttt import evaluate, ttt_loss
from ..quant.gguf import find_gguf, stage_reused
from ..precision import apply_update, resolve_compute, resolve_device

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
    apply_update(head, opt, loss, cfg.grad_clip, f"eagle train diverged at step {step + 1}", "lower lr")
    return [float(v.detach()) for v in losses]


# ------------------------------------------------------------------------------------------ the record


def _training_fields(cfg: EagleTrainConfig) -> dict:
    return {k: v for k, v in asdict(cfg).items() if k not in _RESUME_FREE}


def train_eagle(target_dir: str | os.PathLike, out_dir: str | os.PathLike,
                config: EagleTrainConfig = EagleTrainConfig(), prompts: Sequence[str] | None = None,
                data_files: Sequence[str | os.PathLike] = (), progress: Progress | None = None, *,
                resume: bool = False, say: Callable[[str], None] | None = None) -> TrainingRecord:
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
    ``say(line)``: what the run expects before it trains (``forecast.forecast_line``); the record's ``verdict``
    holds whether the head pays, ``forecast.verdict_line`` the warning when it does not. A ``config.time_limit``
    below what the run needs at the least is refused (``forecast.TimeLimitTooShortError``) before the target is
    read when its size alone rules the limit out, else before anything is generated.

    Example (what ``specrt eagle train MODEL -o HEAD --data notes.txt --steps 500 --draft-vocab 8192`` runs)::

        record = train_eagle("./target", "./head", EagleTrainConfig(steps=500, draft_vocab=8192),
                             data_files=["notes.txt"], progress=callback)
        record["heldout"]["alpha1"], record["heldout"]["tokens_per_pass"]
    """
    if not isinstance(config, EagleTrainConfig):
        raise ConfigError(f"eagle train: config must be an EagleTrainConfig, got {type(config).__name__}")
    t_start = budget.clock()  # a time limit counts from here: reading a GGUF is part of the run
    run = _open(target_dir, out_dir, config, prompts, data_files, progress, resume, say, t_start)
    model, end_ids, taps = _load_target(run)
    with torch.random.fork_rng(devices=[]):
        limit = TimeLimit.minutes(run.cfg.time_limit, t_start)
        data = _data(run, model, end_ids, taps, limit)
        head_cfg, head = _start_head(run, model, data)
        embed = model.get_input_embeddings().weight.detach().float().clone()  # frozen: the head holds no table
        del model
        trained = _optimise(run, head, embed, data, limit)
    data.times["train"] = trained.train_s
    record = build_record(run, head_cfg, end_ids, taps, data, trained)
    _write(run, head_cfg, head, end_ids, data, record)
    return record


def _open(target_dir: str | os.PathLike, out_dir: str | os.PathLike, cfg: EagleTrainConfig,
          prompts: Sequence[str] | None, data_files: Sequence[str | os.PathLike], progress: Progress | None,
          resume: bool, say: Callable[[str], None] | None, t_start: float) -> Run:
    """Check the inputs and read what is cheap (config, tokenizer, texts, a warm start's head) before any model
    loads (a time limit that reading the target and saving alone would overrun: refused); clear a fresh run's work
    folder."""
    from ..loading import load_config, load_tokenizer
    from .graph import check_eagle_target

    device = resolve_device(cfg.device)  # before anything is read or written
    compute = resolve_compute(cfg.compute, device)
    source = Path(target_dir).expanduser()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"{out} exists and is not a folder")
    gguf = find_gguf(source)
    if cfg.time_limit is not None:  # a floor: the measured reading and the rest are checked before generating
        fc.refuse_below(cfg.time_limit, {"reading the target": fc.load_floor_s(
            fc.weight_bytes(source, gguf), gguf is not None and not resume), "saving": budget.SAVE_S})
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
    return Run(cfg, out, work, source, gguf, device, compute, prompts, docs, target_config, tok, init, fingerprint,
               resume, progress or (lambda phase, done, total, loss: None), say or (lambda line: None), t_start)


def _load_target(run: Run) -> tuple[Any, list[int], tuple[int, int, int]]:
    """The frozen target on the run's device, its end ids and the layers the head taps."""
    from ..loading import load_causal_lm

    model = load_causal_lm(str(run.source), "float32").to(run.device)
    model.requires_grad_(False)
    end_ids = target_end_ids(str(run.source), run.target_config, run.tok)
    return model, end_ids, tap_layers(run.target_config.num_hidden_layers)


def _data(run: Run, model: Any, end_ids: list[int], taps: tuple[int, int, int], limit: TimeLimit | None) -> Data:
    """The target's sequences and their cached taps (built, or read back from the work folder)."""
    cfg = run.cfg
    limits = data_limits(limit, run.work, cfg.seq_len, run.target_config.hidden_size, cfg.topk)
    minimum: dict[str, float] = {}

    def refuse_short_limit(writer: Any) -> None:  # before anything is generated
        if limit is not None:
            minimum.update(_minimum(run, writer, taps, limit))
            fc.refuse_below(cfg.time_limit, minimum)

    cached = load_or_build(run.work / CACHE_NAME, run.fingerprint, run.resume, model, run.tok, cfg, run.prompts,
                           run.docs, end_ids, taps, run.report, None if run.init is None else run.init[2:],
                           run.compute, limits, refuse_short_limit)
    return Data(cached, SequenceCache(**cached["train"]), SequenceCache(**cached["heldout"]), cached["d2t"],
                cached["t2d"], dict(cached["times"]), minimum or None)


def _minimum(run: Run, writer: Any, taps: Sequence[int], limit: TimeLimit) -> dict[str, float]:
    """The least seconds a time-limited run needs (``forecast.minimum_parts``), from the time spent so far (reading
    the target), one timed pass of the target as it generates, and the first batches' token rows."""
    cfg = run.cfg
    size = gen_batch(run.device)
    rows, seq_tokens = first_batches(run.tok, cfg, run.prompts, run.docs, size)
    if cfg.self_prompts:
        rows["prompts"] = min(size, DRAWS_PER_PROMPT * cfg.self_prompts) * (len(user_turn(run.tok)[0]) + budget.MIN_NEW)
    row_s = fc.token_row_s(writer, taps, run.target_config.vocab_size, run.device, cfg.seq_len)
    draft = len(run.init[2]) if run.init is not None else min(cfg.draft_vocab or math.inf, run.target_config.vocab_size)
    layers = cfg.layers if run.init is None else run.init[0].num_layers
    share = fc.head_share(run.target_config, int(draft), layers, cfg.ttt_steps)
    fp32 = fc.FP32_OVER_BF16 if run.compute == "bfloat16" else 1.0
    return fc.minimum_parts(budget.clock() - limit.start, row_s, rows, share, fp32, cfg.batch_size * seq_tokens)


def _start_head(run: Run, model: Any, data: Data) -> tuple[Any, Eagle3Head]:
    """A new head shaped after the target (its LM head rows and final norm where ``init_from_target``), or the
    warm start's; on the run's device."""
    if run.init is not None:
        head_cfg, head = run.init[:2]
    else:
        targets = torch.arange(len(data.d2t)) + data.d2t
        head_cfg = head_config(run.target_config, len(data.d2t), run.cfg.layers)
        head = new_head(head_cfg, model, targets, run.cfg.seed, from_target=run.cfg.init_from_target)
    return head_cfg, head.to(run.device)


def _optimise(run: Run, head: Eagle3Head, embed: torch.Tensor, data: Data, limit: TimeLimit | None) -> Trained:
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
    expected = _forecast(run, data, plan, start, heldout_init, limit)
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
    return Trained(start, history, train_s, plan, stopped_at, heldout_init, heldout, expected)


def _forecast(run: Run, data: Data, plan: dict, start: int, heldout_init: dict, limit: TimeLimit | None) -> dict:
    """What the planned steps should give (``forecast.forecast``), said before the first of them."""
    per_seq, unique = token_rows(data.train)
    rows = fc.trained_rows(plan["steps"], run.cfg.batch_size, per_seq, unique)
    expected = fc.forecast(plan["steps"], start, run.cfg.ttt_steps, rows, heldout_init["alpha1"],
                           budget.clock() - run.t_start, None if limit is None else plan)
    run.say(fc.forecast_line(expected, heldout_init["alpha1"], limit is not None))
    return expected


def _timed_plan(run: Run, head: Eagle3Head, opt: torch.optim.Optimizer, embed: torch.Tensor, t2d: torch.Tensor,
                data: Data, sampler: BatchSampler, start: int, plan: dict, limit: TimeLimit) -> dict:
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


def _write(run: Run, head_cfg: Any, head: Eagle3Head, end_ids: list[int], data: Data,
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
