"""What a drafter is built from and what it proposes: the two values every method shares."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cached import CachedModel
from .dist import Dist
from .tree import DEFAULT_EAGLE_TREE, DynamicTree, TreeShape


@dataclass(frozen=True)
class DrafterContext:
    """What a bundle and the decoding options offer a drafter; each method's ``build`` takes what it needs."""

    vocab: int
    model: CachedModel | None = None  # the draft model, where the bundle has one
    tree: TreeShape = TreeShape()
    heads: object | None = None  # Medusa heads, loaded where the method needs them
    paths: tuple = ()  # the bundle's static Medusa tree
    acceptance: str = "exact"
    target: CachedModel | None = None  # the target, whose taps an EAGLE-3 head reads
    eagle: CachedModel | None = None  # the EAGLE-3 head, loaded where the method needs it
    vocab_map: np.ndarray | None = None  # the head's draft ids -> target ids
    eagle_tree: DynamicTree = DEFAULT_EAGLE_TREE  # the shape of the EAGLE-2 tree (method eagle-tree)
    draft_stop: float = 0.0  # a chain ends where the drafter's softmax gives its next token less
    verify_costs: tuple[float, ...] | None = None  # v(r) on this backend, where a dynamic tree is sized by cost


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    # The q each token was drawn from (a point for deterministic drafters), held on its support:
    # verification reads q(x), and q's row only to build a residual after a rejection.
    dists: list[Dist]
    passes: int = 0  # draft-model forward passes spent on it
