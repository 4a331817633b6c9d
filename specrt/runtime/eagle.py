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

from pathlib import Path
from typing import ClassVar

import numpy as np

from .. import theory
from ..bundle import contract as C
from ..bundle import safety
from ..errors import BundleError
from .cached import CachedModel
from .dist import Dist
from .proposal import Drafter, DrafterContext, Proposal
from .rows import LogitRows
from .sampling import SamplingConfig
from .tree import (DEFAULT_EAGLE_TREE, DynamicTree, TokenTree, deeper_level_pays, nodes_worth_verifying,
                   select_nodes)


def to_target(q: Dist, vocab_map: np.ndarray, vocab: int) -> Dist:
    """A distribution over draft ids as one over the target's ``vocab`` ids (``vocab_map``: the target id of
    each draft id, strictly ascending, so ascending draft ids stay ascending)."""
    if q.ids is None:
        return Dist(vocab_map[:len(q.weights)], q.weights, vocab)
    if len(q.ids) == 1:  # greedy rows are points: keep them cheap
        return Dist.point(int(vocab_map[q.ids[0]]), vocab)
    return Dist(vocab_map[q.ids], q.weights, vocab)


def read_vocab_map(bundle: Path, file: str, size: int, vocab: int) -> np.ndarray:
    """A drafter's vocabulary map (``file``: int64 [size], strictly ascending target ids in [0, vocab)), checked."""
    path = bundle / file
    safety.checked_size(path, 8 * size + 4096, "vocabulary map")  # int64 + the header
    try:
        vocab_map = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise BundleError(f"cannot read the vocabulary map {file}: {e}") from None
    if (vocab_map.shape != (size,) or vocab_map.dtype.kind not in "iu"
            or (len(vocab_map) > 1 and not (np.diff(vocab_map) > 0).all())
            or vocab_map[0] < 0 or vocab_map[-1] >= vocab):
        raise BundleError(f"{file} must hold {size} strictly ascending target ids in [0, {vocab})")
    return vocab_map.astype(np.int64)


class EagleDrafter(Drafter):
    """Drafts a chain with the bundle's EAGLE-3 head over the target's taps."""

    needs_eagle: ClassVar[bool] = True

    def __init__(self, head: CachedModel, target: CachedModel, vocab_map: np.ndarray, vocab: int,
                 stop: float = 0.0) -> None:
        self.head, self.target, self.vocab_map, self.vocab, self.stop = head, target, vocab_map, vocab, stop
        self._width = head.decoder.entry.dims.hidden_size
        self._no_taps = np.zeros((1, head.decoder.entry.tap_width), np.float32)
        self._final = 0  # head rows computed from the target's taps

    @classmethod
    def build(cls, ctx: DrafterContext) -> "EagleDrafter":
        return cls(ctx.eagle, ctx.target, ctx.vocab_map, ctx.vocab, ctx.draft_stop)

    def prefill(self, tokens: list[int], sampling: SamplingConfig) -> None:
        pass  # the first proposal's catch-up runs the prompt's rows, once its next token is known

    def _catch_up(self, tokens: list[int], sampling: SamplingConfig) -> LogitRows:
        """Rows done .. m-2 (tokens[done+1:], with the target's taps done .. m-2); the last predicts tokens[m]."""
        head, done, m = self.head, self.head.cache.length, len(tokens)
        self.target.release_taps(done)  # the head's rows below done are final: their taps are not read again
        taps = self.target.taps_at(done, m - 1)
        if taps.shape[1] != self._no_taps.shape[1]:  # the target's taps begin with the head's (a DFlash draft's follow)
            taps = np.ascontiguousarray(taps[:, :self._no_taps.shape[1]])
        self._final = m - 1  # rows with the target's taps; the rest are dropped at rollback
        return head.feed(tokens[done + 1:], sampling, extra={
            C.EAGLE_TAPS: taps, C.EAGLE_FEATURES: np.zeros((len(taps), self._width), np.float32)})

    def propose(self, tokens: list[int], gamma: int, sampling: SamplingConfig, rng: np.random.Generator) -> Proposal:
        if gamma == 0:
            return Proposal([], [])
        rows = self._catch_up(tokens, sampling)
        drafted, dists = [], []
        for i in range(gamma):
            q = to_target(rows[0], self.vocab_map, self.vocab)
            drafted.append(q.sample(rng))
            dists.append(q)
            if i + 1 == gamma or not rows.confident(0, self.stop):
                break
            # a deeper row: the head's own output of the row before stands in for the taps
            rows = self.head.feed(drafted[-1:], sampling, extra={
                C.EAGLE_TAPS: self._no_taps, C.EAGLE_FEATURES: self.head.hidden[-1:]})
        return Proposal(drafted, dists, passes=len(drafted))

    def rollback(self, valid: int) -> None:
        self.head.cache.truncate(min(self.head.cache.length, self._final))


def expansion_mask(frontier: list[int], parents: list[int], fed: dict[int, int], context: int, cached: int
                   ) -> np.ndarray:
    """[1, 1, F, cached + F]: each frontier node sees the head's ``context`` rows, its ancestors (at ``fed[a]``,
    the slot each took in the head's cache: every ancestor of an expanded node was expanded) and itself.
    Records the frontier's own slots in ``fed``."""
    mask = np.zeros((len(frontier), cached + len(frontier)), bool)
    mask[:, :context] = True
    for r, node in enumerate(frontier):
        mask[r, cached + r] = True
        up = parents[node]
        while up >= 0:
            mask[r, fed[up]] = True
            up = parents[up]
    fed.update((node, cached + r) for r, node in enumerate(frontier))
    return mask[None, None]


class EagleTreeDrafter(EagleDrafter):
    """EAGLE-2's dynamic tree from the same head (:class:`DynamicTree`): one head pass per level over the
    level's ``topk`` best nodes, then the ``nodes`` best candidates overall go to the target's one pass.
    A tree sized by cost also grows only the levels that pay for their head pass (:func:`deeper_level_pays`),
    weighing the head's pass by what it cost against the target's last passes (:attr:`pass_cost`).

    The children are the head's top-k, chosen without looking at the target, so verification treats each
    as a point-mass proposal and stays exact under sampling; greedy output equals plain decoding."""

    proposes_trees: ClassVar[bool] = True
    sizes_tree_by_cost: ClassVar[bool] = True  # where its shape says so (DynamicTree.by_cost: "4,4,auto")
    COST_WEIGHT = 0.3  # the pass cost's moving average, per step (as --gamma auto's)

    def __init__(self, head: CachedModel, target: CachedModel, vocab_map: np.ndarray, vocab: int,
                 shape: DynamicTree = DEFAULT_EAGLE_TREE, verify_costs: tuple[float, ...] | None = None) -> None:
        super().__init__(head, target, vocab_map, vocab)
        self.shape, self.verify_costs = shape, verify_costs
        # A head pass in one-row target passes (engine times); None until a step has been timed.
        self.pass_cost: float | None = None
        self._last: tuple[float, int, int, float] | None = None  # head s a pass, rows, target passes, target s

    @classmethod
    def build(cls, ctx: DrafterContext) -> "EagleTreeDrafter":
        return cls(ctx.eagle, ctx.target, ctx.vocab_map, ctx.vocab, ctx.eagle_tree, ctx.verify_costs)

    def _observe_cost(self) -> None:
        """Update :attr:`pass_cost` from the last proposal's head passes and the one target pass since (the
        verify pass of its tree, whose rows the backend's curve turns into one row's time)."""
        if self._last is None:
            return
        head_pass, rows, passes, target_s = self._last
        if self.target.passes != passes + 1:  # a prefill or another caller's pass came between: no reading
            return
        verify_s = self.target.forward_s - target_s
        if verify_s > 0:
            cost = theory.draft_cost(head_pass, verify_s, rows, self.verify_costs)
            self.pass_cost = theory.moving_average(self.pass_cost, cost, self.COST_WEIGHT)

    def propose_tree(self, tokens: list[int], max_depth: int, sampling: SamplingConfig, rng: np.random.Generator,
                     hidden: np.ndarray | None = None) -> TokenTree:
        topk, depth = self.shape.topk, min(self.shape.depth, max_depth)
        if depth == 0:
            return TokenTree([], [])
        self._observe_cost()
        head_s = self.head.forward_s
        rows = self._catch_up(tokens, sampling)
        head, context = self.head, self.head.cache.length
        # Candidates in level order; fed: the expanded ones, in the order they entered the head's cache.
        nodes: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        features = {-1: head.hidden[-1:]}  # node -> the head's output of the row its children came from
        frontier, row_of, fed = [-1], {-1: len(rows) - 1}, {}
        passes, pass_cost = 1, self.pass_cost or 0.0
        for level in range(depth):
            level_start, lead = len(nodes), None
            for parent in frontier:
                ids, logp = rows.top_logprobs(row_of[parent], topk)
                base = scores[parent] if parent >= 0 else 0.0
                nodes += self.vocab_map[ids].tolist()
                parents += [parent] * len(ids)
                scores += (base + logp).tolist()
                lead = logp if lead is None else lead  # the best parent's children: how the next level may look
            if level + 1 == depth:
                break
            frontier = sorted(range(level_start, len(nodes)), key=lambda i: (-scores[i], i))[:topk]
            if self.shape.by_cost and not deeper_level_pays(scores, [scores[i] for i in frontier], lead,
                                                            self.verify_costs, self.shape.nodes, pass_cost, passes):
                break
            mask = expansion_mask(frontier, parents, fed, context, head.cache.length)
            rows = head.run([nodes[i] for i in frontier], np.full(len(frontier), context + level, np.int64),
                            mask, sampling, last=len(frontier), extra={
                                C.EAGLE_TAPS: np.zeros((len(frontier), self._no_taps.shape[1]), np.float32),
                                C.EAGLE_FEATURES: np.concatenate([features[parents[i]] for i in frontier])})
            passes += 1
            row_of = {node: r for r, node in enumerate(frontier)}
            features.update((node, head.hidden[r:r + 1]) for r, node in enumerate(frontier))
        n = self.shape.nodes
        if self.shape.by_cost:
            n = nodes_worth_verifying(scores, self.verify_costs, n, passes * pass_cost)
        keep = select_nodes(parents, scores, n)
        index = {old: new for new, old in enumerate(keep)}
        self._last = ((self.head.forward_s - head_s) / passes, len(keep) + 1, self.target.passes,
                      self.target.forward_s)
        return TokenTree([nodes[i] for i in keep], [index.get(parents[i], -1) for i in keep], passes=passes,
                         points=True, scores=[scores[i] for i in keep])
