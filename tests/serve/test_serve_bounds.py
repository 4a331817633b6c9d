"""What the server bounds, in-process (Starlette's TestClient over the demo generator): an empty completion is a 200,
odd bodies are one-line 400s, a request past --request-timeout is a 504 and the generator moves on, a generator
stuck past it fails /health (and Ray's health check), and Ray's "no replica" errors are resent or a 503.
Slow clients and template bombs against a real `specrt serve`: test_serve_slow_clients.py; fuzzing:
test_serve_fuzz.py.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("starlette", reason="needs the serve extra: pip install -e '.[serve,dev]'")

from starlette.testclient import TestClient  # noqa: E402
from support.servers import DEMO, LONG_PROMPT  # noqa: E402

from specrt.serve import ServeConfig, create_app  # noqa: E402

# Single-line code completion: the demo's greedy continuation of each starts with a newline, so the answer is "".
EMPTY = {"model": DEMO, "prompt": "def f(x):", "stop": ["\n"], "temperature": 0}


@pytest.fixture(scope="module")
def client(demo_gen):
    with TestClient(create_app(demo_gen, ServeConfig())) as c:
        yield c


def _events(text: str) -> list:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


def test_a_stream_keeps_its_result_when_iterated_again(demo_gen):
    stream = demo_gen.stream("def f(x):", max_new_tokens=8, temperature=0, stop=("\n",))
    assert list(stream) == [] and list(stream) == []
    assert stream.result is not None and stream.result.text == "" and stream.result.finish_reason == "stop"
    stream = demo_gen.stream("def fib(n):", method="none", max_new_tokens=6, temperature=0)
    text = "".join(stream)
    assert next(stream, None) is None and stream.result.text == text and len(stream.result.token_ids) == 6


def test_an_empty_completion_is_a_200(client, demo_gen):
    assert demo_gen.generate("def f(x):", max_new_tokens=16, temperature=0, stop=("\n",)).text == ""
    r = client.post("/v1/completions", json=EMPTY)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"] == "" and body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 0
    r = client.post("/v1/completions", json={**EMPTY, "stream": True})
    events = _events(r.text)
    assert r.status_code == 200 and events[-1] == "[DONE]", r.text
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("body,param", [
    (b'{"model": "specrt-demo", "prompt": "a\\ud800b"}', "prompt"),
    (b'{"model": "specrt-demo", "prompt": "a", "stop": ["\\udfff"]}', "stop"),
    (b'{"model": "specrt-demo", "messages": [{"role": "user", "content": "\\ud83d"}]}', "messages[0].content"),
])
def test_a_lone_surrogate_is_a_400_naming_the_parameter(client, body, param):
    r = client.post("/v1/completions" if b"prompt" in body else "/v1/chat/completions", content=body,
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "surrogate" in r.json()["error"]["message"]


def test_a_body_nested_too_deeply_is_a_400(client):
    for body in (b"[" * 100_000, b'{"a":' * 50_000):
        r = client.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "too deeply" in r.json()["error"]["message"], r.text


def test_a_request_past_its_time_limit_is_a_504_and_the_generator_moves_on(demo_gen):
    app = create_app(demo_gen, ServeConfig(request_timeout_s=0.5))
    long = {"model": DEMO, "prompt": LONG_PROMPT, "max_tokens": 1000, "temperature": 0}
    with TestClient(app) as c:
        t0 = time.monotonic()
        r = c.post("/v1/completions", json=long)
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout", r.text
        r = c.post("/v1/completions", json={**long, "stream": True})
        events = _events(r.text)
        assert r.status_code == 200 and "[DONE]" not in events
        assert json.loads(events[-1])["error"]["code"] == "request_timeout"
        # Two generations of ~8 s each were cut at 0.5 s: the generator took the next request at its next step.
        r = c.post("/v1/completions", json={**long, "max_tokens": 4})
        assert r.status_code == 200 and time.monotonic() - t0 < 5
        assert c.get("/health").json()["status"] == "ok"


class _Wedged:
    """The demo generator, except that encoding the prompt "wedge" blocks until released, deaf to cancels (as a
    native call that never returns would)."""

    def __init__(self, gen) -> None:
        self._gen, self.release = gen, threading.Event()

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def encode(self, prompt):
        if prompt == "wedge":
            self.release.wait(60)
        return self._gen.encode(prompt)


def test_a_generator_stuck_past_the_limit_fails_health_and_rays_check(demo_gen):
    from specrt.serve.cluster import Replica

    wedged = _Wedged(demo_gen)
    app = create_app(wedged, ServeConfig(request_timeout_s=0.3))
    app.state.scheduler.stuck_after_s = 2.0  # 30 s in service: a slow step is not a stuck one
    replica = Replica.__new__(Replica)  # Ray's constructor needs a Ray context; check_health needs only the app
    replica.app = app
    try:
        with TestClient(app) as c:
            r = c.post("/v1/completions", json={"model": DEMO, "prompt": "wedge", "max_tokens": 2})
            assert r.status_code == 504, r.text
            replica.check_health()  # past its deadline, not yet past the grace
            deadline = time.monotonic() + 10
            while c.get("/health").status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            health = c.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "stuck"
            with pytest.raises(RuntimeError, match="stuck"):
                replica.check_health()
            wedged.release.set()
            while c.get("/health").status_code != 200 and time.monotonic() < deadline + 10:
                time.sleep(0.05)
            assert c.get("/health").json()["status"] == "ok"
            replica.check_health()
            r = c.post("/v1/completions", json={"model": DEMO, "prompt": "def fib(n):", "max_tokens": 3})
            assert r.status_code == 200
    finally:
        wedged.release.set()


@pytest.mark.parametrize("setting,value", [("request_timeout_s", 0), ("request_timeout_s", float("nan")),
                                           ("header_timeout_s", -1), ("max_connections", 0)])
def test_bad_bounds_are_config_errors(setting, value):
    from specrt.errors import ConfigError

    with pytest.raises(ConfigError, match=setting):
        ServeConfig(**{setting: value})


# --- Ray's "no replica" errors at the ingress (a stand-in handle: no Ray instance needed) -----------------------

class _Answer:
    def __init__(self, error):
        self.error = error

    def __aiter__(self):
        return self

    async def __anext__(self):
        raise self.error

    def cancel(self):
        pass


class _Handle:
    """A DeploymentHandle whose calls raise the given errors in turn, then answer 200."""

    def __init__(self, *errors):
        self.errors, self.calls = list(errors), 0

    def options(self, **kw):
        return self

    @property
    def relay(self):
        return self

    def remote(self, scope, body):
        self.calls += 1
        if self.errors:
            return _Answer(self.errors.pop(0))

        async def ok():
            yield [{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]},
                   {"type": "http.response.body", "body": b"{}", "more_body": False}]
        return ok()


def test_rays_unavailable_errors_are_resent_or_a_503(monkeypatch):
    pytest.importorskip("ray", reason="needs the cluster extra")
    from ray.serve._private.common import DeploymentID
    from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError

    from specrt.serve import cluster

    monkeypatch.setattr(cluster, "RETRY_DELAY_S", 0.0)
    body = {"model": DEMO, "prompt": "x"}
    handle = _Handle(ReplicaUnavailableError("r1"))
    with TestClient(cluster.Ingress(handle, ServeConfig(), 3, "")) as c:
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200 and handle.calls == 2  # resent to another replica
    handle = _Handle(*[ReplicaUnavailableError("r")] * 3)
    with TestClient(cluster.Ingress(handle, ServeConfig(), 3, "")) as c:
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "replicas_unavailable"
    handle = _Handle(DeploymentUnavailableError(DeploymentID(name="specrt", app_name="specrt-demo")))
    with TestClient(cluster.Ingress(handle, ServeConfig(), 3, "")) as c:
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "replicas_unavailable" and handle.calls == 1
        assert r.headers["retry-after"] == "1"
