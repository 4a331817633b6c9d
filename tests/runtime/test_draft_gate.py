"""Prompt lookup verified only where it pays (runtime.loop.DraftGate): paused when the lookup keeps missing and rows
are dear, back on when it hits, and exact whatever it decides, since each decision reads only the steps before it."""

from __future__ import annotations

import numpy as np
import pytest
from support.exactness import exact_sequence_distribution

import specrt
from specrt.runtime.loop import DraftGate
from specrt.runtime.sampling import SamplingConfig

DEAR = (1.0, 1.6, 2.2, 2.8, 3.4, 4.0, 4.6)  # rows dearer than on any CPU measured: a lookup must hit to pay


@pytest.fixture(scope="module")
def close(close_bundle):
    return specrt.load(close_bundle, threads=1)


def test_the_gate_pauses_a_missing_lookup_and_resumes_a_hitting_one():
    gate = DraftGate(DEAR)
    assert gate.keep(4) == 4 and gate.keep(0) == 0  # nothing measured yet: verify what was proposed
    gate.observe([0.2])
    assert gate.keep(4) == 0  # at α 0.2 no prefix beats a plain step when 2 rows cost 1.6
    for _ in range(12):
        gate.observe([1.0, 1.0, 1.0])  # the lookup starts to hit
    assert 1 <= gate.keep(4) <= 4 and gate.alpha > 0.95
    free = DraftGate(None)  # every pass one row's cost: verifying never loses, so it never pauses
    free.observe([0.01])
    assert free.keep(3) == 3


def test_only_the_prefix_that_pays_is_verified():
    gate = DraftGate((1.0, 1.05, 1.1, 2.5, 3.0))  # two extra rows nearly free, a fourth dear
    for _ in range(10):
        gate.observe([0.9])
    assert gate.keep(4) == 2


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_dear_curve_pauses_the_lookup_and_says_so(close, monkeypatch, temperature):
    monkeypatch.setattr(type(close), "verify_costs", lambda self, rows=0: DEAR)
    prompt = "for i in range(10):\n    print(i"
    gated = close.generate(prompt, max_new_tokens=40, method="ngram", temperature=temperature, seed=0)
    st = gated.stats
    assert st.paused_steps > 0 and st.target_passes - 1 >= st.paused_steps
    if temperature == 0:  # greedy: the target's own tokens whatever the gate did
        assert gated.token_ids == close.generate(prompt, max_new_tokens=40, method="none").token_ids
    monkeypatch.setattr(type(close), "verify_costs", lambda self, rows=0: None)
    assert close.generate(prompt, max_new_tokens=40, method="ngram", temperature=temperature,
                          seed=0).stats.paused_steps == 0  # a pass of any width costs one row's: never paused


def test_sampled_output_stays_the_target_s_whatever_the_gate_decides(close, monkeypatch):
    """The gate's choice is any function of the past: here a coin of its own, pausing half the steps at random."""
    coin = np.random.default_rng(7)
    monkeypatch.setattr(DraftGate, "keep", lambda self, k: k if coin.random() < 0.5 else 0)
    monkeypatch.setattr(type(close), "verify_costs", lambda self, rows=0: DEAR)
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    prompt = "print(i)\nprint(i)\nprint(i"  # the lookup finds a continuation in about a quarter of the runs
    exact = exact_sequence_distribution(close, close.encode(prompt), 3, cfg)
    n, counts, paused = 1500, {}, 0
    for seed in range(n):
        out = close.generate(prompt, max_new_tokens=3, temperature=1.0, top_k=3, seed=seed, method="ngram", gamma=2)
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
        paused += out.stats.paused_steps
    assert paused > n // 20  # the coin did pause steps that had a proposal (and let others be verified)
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    assert tv < np.sqrt(27 / n), tv  # E[TV] <= 0.5 sqrt(27 / n) for 27 outcomes; a bias shifts far more


def test_stats_name_the_paused_steps_beside_the_usual_rows(close, monkeypatch, capsys):
    from specrt.measure.report import print_stats

    monkeypatch.setattr(type(close), "verify_costs", lambda self, rows=0: DEAR)
    st = close.generate("print(i)\nprint(i)\nprint(i", max_new_tokens=40, method="ngram", temperature=1.0,
                        seed=0).stats
    assert st.paused_steps
    print_stats(st, "CPUExecutionProvider")
    err = capsys.readouterr().err
    assert f"drafting paused │ {st.paused_steps}/{st.target_passes - 1} │" in " ".join(err.split())
