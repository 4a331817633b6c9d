"""What the demo pair trains on and is judged by: next-token cross entropy for the target, distillation for
the draft, and their held-out metrics (loss, perplexity, acceptance by the speculative rule)."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


def logits_of(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    return model(input_ids=inputs, use_cache=False).logits.float()


def next_token_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def kl_target_draft(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(p_target || q_draft), both at temperature 1."""
    log_p = F.log_softmax(target_logits.flatten(0, 1), dim=-1)
    log_q = F.log_softmax(draft_logits.flatten(0, 1), dim=-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")


def distill_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor,
                 ce_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, kl). Speculative decoding accepts a drafted token with probability min(1, p/q), so the
    acceptance rate is alpha = E[sum_x min(p(x), q(x))] = 1 - E[TV(p, q)]: it rewards matching the target's
    whole distribution, not the data. Forward KL(p || q) is the smooth objective that drives q to p (Pinsker:
    TV <= sqrt(KL / 2)); the small CE term on the real next token only anchors the draft where the target is
    itself unsure.
    """
    kl = kl_target_draft(target_logits, draft_logits)
    if ce_weight == 0.0:
        return kl, kl
    return (1.0 - ce_weight) * kl + ce_weight * next_token_ce(draft_logits, labels), kl


def split_batch(batch: torch.Tensor, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    batch = batch.to(device)
    return batch[:, :-1], batch[:, 1:]


@torch.no_grad()
def eval_target(target: torch.nn.Module, val: Sequence[torch.Tensor], device: str) -> dict[str, float]:
    """Held-out next-token cross entropy (nats per token)."""
    target.eval()
    total, positions = 0.0, 0
    for batch in val:
        inputs, labels = split_batch(batch, device)
        total += next_token_ce(logits_of(target, inputs), labels).item() * labels.numel()
        positions += labels.numel()
    return {"val_loss": total / positions}


@torch.no_grad()
def eval_draft(draft: torch.nn.Module, target: torch.nn.Module, val: Sequence[torch.Tensor],
               device: str) -> dict[str, float]:
    """Held-out cross entropy of the draft and its KL(p_target || q_draft)."""
    draft.eval()
    target.eval()
    ce = kl = 0.0
    positions = 0
    for batch in val:
        inputs, labels = split_batch(batch, device)
        q_logits = logits_of(draft, inputs)
        n = labels.numel()
        ce += next_token_ce(q_logits, labels).item() * n
        kl += kl_target_draft(logits_of(target, inputs), q_logits).item() * n
        positions += n
    return {"val_loss": ce / positions, "val_kl": kl / positions}


@torch.no_grad()
def acceptance(target: torch.nn.Module, draft: torch.nn.Module, val: Sequence[torch.Tensor],
               device: str) -> dict[str, float]:
    """alpha_greedy: how often argmax q == argmax p (greedy decoding's acceptance rate);
    alpha_t1: mean sum_x min(p, q) at temperature 1 (sampling's acceptance rate)."""
    target.eval()
    draft.eval()
    agree = overlap = 0.0
    positions = 0
    for batch in val:
        inputs, _ = split_batch(batch, device)
        p_logits, q_logits = logits_of(target, inputs), logits_of(draft, inputs)
        agree += (p_logits.argmax(-1) == q_logits.argmax(-1)).sum().item()
        overlap += torch.minimum(p_logits.softmax(-1), q_logits.softmax(-1)).sum(-1).sum().item()
        positions += inputs.numel()
    return {"alpha_greedy": agree / positions, "alpha_t1": min(1.0, overlap / positions), "positions": positions}
