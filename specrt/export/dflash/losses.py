"""The DFlash training objective (:mod:`.train`) on cached sequences (``eagle.data.SequenceCache``): anchors drawn
among the scored positions, every anchor's block run in one pass under one dense block mask, the position-decayed
KL to the target, and the greedy acceptance per block slot on held-out sequences.

A block anchored at position p is [token p, MASK x (B-1)] at positions p .. p+B-1, as the runtime drafts after
committing token p: its context is the target's tapped states of positions < p, and slot k >= 1 learns the target's
distribution at position p+k-1 (which predicts token p+k). The training pass reuses the reference draft's weights and
its ``keys_values`` (:mod:`.model`); only the attention over many blocks at once is written here."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..eagle.data import Progress, SequenceCache, scored_rows
from ..eagle.ttt import kl_loss
from ..eagle.vocab import draft_to_target_ids
from .model import DFlashAttention, DFlashDraft, rope
from .train_config import DFlashTrainConfig

EVAL_CHUNK = 64  # held-out anchors run together (a 64·B-row pass)


@dataclass
class Frozen:
    """What the draft borrows from the target, frozen and on the draft's device: its input table (a plain one, as
    the export's graph copies it) and its LM head's rows of the draft vocabulary."""

    embed: Tensor  # [V, H] float32
    head_weight: Tensor  # [D, H] float32: lm_head.weight[draft ids' target ids]
    head_bias: Tensor | None  # [D] or None
    d2t: Tensor  # [D] int64: draft id j is target id j + d2t[j]
    t2d: Tensor  # [V] bool: the target ids the draft vocabulary holds
    mask_token_id: int

    def logits(self, hidden: Tensor) -> Tensor:
        """[..., H] final-normed draft rows -> [..., D] logits over the draft vocabulary."""
        return F.linear(hidden, self.head_weight.to(hidden.dtype),
                        None if self.head_bias is None else self.head_bias.to(hidden.dtype))


# ------------------------------------------------------------------------------------------ anchors and the mask


def anchor_generator(seed: int, step: int) -> torch.Generator:
    """The anchors of ``step`` depend on the seed and the step alone: a resumed run draws what an unbroken one does."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def sample_anchors(batch: SequenceCache, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """(anchors [b, N] long, valid [b, N] bool): per sequence up to ``n`` distinct scored positions drawn uniformly,
    ascending; a sequence with fewer has its remaining anchors marked invalid (they train nothing)."""
    ok = scored_rows(batch).cpu()  # [b, T]: position p's distribution is the target's, so slot 1 has a target
    keys = torch.rand(ok.shape, generator=gen).masked_fill(~ok, 2.0)  # invalid positions sort last
    idx = keys.argsort(dim=1)[:, :min(n, ok.shape[1])].sort(dim=1).values
    return idx.to(batch.tokens.device), ok.gather(1, idx).to(batch.tokens.device)


def block_mask(anchors: Tensor, context_len: int, block_size: int) -> Tensor:
    """The bool attention mask (True = attend) of N blocks over [context S | N blocks of B], [..., N·B, S + N·B] for
    anchors [..., N]: block j's queries see context keys t < anchors[j] (the target's states of committed tokens,
    the anchor's own not yet computed) and all B keys of their own block (no causal order), nothing of another."""
    m = anchors.shape[-1] * block_size
    starts = anchors.repeat_interleave(block_size, dim=-1)  # [..., M]: each query row's anchor
    context = torch.arange(context_len, device=anchors.device) < starts[..., None]  # [..., M, S]
    block = torch.arange(m, device=anchors.device) // block_size
    own = (block[:, None] == block[None, :]).expand(*context.shape[:-1], m)  # [..., M, M]
    return torch.cat([context, own], dim=-1)


def block_inputs(frozen: Frozen, batch: SequenceCache, anchors: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
    """(the blocks' embeddings [b, N·B, H]: [token p, MASK x (B-1)] per anchor p, their positions [b, N·B])."""
    b, n = anchors.shape
    ids = torch.full((b, n, block_size), frozen.mask_token_id, dtype=torch.long, device=anchors.device)
    ids[..., 0] = batch.tokens.long().gather(1, anchors)
    positions = anchors[..., None] + torch.arange(block_size, device=anchors.device)
    return F.embedding(ids.view(b, n * block_size), frozen.embed), positions.view(b, n * block_size)


# ------------------------------------------------------------------------------------------ the training pass


def _keys_values(attn: DFlashAttention, rows: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
    """``keys_values`` of rows [b, T, H] at positions [b, T] -> K, V [b, kv_heads, T, d] (it works row by row)."""
    b, t, h = rows.shape
    k, v = attn.keys_values(rows.reshape(b * t, h), positions.reshape(b * t))  # [kv_heads, b·T, d]
    return k.view(-1, b, t, attn.head_dim).transpose(0, 1), v.view(-1, b, t, attn.head_dim).transpose(0, 1)


def _block_attention(attn: DFlashAttention, h: Tensor, positions: Tensor, context: Tensor, context_positions: Tensor,
                     mask: Tensor) -> Tensor:
    """The reference attention (``DFlashAttention.forward``) of block rows h [b, M, H] over [context ; blocks] under
    ``mask`` [b, M, S+M] -> [b, M, H]."""
    b, m, _ = h.shape
    q = attn.q_norm(attn.q_proj(h).view(b * m, attn.heads, attn.head_dim)).transpose(0, 1)  # [heads, b·M, d]
    q = rope(q, positions.reshape(-1), attn.theta).view(attn.heads, b, m, attn.head_dim).transpose(0, 1)
    kc, vc = _keys_values(attn, context, context_positions)  # the fused context: no input_layernorm
    kb, vb = _keys_values(attn, h, positions)
    group = attn.heads // attn.kv_heads  # query head j reads kv head j // group
    k = torch.cat([kc, kb], dim=2).repeat_interleave(group, dim=1)  # [b, heads, S+M, d]
    v = torch.cat([vc, vb], dim=2).repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask[:, None])  # [b, heads, M, d]
    return attn.o_proj(out.transpose(1, 2).reshape(b, m, attn.heads * attn.head_dim))


def draft_hidden(draft: DFlashDraft, features: Tensor, blocks: Tensor, positions: Tensor, mask: Tensor) -> Tensor:
    """Many blocks in one pass: features [b, S, n·H] (the tapped target states of positions 0..S-1), blocks
    [b, M, H] at positions [b, M], mask [b, M, S+M] (:func:`block_mask`) -> the final-normed rows [b, M, H]. Under
    the block mask each block's rows equal the reference draft's (``DFlashDraft.forward``) on that block alone."""
    context = draft.context(features)
    s = features.shape[1]
    context_positions = torch.arange(s, device=features.device).expand(features.shape[0], s)
    x = blocks
    for layer in draft.layers:
        x = x + _block_attention(layer.self_attn, layer.input_layernorm(x), positions, context, context_positions,
                                 mask)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return draft.norm(x)


def run_blocks(draft: DFlashDraft, frozen: Frozen, batch: SequenceCache, anchors: Tensor, block_size: int) -> Tensor:
    """The draft's final-normed rows [b, N, B, H] of the blocks anchored at ``anchors`` [b, N] in ``batch``."""
    blocks, positions = block_inputs(frozen, batch, anchors, block_size)
    mask = block_mask(anchors, batch.tokens.shape[1], block_size)
    hidden = draft_hidden(draft, batch.taps.to(draft.fc.weight.dtype), blocks.to(draft.fc.weight.dtype), positions,
                          mask)
    return hidden.view(*anchors.shape, block_size, -1)


# ------------------------------------------------------------------------------------------ loss and acceptance


def slot_targets(batch: SequenceCache, anchors: Tensor, valid: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
    """(the target position each slot learns, p+k-1 [b, N, B] clamped into the sequence; whether it has a target
    [b, N, B]: k >= 1, a valid anchor, and p+k-1 scored)."""
    k = torch.arange(block_size, device=anchors.device)
    pos = anchors[..., None] + k - 1
    has = valid[..., None] & (k >= 1) & (pos < batch.stop[:, None, None].long())
    return pos.clamp(0, batch.tokens.shape[1] - 1), has


def _at(values: Tensor, pos: Tensor) -> Tensor:
    """values [b, T, ...] at positions pos [b, N, B] -> [b, N, B, ...]."""
    b, n, k = pos.shape
    flat = pos.reshape(b, n * k)
    if values.dim() == 2:
        return values.gather(1, flat).view(b, n, k)
    return values.gather(1, flat[..., None].expand(-1, -1, values.shape[-1])).view(b, n, k, values.shape[-1])


def block_loss(draft: DFlashDraft, frozen: Frozen, batch: SequenceCache, anchors: Tensor, valid: Tensor,
               cfg: DFlashTrainConfig) -> tuple[Tensor, list[Tensor]]:
    """(the loss: per slot k >= 1 the KL from the target's distribution at p+k-1 to the draft's slot k, over the
    draft vocabulary coarsened to the cached top-k (``eagle.ttt.kl_loss``), weighted exp(-(k-1)/gamma) and
    normalised by the weights of the slots that have one; each slot's mean KL). A slot whose target argmax has no
    draft id is left out, as eagle train leaves out such rows."""
    hidden = run_blocks(draft, frozen, batch, anchors, cfg.block_size)
    pos, has = slot_targets(batch, anchors, valid, cfg.block_size)
    has = has & frozen.t2d[_at(batch.top1.long(), pos)]
    logp, ids = _at(batch.logp, pos), _at(batch.ids, pos)
    total = norm = hidden.new_zeros((), dtype=torch.float32)
    slots = []
    for k, w in enumerate(cfg.slot_weights()):
        if k == 0:
            continue
        keep = has[..., k]
        rows = keep.sum()
        kl, _ = kl_loss(frozen.logits(hidden[..., k, :][keep]), logp[..., k, :][keep], ids[..., k, :][keep],
                        torch.ones(int(rows), dtype=torch.bool, device=keep.device))
        total, norm = total + w * kl, norm + w * rows
        slots.append(kl / rows.clamp_min(1))
    return total / norm.clamp_min(1e-9), slots


def _eval_anchors(b: SequenceCache, block_size: int) -> Tensor:
    """The held-out anchors of one sequence: every scored position whose B-1 slots all have a scored target."""
    t = torch.arange(b.tokens.shape[1], device=b.tokens.device)
    return torch.nonzero(scored_rows(b)[0] & (t + block_size - 2 < b.stop[0].long()))[:, 0]


@torch.no_grad()
def evaluate(draft: DFlashDraft, frozen: Frozen, data: SequenceCache, cfg: DFlashTrainConfig,
             progress: Progress | None = None) -> dict:
    """Greedy acceptance per block slot on cached (held-out) sequences, every eligible position an anchor.

    Slot k is accepted iff slots 1..k-1 were, the draft's argmax (a target id) equals the target's argmax at p+k-1,
    and the cached sequence continues as the accepted drafts did (token p+k-1 == the target's argmax at p+k-2), so
    the target's verdict read from the cache is the one the runtime would get. Greedy held-out replies always do;
    on text windows this is a lower bound. ``accept_by_slot[k-1]``: the fraction of anchors with slots 1..k accepted;
    ``tokens_per_pass``: 1 + their sum, the tokens a target pass commits."""
    draft.eval()
    dev, size = frozen.d2t.device, cfg.block_size
    weights = cfg.slot_weights()
    alive_at, kl_sum, kl_rows, anchors_n = [0] * (size - 1), [0.0] * (size - 1), [0] * (size - 1), 0
    for i in range(len(data)):
        b = data.batch([i], dev)
        top1, tokens = b.top1.long(), b.tokens.long()
        for chunk in _eval_anchors(b, size).split(EVAL_CHUNK):
            anchors = chunk[None]
            valid = torch.ones_like(anchors, dtype=torch.bool)
            hidden = run_blocks(draft, frozen, b, anchors, size)[0]  # [n, B, H]
            pos, has = slot_targets(b, anchors, valid, size)
            has = (has & frozen.t2d[_at(top1, pos)])[0]  # [n, B]: the slots the loss counts
            logp, ids, pos = _at(b.logp, pos)[0], _at(b.ids, pos)[0], pos[0]  # [n, B, k], [n, B, k], [n, B]
            alive = torch.ones(len(chunk), dtype=torch.bool, device=dev)
            for k in range(1, size):
                logits = frozen.logits(hidden[:, k])
                guess = draft_to_target_ids(logits.argmax(-1), frozen.d2t)
                ok = guess == top1[0, pos[:, k]]
                if k > 1:  # the cache's verdict at p+k-1 read token p+k-1, which must be the accepted draft
                    ok &= tokens[0, pos[:, k]] == top1[0, pos[:, k - 1]]
                alive &= ok
                alive_at[k - 1] += int(alive.sum())
                keep = has[:, k]
                kl, rows = kl_loss(logits[keep], logp[keep, k], ids[keep, k],
                                   torch.ones(int(keep.sum()), dtype=torch.bool, device=dev))
                kl_sum[k - 1] += float(kl)
                kl_rows[k - 1] += int(rows)
            anchors_n += len(chunk)
        if progress:
            progress("evaluate", i + 1, len(data), None)
    accept = [a / max(1, anchors_n) for a in alive_at]
    alpha = [accept[0]] + [alive_at[k] / max(1, alive_at[k - 1]) for k in range(1, size - 1)]
    kl_by_slot = [s / max(1, r) for s, r in zip(kl_sum, kl_rows)]
    norm = sum(w * r for w, r in zip(weights[1:], kl_rows))
    return {"anchors": anchors_n, "block_size": size, "accept_by_slot": accept, "alpha_by_slot": alpha,
            "tokens_per_pass": 1 + sum(accept), "kl_by_slot": kl_by_slot,
            "loss": sum(w * s for w, s in zip(weights[1:], kl_sum)) / norm if norm else 0.0}
