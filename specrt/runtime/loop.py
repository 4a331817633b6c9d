"""The decoding loop as named phases: prefill → (speculative_step | tree_step)* → stop. One small state object."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np

from .. import theory
from .acceptance import accept_chain, verify_tree_greedy, verify_tree_sampled, verify_tree_typical
from .cached import CachedModel
from .dist import overlap
from .drafters import Drafter
from .proposal import Proposal
from .options import MAX_GAMMA  # noqa: F401  (the loop's bound on gamma, checked by DecodeOptions)
from .rows import LogitRows, acceptance_beta
from .sampling import SamplingConfig
from .stats import StatsRecorder, StepRecord


@dataclass
class DecodeState:
    tokens: list[int]  # [context] the prompt + tokens generated so far
    target: CachedModel
    drafter: Drafter
    sampling: SamplingConfig
    rng: np.random.Generator
    stats: StatsRecorder
    hidden: np.ndarray | None = None  # [hidden_size] target's final hidden state, last accepted token (Medusa)
    min_rows: int = 1  # 2: DecodeOptions.row_stable


def verify_rows(s: DecodeState, drafted: list[int]) -> list[int]:
    """What the target's verify pass feeds: the context its cache lacks, then the drafts; at least
    ``s.min_rows`` rows, taking back cached tokens (recomputed alike: multi-row passes agree row for row)."""
    start = max(0, min(s.target.cache.length, len(s.tokens) + len(drafted) - s.min_rows))
    s.target.cache.truncate(start)
    return s.tokens[start:] + drafted


def prefill(s: DecodeState) -> int:
    """Run the prompt (what the target's cache lacks of it) through target and drafter; the target's
    distribution gives the first token."""
    with s.stats.timed("prefill"):
        p = s.target.feed(s.tokens[s.target.cache.length:], s.sampling)[0]
        s.hidden = s.target.hidden[-1]
        s.drafter.prefill(s.tokens, s.sampling)
    return p.sample(s.rng)


def plain_step(s: DecodeState) -> tuple[list[int], StepRecord]:
    """Plain decoding: one target pass over what its cache lacks (the last token); its distribution gives
    the next token. The baseline's step, with nothing of speculation's bookkeeping around the pass."""
    token, record, _ = _plain_pass(s)
    return [token], record


def _plain_pass(s: DecodeState) -> tuple[int, StepRecord, LogitRows]:
    t0 = time.perf_counter()
    p = s.target.feed(verify_rows(s, []), s.sampling)
    t1 = time.perf_counter()
    return p[0].sample(s.rng), StepRecord(0, 0, [], 0, 0.0, t1 - t0), p


def speculative_step(s: DecodeState, gamma: int, proposal: Proposal | None = None,
                     draft_s: float = 0.0) -> tuple[list[int], StepRecord]:
    """Draft γ tokens, verify them all in ONE target pass, keep what exact rejection sampling accepts + 1.
    ``proposal``: drafted already (in ``draft_s`` seconds), by a caller that looked at it first."""
    context_len = len(s.tokens)
    t0 = time.perf_counter() - draft_s
    if proposal is None:
        proposal = s.drafter.propose(s.tokens, gamma, s.sampling, s.rng)  # ≤ γ tokens and the q each came from
    k = len(proposal.tokens)
    t1 = time.perf_counter()
    # The token emitted last (not yet in the target's cache) + the drafts, in one pass: k+1 rows of
    # logits, warped into p only as far as verification reads them.
    p = s.target.feed(verify_rows(s, proposal.tokens), s.sampling, last=k + 1)
    t2 = time.perf_counter()
    n, next_token = accept_chain(p, proposal.dists, proposal.tokens, s.rng)
    # Rejected drafts are forgotten by moving a length: O(1), nothing copied.
    s.target.cache.truncate(context_len + n)
    s.drafter.rollback(context_len + n)
    s.hidden = s.target.hidden[n]
    betas = [acceptance_beta(p, i, proposal.dists[i], proposal.tokens[i]) for i in range(min(n + 1, k))]
    return proposal.tokens[:n] + [next_token], StepRecord(k, n, betas, proposal.passes, t1 - t0, t2 - t1)


def tree_step(s: DecodeState, max_depth: int, typical: bool = False) -> tuple[list[int], StepRecord]:
    """Draft a token tree, verify every node in ONE target pass, keep the longest accepted path + 1."""
    context_len = len(s.tokens)
    t0 = time.perf_counter()
    tree = s.drafter.propose_tree(s.tokens, max_depth, s.sampling, s.rng, s.hidden)
    t1 = time.perf_counter()
    # The target's missing context (ending with the root) + the tree below it: rows [root, node 0..N-1].
    p = s.target.feed(verify_rows(s, tree.tokens), s.sampling, last=len(tree.tokens) + 1, tree_parents=tree.parents)
    t2 = time.perf_counter()
    if s.sampling.greedy:
        path, next_token = verify_tree_greedy(p, tree)
    elif typical:
        path, next_token = verify_tree_typical(p, tree, s.rng)  # LOSSY, opt-in only
    else:
        path, next_token = verify_tree_sampled(p, tree, s.rng)
    # The accepted nodes sit at context_len + node index; move them into a contiguous run.
    s.target.compact(context_len, path)
    s.drafter.rollback(context_len)
    s.hidden = s.target.hidden[1 + path[-1] if path else 0]
    rows = [p[0]] + [p[1 + i] for i in path]
    qs = [tree.child_q.get(node) for node in [-1, *path]]
    # Greedy trees rank children by the draft's softmax, not a one-hot q: no beta estimate there.
    betas = [] if s.sampling.greedy else [overlap(pr, q) for pr, q in zip(rows, qs) if q is not None]
    return ([tree.tokens[i] for i in path] + [next_token],
            StepRecord(len(tree.tokens), len(path), betas, tree.passes, t1 - t0, t2 - t1))


class PooledAlpha:
    """α̂ from betas pooled over positions: an EMA (``weight`` a step) of a step's Σβ over one of its count of
    verified positions, a ratio of means (the mean of a step's betas is biased low for γ > 1: AutoGamma's
    docstring). None until a beta is seen."""

    def __init__(self, weight: float) -> None:
        self.weight = weight
        self.value: float | None = None
        self._beta_sum: float | None = None
        self._positions: float | None = None

    def observe(self, betas: list[float]) -> None:
        if betas:
            self._beta_sum = theory.moving_average(self._beta_sum, float(sum(betas)), self.weight)
            self._positions = theory.moving_average(self._positions, float(len(betas)), self.weight)
            self.value = self._beta_sum / self._positions


class AutoGamma:
    """γ from the measured α and c: after every step, γ = optimal_gamma(α̂, ĉ, v) where α̂ is the ratio of
    exponential moving averages (weight 0.3 a step) of a step's Σ Σmin(p, q) over its verified positions and
    of their count, ĉ one of draft-pass time over a 1-row target pass, and v the backend's verify-cost curve
    (runtime.costs; None: every pass costs one row's time, the paper's assumption). Starts at 4, or at 1
    with a curve: where rows are dear the first step, taken before anything is measured, is the one that
    risks least (a fully accepted chain of one already lifts γ at the next step); γ stays within
    [1, max_gamma].

    α̂ pools positions rather than averaging steps: a step's positions stop at its first rejection, so the
    mean of a step's betas is biased low for any γ > 1 (α 0.5 at γ 4: 0.32; the ratio: 0.47), which held γ
    below its optimum. γ at most doubles a step, to 2γ + 1 (it falls at once): a few accepted steps in a
    row push a 6-step α̂ near 1, where the optimum is the longest chain, and on a CPU whose rows are dear one
    such step costs several plain ones (uncapped: γ 16 on 2 % of SmolLM2 int8's steps, 1.01× `none` against
    1.03×); growing one draft a step instead slowed the demo pair's climbs (1.47× against 1.52×;
    docs/performance/auto-gamma-cpu.md)."""

    def __init__(self, start: int | None = None, max_gamma: int = 16, weight: float = 0.3,
                 verify_costs: tuple[float, ...] | None = None, one_pass: bool = False) -> None:
        start = start if start is not None else 4 if verify_costs is None else 1
        self.gamma, self.max_gamma, self.weight = start, max_gamma, weight
        self.verify_costs = verify_costs
        self.one_pass = one_pass  # Drafter.drafts_in_one_pass: a step's draft cost is one pass, whatever γ
        self._alpha = PooledAlpha(weight)
        self.c: float | None = None

    @property
    def alpha(self) -> float | None:
        return self._alpha.value

    def update(self, step: StepRecord) -> int:
        self._alpha.observe(step.betas)
        if step.verify_s > 0:
            t_draft_pass = step.draft_s / step.draft_passes if step.draft_passes else 0.0
            # the verify pass had proposed + 1 rows
            self.c = theory.moving_average(self.c, theory.draft_cost(t_draft_pass, step.verify_s, step.proposed + 1,
                                                         self.verify_costs), self.weight)
        if self.alpha is not None:
            best = theory.optimal_gamma(min(self.alpha, 0.999), self.c or 0.0, self.max_gamma, self.verify_costs,
                                        self.one_pass)
            self.gamma = min(best, 2 * self.gamma + 1)
        return self.gamma


class DraftGate:
    """Whether verifying a proposal that cost nothing to make (prompt lookup: ``Drafter.proposes_for_free``) pays,
    step by step: only its longest prefix whose expected tokens per pass beat that prefix's verify cost is kept,
    and none when no prefix does, so a lookup that keeps missing costs a plain step, not a dear multi-row pass.

    α̂ pools the betas of verified positions as :class:`AutoGamma` does; while verification is off it keeps
    learning from each plain step: a one-hot q's beta is p(x), the target's probability of the lookup's first
    token, read off the row the plain pass made anyway, so the gate turns back on when the lookup starts to
    hit. Which exact method runs each step depends only on the steps before it: the output stays distributed
    as the target's. ``verify_costs``: the backend's curve (runtime.costs); None (every pass costs one row)
    never turns verification off."""

    def __init__(self, verify_costs: tuple[float, ...] | None, weight: float = 0.3) -> None:
        self.verify_costs = verify_costs
        self._alpha = PooledAlpha(weight)

    @property
    def alpha(self) -> float | None:
        return self._alpha.value

    def observe(self, betas: list[float]) -> None:
        self._alpha.observe(betas)

    def keep(self, k: int) -> int:
        """How many of ``k`` proposed tokens to verify: 0 when no prefix is expected to beat a plain step."""
        if k == 0 or self.alpha is None:
            return k
        alpha = min(self.alpha, 0.999)
        best = theory.optimal_gamma(alpha, 0.0, k, self.verify_costs)
        return best if theory.speedup(alpha, best, 0.0, self.verify_costs) > 1.0 else 0

    def step(self, s: DecodeState, gamma: int) -> tuple[list[int], StepRecord]:
        t0 = time.perf_counter()
        proposal = s.drafter.propose(s.tokens, gamma, s.sampling, s.rng)
        draft_s = time.perf_counter() - t0
        k = self.keep(len(proposal.tokens))
        if k:
            step = speculative_step(s, gamma, Proposal(proposal.tokens[:k], proposal.dists[:k]), draft_s)
            self.observe(step[1].betas)
            return step
        token, record, p = _plain_pass(s)
        if proposal.tokens:  # what verifying would have kept at the first position, for free
            self.observe([acceptance_beta(p, 0, proposal.dists[0], proposal.tokens[0])])
            record = replace(record, paused=True, draft_s=draft_s)
        return [token], record


class ChainStepper:
    """One speculative_step per call with a fixed γ, or γ="auto" (:class:`AutoGamma`, weighing γ with
    ``verify_costs``, and one draft pass per step where ``one_pass``); ``gate``: each proposal first passes this
    :class:`DraftGate` (the caller's, so what it learnt outlives one generation)."""

    def __init__(self, gamma: int | str, verify_costs: tuple[float, ...] | None = None,
                 gate: DraftGate | None = None, one_pass: bool = False) -> None:
        self.auto = AutoGamma(verify_costs=verify_costs, one_pass=one_pass) if gamma == "auto" else None
        self.gamma = 0 if gamma == "auto" else int(gamma)
        self.gate = gate

    def __call__(self, s: DecodeState, budget: int) -> tuple[list[int], StepRecord]:
        gamma = min(self.auto.gamma if self.auto else self.gamma, budget)
        step = self.gate.step(s, gamma) if self.gate else speculative_step(s, gamma)
        if self.auto and not step[1].paused:
            self.auto.update(step[1])
        return step


class PlainStepper:
    """One plain_step per call (method ``none``)."""

    def __call__(self, s: DecodeState, budget: int) -> tuple[list[int], StepRecord]:
        return plain_step(s)


class TreeStepper:
    """One tree_step per call; the tree is cut to the depth the token budget can still use.
    ``typical`` selects Medusa's typical acceptance for sampling, which is LOSSY."""

    def __init__(self, typical: bool = False) -> None:
        self.typical = typical

    def __call__(self, s: DecodeState, budget: int) -> tuple[list[int], StepRecord]:
        return tree_step(s, budget, self.typical)


def decode(s: DecodeState, max_new_tokens: int, step: ChainStepper | PlainStepper | TreeStepper,
           stop_ids: frozenset[int]) -> Iterator[list[int]]:
    """Yield chunks of new token ids until max_new_tokens or a stop id (the stop id is not yielded)."""
    produced = 0
    chunk = [prefill(s)]
    while True:
        chunk = chunk[: max_new_tokens - produced]
        for j, t in enumerate(chunk):
            if t in stop_ids:
                s.stats.new_tokens, s.stats.end_token = produced + j, 1
                yield chunk[:j]
                return
        s.tokens.extend(chunk)
        produced += len(chunk)
        s.stats.new_tokens = produced
        yield chunk
        if produced >= max_new_tokens:
            return
        # The correction/bonus token always comes, so at most remaining - 1 drafted tokens are useful.
        chunk, record = step(s, max_new_tokens - produced - 1)
        s.stats.record_step(record)
