"""Bounds on one chat-template render: time, output size, and the sizes a template may build on the way.

A bundle's template is code from whoever shared the bundle. Jinja's sandbox keeps it away from Python's internals
but not from the CPU or the memory: two nested ``range(100000)`` loops run for hours on the thread that renders
(a server's only generator thread), and ``"x" * 10**10`` or a string doubled 40 times exhausts the memory. Here:

- **time**: a trace function, on the rendering thread only and only while it renders, checks the clock at every
  line the template (or Jinja's Python code under it) runs, and aborts past ``time_s``;
- **output**: the render is consumed piece by piece and aborted past ``max_chars``;
- **one step**: the operators that make big values in one C call (``*``, ``**``, ``+``, ``%``) and every call and
  filter are checked before they run: no sequence or argument beyond ``max_chars``, no integer beyond
  ``MAX_INT_BITS``, no format width beyond ``max_chars``; and what a call returns is checked after;
- **depth**: calls nested in calls (a macro that calls itself) stop at ``max_depth``, long before Python's own
  recursion limit;
- **memory**: the trace also watches the process's peak resident size, sampled every millisecond, and aborts a
  render that raised it by more than ``memory_bytes`` (growth through ``~`` or ``{% set %}`` blocks in a loop).

What stays: a single C call under those sizes (a sort of 4 M items) runs to its end, and the memory check reads
the peak, so a process that once peaked higher may grow up to that peak before it notices. The server's request
time limit and its ``/health`` are the backstop for what gets through.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

try:
    import resource
except ImportError:  # Windows: no peak-RSS reading; the other bounds hold
    resource = None  # type: ignore[assignment]

MAX_INT_BITS = 1 << 16  # a template's integers: far past any count or index, far below a slow multiplication
_MEMORY_SAMPLE_S = 0.001
_RSS_UNIT = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class RenderLimits:
    time_s: float = 2.0  # real templates render in milliseconds
    max_chars: int = 4 << 20  # the prompt, and any one string, list or argument a template builds
    memory_bytes: int = 256 << 20  # growth of the process's peak resident size during one render
    # Calls nested inside calls (a macro calling itself): real templates nest a few levels (a tool schema's
    # properties); each level costs ~7 Python frames, so 64 stay far from the interpreter's limit of 1000, where
    # a RecursionError would run unrelated finalizers (and their warnings) at the very bottom of the stack.
    max_depth: int = 64


class LimitExceeded(BaseException):
    """A render went past a :class:`RenderLimits` bound. A BaseException, so that no ``except Exception`` in Jinja
    or in a filter takes it for the template's own error and carries on (the trace function is gone by then)."""


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _RSS_UNIT if resource is not None else 0


@contextlib.contextmanager
def time_and_memory(limits: RenderLimits) -> Iterator[None]:
    """Abort what runs on this thread inside the block, at its next Python line, once it is past ``limits.time_s``
    or has raised the peak resident size by ``limits.memory_bytes``."""
    deadline = time.perf_counter() + limits.time_s
    rss_limit = _peak_rss() + limits.memory_bytes
    next_sample = 0.0

    def check(frame: Any, event: str, arg: Any) -> Callable:
        nonlocal next_sample
        now = time.perf_counter()
        if now > deadline:
            raise LimitExceeded(f"it ran longer than {limits.time_s:g} s")
        if now >= next_sample:
            next_sample = now + _MEMORY_SAMPLE_S
            if resource is not None and _peak_rss() > rss_limit:
                raise LimitExceeded(f"it used more than {limits.memory_bytes >> 20} MiB of memory")
        return check

    previous = sys.gettrace()  # a debugger's or coverage's: it misses the render's lines, and comes back after
    _settrace(check)
    try:
        yield
    finally:
        _settrace(previous)


# CPython up to 3.11 refuses sys.settrace on one thread while another thread is inside it ("Cannot install a trace
# function while another trace function is being installed", a RuntimeError): two renders starting at once on a
# server's threads met it. Only the call itself is serialized; the renders still run side by side.
_SETTRACE_LOCK = threading.Lock()


def _settrace(function: Callable | None) -> None:
    with _SETTRACE_LOCK:
        sys.settrace(function)


def check_size(value: Any, limits: RenderLimits) -> Any:
    """``value``, unless it is a sequence or integer beyond the limits."""
    if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > limits.max_chars:
        raise LimitExceeded(f"it built a value of {len(value)} items (limit {limits.max_chars})")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise LimitExceeded(f"it built an integer of {value.bit_length()} bits (limit {MAX_INT_BITS})")
    return value


def check_arguments(args: tuple, kwargs: dict, limits: RenderLimits) -> None:
    """No width, count or repetition beyond ``max_chars`` reaches a function: ``"x"|center(10**10)``,
    ``lipsum(10**9)``, ``s.ljust(n)`` would build the value in one call, before anything could check it."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limits.max_chars:
            raise LimitExceeded(f"it passed {value} to a function (limit {limits.max_chars})")
        check_size(value, limits)


def check_format(template: Any, limits: RenderLimits) -> None:
    """A format string's widths and precisions (``"%99999999999s"``, ``"{:>99999999999}"``) within ``max_chars``."""
    if isinstance(template, str) and any(int(n) > limits.max_chars for n in _NUMBER.findall(template)):
        raise LimitExceeded(f"it formats with a width beyond {limits.max_chars}")


def check_binop(operator: str, left: Any, right: Any, limits: RenderLimits) -> None:
    """The size of ``left <operator> right`` before it is computed."""
    sequence = (str, list, tuple)
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, sequence) and isinstance(n, int) and len(seq) * n > limits.max_chars:
                raise LimitExceeded(f"it repeats a sequence of {len(seq)} {n} times (limit {limits.max_chars})")
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise LimitExceeded(f"it multiplies integers beyond {MAX_INT_BITS} bits")
    elif operator == "**":
        if (isinstance(left, int) and isinstance(right, int) and abs(left) > 1
                and right * left.bit_length() > MAX_INT_BITS):
            raise LimitExceeded(f"it raises an integer to a power beyond {MAX_INT_BITS} bits")
    elif operator == "+":
        if isinstance(left, sequence) and isinstance(right, sequence) and len(left) + len(right) > limits.max_chars:
            raise LimitExceeded(f"it joins sequences beyond {limits.max_chars} items")
    elif operator == "%":
        check_format(left, limits)


def guarded(function: Callable, limits: RenderLimits, formats: bool = False) -> Callable:
    """``function`` (a filter) with its arguments checked before it runs and its result after; ``formats``: its
    first argument is a format string (the ``format`` filter)."""

    @functools.wraps(function)  # keeps jinja_pass_arg: a filter that wants the context still gets it
    def call(*args: Any, **kwargs: Any) -> Any:
        check_arguments(args[1:], kwargs, limits)  # args[0]: the value filtered (or the context), checked already
        if formats and args:
            check_format(args[0], limits)
        return check_size(function(*args, **kwargs), limits)

    return call
