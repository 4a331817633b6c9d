"""`specrt serve` under load and at its end: the bounded queue and its 429, clients that leave, the API key,
the soak of 320 mixed requests, and SIGTERM's drain. Servers as in test_serve.py: loopback, one thread.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("starlette", reason="needs the serve extra: pip install -e '.[serve,dev]'")
openai = pytest.importorskip("openai", reason="needs the dev extra (the OpenAI client)")

from support import soak  # noqa: E402
from support.servers import DEMO, LONG_PROMPT, Server, error_of, open_stream, read_events, stopped_cleanly  # noqa: E402

import specrt  # noqa: E402

KEY = "test-key-123"

# --- queue, disconnects, API key -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    """One request may wait besides the running one; an API key is required."""
    s = Server(tmp_path_factory.mktemp("tight"), "--max-queue", "1", "--api-key", KEY)
    yield s
    stopped_cleanly(s)


def test_api_key(tight):
    with pytest.raises(openai.AuthenticationError):
        tight.client().models.list()
    with pytest.raises(openai.AuthenticationError):
        tight.client(api_key="wrong").completions.create(model=DEMO, prompt="x", max_tokens=1)
    response = tight.request("POST", "/v1/completions", {"model": DEMO, "prompt": "x"})
    assert response[0] == 401 and response[1]["www-authenticate"] == "Bearer"
    assert error_of(response)["code"] == "invalid_api_key"
    assert tight.client(api_key=KEY).completions.create(model=DEMO, prompt="x", max_tokens=1).choices
    assert tight.get("/health")[0] == 200  # probes need no key


def test_full_queue_429_and_disconnects_free_the_slot(tight, demo_gen):
    auth = {"Authorization": f"Bearer {KEY}"}
    before = tight.metrics()
    long = open_stream(tight, {"model": DEMO, "prompt": LONG_PROMPT, "max_tokens": 1000, "temperature": 0}, auth)
    resp = long.getresponse()  # headers come once its generation has started
    assert resp.status == 200 and resp.readline().startswith(b"data: ")
    waiting = open_stream(tight, {"model": DEMO, "prompt": "x", "max_tokens": 4}, auth)
    tight.wait_for(lambda: tight.health()["queue_depth"] == 1, "the second request to queue")

    with pytest.raises(openai.RateLimitError) as full:
        tight.client(api_key=KEY).completions.create(model=DEMO, prompt="x", max_tokens=4)
    assert int(full.value.response.headers["retry-after"]) >= 1
    assert full.value.body["code"] == "queue_full"

    waiting.close()  # a queued client leaves: its slot frees at once
    tight.wait_for(lambda: tight.health()["queue_depth"] == 0, "the abandoned request to leave the queue")
    prompt = "def step_3(x):"
    next_one = open_stream(tight, {"model": DEMO, "prompt": prompt, "max_tokens": 12, "temperature": 0}, auth)
    tight.wait_for(lambda: tight.health()["queue_depth"] == 1, "the next request to take the slot")
    assert tight.health()["busy"]

    long.close()  # the running client leaves: its generation stops at the next step, the queue moves
    resp = next_one.getresponse()
    events = read_events(resp)
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == demo_gen.generate(prompt, max_new_tokens=12).text
    next_one.close()
    after = tight.metrics()

    def delta(name, labels=()):
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    # The long generation ended as cancelled (a finished one would count under "length" after ~10 s).
    assert delta("specrt_generations_total", (("finish", "cancelled"),)) == 1
    assert delta("specrt_generations_total", (("finish", "length"),)) == 1  # the one that took the slot
    assert delta("specrt_requests_total", (("endpoint", "completions"), ("status", "disconnected"))) == 2
    assert delta("specrt_requests_total", (("endpoint", "completions"), ("status", "429"))) == 1
    assert delta("specrt_generated_tokens_total") == 12


# --- the soak (tests/support/soak.py; the same against the Ray replicas in test_cluster.py) ------------------

def test_soak_320_mixed_requests_lose_nothing_and_leak_nothing(tmp_path):
    """320 requests from 8 clients on a bundle serving completions and chat: each ends in its exact answer or the
    error it provoked; the clients that leave have their generations cancelled; the process's RSS stays put."""
    bundle = soak.chat_demo(tmp_path / "demo-chat")
    reference = soak.Reference(specrt.load(bundle, threads=1))
    s = Server(tmp_path, "--bundle", str(bundle), "--api-key", KEY, "--method", soak.METHOD)
    try:
        soak.check(soak.run_soak(s, reference, "demo-chat", KEY, soak.plan(32, seed=1)))  # warm-up: every path
        rss, before = soak.rss_bytes(s.proc.pid), s.metrics()
        report = soak.run_soak(s, reference, "demo-chat", KEY, soak.plan(320, seed=2))
        soak.wait_idle(s, replicas=1)
        growth, after = soak.rss_bytes(s.proc.pid) / rss - 1, s.metrics()
    finally:
        stopped_cleanly(s)
    print(f"soak, one process: {report.summary()}; RSS {rss / 2**20:.0f} MiB, {growth:+.1%}")
    soak.check(report)  # one process: no error for any good request
    assert report.count()["exact"] >= 200 and report.wall_s < 120, report.summary()
    left = sum(o.job.kind == "leave" and o.job.streamed for o in report.outcomes)
    cancelled = ("specrt_generations_total", (("finish", "cancelled"),))
    assert after[cancelled] - before.get(cancelled, 0) >= left  # each stream that lost its client stopped early
    assert growth < 0.10, f"RSS grew {growth:.1%} over the soak"


# --- shutdown --------------------------------------------------------------------------------------------------

def test_sigterm_drains_in_flight_streams_and_exits_0(tmp_path, demo_gen):
    s = Server(tmp_path)
    conn = open_stream(s, {"model": DEMO, "prompt": "import os", "max_tokens": 120, "temperature": 0})
    resp = conn.getresponse()
    assert resp.status == 200
    s.terminate()
    events = read_events(resp)
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == demo_gen.generate(
        "import os", max_new_tokens=120).text
    stopped_cleanly(s)


def test_sigterm_cancels_what_outlasts_the_drain_timeout(tmp_path):
    s = Server(tmp_path, "--drain-timeout", "0.5")
    conn = open_stream(s, {"model": DEMO, "prompt": LONG_PROMPT, "max_tokens": 1000, "temperature": 0})
    resp = conn.getresponse()
    assert resp.status == 200
    t0 = time.monotonic()
    s.terminate()
    events = read_events(resp)
    assert "[DONE]" not in events  # cut off, not finished
    stopped_cleanly(s)
    assert time.monotonic() - t0 < 6  # the 1000-token generation (~10 s) did not run to its end
