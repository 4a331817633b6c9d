"""The DFlash drafter: which target taps each draft pass reads and where its block sits (recording stand-ins), and
end to end on an exported tiny target with a random draft: greedy output equals plain decoding, sampled output is
distributed as the target's (with a draft that is often right, so acceptances and residuals both decide), and the
one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.bundle import contract as C
from specrt.bundle.contract import ModelDims
from specrt.runtime.backends.base import DecoderOutput
from specrt.runtime.cached import CachedModel
from specrt.runtime.dflash import DFlashDrafter, DFlashParts
from specrt.runtime.kvcache import KVCache
from specrt.runtime.sampling import SamplingConfig

H, TAPS, VOCAB, BLOCK, MASK = 4, 2 * 4, 12, 4, 11
VOCAB_MAP = np.array([0, 2, 3, 7, 9, 11])


class _Target:
    """A target decoder whose taps at position j are j in every column."""

    supports_eagle = True

    def __init__(self) -> None:
        self.entry = type("E", (), {"dims": ModelDims(1, 1, 1, 2, H, VOCAB), "tap_width": TAPS, "kind": "decoder"})
        self.rng = np.random.default_rng(0)

    def new_cache(self, max_context: int) -> KVCache:
        return KVCache(self.entry.dims, max_context, np.float32)

    def forward(self, cache, input_ids, position_ids, mask, extra=None) -> DecoderOutput:
        q = len(input_ids)
        taps = np.repeat(np.asarray(position_ids, np.float32)[:, None], TAPS, axis=1)
        taps[:, H:] += 100  # the second tapped layer's columns: j + 100
        return DecoderOutput(self.rng.normal(size=(q, VOCAB)).astype(np.float32), np.zeros((q, H), np.float32),
                             extra={C.EAGLE_TAPS: taps})


class _Runner:
    """Records each pass; its cache is a length, as OrtDFlash's."""

    def __init__(self) -> None:
        self.length, self.calls = 0, []
        self.rng = np.random.default_rng(1)

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def run(self, block, start, context):
        assert self.length + len(context) == start
        self.calls.append({"block": list(block), "start": start, "context": np.array(context)})
        self.length = start
        return self.rng.normal(size=(len(block) - 1, len(VOCAB_MAP))).astype(np.float32)


def _setup(columns=None):
    target = CachedModel(_Target(), 64, VOCAB)
    runner = _Runner()
    drafter = DFlashDrafter.build(type("Ctx", (), {
        "dflash": DFlashParts(runner, VOCAB_MAP, BLOCK, MASK, columns), "target": target, "vocab": VOCAB,
        "draft_stop": 0.0})())
    return target, runner, drafter


def test_a_pass_reads_the_taps_of_every_committed_position_and_drafts_the_block_after_them():
    target, runner, drafter = _setup()
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    target.feed([5, 6, 7, 8], greedy)  # prefill: taps of positions 0..3
    tokens = [5, 6, 7, 8, 9]  # 9: the target's first token, not in its cache yet
    proposal = drafter.propose(tokens, 3, greedy, rng)
    call = runner.calls[0]
    assert call["block"] == [9, MASK, MASK, MASK] and call["start"] == 4
    assert call["context"][:, 0].tolist() == [0, 1, 2, 3]
    assert len(proposal.tokens) == 3 and proposal.passes == 1
    assert all(t in VOCAB_MAP for t in proposal.tokens)  # draft ids mapped to target ids
    # Verify [9, d1, d2, d3] at positions 4..7; keep one draft: 9 and d1 are committed, then a next token
    target.feed([9] + proposal.tokens, greedy, last=4)
    target.cache.truncate(len(tokens) + 1)
    drafter.rollback(len(tokens) + 1)
    tokens = tokens + proposal.tokens[:1] + [10]
    drafter.propose(tokens, 2, greedy, rng)
    call = runner.calls[1]
    assert call["start"] == 6 and call["block"] == [10, MASK, MASK, MASK]  # the whole block, even for 2 tokens
    assert call["context"][:, 0].tolist() == [4, 5]  # the verify pass's taps of the two committed positions


def test_a_draft_that_sat_out_plain_steps_reads_all_their_taps_at_once():
    target, runner, drafter = _setup()
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    target.feed([5, 6, 7], greedy)
    tokens = [5, 6, 7, 8]
    drafter.propose(tokens, 2, greedy, rng)
    for token in (9, 10):  # plain steps (auto's switch): one row each, the draft not run
        target.feed(tokens[target.cache.length:], greedy)
        tokens = tokens + [token]
    drafter.propose(tokens, 2, greedy, rng)
    assert runner.calls[1]["context"][:, 0].tolist() == [3, 4] and runner.calls[1]["start"] == 5
    assert target.taps_start == 3  # taps the draft has read are let go


def test_the_draft_reads_its_own_layers_columns_in_its_order():
    columns = np.concatenate([np.arange(H, 2 * H), np.arange(0, H)])  # the second tapped layer first
    target, runner, drafter = _setup(columns)
    target.feed([5, 6], SamplingConfig())
    drafter.propose([5, 6, 7], 1, SamplingConfig(), np.random.default_rng(0))
    context = runner.calls[0]["context"]
    assert context[:, 0].tolist() == [100, 101] and context[:, H].tolist() == [0, 1]


def test_gamma_caps_the_tokens_and_the_block_caps_gamma():
    target, runner, drafter = _setup()
    target.feed([5, 6], SamplingConfig())
    assert len(drafter.propose([5, 6, 7], 1, SamplingConfig(), np.random.default_rng(0)).tokens) == 1
    target.feed([7], SamplingConfig())
    assert len(drafter.propose([5, 6, 7, 8], 9, SamplingConfig(), np.random.default_rng(0)).tokens) == BLOCK - 1


# --- end to end: a tiny llama target exported with a random DFlash draft ---------------------------------------

@pytest.fixture(scope="module")
def dflash_gen(dflash_bundle):
    import specrt

    return specrt.load(dflash_bundle, threads=1)


def test_auto_runs_the_dflash_draft_where_the_bundle_has_one(dflash_gen):
    assert dflash_gen.default_method == "dflash"
    stats = dflash_gen.generate("def f(x):", max_new_tokens=8).stats
    assert stats.method == "dflash" and 0 < stats.engine_s < stats.total_s  # the draft's session counted as engine
    m = dflash_gen.manifest
    assert m.dflash.block_size == 4 and m.dflash.eagle_taps == (2, 5) and m.target.eagle_taps == (2, 5)


@pytest.mark.parametrize("gamma", [1, 3, "auto"])
def test_greedy_dflash_equals_plain_decoding(dflash_gen, gamma):
    from support.exactness import PROMPTS

    for prompt in PROMPTS:
        plain = dflash_gen.generate(prompt, max_new_tokens=30, method="none")
        spec = dflash_gen.generate(prompt, max_new_tokens=30, method="dflash", gamma=gamma)
        assert spec.token_ids == plain.token_ids
        assert spec.stats.draft_passes > 0


class _Oracle:
    """A stand-in draft that is often right: slot k's logits are the target's own at the position k after the
    block's start, along the target's greedy path from the context, plus noise (``noise`` x their spread). It knows
    the context through ``tokens`` (set by the drafter below); its context cache is a length, as OrtDFlash's."""

    def __init__(self, gen, noise: float = 0.3) -> None:
        self.gen, self.noise, self.length, self.tokens = gen, noise, 0, []
        self.forward_s = 0.0  # as OrtDFlash's: the generator counts it as engine time
        self.rng = np.random.default_rng(7)

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def reset(self, keep: int = 0) -> None:
        self.truncate(keep)

    def run(self, block, start, context):
        from specrt.runtime.masks import causal_mask

        assert self.length + len(context) == start and self.tokens[start] == block[0]
        self.length = start
        dec, ids, out = self.gen.decoders["target"], list(self.tokens[:start + 1]), []
        for _ in range(len(block) - 1):
            logits = dec.forward(dec.new_cache(len(ids)), np.asarray(ids, np.int64), np.arange(len(ids)),
                                 causal_mask(len(ids), 0)).logits[-1]
            out.append(logits + self.noise * logits.std() * self.rng.normal(size=logits.shape))
            ids.append(int(np.argmax(logits)))
        return np.asarray(out, np.float32)


@pytest.fixture
def oracle_gen(dflash_bundle, monkeypatch):
    """The bundle's generator drafting with :class:`_Oracle` over the whole vocabulary, blocks of 4."""
    import specrt

    gen = specrt.load(dflash_bundle, threads=1)
    oracle = _Oracle(gen)
    gen._dflash = DFlashParts(oracle, np.arange(gen.manifest.target.dims.vocab_size), 4,
                              gen.manifest.dflash.mask_token_id, None)
    propose = DFlashDrafter.propose

    def telling(self, tokens, gamma, sampling, rng):
        oracle.tokens = list(tokens)
        return propose(self, tokens, gamma, sampling, rng)

    monkeypatch.setattr(DFlashDrafter, "propose", telling)
    return gen


def test_sampled_dflash_matches_the_target_distribution(oracle_gen):
    """Each slot's token is drawn from that slot's q, independent of the slots before it; kept with min(1, p/q),
    a rejection redrawn from the residual. With a draft this often right, acceptances and residual draws both
    decide tokens: a q taken from the wrong slot or a residual that leaks q's mass shows in the TV distance."""
    from support.exactness import exact_sequence_distribution

    cfg = SamplingConfig(temperature=1.0, top_k=3)
    prompt = "for i in range(10):\n    print(i"
    exact = exact_sequence_distribution(oracle_gen, oracle_gen.encode(prompt), 3, cfg)
    n, accepted = 1500, 0
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(n):
        out = oracle_gen.generate(prompt, max_new_tokens=3, temperature=1.0, top_k=3, seed=seed, method="dflash",
                                  gamma=3)
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
        accepted += out.stats.accepted
    assert accepted > 0.3 * n  # the test means something only where drafts are kept
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    assert tv < np.sqrt(27 / n), tv  # E[TV] <= 0.5 * sqrt(27 / n) for 27 outcomes


def test_greedy_with_a_draft_that_is_often_right_keeps_its_drafts_and_equals_plain(oracle_gen):
    from support.exactness import PROMPTS

    for prompt in PROMPTS:
        plain = oracle_gen.generate(prompt, max_new_tokens=24, method="none")
        spec = oracle_gen.generate(prompt, max_new_tokens=24, method="dflash", gamma=3)
        assert spec.token_ids == plain.token_ids
        assert spec.stats.tokens_per_target_pass > 1.5


def test_dflash_on_a_bundle_without_a_draft_is_one_line(generator):
    from specrt.errors import ConfigError

    with pytest.raises(ConfigError, match="needs a DFlash draft and this bundle has none") as info:
        generator.generate("x", method="dflash")
    assert "\n" not in str(info.value)


def test_a_kept_prefix_is_read_again_only_where_the_draft_lacks_it(dflash_bundle):
    """reuse_prefix: a second turn feeds only what the caches lack; greedy output still equals plain decoding."""
    import specrt

    gen = specrt.load(dflash_bundle, threads=1)
    gen.reuse_prefix = True
    first = gen.generate("def fib(n):", max_new_tokens=12, method="dflash")
    follow = "def fib(n):" + first.text + "\n# next"
    spec = gen.generate(follow, max_new_tokens=12, method="dflash")
    plain = specrt.load(dflash_bundle, threads=1).generate(follow, max_new_tokens=12, method="none")
    assert spec.token_ids == plain.token_ids and spec.stats.reused_tokens > 0


def test_a_block_drafter_pays_its_draft_pass_once_per_step():
    from specrt import theory
    from specrt.measure.plan import plan_table

    # α 0.6, c 0.3, 7 drafts: a chain pays 7 passes (2.1 + 1), a block one (0.3 + 1)
    assert theory.speedup(0.6, 7, 0.3, one_pass=True) == pytest.approx(theory.expected_tokens(0.6, 7) / 1.3)
    assert theory.optimal_gamma(0.6, 0.3, 16, one_pass=True) > theory.optimal_gamma(0.6, 0.3, 16)
    rows = plan_table(0.6, 0.3, 8, one_pass=True)
    assert rows[6].relative_cost == pytest.approx(1.3)


def test_plan_measures_the_dflash_draft(dflash_bundle):
    from click.testing import CliRunner

    from specrt.cli import main

    res = CliRunner().invoke(main, ["plan", "--bundle", str(dflash_bundle), "--temperature", "0", "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert "dflash measured on" in res.output and "cost c+v(γ+1)" in res.output
