"""How honest a drafter's confidence is: the chance it gave each verified tree node against how often the
generation took that node's path.

A dynamic tree (EAGLE-2) keeps the nodes whose whole-path probability under the head is highest, and
``eagle-tree``'s cost sizing reads that probability as the chance the target keeps the path
(:func:`specrt.runtime.tree.nodes_worth_verifying`). Where the head is over-confident the sizing verifies rows
that do not pay; under-confident, it stops short. Reading each node's outcome off the finished sequence
needs nothing from the loop: a node was kept exactly when the tokens after its tree's context spell its path.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

from ..runtime.drafters import METHODS
from ..runtime.tree import TokenTree

EDGES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)


@dataclass(frozen=True)
class NodeOutcome:
    probability: float  # the drafter's probability of the node's whole path
    depth: int  # 1: a child of the root
    kept: bool  # the generation took the node's path


def tree_outcomes(tree: TokenTree, context: int, tokens: Sequence[int]) -> list[NodeOutcome]:
    """Each node of ``tree``, drafted after ``tokens[:context]``, with whether ``tokens`` (the finished
    sequence) continues along its path. Nodes whose path runs past the end of ``tokens`` are left out: the
    generation stopped before it could say (its budget, or a stop id that is not kept in the sequence)."""
    if len(tree.scores) != len(tree.tokens):
        raise ValueError("the tree records no drafter scores (only a dynamic tree ranks its nodes)")
    outcomes = []
    for node, score in enumerate(tree.scores):
        path = [node]
        while tree.parents[path[-1]] >= 0:
            path.append(tree.parents[path[-1]])
        path.reverse()
        if context + len(path) > len(tokens):
            continue
        kept = all(tokens[context + d] == tree.tokens[n] for d, n in enumerate(path))
        outcomes.append(NodeOutcome(math.exp(score), len(path), kept))
    return outcomes


def _summary(group: list[NodeOutcome]) -> dict:
    return {"nodes": len(group), "predicted": sum(o.probability for o in group) / len(group),
            "kept": sum(o.kept for o in group) / len(group)}


def calibration(trees: Sequence[Sequence[NodeOutcome]], edges: Sequence[float] = EDGES) -> dict:
    """Per tree: the tokens its drafter expected the target to keep (the sum of its nodes' probabilities)
    against those kept; per probability bin [low, high) (the last bin closed) and per depth: the mean
    probability against the share kept. Empty bins and depths are left out."""
    nodes = [o for tree in trees for o in tree]
    if not nodes:
        raise ValueError("no tree nodes to calibrate: the drafter proposed no tree that the generation decided")
    bins = []
    for low, high in zip(edges, edges[1:]):
        group = [o for o in nodes if low <= o.probability < high or (high == edges[-1] and o.probability == high)]
        if group:
            bins.append({"low": low, "high": high, **_summary(group)})
    depths = [{"depth": d, **_summary([o for o in nodes if o.depth == d])} for d in sorted({o.depth for o in nodes})]
    return {"trees": len(trees), "nodes": len(nodes),
            "predicted_per_tree": sum(o.probability for o in nodes) / len(trees),
            "kept_per_tree": sum(o.kept for o in nodes) / len(trees),
            "bins": bins, "depths": depths}


@contextmanager
def recorded_trees(method: str = "eagle-tree") -> Iterator[list[list[NodeOutcome]]]:
    """While open, every tree ``method``'s drafter proposes is kept; on leaving, the list yielded is filled
    with each tree's :func:`tree_outcomes` read off the sequence it was drafted into (the loop's own context
    list, which the generation extends in place, so read once the generations have finished)."""
    drafter = METHODS[method]
    kept: list[tuple[TokenTree, int, list[int]]] = []

    class Recording(drafter):  # type: ignore[misc, valid-type]
        def propose_tree(self, tokens: list[int], *args, **kwargs) -> TokenTree:
            tree = drafter.propose_tree(self, tokens, *args, **kwargs)
            if tree.tokens:
                kept.append((tree, len(tokens), tokens))
            return tree

    trees: list[list[NodeOutcome]] = []
    METHODS[method] = Recording
    try:
        yield trees
    finally:
        METHODS[method] = drafter
        trees.extend(tree_outcomes(tree, context, tokens) for tree, context, tokens in kept)
