"""One generator, one thread, requests in arrival order.

The generator is not thread-safe and serves one sequence at a time (batch size 1, the edge norm), so a
single worker thread owns it and takes jobs from a bounded FIFO. A job hands its events (start, text
pieces, end) to the event loop that waits for them through ``loop.call_soon_threadsafe``; the web side
never touches the generator. Cancelling a job (its client went away, the server stops, or the job ran
past its wall-clock limit) takes it out of the queue at once, or stops its generation at the next piece the
generator yields, i.e. the next step. A generator that does not come back from a step long after its job's
limit is reported as stuck (:attr:`Scheduler.stuck`): ``/health`` fails, so a supervisor can replace it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..errors import ContextLengthError, SpecrtError
from ..runtime.options import DecodeOptions
from .metrics import ServeMetrics
from .protocol import ApiError, GenerationRequest

log = logging.getLogger("specrt.serve")

# A cancelled generation stops at its next step; one that has not stopped this long after its job's deadline is
# not coming back (a template or a backend call that never returns). Generous: one prefill on a small board can
# take several seconds, and a false alarm gets a healthy replica replaced.
STUCK_GRACE_S = 30.0


@dataclass(frozen=True)
class Started:
    prompt_tokens: int


@dataclass(frozen=True)
class Piece:
    text: str


@dataclass(frozen=True)
class Finished:
    result: Any  # GenerationResult


@dataclass(frozen=True)
class Failed:
    error: ApiError


Event = Started | Piece | Finished | Failed


class QueueFull(Exception):
    """The bounded queue holds ``max_queue`` waiting requests already."""


def timed_out(timeout_s: float) -> ApiError:
    """What a request past its wall-clock limit ends with, queued or generating."""
    return ApiError(504, f"the request took longer than the server's limit of {timeout_s:g} s (--request-timeout)",
                    code="request_timeout")


@dataclass(eq=False)
class Job:
    """A request in the queue or on the generator; ``events`` is read on the event loop only."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    timeout_s: float = math.inf  # wall clock from submission to the last event (--request-timeout)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)

    @property
    def deadline(self) -> float:
        return self.submitted + self.timeout_s

    def expired(self) -> bool:
        return time.perf_counter() > self.deadline

    def emit(self, event: Event) -> None:
        """Called from the worker thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop has closed: nobody is left to read it
            self.cancelled.set()

    async def next_event(self) -> Event:
        """The next event, or :func:`timed_out` once the deadline has passed (the job is cancelled then, so the
        generator drops it at its next step). Called on the event loop."""
        try:
            return await asyncio.wait_for(self.events.get(), max(0.0, self.deadline - time.perf_counter()))
        except asyncio.TimeoutError:
            self.cancelled.set()
            return Failed(timed_out(self.timeout_s))


def _hide(message: str, secrets: tuple[str, ...]) -> str:
    """Error bodies never carry file paths: the bundle's location is replaced by a neutral word."""
    for s in secrets:
        message = message.replace(s, "<bundle>")
    return message


class Scheduler:
    """The bounded FIFO and the thread that serves it with ``gen``.

    ``options`` (the server's ``--method`` / ``--gamma`` / ``--tree``) apply to every request; sampling settings,
    length, seed and stop strings come with each. ``max_queue`` counts waiting requests, not the one being
    generated."""

    def __init__(self, gen: Any, max_queue: int, metrics: ServeMetrics,
                 options: DecodeOptions = DecodeOptions(), stuck_after_s: float = STUCK_GRACE_S) -> None:
        self.gen, self.max_queue, self.metrics, self.options = gen, max_queue, metrics, options
        self.stuck_after_s = stuck_after_s  # past a running job's deadline: see :attr:`stuck`
        self._waiting: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._running: Job | None = None
        self._stopping = False
        self._service_s = 1.0  # moving average of a generation's duration: the Retry-After estimate
        self._thread = threading.Thread(target=self._serve, name="specrt-generator", daemon=True)
        bundle = getattr(gen, "bundle", None)
        self._paths = tuple(sorted({str(bundle), str(bundle.resolve())}, key=len, reverse=True)) if bundle else ()

    # --- the event loop's side --------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job`` behind the others, or raise :class:`QueueFull`."""
        with self._cond:
            if self._stopping:
                raise ApiError(503, "the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull()
            self._waiting.append(job)
            self.metrics.queue_depth.set(len(self._waiting))
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Stop ``job``: out of the queue now, or off the generator at its next step. Idempotent."""
        job.cancelled.set()
        with self._cond:
            if job in self._waiting:
                self._waiting.remove(job)
                self.metrics.queue_depth.set(len(self._waiting))

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the queue moves when the running generation ends."""
        return max(1, math.ceil(self._service_s))

    @property
    def depth(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        return self._running is not None

    @property
    def stuck(self) -> bool:
        """The generator has held one job ``stuck_after_s`` past that job's deadline: it will not serve again."""
        job = self._running
        return job is not None and time.perf_counter() > job.deadline + self.stuck_after_s

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is queued and running, and wait for the thread (blocking: call it off the loop)."""
        with self._cond:
            self._stopping = True
            waiting, self._waiting = list(self._waiting), collections.deque()
            if self._running is not None:
                self._running.cancelled.set()
            self.metrics.queue_depth.set(0)
            self._cond.notify_all()
        for job in waiting:
            job.cancelled.set()
            job.emit(Failed(ApiError(503, "the server is shutting down")))
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the worker thread -------------------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                job = self._running = self._waiting.popleft()
                self.metrics.queue_depth.set(len(self._waiting))
            t0 = time.perf_counter()
            self.metrics.busy.set(1)
            try:
                if job.expired():  # its whole time went by in the queue
                    job.cancelled.set()
                    job.emit(Failed(timed_out(job.timeout_s)))
                elif not job.cancelled.is_set():
                    self.metrics.queue_wait.observe(t0 - job.submitted)
                    self._run(job)
            finally:
                self.metrics.busy.set(0)
                with self._cond:
                    self._running = None
                self._service_s = 0.8 * self._service_s + 0.2 * (time.perf_counter() - t0)

    def _pieces(self, req: GenerationRequest) -> tuple[int, Iterator[str]]:
        """The prompt's length in tokens and the generation's text pieces (nothing runs until iterated)."""
        gen = self.gen
        ids = gen.encode_chat(req.messages) if req.is_chat else gen.encode(req.prompt)
        n_prompt = len(ids)
        max_new = req.max_tokens
        if max_new is None:  # "as long as the context allows", OpenAI's chat default
            max_new = gen.max_context - n_prompt
            if max_new < 1:
                raise ContextLengthError(f"the prompt ({n_prompt} tokens) fills the model's context of "
                                         f"{gen.max_context} tokens")
        return n_prompt, gen.stream_ids(ids, self.options.replace(
            max_new_tokens=max_new, temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=req.seed,
            stop=tuple(req.stop)))

    def _run(self, job: Job) -> None:
        pieces: Iterator[str] | None = None
        try:
            n_prompt, pieces = self._pieces(job.request)
            if not self._emit_pieces(job, n_prompt, pieces):
                self.metrics.generations.labels(finish="cancelled").inc()
                # Read only when the server, not the client, ended it (shutdown, the time limit): it hears why.
                job.emit(Failed(timed_out(job.timeout_s) if job.expired() else
                                ApiError(503, "the generation was cancelled: the server is shutting down")))
                return
            result = pieces.result
            self.metrics.record(n_prompt, result)
            job.emit(Finished(result))
        except SpecrtError as e:
            status, code = (400, "context_length_exceeded") if isinstance(e, ContextLengthError) else (
                (400, None) if isinstance(e, ValueError) else (500, None))
            self.metrics.generations.labels(finish="failed").inc()
            job.emit(Failed(ApiError(status, _hide(str(e), self._paths), code=code)))
        except Exception:  # one request's bug must not take the server down: log it, answer 500, serve on
            log.exception("generation failed")
            self.metrics.generations.labels(finish="failed").inc()
            job.emit(Failed(ApiError(500, "internal error while generating (details are in the server log)")))
        finally:
            if pieces is not None and hasattr(pieces, "close"):
                pieces.close()  # a generation stopped early releases its generator frame here, on this thread

    def _emit_pieces(self, job: Job, n_prompt: int, pieces: Iterator[str]) -> bool:
        """Send ``Started`` and the text pieces until the generation ends (True), or the job is cancelled or its
        time is up (False).

        ``pieces`` is iterated once, by one ``for``: a generation that yields nothing (a stop string at its very
        start) is simply an empty answer."""
        started = False
        for piece in pieces:
            if not started:
                # Sent after the first step: errors raised by the generator's checks or its first step (a prompt
                # beyond the context, a bad setting) still become a plain 400 instead of a broken 200.
                started = True
                job.emit(Started(n_prompt))
                self.metrics.first_token.observe(time.perf_counter() - job.submitted)
            job.emit(Piece(piece))
            if job.cancelled.is_set() or job.expired():
                return False
        if not started:
            job.emit(Started(n_prompt))
        return True
