"""``reuse_prefix``: a generation whose prompt starts as the last one's context did feeds only the rest.

Each cache must keep exactly what it holds of that context: the target's and a draft model's K/V, and an
EAGLE-3 head's rows, which read the token after their own too. So the reused generation must decode what
a fresh one decodes, by every method and after switching methods, streams closed early and errors, and the
rows it feeds are counted.
"""

from __future__ import annotations

import pytest

import specrt

PROMPT = "def fib(n):"
METHODS = {"close": ("none", "draft", "tree", "ngram"), "eagle": ("none", "eagle", "eagle-tree", "ngram")}


@pytest.fixture(params=["close", "eagle"])
def pair(request, close_bundle, eagle_bundle):
    """(fresh, reusing) generators over the same bundle, and its methods."""
    bundle = close_bundle if request.param == "close" else eagle_bundle
    fresh, reusing = specrt.load(bundle, threads=1), specrt.load(bundle, threads=1)
    reusing.reuse_prefix = True
    return fresh, reusing, METHODS[request.param]


def _fed_rows(gen) -> list[int]:
    """Records the rows of every target pass from now on."""
    rows: list[int] = []
    dec = gen.decoders["target"]
    forward = dec.forward

    def counting(cache, ids, *args, **kwargs):
        rows.append(len(ids))
        return forward(cache, ids, *args, **kwargs)

    dec.forward = counting
    return rows


def test_the_same_prompt_again_feeds_its_last_two_tokens_and_decodes_the_same(pair):
    fresh, reusing, methods = pair
    prompt_ids = reusing.encode(PROMPT)
    for method in methods:
        want = fresh.generate(PROMPT, max_new_tokens=20, method=method).token_ids
        first = reusing.generate(PROMPT, max_new_tokens=20, method=method)
        rows = _fed_rows(reusing)
        again = reusing.generate(PROMPT, max_new_tokens=20, method=method)
        assert first.token_ids == want and again.token_ids == want, method
        # two rows, not one: a one-row pass takes other (quantized) kernels than the prefill did
        assert again.stats.reused_tokens == len(prompt_ids) - 2 and rows[0] == 2, method


def test_a_conversation_feeds_only_its_new_turn(pair):
    """The next prompt holds the last one, its reply and more: everything before the new text is kept."""
    fresh, reusing, methods = pair
    for method in methods:
        reply = reusing.generate(PROMPT, max_new_tokens=12, method=method)
        follow = PROMPT + reply.text + "\n    return fib(n - 1)"
        common = _common(reusing.encode(PROMPT) + reply.token_ids, reusing.encode(follow))
        got = reusing.generate(follow, max_new_tokens=16, method=method)
        assert got.token_ids == fresh.generate(follow, max_new_tokens=16, method=method).token_ids, method
        # at least the first prompt (every model prefilled it), never past what the two contexts share
        assert min(common, len(reusing.encode(PROMPT))) - 2 <= got.stats.reused_tokens <= common, method


def test_switching_methods_keeps_every_cache_consistent(pair):
    """A model left out of one generation keeps a prefix of what it held; the next that runs it must not
    read rows of an older context (prompts share a prefix, then differ)."""
    fresh, reusing, methods = pair
    prompts = [PROMPT, PROMPT + "\n    if n < 2:", "import os\n", PROMPT + "\n    return", PROMPT]
    for i, prompt in enumerate(prompts):
        for method in methods[1:] if i % 2 else reversed(methods):
            want = fresh.generate(prompt, max_new_tokens=12, method=method).token_ids
            assert reusing.generate(prompt, max_new_tokens=12, method=method).token_ids == want, (prompt, method)


def test_a_stream_closed_early_or_an_error_leaves_nothing_stale(pair):
    fresh, reusing, methods = pair
    method = methods[1]
    want = fresh.generate(PROMPT, max_new_tokens=16, method=method).token_ids
    stream = reusing.stream(PROMPT, max_new_tokens=40, method=method)
    for _ in range(3):
        next(stream)
    stream.close()  # between steps: what it decoded so far stays reusable
    after_close = reusing.generate(PROMPT, max_new_tokens=16, method=method)
    assert after_close.token_ids == want and after_close.stats.reused_tokens > 0

    dec = reusing.decoders["target"]
    forward, calls = dec.forward, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("engine failed")
        return forward(*args, **kwargs)

    dec.forward = failing
    with pytest.raises(RuntimeError, match="engine failed"):
        reusing.generate(PROMPT, max_new_tokens=16, method=method)
    dec.forward = forward
    again = reusing.generate(PROMPT, max_new_tokens=16, method=method)  # a failed pass: nothing is trusted
    assert again.stats.reused_tokens == 0 and again.token_ids == want


def test_off_by_default_every_generation_prefills_its_whole_prompt(generator):
    assert generator.reuse_prefix is False
    generator.generate(PROMPT, max_new_tokens=4)
    rows = _fed_rows(generator)
    assert generator.generate(PROMPT, max_new_tokens=4).stats.reused_tokens == 0
    assert rows[0] == len(generator.encode(PROMPT))


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
