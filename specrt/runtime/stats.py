"""Counters and timers of one generation, and the figures derived from them."""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator, Sequence

from .. import theory


@dataclass(frozen=True)
class StepRecord:
    proposed: int
    accepted: int
    betas: list[float]  # sum_x min(p, q) at each verified position up to the first rejection
    draft_passes: int
    draft_s: float
    verify_s: float
    paused: bool = False  # a plain step in a speculative method: DraftGate or auto's MethodGate judged drafting lost


@dataclass
class StatsRecorder:
    method: str
    gamma_requested: int | str
    prompt_tokens: int = 0  # the context every pass reads before the first new token (bytes per token)
    reused_tokens: int = 0  # prompt tokens whose K/V the previous generation left (reuse_prefix)
    new_tokens: int = 0
    # 1 when the last pass yielded a stop id: a token the pass produced, so it counts in tokens per target pass
    # (plain decoding is then exactly 1.00) though it is not part of the output
    end_token: int = 0
    steps: int = 0  # target passes after prefill
    drafted: int = 0
    accepted: int = 0
    draft_passes: int = 0
    paused: int = 0  # plain steps in a speculative method: DraftGate's unverified lookups, MethodGate's switch
    betas: list[float] = field(default_factory=list)
    accepted_lengths: list[int] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=lambda: {"prefill": 0.0, "draft": 0.0, "verify": 0.0})
    engine_s: float = 0.0  # inside the models' engine run calls (set by the caller, who owns the models)
    target_copied_bytes: int = 0  # device-to-host bytes of the target's outputs (set by the caller)
    t_start: float = field(default_factory=time.perf_counter)
    # The target's verify-cost curve v(1..n) where the generator has measured it (runtime.costs): the predicted
    # speedup then prices a verify pass of γ+1 rows against a plain one-row step, not as equal to it
    verify_costs: tuple[float, ...] | None = None
    switch_note: str | None = None  # auto's MethodGate: what it measured and ran (set by the caller)
    one_pass: bool = False  # Drafter.drafts_in_one_pass: the predicted speedup counts one draft pass per step

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - t0

    def record_step(self, r: StepRecord) -> None:
        self.steps += 1
        self.accepted_lengths.append(r.accepted)
        self.drafted += r.proposed  # what was drafted; n-gram lookup may propose fewer than gamma
        self.accepted += r.accepted
        self.betas.extend(r.betas)
        self.draft_passes += r.draft_passes
        self.paused += r.paused
        self.seconds["draft"] += r.draft_s
        self.seconds["verify"] += r.verify_s

    def finish(self) -> "GenerationStats":
        total = time.perf_counter() - self.t_start
        passes = self.steps + 1  # + the prefill pass, which yields the first token
        t_target = self.seconds["verify"] / self.steps if self.steps else 0.0
        t_draft = self.seconds["draft"] / self.draft_passes if self.draft_passes else 0.0
        c = t_draft / t_target if t_target else 0.0
        alpha = sum(self.betas) / len(self.betas) if self.betas else None
        drafting = self.steps - self.paused  # a paused step is a plain one: it drafted nothing it verified
        mean_gamma = self.drafted / drafting if drafting else 0.0
        gamma = round(mean_gamma)
        # c is a draft pass over the verify pass timed here, so the theory's unit is that pass; a plain step is
        # v(γ+1) times cheaper, which the curve, where known, divides out.
        verify_cost = theory.verify_cost_at(self.verify_costs, gamma + 1) if self.verify_costs and gamma else None
        predicted = (theory.speedup(min(alpha, 1.0), gamma, c, one_pass=self.one_pass) / (verify_cost or 1.0)
                     if alpha is not None and gamma else None)
        return GenerationStats(
            method=self.method, prompt_tokens=self.prompt_tokens, new_tokens=self.new_tokens, target_passes=passes, draft_passes=self.draft_passes,
            drafted=self.drafted, accepted=self.accepted,
            acceptance_rate=self.accepted / self.drafted if self.drafted else None,
            alpha_estimate=alpha, mean_accepted=self.accepted / self.steps if self.steps else 0.0,
            tokens_per_target_pass=(self.new_tokens + self.end_token) / passes, mean_gamma=mean_gamma,
            c=c, predicted_speedup=predicted, total_s=total, prefill_s=self.seconds["prefill"],
            draft_s=self.seconds["draft"], verify_s=self.seconds["verify"],
            other_s=total - sum(self.seconds.values()),
            engine_s=self.engine_s, host_s=total - self.engine_s,
            host_ms_per_token=1000 * (total - self.engine_s) / self.new_tokens if self.new_tokens else 0.0,
            d2h_bytes_per_target_pass=self.target_copied_bytes / passes,
            tokens_per_second=self.new_tokens / total if total > 0 else 0.0,
            accepted_per_depth=[sum(n > d for n in self.accepted_lengths) / self.steps
                                for d in range(max(self.accepted_lengths, default=0))],
            reused_tokens=self.reused_tokens, paused_steps=self.paused, verify_cost=verify_cost,
            switch=self.switch_note)


@dataclass(frozen=True)
class GenerationStats:
    """What one generation did and how fast. ``alpha_estimate`` is the mean of sum_x min(p, q) over
    verified positions (Leviathan et al.'s estimator); ``acceptance_rate`` is accepted / drafted."""

    method: str
    prompt_tokens: int
    new_tokens: int
    target_passes: int  # including the prefill pass
    draft_passes: int
    drafted: int
    accepted: int
    acceptance_rate: float | None
    alpha_estimate: float | None
    mean_accepted: float  # accepted draft tokens per speculative step
    tokens_per_target_pass: float  # the stop id a last pass produced included: plain decoding = 1.00
    mean_gamma: float  # tokens drafted per step: chain length, or tree nodes verified per pass
    c: float  # measured draft pass time / target verification pass time
    predicted_speedup: float | None  # theory.speedup(alpha_estimate, round(mean_gamma), c) / verify_cost
    total_s: float
    prefill_s: float
    draft_s: float
    verify_s: float
    other_s: float  # total minus prefill, draft and verify phases
    engine_s: float  # inside the target's and draft's engine run calls (DecoderOutput.engine_s)
    host_s: float  # everything else: warping, sampling, acceptance, cache bookkeeping, detokenising
    host_ms_per_token: float  # host_s per generated token
    d2h_bytes_per_target_pass: float  # hidden rows + logits or their summary from a GPU per target pass (0 on CPU)
    tokens_per_second: float
    # fraction of speculative steps whose accepted run reached depth d+1 (chains and trees alike)
    accepted_per_depth: list[float] = field(default_factory=list)
    # prompt tokens not fed again: their K/V was left by the previous generation (reuse_prefix)
    reused_tokens: int = 0
    # plain steps in a speculative method: prompt lookup kept missing where rows are dear (runtime.loop.DraftGate),
    # or auto measured the method slower than plain decoding (runtime.gate.MethodGate)
    paused_steps: int = 0
    # v(γ+1): a verify pass over a plain step, from the measured curve, in predicted_speedup; None: not measured
    verify_cost: float | None = None
    # auto's switch between the method and plain decoding (runtime.gate): its measured rates and what ran; None
    # where the method was named or needs no switch
    switch: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def mean_pass_seconds(stats: Sequence[GenerationStats]) -> tuple[float, float | None]:
    """(a target pass after prefill, a drafting pass) in seconds over several generations, each phase's time over its
    passes (a long generation weighs as its passes do): what ``specrt bench`` and ``specrt verify`` take c from.
    0.0 / None where no such pass ran."""
    steps = sum(s.target_passes - 1 for s in stats)
    draft_passes = sum(s.draft_passes for s in stats)
    return (sum(s.verify_s for s in stats) / steps if steps else 0.0,
            sum(s.draft_s for s in stats) / draft_passes if draft_passes else None)
