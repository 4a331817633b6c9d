"""Exactness of speculative sampling, checked statistically, plus deterministic one-hot cases."""

import numpy as np
import pytest

from specrt.runtime.sampling import sample
from specrt.runtime.verify import residual, verify_chain
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
    assert np.allclose(residual(p, p), p)  # zero residual mass: p itself
    r = residual(p, np.array([0.4, 0.3, 0.3]))
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
