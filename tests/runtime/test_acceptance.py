"""Every acceptance rule (specrt.runtime.acceptance): the chain's exactness checked statistically, plus
deterministic one-hot cases; token trees, greedy and sampled (children i.i.d. or point masses); Medusa's
typical acceptance."""

import numpy as np
import pytest

from specrt.runtime.acceptance import (
    dense_residual,
    typical_threshold,
    verify_chain,
    verify_tree_greedy,
    verify_tree_sampled,
    verify_tree_typical,
)
from specrt.runtime.dist import Dist
from specrt.runtime.sampling import sample
from specrt.runtime.tree import TokenTree
from specrt.theory import acceptance_rate

N = 20_000


def tv(counts: np.ndarray, p: np.ndarray) -> float:
    return 0.5 * float(np.abs(counts / counts.sum() - p).sum())


def tv_bound(v: int, n: int = N) -> float:
    # E[TV(empirical, p)] <= 0.5 * sqrt(V / n) (Cauchy-Schwarz + Jensen on E[sum (p̂-p)^2] <= 1/n);
    # twice that is far in the tail for multinomial counts and far below what a biased rule gives.
    return float(np.sqrt(v / n))


def speculative_sequence(p: np.ndarray, q: np.ndarray, gamma: int, length: int, rng, rule=verify_chain) -> list[int]:
    """Emit ``length`` tokens from position-dependent, context-independent p[t] / q[t] with draft chains."""
    out: list[int] = []
    while len(out) < length:
        t = len(out)
        g = min(gamma, length - t - 1)
        drafts = [sample(q[t + i], rng) for i in range(g)]
        n, nxt = rule(p[t:t + g + 1], q[t:t + g], drafts, rng)
        out += drafts[:n] + [nxt]
    return out[:length]


def make_case(kind: str, v: int, length: int, rng) -> tuple[np.ndarray, np.ndarray]:
    p = rng.dirichlet(np.ones(v) * 0.7, size=length)
    q = rng.dirichlet(np.ones(v) * 0.7, size=length)
    if kind == "sparse":  # disjoint-ish supports: p has zeros where q has mass and vice versa
        p[:, : v // 3] = 0
        q[:, -(v // 3):] = 0
        p /= p.sum(1, keepdims=True)
        q /= q.sum(1, keepdims=True)
    elif kind == "q_equals_p":
        q = p.copy()
    elif kind == "one_hot_q":  # a deterministic drafter such as n-gram lookup
        q = np.eye(v)[rng.integers(0, v, length)]
    elif kind == "one_hot_p":
        p = np.eye(v)[rng.integers(0, v, length)]
    return p, q


CASES = [("dense", 2), ("dense", 8), ("dense", 50), ("sparse", 9), ("q_equals_p", 8), ("one_hot_q", 8),
         ("one_hot_p", 6)]


@pytest.mark.parametrize("kind,v", CASES)
def test_emitted_tokens_follow_the_target(kind, v):
    rng = np.random.default_rng(1234 + v)
    length, gamma = 3, 2
    p, q = make_case(kind, v, length + 2, rng)
    runs = np.array([speculative_sequence(p, q, gamma, length, rng) for _ in range(N)])
    direct = np.array([[sample(p[t], rng) for t in range(length)] for _ in range(N)])
    for t in range(length):
        spec_tv = tv(np.bincount(runs[:, t], minlength=v), p[t])
        direct_tv = tv(np.bincount(direct[:, t], minlength=v), p[t])
        assert spec_tv < tv_bound(v), (t, spec_tv, direct_tv)
        assert direct_tv < tv_bound(v)  # the same bound holds for direct sampling with the same count


def biased_rule(target_probs, draft_probs, draft_tokens, rng):
    """A plausible bug: on rejection sample from p instead of norm(max(0, p - q))."""
    for i, x in enumerate(draft_tokens):
        if rng.random() * draft_probs[i, x] < target_probs[i, x]:
            continue
        return i, sample(target_probs[i], rng)
    return len(draft_tokens), sample(target_probs[len(draft_tokens)], rng)


def test_the_statistical_check_catches_a_biased_sampler():
    rng = np.random.default_rng(7)
    p, q = make_case("dense", 8, 3, rng)
    runs = np.array([speculative_sequence(p, q, 1, 2, rng, rule=biased_rule) for _ in range(N)])
    assert tv(np.bincount(runs[:, 0], minlength=8), p[0]) > tv_bound(8)


@pytest.mark.parametrize("kind,v", CASES)
def test_acceptance_frequency_matches_sum_min(kind, v):
    rng = np.random.default_rng(99 + v)
    p, q = make_case(kind, v, 2, rng)
    accepted = 0
    for _ in range(N):
        x = sample(q[0], rng)
        n, _ = verify_chain(p, q[:1], [x], rng)
        accepted += n
    beta = acceptance_rate(p[0], q[0])
    assert abs(accepted / N - beta) < 4 * np.sqrt(max(beta * (1 - beta), 1e-4) / N)


def test_one_hot_all_accepted_gives_bonus():
    v = 10
    p = np.eye(v)[[3, 5, 7, 2]]  # target argmax after each prefix
    q = np.eye(v)[[3, 5, 7]]
    n, nxt = verify_chain(p, q, [3, 5, 7], np.random.default_rng(0))
    assert (n, nxt) == (3, 2)


@pytest.mark.parametrize("mismatch", [0, 1, 2])
def test_one_hot_mismatch_gives_correction(mismatch):
    v = 10
    target = [3, 5, 7, 2]
    drafts = [3, 5, 7]
    drafts[mismatch] = 9
    p = np.eye(v)[target]
    q = np.eye(v)[drafts]
    n, nxt = verify_chain(p, q, drafts, np.random.default_rng(0))
    assert (n, nxt) == (mismatch, target[mismatch])


def test_residual_guards():
    p = np.array([0.2, 0.3, 0.5])
    assert np.allclose(dense_residual(p, p), p)  # zero residual mass: p itself
    r = dense_residual(p, np.array([0.4, 0.3, 0.3]))
    assert np.allclose(r, [0, 0, 1])
    assert np.isclose(r.sum(), 1)


def test_unnormalised_inputs_give_the_same_decisions():
    rng = np.random.default_rng(5)
    p, q = make_case("dense", 8, 4, rng)
    drafts = [sample(q[i], rng) for i in range(3)]
    a = verify_chain(p, q[:3], drafts, np.random.default_rng(11))
    b = verify_chain(p * 3.0, q[:3] * 0.5, drafts, np.random.default_rng(11))
    assert a == b


def test_empty_chain_samples_from_p():
    n, nxt = verify_chain(np.eye(5)[[4]], np.zeros((0, 5)), [], np.random.default_rng(0))
    assert (n, nxt) == (0, 4)


# --- token trees ---------------------------------------------------------------------------------------------

def rows(*dense) -> list[Dist]:
    """Dense probability rows as the Dists verification reads: [root, node 0, node 1, ...]."""
    return [Dist.from_probs(r) for r in dense]


def test_greedy_tree_follows_the_target_argmax():
    v = 8
    #   root -> 3 (node 0) -> 5 (node 2)
    #        -> 4 (node 1) -> 6 (node 3)
    tree = TokenTree(tokens=[3, 4, 5, 6], parents=[-1, -1, 0, 1])
    onehot = np.eye(v)
    # target: after root 4, after node 1 (4) -> 6, after node 3 (6) -> 2 (bonus)
    p_root, p_nodes = onehot[4], onehot[[0, 6, 0, 2]]
    assert verify_tree_greedy(rows(p_root, *p_nodes), tree) == ([1, 3], 2)
    # target wants 7 after the root: no child carries it -> correction 7, nothing accepted
    assert verify_tree_greedy(rows(onehot[7], *p_nodes), tree) == ([], 7)
    # accept node 0 (3), then the target wants 1, which node 2 (5) is not -> correction 1
    assert verify_tree_greedy(rows(onehot[3], *onehot[[1, 0, 0, 0]]), tree) == ([0], 1)


def tree_sequence(p, q, widths, length, rng, rule=verify_tree_sampled):
    """Emit `length` tokens from position-dependent, context-independent p[t] with sampled trees whose
    children at depth d are i.i.d. draws from q[t + d]."""
    out: list[int] = []
    while len(out) < length:
        t = len(out)
        tokens, parents, child_q, frontier = [], [], {-1: Dist.from_probs(q[t])}, [-1]
        for d, w in enumerate(widths[: length - t - 1]):
            start = len(tokens)
            for parent in frontier:
                for _ in range(w):
                    tokens.append(child_q[parent].sample(rng))
                    parents.append(parent)
            frontier = list(range(start, len(tokens)))
            for node in frontier:
                child_q[node] = Dist.from_probs(q[t + d + 1])
        tree = TokenTree(tokens, parents, child_q)
        depth = [tree.depth(i) for i in range(len(tokens))]
        path, nxt = rule(rows(p[t], *[p[t + d + 1] for d in depth]), tree, rng)
        out += [tokens[i] for i in path] + [nxt]
    return out[:length]


@pytest.mark.parametrize("kind", ["dense", "sparse", "q_equals_p"])
def test_sampled_tree_is_exact(kind):
    rng = np.random.default_rng(2024)
    v, length = 6, 3
    p = rng.dirichlet(np.ones(v) * 0.7, size=length + 3)
    q = rng.dirichlet(np.ones(v) * 0.7, size=length + 3)
    if kind == "sparse":
        p[:, :2] = 0
        q[:, -2:] = 0
        p /= p.sum(1, keepdims=True)
        q /= q.sum(1, keepdims=True)
    elif kind == "q_equals_p":
        q = p.copy()
    runs = np.array([tree_sequence(p, q, (3, 2), length, rng) for _ in range(N)])
    bound = np.sqrt(v / N)  # twice the expectation bound, as for chains above
    for t in range(length):
        emp = np.bincount(runs[:, t], minlength=v) / N
        assert 0.5 * np.abs(emp - p[t]).sum() < bound, t


def test_sampled_tree_check_catches_a_missing_residual_update():
    """Without p <- norm(max(0, p - q)) after a rejected child, siblings get too much mass."""
    def biased(p_rows, tree, rng):
        kids = tree.children()
        node, p, path = -1, p_rows[0], []
        while kids[node]:
            q = tree.child_q[node]
            for child in kids[node]:
                x = tree.tokens[child]
                if rng.random() * q.prob(x) < p.prob(x):
                    path.append(child)
                    node, p = child, p_rows[1 + child]
                    break
            else:
                break
        return path, p.sample(rng)

    rng = np.random.default_rng(3)
    v = 6
    p = rng.dirichlet(np.ones(v) * 0.7, size=5)
    q = rng.dirichlet(np.ones(v) * 0.7, size=5)
    runs = np.array([tree_sequence(p, q, (3,), 2, rng, rule=biased) for _ in range(N)])
    emp = np.bincount(runs[:, 0], minlength=v) / N
    assert 0.5 * np.abs(emp - p[0]).sum() > np.sqrt(v / N)


def test_point_mass_tree_children_are_exact_under_sampling():
    """Two fixed children of the root; the next token's distribution must be p whatever they are."""
    p_root = Dist(None, np.array([0.5, 0.2, 0.2, 0.1]), 4)
    leaf = Dist(None, np.array([0.25, 0.25, 0.25, 0.25]), 4)
    tree = TokenTree([0, 2], [-1, -1], points=True)
    rng = np.random.default_rng(0)
    n = 40000
    first = np.zeros(4)
    for _ in range(n):
        path, nxt = verify_tree_sampled([p_root, leaf, leaf], tree, rng)
        first[tree.tokens[path[0]] if path else nxt] += 1
    assert np.abs(first / n - p_root.dense()).max() < 0.01


# --- Medusa's typical acceptance (lossy) ----------------------------------------------------------------------

def test_typical_rule():
    flat = np.full(4, 0.25)
    peaked = np.array([0.97, 0.01, 0.01, 0.01])
    # Uniform: entropy log 4, threshold min(0.09, 0.3 / 4) = 0.075; peaked: min(0.09, 0.3 * e^-H) = 0.09
    assert typical_threshold(flat, 0.09, 0.3) == pytest.approx(0.075)
    assert typical_threshold(peaked, 0.09, 0.3) == pytest.approx(0.09)
    tree = TokenTree(tokens=[0, 1, 2], parents=[-1, -1, 0])
    p_root = np.array([0.6, 0.3, 0.05, 0.05])
    p_nodes = np.array([[0.05, 0.05, 0.85, 0.05], [0.25] * 4, [0.1, 0.2, 0.3, 0.4]])
    rows = lambda: [Dist.from_probs(r) for r in [p_root, *p_nodes]]  # noqa: E731
    path, _ = verify_tree_typical(rows(), tree, np.random.default_rng(0))
    assert path == [0, 2]  # both typical; the deepest accepted path wins
    p_nodes[0] = [0.9, 0.04, 0.03, 0.03]  # token 2 is now atypical after node 0
    path, _ = verify_tree_typical(rows(), tree, np.random.default_rng(0))
    assert path == [0]
