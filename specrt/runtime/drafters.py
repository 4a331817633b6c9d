"""Ways to propose draft tokens, each registered under a ``--method`` name. A method's class subclasses
:class:`~specrt.runtime.proposal.Drafter`, whose class attributes declare what it needs; the built-in ones
are registered from one list (:data:`BUILTIN_METHODS`) through :func:`register_method`, as a plug-in
registers its own."""

from __future__ import annotations

from typing import Callable, ClassVar

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..bundle.manifest import Manifest
from .cached import CachedModel
from .dist import Dist
from .dflash import DFlashDrafter
from .eagle import EagleDrafter, EagleTreeDrafter
from .masks import tree_mask
from .medusa import MedusaDrafter
from .proposal import Drafter, DrafterContext, Proposal
from .sampling import SamplingConfig
from .tree import TokenTree, TreeShape

METHODS: dict[str, type[Drafter]] = {}  # --method name -> its class, in the order --help lists them


def register_method(name: str) -> Callable[[type[Drafter]], type[Drafter]]:
    """A class decorator that makes a :class:`Drafter` subclass the method ``name`` (``--method name``,
    ``DecodeOptions(method=name)``); a later registration under the same name replaces the earlier one."""

    def deco(cls: type[Drafter]) -> type[Drafter]:
        if not (isinstance(cls, type) and issubclass(cls, Drafter)):
            raise TypeError(f"method {name!r}: {cls!r} is not a Drafter subclass")
        METHODS[name] = cls
        return cls

    return deco


def drafter_class(method: str) -> type[Drafter]:
    """The class registered as ``method``; for a name that is none (``auto``, a typo), :class:`Drafter`
    itself, which declares that it needs nothing."""
    return METHODS.get(method, Drafter)


# What a bundle without a drafter is told, in one line (specrt.load(), run --stats, serve): auto runs prompt lookup.
NO_DRAFTER = ("no drafter in this bundle: auto runs prompt lookup (ngram), which pays only where a reply repeats its "
              "prompt (it pauses itself where it would not); for a speedup add an EAGLE-3 head, one published for "
              "this model (specrt export MODEL --eagle HUB_ID) or your own (specrt eagle train MODEL -o HEAD, then "
              "--eagle HEAD; docs/eagle.md)")


def auto_candidates(manifest: Manifest) -> list[str]:
    """The drafting methods ``manifest``'s bundle holds, in ``auto``'s order where nothing was measured: its EAGLE-3
    head's dynamic tree (its chain where the bundle runs no trees, Manifest.runs_trees), its DFlash draft's block,
    its draft model's chain."""
    methods = ["eagle-tree" if manifest.runs_trees else "eagle"] if manifest.eagle is not None else []
    return methods + (["dflash"] if manifest.dflash is not None else []) + (["draft"] if manifest.draft is not None else [])


def auto_method(manifest: Manifest) -> str:
    """What ``--method auto`` runs on a bundle: the drafter ``specrt export`` measured fastest on its machine where
    the bundle holds several (``Manifest.chosen["auto"]``, :mod:`specrt.measure.quick`), else the first of
    :func:`auto_candidates`, else prompt lookup, which needs no model (the one rule: the generator and ``specrt
    export``'s closing line read it)."""
    candidates = auto_candidates(manifest)
    measured = manifest.chosen.get("auto")
    if isinstance(measured, dict) and measured.get("method") in candidates:
        return measured["method"]
    return candidates[0] if candidates else "ngram"


def proposes_trees(method: str) -> bool:
    """Whether ``method`` verifies a token tree (its "gamma" is nodes per pass, not a chain's length)."""
    return drafter_class(method).proposes_trees


class ModelDrafter(Drafter):
    """A small draft model sampled autoregressively with the same warping as the target."""

    needs_draft_model: ClassVar[bool] = True

    def __init__(self, model: CachedModel, stop: float = 0.0) -> None:
        self.model, self.stop = model, stop

    @classmethod
    def build(cls, ctx: DrafterContext) -> "ModelDrafter":
        return cls(ctx.model, ctx.draft_stop)

    def prefill(self, tokens: list[int], sampling: SamplingConfig) -> None:
        self.model.feed(tokens[self.model.cache.length:], sampling)  # a kept prefix is not fed again

    def propose(self, tokens: list[int], gamma: int, sampling: SamplingConfig, rng: np.random.Generator) -> Proposal:
        if gamma == 0:
            return Proposal([], [])
        # The first pass also feeds what the draft has not seen (after a fully accepted chain: the
        # last drafted token and the bonus token), so catching up costs no extra pass.
        rows = self.model.feed(tokens[self.model.cache.length:], sampling)
        drafted, dists = [], []
        for i in range(gamma):
            q = rows[0]
            drafted.append(q.sample(rng))
            dists.append(q)
            if i + 1 == gamma or not rows.confident(0, self.stop):
                break
            rows = self.model.feed(drafted[-1:], sampling)
        return Proposal(drafted, dists, passes=len(drafted))

    def rollback(self, valid: int) -> None:
        self.model.cache.truncate(min(self.model.cache.length, valid))


class NgramDrafter(Drafter):
    """Prompt lookup: continue the longest recent suffix n-gram that already occurred in the context.

    A deterministic proposal is a one-hot q, so exact acceptance still applies: x is kept with
    probability p(x) and a rejection resamples from p without x.
    """

    proposes_for_free = True

    def __init__(self, vocab: int, max_ngram: int = 3) -> None:
        self.vocab, self.max_ngram = vocab, max_ngram

    @classmethod
    def build(cls, ctx: DrafterContext) -> "NgramDrafter":
        return cls(ctx.vocab)

    def propose(self, tokens: list[int], gamma: int, sampling: SamplingConfig, rng: np.random.Generator) -> Proposal:
        found = lookup_continuation(np.asarray(tokens), gamma, self.max_ngram)
        return Proposal(found, [Dist.point(t, self.vocab) for t in found])


def lookup_continuation(tokens: np.ndarray, gamma: int, max_ngram: int) -> list[int]:
    """Up to ``gamma`` tokens that followed the most recent earlier occurrence of the longest
    suffix n-gram (n = max_ngram .. 1); [] when no suffix recurs."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        windows = sliding_window_view(tokens[:-1], n)  # every earlier n-gram, excluding the suffix itself
        hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if hits.size:
            start = hits[-1] + n
            return tokens[start:start + gamma].tolist()
    return []


class NoDrafter(Drafter):
    """Plain autoregressive decoding of the target: the baseline every speedup is measured against."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    @classmethod
    def build(cls, ctx: DrafterContext) -> "NoDrafter":
        return cls(ctx.vocab)

    def propose(self, tokens: list[int], gamma: int, sampling: SamplingConfig, rng: np.random.Generator) -> Proposal:
        return Proposal([], [])


class TreeDrafter(ModelDrafter):
    """The draft model grows a token tree level by level, one draft pass per level (the tree mask lets
    a whole level run at once). Greedy: each node's children are the draft's top-w tokens. Sampling:
    w i.i.d. draws from the node's q, which SpecInfer's verification needs for exactness."""

    proposes_trees: ClassVar[bool] = True

    def __init__(self, model: CachedModel, tree: TreeShape = TreeShape()) -> None:
        super().__init__(model)
        self.shape = tree

    @classmethod
    def build(cls, ctx: DrafterContext) -> "TreeDrafter":
        return cls(ctx.model, ctx.tree)

    def propose_tree(self, tokens: list[int], max_depth: int, sampling: SamplingConfig, rng: np.random.Generator,
                     hidden: np.ndarray | None = None) -> TokenTree:
        widths = self.shape.widths[:max_depth]
        if not widths:
            return TokenTree([], [])
        m = self.model
        rows = m.feed(tokens[m.cache.length:], sampling)
        row_of = {-1: (rows, 0)}  # node -> where its children's logits are (valid until the next pass)
        child_q: dict[int, Dist] = {}
        context = m.cache.length
        nodes: list[int] = []
        parents: list[int] = []
        frontier, passes = [-1], 1
        for level, width in enumerate(widths):
            start = len(nodes)
            for parent in frontier:
                rows, i = row_of[parent]
                if sampling.greedy:  # the draft's top-w logits; a one-hot q would only name the top one
                    picks = rows.top(i, width)
                else:
                    q = child_q[parent] = rows[i]
                    picks = [q.sample(rng) for _ in range(width)]
                nodes += picks
                parents += [parent] * len(picks)
            frontier = list(range(start, len(nodes)))
            if level + 1 < len(widths):  # the last level's children are never needed
                mask, depth = tree_mask(parents, context)
                rows = m.run(nodes[start:], context + depth[start:], mask[:, :, start:], sampling, last=len(frontier))
                passes += 1
                row_of.update((node, (rows, j)) for j, node in enumerate(frontier))
        return TokenTree(nodes, parents, child_q, passes)


# The built-in methods, in the order --help lists them after auto (an EAGLE-3 head's chain and tree, a DFlash
# draft's block, a draft model's, Medusa's heads, prompt lookup, plain decoding), each registered as a plug-in
# registers its own.
BUILTIN_METHODS: tuple[tuple[str, type[Drafter]], ...] = (
    ("eagle", EagleDrafter),
    ("eagle-tree", EagleTreeDrafter),
    ("dflash", DFlashDrafter),
    ("draft", ModelDrafter),
    ("tree", TreeDrafter),
    ("medusa", MedusaDrafter),
    ("ngram", NgramDrafter),
    ("none", NoDrafter),
)
for _name, _cls in BUILTIN_METHODS:
    register_method(_name)(_cls)
