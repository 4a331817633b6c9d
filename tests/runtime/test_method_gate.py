"""``auto``'s switch between a method and plain decoding (runtime.gate.MethodGate): it runs whichever measured
faster, re-measures the other now and then, and stays exact whatever it decides, since each decision reads only
the steps before it. The drafters' caches catch up over the plain steps they sat out."""

from __future__ import annotations

import numpy as np
import pytest
from support.exactness import PROMPTS, exact_sequence_distribution

import specrt
from specrt.runtime.gate import MethodGate
from specrt.runtime.sampling import SamplingConfig


def _drive(gate: MethodGate, steps: int, method: tuple[int, float], plain: tuple[int, float]) -> list[bool]:
    """``steps`` decisions, each recorded with the (tokens, seconds) its kind takes."""
    ran = []
    for _ in range(steps):
        m = gate.method_now()
        gate.record(m, *(method if m else plain))
        ran.append(m)
    return ran


def test_the_gate_learns_both_then_runs_the_faster_and_probes_the_other():
    gate, g = MethodGate(), MethodGate
    ran = _drive(gate, g.WARM_METHOD + g.WARM_PLAIN, (3, 0.012), (1, 0.008))  # the method: 250 tokens/s; plain: 125
    assert ran == [True] * g.WARM_METHOD + [False] * g.WARM_PLAIN  # the method first, then plain decoding
    ran = _drive(gate, 2 * (g.PLAIN_PROBE + 1), (3, 0.012), (1, 0.008))
    assert ran.count(False) == 2  # one plain step after every PLAIN_PROBE of the method's
    assert ran[g.PLAIN_PROBE] is False and ran[-1] is False
    ran = _drive(gate, 400, (1, 0.012), (1, 0.008))  # drafts stop being kept: the method now loses
    probes = [i for i in range(1, len(ran)) if ran[i] and not ran[i - 1]]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] == g.METHOD_PROBE_MAX + 1  # each losing probe waits longer
    assert gate._wait == g.METHOD_PROBE_MAX
    said = gate.describe("eagle-tree")
    assert "plain steps run" in said and f"after {g.METHOD_PROBE_MAX} of them" in said
    ran = _drive(gate, 500, (4, 0.012), (1, 0.008))  # and wins again: probes see it, the method comes back
    assert ran[-100:].count(False) <= 2 and "eagle-tree runs" in gate.describe("eagle-tree")  # its plain probes
    assert gate._wait == g.METHOD_PROBE  # and a later loss is probed soon again


def test_a_slower_machine_does_not_switch_a_losing_method_on():
    """Rates measured a hundred steps apart are not comparable on a machine whose speed drifts: a method's probes
    are weighed against plain decoding's rate at their own time."""
    gate = MethodGate()
    _drive(gate, 400, (1, 0.0111), (1, 0.0100))  # 0.90x plain decoding: off
    assert not gate.on
    ran = _drive(gate, 600, (1, 0.0111 * 1.4), (1, 0.0100 * 1.4))  # everything 40 % slower: still 0.90x
    probes = sum(1 for a, b in zip([False] + ran, ran) if b and not a)
    assert sum(ran) == probes <= 5 and not gate.on  # one step per probe, none more


def test_a_slower_machine_does_not_switch_a_winning_method_off_for_long():
    """Plain decoding's rate, last measured by a probe in a faster time, is re-measured before the method's
    current one is judged against it."""
    gate = MethodGate()
    _drive(gate, 200, (2, 0.016), (1, 0.0100))  # 1.25x plain decoding: on
    ran = _drive(gate, 600, (2, 0.016 * 1.5), (1, 0.0100 * 1.5))  # everything 50 % slower: still 1.25x
    assert gate.on and ran.count(False) <= 600 // (MethodGate.PLAIN_PROBE + 1) + 2 * MethodGate.WARM_PLAIN
    while gate.method_now():  # much slower now: below plain decoding's last rate
        gate.record(True, 1, 0.05)
    assert gate.on and "measured again" in gate.describe("eagle-tree")
    _drive(gate, MethodGate.WARM_PLAIN, (1, 0.05), (1, 0.0150))
    assert not gate.on and "plain steps run" in gate.describe("eagle-tree")


def test_a_method_switched_off_comes_back_only_as_fast_as_plain_decoding():
    """Kept down to KEEP, resumed from RESUME: a method within the noise of plain decoding (prompt lookup's host
    work at T 1) does not flip on and off around one threshold."""
    gate = MethodGate()
    _drive(gate, 300, (1, 0.0125), (1, 0.0100))  # 0.80x: off
    ran = _drive(gate, 1500, (1, 0.0102), (1, 0.0100))  # 0.98x: above KEEP, below RESUME
    assert not gate.on and sum(ran) <= 1500 // MethodGate.METHOD_PROBE


def test_a_method_within_noise_of_plain_decoding_keeps_running():
    gate = MethodGate()
    ran = _drive(gate, 100, (1, 0.0101), (1, 0.0100))  # 0.99x: within KEEP
    assert ran[MethodGate.WARM_METHOD + MethodGate.WARM_PLAIN:].count(False) == 1  # the one plain probe


def test_a_few_unlucky_steps_do_not_turn_a_winning_method_off():
    """Tokens per step vary from 1 to the tree's depth: the rate is judged over tens of steps, not three."""
    gate, rng = MethodGate(), np.random.default_rng(0)
    ran = []
    for _ in range(400):
        m = gate.method_now()
        gate.record(m, *((int(rng.choice([1, 1, 1, 2, 3, 4])), 0.016) if m else (1, 0.0108)))
        ran.append(m)
    assert sum(ran) > 0.9 * len(ran)  # 2.0 tokens per 16 ms step: 1.35x a 10.8 ms plain step


@pytest.fixture(scope="module")
def eagle_gen(eagle_bundle):
    return specrt.load(eagle_bundle, threads=1)


def _coin(monkeypatch, seed: int = 7, share: float = 0.5):
    coin = np.random.default_rng(seed)
    monkeypatch.setattr(MethodGate, "method_now", lambda self: coin.random() < share)


@pytest.mark.parametrize("method", ["eagle-tree", "eagle"])
def test_greedy_auto_equals_plain_decoding_whatever_the_gate_decides(eagle_gen, monkeypatch, method):
    """A coin decides each step: the head sits out runs of plain steps and catches up over their rows."""
    _coin(monkeypatch)
    monkeypatch.setattr(type(eagle_gen), "default_method", method)
    for prompt in PROMPTS:
        plain = eagle_gen.generate(prompt, max_new_tokens=30, method="none")
        auto = eagle_gen.generate(prompt, max_new_tokens=30, method="auto", gamma=3)
        assert auto.token_ids == plain.token_ids
        assert auto.stats.method == method and 0 < auto.stats.paused_steps < auto.stats.target_passes - 1
        assert auto.stats.draft_passes > 0 and auto.stats.switch


@pytest.mark.parametrize("method", ["draft", "medusa", "ngram"])
def test_a_draft_model_medusa_and_lookup_catch_up_after_plain_steps(close_bundle, medusa_bundle, monkeypatch, method):
    _coin(monkeypatch, share=0.4)
    gen = specrt.load(medusa_bundle if method == "medusa" else close_bundle, threads=1)
    monkeypatch.setattr(type(gen), "default_method", method)
    for prompt in PROMPTS[:3]:
        auto = gen.generate(prompt, max_new_tokens=24, method="auto")
        assert auto.stats.method == method
        assert auto.token_ids == gen.generate(prompt, max_new_tokens=24, method="none").token_ids
        assert auto.stats.paused_steps > 0 and (auto.stats.drafted > 0 or method == "ngram")


def test_sampled_auto_stays_the_target_s_whatever_the_gate_decides(eagle_gen, monkeypatch):
    """The gate's choice is any function of the past: here a coin of its own."""
    _coin(monkeypatch)
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    prompt = "for i in range(10):\n    print(i"
    exact = exact_sequence_distribution(eagle_gen, eagle_gen.encode(prompt), 3, cfg)
    n, counts, paused = 1500, {}, 0
    for seed in range(n):
        out = eagle_gen.generate(prompt, max_new_tokens=3, temperature=1.0, top_k=3, seed=seed, method="auto",
                                 eagle_tree="2,2,4")
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
        paused += out.stats.paused_steps
    assert paused > n // 4  # the coin gave steps to plain decoding, and the others to the tree
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    assert tv < np.sqrt(27 / n), tv  # E[TV] <= 0.5 sqrt(27 / n) for 27 outcomes; a bias shifts far more


def test_a_named_method_runs_as_named(eagle_gen):
    st = eagle_gen.generate("def f(x):", max_new_tokens=12, method="eagle-tree").stats
    assert st.switch is None and st.paused_steps == 0


def test_stats_say_what_the_switch_measured_and_ran(eagle_gen, monkeypatch, capsys):
    from specrt.measure.report import print_stats

    monkeypatch.setattr(MethodGate, "WARM_METHOD", 1)
    monkeypatch.setattr(MethodGate, "WARM_PLAIN", 1)
    st = eagle_gen.generate("def f(x):", max_new_tokens=24, method="auto", temperature=1.0, seed=0).stats
    assert st.switch and "plain decoding" in st.switch
    print_stats(st, "CPUExecutionProvider")
    err = " ".join(capsys.readouterr().err.split())
    assert f"auto's switch │ {st.paused_steps}/{st.target_passes - 1} plain │" in err
