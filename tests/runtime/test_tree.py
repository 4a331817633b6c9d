"""Token trees: shapes, masks, one-pass verification equal to chains, greedy and sampled trees in the loop
(the acceptance rules themselves: test_acceptance.py)."""

from __future__ import annotations

import numpy as np
import pytest

import specrt
from specrt.errors import ConfigError
from specrt.runtime.masks import causal_mask, is_causal, speculation_mask
from specrt.runtime.tree import TokenTree, TreeShape


def test_tree_shape():
    assert TreeShape((2, 2, 1, 1)).nodes == 14
    assert TreeShape.parse("3,2,1").widths == (3, 2, 1)
    for bad in ("", "2,x", "0,1"):
        with pytest.raises(ConfigError):
            TreeShape.parse(bad)
    with pytest.raises(ConfigError, match="at most 64"):
        TreeShape((4, 4, 4))


def test_speculation_mask_against_hand_built_reference():
    # past 2, two context tokens (a, b), then tree nodes below b: 0 and 1 children of b, 2 child of 0.
    mask, pos = speculation_mask(2, 2, [-1, -1, 0])
    expected = np.array([
        # p p a b 0 1 2
        [1, 1, 1, 0, 0, 0, 0],  # a
        [1, 1, 1, 1, 0, 0, 0],  # b
        [1, 1, 1, 1, 1, 0, 0],  # 0
        [1, 1, 1, 1, 0, 1, 0],  # 1
        [1, 1, 1, 1, 1, 0, 1],  # 2
    ], dtype=bool)
    assert np.array_equal(mask[0, 0], expected)
    assert pos.tolist() == [2, 3, 4, 4, 5]
    plain, plain_pos = speculation_mask(3, 4)
    assert np.array_equal(plain, causal_mask(4, 3)) and plain_pos.tolist() == [3, 4, 5, 6]
    # what a causal-only graph (gqa-static) can run: a chain's mask and nothing else
    assert is_causal(plain, 3) and is_causal(causal_mask(1, 9), 9) and is_causal(causal_mask(5, 0), 0)
    assert not is_causal(mask, 2) and not is_causal(plain, 2)  # a tree; a mask of another past
    skip = causal_mask(3, 4).copy()
    skip[0, 0, 2, 1] = False  # an EAGLE expansion hides a past row the cache holds
    assert not is_causal(skip, 4)


@pytest.fixture(scope="module")
def close(close_bundle):
    return specrt.load(close_bundle, threads=1)


def test_tree_pass_equals_chain_passes_logits_and_kv(close):
    dec = close.decoders["target"]
    ctx = close.encode("def fib(n):")
    tree = TokenTree(tokens=[10, 20, 30, 40, 50], parents=[-1, -1, 0, 0, 2])
    mask, pos = speculation_mask(0, len(ctx), tree.parents)
    cache = dec.new_cache(64)
    logits = dec.forward(cache, np.array(ctx + tree.tokens), pos, mask).logits.copy()
    cache.advance(len(ctx) + len(tree.tokens))
    for node, path in [(1, [1]), (3, [0, 3]), (4, [0, 2, 4])]:
        chain = ctx + [tree.tokens[i] for i in path]
        ref_cache = dec.new_cache(64)
        ref = dec.forward(ref_cache, np.array(chain), np.arange(len(chain)), causal_mask(len(chain), 0)).logits
        assert np.abs(logits[len(ctx) + node] - ref[-1]).max() < 1e-5
    # Compacting the accepted path [0, 2, 4] leaves the cache a chain computation would have produced.
    cache.compact(len(ctx), [0, 2, 4])
    chain = ctx + [10, 30, 50]
    ref_cache = dec.new_cache(64)
    dec.forward(ref_cache, np.array(chain), np.arange(len(chain)), causal_mask(len(chain), 0))
    ref_cache.advance(len(chain))
    assert cache.length == len(chain)
    for layer in range(cache.num_layers):
        assert np.abs(cache.keys[layer][:, :len(chain)] - ref_cache.keys[layer][:, :len(chain)]).max() < 1e-5
        assert np.abs(cache.values[layer][:, :len(chain)] - ref_cache.values[layer][:, :len(chain)]).max() < 1e-5


@pytest.mark.parametrize("shape", [(2, 2, 1, 1), (3, 1), (1, 1, 1), (4,)])
def test_greedy_tree_equals_plain_decoding(close, shape):
    for prompt in ("def fib(n):", "import os\nimport sys\n", "class Point:"):
        plain = close.generate(prompt, max_new_tokens=40, method="none")
        tree = close.generate(prompt, max_new_tokens=40, method="tree", tree=shape)
        assert tree.token_ids == plain.token_ids


def test_tree_beats_its_chain_on_tokens_per_pass(close):
    prompts = ("def fib(n):", "import os\nimport sys\n", "class Point:")
    tree = [close.generate(p, max_new_tokens=60, method="tree", tree=(3, 2, 1, 1)).stats for p in prompts]
    chain = [close.generate(p, max_new_tokens=60, method="draft", gamma=4).stats for p in prompts]
    assert sum(s.tokens_per_target_pass for s in tree) > sum(s.tokens_per_target_pass for s in chain)
    st = tree[0]
    assert st.mean_gamma == pytest.approx(3 + 6 + 6 + 6, abs=12)  # nodes per pass (shallower near the end)
    assert st.accepted_per_depth[0] >= st.accepted_per_depth[-1]


def test_sampled_tree_generation_matches_the_target(close):
    from support.exactness import exact_sequence_distribution

    from specrt.runtime.sampling import SamplingConfig

    prompt = "for i in range(10):\n    print(i"
    exact = exact_sequence_distribution(close, close.encode(prompt), 3, SamplingConfig(temperature=1.0, top_k=3))
    n = 1500
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(n):
        out = tuple(close.generate(prompt, max_new_tokens=3, temperature=1.0, top_k=3, seed=seed, method="tree",
                                   tree=(2, 2)).token_ids)
        counts[out] = counts.get(out, 0) + 1
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    assert tv < np.sqrt(27 / n), tv
