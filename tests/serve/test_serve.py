"""`specrt serve`: real server processes on loopback, driven by the official OpenAI client and raw HTTP.

Every server binds 127.0.0.1 on a free port, runs with one intra-op thread and stops with SIGTERM (exit 0
checked). The demo bundle serves completions; the chat endpoint uses conftest's tiny instruct bundle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("starlette", reason="needs the serve extra: pip install -e '.[serve,dev]'")
openai = pytest.importorskip("openai", reason="needs the dev extra (the OpenAI client)")

from click.testing import CliRunner  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from support import soak  # noqa: E402
from support.servers import ROOT, Server, free_port, hide_modules, open_stream, read_events  # noqa: E402

import specrt  # noqa: E402
from specrt.cli import main  # noqa: E402
from specrt.serve.protocol import FINISH  # noqa: E402

DEMO = "specrt-demo"
LONG_PROMPT = "def fib(n):"  # greedy on the demo runs the full 1000 tokens (no EOS): ~7-10 s on 2 cores
KEY = "test-key-123"


def _stopped_cleanly(server: Server) -> None:
    rc = server.stop()
    assert rc == 0, f"exit code {rc}:\n{server.log.read_text()}"


@pytest.fixture(scope="module")
def demo_gen():
    return specrt.load(threads=1)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve"), "--max-queue", "16")
    yield s
    _stopped_cleanly(s)


# --- completions on the demo bundle --------------------------------------------------------------------------

SAMPLED = dict(temperature=0.8, top_p=0.9, top_k=40, seed=11)


def test_models_and_health(server):
    assert [m.id for m in server.client().models.list().data] == [DEMO]
    assert server.client().models.retrieve(DEMO).id == DEMO
    assert server.health() == {"status": "ok", "model": DEMO, "queue_depth": 0, "max_queue": 16, "busy": False,
                               "replica": "0"}


def test_seeded_completion_equals_generate(server, demo_gen):
    prompt = "def read_lines(path):"
    expected = demo_gen.generate(prompt, max_new_tokens=24, **SAMPLED)
    out = server.client().completions.create(model=DEMO, prompt=prompt, max_tokens=24, temperature=0.8, top_p=0.9,
                                             seed=11, extra_body={"top_k": 40})
    assert out.object == "text_completion" and out.model == DEMO
    assert out.choices[0].text == expected.text
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == len(demo_gen.encode(prompt))
    assert out.usage.completion_tokens == len(expected.token_ids) == 24
    ext = out.specrt  # the extension object
    assert (ext["accepted"], ext["drafted"]) == (expected.stats.accepted, expected.stats.drafted)
    assert ext["tokens_per_target_pass"] == pytest.approx(expected.stats.tokens_per_target_pass)
    assert ext["alpha"] == pytest.approx(expected.stats.alpha_estimate) and ext["method"] == "draft"
    assert ext["replica"] == "0"  # one process: one replica


def test_seeded_stream_equals_generate(server, demo_gen):
    prompt = "class Stack:"
    expected = demo_gen.generate(prompt, max_new_tokens=32, **SAMPLED)
    chunks = list(server.client().completions.create(
        model=DEMO, prompt=prompt, max_tokens=32, temperature=0.8, top_p=0.9, seed=11, extra_body={"top_k": 40},
        stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == expected.text and sum(1 for t in texts if t) > 3  # it streamed, piece by piece
    assert len({c.id for c in chunks}) == 1
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason == "length"
    assert last.specrt["accepted"] == expected.stats.accepted
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 32


def test_greedy_stop_sequence(server, demo_gen):
    expected = demo_gen.generate("def fib(n):", max_new_tokens=40, stop=["string"])
    assert expected.finish_reason == "stop"
    out = server.client().completions.create(model=DEMO, prompt="def fib(n):", max_tokens=40, temperature=0,
                                             stop="string")
    assert out.choices[0].text == expected.text and out.choices[0].finish_reason == "stop"


def test_sixteen_concurrent_streams_all_complete_unmixed(server, demo_gen):
    prompts = [f"def step_{i}(x):" for i in range(16)]
    expected = [demo_gen.generate(p, max_new_tokens=12).text for p in prompts]
    start = threading.Barrier(16)

    def one(prompt: str) -> tuple[str, set]:
        client = server.client()
        start.wait()
        chunks = list(client.completions.create(model=DEMO, prompt=prompt, max_tokens=12, temperature=0, stream=True))
        return "".join(c.choices[0].text for c in chunks), {c.id for c in chunks}

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, prompts))
    assert [text for text, _ in results] == expected
    ids = [i for _, ids in results for i in ids]
    assert len(ids) == 16 and len(set(ids)) == 16  # one id per stream: no chunk crossed into another
    m = server.metrics()
    assert m[("specrt_queue_wait_seconds_count", ())] >= 16 and m[("specrt_queue_depth", ())] == 0


def _error(status_body: tuple[int, dict, bytes]) -> dict:
    status, _, body = status_body
    text = body.decode()
    assert "Traceback" not in text and str(ROOT) not in text and "/site-packages/" not in text
    return json.loads(text)["error"]


@pytest.mark.parametrize("change,param", [
    ({"temperature": -0.5}, "temperature"), ({"temperature": "hot"}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k"), ({"top_k": 2.5}, "top_k"), ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"), ({"seed": -1}, "seed"), ({"seed": "x"}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": 3}, "stop"), ({"n": 2}, "n"), ({"logprobs": 2}, "logprobs"),
    ({"presence_penalty": 0.5}, "presence_penalty"), ({"prompt": [1, 2, 3]}, "prompt"), ({"prompt": None}, "prompt"),
    ({"stream": "yes"}, "stream"), ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"model": None}, "model"),
])
def test_bad_parameters_are_400_naming_them(server, change, param):
    body = {"model": DEMO, "prompt": "x", "max_tokens": 4, **change}
    response = server.request("POST", "/v1/completions", {k: v for k, v in body.items() if v is not None})
    assert response[0] == 400
    error = _error(response)
    assert error["type"] == "invalid_request_error" and error["param"] == param and param in error["message"]


@pytest.mark.parametrize("body,status,match", [
    (b"{not json", 400, "not valid JSON"), (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"model": "gpt-4", "prompt": "x"}).encode(), 404, "does not exist"),
])
def test_malformed_bodies_and_unknown_model(server, body, status, match):
    response = server.request("POST", "/v1/completions", body)
    assert response[0] == status and match in _error(response)["message"]


def test_openai_client_raises_bad_request(server):
    with pytest.raises(openai.BadRequestError, match="top_p"):
        server.client().completions.create(model=DEMO, prompt="x", top_p=3)


def test_prompt_beyond_the_context_is_400(server):
    long_prompt = "def f(x):\n    return x\n" * 400  # far more than the demo's 1024 positions
    response = server.request("POST", "/v1/completions", {"model": DEMO, "prompt": long_prompt, "max_tokens": 4})
    assert response[0] == 400 and _error(response)["code"] == "context_length_exceeded"
    response = server.request("POST", "/v1/completions", {"model": DEMO, "prompt": "x", "max_tokens": 5000})
    assert response[0] == 400 and "max context" in _error(response)["message"]


def test_chat_on_a_bundle_without_template_is_a_clear_400(server):
    with pytest.raises(openai.BadRequestError, match="no chat template") as e:
        server.client().chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "hi"}])
    assert str(ROOT) not in str(e.value)


def test_oversized_body_is_413_and_the_server_serves_on(server):
    response = server.request("POST", "/v1/completions",
                              {"model": DEMO, "prompt": "x" * (1 << 20), "max_tokens": 1})  # default limit: 1 MiB
    assert response[0] == 413 and _error(response)["code"] == "request_too_large"
    assert server.client().completions.create(model=DEMO, prompt="x", max_tokens=2).usage.completion_tokens == 2


def test_unknown_routes_answer_openai_style(server):
    response = server.get("/v1/embeddings")
    assert response[0] == 404 and _error(response)["message"]
    assert server.request("DELETE", "/v1/completions")[0] == 405


def test_metrics_in_prometheus_format(server):
    server.client().completions.create(model=DEMO, prompt="import os", max_tokens=8, temperature=0)
    status, headers, _ = server.get("/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    m = server.metrics()
    assert m[("specrt_requests_total", (("endpoint", "completions"), ("status", "200")))] >= 1
    assert m[("specrt_generated_tokens_total", ())] >= 8 and m[("specrt_prompt_tokens_total", ())] > 0
    assert m[("specrt_target_passes_total", ())] > 0 and m[("specrt_accepted_tokens_total", ())] > 0
    assert m[("specrt_tokens_per_target_pass", ())] > 1  # the draft helps on the demo pair
    assert 0 < m[("specrt_alpha", ())] <= 1 and m[("specrt_tokens_per_second", ())] > 0
    assert m[("specrt_queue_depth", ())] == 0 and m[("specrt_busy", ())] == 0
    assert m[("specrt_request_duration_seconds_count", (("endpoint", "completions"),))] >= 1
    assert ("specrt_time_to_first_token_seconds_bucket", (("le", "+Inf"),)) in m


def test_a_client_that_leaves_mid_generation_cancels_it(server):
    before = server.metrics()
    conn = server.connect()
    body = {"model": DEMO, "prompt": LONG_PROMPT, "max_tokens": 1000, "temperature": 0}
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    server.wait_for(lambda: server.health()["busy"], "the generation to start")
    conn.close()  # a non-streaming client gives up
    server.wait_for(lambda: not server.health()["busy"], "the generation to stop")
    after = server.metrics()
    key = ("specrt_generations_total", (("finish", "cancelled"),))
    assert after.get(key, 0) - before.get(key, 0) == 1  # stopped, not run to its 1000 tokens


# --- queue, disconnects, API key -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    """One request may wait besides the running one; an API key is required."""
    s = Server(tmp_path_factory.mktemp("tight"), "--max-queue", "1", "--api-key", KEY)
    yield s
    _stopped_cleanly(s)


def test_api_key(tight):
    with pytest.raises(openai.AuthenticationError):
        tight.client().models.list()
    with pytest.raises(openai.AuthenticationError):
        tight.client(api_key="wrong").completions.create(model=DEMO, prompt="x", max_tokens=1)
    response = tight.request("POST", "/v1/completions", {"model": DEMO, "prompt": "x"})
    assert response[0] == 401 and response[1]["www-authenticate"] == "Bearer"
    assert _error(response)["code"] == "invalid_api_key"
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
    s = Server(tmp_path, "--bundle", str(bundle), "--api-key", KEY)
    try:
        soak.check(soak.run_soak(s, reference, "demo-chat", KEY, soak.plan(32, seed=1)))  # warm-up: every path
        rss, before = soak.rss_bytes(s.proc.pid), s.metrics()
        report = soak.run_soak(s, reference, "demo-chat", KEY, soak.plan(320, seed=2))
        soak.wait_idle(s, replicas=1)
        growth, after = soak.rss_bytes(s.proc.pid) / rss - 1, s.metrics()
    finally:
        _stopped_cleanly(s)
    print(f"soak, one process: {report.summary()}; RSS {rss / 2**20:.0f} MiB, {growth:+.1%}")
    soak.check(report)  # one process: no error for any good request
    assert report.count()["exact"] >= 200 and report.wall_s < 120, report.summary()
    left = sum(o.job.kind == "leave" and o.job.streamed for o in report.outcomes)
    cancelled = ("specrt_generations_total", (("finish", "cancelled"),))
    assert after[cancelled] - before.get(cancelled, 0) >= left  # each stream that lost its client stopped early
    assert growth < 0.10, f"RSS grew {growth:.1%} over the soak"


# --- one failing request, in-process (a broken generator is not something a real bundle offers on cue) ----------

class _Faulty:
    """The demo generator, except that the prompt "boom" fails before any text and "boom later" mid-stream."""

    def __init__(self, gen) -> None:
        self._gen = gen
        self._prompt = None

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def encode(self, prompt):  # the server encodes once, then streams from the ids
        self._prompt = prompt
        return self._gen.encode(prompt)

    def stream_ids(self, ids, options=None, **kw):
        prompt = self._prompt
        if prompt == "boom":
            raise RuntimeError(f"a bug, with a path: {ROOT}/secret.py")
        pieces = self._gen.stream_ids(ids, options, **kw)
        if prompt == "boom later":
            def failing():
                yield next(pieces)
                raise RuntimeError("a bug after the first piece")
            return failing()
        return pieces


def test_an_exception_in_one_request_is_a_500_and_the_server_serves_on(demo_gen):
    import uvicorn

    from specrt.serve import ServeConfig, create_app

    port = free_port()
    app = create_app(_Faulty(demo_gen), ServeConfig(port=port))
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", lifespan="on"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not uv.started and time.monotonic() < deadline:
            time.sleep(0.05)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(model=DEMO, prompt="boom", max_tokens=4)
        assert "secret.py" not in str(e.value.body) and "Traceback" not in str(e.value.body)
        with pytest.raises(openai.APIError, match="internal error"):
            for _ in client.completions.create(model=DEMO, prompt="boom later", max_tokens=30, stream=True):
                pass
        out = client.completions.create(model=DEMO, prompt="def fib(n):", max_tokens=6, temperature=0)
        assert out.choices[0].text == demo_gen.generate("def fib(n):", max_new_tokens=6).text
        samples = {(s.name, tuple(s.labels.items())): s.value for f in text_string_to_metric_families(
            app.state.metrics.render()[0].decode()) for s in f.samples}
        assert samples[("specrt_generations_total", (("finish", "failed"),))] == 2
    finally:
        uv.should_exit = True
        thread.join(30)
    assert not thread.is_alive()


# --- chat, on the tiny instruct bundle ------------------------------------------------------------------------

MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fib(n):"}]


@pytest.fixture(scope="module")
def chat_server(chat_bundle, tmp_path_factory):
    # The instruct bundle has no draft model: prompt lookup speculates instead.
    s = Server(tmp_path_factory.mktemp("chat"), "--bundle", str(chat_bundle), "--method", "ngram",
               "--model-name", "tiny-instruct")
    yield s
    _stopped_cleanly(s)


def test_chat_equals_gen_chat(chat_server, chat_bundle):
    gen = specrt.load(chat_bundle, threads=1)
    expected = gen.chat(MESSAGES, max_new_tokens=12, temperature=0.7, seed=3, method="ngram")
    client = chat_server.client()
    out = client.chat.completions.create(model="tiny-instruct", messages=MESSAGES, max_tokens=12, temperature=0.7,
                                         seed=3)
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == expected.text
    assert out.usage.prompt_tokens == len(gen.encode_chat(MESSAGES))
    assert out.usage.completion_tokens == len(expected.token_ids)
    assert out.usage.prompt_tokens_details.cached_tokens == 0  # no --reuse-prefix: every prompt fed whole
    assert out.specrt["method"] == "ngram"

    parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in MESSAGES]
    chunks = list(client.chat.completions.create(model="tiny-instruct", messages=parts, max_completion_tokens=12,
                                                 temperature=0.7, seed=3, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == FINISH[expected.finish_reason]


def test_chat_without_max_tokens_fills_at_most_the_context(chat_server, chat_bundle):
    gen = specrt.load(chat_bundle, threads=1)
    out = chat_server.client().chat.completions.create(model="tiny-instruct", messages=MESSAGES, temperature=0)
    expected = gen.chat(MESSAGES, max_new_tokens=gen.max_context - len(gen.encode_chat(MESSAGES)), method="ngram")
    assert out.choices[0].message.content == expected.text
    assert out.usage.total_tokens <= gen.max_context


def test_reuse_prefix_feeds_only_a_conversations_new_turn(chat_bundle, tmp_path):
    """OpenAI clients re-send the whole conversation every turn: with --reuse-prefix the server keeps the last
    request's context and feeds the rest; the reply is what a fresh generation gives (fp32), the kept tokens
    are OpenAI's usage.prompt_tokens_details.cached_tokens, and without the flag nothing is kept."""
    gen = specrt.load(chat_bundle, threads=1)
    s = Server(tmp_path, "--bundle", str(chat_bundle), "--method", "ngram", "--model-name", "tiny-instruct",
               "--reuse-prefix")
    try:
        client = s.client()
        first = client.chat.completions.create(model="tiny-instruct", messages=MESSAGES, max_tokens=12, temperature=0)
        assert first.usage.prompt_tokens_details.cached_tokens <= 1  # the server's warm-up shared its BOS at most
        turn = MESSAGES + [{"role": "assistant", "content": first.choices[0].message.content},
                           {"role": "user", "content": "and fib(10)?"}]
        chunks = list(client.chat.completions.create(model="tiny-instruct", messages=turn, max_tokens=12,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}))
        expected = gen.chat(turn, max_new_tokens=12, method="ngram")
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
        cached = chunks[-1].usage.prompt_tokens_details.cached_tokens
        assert len(gen.encode_chat(MESSAGES)) - 2 <= cached < chunks[-1].usage.prompt_tokens
    finally:
        _stopped_cleanly(s)


def test_a_template_refusing_the_messages_is_a_400(chat_server):
    with pytest.raises(openai.BadRequestError, match="content"):
        chat_server.client().chat.completions.create(model="tiny-instruct",
                                                     messages=[{"role": "user", "content": [{"type": "image_url"}]}])


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
    _stopped_cleanly(s)


def test_sigterm_cancels_what_outlasts_the_drain_timeout(tmp_path):
    s = Server(tmp_path, "--drain-timeout", "0.5")
    conn = open_stream(s, {"model": DEMO, "prompt": LONG_PROMPT, "max_tokens": 1000, "temperature": 0})
    resp = conn.getresponse()
    assert resp.status == 200
    t0 = time.monotonic()
    s.terminate()
    events = read_events(resp)
    assert "[DONE]" not in events  # cut off, not finished
    _stopped_cleanly(s)
    assert time.monotonic() - t0 < 6  # the 1000-token generation (~10 s) did not run to its end


# --- the command line ------------------------------------------------------------------------------------------

def test_cli_help_teaches_serve():
    out = CliRunner().invoke(main, ["serve", "--help"]).output
    for needle in ("/v1/chat/completions", "/metrics", "SPECRT_API_KEY", "--max-queue", "specrt serve --bundle",
                   "curl", "[default: 127.0.0.1]"):
        assert needle in out, needle


def test_cli_without_the_serve_extra_says_what_to_install(monkeypatch):
    for name in [m for m in sys.modules if m == "specrt.serve" or m.startswith("specrt.serve.")]:
        monkeypatch.delitem(sys.modules, name)
    hide_modules(monkeypatch, "starlette")
    # --max-queue -1 is refused right after the import: should the import pass, no server starts here.
    res = CliRunner().invoke(main, ["serve", "--max-queue", "-1"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.output.strip().splitlines() == [
        "Error: serve needs the serve extra (starlette is missing): pip install 'specrt[serve]'"]


def test_cli_bad_settings_are_one_line_errors():
    res = CliRunner().invoke(main, ["serve", "--max-queue", "-1"])
    assert res.exit_code == 1 and res.output.strip() == "Error: max_queue must be >= 0, got -1"
    # The warm-up generation runs before the port opens: a method the bundle cannot run fails there.
    res = CliRunner().invoke(main, ["serve", "--gamma", "99", "--threads", "1"])
    assert res.exit_code == 1 and res.output.count("\n") == 1 and "gamma must be" in res.output


def test_the_server_imports_neither_torch_nor_transformers():
    code = ("import sys, specrt; from specrt.serve import ServeConfig, create_app; "
            "create_app(specrt.load(threads=1), ServeConfig()); "
            "bad = [m for m in ('torch', 'transformers', 'onnx') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stdout + res.stderr
