"""Token trees (SpecInfer): many continuations verified in ONE target pass; the longest accepted path wins
(the rules that accept a path: :mod:`specrt.runtime.acceptance`).

Nodes exclude the root, which is the last context token; parent -1 means "child of the root".
Nodes are in level order, so a parent always precedes its children.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .. import theory
from ..errors import ConfigError
from .dist import Dist

MAX_TREE_NODES = 64


@dataclass(frozen=True)
class TreeShape:
    """Children per node at each depth: (2, 2, 1, 1) = 2 + 4 + 4 + 4 = 14 nodes, depth 4."""

    widths: tuple[int, ...] = (2, 2, 1, 1)

    def __post_init__(self) -> None:
        if not self.widths or any(not isinstance(w, int) or w < 1 for w in self.widths):
            raise ConfigError(f"tree widths must be positive integers, got {self.widths!r}")
        if self.nodes > MAX_TREE_NODES:
            raise ConfigError(f"a tree of widths {self.widths} has {self.nodes} nodes; at most {MAX_TREE_NODES}")

    @property
    def nodes(self) -> int:
        total, level = 0, 1
        for w in self.widths:
            level *= w
            total += level
        return total

    @classmethod
    def parse(cls, text: str) -> "TreeShape":
        try:
            return cls(tuple(int(x) for x in text.split(",") if x.strip()))
        except ValueError:
            raise ConfigError(f"tree shape must look like 2,2,1,1 (children per depth), got {text!r}") from None


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's tree, grown where the drafter is confident: at each of ``depth`` levels the ``topk`` best
    nodes get their ``topk`` most likely children; the ``nodes`` best nodes overall (by the product of the
    drafter's probabilities along their path) are verified. (4, 4, 16): 4 + 16 + 16 + 16 candidates, 16 kept.
    ``by_cost`` ("4,4,auto"): each pass verifies as many of the best nodes as pay for their rows on this backend
    (:func:`nodes_worth_verifying`), at most ``nodes`` (then every candidate, up to MAX_TREE_NODES)."""

    topk: int = 4
    depth: int = 4
    nodes: int = 16
    by_cost: bool = False

    def __post_init__(self) -> None:
        for name in ("topk", "depth", "nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"dynamic tree {name} must be a positive integer, got {value!r}")
        if self.nodes > MAX_TREE_NODES:
            raise ConfigError(f"a dynamic tree of {self.nodes} nodes is too large; at most {MAX_TREE_NODES}")

    @classmethod
    def parse(cls, text: str) -> "DynamicTree":
        """"TOPK,DEPTH,NODES", NODES a count or ``auto`` (as many as pay, :attr:`by_cost`)."""
        try:
            topk, depth, nodes = (x.strip() for x in text.split(","))
            if nodes != "auto":
                return cls(int(topk), int(depth), int(nodes))
            topk, depth = int(topk), int(depth)
        except ValueError:
            raise ConfigError(f"a dynamic tree must look like 4,4,16 or 4,4,auto (top-k per node, depth, nodes), "
                              f"got {text!r}") from None
        candidates = topk + (depth - 1) * topk * topk if topk > 0 and depth > 0 else 1
        return cls(topk, depth, min(candidates, MAX_TREE_NODES), by_cost=True)

    def __str__(self) -> str:
        return f"{self.topk},{self.depth},{'auto' if self.by_cost else self.nodes}"


# The default: a small tree sized by cost (SmolLM2-135M fp32 on a 2-core CPU: 1.31x none beside the chain's
# 1.29x, where the fixed 4,4,16 ran below none; docs/performance/smollm2-eagle3-cpu.md); on a GPU, where rows
# are nearly free, every candidate (21) is verified.
DEFAULT_EAGLE_TREE = DynamicTree.parse("3,3,auto")


def _best_nodes(scores: Sequence[float], verify_costs: Sequence[float] | None, most: int,
                drafting: float) -> tuple[int, float]:
    """(n, its value): the n ≤ ``most`` best candidates maximising (1 + Σ_{i<n} exp(score_i)) / (v(n + 1) +
    ``drafting``), a step's expected tokens per cost in one-row target passes."""
    best_n, best, expected = 0, 1.0 / (1.0 + drafting), 1.0
    for n, score in enumerate(sorted(scores, reverse=True)[:most], 1):
        expected += float(np.exp(score))
        value = expected / (theory.verify_cost_at(verify_costs, n + 1) + drafting)
        if value > best:
            best_n, best = n, value
    return best_n, best


def nodes_worth_verifying(scores: Sequence[float], verify_costs: Sequence[float] | None, most: int,
                          drafting: float = 0.0) -> int:
    """How many of a tree's best candidates one target pass should verify: the n ≤ ``most`` that maximises
    the step's expected tokens per cost, (1 + Σ_{i<n} exp(score_i)) / (v(n + 1) + ``drafting``).

    ``scores``: the candidates' cumulative log-probabilities under the drafter (exp(score) is its chance that
    the target takes that node's whole path); ``verify_costs``: v(r), an r-row pass against one row
    (theory.verify_cost_at; None: every row free, so all ``most``); ``drafting``: what the step's drafting
    cost, in one-row target passes (it is spent whatever n is, so it makes more nodes worth their rows).
    The choice reads the drafter only, never the target, so the kept nodes stay point-mass proposals and
    verification stays exact."""
    return _best_nodes(scores, verify_costs, most, drafting)[0]


def deeper_level_pays(scores: Sequence[float], frontier_scores: Sequence[float], child_logprobs: Sequence[float],
                      verify_costs: Sequence[float] | None, most: int, pass_cost: float, passes: int) -> bool:
    """Whether a dynamic tree should run the drafter once more to grow another level below its frontier.

    The new level is predicted to look like the last one: each frontier node gets children whose conditional
    log-probabilities are ``child_logprobs`` (those of the last level's best parent). It pays when the best
    verified subset of the grown tree is expected to keep more tokens per cost, a drafter pass costing
    ``pass_cost`` one-row target passes, than the best of the tree as it is after ``passes`` passes. Where
    verifying rows is dear (int8 on a small CPU) a tree stops after its first level; where rows are cheap
    and the drafter confident, it grows. Reads the drafter only: verification stays exact."""
    now = _best_nodes(scores, verify_costs, most, passes * pass_cost)[1]
    grown = [*scores, *(f + c for f in frontier_scores for c in child_logprobs)]
    return _best_nodes(grown, verify_costs, most, (passes + 1) * pass_cost)[1] > now


def select_nodes(parents: Sequence[int], scores: Sequence[float], n: int) -> list[int]:
    """The ``n`` best-scoring nodes that form a tree (each one's parent kept too), ascending.

    Scores are cumulative log-probabilities, so a child never outscores its parent and the best ``n`` by
    (score, then index) already hold every kept node's parent; a node whose parent was not kept is passed
    over all the same, so a caller's rounding can never detach a branch."""
    kept: set[int] = set()
    for i in sorted(range(len(parents)), key=lambda i: (-scores[i], i)):
        if len(kept) == n:
            break
        if parents[i] < 0 or parents[i] in kept:
            kept.add(i)
    return sorted(kept)


@dataclass(frozen=True)
class TokenTree:
    """``nodes`` drafted tokens below the root (the context's last token), in level order."""

    tokens: list[int]  # [nodes] each node's token id
    parents: list[int]  # [nodes] each node's parent: a node index below its own, or -1 (the root)
    # {parent: q} for each parent in [-1, nodes) that has children: the distribution they were drawn from
    # (sampling only)
    child_q: dict[int, Dist] = field(default_factory=dict)
    passes: int = 0  # draft-model forward passes spent building it
    # Children chosen deterministically (a dynamic tree's top-k): each is a point-mass proposal, so no child_q
    points: bool = False
    # [nodes] a dynamic tree's ranking: each node's whole-path log-probability under its drafter ([] otherwise)
    scores: list[float] = field(default_factory=list)

    def children(self) -> dict[int, list[int]]:
        kids: dict[int, list[int]] = {-1: []}
        for i, parent in enumerate(self.parents):
            kids.setdefault(parent, []).append(i)
            kids.setdefault(i, [])
        return kids

    def depth(self, node: int) -> int:
        d = 0
        while self.parents[node] >= 0:
            node, d = self.parents[node], d + 1
        return d
