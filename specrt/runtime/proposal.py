"""What every method shares: what a drafter is built from (:class:`DrafterContext`), what it proposes
(:class:`Proposal`, a chain; trees are :class:`~specrt.runtime.tree.TokenTree`) and the interface it
implements (:class:`Drafter`, which also declares what the method needs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .cached import CachedModel
from .dist import Dist
from .sampling import SamplingConfig
from .tree import DEFAULT_EAGLE_TREE, DynamicTree, TokenTree, TreeShape


@dataclass(frozen=True)
class DrafterContext:
    """What a bundle and the decoding options offer a drafter; each method's ``build`` takes what it needs."""

    vocab: int
    model: CachedModel | None = None  # the draft model, where the bundle has one
    tree: TreeShape = TreeShape()
    heads: object | None = None  # Medusa heads, loaded where the method needs them
    paths: tuple = ()  # [nodes] the bundle's static Medusa tree: each node's head ranks from the root, level order
    acceptance: str = "exact"
    target: CachedModel | None = None  # the target, whose taps an EAGLE-3 head reads
    eagle: CachedModel | None = None  # the EAGLE-3 head, loaded where the method needs it
    vocab_map: np.ndarray | None = None  # [draft_vocab] int64: the head's draft ids -> target ids, ascending
    eagle_tree: DynamicTree = DEFAULT_EAGLE_TREE  # the shape of the EAGLE-2 tree (method eagle-tree)
    dflash: object | None = None  # the DFlash draft (runtime.dflash.DFlashParts), loaded where the method needs it
    draft_stop: float = 0.0  # a chain ends where the drafter's softmax gives its next token less
    # [rows]: v(r) = verify_costs[r - 1], an r-row target pass against one row on this backend, where a dynamic
    # tree is sized by cost (theory.verify_cost_at reads it; None: every row free)
    verify_costs: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Proposal:
    """A drafted chain: ``k`` ≤ gamma tokens to follow the context, tokens[i] drawn from dists[i]."""

    tokens: list[int]  # [k] the drafted ids, in order
    # [k] the q each token was drawn from (a point for deterministic drafters), held on its support:
    # verification reads q(x), and q's row only to build a residual after a rejection.
    dists: list[Dist]
    passes: int = 0  # draft-model forward passes spent on it


class Drafter:
    """A way to propose draft tokens, registered under a ``--method`` name
    (:func:`~specrt.runtime.drafters.register_method`). Built-in methods and plug-ins alike subclass it: its
    class attributes declare what the method needs, with the defaults of a method that needs nothing, and
    the generator and ``specrt bench`` read them instead of the method's name."""

    needs_draft_model: ClassVar[bool] = False
    """Drafts with the bundle's draft model (:attr:`DrafterContext.model`), which the bundle must hold."""

    needs_eagle: ClassVar[bool] = False
    """Drafts with the bundle's EAGLE-3 head (:attr:`DrafterContext.eagle`, ``vocab_map``; the target's taps):
    loaded on first use, and its cache kept in step with the target's."""

    needs_dflash: ClassVar[bool] = False
    """Drafts with the bundle's DFlash block draft (:attr:`DrafterContext.dflash`; the target's taps): loaded on
    first use, its context cache kept in step with what the target commits."""

    drafts_in_one_pass: ClassVar[bool] = False
    """Proposes its whole chain in one draft pass (a block drafter): ``--gamma auto`` then weighs one draft pass
    per step, not one per drafted token."""

    needs_medusa: ClassVar[bool] = False
    """Drafts with the bundle's Medusa heads and static tree (:attr:`DrafterContext.heads`, ``paths``), loaded
    on first use."""

    proposes_trees: ClassVar[bool] = False
    """Proposes a token tree (:meth:`propose_tree`, its ``gamma`` being nodes per pass) rather than a chain
    (:meth:`propose`)."""

    proposes_for_free: ClassVar[bool] = False
    """Proposes without a model pass (prompt lookup), so a proposal can be made and then not verified: each
    step's proposal first passes :class:`~specrt.runtime.loop.DraftGate`, which verifies only what is expected
    to pay at the running acceptance and this backend's measured verify cost."""

    sizes_tree_by_cost: ClassVar[bool] = False
    """Sizes its dynamic tree (:attr:`DrafterContext.eagle_tree`) by what this backend's verify passes cost per
    row (:attr:`DrafterContext.verify_costs`), where that shape asks for it (nodes ``auto``): the costs are
    then measured before the generation (and before ``specrt bench`` times any), not inside a timed step."""

    @classmethod
    def build(cls, ctx: DrafterContext) -> "Drafter":
        """The drafter, from what the bundle and the decoding options offer."""
        raise NotImplementedError

    def prefill(self, tokens: list[int], sampling: SamplingConfig) -> None:
        """Take in the prompt ``tokens`` before the first proposal (nothing to do by default)."""

    def propose(self, tokens: list[int], gamma: int, sampling: SamplingConfig, rng: np.random.Generator) -> Proposal:
        """At most ``gamma`` tokens to follow ``tokens``, each with the q it was drawn from (a chain)."""
        raise NotImplementedError

    def propose_tree(self, tokens: list[int], max_depth: int, sampling: SamplingConfig, rng: np.random.Generator,
                     hidden: np.ndarray | None = None) -> TokenTree:
        """A token tree at most ``max_depth`` deep below ``tokens[-1]`` (where :attr:`proposes_trees`);
        ``hidden``: the target's final hidden state there ([hidden_size], Medusa's heads read it)."""
        raise NotImplementedError

    def rollback(self, valid: int) -> None:
        """``tokens[:valid]`` are final; forget anything fed beyond them (nothing to do by default)."""
