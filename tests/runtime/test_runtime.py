"""The decoding loop end to end on exported tiny models: greedy parity, exact sampling, stops, errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from support.exactness import PROMPTS, exact_sequence_distribution
from support.models import assert_loads_no_torch
from transformers import AutoModelForCausalLM

import specrt
from specrt.errors import BundleError, ConfigError, ContextLengthError
from specrt.runtime.masks import causal_mask
from specrt.runtime.sampling import SamplingConfig, probs_from_logits


@pytest.fixture(scope="module")
def close(close_bundle):
    return specrt.load(close_bundle, threads=1)


@pytest.mark.parametrize("method,gamma", [("draft", 1), ("draft", 3), ("draft", 5), ("draft", "auto"),
                                          ("ngram", 4), ("ngram", "auto")])
def test_greedy_speculation_equals_plain_decoding(close, method, gamma):
    for prompt in PROMPTS:
        plain = close.generate(prompt, max_new_tokens=40, method="none")
        spec = close.generate(prompt, max_new_tokens=40, method=method, gamma=gamma)
        assert spec.token_ids == plain.token_ids
        assert len(spec.token_ids) == 40 and spec.text == plain.text


def test_the_close_pair_exercises_accept_and_reject(close):
    st = close.generate(PROMPTS[0], max_new_tokens=60, method="draft", gamma=4).stats
    assert 0.2 < st.acceptance_rate < 1.0
    assert st.tokens_per_target_pass > 1.5
    assert st.target_passes < 60 and st.draft_passes > 0


def test_greedy_draft_equals_hf_generate(pairs, close):
    hf = AutoModelForCausalLM.from_pretrained(pairs["llama"][0]).eval()
    ids = close.encode(PROMPTS[1])
    x = torch.tensor([ids])
    with torch.no_grad():
        ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=30, do_sample=False,
                          eos_token_id=None, pad_token_id=1)[0, len(ids):].tolist()
    assert close.generate(PROMPTS[1], max_new_tokens=30, method="draft", gamma=4).token_ids == ref


def test_fully_accepted_chains_and_draft_catch_up(self_bundle):
    gen = specrt.load(self_bundle, threads=1)
    plain = gen.generate(PROMPTS[0], max_new_tokens=41, method="none")
    spec = gen.generate(PROMPTS[0], max_new_tokens=41, method="draft", gamma=4)
    assert spec.token_ids == plain.token_ids
    st = spec.stats
    assert st.acceptance_rate == 1.0 and st.alpha_estimate == 1.0
    # 1 token from prefill, then 8 passes of 4 accepted + 1 bonus = 41 tokens in 9 passes.
    assert st.target_passes == 9 and st.tokens_per_target_pass == pytest.approx(41 / 9)
    # Each step after the first feeds the draft 2 missing tokens in its first pass, not an extra pass.
    assert st.draft_passes == 8 * 4
    # After a fully accepted chain the draft has not seen its own last token yet: it is fed, with the
    # bonus token, in the next round's first draft pass.
    assert gen._models["draft"].cache.length == gen._models["target"].cache.length - 1


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_sampled_speculation_matches_the_target_distribution(close, method):
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    prompt = "for i in range(10):\n    print(i"
    ids = close.encode(prompt)
    exact = exact_sequence_distribution(close, ids, 3, cfg)
    n = 1500
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(n):
        out = tuple(close.generate(prompt, max_new_tokens=3, temperature=1.0, top_k=3, seed=seed, method=method,
                                   gamma=2).token_ids)
        counts[out] = counts.get(out, 0) + 1
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    # E[TV] <= 0.5 * sqrt(27 / n) = 0.067 for 27 outcomes; a biased sampler shifts mass far more.
    assert tv < np.sqrt(27 / n), tv


@pytest.mark.parametrize("kwargs", [dict(top_k=5), dict(top_p=0.5), dict(top_k=8, top_p=0.9)])
def test_top_k_top_p_tokens_stay_in_the_allowed_set(close, kwargs):
    cfg = SamplingConfig(temperature=1.0, **kwargs)
    dec = close.decoders["target"]
    for seed in range(3):
        out = close.generate(PROMPTS[0], max_new_tokens=20, temperature=1.0, seed=seed, method="draft", gamma=3,
                             **kwargs)
        toks = close.encode(PROMPTS[0]) + out.token_ids
        logits = dec.forward(dec.new_cache(64), np.array(toks), np.arange(len(toks)), causal_mask(len(toks), 0)).logits
        allowed = probs_from_logits(logits[:-1], cfg) > 0
        start = len(toks) - len(out.token_ids)
        for i, t in enumerate(out.token_ids):
            assert allowed[start - 1 + i, t]


def test_seeded_runs_are_reproducible(close):
    a = close.generate(PROMPTS[2], max_new_tokens=30, temperature=0.9, top_p=0.95, seed=42, method="draft")
    b = close.generate(PROMPTS[2], max_new_tokens=30, temperature=0.9, top_p=0.95, seed=42, method="draft")
    c = close.generate(PROMPTS[2], max_new_tokens=30, temperature=0.9, top_p=0.95, seed=43, method="draft")
    assert a.token_ids == b.token_ids and a.text == b.text
    assert a.token_ids != c.token_ids


def test_stream_pieces_join_to_the_generated_text(close):
    stream = close.stream(PROMPTS[0], max_new_tokens=30, method="draft")
    pieces = list(stream)
    assert "".join(pieces) == stream.result.text == close.generate(PROMPTS[0], max_new_tokens=30).text


def test_stop_string(close):
    full = close.generate(PROMPTS[0], max_new_tokens=40, method="none").text
    stop = full[10:13]
    assert stop and stop in full
    out = close.generate(PROMPTS[0], max_new_tokens=40, method="draft", stop=[stop])
    assert out.finish_reason == "stop"
    assert out.text == full[: full.find(stop)]
    streamed = "".join(close.stream(PROMPTS[0], max_new_tokens=40, method="draft", stop=[stop]))
    assert streamed == out.text
    # the ids end with the token that reaches the stop string, not with the rest of the last chunk
    assert out.text, "the stop string should not be at the very start here"
    covered = close.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    shorter = close.tokenizer.decode(out.token_ids[:-1], skip_special_tokens=True)
    assert covered.startswith(out.text) and len(shorter) < len(out.text)


def test_eos_stops_generation(close_bundle, tmp_path, close):
    first = close.generate(PROMPTS[0], max_new_tokens=10, method="none").token_ids
    bundle = tmp_path / "b"
    shutil.copytree(close_bundle, bundle)
    manifest = json.loads((bundle / "specrt.json").read_text())
    manifest["tokenizer"]["eos_token_ids"] = [first[4]]
    (bundle / "specrt.json").write_text(json.dumps(manifest))
    gen = specrt.load(bundle, threads=1)
    for method in ("none", "draft"):
        out = gen.generate(PROMPTS[0], max_new_tokens=10, method=method)
        assert out.finish_reason == "eos"
        assert out.token_ids == first[: first.index(first[4])]


def test_context_limit_is_an_error_not_a_truncation(close):
    with pytest.raises(ContextLengthError, match="max context"):
        close.generate("x " * 200, max_new_tokens=100)
    # Right at the limit works and the caches never overflow.
    n_prompt = len(close.encode(PROMPTS[0]))
    out = close.generate(PROMPTS[0], max_new_tokens=close.max_context - n_prompt, method="draft", gamma=8)
    assert len(out.token_ids) == close.max_context - n_prompt


@pytest.mark.parametrize("kwargs,match", [
    (dict(gamma=0), "gamma"), (dict(gamma=65), "gamma"), (dict(gamma="fast"), "gamma"),
    (dict(temperature=-1.0), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_k=-2), "top_k"),
    (dict(method="beam"), "unknown method"), (dict(max_new_tokens=0), "max_new_tokens")])
def test_bad_arguments(close, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        close.generate("x", **kwargs)


def test_bundle_without_draft(pairs, tmp_path):
    from specrt.export.exporter import ExportOptions, export_bundle

    export_bundle(str(pairs["gpt2"][0]), None, tmp_path / "solo", ExportOptions(exporter="torchscript"))
    gen = specrt.load(tmp_path / "solo", threads=1)
    with pytest.raises(ConfigError, match="needs a draft model"):
        gen.generate("x", method="draft")
    assert gen.generate("x", method="ngram", max_new_tokens=20).token_ids == gen.generate(
        "x", method="none", max_new_tokens=20).token_ids


def test_bad_bundles(close_bundle, tmp_path):
    with pytest.raises(BundleError, match="not found"):
        specrt.load(tmp_path / "missing")
    bundle = tmp_path / "b"
    shutil.copytree(close_bundle, bundle)
    manifest = json.loads((bundle / "specrt.json").read_text())
    (bundle / "specrt.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(BundleError, match="format version 99"):
        specrt.load(bundle)
    (bundle / "specrt.json").write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        specrt.load(bundle)
    (bundle / "specrt.json").write_text(json.dumps(manifest))
    (bundle / "draft.onnx").unlink()
    with pytest.raises(BundleError, match="draft.onnx is missing"):
        specrt.load(bundle)
    (bundle / "draft.onnx").write_bytes(b"garbage")
    with pytest.raises(BundleError, match="draft.onnx is not an ONNX model"):
        specrt.load(bundle)


def test_runtime_imports_no_torch(close_bundle):
    assert_loads_no_torch(close_bundle, "g.generate('def f():', max_new_tokens=8, method='draft')")


def test_stats_are_consistent(close):
    st = close.generate(PROMPTS[0], max_new_tokens=50, method="draft", gamma=4).stats
    assert st.new_tokens == 50
    assert st.drafted >= st.accepted
    assert st.tokens_per_target_pass == pytest.approx(50 / st.target_passes)
    assert 0 <= st.alpha_estimate <= 1 and st.c > 0 and st.predicted_speedup > 0
    assert st.total_s >= st.prefill_s + st.draft_s + st.verify_s
    assert st.to_dict()["method"] == "draft"


def test_only_the_target_session_spins_and_a_small_draft_runs_on_the_calling_thread(close_bundle):
    """A spinning draft pool fights the target's for the cores; a pool for a tiny draft only adds wake-ups."""
    gen = specrt.load(close_bundle, threads=2)
    target, draft = (gen.decoders[r].session.get_session_options() for r in ("target", "draft"))
    spinning = "session.intra_op.allow_spinning"
    with pytest.raises(RuntimeError, match="does not have configuration"):  # unset: ORT's default, spinning
        target.get_session_config_entry(spinning)
    assert target.intra_op_num_threads == 2
    assert draft.intra_op_num_threads == 1 and draft.get_session_config_entry(spinning) == "0"


def test_auto_gamma_weighs_gamma_with_the_verify_cost_curve():
    from specrt.runtime.loop import AutoGamma
    from specrt.runtime.stats import StepRecord

    steep = (1.0, 1.21, 1.57, 1.71, 2.0, 2.17, 2.51, 2.75, 3.03)  # the SmolLM2 int8 bundle's
    # a 5-row pass of 20 ms on that curve is a 10 ms row; 1 ms per draft pass: c = 0.1
    step = StepRecord(proposed=4, accepted=2, betas=[0.6, 0.6, 0.6], draft_passes=4, draft_s=0.004, verify_s=0.020)
    flat, costly = AutoGamma(), AutoGamma(verify_costs=steep)
    assert flat.gamma == 4 and costly.gamma == 1  # with a curve, the first step risks one row
    assert costly.update(step) == 1 and costly.c == pytest.approx(0.1)
    assert flat.update(step) == 4 and flat.c == pytest.approx(0.05)  # rows assumed free: c read off the 5-row pass


def test_auto_gamma_pools_positions_so_long_chains_do_not_bias_alpha_low():
    """Greedy drafts accepted with probability 0.6 each, a step's positions ending at its first rejection: the
    mean of each step's betas says < 0.5 at the γ chosen here; pooling positions says ~0.6."""
    from specrt.runtime.loop import AutoGamma
    from specrt.runtime.stats import StepRecord

    rng, auto, seen, step_means = np.random.default_rng(0), AutoGamma(), [], []
    for i in range(600):
        gamma, betas = auto.gamma, []
        while len(betas) < gamma:
            betas.append(float(rng.random() < 0.6))
            if not betas[-1]:
                break
        accepted = int(sum(betas))
        auto.update(StepRecord(gamma, accepted, betas, gamma, 0.001 * gamma, 0.020))
        if i >= 100:
            seen.append(auto.alpha)
            step_means.append(np.mean(betas))
    assert np.mean(seen) == pytest.approx(0.6, abs=0.05)  # a ratio of 6-step means: a little low
    assert np.mean(step_means) < 0.5  # what averaging each step's betas made of it
    from specrt import theory

    assert auto.gamma <= theory.optimal_gamma(min(auto.alpha, 0.999), auto.c, 16)


def test_auto_gamma_at_most_doubles_a_step_and_falls_at_once():
    from specrt.runtime.loop import AutoGamma
    from specrt.runtime.stats import StepRecord

    auto = AutoGamma(verify_costs=(1.0, 1.05, 1.08, 1.12, 1.16, 1.2, 1.25, 1.3, 1.35))  # rows nearly free
    chosen = []
    for _ in range(4):  # every draft accepted: α̂ → 1, whose optimum is the longest chain
        gamma = auto.gamma
        chosen.append(auto.update(StepRecord(gamma, gamma, [1.0] * gamma, gamma, 0.0005 * gamma, 0.010)))
    assert chosen == [3, 7, 15, 16]
    falls = [auto.gamma]
    while falls[-1] > 1:  # first drafts rejected, step after step: γ falls as far as α̂ says, not one by one
        falls.append(auto.update(StepRecord(falls[-1], 0, [0.0], falls[-1], 0.0005 * falls[-1], 0.010)))
    assert max(a - b for a, b in zip(falls, falls[1:])) >= 3


def test_a_slow_spell_while_measuring_verify_costs_inflates_no_row_count():
    """A pass of r rows takes r ms, except four passes in a row that take 10× (the VM busy elsewhere). Each
    sweep times every row count once, so the spell spoils at most one timing per count and the fastest of
    three leaves the affine curve exact; four timings of one count back to back would lose that count."""
    from specrt.runtime.costs import measure_verify_costs

    class Stand:  # the slice of CachedModel the measurement uses
        def __init__(self):
            self.forward_s, self.calls = 0.0, 0
            self.cache = type("Cache", (), {"max_context": 64, "truncate": lambda c, n: None})()

        def reset(self):
            pass

        def feed(self, tokens, sampling, last=1):
            self.calls += 1
            slow = 10.0 if 19 <= self.calls < 23 else 1.0
            self.forward_s += slow * len(tokens) * 1e-3

    costs = measure_verify_costs(Stand(), max_rows=6, context=4, repeats=3)
    assert costs == pytest.approx(tuple(float(r) for r in range(1, 7)))


def test_verify_costs_are_measured_once_and_leave_the_target_cache_empty(close, tmp_path, monkeypatch):
    from specrt.runtime.costs import CALIBRATION_ROWS

    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path))  # none kept yet: measured here (tests/runtime/test_costs.py)
    close._verify_costs = None  # an earlier gamma="auto" test may have measured them already
    costs = close.verify_costs()
    assert len(costs) == CALIBRATION_ROWS and costs[0] == 1.0
    assert all(b >= a for a, b in zip(costs, costs[1:]))
    assert close.verify_costs() is costs
    assert close._models["target"].cache.length == 0


def test_pass_times_pool_generations_by_their_passes():
    """bench's and verify's c: each phase's seconds over its passes across generations, not a mean of means."""
    from types import SimpleNamespace

    from specrt.runtime.stats import mean_pass_seconds

    long = SimpleNamespace(target_passes=5, verify_s=0.4, draft_passes=8, draft_s=0.08)  # 4 steps after prefill
    short = SimpleNamespace(target_passes=2, verify_s=0.3, draft_passes=0, draft_s=0.0)
    assert mean_pass_seconds([long, short]) == (pytest.approx(0.7 / 5), pytest.approx(0.01))
    prefill_only = SimpleNamespace(target_passes=1, verify_s=0.0, draft_passes=0, draft_s=0.0)
    assert mean_pass_seconds([prefill_only]) == (0.0, None)



@pytest.mark.parametrize("method", ["none", "draft"])
def test_the_stop_id_a_pass_yields_counts_as_its_token(close_bundle, method):
    """The stop id a last pass yields is a token that pass produced: plain decoding reads 1.00 with or
    without a stop, and a draft's tokens per pass count it too."""
    gen = specrt.load(close_bundle, threads=1)
    full = gen.generate(PROMPTS[0], max_new_tokens=12, method=method)
    stop = full.token_ids[6]
    object.__setattr__(gen.manifest.tokenizer, "eos_token_ids", (stop,))  # frozen: this test's copy only
    stopped = gen.generate(PROMPTS[0], max_new_tokens=12, method=method)
    first = full.token_ids.index(stop)
    assert stopped.token_ids == full.token_ids[:first] and stopped.stats.new_tokens == first
    st = stopped.stats
    assert st.tokens_per_target_pass == pytest.approx((first + 1) / st.target_passes)
    if method == "none":
        assert full.stats.tokens_per_target_pass == 1.0 and st.tokens_per_target_pass == 1.0


def test_the_predicted_speedup_prices_the_verify_pass_once_its_cost_is_measured(close_bundle):
    """c is a draft pass over the verify pass timed in the loop; a plain step is v(γ+1) times cheaper than that
    pass, so once the curve is measured (gamma auto measures it) the prediction divides it out."""
    from specrt import theory

    gen = specrt.load(close_bundle, threads=1)
    before = gen.generate(PROMPTS[0], max_new_tokens=20, method="draft", gamma=3).stats
    assert before.verify_cost is None
    assert before.predicted_speedup == pytest.approx(
        theory.speedup(before.alpha_estimate, round(before.mean_gamma), before.c))
    gen.generate(PROMPTS[0], max_new_tokens=8, method="draft", gamma="auto")
    st = gen.generate(PROMPTS[0], max_new_tokens=20, method="draft", gamma=3).stats
    gamma = round(st.mean_gamma)
    assert st.verify_cost == pytest.approx(theory.verify_cost_at(gen.verify_costs(), gamma + 1))
    assert st.predicted_speedup == pytest.approx(theory.speedup(st.alpha_estimate, gamma, st.c) / st.verify_cost)
