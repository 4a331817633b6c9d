"""`specrt eagle train --time-limit` kept (issue #62): a batch cut token-step by token-step at its deadline, the
held-out replies within their own share, a limit below the run's least refused before anything is generated, the
estimate said before training, and the warning after it when the head is too weak to pay
(specrt/export/eagle/forecast.py). Deadlines run on a fake clock (``budget.clock``) that each target pass moves
on: no test reads the wall time."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner
from support.eagle_train import PROMPTS, SMALL, small_target

from specrt.cli import main
from specrt.export.eagle import budget as eb
from specrt.export.eagle import data as ed
from specrt.export.eagle import forecast as fc
from specrt.export.eagle import generate as eg
from specrt.export.eagle.config import tap_layers
from specrt.export.eagle.train import train_eagle
from specrt.theory import speedup


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return small_target(tmp_path_factory.mktemp("eagle-forecast") / "target")


@pytest.fixture
def fake_clock(monkeypatch):
    """budget.clock reads a counter that every target pass (prefill, token step, text batch) moves on by 1 s."""
    now = {"t": 0.0}
    real_pass = eg._target_pass

    def timed_pass(*args, **kwargs):
        now["t"] += 1.0
        return real_pass(*args, **kwargs)

    monkeypatch.setattr(eb, "clock", lambda: now["t"])
    monkeypatch.setattr(eg, "_target_pass", timed_pass)
    return now


def _model(target):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target).eval()


# ------------------------------------------------------------------------------------- cut at the deadline


def test_a_batch_stops_token_step_wise_at_its_deadline_keeping_what_it_wrote(target, fake_clock):
    """The prefill is pass 1 (t = 1), token step k's pass ends at t = k + 1: a deadline at t = 6 stops the batch
    after 5 tokens, each with its states; with min_new 8 it writes 8 first. Without a deadline rows run to max_len."""
    model, taps = _model(target), tap_layers(4)
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    cut = eg.continue_prompts(model, prompts, 30, 0.0, [], torch.Generator(), taps, until=6.0)
    assert [len(q.tokens) - len(p) for q, p in zip(cut, prompts)] == [5, 5] and all(q.cut for q in cut)
    assert all(q.taps.shape[0] == q.final.shape[0] == q.top1.shape[0] == len(q.tokens) for q in cut)
    whole = eg.continue_prompts(model, prompts, 30, 0.0, [], torch.Generator(), taps)
    assert [q.tokens[:len(c.tokens)] for q, c in zip(whole, cut)] == [c.tokens for c in cut]  # the same reply, cut
    assert all(torch.equal(q.top1[:len(c.tokens)], c.top1) for q, c in zip(whole, cut))
    assert [len(q.tokens) for q in whole] == [30, 30] and not any(q.cut for q in whole)
    fake_clock["t"] = 0.0
    least = eg.continue_prompts(model, prompts, 30, 0.0, [], torch.Generator(), taps, until=0.0, min_new=8)
    assert [len(q.tokens) - len(p) for q, p in zip(least, prompts)] == [8, 8]


def test_held_out_replies_keep_their_share_and_a_running_batch_is_cut(target, fake_clock, monkeypatch):
    """One row a batch; replies may run to 40 s: the held-out ones get a quarter of it (to t = 10), so the first is
    cut after 9 tokens and the second never starts; the first training batch starts at t = 10 and is cut at t = 40
    after 29 tokens (its prefill is pass 11), and no other starts."""
    monkeypatch.setattr(ed, "_GEN_BATCH", 1)
    from specrt.export.loading import load_tokenizer

    cfg = replace(SMALL, seq_len=64)
    train, held, info = ed._build_sequences(_model(target), load_tokenizer(str(target)), cfg, PROMPTS, [], [],
                                            tap_layers(4), lambda *a: None, limits=eb.DataLimits(until=40.0))
    assert info["heldout_replies_asked"] == 2 and info["heldout_replies_made"] == len(held) == 1
    assert info["heldout_cut"] == "time" and held[0].cut and len(held[0].tokens) - held[0].start - 1 == 9
    assert info["generation_cut"] == "time" and info["continuations_made"] == len(train) == 1
    assert train[0].cut and len(train[0].tokens) - train[0].start - 1 == 29
    assert info["replies_cut_short"] == 2
    assert eb.DataLimits(until=100.0).heldout_until(20.0) == 20.0 + eb.HELDOUT_SHARE * 80.0
    assert eb.DataLimits(until=10.0).heldout_until(20.0) == 20.0 and eb.DataLimits().heldout_until(5.0) is None


def test_text_windows_after_the_first_batch_stop_at_the_deadline(target, fake_clock):
    model, windows = _model(target), [[5, 6, 7, 8, 9]] * 5
    assert len(eg.teacher_forced(model, windows, tap_layers(4), 2, until=0.0)) == 2  # the first batch only
    fake_clock["t"] = 0.0
    assert len(eg.teacher_forced(model, windows, tap_layers(4), 2, until=2.0)) == 4  # t = 1, then 2: stop
    assert len(eg.teacher_forced(model, windows, tap_layers(4), 2)) == 5


# --------------------------------------------------------------------------------- refused up front


def test_a_limit_below_reading_the_target_and_saving_is_refused_before_it_is_read(target, tmp_path, monkeypatch):
    from specrt.export import loading

    monkeypatch.setattr(loading, "load_causal_lm", lambda *a, **k: pytest.fail("the target was read"))
    r = CliRunner().invoke(main, ["eagle", "train", str(target), "-o", str(tmp_path / "h"), "--time-limit", "0.1"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    line = [ln for ln in r.output.splitlines() if "--time-limit" in ln]
    assert len(line) == 1 and "--time-limit 0.1 is below the ~0.2 minutes this run needs at the least" in line[0]
    assert "saving 10 s" in line[0] and line[0].endswith("give at least 0.5") and not (tmp_path / "h").exists()


def test_a_limit_below_the_measured_least_is_refused_before_anything_is_generated(target, tmp_path, monkeypatch):
    """The target as measured after reading it (here: 10 s a token row) needs more than 5 minutes for its first
    replies alone: refused before a prompt is continued, with the least limit to give."""
    monkeypatch.setattr(fc, "token_row_s", lambda *a: 10.0)
    monkeypatch.setattr(ed, "continue_prompts", lambda *a, **k: pytest.fail("a reply was generated"))
    calls = []
    with pytest.raises(fc.TimeLimitTooShortError) as e:
        train_eagle(target, tmp_path / "h", replace(SMALL, time_limit=5.0), prompts=PROMPTS,
                    progress=lambda *a: calls.append(a))
    msg = str(e.value)
    assert msg.startswith("eagle train: --time-limit 5 is below the ~") and "the first replies" in msg
    assert "the held-out checks" in msg and "saving 10 s" in msg and "\n" not in msg
    need = float(msg.split("~")[1].split(" ")[0])
    assert need > 5 and msg.endswith(f"give at least {fc.at_least(need):g}")
    assert calls == [] and not (tmp_path / "h" / ".train" / "cache.pt").exists()


def test_the_least_a_run_needs_counts_each_part():
    parts = fc.minimum_parts(12.0, 0.01, {"heldout": 100, "train": 300}, 0.5, 2.0, 40)
    assert parts["reading the target"] == 12.0 and parts["the first replies"] == pytest.approx(4.0)
    assert parts["the held-out checks"] == pytest.approx(2 * 0.5 * 2.0 * 0.01 * 100)
    assert parts["timed steps"] == pytest.approx((eb.PROBE_STEPS + 1) * fc.BACKWARD * 0.5 * 0.01 * 40)
    assert parts["saving"] == eb.SAVE_S
    fc.refuse_below(sum(parts.values()) / 60 + 1e-9, parts)  # at the least: taken
    assert [fc.at_least(m) for m in (0.2, 1.8, 2.0, 9.7, 12.3, 61.0)] == [0.5, 2.0, 2.0, 10.0, 13.0, 65.0]


def test_a_heads_share_of_a_target_pass_follows_their_weights():
    """SmolLM2-135M (30 layers, hidden 576, vocabulary 49,152) against a 16,384-id head at depth 3: about a third,
    as its held-out checks took (~1 min) against writing those replies (~2.5 min)."""
    from transformers import LlamaConfig

    smol = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                       num_key_value_heads=3, vocab_size=49152)
    assert 0.25 < fc.head_share(smol, 16384, 1, 3) < 0.45
    assert fc.head_share(smol, 16384, 2, 3) > fc.head_share(smol, 16384, 1, 3) > fc.head_share(smol, 4096, 1, 3)


# ------------------------------------------------------------------------------- before and after


def test_the_acceptance_curve_goes_through_its_anchors_and_inverts():
    for rows, alpha in fc.ANCHORS:
        assert fc.expected_alpha(rows) == pytest.approx(alpha)
        assert fc.rows_for(alpha) == pytest.approx(rows, rel=1e-6)
    xs = [10 ** (k / 4) for k in range(0, 40)]
    values = [fc.expected_alpha(x) for x in xs]
    assert values == sorted(values) and values[-1] == fc.CEILING and fc.expected_alpha(0) == fc.UNTRAINED
    assert fc.rows_for(fc.CEILING) == math.inf
    assert fc.trained_rows(100, 8, 50.0, 1000) == 4000 and fc.trained_rows(2, 8, 50.0, 10**6) == 800


def test_a_head_pays_when_theory_says_a_chain_beats_plain_decoding():
    """At c 0.15 a one-draft chain breaks even at acceptance 0.15; measured acceptances by depth give theory's
    speedup when they are all alike."""
    assert fc.alpha_for(1.0, 3) == pytest.approx(fc.C_DRAFT, abs=1e-6)
    assert fc.measured_speedup([0.5, 0.5, 0.5])[0] == pytest.approx(max(speedup(0.5, g, 0.15) for g in (1, 2, 3)))
    assert fc.measured_speedup([0.5, 0.5, 0.5]) == (pytest.approx(speedup(0.5, 2, 0.15)), 2)  # 2 drafts best
    strong = fc.verdict({"alpha_by_depth": [0.5, 0.48, 0.47], "alpha1": 0.5, "tokens_per_pass": 1.84}, 3, 5e5,
                        160.0, replace(SMALL, time_limit=60.0), 120.0, True)
    assert strong["pays"] and strong["advice"] is None and fc.verdict_line(strong, {}) is None
    held = {"alpha_by_depth": [0.021, 0.1, 0.1], "alpha1": 0.021, "tokens_per_pass": 1.02}
    cfg = replace(SMALL, time_limit=2.0, batch_size=8)
    weak = fc.verdict(held, 3, 1e4, 100.0, cfg, 60.0, True)
    advice = weak["advice"]
    assert not weak["pays"] and weak["speedup"] < 1
    assert advice["rows"] == pytest.approx(fc.rows_for(weak["alpha1_worth"]))
    more = advice["rows"] / 1e4  # the curve's rows over this run's: its time past the least scaled as much
    assert more > 10 and advice["time_limit"] == fc.at_least((60.0 + 60.0 * more) / 60)
    assert advice["sequences"] == math.ceil(advice["rows"] / fc.PASSES_USEFUL / 100.0)
    assert advice["steps"] == math.ceil(advice["rows"] / (8 * 100.0))
    line = fc.verdict_line(weak, held)
    assert line.startswith("warning: this head is too weak to pay for itself: held-out first-draft acceptance 0.021")
    assert f"give --time-limit {advice['time_limit']:g} or more, with --sequences {advice['sequences']}" in line
    for unbound in (fc.verdict(held, 3, 1e4, 100.0, cfg, 60.0, False),  # the limit did not bind: data and steps did
                    fc.verdict(held, 3, 1e4, 100.0, replace(cfg, time_limit=None), None, False)):
        assert unbound["advice"]["time_limit"] is None
        assert fc.verdict_line(unbound, held).endswith(f"give --sequences {advice['sequences']} --steps "
                                                       f"{advice['steps']} or more")
    few = fc.verdict(held, 3, 1e4, 100.0, replace(cfg, steps=10**6, num_sequences=10**6), 60.0, True)["advice"]
    assert few["steps"] == few["sequences"] == 10**6  # never advised below what was asked


def test_the_run_says_what_it_expects_before_training_and_records_where_it_stopped(target, tmp_path):
    events = []
    record = train_eagle(target, tmp_path / "head", replace(SMALL, time_limit=30.0), prompts=PROMPTS,
                         progress=lambda phase, *a: events.append(phase), say=lambda line: events.append(line))
    said = [e for e in events if e.startswith("eagle train: expect")]
    assert len(said) == 1 and events.index(said[0]) < events.index("train")  # before the first step
    assert "min in all" in said[0] and "held-out first-draft acceptance near" in said[0]
    f = record["forecast"]
    assert f["steps"] == 30 and 0 < f["elapsed_s"] < f["total_s"] and 0 <= f["alpha1"] <= fc.CEILING
    limit = record["time_limit"]
    assert limit["stopped_because"] == "all of --steps" and limit["stopped_at_step"] is None
    assert limit["data_stopped"] == {"prompts": None, "heldout": None, "replies": None, "text": None}
    assert limit["minimum_s"] == pytest.approx(sum(limit["minimum"].values())) and limit["minimum_s"] > eb.SAVE_S
    assert record["verdict"]["c"] == fc.C_DRAFT and isinstance(record["verdict"]["pays"], bool)
    assert json.loads((tmp_path / "head" / "training.json").read_text()) == record


def test_the_cli_warns_when_the_head_is_too_weak_to_pay(target, tmp_path):
    """Six steps on a random target leave a head no chain pays for: the CLI says so, and what to give."""
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(PROMPTS))
    r = CliRunner().invoke(main, ["eagle", "train", str(target), "-o", str(tmp_path / "head"), "--prompts",
                                  str(prompts), "--steps", "6", "--seq-len", "32", "--sequences", "16",
                                  "--draft-vocab", "64", "--batch-size", "4", "--compute", "float32",
                                  "--time-limit", "20"])
    assert r.exit_code == 0, r.output
    record = json.loads((tmp_path / "head" / "training.json").read_text())
    assert not record["verdict"]["pays"]
    assert "eagle train: expect about" in r.output
    warning = [ln for ln in r.output.splitlines() if ln.startswith("warning: this head is too weak to pay")]
    advice = record["verdict"]["advice"]  # all six steps ran well within the limit: more data and steps, not time
    assert advice["time_limit"] is None and len(warning) == 1
    assert warning[0].endswith(f"give --sequences {advice['sequences']} --steps {advice['steps']} or more")
