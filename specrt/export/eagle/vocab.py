"""An EAGLE-3 head's draft vocabulary: draft id i is target id i + d2t[i]; t2d marks the target ids that have
one (docs/design/eagle3.md, "Draft vocabulary"). The head itself is :mod:`specrt.export.eagle.head`."""

from __future__ import annotations

from typing import Sequence

import torch

from ...errors import EagleHeadError


def token_counts(sequences: Sequence[Sequence[int]], vocab_size: int) -> torch.Tensor:
    """How often each of ``vocab_size`` ids occurs in ``sequences`` (int64 [vocab_size])."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids in sequences:
        if len(ids):
            counts += torch.bincount(torch.as_tensor(list(ids), dtype=torch.long), minlength=vocab_size)
    return counts


def ranked_ids(counts: torch.Tensor, n: int, always: torch.Tensor) -> torch.Tensor:
    """The ``n`` ids to keep of a counted vocabulary, ascending: every ``always`` one (bool, as ``counts``), then the
    most frequent, ties to the lower id: how the trainer chooses a draft vocabulary and ``eagle prune`` cuts one."""
    order = torch.argsort(-counts, stable=True)
    ranked = torch.cat([order[always[order]], order[~always[order]]])
    return ranked[:n].sort().values


def draft_to_target_ids(draft_ids: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    return draft_ids + d2t[draft_ids]


def draft_logits_to_target(logits: torch.Tensor, d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[..., D] draft logits → [..., V] with -inf at target ids outside the draft vocabulary (vLLM's way)."""
    out = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    out[..., torch.arange(d2t.shape[0], device=d2t.device) + d2t] = logits
    return out


def target_logits_to_draft(target_logits: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """[..., V] target logits at the draft ids' targets, in draft-id order (the distillation target).
    EAGLE indexes with t2d instead, which equals this only when the target ids are sorted."""
    return target_logits[..., torch.arange(d2t.shape[0], device=d2t.device) + d2t]


def validate_vocab_map(d2t: torch.Tensor | None, t2d: torch.Tensor | None, vocab_size: int,
                       draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Check (and, where absent and implied, build) the maps; returns int64 d2t [D] and bool t2d [V]."""
    if d2t is None:
        if draft_vocab_size != vocab_size:
            raise EagleHeadError(f"no d2t: a draft vocabulary of {draft_vocab_size} < vocab_size {vocab_size} "
                                 "needs the d2t map (EAGLE-1/2 heads have none)")
        d2t = torch.zeros(draft_vocab_size, dtype=torch.int64)
    if d2t.dtype.is_floating_point or d2t.dtype.is_complex or d2t.dtype == torch.bool:
        raise EagleHeadError(f"d2t must hold integers, got {d2t.dtype}")
    if tuple(d2t.shape) != (draft_vocab_size,):
        raise EagleHeadError(f"d2t has shape {list(d2t.shape)}, expected [{draft_vocab_size}] (draft_vocab_size)")
    d2t = d2t.to(torch.int64)
    targets = torch.arange(draft_vocab_size) + d2t
    bad = ((targets < 0) | (targets >= vocab_size)).nonzero()
    if len(bad):
        i = int(bad[0])
        raise EagleHeadError(f"d2t maps draft id {i} (offset {int(d2t[i])}) to target id {int(targets[i])}, "
                             f"outside [0, {vocab_size})")
    order = torch.argsort(targets, stable=True)
    dup = (targets[order][1:] == targets[order][:-1]).nonzero()
    if len(dup):
        i, j = int(order[int(dup[0])]), int(order[int(dup[0]) + 1])
        raise EagleHeadError(f"d2t maps draft ids {i} and {j} to the same target id {int(targets[i])}")
    expected = torch.zeros(vocab_size, dtype=torch.bool)
    expected[targets] = True
    if t2d is None:
        return d2t, expected
    if tuple(t2d.shape) != (vocab_size,):
        raise EagleHeadError(f"t2d has shape {list(t2d.shape)}, expected [{vocab_size}] (vocab_size)")
    if t2d.dtype != torch.bool:
        if t2d.dtype.is_floating_point or not bool(((t2d == 0) | (t2d == 1)).all()):
            raise EagleHeadError(f"t2d must be a boolean mask, got {t2d.dtype}")
        t2d = t2d.to(torch.bool)
    wrong = (t2d != expected).nonzero()
    if len(wrong):
        j = int(wrong[0])
        if t2d[j]:
            raise EagleHeadError(f"t2d marks target id {j}, which no draft id maps to through d2t")
        i = int((targets == j).nonzero()[0])
        raise EagleHeadError(f"t2d misses target id {j}, which d2t maps draft id {i} to")
    return d2t, t2d
