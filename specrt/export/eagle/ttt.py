"""Training-time test for an EAGLE-3 head (:mod:`specrt.export.eagle.train`): the head unrolled on its own outputs
over whole cached sequences under the attention pattern the runtime's chain sees, the per-step KL loss, and the
greedy acceptance those unrolled drafts would get from the runtime (the held-out check)."""

from __future__ import annotations


import torch
import torch.nn.functional as F

from .head import Eagle3Head
from .data import Progress, SequenceCache, scored_rows
from .train_config import EagleTrainConfig
from .vocab import draft_to_target_ids
from ..precision import compute_context


# ----------------------------------------------------------------------------------------- the TTT mask


def ttt_mask(seq_len: int, step: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The bool attention mask (True = attend) of unrolled step ``step`` over the keys of steps 0..step.

    Shape [T, (step+1)·T]: block s' (columns s'·T .. s'·T+T-1) holds the keys step s' computed for rows
    0..T-1. Query row j at step s drafts depth s of the chain whose last target-verified row (root) is
    r = j - s; at inference that row has the root's prefix 0..r in the head's cache plus the chain's deeper
    rows r+1..j-1, and itself. So row j sees column c of block 0 iff c <= j - s, and of block s' >= 1 iff
    c == j - s + s' (the chain's depth-s' row, itself when s' = s). Rows with j < s have no root; they
    see only their own chain cells and are never scored.
    """
    j = torch.arange(seq_len, device=device)[:, None]
    c = torch.arange(seq_len, device=device)[None, :]
    return torch.cat([c <= j - step] + [c == j - step + s for s in range(1, step + 1)], dim=1)


def ttt_hidden(head: Eagle3Head, taps: torch.Tensor, embeds: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """The head's outputs [B, T, H] (before its final norm) of each unrolled step 0..depth-1 over whole sequences.

    taps [B, T, 3·H_t]: the target's at positions 0..T-1; embeds [B, T, H]: of tokens 1..T (row j reads
    token j+1). Step s > 0 feeds row j the head's step-(s-1) output of row j-1 as features (the runtime's
    deeper chain row), with every earlier step's keys and values as the past under :func:`ttt_mask`.
    Gradients flow through the fed-back features and the earlier keys, as in EAGLE-3's training.
    """
    b, t = taps.shape[:2]
    dev = taps.device
    positions = torch.arange(t, device=dev).expand(b, t)  # row j sits at position j at every step (the chain's)
    hidden, kv = head.layer(head.fuse(taps), embeds, positions, ttt_mask(t, 0, dev).expand(b, 1, t, t))
    hiddens, steps = [hidden], [kv]  # steps[s][layer] = (key, value) step s computed in that layer
    for s in range(1, depth):
        features = F.pad(hidden[:, :-1], (0, 0, 1, 0))  # row j ← row j-1's previous-step output
        mask = ttt_mask(t, s, dev).expand(b, 1, t, (s + 1) * t)
        past = tuple((torch.cat([x[i][0] for x in steps], dim=1), torch.cat([x[i][1] for x in steps], dim=1))
                     for i in range(len(kv)))
        hidden, kv = head.layer(features, embeds, positions, mask, past)
        hiddens.append(hidden)
        steps.append(kv)
    return hiddens


def ttt_forward(head: Eagle3Head, taps: torch.Tensor, embeds: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """Draft logits [B, T, D] of each unrolled step (:func:`ttt_hidden`) at every row."""
    return [head.logits(h) for h in ttt_hidden(head, taps, embeds, depth)]


# ------------------------------------------------------------------------------------ loss and metrics


def kl_loss(logits: torch.Tensor, logp: torch.Tensor, ids: torch.Tensor, keep: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over the ``keep`` rows, their count) of KL(p || q) over the draft vocabulary coarsened to p's stored
    top-k ids plus one bucket for the rest (exact when k = D; never more than the full KL). logits [B, T, D]
    (the head's), logp / ids [B, T, k] (the target's, row-aligned), keep [B, T] bool."""
    logq = torch.log_softmax(logits.float(), dim=-1)
    logp = logp.float()
    p = logp.exp()
    kl = (p * (logp - logq.gather(-1, ids.long()))).sum(-1)
    if ids.shape[-1] < logits.shape[-1]:
        rest_p = (1 - p.sum(-1)).clamp_min(0)  # fp16 log-probs may sum a hair over 1
        rest_logq = torch.logsumexp(logq.scatter(-1, ids.long(), float("-inf")), dim=-1)
        kl = kl + rest_p * (torch.log(rest_p.clamp_min(1e-12)) - rest_logq)
    return (kl * keep).sum(), keep.sum()  # the count stays a tensor: no device sync per unrolled step


def step_kls(head: Eagle3Head, embed: torch.Tensor, t2d: torch.Tensor, b: SequenceCache, depth: int, *,
              all_rows: bool = False) -> tuple[list[torch.Tensor] | None, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per step s the (KL sum, rows) over rows j = r + s (root r = j - s >= 0) whose target position j+1 is
    scored and whose target argmax has a draft id (EAGLE-3's position_mask). The LM head runs on those rows
    only; ``all_rows`` also returns each step's logits [B, T, D] at every row (for acceptance), else None."""
    embeds = embed[F.pad(b.tokens[:, 1:].long(), (0, 1))]  # row j reads token j+1 (the last row: padding)
    hiddens = ttt_hidden(head, b.taps.float(), embeds, depth)
    target_ok = F.pad((scored_rows(b) & t2d[b.top1.long()])[:, 1:], (0, 1))  # row j: target position j+1
    logp, ids = F.pad(b.logp[:, 1:], (0, 0, 0, 1)), F.pad(b.ids[:, 1:], (0, 0, 0, 1))
    row = torch.arange(b.tokens.shape[1], device=b.tokens.device)[None]
    logits = [head.logits(h) for h in hiddens] if all_rows else None
    kls = []
    for s, h in enumerate(hiddens):
        keep = target_ok & (row >= s)
        lg = logits[s][keep] if logits is not None else head.logits(h[keep])
        kls.append(kl_loss(lg, logp[keep], ids[keep], torch.ones(len(lg), dtype=torch.bool, device=lg.device)))
    return logits, kls


def ttt_loss(head: Eagle3Head, embed: torch.Tensor, t2d: torch.Tensor, batch: SequenceCache,
             cfg: EagleTrainConfig, compute: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(the training loss of ``batch``: the unrolled steps' mean KLs weighed by ``cfg.loss_decay`` per step, those
    mean KLs), computed under ``compute``."""
    with compute_context(compute, embed.device):
        _, kls = step_kls(head, embed, t2d, batch, cfg.ttt_steps)
    losses = [total / rows.clamp_min(1) for total, rows in kls]  # per step: the mean over its rows
    return sum(cfg.loss_decay ** s * v for s, v in enumerate(losses)), losses


@torch.no_grad()
def evaluate(head: Eagle3Head, embed: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor, data: SequenceCache,
             cfg: EagleTrainConfig, progress: Progress | None = None) -> dict:
    """Greedy acceptance as the runtime's chain meets it, on cached (held-out) sequences (host memory; each
    batch is moved to ``d2t``'s device, where the head, ``embed`` and ``t2d`` are).

    A proposal starts at every root r whose next target position r+1 is scored: the head's step-0 draft of
    row r is accepted iff it maps to the target's argmax at r+1 (``alpha1``). Deeper draft s (row r+s) is
    accepted iff every earlier one was, it equals the target's argmax at r+s+1, and the cached sequence
    really continues with the accepted draft (token r+s+1 == argmax at r+s), so the head read exactly what
    the runtime would have fed it. Held-out continuations are greedy, where that always holds; on text
    windows it truncates chains where the text leaves the target's greedy path (a lower bound there).
    ``kl`` is the training loss (the decay-weighted per-step KL) on the same sequences.
    """
    head.eval()
    depth = cfg.ttt_steps
    roots = 0
    alive_at = [0] * depth
    kl_sum, kl_rows = [0.0] * depth, [0] * depth
    batches = range(0, len(data), cfg.batch_size)
    for n_done, lo in enumerate(batches, 1):
        b = data.batch(range(lo, min(len(data), lo + cfg.batch_size)), d2t.device)
        logits, kls = step_kls(head, embed, t2d, b, depth, all_rows=True)
        for s, (total, rows) in enumerate(kls):
            kl_sum[s] += float(total)
            kl_rows[s] += int(rows)
        top1 = b.top1.long()
        nxt = F.pad(top1[:, 1:], (0, 1), value=-1)  # row j's target: the argmax at position j+1
        scored = F.pad(scored_rows(b)[:, 1:], (0, 1))  # row j: target position j+1 is scored
        on_path = F.pad(b.tokens[:, 1:].long() == top1[:, :-1], (0, 1))  # token j+1 == the argmax at j
        alive = scored.clone()  # indexed by root r
        roots += int(alive.sum())
        for s, lg in enumerate(logits):
            ok = (draft_to_target_ids(lg.argmax(-1), d2t) == nxt) & scored & (on_path if s else scored)
            alive = alive & F.pad(ok[:, s:], (0, s), value=False)  # root r's depth-s draft sits at row r + s
            alive_at[s] += int(alive.sum())
        if progress:
            progress("evaluate", n_done, len(batches), None)
    accepted = sum(alive_at)
    alpha = [alive_at[0] / max(1, roots)] + [alive_at[s] / max(1, alive_at[s - 1]) for s in range(1, depth)]
    kl_steps = [total / max(1, rows) for total, rows in zip(kl_sum, kl_rows)]
    return {"roots": roots, "depth": depth, "alpha1": alpha[0], "alpha_by_depth": alpha,
            "accepted_per_proposal": accepted / max(1, roots), "acceptance_rate": accepted / max(1, roots * depth),
            "tokens_per_pass": 1 + accepted / max(1, roots), "kl_by_step": kl_steps,
            "kl": sum(cfg.loss_decay ** s * v for s, v in enumerate(kl_steps))}
