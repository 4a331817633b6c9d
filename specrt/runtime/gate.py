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
    first step does not stand for many. :attr:`MethodGate.ratio` is one too, its "seconds" counted in the
    tokens plain decoding would have given in them."""

    tokens: float | None = None
    seconds: float | None = None
    samples: int = 0

    def add(self, tokens: float, seconds: float, weight: float) -> None:
        self.samples += 1
        weight = max(weight, 1.0 / self.samples)
        self.tokens = theory.moving_average(self.tokens, float(tokens), weight)
        self.seconds = theory.moving_average(self.seconds, seconds, weight)

    def anchor(self, value: float) -> None:
        """Make the rate ``value`` now, its tokens' scale kept (what a step keeps), so the next steps move it
        as they would have moved a rate measured at ``value``."""
        if self.tokens and value > 0:
            self.seconds = self.tokens / value

    @property
    def value(self) -> float:
        return self.tokens / self.seconds if self.tokens is not None and self.seconds else 0.0


class MethodGate:
    """Which of the method's step and a plain step to run next, from their measured rates. Kept by the
    generator per method and sampling settings across generations, so a server learns it once.

    First :attr:`WARM_METHOD` steps of the method and :attr:`WARM_PLAIN` plain ones, back to back; then the
    method runs while its rate is at least :attr:`KEEP` of plain decoding's, else plain steps until it measures
    :attr:`RESUME` (as fast as plain decoding). The kind not running is probed, one timed step: plain decoding
    after :attr:`PLAIN_PROBE` method steps (its rate only drifts, with the context's length), the method after
    :attr:`METHOD_PROBE` plain steps, twice as many after a probe that finds it slower, half as many after one
    that finds it faster by more than the noise, within [:attr:`METHOD_PROBE`, :attr:`METHOD_PROBE_MAX`] (a
    probe, two steps of the method as :class:`GatedStepper` times them, costs about 2 (c + v(rows)) plain
    steps: a method that keeps losing costs about 1 %).

    The machine's speed drifts (a busy neighbour: SmolLM2's plain rate went from 125 to 78 tokens/s within two
    minutes on a shared 2-core VM), so a rate measured a hundred steps ago is not comparable with one measured
    now. Each decision reads rates measured together:

    - while the method runs, its rate is current, and a plain probe is a step beside it; when its rate falls
      below KEEP of plain decoding's (which may date from a faster time), plain decoding is re-measured from
      scratch (WARM_PLAIN steps) and the two are compared afresh, so a slower machine does not switch off a
      method that still wins;
    - while plain steps run, each method probe's tokens are weighed against the tokens plain decoding gives in
      the same seconds *now* (:attr:`ratio`), so a slower machine does not make a method measured in a faster
      time look better: on SmolLM2's int4 head at T 0.7 that switched a 0.88x tree on for 130 steps.

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
    # ...and at or above which a method switched off runs again. At KEEP, prompt lookup at T 1 on SmolLM2's chat
    # (about 0.96x, its host work) flipped on and off around the threshold and ran 0.97x plain decoding.
    RESUME = 1.0
    PLAIN_PROBE = 64
    METHOD_PROBE = 24
    # At most this many plain steps between probes of a losing method: at 96, SmolLM2's head at T 0.7 spent 5 %
    # of auto's time in probes (the head's catch-up over the rows it sat out is most of a probe's cost).
    METHOD_PROBE_MAX = 192

    def __init__(self) -> None:
        self.method, self.plain = Rate(), Rate()
        # While plain steps run: the method's tokens over the tokens plain decoding gave in as many seconds at
        # the time of each probe; its value is the method's rate over plain decoding's, free of the drift.
        self.ratio = Rate()
        self.on = True  # the method is the kind that runs (probes of plain decoding aside)
        self._run = 0  # steps of the running kind since the other last ran
        self._wait = self.METHOD_PROBE  # plain steps before the next probe of a losing method

    @property
    def warm(self) -> bool:
        return self.method.samples >= self.WARM_METHOD and self.plain.samples >= self.WARM_PLAIN

    def method_now(self) -> bool:
        """Whether the next step is the method's."""
        if self.method.samples < self.WARM_METHOD:
            return True
        if self.plain.samples < self.WARM_PLAIN:  # warming up, or plain decoding re-measured after a switch
            return False
        return self._run < self.PLAIN_PROBE if self.on else self._run >= self._wait

    def record(self, method: bool, tokens: int, seconds: float) -> None:
        if not self.warm:
            (self.method if method else self.plain).add(tokens, seconds, self.WEIGHT)
            if self.warm:  # both rates measured back to back: comparable
                self._judge()
        elif method == self.on:  # a step of the running kind
            (self.method if method else self.plain).add(tokens, seconds, self.WEIGHT)
            self._run += 1
            if method:
                self._remeasure_if_behind()
        elif method:  # a probe of the method, weighed against plain decoding's rate now
            self._run = 0
            self.ratio.add(tokens, seconds * self.plain.value, self.WEIGHT)
            self.method.add(tokens, seconds, self.WEIGHT)  # keeps its tokens' scale current for anchor()
            faster = self.KEEP * tokens >= seconds * self.plain.value  # beat plain decoding beyond the noise
            self._wait = max(self.METHOD_PROBE, min(self._wait * 2 if not faster else self._wait // 2,
                                                    self.METHOD_PROBE_MAX))
            if self.ratio.value >= self.RESUME:
                self.method.anchor(self.ratio.value * self.plain.value)
                self.on, self._wait = True, self.METHOD_PROBE
        else:  # a probe of plain decoding, beside the method's current rate
            self._run = 0
            self.plain.add(tokens, seconds, self.WEIGHT)
            self._remeasure_if_behind()

    def _remeasure_if_behind(self) -> None:
        """The running method below KEEP of plain decoding's rate: plain decoding is measured again, from
        scratch, before the two are judged (:meth:`_judge`): its rate may date from a faster machine."""
        if self.method.value < self.KEEP * self.plain.value:
            self.plain = Rate()

    def _judge(self) -> None:
        """Both rates fresh: which runs, and the ratio the method's probes move from here."""
        self.ratio = Rate(self.method.tokens, (self.method.seconds or 0.0) * self.plain.value,
                          samples=round(1 / self.WEIGHT))
        self.on, self._run = self.ratio.value >= self.KEEP, 0

    @property
    def speed(self) -> float:
        """The method's rate over plain decoding's, as last judged."""
        if self.on or not self.ratio.samples:
            return self.method.value / self.plain.value if self.plain.value else 0.0
        return self.ratio.value

    def describe(self, name: str) -> str:
        """One line: the rates, and what runs."""
        if not self.ratio.samples:
            return f"{name} only (plain decoding not measured yet)"
        if self.plain.samples < self.WARM_PLAIN:
            return (f"{name} measured below plain decoding's last rate: plain decoding is being measured again "
                    f"before {name} is judged")
        if self.on:
            return (f"{name} {self.speed:.2f}x plain decoding per step as measured here: {name} runs, "
                    f"a plain step every {self.PLAIN_PROBE + 1} re-measures it")
        return (f"{name} measured {self.speed:.2f}x plain decoding per step here (drafts too rarely kept at these "
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
