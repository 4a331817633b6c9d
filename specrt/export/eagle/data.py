"""The data an EAGLE-3 head trains on (:mod:`specrt.export.eagle.train`): the target's own continuations of
seed prompts (plus optional plain text), and one cache of its three tap states and top-k log-probabilities
over the draft vocabulary, computed once and reused every epoch (and on resume)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ...errors import ConfigError, OutputPathError
from . import budget
from .budget import MIN_NEW, DataLimits
from .generate import TargetSequence, check_logits_are_lm_head, continue_prompts, model_device, teacher_forced
from .prompts import MESSAGE_TOKENS, with_bos, write_prompts
from .train_config import EagleTrainConfig
from .vocab import ranked_ids, token_counts
from ..precision import generating
from ..progress import PhaseProgress

_GEN_BATCH = 128  # rows sampled together (prompts of unequal length left-padded; SmolLM2-135M, 2 Zen 4 cores:
# 339 tokens/s in bfloat16, 176 in float32)
_GEN_BATCH_CUDA = 512  # a GPU's step costs launches, not bytes: wider batches are nearly free there
_MIN_WINDOW = 4  # text windows shorter than this (tokens) are dropped

# progress(phase, done, total, loss): phase is "generate" (sequences), "cache" (sequences), "train"
# (steps; loss is the step's weighted TTT loss, None on the call that announces a resumed start) or
# "evaluate" (held-out batches). Raising from it stops training; the last checkpoint stays resumable.
Progress = PhaseProgress


@dataclass
class SequenceCache:
    """The target's view of N sequences, padded to T, computed once and reused every epoch.

    tokens int32 [N, T]; length int32 [N] (real tokens); start int32 [N]: the first scored target
    position (the prompt's last position for a continuation: its distribution predicts the first generated
    token; 1 for a text window); stop int32 [N]: one past the last scored position (length, or length - 1
    when the sequence ends with an end id); taps fp16 [N, T, 3·H_t]: output_hidden_states at the taps,
    concatenated in tap order; logp fp16 [N, T, k] and ids int32 [N, T, k]: the target's top-k
    log-probabilities over the draft vocabulary (log_softmax of its logits at the draft ids' target ids)
    and their draft ids, descending; top1 int32 [N, T]: the target's argmax over the FULL vocabulary (a
    target id: what greedy verification accepts).
    """

    tokens: torch.Tensor
    length: torch.Tensor
    start: torch.Tensor
    stop: torch.Tensor
    taps: torch.Tensor
    logp: torch.Tensor
    ids: torch.Tensor
    top1: torch.Tensor

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, index: Sequence[int], device: torch.device | str | None = None) -> SequenceCache:
        """Rows ``index``, cut to their longest sequence (on ``device``, where given: the cache itself stays
        in host memory)."""
        idx = torch.as_tensor(list(index), dtype=torch.long)
        t = int(self.length[idx].max())
        return SequenceCache(**{name: (v[idx, :t] if v.dim() > 1 else v[idx]).to(device)
                                for name, v in vars(self).items()})

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in vars(self).values())


def target_end_ids(source: str, config: Any, tok: Any) -> list[int]:
    from ..loading import load_generation_config

    ids: set[int] = set()
    gen = load_generation_config(source)
    for value in (getattr(gen, "eos_token_id", None), getattr(config, "eos_token_id", None), tok.eos_token_id):
        if value is not None:
            ids.update([value] if isinstance(value, int) else value)
    return sorted(ids)


def _encode_prompt(tok: Any, prompt: str, chat: bool) -> list[int]:
    """The prompt as the runtime encodes it: chat-templated text with its BOS rule, or plain encoding."""
    if not (chat and getattr(tok, "chat_template", None)):
        return tok(prompt).input_ids
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                   tokenize=False)
    return with_bos(tok, tok(text, add_special_tokens=False).input_ids)


def read_documents(data_files: Sequence[str | os.PathLike], data_format: str) -> list[str]:
    from ..medusa import read_texts

    docs: list[str] = []
    for path in data_files:
        for text in read_texts(Path(path)):
            docs.extend([line for line in text.splitlines() if line.strip()] if data_format == "lines" else [text])
    return docs


def _split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Group indices → (train, held out): at least one of each, about ``fraction`` held out."""
    if n < 2:
        raise ConfigError(f"eagle train needs at least two prompts or text documents (one is held out to measure "
                          f"acceptance); got {n}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    held = min(n - 1, max(1, round(n * fraction)))
    return sorted(order[held:]), sorted(order[:held])


def gen_batch(device: torch.device) -> int:
    """Rows the target generates together on ``device``."""
    return _GEN_BATCH_CUDA if device.type == "cuda" else _GEN_BATCH


def _length_batches(rows: list[int], encoded: dict[int, list[int]], size: int) -> list[list[int]]:
    """``rows`` (prompt indices) in batches of ``size``, sorted by prompt length so a batch pads little."""
    rows = sorted(rows, key=lambda i: (len(encoded[i]), i))
    return [rows[lo:lo + size] for lo in range(0, len(rows), size)]


@dataclass
class _Plan:
    """Which prompts and documents train and which are held out (whole, so no held-out sequence shares a prefix with
    a training one), and the prompts' ids (those that leave room for a reply in seq_len)."""

    groups: list[tuple[str, str]]  # ("prompt" | "doc", text)
    train_groups: list[int]
    held_list: list[int]
    encoded: dict[int, list[int]]

    @property
    def train_prompts(self) -> list[int]:
        return [i for i in self.train_groups if i in self.encoded]

    @property
    def held_prompts(self) -> list[int]:
        return [i for i in self.held_list if i in self.encoded]

    def docs(self, held: bool) -> int:
        return sum(1 for i in (self.held_list if held else self.train_groups) if self.groups[i][0] == "doc")


def _plan(tok: Any, cfg: EagleTrainConfig, prompts: Sequence[str], docs: Sequence[str],
          written: Sequence[str] = ()) -> _Plan:
    """The split and the prompts' ids; ``written`` (the target's own prompts) are split apart, so the seed prompts'
    split is the same with or without them."""
    groups = [("prompt", p) for p in prompts] + [("doc", d) for d in docs] + [("prompt", p) for p in written]
    train_groups, held_list = _split(len(groups) - len(written), cfg.heldout_fraction, cfg.seed)
    if written:
        more = _split(len(written), cfg.heldout_fraction, cfg.seed) if len(written) > 1 else ([0], [])
        base = len(groups) - len(written)
        train_groups, held_list = train_groups + [base + i for i in more[0]], held_list + [base + i for i in more[1]]
    encoded: dict[int, list[int]] = {}
    for i, (kind, text) in enumerate(groups):
        if kind == "prompt":
            ids = _encode_prompt(tok, text, cfg.chat_template)
            if len(ids) + 1 < cfg.seq_len:  # else no room for a continuation: skipped
                encoded[i] = ids
    return _Plan(groups, train_groups, held_list, encoded)


def first_batches(tok: Any, cfg: EagleTrainConfig, prompts: Sequence[str], docs: Sequence[str], size: int
                  ) -> tuple[dict[str, int], float]:
    """Token rows the target reads at the least before training (:mod:`.forecast`'s minimum), {"heldout", "train"}:
    the first batch of each side's replies (``size`` rows of its shortest prompts, each writing ``MIN_NEW`` tokens
    before a deadline may cut it) and of its text windows (``cfg.batch_size`` windows of at most ``seq_len``),
    which run whatever the deadlines; and the mean length of the training sequences they make."""
    plan = _plan(tok, cfg, prompts, docs)
    rows, seqs = {}, {}
    for name, side, held in (("heldout", plan.held_prompts, True), ("train", plan.train_prompts, False)):
        lengths = sorted(len(plan.encoded[i]) for i in side)[:size]
        windows = min(cfg.batch_size, plan.docs(held))  # (a document: one window or more)
        rows[name] = sum(lengths) + MIN_NEW * len(lengths) + windows * cfg.seq_len
        seqs[name] = len(lengths) + windows
    return rows, rows["train"] / max(1, seqs["train"])


def _build_sequences(model: Any, tok: Any, cfg: EagleTrainConfig, prompts: Sequence[str], docs: Sequence[str],
                     end_ids: list[int], taps: Sequence[int], progress: Progress, written: Sequence[str] = (),
                     limits: DataLimits = DataLimits()) -> tuple[list[TargetSequence], list[TargetSequence], dict]:
    """Training prompts get continuations at ``cfg.temperature``; held-out prompts one greedy continuation each,
    the runtime's greedy chain exactly, generated first (they draw no random numbers, so the training replies are
    the same draws with or without a limit). Under a time limit the held-out replies and windows stop at their own
    deadline (``DataLimits.heldout_until``), the training ones at ``limits.until``: no batch but each side's first
    starts after it, and a batch running when it passes stops within MIN_NEW token steps (``continue_prompts``),
    its rows keeping what they wrote. Training batches also stop where the memory or disk bound says; under a
    time limit, or where such a bound would cut them, they go round the prompts one reply each per round, batches
    in a seeded order, so a cut leaves every prompt within one reply of the rest and no length favoured."""
    plan = _plan(tok, cfg, prompts, docs, written)
    encoded, held_groups, train_prompts = plan.encoded, set(plan.held_list), plan.train_prompts
    per_prompt = 1 if cfg.temperature == 0 else math.ceil(cfg.num_sequences / max(1, len(train_prompts)))
    # one row per continuation, batched across prompts; held-out prompts get one greedy row each
    size = gen_batch(model_device(model))
    held_batches = _length_batches(plan.held_prompts, encoded, size)
    rows = [i for i in train_prompts for _ in range(per_prompt)]
    held_rows = sum(len(b) for b in held_batches)
    least = held_rows + min(size, len(rows))  # the most the memory bound cannot cut: held-out, one training batch
    if limits.max_rows is not None and least > limits.max_rows:
        raise ConfigError(f"eagle train: the held-out replies and one batch of training replies ({least} sequences "
                          f"of up to {cfg.seq_len} tokens) need more {limits.bound_by} than this host has (room for "
                          f"{limits.max_rows}); lower --seq-len or give fewer prompts")
    if limits.until is None and (limits.max_rows is None or held_rows + len(rows) <= limits.max_rows):
        train_batches = _length_batches(rows, encoded, size)
    else:
        train_batches = [b for r in range(per_prompt) for b in _shuffled(_length_batches(train_prompts, encoded, size),
                                                                        cfg.seed * 1_000_003 + r)]
    windows = _text_windows(tok, plan.groups, held_groups, cfg.seq_len)
    n_text, total = len(windows[False]) + len(windows[True]), held_rows + len(rows)
    gen = torch.Generator().manual_seed(cfg.seed)  # greedy rows draw nothing: held-out first leaves the rest as was
    held_until = limits.heldout_until(budget.clock())
    held, held_cut, short = _generate(model, held_batches, 0.0, gen, encoded, cfg, end_ids, taps, held_until,
                                      DataLimits(), progress, 0, total)
    held_windows = teacher_forced(model, windows[True], taps, cfg.batch_size, progress, 0, n_text, held_until)
    train, cut, short_train = _generate(model, train_batches, cfg.temperature, gen, encoded, cfg, end_ids, taps,
                                        limits.until, limits, progress, held_rows, total)
    made = len(train)
    train_windows = teacher_forced(model, windows[False], taps, cfg.batch_size, progress, len(held_windows), n_text,
                                   limits.until)
    train, held = train + train_windows, held + held_windows
    skipped = len(prompts) + len(written) - len(encoded)
    if not train or not held:
        raise ConfigError("eagle train: no training or no held-out sequences remain (prompts that leave no room "
                          f"in seq_len {cfg.seq_len} are skipped: {skipped} were)")
    windows_cut = len(held_windows) + len(train_windows) < n_text
    info = {"prompts": len(prompts) + len(written), "prompts_written": len(written), "documents": len(docs),
            "prompts_skipped": skipped, "prompts_train": len(train_prompts), "prompts_heldout": len(plan.held_prompts),
            "documents_heldout": plan.docs(True), "text_windows": len(held_windows) + len(train_windows),
            "text_windows_cut": "time" if windows_cut else None, "continuations_per_prompt": per_prompt,
            "continuations_asked": len(rows), "continuations_made": made, "generation_cut": cut,
            "heldout_replies_asked": held_rows, "heldout_replies_made": len(held) - len(held_windows),
            "heldout_cut": held_cut, "replies_cut_short": short + short_train}
    return train, held, info


def _generate(model: Any, batches: list[list[int]], temperature: float, gen: torch.Generator,
              encoded: dict[int, list[int]], cfg: EagleTrainConfig, end_ids: list[int], taps: Sequence[int],
              until: float | None, limits: DataLimits, progress: Progress, done: int, total: int
              ) -> tuple[list[TargetSequence], str | None, int]:
    """The target's continuation of every row of ``batches`` (prompt indices) at ``temperature``: batches after the
    first start only before ``until`` and within ``limits.max_rows`` (counting from ``done``), and each stops
    within MIN_NEW token steps once ``until`` passes. Returns the sequences, why the batches stopped early
    ("time", or ``limits.bound_by``; None) and how many replies a deadline cut short."""
    seqs: list[TargetSequence] = []
    cut, short = None, 0
    for k, batch in enumerate(batches):
        if k:
            if until is not None and budget.clock() >= until:
                cut = "time"
            elif limits.max_rows is not None and done + len(batch) > limits.max_rows:
                cut = limits.bound_by
            if cut:
                progress("generate", done, done, None)
                break
        replies = continue_prompts(model, [encoded[i] for i in batch], cfg.seq_len, temperature, end_ids, gen, taps,
                                   until, budget.MIN_NEW)
        seqs += replies
        short += sum(q.cut for q in replies)
        done += len(batch)
        progress("generate", done, total, None)
    return seqs, cut, short


def _text_windows(tok: Any, groups: list[tuple[str, str]], held_groups: set[int], seq_len: int
                  ) -> dict[bool, list[list[int]]]:
    """{held out: the documents' token windows of ``seq_len``} (a last window under _MIN_WINDOW tokens dropped)."""
    windows: dict[bool, list[list[int]]] = {False: [], True: []}
    for i, (kind, text) in enumerate(groups):
        if kind == "doc":
            ids = tok(text).input_ids
            windows[i in held_groups] += [ids[k:k + seq_len] for k in range(0, len(ids), seq_len)
                                          if len(ids) - k >= _MIN_WINDOW]
    return windows


def _shuffled(batches: list[list[int]], seed: int) -> list[list[int]]:
    order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(seed)).tolist()
    return [batches[k] for k in order]


def choose_draft_vocab(counts: torch.Tensor, n: int | None, end_ids: Sequence[int]
                       ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """EAGLE-3's draft vocabulary (traineagle3/cnets.py:664-676): the end ids, then the ``n`` most frequent tokens the
    training data predicts (``counts``: how often each target id is predicted, int64 [V]) that it predicts at all,
    ties to the lower id, sorted ascending; d2t[i] = used[i] - i. Returns (d2t int64 [D], t2d bool [V], the
    fraction of predicted tokens the vocabulary covers)."""
    vocab_size = len(counts)
    if n is None or n >= vocab_size:
        used = torch.arange(vocab_size)
    else:
        ends = torch.zeros(vocab_size, dtype=torch.bool)
        ends[sorted(set(end_ids))] = True
        seen = int(((counts > 0) & ~ends).sum())  # never-predicted ids are not drafted
        used = ranked_ids(counts, int(ends.sum()) + min(seen, max(0, n - int(ends.sum()))), ends)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(len(used)), t2d, vocab_coverage(counts, t2d)


@torch.no_grad()
def _cache(seqs: list[TargetSequence], lm_head: torch.nn.Module, targets: torch.Tensor, seq_len: int, topk: int,
           end_ids: list[int], progress: Progress, done: int, total: int) -> SequenceCache:
    """Pads ``seqs`` into a SequenceCache; the draft-vocab log-probabilities are the target's own logits at the
    draft ids' target ids (its LM head on its last hidden state), computed on scored positions only."""
    n, width = len(seqs), seqs[0].taps.shape[-1]
    k = min(topk, len(targets))
    dev = lm_head.weight.device  # the LM head's products on its own device, the cache in host memory
    targets = targets.to(dev)
    weight = lm_head.weight[targets].float()  # [D, H_t]
    bias = None if getattr(lm_head, "bias", None) is None else lm_head.bias[targets].float()
    c = SequenceCache(tokens=torch.zeros(n, seq_len, dtype=torch.int32), length=torch.zeros(n, dtype=torch.int32),
                      start=torch.tensor([q.start for q in seqs], dtype=torch.int32),
                      stop=torch.zeros(n, dtype=torch.int32), taps=torch.zeros(n, seq_len, width, dtype=torch.float16),
                      logp=torch.zeros(n, seq_len, k, dtype=torch.float16),
                      ids=torch.zeros(n, seq_len, k, dtype=torch.int32),
                      top1=torch.zeros(n, seq_len, dtype=torch.int32))
    for i, q in enumerate(seqs):
        m = len(q.tokens)
        c.tokens[i, :m] = torch.tensor(q.tokens, dtype=torch.int32)
        c.length[i] = m
        c.stop[i] = m - 1 if q.tokens[-1] in end_ids else m
        c.taps[i, :m], c.top1[i, :m] = q.taps, q.top1
        lo, hi = max(1, q.start), int(c.stop[i])
        if hi > lo:
            logits = F.linear(q.final[lo:hi].to(dev), weight, bias)
            top = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
            c.logp[i, lo:hi], c.ids[i, lo:hi] = top.values.half().cpu(), top.indices.int().cpu()
        seqs[i] = None  # consumed: its fp32 states are freed as the cache fills
        progress("cache", done + i + 1, total, None)
    return c


def scored_rows(c: SequenceCache) -> torch.Tensor:
    """[N, T] bool: target position t is scored (start <= t < stop, t >= 1)."""
    t = torch.arange(c.tokens.shape[1], device=c.tokens.device)[None]
    return (t >= c.start[:, None].clamp_min(1)) & (t < c.stop[:, None])


def _topk_mass(c: SequenceCache) -> float:
    mass = c.logp.float().exp().sum(-1)
    keep = scored_rows(c)
    return float(mass[keep].mean()) if bool(keep.any()) else 1.0


def save_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise OutputPathError(f"could not write {path}: {e}") from None


def data_fingerprint(source: str, cfg: EagleTrainConfig, prompts: Sequence[str], docs: Sequence[str],
                     d2t: torch.Tensor | None = None) -> str:
    """What the cache depends on: the target's config, tokenizer and weights' identity, the data and its
    settings, and the draft vocabulary when it is given (a warm start's)."""
    h = hashlib.sha256()
    if d2t is not None:
        h.update(d2t.to(torch.int64).numpy().tobytes())
    folder = Path(source)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (folder / name).is_file():
            h.update(name.encode() + (folder / name).read_bytes())
    for weights in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        st = weights.stat()
        h.update(f"{weights.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    data_fields = {k: v for k, v in asdict(cfg).items()
                   if k in ("seq_len", "draft_vocab", "seed", "heldout_fraction", "num_sequences", "temperature",
                            "topk", "chat_template", "data_format", "self_prompts")}
    h.update(json.dumps([data_fields, list(prompts), list(docs)]).encode())
    return h.hexdigest()


def vocab_coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    """The fraction of the predicted tokens (``counts`` per target id) that a draft vocabulary (``t2d``) holds."""
    total = int(counts.sum())
    return int(counts[t2d].sum()) / total if total else 1.0


def load_or_build(path: Path, fingerprint: str, resume: bool, model: Any, tok: Any, cfg: EagleTrainConfig,
          prompts: Sequence[str], docs: Sequence[str], end_ids: list[int], taps: Sequence[int],
          report: Progress, vocab: tuple[torch.Tensor, torch.Tensor] | None = None, compute: str = "float32",
          limits: DataLimits = DataLimits(), before: Callable[[Any], None] | None = None) -> dict:
    """The run's cache: read back when resuming, else generated, cached and saved (atomically) at ``path``.
    ``vocab``: (d2t, t2d) to keep (a warm start's head's), else chosen from the training data. ``compute``:
    the target's decoder's precision while it generates (``generating``). ``limits``: where generating stops
    early (``eagle_budget``). ``before(writer)``: called with the target as it generates before anything is
    generated (a time limit's check that the run fits: it may raise)."""
    if resume and path.is_file():
        cached = torch.load(path, weights_only=True)
        if cached["fingerprint"] != fingerprint:
            raise ConfigError(f"{path.parent} holds a cache of another target, data or data settings; train "
                              "without resume to start over")
        return cached
    sample = next(iter(prompts), None) or next(iter(docs), None) or "Hello"
    check_logits_are_lm_head(model, _encode_prompt(tok, sample, cfg.chat_template))
    t0 = time.perf_counter()
    writer = generating(model, compute)
    if before is not None:
        before(writer)
    written = write_prompts(writer, tok, cfg.self_prompts, end_ids, torch.Generator().manual_seed(cfg.seed), taps,
                            exclude=prompts, batch=gen_batch(model_device(model)),
                            max_tokens=min(MESSAGE_TOKENS, cfg.seq_len // 2), progress=report,
                            until=limits.prompts_until) if cfg.self_prompts else []  # half the sequence for a reply
    times = {"prompts": time.perf_counter() - t0}
    prompts_cut = len(written) < cfg.self_prompts and limits.prompts_until is not None and \
        budget.clock() >= limits.prompts_until  # (else the target ended too few messages to write them all)
    train_seqs, held_seqs, info = _build_sequences(writer, tok, cfg, prompts, docs, end_ids, taps, report, written,
                                                   limits)
    info["prompts_cut"] = "time" if prompts_cut else None
    times["generate"] = time.perf_counter() - t0 - times["prompts"]
    counts = token_counts([q.tokens[q.start + 1:] for q in train_seqs], model.config.vocab_size)  # what they predict
    if vocab is None:
        d2t, t2d, coverage = choose_draft_vocab(counts, cfg.draft_vocab, end_ids)
    else:
        (d2t, t2d), coverage = vocab, vocab_coverage(counts, vocab[1])
    targets = torch.arange(len(d2t)) + d2t
    draft_counts = counts[targets]  # per draft id: what `specrt eagle prune` ranks the ids by
    t0 = time.perf_counter()
    n_train, total = len(train_seqs), len(train_seqs) + len(held_seqs)
    head = model.get_output_embeddings()
    train = _cache(train_seqs, head, targets, cfg.seq_len, cfg.topk, end_ids, report, 0, total)
    held = _cache(held_seqs, head, targets, cfg.seq_len, cfg.topk, end_ids, report, n_train, total)
    times["cache"] = time.perf_counter() - t0
    info.update(draft_vocab_coverage=coverage, topk_mass=_topk_mass(train))
    cached = {"fingerprint": fingerprint, "d2t": d2t, "t2d": t2d, "draft_counts": draft_counts,
              "train": vars(train), "heldout": vars(held),
              "info": info, "times": times, "written": written}
    save_atomic(cached, path)
    return cached


class BatchSampler:
    """Batches as a pure function of the step, so a resumed run draws exactly the batches the uninterrupted
    one would. Epoch e takes the training sequences in a permutation seeded by (seed, e) (the remainder past
    whole batches waits for another epoch), sorts each window of ``WINDOW`` batches' worth by length, so a
    batch pads little (transformers' ``group_by_length``), and visits its batches in a second seeded order."""

    WINDOW = 16

    def __init__(self, lengths: torch.Tensor, batch_size: int, seed: int) -> None:
        self.lengths, self.batch_size, self.seed = lengths.tolist(), batch_size, seed
        self.per_epoch = max(1, len(self.lengths) // batch_size)
        self._epochs: dict[int, list[list[int]]] = {}

    def _epoch(self, epoch: int) -> list[list[int]]:
        if epoch not in self._epochs:
            n, size = len(self.lengths), self.batch_size
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch + 1)
            order = torch.randperm(n, generator=g).tolist()
            order = (order * -(-size // n))[:size] if n < size else order[:self.per_epoch * size]
            width = self.WINDOW * size
            grouped = [i for lo in range(0, len(order), width)
                       for i in sorted(order[lo:lo + width], key=lambda i: self.lengths[i])]
            batches = [grouped[k * size:(k + 1) * size] for k in range(self.per_epoch)]
            self._epochs = {epoch: [batches[k] for k in torch.randperm(len(batches), generator=g).tolist()]}
        return self._epochs[epoch]

    def batch(self, step: int) -> list[int]:
        epoch, k = divmod(step, self.per_epoch)
        return self._epoch(epoch)[k]
