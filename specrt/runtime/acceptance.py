"""Every acceptance rule in one place: which drafted tokens the target keeps, and the one token it adds.

Terms (each rule below uses them in this sense):

- **p / q**: p is the target's next-token distribution at a position, q the distribution the drafter drew
  its token there from (both after the same temperature / top-k / top-p warping). A deterministic drafter's
  q is a point (one-hot): all its mass on the token it proposed. ``p[0]`` is the row after the context's
  last token (a tree's root), ``p[i]`` the row after the i-th drafted token (a chain) or ``p[1 + i]`` the
  row after node i (a tree).
- **accepted**: a drafted token the target keeps; the kept tokens are always a prefix of the chain, or a
  path of the tree.
- **residual**: norm(max(0, p − q)), what the target's token is drawn from after it rejects a token drawn
  from q (p itself when p and q are equal to rounding; built by :func:`~specrt.runtime.dist.residual`).
- **correction**: the token drawn on the first rejection, from the residual (greedy: the target's argmax,
  which the drafted token was not).
- **bonus**: the token drawn from p after the last position when every drafted token was accepted, so
  every step yields at least one token.
- **path**: a tree's accepted nodes, from a child of the root down (each the parent of the next); the
  tree's counterpart of a chain's accepted prefix.

Every rule returns (what was accepted, the next token): the correction, or the bonus.

- :func:`verify_chain` (dense float64 rows, the public reference) and :func:`accept_chain` (the same rule
  on :class:`~specrt.runtime.dist.Dist` rows, which the loop runs): Leviathan et al. 2023 / Chen et al.
  2023, exact;
- :func:`verify_tree_greedy`: the target's argmax followed down the tree, exact for greedy decoding;
- :func:`verify_tree_sampled`: SpecInfer's multi-step speculative sampling over a token tree, exact;
- :func:`verify_tree_typical`: Medusa's typical acceptance, LOSSY, opt-in only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .dist import MIN_RESIDUAL_MASS, Dist, residual
from .rows import exceeds
from .sampling import sample
from .tree import TokenTree


def dense_residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The residual norm(max(0, p - q)) of normalised dense rows: what to sample after rejecting a token
    drawn from q (p itself when the residual's mass is rounding, see :data:`~specrt.runtime.dist.MIN_RESIDUAL_MASS`)."""
    r = np.maximum(p - q, 0.0)
    mass = r.sum()
    return p if mass < MIN_RESIDUAL_MASS else r / mass


def verify_chain(target_probs: np.ndarray, draft_probs: np.ndarray, draft_tokens: np.ndarray | list[int],
                 rng: np.random.Generator) -> tuple[int, int]:
    """Leviathan et al.'s rule over a chain; the emitted tokens are distributed exactly as the target's.

    target_probs [γ+1, V], draft_probs [γ, V], draft_tokens [γ] (each drawn from its q row).
    Returns (n_accepted, next_token): next_token is the correction on the first rejection, or the
    bonus from target_probs[γ] when all γ are accepted. Greedy = one-hot rows: accept while argmax matches.
    """
    target_probs = target_probs / target_probs.sum(axis=-1, keepdims=True)
    draft_probs = draft_probs / draft_probs.sum(axis=-1, keepdims=True)
    for i, x in enumerate(draft_tokens):
        p_x, q_x = target_probs[i, x], draft_probs[i, x]
        # Accept x with probability min(1, p(x)/q(x)); u * q < p avoids dividing by q.
        if rng.random() * q_x < p_x:
            continue
        # Rejected: the correction is drawn from the residual norm(max(0, p - q)).
        return i, sample(dense_residual(target_probs[i], draft_probs[i]), rng)
    n = len(draft_tokens)
    return n, sample(target_probs[n], rng)  # all accepted: the bonus, from p after the last draft


def accept_chain(p: Sequence[Dist], q: Sequence[Dist], draft_tokens: Sequence[int],
                 rng: np.random.Generator) -> tuple[int, int]:
    """:func:`verify_chain` on distributions held on their supports. ``p[i]`` is read only up to the
    first rejection (a :class:`~specrt.runtime.rows.LogitRows` warps nothing past it), and the
    residual is built for the rejected row alone."""
    for i, x in enumerate(draft_tokens):
        # Accept x with probability min(1, p(x)/q(x)); u * q < p avoids dividing by q. A row left on a
        # device is read at x alone when that decides; the whole row only for the residual.
        if exceeds(p, i, x, rng.random() * q[i].prob(x)):
            continue
        # Rejected: the correction is drawn from the residual norm(max(0, p - q)).
        return i, residual(p[i], q[i]).sample(rng)
    return len(draft_tokens), p[len(draft_tokens)].sample(rng)  # all accepted: the bonus


def verify_tree_greedy(p: Sequence[Dist], tree: TokenTree) -> tuple[list[int], int]:
    """Follow the target's argmax from the root while a child carries it. ``p[0]``: the root's row,
    ``p[1 + i]``: node i's. Returns (path, next_token)."""
    kids = tree.children()
    node, path = -1, []
    while True:
        best = int(p[1 + node].top(1)[0])
        child = next((c for c in kids[node] if tree.tokens[c] == best), None)
        if child is None:
            return path, best  # the correction, or the bonus token after an accepted leaf
        path.append(child)
        node = child


def verify_tree_sampled(p: Sequence[Dist], tree: TokenTree, rng: np.random.Generator) -> tuple[list[int], int]:
    """SpecInfer's multi-step speculative sampling (Miao et al. 2023), the multi-draft rejection rule:
    exact when each node's children are i.i.d. draws from ``tree.child_q[node]``, or (``tree.points``)
    distinct tokens chosen without looking at the target. ``p[0]``: the root's row, ``p[1 + i]``: node i's.
    Returns (path, next_token).

    At a node: try its children in order, accepting child x with probability min(1, p(x)/q(x)); after
    each rejection p becomes the residual norm(max(0, p - q)), and the next sibling is tested against that
    (recursive rejection). An accepted child becomes the node; when every child is rejected (or a leaf
    was accepted) the next token is drawn from the current p: the correction, or the bonus. A point-mass
    child is kept with probability p(x), and its rejection zeroes x in p and renormalises.
    """
    kids = tree.children()
    node, p_node, path = -1, p[0], []
    while kids[node]:
        q = None if tree.points else tree.child_q[node]
        for child in kids[node]:
            x = tree.tokens[child]
            if tree.points:
                q = Dist.point(x, p_node.vocab)
            # Accept x with probability min(1, p(x)/q(x)), p the residual left by the siblings before it.
            if rng.random() * q.prob(x) < p_node.prob(x):
                path.append(child)
                node, p_node = child, p[1 + child]
                break
            p_node = residual(p_node, q)  # rejected: p <- norm(max(0, p - q)) for the next sibling
        else:
            break
    return path, p_node.sample(rng)


def typical_threshold(p: np.ndarray, epsilon: float, delta: float) -> float:
    """Medusa's typical acceptance threshold: a token is plausible when p(x) > min(ε, δ·exp(−H(p)))."""
    nz = p[p > 0]
    entropy = float(-(nz * np.log(nz)).sum())  # H(p)
    return min(epsilon, delta * np.exp(-entropy))


def verify_tree_typical(p: Sequence[Dist], tree: TokenTree, rng: np.random.Generator,
                        epsilon: float = 0.09, delta: float = 0.3) -> tuple[list[int], int]:
    """Medusa's typical acceptance (Cai et al. 2024), LOSSY: keeps the deepest path whose every token is
    typical under the target (p(x) > min(ε, δ·exp(−H(p))), :func:`typical_threshold`), then samples the next
    token from the target at its end. Fast at temperature > 0, but the output distribution is NOT the
    target's; never the default. ``p[0]``: the root's row, ``p[1 + i]``: node i's.
    The entropy needs whole rows: this opt-in path densifies every row it reads."""
    ok: dict[int, bool] = {-1: True}
    rows: dict[int, np.ndarray] = {}
    best, best_depth = -1, 0
    for i, (parent, x) in enumerate(zip(tree.parents, tree.tokens)):
        row = rows[parent] if parent in rows else rows.setdefault(parent, p[1 + parent].dense())
        ok[i] = ok[parent] and row[x] > typical_threshold(row, epsilon, delta)
        if ok[i] and tree.depth(i) + 1 > best_depth:
            best, best_depth = i, tree.depth(i) + 1
    path = []
    node = best
    while node >= 0:
        path.append(node)
        node = tree.parents[node]
    return path[::-1], p[1 + best].sample(rng)
