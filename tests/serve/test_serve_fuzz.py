"""The HTTP API fuzzed: hypothesis draws request bodies for /v1/completions and /v1/chat/completions (every field
either a plausible value or any JSON value: wrong types, odd unicode with lone surrogates, huge and negative numbers,
NaN, nested structures) and raw bodies (bytes, deep nesting), and sends them to the in-process app over a copy of the
demo bundle that has a chat template. Every answer must be a 2xx or a 4xx with OpenAI's error body, never a 5xx;
a 200 stream must end in [DONE]; and afterwards the server must still answer a plain request exactly.

Bounded: a fixed number of examples per endpoint, each under a deadline, and lengths that keep every generation
short (max_tokens is drawn from 1-8, or from values the server must refuse): ~30 s on 2 cores.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

pytest.importorskip("starlette", reason="needs the serve extra: pip install -e '.[serve,dev]'")
hypothesis = pytest.importorskip("hypothesis", reason="needs the dev extra (hypothesis)")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402
from support import soak  # noqa: E402

import specrt  # noqa: E402
from specrt.serve import ServeConfig, create_app  # noqa: E402

MODEL = "fuzz"
FUZZ = settings(max_examples=250, deadline=timedelta(seconds=10), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Text as clients send it, and as they should not: any code point, lone surrogates included.
odd_text = st.text(st.characters(exclude_categories=()), max_size=40) | st.sampled_from(
    ["", "\n", "\ud800", "a\udfffb", "\x00", "\u202e", "🧪" * 20, "def f(x):", "<|im_end|>", "\ufeff"])
numbers = (st.integers(min_value=-(2**70), max_value=2**70) | st.floats()
           | st.sampled_from([0, -1, 1e-40, 5e-324, 1e308, 2**63, 2**64, -(2**63)]))
scalars = st.none() | st.booleans() | numbers | odd_text
# Any JSON value; its integers avoid 9-1024, where max_tokens would mean a long generation.
json_values = st.recursive(scalars.filter(lambda v: not (isinstance(v, (int, float)) and 9 <= v <= 1024)),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(odd_text, inner, max_size=4),
                           max_leaves=10)


def _maybe(valid: st.SearchStrategy, odd: st.SearchStrategy = json_values) -> st.SearchStrategy:
    """Mostly ``valid``, one time in eight ``odd``: with a dozen fields, a fair share of bodies are all valid and
    reach the generator, and each field is still fuzzed on its own."""
    return st.integers(0, 7).flatmap(lambda i: odd if i == 0 else valid)


short = st.integers(1, 8)  # a valid length that keeps a generation short
length = _maybe(short, st.integers(max_value=0) | st.integers(min_value=1025) | json_values)


def _neutral(*values) -> st.SearchStrategy:
    """A parameter specrt refuses unless neutral: mostly neutral (OpenAI clients send these defaults)."""
    return _maybe(st.sampled_from(values))


SAMPLING = {
    "temperature": _maybe(st.floats(0, 2) | st.sampled_from([0, 1e-40, 5e-324, 2])),
    "top_p": _maybe(st.floats(0, 1, exclude_min=True) | st.sampled_from([1e-300, 1])),
    "top_k": _maybe(st.integers(0, 100) | st.sampled_from([2**62, 4095, 4096, 4097])),
    "seed": _maybe(st.integers(0, 2**63 - 1) | st.sampled_from([0, 2**63 - 1]).map(float)),
    "stop": _maybe(odd_text | st.lists(odd_text, max_size=4)), "stream": _maybe(st.booleans()),
    # Only with stream: true (400 otherwise), so mostly absent; the usage chunk: see _streams_with_usage.
    "stream_options": _maybe(st.none(), st.fixed_dictionaries({}, optional={"include_usage": _maybe(st.booleans())})
                             | json_values),
    "n": _neutral(1, None), "logprobs": _neutral(None, False), "echo": _neutral(False, None),
    "presence_penalty": _neutral(0, None), "logit_bias": _neutral(None, {}), "tools": _neutral(None, []),
    "response_format": _neutral(None, {"type": "text"}), "user": json_values,
}


def _body(required: dict, optional: dict) -> st.SearchStrategy:
    """A body of these fields, and maybe keys nobody defined (they may name a field too: the drawn one wins)."""
    return st.builds(lambda extra, known: {**extra, **known}, st.dictionaries(odd_text, json_values, max_size=2),
                     st.fixed_dictionaries(required, optional=optional))


model = _maybe(st.just(MODEL), st.just("gpt-4") | json_values)


def _streams_with_usage(bodies: st.SearchStrategy) -> st.SearchStrategy:
    """Half of the bodies that stream also ask for the usage chunk."""
    return st.tuples(bodies, st.booleans()).map(
        lambda b: {**b[0], "stream_options": {"include_usage": True}} if b[1] and b[0].get("stream") is True else b[0])

completion_bodies = _streams_with_usage(_body(
    {"model": model, "prompt": _maybe(odd_text | st.lists(odd_text, min_size=1, max_size=2))},
    {"max_tokens": length, **SAMPLING}))
part = st.fixed_dictionaries({"type": _maybe(st.just("text")), "text": _maybe(odd_text)})
message = _maybe(st.fixed_dictionaries({"role": _maybe(st.sampled_from(["system", "user", "assistant"]), odd_text),
                                        "content": _maybe(odd_text | st.lists(part, max_size=3))}))


def _short_reply(body: dict) -> dict:
    """Chat defaults max_tokens to the context left: a body that sets no limit gets a short one."""
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        return {**body, "max_completion_tokens": 4}
    return body


chat_bodies = _streams_with_usage(_body(
    {"model": model, "messages": _maybe(st.lists(message, min_size=1, max_size=4))},
    {"max_tokens": length, "max_completion_tokens": length, **SAMPLING})).map(_short_reply)
raw_bodies = (st.binary(max_size=300) | st.integers(1, 300_000).map(lambda n: b"[" * n)
              | st.integers(1, 100_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n)
              | json_values.map(lambda v: json.dumps(v).encode())
              | st.sampled_from([b'{"model": "fuzz", "prompt": "\\ud800"}', b"\xff\xfe{}", b"NaN", b"1e999999"]))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    gen = specrt.load(soak.chat_demo(tmp_path_factory.mktemp("fuzz") / MODEL), threads=1)
    with TestClient(create_app(gen, ServeConfig(model_name=MODEL)), raise_server_exceptions=False) as c:
        yield c


def _check(response) -> None:
    """2xx, or 4xx with OpenAI's error body; a stream ends in [DONE]."""
    status, text = response.status_code, response.text
    hypothesis.event(f"status {status} {response.json()['error']['param'] if status >= 400 else ''}")
    assert status < 500, f"{status}: {text[:500]}"
    if status >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and "\n" not in error["message"] and "Traceback" not in text
        assert {"type", "param", "code"} <= set(error)
    elif response.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", text[-500:]
        assert not any("error" in json.loads(e) for e in events[:-1]), text[-500:]
    else:
        assert response.json()["choices"][0]["finish_reason"] in ("length", "stop")


def _post(client, path: str, body) -> None:
    _check(client.post(path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"}))


@FUZZ
@given(body=completion_bodies)
def test_completions_never_answer_5xx(client, body):
    _post(client, "/v1/completions", body)


@FUZZ
@given(body=chat_bodies)
def test_chat_never_answers_5xx(client, body):
    _post(client, "/v1/chat/completions", body)


@FUZZ
@given(body=raw_bodies, path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_raw_bodies_never_answer_5xx(client, body, path):
    _check(client.post(path, content=body, headers={"Content-Type": "application/json"}))


def test_the_server_answers_exactly_after_the_fuzzing(client, demo_gen):
    # Named to run after the three above (pytest keeps file order): the generator, queue and metrics survived.
    expected = demo_gen.generate("def fib(n):", max_new_tokens=12, temperature=0)
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "def fib(n):", "max_tokens": 12,
                                             "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected.text, r.text
    deadline = time.monotonic() + 10  # the answer goes out a moment before the generator thread lets the job go
    while (health := client.get("/health").json())["busy"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert health["status"] == "ok" and health["queue_depth"] == 0 and not health["busy"], health
