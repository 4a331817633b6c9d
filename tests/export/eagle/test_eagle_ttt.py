"""The training-time test of an EAGLE-3 head (specrt/export/eagle/ttt.py): the mask against the runtime's chain, the
unrolled steps against the runtime's order of work, the loss over the stored top-k, and the held-out acceptance
counted as the runtime's chain meets it."""

from __future__ import annotations

import pytest
import torch
from support.models import tiny_head_and_batch

from specrt.export.eagle import ttt
from specrt.export.eagle.config import Eagle3Config
from specrt.export.eagle.head import Eagle3Head
from specrt.export.eagle.data import SequenceCache
from specrt.export.eagle.train import EagleTrainConfig
from specrt.export.eagle.ttt import ttt_forward, ttt_mask


def test_ttt_mask_is_the_chains_attention():
    x, o = True, False
    # step 1, T = 4: block 0 = true-tap rows 0..j-1, block 1 = the row itself
    assert ttt_mask(4, 1).tolist() == [[o, o, o, o, x, o, o, o],
                                       [x, o, o, o, o, x, o, o],
                                       [x, x, o, o, o, o, x, o],
                                       [x, x, x, o, o, o, o, x]]
    # step 2: row j (root j-2) sees rows 0..j-2, the depth-1 row j-1 and itself
    m = ttt_mask(5, 2)
    assert m.shape == (5, 15)
    assert m[4].tolist() == [x, x, x, o, o] + [o, o, o, x, o] + [o, o, o, o, x]
    assert ttt_mask(3, 0).tolist() == torch.ones(3, 3, dtype=torch.bool).tril().tolist()


@pytest.mark.parametrize("layers", [1, 3])
def test_ttt_forward_equals_the_runtimes_chain(layers):
    """Unrolled step s at row r + s == the runtime's depth-s row after verified rows 0..r: cache the
    prefix's K/V (every layer's, for a stacked head), then feed each deeper row the previous row's hidden as
    features, at position r + s."""
    cfg = Eagle3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                       vocab_size=50, draft_vocab_size=20, target_hidden_size=24, num_layers=layers)
    torch.manual_seed(0)
    head = Eagle3Head(cfg).eval()
    t, depth = 9, 3
    taps, embeds = torch.randn(2, t, 72), torch.randn(2, t, 32)
    with torch.no_grad():
        unrolled = ttt_forward(head, taps, embeds, depth)
        for r in range(t - depth + 1):
            mask = torch.ones(2, 1, r + 1, r + 1, dtype=torch.bool).tril()
            out = head(taps[:, :r + 1], embeds[:, :r + 1], torch.arange(r + 1).expand(2, -1), mask)
            torch.testing.assert_close(out.logits[:, -1], unrolled[0][:, r], rtol=1e-5, atol=1e-5)
            past, hidden = [(out.key, out.value), *out.rest], out.hidden[:, -1:]
            for s in range(1, depth):
                j = r + s  # the depth-s row reads token j+1, i.e. embeds[:, j]
                step = head.step(hidden, embeds[:, j:j + 1], torch.full((2, 1), j),
                                 torch.ones(2, 1, 1, past[0][0].shape[1] + 1, dtype=torch.bool), *past[0], past[1:])
                torch.testing.assert_close(step.logits[:, 0], unrolled[s][:, j], rtol=1e-5, atol=1e-5)
                new = [(step.key, step.value), *step.rest]
                past = [(torch.cat([k, nk], 1), torch.cat([v, nv], 1)) for (k, v), (nk, nv) in zip(past, new)]
                hidden = step.hidden


def test_the_loss_on_scored_rows_alone_equals_the_loss_over_every_row():
    """Training runs the LM head on the rows it scores only; the KL sums are those of the full logits."""
    head, embed, t2d, b = tiny_head_and_batch()
    n, t = b.tokens.shape
    logits, kls = ttt.step_kls(head, embed, t2d, b, 3, all_rows=True)
    assert logits is not None and [tuple(lg.shape) for lg in logits] == [(n, t, 20)] * 3
    none, sparse = ttt.step_kls(head, embed, t2d, b, 3)
    assert none is None
    for (a, rows_a), (c, rows_c) in zip(kls, sparse):
        assert rows_a == rows_c > 0
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)


def test_kl_is_exact_with_the_full_row_and_a_lower_bound_with_top_k():
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(2, 5, 12, generator=g), torch.randn(2, 5, 12, generator=g)
    logp = torch.log_softmax(target, -1)
    keep = torch.ones(2, 5, dtype=torch.bool)
    exact = (logp.exp() * (logp - torch.log_softmax(logits, -1))).sum(-1).sum()
    top = logp.topk(12, -1)
    total, rows = ttt.kl_loss(logits, top.values, top.indices, keep)
    assert rows == 10
    torch.testing.assert_close(total, exact, rtol=1e-5, atol=1e-6)
    top = logp.topk(4, -1)
    coarse, _ = ttt.kl_loss(logits, top.values, top.indices, keep)
    assert 0 <= coarse <= exact
    keep[0] = False
    assert ttt.kl_loss(logits, top.values, top.indices, keep)[1] == 5


def test_acceptance_counts_chains_like_the_runtime(monkeypatch):
    """One-hot drafts: the chain from root r stops at the first wrong draft, and a deeper draft counts only
    where the sequence continues with the accepted token (else the head read another context)."""
    t = 8
    top1 = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 17]], dtype=torch.int32)  # the target's argmax per position
    tokens = torch.tensor([[5, 10, 11, 12, 99, 14, 15, 16]], dtype=torch.int32)  # token 4 leaves the greedy path
    data = SequenceCache(tokens=tokens, length=torch.tensor([t], dtype=torch.int32),
                         start=torch.tensor([1], dtype=torch.int32), stop=torch.tensor([t], dtype=torch.int32),
                         taps=torch.zeros(1, t, 3), logp=torch.zeros(1, t, 1, dtype=torch.float16),
                         ids=torch.zeros(1, t, 1, dtype=torch.int32), top1=top1)
    right = top1[0, 1:].tolist() + [0]  # row j's correct draft: the argmax at j+1
    drafts = [list(right), list(right), list(right)]
    drafts[0][2] = 0  # root 2's first draft is wrong
    drafts[1][5] = 0  # depth 1 at row 5 (root 4) is wrong

    def fake(head, embed, t2d, b, depth, **_):
        logits = [torch.nn.functional.one_hot(torch.tensor([d]), 20).float() for d in drafts[:depth]]
        return logits, [(torch.tensor(0.0), 1)] * depth

    monkeypatch.setattr(ttt, "step_kls", fake)
    cfg = EagleTrainConfig(batch_size=4, ttt_steps=3)
    m = ttt.evaluate(torch.nn.Identity(), None, torch.zeros(20, dtype=torch.long), None, data, cfg)
    # roots 0..6 (their next target positions 1..7 are scored); accepted drafts per root:
    #   r0: rows 0, 1, 2 all right and on the greedy path -> 3
    #   r1: rows 1, 2; depth 2 (row 3) would read token 4 = 99, not the accepted draft 13 -> 2
    #   r2: its first draft is wrong -> 0
    #   r3: the root itself reads token 4 = 99 (verified context may be anything); rows 3, 4, 5 right -> 3
    #   r4: row 4 right, depth 1 (row 5) wrong -> 1
    #   r5: rows 5, 6; row 7 has no target -> 2
    #   r6: row 6 -> 1
    assert m["roots"] == 7
    assert m["accepted_per_proposal"] == pytest.approx(12 / 7)
    assert m["alpha1"] == pytest.approx(6 / 7)
    assert m["alpha_by_depth"] == pytest.approx([6 / 7, 4 / 6, 2 / 4])
    assert m["tokens_per_pass"] == pytest.approx(1 + 12 / 7)
