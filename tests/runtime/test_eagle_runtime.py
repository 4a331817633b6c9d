"""The EAGLE-3 drafter's bookkeeping on recording stand-ins: which target taps each head row reads, which
head rows survive verification, and the draft-to-target id mapping of q. (End-to-end exactness on
exported heads: tests/export/eagle/test_eagle_export.py and the end-to-end tests below when a bundle is built.)"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from specrt.bundle import contract as C
from specrt.bundle.contract import ModelDims
from specrt.runtime.backends.base import DecoderOutput
from specrt.runtime.cached import CachedModel
from specrt.runtime.dist import Dist
from specrt.runtime.eagle import EagleDrafter, to_target
from specrt.runtime.kvcache import KVCache
from specrt.runtime.sampling import SamplingConfig

H, TAPS = 4, 3 * 4
VOCAB, DRAFT_VOCAB = 12, 5
VOCAB_MAP = np.array([0, 2, 3, 7, 11])


@dataclass
class _Entry:
    dims: ModelDims
    tap_width: int
    kind: str


class _Recorder:
    """A decoder that records every pass. The target's taps of position j are j in every column (so a
    head row's taps name the position they came from); the head's hidden of row j is -j."""

    supports_eagle = True
    provider = "stand-in"
    graph_status = None

    def __init__(self, kind: str, vocab: int) -> None:
        self.entry = _Entry(ModelDims(1, 1, 1, 2, H, vocab), TAPS if kind == "decoder" else TAPS, kind)
        self.calls: list[dict] = []
        self.rng = np.random.default_rng(0)

    def new_cache(self, max_context: int) -> KVCache:
        return KVCache(self.entry.dims, max_context, np.float32)

    def forward(self, cache, input_ids, position_ids, mask, extra=None) -> DecoderOutput:
        q = len(input_ids)
        self.calls.append({"ids": list(input_ids), "pos": list(position_ids), "past": cache.length,
                           "extra": {k: np.array(v) for k, v in (extra or {}).items()}})
        logits = self.rng.normal(size=(q, self.entry.dims.vocab_size)).astype(np.float32)
        positions = np.asarray(position_ids, np.float32)
        if self.entry.kind == "decoder":
            return DecoderOutput(logits, np.zeros((q, H), np.float32),
                                 extra={C.EAGLE_TAPS: np.repeat(positions[:, None], TAPS, axis=1)})
        return DecoderOutput(logits, -np.repeat(positions[:, None], H, axis=1))


def _pair():
    target = CachedModel(_Recorder("decoder", VOCAB), 64, VOCAB)
    head = CachedModel(_Recorder("eagle3", DRAFT_VOCAB), 64, DRAFT_VOCAB)
    return target, head, EagleDrafter(head, target, VOCAB_MAP, VOCAB)


def test_each_head_row_pairs_the_taps_of_its_position_with_the_next_token():
    target, head, drafter = _pair()
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    prompt = [5, 6, 7, 8]
    target.feed(prompt, greedy, last=1)  # prefill: taps of positions 0..3
    tokens = prompt + [9]  # the target's first token, not in its cache yet
    proposal = drafter.propose(tokens, 3, greedy, rng)
    catch_up, *steps = head.decoder.calls
    assert catch_up["ids"] == [6, 7, 8, 9] and catch_up["pos"] == [0, 1, 2, 3] and catch_up["past"] == 0
    assert catch_up["extra"][C.EAGLE_TAPS][:, 0].tolist() == [0, 1, 2, 3]  # taps of positions 0..3
    assert not catch_up["extra"][C.EAGLE_FEATURES].any()
    # Deeper rows: the drafted token, no taps, the head's own output of the row before
    assert [s["ids"] for s in steps] == [[proposal.tokens[0]], [proposal.tokens[1]]]
    assert [s["pos"] for s in steps] == [[4], [5]]
    assert not steps[0]["extra"][C.EAGLE_TAPS].any() and steps[0]["extra"][C.EAGLE_FEATURES][0, 0] == -3
    assert steps[1]["extra"][C.EAGLE_FEATURES][0, 0] == -4
    assert proposal.passes == 3 and all(t in VOCAB_MAP for t in proposal.tokens)


def _first_proposal(gamma: int):
    """A prompt [5, 6, 7, 8] prefilled, the target's first token 9, and the head's first proposal of ``gamma``."""
    target, head, drafter = _pair()
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    target.feed([5, 6, 7, 8], greedy, last=1)
    tokens = [5, 6, 7, 8, 9]
    return target, head, drafter, tokens, drafter.propose(tokens, gamma, greedy, rng), greedy, rng


@pytest.mark.parametrize("accepted", [0, 2, 3])
def test_rows_fed_the_heads_own_features_are_recomputed_after_verification(accepted):
    target, head, drafter, tokens, proposal, greedy, rng = _first_proposal(3)
    # Verify: the target runs [9, d1, d2, d3] at positions 4..7, keeps `accepted` drafts and a next token
    target.feed([9] + proposal.tokens, greedy, last=4)
    target.cache.truncate(len(tokens) + accepted)
    drafter.rollback(len(tokens) + accepted)
    assert head.cache.length == 4  # rows 0..3 read the target's taps; rows 4, 5 are dropped
    tokens = tokens + proposal.tokens[:accepted] + [10]
    head.decoder.calls.clear()
    drafter.propose(tokens, 2, greedy, rng)
    catch_up = head.decoder.calls[0]
    # Rows 4 .. len-2 again, now with the verify pass's taps (positions 4 .. 4 + accepted)
    assert catch_up["pos"] == list(range(4, len(tokens) - 1)) and catch_up["past"] == 4
    assert catch_up["ids"] == tokens[5:]
    assert catch_up["extra"][C.EAGLE_TAPS][:, 0].tolist() == list(range(4, len(tokens) - 1))


def test_a_head_that_sat_out_plain_steps_catches_up_over_their_rows():
    """auto's switch (runtime.gate) may run plain steps between proposals: the target keeps each pass's taps
    until the head has read them, and the next catch-up covers every row the head missed."""
    target, head, drafter, tokens, proposal, greedy, rng = _first_proposal(1)
    target.feed([9] + proposal.tokens, greedy, last=2)  # verify: positions 4, 5; the draft is rejected
    target.cache.truncate(len(tokens))
    drafter.rollback(len(tokens))
    tokens = tokens + [10]
    for token in (11, 12):  # two plain steps: one row each, the head not run
        target.feed(tokens[target.cache.length:], greedy)
        tokens = tokens + [token]
    head.decoder.calls.clear()
    drafter.propose(tokens, 1, greedy, rng)
    catch_up = head.decoder.calls[0]
    assert catch_up["past"] == 4 and catch_up["ids"] == [10, 11, 12] and catch_up["pos"] == [4, 5, 6]
    assert catch_up["extra"][C.EAGLE_TAPS][:, 0].tolist() == [4, 5, 6]  # the verify pass's, then each plain one's
    assert target.taps_start == 4  # what the head has read is let go: rows below it are final


def test_taps_not_made_by_the_last_target_pass_are_an_error_not_garbage():
    target, head, drafter = _pair()
    target.feed([5, 6], SamplingConfig(), last=1)
    with pytest.raises(RuntimeError, match="taps of positions"):
        drafter.propose([5, 6, 7, 8], 2, SamplingConfig(), np.random.default_rng(0))  # position 2 never ran


def test_q_over_draft_ids_becomes_q_over_target_ids():
    full = Dist(None, np.array([1.0, 2.0, 3.0, 4.0, 0.0]), DRAFT_VOCAB)
    mapped = to_target(full, VOCAB_MAP, VOCAB)
    assert mapped.vocab == VOCAB and np.allclose(mapped.dense()[VOCAB_MAP], full.dense())
    assert mapped.dense()[[1, 4, 5, 6, 8, 9, 10]].sum() == 0
    sparse = Dist(np.array([1, 3]), np.array([0.25, 0.75]), DRAFT_VOCAB)
    assert to_target(sparse, VOCAB_MAP, VOCAB).prob(7) == 0.75
    assert to_target(Dist.point(4, DRAFT_VOCAB), VOCAB_MAP, VOCAB).ids.tolist() == [11]
    # The same uniform draws the same token through the map (inverse CDF over ascending ids)
    for seed in range(20):
        a = VOCAB_MAP[full.sample(np.random.default_rng(seed))]
        assert a == mapped.sample(np.random.default_rng(seed))


# --- end to end: a tiny llama target exported with a random EAGLE-3 head ------------------------------------

@pytest.fixture(scope="module")
def eagle_gen(eagle_bundle):
    import specrt

    return specrt.load(eagle_bundle, threads=1)


def test_auto_is_the_eagle_tree_where_the_bundle_has_a_head(eagle_gen):
    assert eagle_gen.default_method == "eagle-tree"
    assert eagle_gen.generate("def f(x):", max_new_tokens=6).stats.method == "eagle-tree"


@pytest.mark.parametrize("options", [dict(method="eagle", gamma=1), dict(method="eagle", gamma=3),
                                     dict(method="eagle", gamma="auto"), dict(method="eagle-tree", eagle_tree="2,3,5"),
                                     dict(method="eagle-tree", eagle_tree="4,4,16"),
                                     dict(method="eagle-tree", eagle_tree="1,2,1"),
                                     dict(method="eagle-tree", eagle_tree="3,3,auto")])
def test_greedy_eagle_equals_plain_decoding(eagle_gen, options):
    from support.exactness import PROMPTS

    for prompt in PROMPTS:
        plain = eagle_gen.generate(prompt, max_new_tokens=30, method="none")
        spec = eagle_gen.generate(prompt, max_new_tokens=30, **options)
        assert spec.token_ids == plain.token_ids
        assert spec.stats.draft_passes > 0


@pytest.mark.parametrize("method, tree", [("eagle", "2,2,4"), ("eagle-tree", "2,2,4"), ("eagle-tree", "2,2,auto")])
def test_sampled_eagle_matches_the_target_distribution(eagle_gen, method, tree):
    """A random head's q is far from p, so rejections and residual draws decide nearly every token: a
    residual that leaks q's mass shows here. (Acceptances through the vocab map: the trained head's test.)
    The tree's children are the head's top-k: point masses, each rejection zeroing one id of p."""
    from support.exactness import exact_sequence_distribution

    cfg = SamplingConfig(temperature=1.0, top_k=3)
    prompt = "for i in range(10):\n    print(i"
    exact = exact_sequence_distribution(eagle_gen, eagle_gen.encode(prompt), 3, cfg)
    n = 1500
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(n):
        out = eagle_gen.generate(prompt, max_new_tokens=3, temperature=1.0, top_k=3, seed=seed, method=method,
                                 gamma=2, eagle_tree=tree)
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    assert tv < np.sqrt(27 / n), tv  # E[TV] <= 0.5 * sqrt(27 / n) for 27 outcomes


def test_eagle_on_a_bundle_without_a_head_is_one_line(generator):
    from specrt.errors import ConfigError

    with pytest.raises(ConfigError, match="needs an EAGLE-3 head and this bundle has none"):
        generator.generate("x", method="eagle")


# --- EAGLE-2 dynamic tree ---------------------------------------------------------------------------------------

def test_dynamic_tree_expands_the_best_nodes_with_their_parents_rows():
    from specrt.runtime.eagle import EagleTreeDrafter
    from specrt.runtime.tree import DynamicTree

    target = CachedModel(_Recorder("decoder", VOCAB), 64, VOCAB)
    head = CachedModel(_Recorder("eagle3", DRAFT_VOCAB), 64, DRAFT_VOCAB)
    drafter = EagleTreeDrafter(head, target, VOCAB_MAP, VOCAB, DynamicTree(topk=2, depth=3, nodes=5))
    greedy = SamplingConfig()
    prompt = [5, 6, 7, 8]
    target.feed(prompt, greedy, last=1)
    tree = drafter.propose_tree(prompt + [9], 8, greedy, np.random.default_rng(0))
    catch_up, level1, level2 = head.decoder.calls
    assert catch_up["pos"] == [0, 1, 2, 3]
    # Level 1: the root's 2 children, each at the position after the root, reading the catch-up's last row
    assert level1["pos"] == [4, 4] and level1["past"] == 4
    assert (level1["extra"][C.EAGLE_FEATURES][:, 0] == -3).all() and not level1["extra"][C.EAGLE_TAPS].any()
    # Level 2: the 2 best of the 4 grandchildren, reading their own parent's row (hidden -4: position 4)
    assert level2["pos"] == [5, 5] and level2["past"] == 6
    assert (level2["extra"][C.EAGLE_FEATURES][:, 0] == -4).all()
    assert len(tree.tokens) == 5 and tree.points and tree.passes == 3
    assert all(t in VOCAB_MAP for t in tree.tokens)
    assert all(p < i for i, p in enumerate(tree.parents))  # level order: parents first
    # Its ranking travels with it: whole-path log-probabilities, a child never above its parent
    assert len(tree.scores) == 5 and all(s <= 0 for s in tree.scores)
    assert all(tree.scores[i] <= tree.scores[p] for i, p in enumerate(tree.parents) if p >= 0)
    drafter.rollback(5)
    assert head.cache.length == 4  # only the rows that read the target's taps survive


def test_a_tree_grows_a_level_only_where_its_head_pass_pays():
    from specrt.runtime.tree import deeper_level_pays

    level = np.log([0.5, 0.12, 0.06])  # the root's children, the head about as sure as SmolLM2's
    fp32 = (1.0, 1.06, 1.11, 1.18, 1.22, 1.27, 1.35, 1.42, 1.44)  # measured v(r) on a 2-core CPU
    int8 = (1.0, 1.26, 1.41, 1.54, 1.69, 1.85, 2.01, 2.17, 2.34)
    # fp32: rows cheap, a head pass 0.05 of a target pass: grandchildren (0.25) pay for a row and the pass
    assert deeper_level_pays(level, level, level, fp32, 21, 0.05, 1)
    # int8: each row ~0.15 of a pass and the head's pass as dear: one level (a chain of one) is the best buy
    assert not deeper_level_pays(level, level, level, int8, 21, 0.15, 1)
    # rows free and passes free (a GPU, before anything was timed): grow
    assert deeper_level_pays(level, level, level, None, 21, 0.0, 1)
    # a head unsure of its next level does not pay even where rows are cheap
    assert not deeper_level_pays(level, level, np.log([0.05, 0.02, 0.01]), fp32, 21, 0.05, 1)


def test_a_tree_sized_by_cost_stops_growing_where_the_head_pass_does_not_pay():
    from specrt.runtime.eagle import EagleTreeDrafter
    from specrt.runtime.tree import DynamicTree

    greedy, prompt = SamplingConfig(), [5, 6, 7, 8]
    grown = {}
    for name, costs, pass_cost in (("cheap", (1.0,) * 9, 0.0), ("dear", tuple(1.0 + r for r in range(9)), 2.0)):
        target = CachedModel(_Recorder("decoder", VOCAB), 64, VOCAB)
        head = CachedModel(_Recorder("eagle3", DRAFT_VOCAB), 64, DRAFT_VOCAB)
        drafter = EagleTreeDrafter(head, target, VOCAB_MAP, VOCAB, DynamicTree.parse("2,3,auto"), costs)
        drafter.pass_cost = pass_cost
        target.feed(prompt, greedy, last=1)
        tree = drafter.propose_tree(prompt + [9], 8, greedy, np.random.default_rng(0))
        grown[name] = (tree.passes, len(head.decoder.calls))
    assert grown["cheap"] == (3, 3)  # the catch-up and two levels
    assert grown["dear"] == (1, 1)  # the catch-up's top-k only: no head pass that cannot pay


def test_the_tree_drafter_times_its_head_pass_against_the_verify_pass_that_followed():
    from specrt.runtime.eagle import EagleTreeDrafter

    target = CachedModel(_Recorder("decoder", VOCAB), 64, VOCAB)
    head = CachedModel(_Recorder("eagle3", DRAFT_VOCAB), 64, DRAFT_VOCAB)
    costs = (1.0, 1.2, 1.5, 2.0)
    drafter = EagleTreeDrafter(head, target, VOCAB_MAP, VOCAB, verify_costs=costs)
    # the last proposal: 2 ms a head pass, a 3-row tree (v = 1.5); then its verify pass took 30 ms
    drafter._last = (0.002, 3, target.passes, target.forward_s)
    target.passes, target.forward_s = target.passes + 1, target.forward_s + 0.030
    drafter._observe_cost()
    assert drafter.pass_cost == pytest.approx(0.002 / (0.030 / 1.5))  # 0.1 of a one-row pass
    # a prefill (or anything else) between the proposal and the next: not a reading of the verify pass
    drafter._last = (0.010, 3, target.passes, target.forward_s)
    target.passes, target.forward_s = target.passes + 2, target.forward_s + 0.5
    drafter._observe_cost()
    assert drafter.pass_cost == pytest.approx(0.1)


def test_select_nodes_keeps_the_best_connected_subtree():
    from specrt.runtime.tree import select_nodes

    parents = [-1, -1, 0, 0, 1, 2]
    scores = [-0.1, -0.5, -0.3, -2.0, -0.6, -0.4]
    assert select_nodes(parents, scores, 4) == [0, 1, 2, 5]
    assert select_nodes(parents, scores, 1) == [0]
    # A child that (by rounding) outscores its parent is not kept without it
    assert select_nodes([-1, -1, 1], [-0.1, -0.9, -0.2], 2) == [0, 1]


def test_a_tree_sized_by_cost_keeps_the_nodes_that_pay_for_their_rows():
    from specrt.runtime.tree import nodes_worth_verifying

    scores = np.log([0.9, 0.5, 0.3, 0.05, 0.01])
    # Rows free (a GPU's memory-bound pass): every candidate; no curve measured is the same
    assert nodes_worth_verifying(scores, (1.0,) * 8, 5) == 5
    assert nodes_worth_verifying(scores, None, 3) == 3
    # Each row +10 %: a node pays while its chance beats the cost of its row at the pass's tokens so far
    # (1 + 0.9 + 0.5 = 2.4 tokens for 1.2 passes; the 0.3 node: 2.7 / 1.3 = 2.08 > 2.0; 0.05: 2.75 / 1.4 < 2.08)
    assert nodes_worth_verifying(scores, tuple(1 + 0.1 * r for r in range(8)), 5) == 3
    # Rows as dear as passes (int8 on a small CPU): no node is worth its row, the pass is a plain step
    assert nodes_worth_verifying(np.log([0.5, 0.4]), tuple(float(r) for r in range(1, 9)), 2) == 0
    # Order of the candidates does not matter, and ``most`` caps
    assert nodes_worth_verifying(scores[::-1], (1.0,) * 8, 2) == 2


def test_auto_nodes_parse_to_every_candidate_sized_by_cost():
    from specrt.errors import ConfigError
    from specrt.runtime.tree import DynamicTree

    tree = DynamicTree.parse("4,4,auto")
    assert (tree.topk, tree.depth, tree.nodes, tree.by_cost) == (4, 4, 52, True) and str(tree) == "4,4,auto"
    assert DynamicTree.parse("8,5,auto").nodes == 64  # capped at MAX_TREE_NODES
    assert not DynamicTree.parse("4,4,16").by_cost
    with pytest.raises(ConfigError, match="4,4,auto"):
        DynamicTree.parse("4,auto,16")


def test_verify_checks_the_eagle_chain_and_tree(eagle_gen):
    from specrt.check.verify import verify_bundle

    progress = []
    checks = list(verify_bundle(eagle_gen, ["def f(x):", "import os\n"], samples=150, max_new_tokens=12,
                                on_progress=lambda what, done, total: progress.append(what)))
    names = [c.name for c in checks]
    for method in ("eagle", "eagle-tree"):
        assert f"greedy {method} == plain" in names and f"sampled {method} ~ target" in names
    assert all(c.passed for c in checks if c.name.startswith(("greedy", "sampled", "target"))), checks
    assert progress.count("sampling eagle") == 150 and progress.count("sampling eagle-tree") == 150


def test_plan_measures_the_head(eagle_bundle, chat_bundle):
    from click.testing import CliRunner

    from specrt.cli import main

    res = CliRunner().invoke(main, ["plan", "--bundle", str(eagle_bundle), "--temperature", "0", "--max-gamma", "4"])
    assert res.exit_code == 0, res.output
    assert "eagle measured on 8 prompts" in res.output and "head / target matmul FLOPs" in res.output
    assert "α = " in res.output and "(measured greedy)" in res.output
    # No head, no draft: prompt lookup is planned, on the chat prompts the bundle's template asks for.
    res = CliRunner().invoke(main, ["plan", "--bundle", str(chat_bundle), "--max-gamma", "4", "--temperature", "0.7"])
    assert res.exit_code == 0, res.output
    assert "ngram measured on 8 prompts at temperature 0.7" in res.output and "prompt lookup" in res.output
    assert "(measured at T 0.7)" in res.output and "μ = 0" in res.output


def test_verify_chat_renders_each_prompt_in_the_template(chat_bundle):
    from click.testing import CliRunner

    from specrt.cli import main

    res = CliRunner().invoke(main, ["verify", "--bundle", str(chat_bundle), "--prompt-set", "chat", "--samples", "60",
                                    "--max-new-tokens", "8"])
    assert "PASS  greedy ngram == plain: 12/12" in res.output and "PASS  sampled ngram ~ target" in res.output, res.output


def _stop_that_bites(gen, method: str, gamma: int) -> float:
    """A draft_stop this pair's drafter crosses both ways: some chains end early, some run to gamma."""
    for stop in 0.9 * 0.8 ** np.arange(40):  # down to 1e-4: a random tiny draft's top probability is ~1/vocab
        stop = float(stop)
        mean = gen.generate("def f(x):\n    return", max_new_tokens=30, method=method, gamma=gamma,
                            draft_stop=stop).stats.mean_gamma
        if 1.2 < mean < gamma - 0.2:
            return stop
    raise AssertionError(f"no threshold makes {method}'s chains vary")


@pytest.mark.parametrize("method", ["eagle", "draft"])
def test_a_chain_that_stops_where_the_drafter_is_unsure_stays_exact(eagle_gen, generator, method):
    """draft_stop ends a chain where the drafter's own softmax of its next token is below it: fewer drafts and
    draft passes; greedy output still equals plain decoding and sampled output the target's distribution."""
    from support.exactness import PROMPTS, exact_sequence_distribution

    gen = eagle_gen if method == "eagle" else generator
    stop = _stop_that_bites(gen, method, 4)
    for prompt in PROMPTS[:3]:
        plain = gen.generate(prompt, max_new_tokens=30, method="none")
        full = gen.generate(prompt, max_new_tokens=30, method=method, gamma=4)
        cut = gen.generate(prompt, max_new_tokens=30, method=method, gamma=4, draft_stop=stop)
        assert cut.token_ids == full.token_ids == plain.token_ids
        assert cut.stats.draft_passes == cut.stats.drafted  # one pass per drafted token, none wasted
        assert cut.stats.mean_gamma < full.stats.mean_gamma
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    prompt = "for i in range(10):\n    print(i"
    exact = exact_sequence_distribution(gen, gen.encode(prompt), 3, cfg)
    n, counts = 1500, {}
    for seed in range(n):
        out = gen.generate(prompt, max_new_tokens=3, temperature=1.0, top_k=3, seed=seed, method=method, gamma=2,
                           draft_stop=stop)
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    assert tv < np.sqrt(27 / n), tv  # E[TV] <= 0.5 * sqrt(27 / n) for 27 outcomes


def test_draft_stop_is_a_probability():
    from specrt.errors import ConfigError
    from specrt.runtime.options import DecodeOptions

    for bad in (-0.1, 1.0, True, "0.5"):
        with pytest.raises(ConfigError, match="draft_stop must be a probability"):
            DecodeOptions(draft_stop=bad)
