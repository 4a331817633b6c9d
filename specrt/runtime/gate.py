"""``auto``'s switch: each step runs the method's own step or a plain one, whichever measured faster here.

A drafter (an EAGLE-3 tree or chain, a draft model, Medusa) makes every step dearer than a plain one and pays
only as far as its drafts are kept. Where few are kept (sampling at T 0.7-1 on open chat) or where verifying
several rows costs several rows' time (quantized blocks on a CPU), it loses to plain decoding. A
:class:`MethodGate` measures both as decoding goes, in tokens per second of each step's wall time, runs the
faster one and now and then tries the other, so it notices when that changes (a reply that turns to code, say).
Prompt lookup runs behind it too, on top of its own gate (``loop.DraftGate``), which judges each proposal before
verifying it but does not count the host work of looking up and accepting.

Exact at any temperature: which exact method runs a step depends only on what was measured before it,
never on the step's own draws, so every token is still distributed as the target's (greedy output equals
plain decoding's whichever runs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from .. import theory
from .loop import ChainStepper, DecodeState, TreeStepper, plain_step
from .stats import StepRecord


@dataclass
class Rate:
    """Tokens per second of one kind of step: a ratio of moving averages (a step's tokens, its seconds), so a
    step that kept five tokens weighs as five. The first 1/weight steps weigh alike (a plain mean), so the
    first step does not stand for many."""

    tokens: float | None = None
    seconds: float | None = None
    samples: int = 0

    def add(self, tokens: int, seconds: float, weight: float) -> None:
        self.samples += 1
        weight = max(weight, 1.0 / self.samples)
        self.tokens = theory.moving_average(self.tokens, float(tokens), weight)
        self.seconds = theory.moving_average(self.seconds, seconds, weight)

    @property
    def value(self) -> float:
        return self.tokens / self.seconds if self.tokens is not None and self.seconds else 0.0


class MethodGate:
    """Which of the method's step and a plain step to run next, from their measured rates. Kept by the
    generator per method and sampling settings across generations, so a server learns it once.

    First :attr:`WARM_METHOD` steps of the method and :attr:`WARM_PLAIN` plain ones, then the method while its
    rate is at least :attr:`KEEP` of plain decoding's, else plain steps. The other kind runs once after a run of
    the faster: plain decoding after :attr:`PLAIN_PROBE` method steps (its rate only drifts, with the context's
    length), the method after :attr:`METHOD_PROBE` plain steps, twice as many after each probe that finds it still
    slower once its rate rests on 1/:attr:`WEIGHT` steps, up to :attr:`METHOD_PROBE_MAX` (a probe, two steps of
    the method as :class:`GatedStepper` times them, costs about 2 (c + v(rows)) plain steps: a method that loses
    15 % costs under 1 % over a long run).

    The memory is long on purpose: the tokens a method's step keeps vary from 1 to its depth, so ten steps
    tell its rate within about 15 %, too coarse for a drafter that gains 5-10 % (SmolLM2's int4 head on a
    CPU); flipping on that noise ran 0.89x plain decoding where the method alone ran 1.05x. Forty steps tell
    it within about 8 %, and what separates a winning drafter from a losing one is mostly the sampling
    settings, which have gates of their own."""

    WEIGHT = 0.05  # of a step, in each moving average: about the last forty steps of a kind count
    # Steps of the method before its rate is compared: judged on 8, SmolLM2's int4 tree (1.06-1.10x plain decoding
    # greedy) was turned off early often enough that auto ran 0.93x the tree alone; a losing method's 16 cost
    # about 2 plain steps' time once per generator.
    WARM_METHOD = 16
    WARM_PLAIN = 4  # a plain step keeps one token: its rate is steady
    KEEP = 0.97  # the method's rate over plain decoding's below which plain steps run: measured noise aside
    PLAIN_PROBE = 64
    METHOD_PROBE = 24
    METHOD_PROBE_MAX = 96  # each probe that finds the method still slower doubles the wait, up to this

    def __init__(self) -> None:
        self.method, self.plain = Rate(), Rate()
        self._run = 0  # steps of the faster kind since the other last ran
        self._wait = self.METHOD_PROBE  # plain steps before the next probe of a losing method

    @property
    def warm(self) -> bool:
        return self.method.samples >= self.WARM_METHOD and self.plain.samples >= self.WARM_PLAIN

    @property
    def method_faster(self) -> bool:
        return self.method.value >= self.KEEP * self.plain.value

    def method_now(self) -> bool:
        """Whether the next step is the method's."""
        if self.method.samples < self.WARM_METHOD:
            return True
        if self.plain.samples < self.WARM_PLAIN:
            return False
        if self.method_faster:
            return self._run < self.PLAIN_PROBE
        return self._run >= self._wait

    def record(self, method: bool, tokens: int, seconds: float) -> None:
        counting = self.warm and method == self.method_faster  # not a warm-up step, nor a probe
        (self.method if method else self.plain).add(tokens, seconds, self.WEIGHT)
        self._run = self._run + 1 if counting else 0
        if self.method_faster:
            self._wait = self.METHOD_PROBE
        elif method and not counting and self.warm and self.method.samples * self.WEIGHT >= 1:
            # a probe that found the method still slower, on a rate of enough steps to trust: wait longer
            self._wait = min(2 * self._wait, self.METHOD_PROBE_MAX)

    def describe(self, name: str) -> str:
        """One line: the rates, and what runs."""
        if self.plain.samples == 0:
            return f"{name} only (plain decoding not measured yet)"
        ratio = self.method.value / self.plain.value if self.plain.value else 0.0
        if self.method_faster:
            return (f"{name} {ratio:.2f}x plain decoding per step as measured here: {name} runs, "
                    f"a plain step every {self.PLAIN_PROBE + 1} re-measures it")
        return (f"{name} measured {ratio:.2f}x plain decoding per step here (drafts too rarely kept at these "
                f"settings): plain steps run, {name} is tried again after {self._wait} of them")


class GatedStepper:
    """A method's stepper behind a :class:`MethodGate`: a step the gate gives to plain decoding is one target
    pass with nothing drafted (``StepRecord.paused``); the drafter's caches catch up when it runs next
    (an EAGLE-3 head over every row it missed, a draft model over the tokens it lacks).

    A step is timed from its call to the next call: what the loop and its reader do with a step's tokens
    (detokenising, streaming them out: about a millisecond a step on a CPU) is paid per step, not per token,
    and counts against plain decoding as it does in the tokens/s a user sees."""

    def __init__(self, inner: ChainStepper | TreeStepper, gate: MethodGate) -> None:
        self.inner, self.gate = inner, gate
        # The method's first step of a generation, or after plain steps, is not timed: it also feeds its drafter
        # what it missed (an EAGLE-3 head's catch-up over 17 rows cost SmolLM2's 4 ms on top of a 21 ms step), a
        # cost of switching, not of running it. So a probe of such a method is two steps, the second one timed.
        self._catching_up = True
        self._pending: tuple[bool, int, float] | None = None  # the last step: method?, tokens, when it began

    def __call__(self, s: DecodeState, budget: int) -> tuple[list[int], StepRecord]:
        t0 = time.perf_counter()
        if self._pending is not None:
            method, tokens, began = self._pending
            self.gate.record(method, tokens, t0 - began)
        method = self.gate.method_now()
        if method:
            tokens, record = self.inner(s, budget)
        else:
            tokens, record = plain_step(s)
            s.hidden = s.target.hidden[-1]  # Medusa reads the last accepted token's hidden state
            record = replace(record, paused=True)
        self._pending = None if method and self._catching_up else (method, len(tokens), t0)
        # a lookup (proposes_for_free) has nothing to catch up: its probes are one step, every one timed
        self._catching_up = not method and not s.drafter.proposes_for_free
        return tokens, record
