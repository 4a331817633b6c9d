"""How the target writes an EAGLE-3 head's training data (``eagle_data`` assembles it): its own
continuations of seed prompts, batched across prompts, and teacher-forced passes over text, each keeping the
target's taps, last hidden state and argmax at every position.

The target runs on its own device (the CPU or a CUDA GPU); what it writes lands in host memory, where the
cache is assembled, and sampling draws its uniforms from a CPU generator, so a seed gives the same stream of
draws on either device."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ...errors import ConfigError
from ..progress import PhaseProgress
from . import budget

Progress = PhaseProgress


def model_device(model: Any) -> torch.device:
    """Where ``model`` (a transformers model or ``precision.generating``'s copy) keeps its weights."""
    weights = model.parameters() if isinstance(model, torch.nn.Module) else model.get_decoder().parameters()
    return next(weights).device


def _forward_kwargs(decoder: Any, cache: Any) -> dict:
    """transformers renamed past_key_values to cache (5.2x)."""
    params = inspect.signature(decoder.forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache, "use_cache": True}


def _target_pass(model: Any, taps: Sequence[int], last_only: bool, **kwargs: Any
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(taps fp16 [B, T, 3·H_t], final fp32 [B, T, H_t], logits fp32 [B, T or 1, V]) from the target's decoder
    and its LM head, each in its own weights' dtype (``generating``)."""
    out = model.get_decoder()(output_hidden_states=True, **kwargs)
    tap, final = _states(out, taps)
    head = model.get_output_embeddings()
    logits = head((final[:, -1:] if last_only else final).to(head.weight.dtype)).float()
    return tap, final, logits


def check_logits_are_lm_head(model: Any, ids: Sequence[int]) -> None:
    """The cache's logits are the LM head applied to the last hidden state; refuse a target where its own
    logits are not that (a logit scale or soft-cap between the two)."""
    x = torch.tensor([list(ids)[:16]], device=model_device(model))
    with torch.no_grad():
        out = model(input_ids=x, output_hidden_states=True, use_cache=False)
        mine = model.get_output_embeddings()(out.hidden_states[-1])
    if not torch.allclose(mine.float(), out.logits.float(), rtol=1e-3, atol=1e-3):
        raise ConfigError("this target's logits are not its LM head applied to its last hidden state; "
                          "eagle train cannot restrict them to a draft vocabulary")


def sample_rows(probs: torch.Tensor, gen: torch.Generator, block: int = 256) -> torch.Tensor:
    """One id per row of ``probs`` [n, V] (unnormalised: mass per id) by inverse CDF, one uniform draw a row,
    in two levels: the CDF of blocks of ``block`` ids, then of the chosen block's ids (in float64). A
    full-vocabulary CDF cost 40 % of generating at 128 rows in bfloat16; ``torch.multinomial`` draws an
    exponential per vocabulary entry."""
    n, v = probs.shape
    p = (F.pad(probs, (0, -v % block)) if v % block else probs).view(n, -1, block)  # [n, blocks, block]
    mass = p.sum(-1).double()  # [n, blocks]
    cdf = mass.cumsum(-1)
    u = torch.rand(n, 1, generator=gen, dtype=torch.float64).to(probs.device) * cdf[:, -1:]
    b = torch.searchsorted(cdf, u, right=True).clamp_max(cdf.shape[-1] - 1)  # [n, 1]
    u = u - (cdf.gather(1, b) - mass.gather(1, b))  # what is left to walk inside block b
    inner = p[torch.arange(n, device=probs.device), b[:, 0]].double().cumsum(-1)  # [n, block]
    j = torch.searchsorted(inner, u, right=True).clamp_max(block - 1)
    return (b * block + j)[:, 0].clamp_max(v - 1)


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
class TargetSequence:
    """One sequence as the target saw it, before the draft vocabulary is known."""

    tokens: list[int]
    start: int  # the first scored target position
    taps: torch.Tensor  # [len, 3·H_t] fp16
    final: torch.Tensor  # [len, H_t] fp32: the target's last hidden state, its LM head's input
    top1: torch.Tensor  # [len] int32: the target's argmax over the full vocabulary
    cut: bool = False  # its reply was cut at a deadline (it had neither ended nor reached its length)


def _states(out: Any, taps: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(taps fp16 [B, T, 3·H_t], final fp32 [B, T, H_t]) from an output_hidden_states forward. The last of
    HF's hidden_states is after the final norm: what the LM head reads."""
    return torch.cat([out.hidden_states[i] for i in taps], dim=-1).half(), out.hidden_states[-1].float()


@torch.no_grad()
def continue_prompts(model: Any, prompts: Sequence[list[int]], max_len: int, temperature: float, end_ids: list[int],
                     gen: torch.Generator, taps: Sequence[int], until: float | None = None, min_new: int = 0
                     ) -> list[TargetSequence]:
    """One continuation of each of ``prompts`` (one row each; repeat a prompt for several), each up to
    ``max_len`` tokens in all and cut after its first end id, with the target's taps, last hidden state and
    argmax at every position, from the generating passes themselves (as the runtime's incremental passes
    compute them): no second forward over the data. ``until``: a ``budget.clock()`` reading past which no token
    step runs once each row has written ``min_new``; rows still writing keep what they wrote, marked ``cut``.
    Rows of different lengths are left-padded, with the padding masked out and each row's positions
    counted from its own first token, so a row sees what it would alone (up to the float rounding of
    batched kernels); a row that ends leaves the batch (and its KV cache), so the rest run no wider. The
    bookkeeping (rows, quotas, ends) stays on the host; inputs, KV cache and logits on the target's device."""
    dev = model_device(model)
    n, lengths = len(prompts), torch.tensor([len(q) for q in prompts])
    width = int(lengths.max())
    pad = width - lengths  # [n]: left padding of each row
    quota = (max_len - lengths).clamp_min(0)  # new tokens each row may add
    cache = _grown_in_place(model, width + int(quota.max()))
    kwargs = _forward_kwargs(model.get_decoder(), cache)
    ids = torch.tensor([[0] * (width - len(q)) + list(q) for q in prompts], device=dev)
    mask = (torch.arange(width)[None] >= pad[:, None]).long().to(dev)
    positions = (mask.cumsum(1) - 1).clamp_min(0)
    tap_now, final_now, logits = _target_pass(model, taps, True, input_ids=ids, attention_mask=mask,
                                              position_ids=positions, **kwargs)
    logits = logits[:, -1]
    cols = width + int(quota.max())
    tap_all = torch.zeros(n, cols, tap_now.shape[-1], dtype=tap_now.dtype)
    final_all = torch.zeros(n, cols, final_now.shape[-1])
    top1_all = torch.zeros(n, cols, dtype=torch.int32)  # prompt positions but the last are never scored
    tap_all[:, :width], final_all[:, :width] = tap_now.cpu(), final_now.cpu()
    top1_all[:, width - 1] = logits.argmax(-1).cpu()
    new = torch.full((n, max(1, int(quota.max()))), -1, dtype=torch.long)
    ends = torch.tensor(end_ids or [-1])
    rows = torch.arange(n)  # the batch's rows, in cache order
    done = quota <= 0
    cut = torch.zeros(n, dtype=torch.bool)
    step = 0

    def keep(which: torch.Tensor) -> None:
        nonlocal rows, logits, mask, positions
        if not bool(which.all()):
            on_dev = which.to(dev)
            cache.batch_select_indices(torch.nonzero(on_dev)[:, 0])
            rows, logits, mask, positions = rows[which], logits[on_dev], mask[on_dev], positions[on_dev]

    while True:
        keep(~done[rows])
        if not len(rows):
            break
        if until is not None and step >= min_new and budget.clock() >= until:
            cut[rows] = True  # each token so far has its states: the pass below ran for it
            break
        if temperature == 0:
            nxt = logits.argmax(-1).cpu()
        else:
            nxt = sample_rows((logits - logits.max(-1, keepdim=True).values).mul_(1 / temperature).exp_(), gen).cpu()
        new[rows, step] = nxt
        step += 1
        ended = torch.isin(nxt, ends)
        done[rows] |= ended | (step >= quota[rows])
        keep(~ended)  # the states at an end id are never read; at a row's last token by quota, they are
        if not len(rows):
            break
        nxt = nxt[~ended].to(dev)
        mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype, device=dev)], dim=1)
        positions = positions[:, -1:] + 1
        tap_now, final_now, logits = _target_pass(model, taps, True, input_ids=nxt[:, None], attention_mask=mask,
                                                  position_ids=positions, **kwargs)
        logits = logits[:, -1]
        col = width + step - 1
        tap_all[rows, col], final_all[rows, col] = tap_now[:, -1].cpu(), final_now[:, -1].cpu()
        top1_all[rows, col] = logits.argmax(-1).int().cpu()
    result = []
    for r, prompt in enumerate(prompts):
        row = [x for x in new[r].tolist() if x >= 0]
        m, lo = len(prompt) + len(row), int(pad[r])
        result.append(TargetSequence(list(prompt) + row, len(prompt) - 1, tap_all[r, lo:lo + m].clone(),
                                     final_all[r, lo:lo + m].clone(), top1_all[r, lo:lo + m].clone(), bool(cut[r])))
    return result


@torch.no_grad()
def teacher_forced(model: Any, windows: list[list[int]], taps: Sequence[int], batch_size: int,
                   progress: Progress | None = None, done: int = 0, total: int = 0, until: float | None = None
                   ) -> list[TargetSequence]:
    """Text windows as they are: one forward each (right-padded in batches: a causal target's real positions
    never see the padding). ``progress("text", done + windows so far, total)`` after each batch: on a CPU
    a 135M target reads ~400 tokens/s, so half a million tokens of text take about 20 minutes. ``until``: a
    ``budget.clock()`` reading past which no further batch starts (the first always runs); fewer windows come
    back then."""
    result: list[TargetSequence] = []
    for lo in range(0, len(windows), batch_size):
        if lo and until is not None and budget.clock() >= until:
            break
        group = windows[lo:lo + batch_size]
        m = max(len(w) for w in group)
        ids = torch.tensor([w + [0] * (m - len(w)) for w in group], device=model_device(model))
        tap_all, final_all, logits = _target_pass(model, taps, False, input_ids=ids, use_cache=False)
        tap_all, final_all, top1 = tap_all.cpu(), final_all.cpu(), logits.argmax(-1).int().cpu()
        result += [TargetSequence(w, 1, tap_all[i, :len(w)], final_all[i, :len(w)], top1[i, :len(w)])
                   for i, w in enumerate(group)]
        if progress:
            progress("text", done + lo + len(group), total, None)
    return result
