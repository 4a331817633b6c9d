"""EAGLE-3 drafting: a one-layer head that reads the target's own hidden states proposes a chain.

Head row j pairs the target's taps at position j with the embedding of token j+1 and predicts token
j+2 (docs/design/eagle3.md). Rows whose taps the target computed are final; a deeper draft step has no
target taps yet and feeds the head's own output of the row before instead, so those rows are dropped
after verification and recomputed, with the taps the verify pass made, in the next proposal's first
head pass ("catch-up"): γ head passes per proposal, as a draft model's chain.

Exactness needs nothing from the head: each drafted token's q is the head's warped distribution mapped
from draft ids to target ids, and verification keeps x with probability min(1, p(x)/q(x)).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..bundle import contract as C
from .cached import CachedModel
from .dist import Dist
from .proposal import DrafterContext, Proposal
from .sampling import SamplingConfig


def to_target(q: Dist, vocab_map: np.ndarray, vocab: int) -> Dist:
    """A distribution over draft ids as one over the target's ``vocab`` ids (``vocab_map``: the target id of
    each draft id, strictly ascending, so ascending draft ids stay ascending)."""
    if q.ids is None:
        return Dist(vocab_map[:len(q.weights)], q.weights, vocab)
    if len(q.ids) == 1:  # greedy rows are points: keep them cheap
        return Dist.point(int(vocab_map[q.ids[0]]), vocab)
    return Dist(vocab_map[q.ids], q.weights, vocab)


class EagleDrafter:
    """Drafts a chain with the bundle's EAGLE-3 head over the target's taps."""

    needs_draft_model: ClassVar[bool] = False
    needs_eagle: ClassVar[bool] = True
    proposes_trees: ClassVar[bool] = False

    def __init__(self, head: CachedModel, target: CachedModel, vocab_map: np.ndarray, vocab: int) -> None:
        self.head, self.target, self.vocab_map, self.vocab = head, target, vocab_map, vocab
        self._width = head.decoder.entry.dims.hidden_size
        self._no_taps = np.zeros((1, head.decoder.entry.tap_width), np.float32)
        self._final = 0  # head rows computed from the target's taps

    @classmethod
    def build(cls, ctx: DrafterContext) -> "EagleDrafter":
        return cls(ctx.eagle, ctx.target, ctx.vocab_map, ctx.vocab)

    def prefill(self, tokens: list[int], sampling: SamplingConfig) -> None:
        pass  # the first proposal's catch-up runs the prompt's rows, once its next token is known

    def propose(self, tokens: list[int], gamma: int, sampling: SamplingConfig, rng: np.random.Generator) -> Proposal:
        if gamma == 0:
            return Proposal([], [])
        head, done = self.head, self.head.cache.length
        # Catch-up: rows done .. m-2 (tokens[done+1:], target taps done .. m-2); the last predicts tokens[m].
        m = len(tokens)
        taps = self.target.taps_at(done, m - 1)
        rows = head.feed(tokens[done + 1:], sampling, extra={
            C.EAGLE_TAPS: taps, C.EAGLE_FEATURES: np.zeros((len(taps), self._width), np.float32)})
        drafted, dists = [], []
        for i in range(gamma):
            q = to_target(rows[0], self.vocab_map, self.vocab)
            drafted.append(q.sample(rng))
            dists.append(q)
            if i + 1 < gamma:  # a deeper row: the head's own output of the row before stands in for the taps
                rows = head.feed(drafted[-1:], sampling, extra={
                    C.EAGLE_TAPS: self._no_taps, C.EAGLE_FEATURES: head.hidden[-1:]})
        self._final = m - 1  # rows with the target's taps; the rest are dropped at rollback
        return Proposal(drafted, dists, passes=gamma)

    def rollback(self, valid: int) -> None:
        self.head.cache.truncate(min(self.head.cache.length, self._final))
