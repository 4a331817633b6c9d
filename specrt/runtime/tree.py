"""Token trees (SpecInfer): many continuations verified in ONE target pass; the longest accepted path wins.

Nodes exclude the root, which is the last context token; parent -1 means "child of the root".
Nodes are in level order, so a parent always precedes its children.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from .sampling import sample
from .verify import residual

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
class TokenTree:
    tokens: list[int]
    parents: list[int]
    # parent index (-1 = root) -> the distribution its children were drawn from (or chosen by, greedy)
    child_q: dict[int, np.ndarray] = field(default_factory=dict)
    passes: int = 0  # draft-model forward passes spent building it

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


def verify_tree_greedy(p_root: np.ndarray, p_nodes: np.ndarray, tree: TokenTree) -> tuple[list[int], int]:
    """Follow the target's argmax from the root while a child carries it. Returns (path, next_token)."""
    kids = tree.children()
    node, p, path = -1, p_root, []
    while True:
        best = int(np.argmax(p))
        child = next((c for c in kids[node] if tree.tokens[c] == best), None)
        if child is None:
            return path, best  # correction, or the bonus token after an accepted leaf
        path.append(child)
        node, p = child, p_nodes[child]


def verify_tree_sampled(p_root: np.ndarray, p_nodes: np.ndarray, tree: TokenTree,
                        rng: np.random.Generator) -> tuple[list[int], int]:
    """SpecInfer's multi-step speculative sampling; exact when each node's children are i.i.d. draws
    from ``tree.child_q[node]``.

    At a node: try its children in order, accepting child x with probability min(1, p(x)/q(x)); after
    each rejection p becomes norm(max(0, p - q)). An accepted child becomes the node; when every child
    is rejected (or a leaf was accepted) the next token is drawn from the current p.
    """
    kids = tree.children()
    node, p, path = -1, p_root / p_root.sum(), []
    while kids[node]:
        q = tree.child_q[node] / tree.child_q[node].sum()
        for child in kids[node]:
            x = tree.tokens[child]
            if rng.random() * q[x] < p[x]:
                path.append(child)
                node, p = child, p_nodes[child] / p_nodes[child].sum()
                break
            p = residual(p, q)
        else:
            break
    return path, sample(p, rng)
