"""`specrt serve`: real server processes on loopback, driven by the official OpenAI client and raw HTTP.

Every server binds 127.0.0.1 on a free port, runs with one intra-op thread and stops with SIGTERM (exit 0
checked). This file: completions on the demo bundle, bad requests, metrics, a failing request and the command
line; test_serve_chat.py: the chat endpoint on conftest's tiny instruct bundle; test_serve_lifecycle.py: the
queue, the API key, the soak and shutdown. Shared: tests/serve/conftest.py and tests/support/servers.py.
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
from support.servers import (  # noqa: E402
    DEMO,
    LONG_PROMPT,
    ROOT,
    Server,
    error_of,
    free_port,
    hide_modules,
    stopped_cleanly,
)

from specrt.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # A named method: under auto, which exact method runs a step follows measured time (runtime.gate), so a sampled
    # reply is the target's in distribution but not the same tokens for a seed; these tests compare tokens.
    s = Server(tmp_path_factory.mktemp("serve"), "--max-queue", "16", "--method", NAMED)
    yield s
    stopped_cleanly(s)


# --- completions on the demo bundle --------------------------------------------------------------------------

NAMED = "draft"  # the demo pair's auto: the same method, named
SAMPLED = dict(temperature=0.8, top_p=0.9, top_k=40, seed=11)


def test_models_and_health(server):
    assert [m.id for m in server.client().models.list().data] == [DEMO]
    assert server.client().models.retrieve(DEMO).id == DEMO
    assert server.health() == {"status": "ok", "model": DEMO, "queue_depth": 0, "max_queue": 16, "busy": False,
                               "replica": "0"}


def test_seeded_completion_equals_generate(server, demo_gen):
    prompt = "def read_lines(path):"
    expected = demo_gen.generate(prompt, max_new_tokens=24, method=NAMED, **SAMPLED)
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
    expected = demo_gen.generate(prompt, max_new_tokens=32, method=NAMED, **SAMPLED)
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
    error = error_of(response)
    assert error["type"] == "invalid_request_error" and error["param"] == param and param in error["message"]


@pytest.mark.parametrize("body,status,match", [
    (b"{not json", 400, "not valid JSON"), (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"model": "gpt-4", "prompt": "x"}).encode(), 404, "does not exist"),
])
def test_malformed_bodies_and_unknown_model(server, body, status, match):
    response = server.request("POST", "/v1/completions", body)
    assert response[0] == status and match in error_of(response)["message"]


def test_openai_client_raises_bad_request(server):
    with pytest.raises(openai.BadRequestError, match="top_p"):
        server.client().completions.create(model=DEMO, prompt="x", top_p=3)


def test_prompt_beyond_the_context_is_400(server):
    long_prompt = "def f(x):\n    return x\n" * 400  # far more than the demo's 1024 positions
    response = server.request("POST", "/v1/completions", {"model": DEMO, "prompt": long_prompt, "max_tokens": 4})
    assert response[0] == 400 and error_of(response)["code"] == "context_length_exceeded"
    response = server.request("POST", "/v1/completions", {"model": DEMO, "prompt": "x", "max_tokens": 5000})
    assert response[0] == 400 and "max context" in error_of(response)["message"]


def test_chat_on_a_bundle_without_template_is_a_clear_400(server):
    with pytest.raises(openai.BadRequestError, match="no chat template") as e:
        server.client().chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "hi"}])
    assert str(ROOT) not in str(e.value)


def test_oversized_body_is_413_and_the_server_serves_on(server):
    response = server.request("POST", "/v1/completions",
                              {"model": DEMO, "prompt": "x" * (1 << 20), "max_tokens": 1})  # default limit: 1 MiB
    assert response[0] == 413 and error_of(response)["code"] == "request_too_large"
    assert server.client().completions.create(model=DEMO, prompt="x", max_tokens=2).usage.completion_tokens == 2


def test_unknown_routes_answer_openai_style(server):
    response = server.get("/v1/embeddings")
    assert response[0] == 404 and error_of(response)["message"]
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
