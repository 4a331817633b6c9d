"""Medusa: extra heads on the target's last hidden state propose the next tokens; a static sparse tree
of their top candidates is verified in one target pass (exact for greedy; typical acceptance, in
:mod:`specrt.runtime.acceptance`, is LOSSY)."""

from __future__ import annotations

import heapq
from typing import ClassVar, Sequence

import numpy as np

from ..errors import ConfigError
from .proposal import Drafter, DrafterContext
from .sampling import SamplingConfig
from .tree import MAX_TREE_NODES, TokenTree

Path = tuple[int, ...]  # (i_0, i_1, ...): head d's i_d-th ranked candidate at depth d


def choose_tree(accuracies: list[list[float]], budget: int) -> tuple[list[Path], float]:
    """The static tree that maximises expected accepted length under a node budget.

    ``accuracies[d][i]``: measured probability that head d's rank-i candidate is the target's token.
    A path's acceptance probability is the product along it (heads treated as independent), and the
    expected accepted length is the sum over nodes, so best-first search over that product picks the
    optimal prefix-closed set (a child never scores above its parent). Returns (paths in level order,
    expected accepted tokens).
    """
    if not 1 <= budget <= MAX_TREE_NODES:
        raise ConfigError(f"the Medusa tree budget must be in [1, {MAX_TREE_NODES}], got {budget}")
    heap = [(-accuracies[0][i], (i,)) for i in range(len(accuracies[0]))]
    heapq.heapify(heap)
    chosen: list[tuple[Path, float]] = []
    while heap and len(chosen) < budget:
        neg, path = heapq.heappop(heap)
        chosen.append((path, -neg))
        d = len(path)
        if d < len(accuracies):
            for j, acc in enumerate(accuracies[d]):
                heapq.heappush(heap, (neg * acc, path + (j,)))
    paths = sorted((p for p, _ in chosen), key=lambda p: (len(p), p))
    return paths, float(sum(score for _, score in chosen))


def tree_from_paths(paths: list[Path], candidates: np.ndarray, max_depth: int) -> TokenTree:
    """Materialise a static tree: node token = candidates[depth][rank]. candidates: [heads, topk] ids."""
    index: dict[Path, int] = {}
    tokens, parents = [], []
    for path in paths:
        if len(path) > max_depth:
            continue
        index[path] = len(tokens)
        tokens.append(int(candidates[len(path) - 1, path[-1]]))
        parents.append(index[path[:-1]] if len(path) > 1 else -1)
    return TokenTree(tokens, parents)


class MedusaDrafter(Drafter):
    """Proposes a static tree of the Medusa heads' top candidates from the target's last hidden state."""

    needs_medusa: ClassVar[bool] = True
    proposes_trees: ClassVar[bool] = True

    def __init__(self, heads, paths: Sequence[Path], acceptance: str = "exact") -> None:
        if acceptance not in ("exact", "typical"):
            raise ConfigError(f"acceptance must be 'exact' or 'typical', got {acceptance!r}")
        self.heads, self.paths, self.acceptance = heads, [tuple(p) for p in paths], acceptance

    @classmethod
    def build(cls, ctx: DrafterContext) -> "MedusaDrafter":
        return cls(ctx.heads, ctx.paths, ctx.acceptance)

    def check(self, sampling: SamplingConfig) -> None:
        if not sampling.greedy and self.acceptance == "exact":
            raise ConfigError("Medusa's static tree is exact only for greedy decoding (temperature 0); for "
                              "sampling pass acceptance 'typical', which is LOSSY (not the target's distribution)")

    def prefill(self, tokens: list[int], sampling: SamplingConfig) -> None:
        self.check(sampling)

    def propose_tree(self, tokens: list[int], max_depth: int, sampling: SamplingConfig, rng: np.random.Generator,
                     hidden: np.ndarray | None) -> TokenTree:
        if max_depth < 1:
            return TokenTree([], [])
        ids, _ = self.heads(hidden.reshape(1, 1, -1))  # [1, 1, heads, topk]
        return tree_from_paths(self.paths, ids[0, 0], max_depth)
