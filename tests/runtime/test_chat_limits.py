"""A chat template is code from whoever shared the bundle: one that runs too long, writes too much or builds a huge
value is stopped with a one-line ChatTemplateError, quickly, and real templates still render (test_chat.py compares
them with transformers under these very limits)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from specrt.errors import ChatTemplateError
from specrt.runtime.chat import ChatTemplate
from specrt.runtime.chat_limits import RenderLimits

MESSAGES = [{"role": "user", "content": "hi"}]
LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
DOUBLE = "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s OP ns.s %}{% endfor %}"


def _stopped(source: str, match: str, limits: RenderLimits = RenderLimits(), within: float = 10.0) -> None:
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match=match) as e:
        ChatTemplate(source, limits=limits).render(MESSAGES)
    assert "\n" not in str(e.value)
    assert time.monotonic() - t0 < within


def test_nested_loops_stop_at_the_time_limit():
    t0 = time.monotonic()
    _stopped(LOOPS, "ran longer than 0.3 s", RenderLimits(time_s=0.3), within=3)
    assert time.monotonic() - t0 >= 0.3
    _stopped(LOOPS, "ran longer than 2 s")  # the default
    assert sys.gettrace() is None or sys.gettrace().__name__ != "check"  # the trace function is gone again


@pytest.mark.parametrize("source,match", [
    (LOOPS.replace("{% endfor %}{% endfor %}", "{{ messages[0].content * 1000 }}{% endfor %}{% endfor %}"),
     "wrote more than 4194304"),
    ("{{ 'x' * 10000000000 }}", "repeats a sequence"),
    ("{{ [1, 2] * 10000000000 }}", "repeats a sequence"),
    ("{{ 3 ** 100000000 }}", "power"),
    ("{% set ns = namespace(x=3) %}{% for i in range(60) %}{% set ns.x = ns.x * ns.x %}{% endfor %}", "multiplies"),
    (DOUBLE.replace("OP", "+"), "joins sequences"),
    ("{{ 'x'|center(10000000000) }}", "passed 10000000000"),  # folded while compiling
    ("{{ messages[0].content.ljust(10000000000) }}", "passed 10000000000"),
    ("{{ messages[0].content|center(10000000000) }}", "passed 10000000000"),
    ("{{ '%99999999999s'|format(messages[0].content) }}", "width"),
    ("{{ '%99999999999s' % messages[0].content }}", "width"),
    ("{{ '{:>99999999999}'.format(messages[0].content) }}", "width"),
    ("{% set ns = namespace(s='aaaaaaaa') %}{% for i in range(20) %}{% set ns.s = ns.s|replace('a', 'aaaaaaaa') %}"
     "{% endfor %}", "built a value"),
    ("{{ lipsum(n=3000000) }}", "ran longer"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "nested calls more than 64 deep"),
    ("{% for m in messages recursive %}{{ loop([m]) }}{% endfor %}", "nested calls more than 64 deep"),
])
def test_a_template_that_builds_too_much_is_stopped(source, match):
    _stopped(source, match, RenderLimits(time_s=1.0))


def test_calls_nest_up_to_the_depth_limit_and_the_count_unwinds():
    # A macro walking a nested tool schema recurses a few levels; 60 is well within the limit of 64.
    source = "{% macro f(n) %}{% if n > 0 %}({{ f(n - 1) }}){% endif %}{% endmacro %}{{ f(N) }}"
    deep = ChatTemplate(source.replace("N", "messages|length * 60"))
    assert deep.render(MESSAGES) == "(" * 60 + ")" * 60
    with pytest.raises(ChatTemplateError, match="more than 64 deep"):
        deep.render(MESSAGES * 2)  # 120 levels
    assert deep.render(MESSAGES) == "(" * 60 + ")" * 60  # a stopped render left no depth behind
    assert ChatTemplate(source.replace("N", "70"), limits=RenderLimits(max_depth=80)).render(MESSAGES) == "(" * 70 + ")" * 70


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the memory bound reads the peak RSS (Linux units)")
@pytest.mark.parametrize("source", [
    DOUBLE.replace("OP", "~"),
    DOUBLE.replace("{% set ns.s = ns.s OP ns.s %}", "{% set t %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = t %}"),
])
def test_a_string_doubled_in_a_loop_stops_at_the_memory_bound(source):
    # `~` and {% set %} blocks join in one C call no operator hook sees: the peak-RSS watch stops them (or the
    # clock, on a machine slow enough to take 5 s over 64 MiB).
    _stopped(source, "more than 64 MiB|longer than", RenderLimits(time_s=5, memory_bytes=64 << 20))


def test_real_templates_and_long_conversations_render_within_the_limits():
    from pathlib import Path

    source = (Path(__file__).parents[1] / "data" / "chat_templates" / "llama-3-instruct.jinja").read_text()
    conversation = [{"role": r, "content": "word " * 2000} for r in ("user", "assistant") * 100] + MESSAGES
    t0 = time.monotonic()
    out = ChatTemplate(source, {"bos_token": "<s>"}).render(conversation)
    assert len(out) > 2_000_000 and time.monotonic() - t0 < 1.5


def test_renders_on_two_threads_bound_each_other_not():
    # The trace function is per thread: a bomb on one thread does not stop a good render on another.
    good, results = ChatTemplate("{{ messages[0].content }}"), []

    def render_good():
        results.extend(good.render(MESSAGES) for _ in range(200))

    thread = threading.Thread(target=render_good)
    thread.start()
    _stopped(LOOPS, "longer than 0.5", RenderLimits(time_s=0.5))
    thread.join(10)
    assert results == ["hi"] * 200


def test_renders_starting_at_once_never_overlap_in_settrace(monkeypatch):
    # CPython <= 3.11 raises a RuntimeError when one thread calls sys.settrace while another is inside it; a
    # server starting two renders at once met it. Here each settrace call dwells a moment: no two may overlap.
    real, inside, overlaps = sys.settrace, [], []

    def dwelling_settrace(function):
        inside.append(1)
        if len(inside) > 1:
            overlaps.append(1)
        time.sleep(0.001)  # lets the other thread run into its own call
        inside.pop()
        real(function)

    monkeypatch.setattr(sys, "settrace", dwelling_settrace)
    template = ChatTemplate("{{ messages[0].content }}")
    results = []
    threads = [threading.Thread(target=lambda: results.extend(template.render(MESSAGES) for _ in range(50)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert results == ["hi"] * 100 and not overlaps
