"""`specrt serve`'s chat endpoint on conftest's tiny instruct bundle (no draft: prompt lookup speculates),
with and without --reuse-prefix. Servers as in test_serve.py: loopback, one thread, SIGTERM, exit 0.
"""

from __future__ import annotations

import pytest

pytest.importorskip("starlette", reason="needs the serve extra: pip install -e '.[serve,dev]'")
openai = pytest.importorskip("openai", reason="needs the dev extra (the OpenAI client)")

from support.servers import Server, stopped_cleanly  # noqa: E402

import specrt  # noqa: E402
from specrt.serve.protocol import FINISH  # noqa: E402

# --- chat, on the tiny instruct bundle ------------------------------------------------------------------------

MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fib(n):"}]


@pytest.fixture(scope="module")
def chat_server(chat_bundle, tmp_path_factory):
    # The instruct bundle has no draft model: prompt lookup speculates instead.
    s = Server(tmp_path_factory.mktemp("chat"), "--bundle", str(chat_bundle), "--method", "ngram",
               "--model-name", "tiny-instruct")
    yield s
    stopped_cleanly(s)


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
        stopped_cleanly(s)


def test_a_template_refusing_the_messages_is_a_400(chat_server):
    with pytest.raises(openai.BadRequestError, match="content"):
        chat_server.client().chat.completions.create(model="tiny-instruct",
                                                     messages=[{"role": "user", "content": [{"type": "image_url"}]}])
