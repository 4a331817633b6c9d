"""Training a DFlash block draft (:mod:`.model`) for a frozen target, on data the target writes itself.

Pipeline (``train_dflash``): the draft's shape from the target (its layer's widths, z-lab's tapped layers, a mask
token) → eagle train's data (:mod:`..eagle.data`: the target's continuations of seed prompts, one cache of its
states at the draft's taps and its top-k log-probabilities over the draft vocabulary) → AdamW on a fresh draft,
each step drawing anchors in every sequence and running all their blocks in one pass (:mod:`.losses`) → held-out
greedy acceptance per block slot → the draft in z-lab's layout (:func:`.new_draft.save_draft`) and training.json.
A time limit bounds it all as it bounds eagle train (:mod:`..eagle.budget`).

Taps: z-lab's ``target_layer_ids`` i is the residual stream AFTER target layer i, Hugging Face's
``output_hidden_states[i + 1]``; eagle's data indexes ``output_hidden_states`` directly (its taps are the states
entering a layer), so it is handed ``i + 1``. The last layer's output is refused: Hugging Face gives it after the
final norm, the runtime's target graph before it."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ...bundle.safety import write_atomic
from ...errors import ConfigError, DFlashDraftError, ModelLoadError, OutputPathError
from ..eagle import budget, forecast as fc
from ..eagle.budget import TimeLimit, data_limits, padded_tokens, plan_training
from ..eagle.config import DTYPES
from ..eagle.data import (BatchSampler, Progress, SequenceCache, data_fingerprint, first_batches, gen_batch,
                          load_or_build, read_documents, save_atomic, target_end_ids)
from ..eagle.prompts import DRAWS_PER_PROMPT, user_turn
from ..eagle.record import Data, _device_name, _limit_record, _versions
from ..precision import apply_update, compute_context, resolve_compute, resolve_device
from ..quant.gguf import find_gguf, stage_reused
from .config import DFlashConfig, check_against_target
from .losses import Frozen, anchor_generator, block_loss, evaluate, sample_anchors
from .model import DFlashDraft
from .new_draft import (choose_mask_token, config_json, draft_shape, draft_share, plan_line, save_draft,
                        text_config)
from .train_config import WHO, DFlashTrainConfig

RECORD_NAME = "training.json"
WORK_DIR, CACHE_NAME, CHECKPOINT_NAME = ".train", "cache.pt", "checkpoint.pt"  # as eagle train's
TAP_CONVENTION = "target_layer_ids i: after target layer i = output_hidden_states[i+1]; taps: output_hidden_states"
_RESUME_FREE = ("checkpoint_every", "keep_checkpoint", "dtype", "compute", "device", "time_limit")


@dataclass
class Run:
    """One run's inputs, checked and read: what every phase below needs."""

    cfg: DFlashTrainConfig
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
    shape: dict  # DFlashConfig's fields but the mask token (chosen from the data where the vocabulary has no spare row)
    fingerprint: str
    resume: bool
    report: Progress
    say: Callable[[str], None]
    t_start: float

    @property
    def taps(self) -> tuple[int, ...]:
        """eagle's data taps (output_hidden_states indices) of the draft's after-layer ids."""
        return tuple(i + 1 for i in self.shape["target_layer_ids"])


@dataclass
class Trained:
    """Where the optimisation ended."""

    start: int  # the step a resumed run began at
    history: list[float]  # every step's loss (a resumed run's earlier ones too)
    slots: list[float]  # the last step's mean KL per slot 1..B-1
    train_s: float
    plan: dict
    stopped_at: int | None  # the step a time limit stopped at
    heldout: dict


# ------------------------------------------------------------------------------------------ the run


def train_dflash(target_dir: str | os.PathLike, out_dir: str | os.PathLike,
                 config: DFlashTrainConfig = DFlashTrainConfig(), prompts: Sequence[str] | None = None,
                 data_files: Sequence[str | os.PathLike] = (), progress: Progress | None = None, *,
                 resume: bool = False, say: Callable[[str], None] | None = None) -> dict:
    """Train a DFlash draft for the frozen target in ``target_dir`` (a local Hugging Face folder or llama.cpp GGUF;
    nothing is downloaded); returns the training.json record.

    ``out_dir`` receives z-lab's layout, which ``read_draft`` reads back: ``config.json`` (a Qwen3 config,
    ``block_size``, ``num_target_layers``, ``dflash_config``), ``model.safetensors`` (the body as ``config.dtype``,
    no embedding nor LM head: both are the target's; and ``d2t`` int64 [D] where the draft vocabulary is reduced)
    and ``training.json``. ``prompts``, ``data_files``, ``progress``, ``resume`` and ``config.time_limit`` work as
    ``eagle.train.train_eagle``'s. ``say(line)``: the plan (the draft's shape, the mask token chosen), before the
    long work.

    Example (what ``specrt dflash train MODEL -o DRAFT --time-limit 8`` runs)::

        record = train_dflash("./target", "./draft", DFlashTrainConfig(time_limit=8), progress=callback)
        record["heldout"]["accept_by_slot"], record["heldout"]["tokens_per_pass"]
    """
    if not isinstance(config, DFlashTrainConfig):
        raise ConfigError(f"{WHO}: config must be a DFlashTrainConfig, got {type(config).__name__}")
    t_start = budget.clock()  # a time limit counts from here
    run = _open(target_dir, out_dir, config, prompts, data_files, progress, resume, say, t_start)
    model, end_ids = _load_target(run)
    with torch.random.fork_rng(devices=[]):
        limit = TimeLimit.minutes(run.cfg.time_limit, t_start)
        data = _data(run, model, end_ids, limit)
        draft_cfg, frozen, why = _draft_and_frozen(run, model, data)
        del model
        torch.manual_seed(run.cfg.seed)
        draft = DFlashDraft(draft_cfg).to(run.device).train()
        trained = _optimise(run, draft, frozen, data, limit)
    data.times["train"] = trained.train_s
    record = _record(run, draft_cfg, why, end_ids, data, trained)
    _write(run, draft, data, record)
    return record


def _open(target_dir: str | os.PathLike, out_dir: str | os.PathLike, cfg: DFlashTrainConfig,
          prompts: Sequence[str] | None, data_files: Sequence[str | os.PathLike], progress: Progress | None,
          resume: bool, say: Callable[[str], None] | None, t_start: float) -> Run:
    """Check the inputs and read what is cheap before any model loads, as eagle train's ``_open`` does."""
    from ..loading import load_config, load_tokenizer
    from .graph import DFLASH_TARGETS

    device = resolve_device(cfg.device)
    compute = resolve_compute(cfg.compute, device)
    source, out = Path(target_dir).expanduser(), Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"{out} exists and is not a folder")
    gguf = find_gguf(source)
    if cfg.time_limit is not None:
        fc.refuse_below(cfg.time_limit, {"reading the target": fc.load_floor_s(
            fc.weight_bytes(source, gguf), gguf is not None and not resume), "saving": budget.SAVE_S}, WHO)
    if gguf is not None:
        source = stage_reused(gguf, out / WORK_DIR / "target", reuse=resume)
    if not (source / "config.json").is_file():
        raise ModelLoadError(f"{source} is not a local Hugging Face model folder (no config.json); {WHO} reads the "
                             "target from disk and never downloads")
    if prompts is None:
        from ...data import prompts as shipped_prompts

        prompts = shipped_prompts("chat") + shipped_prompts("all")
    prompts = list(prompts)
    if not all(isinstance(p, str) and p for p in prompts):
        raise ConfigError(f"{WHO}: prompts must be non-empty strings")
    target_config = load_config(str(source))
    if target_config.model_type not in DFLASH_TARGETS:
        raise DFlashDraftError(f"DFlash drafts need a llama-style target ({', '.join(DFLASH_TARGETS)}); "
                               f"{target_config.model_type} is not one")
    shape = draft_shape(target_config, cfg, device.type)
    tok = load_tokenizer(str(source))
    if cfg.self_prompts:
        user_turn(tok)
    docs = read_documents(data_files, cfg.data_format)
    h = hashlib.sha256(data_fingerprint(str(source), cfg.data_config(), prompts, docs).encode())
    h.update(json.dumps(["dflash taps", [i + 1 for i in shape["target_layer_ids"]]]).encode())  # what the cache holds
    work = out / WORK_DIR
    if not resume and work.exists():
        for item in work.iterdir():
            if gguf is None or item.name != "target":
                shutil.rmtree(item) if item.is_dir() else item.unlink()
    run = Run(cfg, out, work, source, gguf, device, compute, prompts, docs, target_config, tok, shape, h.hexdigest(),
              resume, progress or (lambda phase, done, total, loss: None), say or (lambda line: None), t_start)
    run.say(plan_line(shape, cfg, device, compute))
    return run


def _load_target(run: Run) -> tuple[Any, list[int]]:
    from ..loading import load_causal_lm

    model = load_causal_lm(str(run.source), "float32").to(run.device)
    model.requires_grad_(False)
    return model, target_end_ids(str(run.source), run.target_config, run.tok)


def _data(run: Run, model: Any, end_ids: list[int], limit: TimeLimit | None) -> Data:
    """The target's sequences and their cached taps, built by eagle train's pipeline (or read back on resume)."""
    cfg, data_cfg = run.cfg, run.cfg.data_config()
    limits = data_limits(limit, run.work, cfg.seq_len, run.shape["hidden_size"], cfg.topk, taps=len(run.taps))
    minimum: dict[str, float] = {}

    def refuse_short_limit(writer: Any) -> None:  # before anything is generated
        if limit is not None:
            minimum.update(_minimum(run, writer, limit))
            fc.refuse_below(cfg.time_limit, minimum, WHO)

    cached = load_or_build(run.work / CACHE_NAME, run.fingerprint, run.resume, model, run.tok, data_cfg, run.prompts,
                           run.docs, end_ids, run.taps, run.report, None, run.compute, limits, refuse_short_limit)
    return Data(cached, SequenceCache(**cached["train"]), SequenceCache(**cached["heldout"]), cached["d2t"],
                cached["t2d"], dict(cached["times"]), minimum or None)


def _minimum(run: Run, writer: Any, limit: TimeLimit) -> dict[str, float]:
    """The least seconds a time-limited run needs, by what they pay for (as ``eagle.forecast.minimum_parts``): reading
    the target, the first batches of replies, one held-out pass (a block at every held-out position of the first
    batch), the timed steps and one more, the save."""
    cfg = run.cfg
    size = gen_batch(run.device)
    rows, _ = first_batches(run.tok, cfg.data_config(), run.prompts, run.docs, size)
    if cfg.self_prompts:
        rows["prompts"] = min(size, DRAWS_PER_PROMPT * cfg.self_prompts) * (len(user_turn(run.tok)[0]) + budget.MIN_NEW)
    row_s = fc.token_row_s(writer, run.taps, run.shape["vocab_size"], run.device, cfg.seq_len)
    share = draft_share(run.shape, min(cfg.draft_vocab or math.inf, run.shape["vocab_size"]), run.target_config)
    fp32 = fc.FP32_OVER_BF16 if run.compute == "bfloat16" else 1.0
    return {"reading the target": budget.clock() - limit.start, "the first replies": row_s * sum(rows.values()),
            "the held-out check": share * fp32 * row_s * rows.get("heldout", 0) * cfg.block_size,
            "timed steps": (budget.PROBE_STEPS + 1) * fc.BACKWARD * share * row_s * _block_rows(cfg),
            "saving": budget.SAVE_S}


def _block_rows(cfg: DFlashTrainConfig) -> int:
    return cfg.batch_size * cfg.anchors * cfg.block_size


def _draft_and_frozen(run: Run, model: Any, data: Data) -> tuple[DFlashConfig, Frozen, str]:
    """The draft's config (the mask token chosen now: from the data where the vocabulary has no spare row) and what
    it borrows from the target, on the run's device."""
    tokens = torch.cat([c.tokens[torch.arange(c.tokens.shape[1]) < c.length[:, None]] for c in (data.train, data.held)])
    counts = torch.bincount(tokens.long(), minlength=run.shape["vocab_size"])  # prompts and replies, every token
    mask, why = choose_mask_token(run.shape["vocab_size"], len(run.tok), counts)
    run.say(f"{WHO}: mask token {why}")
    draft_cfg = DFlashConfig(**run.shape, mask_token_id=mask)
    check_against_target(draft_cfg, run.target_config)
    targets = torch.arange(len(data.d2t)) + data.d2t
    head = model.get_output_embeddings()
    bias = getattr(head, "bias", None)
    dev = run.device
    frozen = Frozen(embed=model.get_input_embeddings().weight.detach().float().to(dev),
                    head_weight=head.weight.detach()[targets.to(head.weight.device)].float().to(dev),
                    head_bias=None if bias is None else bias.detach()[targets.to(bias.device)].float().to(dev),
                    d2t=data.d2t.to(dev), t2d=data.t2d.to(dev), mask_token_id=mask)
    return draft_cfg, frozen, why


# ------------------------------------------------------------------------------------------ training


def optimizer(draft: DFlashDraft, cfg: DFlashTrainConfig) -> torch.optim.AdamW:
    """AdamW as SpecForge trains DFlash drafts (torch's default betas, no weight decay); the lr is set each step."""
    return torch.optim.AdamW(draft.parameters(), lr=cfg.lr, weight_decay=0.0)


def train_step(draft: DFlashDraft, opt: torch.optim.Optimizer, frozen: Frozen, batch: SequenceCache,
               cfg: DFlashTrainConfig, compute: str, step: int, steps: int) -> tuple[float, list[float]]:
    """One update at ``step`` of ``steps``: anchors drawn for the step, the decayed block loss (under ``compute``),
    backward, the gradient-norm clip, AdamW. Returns (the loss, each slot's mean KL)."""
    draft.train()
    for group in opt.param_groups:
        group["lr"] = cfg.lr_at(step, steps)
    anchors, valid = sample_anchors(batch, cfg.anchors, anchor_generator(cfg.seed, step))
    with compute_context(compute, frozen.embed.device):
        loss, slots = block_loss(draft, frozen, batch, anchors, valid, cfg)
    value = apply_update(draft, opt, loss, cfg.grad_clip, f"{WHO} diverged at step {step + 1}", "lower --lr")
    return value, [float(s.detach()) for s in slots]


def _units(cfg: DFlashTrainConfig, sampler: BatchSampler, step: int) -> int:
    """What a step's time is about proportional to: its context rows and its block rows."""
    return padded_tokens(sampler.lengths, sampler.batch(step)) + _block_rows(cfg)


def _eval_units(cfg: DFlashTrainConfig, held: SequenceCache) -> float:
    """The held-out check in step units: a block at every held-out position, forward only."""
    return float(held.length.sum()) * (cfg.block_size + 1) / fc.BACKWARD


def _optimise(run: Run, draft: DFlashDraft, frozen: Frozen, data: Data, limit: TimeLimit | None) -> Trained:
    """Resume or start, fit the step count to a time limit, run the steps (checkpointing), then measure the saved
    copy's held-out acceptance."""
    cfg, device = run.cfg, run.device
    opt = optimizer(draft, cfg)
    state = _resume_state(run.work, run.fingerprint, cfg) if run.resume else None
    start, history, slots, train_s, plan = 0, [], [], 0.0, {"steps": cfg.steps}
    if state is not None:
        draft.load_state_dict(state["draft"])
        opt.load_state_dict(state["optimizer"])
        start, history, slots, train_s, plan = (state[k] for k in ("step", "history", "slots", "train_s", "plan"))
    sampler = BatchSampler(data.train.length, cfg.batch_size, cfg.seed)
    if limit is not None:
        timed = _timed_plan(run, draft, opt, frozen, data, sampler, start, limit)
        plan = timed if state is None else {**timed, "steps": plan["steps"]}
    steps, stopped_at = plan["steps"], None
    if start:
        run.report("train", start, steps, None)
    for step in range(start, steps):
        if limit is not None and step > start and limit.left() < (
                plan["reserve_s"] + plan["s_per_token"] * _units(cfg, sampler, step)):
            stopped_at = step  # the draft as it is, checked and saved within the limit
            break
        t0 = time.perf_counter()
        loss, slots = train_step(draft, opt, frozen, data.train.batch(sampler.batch(step), device), cfg, run.compute,
                                 step, steps)
        train_s += time.perf_counter() - t0
        history.append(loss)
        if (step + 1) % cfg.checkpoint_every == 0:
            save_atomic({"fingerprint": run.fingerprint, "config": _resume_fields(cfg), "step": step + 1,
                         "draft": draft.state_dict(), "optimizer": opt.state_dict(), "history": history,
                         "slots": slots, "train_s": train_s, "plan": plan}, run.work / CHECKPOINT_NAME)
        run.report("train", step + 1, steps, loss)
    t0 = time.perf_counter()
    heldout = evaluate(saved_copy(draft, cfg.dtype).to(device), frozen, data.held, cfg, run.report)
    data.times["evaluate"] = time.perf_counter() - t0
    return Trained(start, history, slots, train_s, plan, stopped_at, heldout)


def _timed_plan(run: Run, draft: DFlashDraft, opt: torch.optim.Optimizer, frozen: Frozen, data: Data,
                sampler: BatchSampler, start: int, limit: TimeLimit) -> dict:
    """The step count and reserve a time limit allows, from steps timed whole on copies (``budget.plan_training``)."""
    cfg = run.cfg
    probe = copy.deepcopy(draft)
    probe_opt = optimizer(probe, cfg)
    probe_opt.load_state_dict(copy.deepcopy(opt.state_dict()))

    def probe_step(k: int) -> tuple[float, list[float]]:
        return train_step(probe, probe_opt, frozen, data.train.batch(sampler.batch(k), run.device), cfg, run.compute,
                          k, cfg.steps)

    return plan_training(probe_step, lambda k: _units(cfg, sampler, k), start, cfg.steps, limit, run.device, None,
                         _eval_units(cfg, data.held))


def saved_copy(draft: DFlashDraft, dtype: str) -> DFlashDraft:
    """The draft as it is saved: its weights rounded to ``dtype``, computing in float32."""
    return DFlashDraft.from_state(draft.cfg, {k: v.detach().cpu().to(DTYPES[dtype]) for k, v in
                                              draft.state_dict().items()})


def _resume_fields(cfg: DFlashTrainConfig) -> dict:
    return {k: v for k, v in asdict(cfg).items() if k not in _RESUME_FREE}


def _resume_state(work: Path, fingerprint: str, cfg: DFlashTrainConfig) -> dict | None:
    path = work / CHECKPOINT_NAME
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=True, map_location="cpu")
    if state["fingerprint"] != fingerprint or state["config"] != _resume_fields(cfg):
        raise ConfigError(f"{path} was written by a run with other data or settings; train without --resume to "
                          "start over")
    return state


# ------------------------------------------------------------------------------------------ the record and the files


def _record(run: Run, draft_cfg: DFlashConfig, mask_why: str, end_ids: list[int], data: Data,
            trained: Trained) -> dict:
    """The run's training.json (timed before the draft is saved)."""
    cfg, train, held, history = run.cfg, data.train, data.held, trained.history
    minimum_s = None if data.minimum is None else sum(data.minimum.values())
    reduced = len(data.d2t) < draft_cfg.vocab_size
    return {"format": 1, "target": str(run.gguf or run.source), "architecture": run.target_config.model_type,
            "config": asdict(cfg), "draft": config_json(draft_cfg, text_config(run.target_config).num_hidden_layers,
                                                        cfg.dtype, len(data.d2t) if reduced else None),
            "target_layer_ids": list(draft_cfg.target_layer_ids), "taps": list(run.taps),
            "tap_convention": TAP_CONVENTION, "mask_token_id": draft_cfg.mask_token_id, "mask_token": mask_why,
            "end_ids": end_ids, "draft_vocab_size": len(data.d2t), "gamma": cfg.decay,
            "slot_weights": cfg.slot_weights(),
            "data": {**data.cached["info"], "sequences_train": len(train), "sequences_heldout": len(held),
                     "tokens_train": int(train.length.sum()), "tokens_heldout": int(held.length.sum()),
                     "cache_bytes": train.nbytes() + held.nbytes()},
            "loss": {"first": history[0] if history else None, "last": history[-1] if history else None,
                     "last_by_slot": trained.slots, "history": history},
            "heldout": trained.heldout, "resumed_from": trained.start or None, "compute": run.compute,
            "device": _device_name(run.device),
            "time_limit": None if cfg.time_limit is None else _limit_record(cfg, data, trained, minimum_s),
            "time_s": {**data.times, "total_this_run": budget.clock() - run.t_start}, "versions": _versions()}


def _write(run: Run, draft: DFlashDraft, data: Data, record: dict) -> None:
    """The draft (d2t beside it where its vocabulary is reduced) and training.json; the work folder removed."""
    reduced = len(data.d2t) < draft.cfg.vocab_size
    state = {k: v.detach().to("cpu", DTYPES[run.cfg.dtype]) for k, v in draft.state_dict().items()}
    save_draft(run.out, record["draft"], state, data.d2t if reduced else None)
    write_atomic(run.out / RECORD_NAME, json.dumps(record, indent=2, allow_nan=False) + "\n")
    if not run.cfg.keep_checkpoint:
        shutil.rmtree(run.work)
