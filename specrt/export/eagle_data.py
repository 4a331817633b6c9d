"""The data an EAGLE-3 head trains on (:mod:`specrt.export.eagle_train`): the target's own continuations of
seed prompts (plus optional plain text), and one cache of its three tap states and top-k log-probabilities
over the draft vocabulary, computed once and reused every epoch (and on resume)."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError, OutputPathError
from .progress import PhaseProgress

if TYPE_CHECKING:
    from .eagle_train import EagleTrainConfig

_GEN_BATCH = 128  # rows sampled together (prompts of unequal length left-padded; ~250 tokens/s on SmolLM2-135M, 2 cores)
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

    def batch(self, index: Sequence[int]) -> SequenceCache:
        """Rows ``index``, cut to their longest sequence."""
        idx = torch.as_tensor(list(index), dtype=torch.long)
        t = int(self.length[idx].max())
        return SequenceCache(**{name: (v[idx, :t] if v.dim() > 1 else v[idx]) for name, v in vars(self).items()})

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in vars(self).values())


def target_end_ids(source: str, config: Any, tok: Any) -> list[int]:
    from .loading import load_generation_config

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
    ids = tok(text, add_special_tokens=False).input_ids
    bos = tok.bos_token_id
    if bos is not None and tok("x").input_ids[:1] == [bos] and ids[:1] != [bos]:
        ids = [bos] + ids
    return ids


def _forward_kwargs(model: Any, cache: Any) -> dict:
    """transformers renamed past_key_values to cache (5.2x) and num_logits_to_keep to logits_to_keep."""
    params = inspect.signature(model.forward).parameters
    kwargs = {"cache" if "cache" in params else "past_key_values": cache, "use_cache": True}
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = 1
    return kwargs


def sample_rows(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One id per row of ``probs`` [n, V] by inverse CDF: one uniform draw a row. ``torch.multinomial``
    draws an exponential per vocabulary entry (~18 % of generating on a 49k vocabulary, 2 cores)."""
    cdf = probs.double().cumsum(-1)
    u = torch.rand(len(probs), 1, generator=gen, dtype=torch.float64) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp_max(probs.shape[-1] - 1)


def _grown_in_place(model: Any, capacity: int) -> Any:
    """A DynamicCache whose full-attention layers write into buffers of ``capacity`` positions, allocated
    once, where DynamicLayer concatenates a new tensor every step (~11 % of generating at 192 tokens)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class Preallocated(DynamicLayer):
        def __init__(self) -> None:
            super().__init__()
            self.length = 0

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.device = key_states.device
            b, h, _, d = key_states.shape
            self.k_buf = key_states.new_empty(b, h, capacity, d)
            self.v_buf = value_states.new_empty(b, h, capacity, value_states.shape[-1])
            self.is_initialized = True

        def _view(self) -> None:
            self.keys, self.values = self.k_buf[:, :, :self.length], self.v_buf[:, :, :self.length]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            self.k_buf[:, :, self.length:end], self.v_buf[:, :, self.length:end] = key_states, value_states
            self.length = end
            self._view()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.is_initialized:
                self.k_buf, self.v_buf = self.k_buf[indices], self.v_buf[indices]
                self._view()

    cache = DynamicCache(config=model.config)
    # sliding-window and other special layers keep transformers' own class
    cache.layers = [Preallocated() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


@dataclass
class _Seq:
    """One sequence as the target saw it, before the draft vocabulary is known."""

    tokens: list[int]
    start: int  # the first scored target position
    taps: torch.Tensor  # [len, 3·H_t] fp16
    final: torch.Tensor  # [len, H_t] fp32: the target's last hidden state, its LM head's input
    top1: torch.Tensor  # [len] int32: the target's argmax over the full vocabulary


def _states(out: Any, taps: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(taps fp16 [B, T, 3·H_t], final fp32 [B, T, H_t]) from an output_hidden_states forward. The last of
    HF's hidden_states is after the final norm: what the LM head reads."""
    return torch.cat([out.hidden_states[i] for i in taps], dim=-1).half(), out.hidden_states[-1].float()


@torch.no_grad()
def _continue(model: Any, prompts: Sequence[list[int]], max_len: int, temperature: float, end_ids: list[int],
              gen: torch.Generator, taps: Sequence[int]) -> list[_Seq]:
    """One continuation of each of ``prompts`` (one row each; repeat a prompt for several), each up to
    ``max_len`` tokens in all and cut after its first end id, with the target's taps, last hidden state and
    argmax at every position, from the generating passes themselves (as the runtime's incremental passes
    compute them): no second forward over the data.

    Rows of different lengths are left-padded, with the padding masked out and each row's positions
    counted from its own first token, so a row sees what it would alone (up to the float rounding of
    batched kernels); a row that ends leaves the batch (and its KV cache), so the rest run no wider."""
    n, lengths = len(prompts), torch.tensor([len(q) for q in prompts])
    width = int(lengths.max())
    pad = width - lengths  # [n]: left padding of each row
    quota = (max_len - lengths).clamp_min(0)  # new tokens each row may add
    cache = _grown_in_place(model, width + int(quota.max()))
    kwargs = {**_forward_kwargs(model, cache), "output_hidden_states": True}
    ids = torch.tensor([[0] * (width - len(q)) + list(q) for q in prompts])
    mask = (torch.arange(width)[None] >= pad[:, None]).long()
    positions = (mask.cumsum(1) - 1).clamp_min(0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, **kwargs)
    tap_now, final_now = _states(out, taps)
    cols = width + int(quota.max())
    tap_all = torch.zeros(n, cols, tap_now.shape[-1], dtype=tap_now.dtype)
    final_all = torch.zeros(n, cols, final_now.shape[-1])
    top1_all = torch.zeros(n, cols, dtype=torch.int32)  # prompt positions but the last are never scored
    tap_all[:, :width], final_all[:, :width] = tap_now, final_now
    top1_all[:, width - 1] = out.logits[:, -1].argmax(-1)
    new = torch.full((n, max(1, int(quota.max()))), -1, dtype=torch.long)
    ends = torch.tensor(end_ids or [-1])
    rows = torch.arange(n)  # the batch's rows, in cache order
    logits = out.logits[:, -1].float()
    done = quota <= 0
    step = 0

    def keep(which: torch.Tensor) -> None:
        nonlocal rows, logits, mask, positions
        if not bool(which.all()):
            cache.batch_select_indices(torch.nonzero(which)[:, 0])
            rows, logits, mask, positions = rows[which], logits[which], mask[which], positions[which]

    while True:
        keep(~done[rows])
        if not len(rows):
            break
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            nxt = sample_rows(torch.softmax(logits / temperature, -1), gen)
        new[rows, step] = nxt
        step += 1
        ended = torch.isin(nxt, ends)
        done[rows] |= ended | (step >= quota[rows])
        keep(~ended)  # the states at an end id are never read; at a row's last token by quota, they are
        if not len(rows):
            break
        nxt = nxt[~ended]
        mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype)], dim=1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=positions, **kwargs)
        tap_now, final_now = _states(out, taps)
        col = width + step - 1
        tap_all[rows, col], final_all[rows, col] = tap_now[:, -1], final_now[:, -1]
        top1_all[rows, col] = out.logits[:, -1].argmax(-1).int()
        logits = out.logits[:, -1].float()
    result = []
    for r, prompt in enumerate(prompts):
        row = [x for x in new[r].tolist() if x >= 0]
        m, lo = len(prompt) + len(row), int(pad[r])
        result.append(_Seq(list(prompt) + row, len(prompt) - 1, tap_all[r, lo:lo + m].clone(),
                           final_all[r, lo:lo + m].clone(), top1_all[r, lo:lo + m].clone()))
    return result


@torch.no_grad()
def _teacher_forced(model: Any, windows: list[list[int]], taps: Sequence[int], batch_size: int,
                    progress: Progress | None = None, done: int = 0, total: int = 0) -> list[_Seq]:
    """Text windows as they are: one forward each (right-padded in batches: a causal target's real positions
    never see the padding). ``progress("text", done + windows so far, total)`` after each batch: on a CPU
    a 135M target reads ~400 tokens/s, so half a million tokens of text take about 20 minutes."""
    result = []
    for lo in range(0, len(windows), batch_size):
        group = windows[lo:lo + batch_size]
        m = max(len(w) for w in group)
        ids = torch.tensor([w + [0] * (m - len(w)) for w in group])
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        tap_all, final_all = _states(out, taps)
        top1 = out.logits.argmax(-1).int()
        result += [_Seq(w, 1, tap_all[i, :len(w)], final_all[i, :len(w)], top1[i, :len(w)])
                   for i, w in enumerate(group)]
        if progress:
            progress("text", done + lo + len(group), total, None)
    return result


def read_documents(data_files: Sequence[str | os.PathLike], data_format: str) -> list[str]:
    from .medusa import read_texts

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


def _length_batches(rows: list[int], encoded: dict[int, list[int]]) -> list[list[int]]:
    """``rows`` (prompt indices) in batches of _GEN_BATCH, sorted by prompt length so a batch pads little."""
    rows = sorted(rows, key=lambda i: (len(encoded[i]), i))
    return [rows[lo:lo + _GEN_BATCH] for lo in range(0, len(rows), _GEN_BATCH)]


def _build_sequences(model: Any, tok: Any, cfg: EagleTrainConfig, prompts: Sequence[str], docs: Sequence[str],
                     end_ids: list[int], taps: Sequence[int], progress: Progress
                     ) -> tuple[list[_Seq], list[_Seq], dict]:
    """Whole prompts and documents are held out, so no held-out sequence shares a prefix with a training one.
    Training prompts get continuations at ``cfg.temperature``; held-out prompts one greedy continuation
    each, the runtime's greedy chain exactly."""
    groups = [("prompt", p) for p in prompts] + [("doc", d) for d in docs]
    train_groups, held_list = _split(len(groups), cfg.heldout_fraction, cfg.seed)
    held_groups = set(held_list)
    encoded: dict[int, list[int]] = {}
    for i, (kind, text) in enumerate(groups):
        if kind == "prompt":
            ids = _encode_prompt(tok, text, cfg.chat_template)
            if len(ids) + 1 < cfg.seq_len:  # else no room for a continuation: skipped
                encoded[i] = ids
    train_prompts = [i for i in train_groups if i in encoded]
    per_prompt = 1 if cfg.temperature == 0 else math.ceil(cfg.num_sequences / max(1, len(train_prompts)))
    # one row per continuation, batched across prompts; held-out prompts get one greedy row each
    batches = [(cfg.temperature, b) for b in _length_batches([i for i in train_prompts for _ in range(per_prompt)],
                                                             encoded)]
    batches += [(0.0, b) for b in _length_batches([i for i in held_list if i in encoded], encoded)]
    total = sum(len(b) for _, b in batches)
    gen = torch.Generator().manual_seed(cfg.seed)
    train: list[_Seq] = []
    held: list[_Seq] = []
    done = 0
    for temperature, batch in batches:
        for i, seq in zip(batch, _continue(model, [encoded[i] for i in batch], cfg.seq_len, temperature, end_ids,
                                           gen, taps)):
            (held if i in held_groups else train).append(seq)
        done += len(batch)
        progress("generate", done, total, None)
    windows: dict[bool, list[list[int]]] = {False: [], True: []}
    for i, (kind, text) in enumerate(groups):
        if kind == "doc":
            ids = tok(text).input_ids
            windows[i in held_groups] += [ids[k:k + cfg.seq_len] for k in range(0, len(ids), cfg.seq_len)
                                          if len(ids) - k >= _MIN_WINDOW]
    n_text = len(windows[False]) + len(windows[True])
    train += _teacher_forced(model, windows[False], taps, cfg.batch_size, progress, 0, n_text)
    held += _teacher_forced(model, windows[True], taps, cfg.batch_size, progress, len(windows[False]), n_text)
    skipped = len(prompts) - len(encoded)
    if not train or not held:
        raise ConfigError("eagle train: no training or no held-out sequences remain (prompts that leave no room "
                          f"in seq_len {cfg.seq_len} are skipped: {skipped} were)")
    info = {"prompts": len(prompts), "documents": len(docs), "prompts_skipped": skipped,
            "prompts_train": len(train_prompts), "prompts_heldout": sum(1 for i in held_list if i in encoded),
            "documents_heldout": sum(1 for i in held_list if groups[i][0] == "doc"),
            "text_windows": len(windows[False]) + len(windows[True]), "continuations_per_prompt": per_prompt}
    return train, held, info


def choose_draft_vocab(sequences: Sequence[tuple[Sequence[int], int]], vocab_size: int, n: int | None,
                       end_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, float]:
    """EAGLE-3's draft vocabulary (traineagle3/cnets.py:664-676): the ``n`` most frequent tokens the training
    ``sequences`` ((tokens, first scored target position) pairs) predict, ties to the lower id, plus the end
    ids, sorted ascending; d2t[i] = used[i] - i. Returns (d2t int64 [D], t2d bool [V], the fraction of
    predicted tokens the vocabulary covers)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for tokens, start in sequences:
        counts += torch.bincount(torch.tensor(list(tokens[start + 1:]), dtype=torch.long), minlength=vocab_size)
    if n is None or n >= vocab_size:
        used = torch.arange(vocab_size)
    else:
        order = torch.argsort(-counts, stable=True)  # most frequent first, lower id first on ties
        seen = order[counts[order] > 0]
        ends = torch.tensor(sorted(set(end_ids)), dtype=torch.long)
        rest = seen[~torch.isin(seen, ends)][:max(0, n - len(ends))]
        used = torch.cat([ends, rest]).unique()  # sorted ascending
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    coverage = float(counts[used].sum()) / max(1, int(counts.sum()))
    return used - torch.arange(len(used)), t2d, coverage


@torch.no_grad()
def _cache(seqs: list[_Seq], lm_head: torch.nn.Module, targets: torch.Tensor, seq_len: int, topk: int,
           end_ids: list[int], progress: Progress, done: int, total: int) -> SequenceCache:
    """Pads ``seqs`` into a SequenceCache; the draft-vocab log-probabilities are the target's own logits at the
    draft ids' target ids (its LM head on its last hidden state), computed on scored positions only."""
    n, width = len(seqs), seqs[0].taps.shape[-1]
    k = min(topk, len(targets))
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
            logits = F.linear(q.final[lo:hi], weight, bias)
            top = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
            c.logp[i, lo:hi], c.ids[i, lo:hi] = top.values.half(), top.indices.int()
        if i == 0:
            _check_lm_head(q, lm_head)
        seqs[i] = None  # consumed: its fp32 states are freed as the cache fills
        progress("cache", done + i + 1, total, None)
    return c


def _check_lm_head(q: _Seq, lm_head: torch.nn.Module) -> None:
    """The cache's logits come from the LM head on the last hidden state; refuse a target where that is not
    its argmax (a logit scale or soft-cap between the two)."""
    lo, hi = max(1, q.start), len(q.tokens) - 1
    if hi <= lo:
        return
    logits = lm_head(q.final[lo:hi].to(lm_head.weight.dtype)).float()
    best = logits.gather(-1, q.top1[lo:hi, None].long())[:, 0]
    if not bool((best >= logits.max(-1).values - 1e-3).all()):
        raise ConfigError("this target's logits are not its LM head applied to its last hidden state; "
                          "eagle train cannot restrict them to a draft vocabulary")


def scored_rows(c: SequenceCache) -> torch.Tensor:
    """[N, T] bool: target position t is scored (start <= t < stop, t >= 1)."""
    t = torch.arange(c.tokens.shape[1])[None]
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
                            "topk", "chat_template", "data_format")}
    h.update(json.dumps([data_fields, list(prompts), list(docs)]).encode())
    return h.hexdigest()


def vocab_coverage(sequences: Sequence[tuple[Sequence[int], int]], t2d: torch.Tensor) -> float:
    """The fraction of the tokens ``sequences`` predict that a given draft vocabulary (``t2d``) holds."""
    predicted = torch.cat([torch.tensor(list(tokens[start + 1:]), dtype=torch.long) for tokens, start in sequences])
    return float(t2d[predicted].float().mean()) if len(predicted) else 1.0


def load_or_build(path: Path, fingerprint: str, resume: bool, model: Any, tok: Any, cfg: EagleTrainConfig,
          prompts: Sequence[str], docs: Sequence[str], end_ids: list[int], taps: Sequence[int],
          report: Progress, vocab: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
    """The run's cache: read back when resuming, else generated, cached and saved (atomically) at ``path``.
    ``vocab``: (d2t, t2d) to keep (a warm start's head's), else chosen from the training data."""
    if resume and path.is_file():
        cached = torch.load(path, weights_only=True)
        if cached["fingerprint"] != fingerprint:
            raise ConfigError(f"{path.parent} holds a cache of another target, data or data settings; train "
                              "without resume to start over")
        return cached
    t0 = time.perf_counter()
    train_seqs, held_seqs, info = _build_sequences(model, tok, cfg, prompts, docs, end_ids, taps, report)
    times = {"generate": time.perf_counter() - t0}
    predicted = [(q.tokens, q.start) for q in train_seqs]
    if vocab is None:
        d2t, t2d, coverage = choose_draft_vocab(predicted, model.config.vocab_size, cfg.draft_vocab, end_ids)
    else:
        (d2t, t2d), coverage = vocab, vocab_coverage(predicted, vocab[1])
    targets = torch.arange(len(d2t)) + d2t
    t0 = time.perf_counter()
    n_train, total = len(train_seqs), len(train_seqs) + len(held_seqs)
    head = model.get_output_embeddings()
    train = _cache(train_seqs, head, targets, cfg.seq_len, cfg.topk, end_ids, report, 0, total)
    held = _cache(held_seqs, head, targets, cfg.seq_len, cfg.topk, end_ids, report, n_train, total)
    times["cache"] = time.perf_counter() - t0
    info.update(draft_vocab_coverage=coverage, topk_mass=_topk_mass(train))
    cached = {"fingerprint": fingerprint, "d2t": d2t, "t2d": t2d, "train": vars(train), "heldout": vars(held),
              "info": info, "times": times}
    save_atomic(cached, path)
    return cached
