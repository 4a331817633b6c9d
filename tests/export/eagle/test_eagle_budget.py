"""`specrt eagle train --time-limit` and the memory / disk bounds on its data (specrt/export/eagle/budget.py): the
plan's arithmetic on its own, where generating stops and how the replies spread over the prompts when it does,
a run whose step count is fitted to its limit, one that overruns its plan and stops at the limit with a saved head,
a resumed run keeping its plan, and the CLI."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner
from support.eagle_train import PROMPTS, SMALL, small_target

from specrt.cli import main
from specrt.errors import ConfigError
from specrt.export.eagle import budget as eb
from specrt.export.eagle import data as ed
from specrt.export.eagle import forecast as fc
from specrt.export.eagle.config import tap_layers
from specrt.export.eagle.checkpoint import load_eagle3
from specrt.export.eagle.train import EagleTrainConfig, train_eagle


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return small_target(tmp_path_factory.mktemp("eagle-budget") / "target")


# ----------------------------------------------------------------------------------------- the arithmetic


def test_the_plan_counts_each_steps_cost_keeps_the_reserve_and_stays_within_bounds():
    assert eb.plan_steps([1.0, 1.0, 1.0, 3.0, 3.0], 2.0 + 7 * eb.STEP_MARGIN, 2.0, 100) == 4  # 7 s of room; a later
    # long step counts
    assert eb.plan_steps(iter([1.0] * 10), 100.0, 0.0, 5) == 5  # --steps stays the most
    assert eb.plan_steps([5.0], 1.0, 16.0, 10) == 1  # nothing fits: still one step
    assert eb.plan_steps((1.0 for _ in iter(int, 1)), 20.5 * eb.STEP_MARGIN, 0.0, 10**9) == 20  # endless: time cuts
    assert eb.padded_tokens([3, 9, 4, 7], [0, 2, 3]) == 3 * 7
    assert eb.in_order_tokens([3, 9, 4, 7, 2], 2) == 2 * 9 + 2 * 7 + 1 * 2
    limit = eb.TimeLimit.minutes(10, start=100.0)
    assert (limit.prompts_end, limit.data_end, limit.end) == (200.0, 400.0, 700.0)
    assert eb.TimeLimit.minutes(None, 0.0) is None


def test_a_plan_prices_the_steps_by_their_token_rows(monkeypatch):
    """Timed steps of 1,000 and 3,000 token rows took 1 s and 3 s: 1 ms a row; then 10 s of room (less the
    measured check and the save) hold the steps whose rows add up to it, whatever the probe's own batches were."""
    monkeypatch.setattr(eb, "time_steps", lambda step, steps, device: [(1, 1.0), (2, 3.0)])
    rows = {1: 1000, 2: 3000, 3: 2000, 4: 2000, 5: 4000, 6: 500}
    left = 2.0 * eb.EVAL_MARGIN + eb.SAVE_S + 10.0 * eb.STEP_MARGIN  # + a hair for the clock running meanwhile
    limit = eb.TimeLimit(time.perf_counter(), left + 0.05)
    plan = eb.plan_training(None, rows.get, 1, 7, limit, torch.device("cpu"), 2.0, 0)
    assert plan["s_per_token"] == pytest.approx(1e-3) and plan["evaluate_s"] == 2.0
    assert plan["steps"] == 5 and plan["step_s"] == pytest.approx(2.0)  # steps 1-4: 1 + 3 + 2 + 2 s
    assert plan["reserve_s"] == pytest.approx(2.0 * eb.EVAL_MARGIN + eb.SAVE_S)
    unmeasured = eb.plan_training(None, rows.get, 1, 7, limit, torch.device("cpu"), None, 5000)
    assert unmeasured["evaluate_s"] == pytest.approx(eb.EVAL_FRACTION * 5.0)  # priced from the held-out rows


def test_a_cache_rows_bytes_are_what_the_cache_holds():
    """row_bytes' cache figure is one SequenceCache row's size, so the memory and disk bounds count real bytes."""
    _, cached = eb.row_bytes(32, 24, 16)
    c = ed.SequenceCache(tokens=torch.zeros(1, 32, dtype=torch.int32), length=torch.zeros(1, dtype=torch.int32),
                         start=torch.zeros(1, dtype=torch.int32), stop=torch.zeros(1, dtype=torch.int32),
                         taps=torch.zeros(1, 32, 72, dtype=torch.float16), logp=torch.zeros(1, 32, 16, dtype=torch.float16),
                         ids=torch.zeros(1, 32, 16, dtype=torch.int32), top1=torch.zeros(1, 32, dtype=torch.int32))
    assert cached == c.nbytes()


def test_the_data_bound_is_the_tighter_of_memory_and_disk(tmp_path, monkeypatch):
    from specrt.runtime.backends import onnxruntime as ortb

    gen, cached = eb.row_bytes(256, 576, 64)
    lim = eb.data_limits(None, tmp_path / "not-yet" / ".train", 256, 576, 64, memory=10 * 2**30, disk=2**40)
    assert (lim.bound_by, lim.max_rows) == ("memory", int(0.8 * 10 * 2**30) // (gen + cached))
    assert lim.until is None and lim.prompts_until is None and not lim.out_of_time()
    lim = eb.data_limits(eb.TimeLimit(0.0, 60.0), tmp_path, 256, 576, 64, memory=2**40, disk=2**30)
    assert (lim.bound_by, lim.max_rows) == ("disk", int(0.9 * 2**30) // cached)
    assert (lim.prompts_until, lim.until) == (10.0, 30.0) and lim.out_of_time()
    assert eb.free_disk(tmp_path / "a" / "b") == eb.free_disk(tmp_path) > 0  # a folder not made yet: its parent's
    monkeypatch.setattr(ortb, "available_memory", lambda: None)  # off Linux: the disk alone bounds the data
    assert eb.data_limits(None, tmp_path, 256, 576, 64, disk=2**30).bound_by == "disk"
    monkeypatch.setattr(ortb, "available_memory", lambda: 2**20)  # read when not given
    assert eb.data_limits(None, tmp_path, 256, 576, 64, disk=2**40).max_rows == 0


def test_steps_are_timed_but_the_first():
    calls = []
    timed = eb.time_steps(calls.append, range(5, 9), torch.device("cpu"))
    assert [k for k, _ in timed] == [6, 7, 8] and all(s >= 0 for _, s in timed) and calls == [5, 6, 7, 8]
    assert [k for k, _ in eb.time_steps(calls.append, [3], torch.device("cpu"))] == [3]  # one: timed all the same


# ------------------------------------------------------------------------------------------ the data


def _build(target, limits, cfg=SMALL):
    from transformers import AutoModelForCausalLM

    from specrt.export.loading import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(target).eval()
    return ed._build_sequences(model, load_tokenizer(str(target)), cfg, PROMPTS, [], [1], tap_layers(4),
                               lambda *a: None, limits=limits)


def test_generating_stops_at_its_deadline_after_the_held_out_and_one_training_batch(target, monkeypatch):
    monkeypatch.setattr(ed, "_GEN_BATCH", 4)
    train, held, info = _build(target, eb.DataLimits(until=0.0))  # long past
    assert len(held) == info["prompts_heldout"] == 2  # whole, first
    assert len(train) == info["continuations_made"] == 4 and info["generation_cut"] == "time"
    assert info["continuations_asked"] == 8 * 5
    assert len({tuple(q.tokens[:q.start + 1]) for q in train}) == 4  # one round: four prompts, one reply each


def test_a_memory_bound_spreads_the_replies_over_the_prompts(target, monkeypatch):
    monkeypatch.setattr(ed, "_GEN_BATCH", 4)
    train, held, info = _build(target, eb.DataLimits(max_rows=2 + 14, bound_by="memory"))
    assert info["generation_cut"] == "memory" and len(train) == 12  # three whole batches fit beside the held-out 2
    per_prompt = Counter(tuple(q.tokens[:q.start + 1]) for q in train)
    assert len(per_prompt) == 8 and max(per_prompt.values()) - min(per_prompt.values()) <= 1
    _, _, unbounded = _build(target, eb.DataLimits(max_rows=1000, bound_by="memory"))
    assert unbounded["generation_cut"] is None and unbounded["continuations_made"] == 40
    with pytest.raises(ConfigError, match=r"held-out replies and one batch of training replies \(6 sequences .* more "
                                          r"disk than this host has \(room for 5\)"):
        _build(target, eb.DataLimits(max_rows=5, bound_by="disk"))  # refused before any reply is written


def test_self_prompts_stop_at_their_deadline_after_one_batch(monkeypatch):
    from specrt.export.eagle import prompts as ep

    batches = []

    def fake_continue(model, prompts, *a):
        batches.append(len(prompts))
        return []  # no message ends: every row is dropped, so only the deadline stops it

    monkeypatch.setattr(ep, "continue_prompts", fake_continue)
    monkeypatch.setattr(ep, "user_turn", lambda tok: ([5], [6]))
    assert ep.write_prompts(None, None, 10, [1], None, (), batch=4, until=0.0) == [] and batches == [4]
    batches.clear()
    ep.write_prompts(None, None, 10, [1], None, (), batch=4, until=time.perf_counter() + 60)
    assert batches == [4] * 10  # DRAWS_PER_PROMPT · n rows without a deadline


# ---------------------------------------------------------------------------------------- whole runs


def test_a_generous_limit_trains_every_step_and_records_its_plan(target, tmp_path):
    record = train_eagle(target, tmp_path / "head", replace(SMALL, time_limit=30.0), prompts=PROMPTS)
    plan = record["time_limit"]
    assert plan["steps"] == 30 and plan["stopped_at_step"] is None and plan["minutes"] == 30.0
    assert plan["step_s"] > 0 and plan["s_per_token"] > 0 and plan["reserve_s"] >= eb.SAVE_S
    assert plan["evaluate_s"] == record["time_s"]["evaluate_init"]  # the first check, timed, prices the last
    assert len(record["loss"]["history"]) == 30 and record["data"]["generation_cut"] is None
    json.loads((tmp_path / "head" / "training.json").read_text())  # written, as without a limit


def test_a_tight_limit_cuts_the_data_and_plans_the_steps_that_fit(target, tmp_path, monkeypatch):
    monkeypatch.setattr(ed, "_GEN_BATCH", 4)
    monkeypatch.setattr(eb, "plan_steps", lambda costs, left, reserve, most: min(most, 7))  # as if 7 fitted
    monkeypatch.setattr(fc, "refuse_below", lambda minutes, parts: None)  # (such a limit is refused up front)
    record = train_eagle(target, tmp_path / "head", replace(SMALL, time_limit=1e-6), prompts=PROMPTS)
    assert record["data"]["generation_cut"] == "time" and record["data"]["continuations_made"] == 4
    assert record["time_limit"]["steps"] == 7
    assert len(record["loss"]["history"]) == 1  # the limit had passed: one step, then stopped, checked and saved
    assert record["time_limit"]["stopped_at_step"] == 1 and record["time_limit"]["stopped_because"] == "the time limit"
    assert record["time_limit"]["data_stopped"]["replies"] == "time" and record["time_limit"]["replies_cut_short"] > 0
    assert record["verdict"]["advice"]["time_limit"] is not None  # the limit bound it: a longer one is advised
    load_eagle3(tmp_path / "head")
    assert record["heldout"]["roots"] > 0 and not (tmp_path / "head" / ".train").exists()


def test_a_limited_run_planned_at_n_steps_trains_the_head_an_n_step_run_does(target, tmp_path, monkeypatch):
    """Greedy replies (the same data in either order), a plan of 10 steps: the timed steps ran on copies and the
    schedule is 10 steps', so the head is bit for bit the one ``--steps 10`` trains without a limit."""
    greedy = replace(SMALL, temperature=0.0)
    monkeypatch.setattr(eb, "plan_steps", lambda costs, left, reserve, most: 10)
    limited = train_eagle(target, tmp_path / "limited", replace(greedy, time_limit=30.0), prompts=PROMPTS)
    plain = train_eagle(target, tmp_path / "plain", replace(greedy, steps=10), prompts=PROMPTS)
    assert limited["time_limit"]["steps"] == 10 and len(limited["loss"]["history"]) == 10
    assert limited["loss"]["history"] == plain["loss"]["history"] and limited["heldout"] == plain["heldout"]
    a, b = load_eagle3(tmp_path / "limited")[1], load_eagle3(tmp_path / "plain")[1]
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_resumed_run_keeps_the_plan_its_checkpoint_made(target, tmp_path, monkeypatch):
    """...and ends with the head the uninterrupted run trains: its timed steps touch copies, never the optimizer's
    restored state."""
    out = tmp_path / "head"
    monkeypatch.setattr(eb, "plan_steps", lambda costs, left, reserve, most: 12)
    whole = train_eagle(target, tmp_path / "whole", replace(SMALL, time_limit=30.0), prompts=PROMPTS)

    def stop_at_6(phase, done, total, loss):
        if phase == "train" and done == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_eagle(target, out, replace(SMALL, time_limit=30.0), prompts=PROMPTS, progress=stop_at_6)
    monkeypatch.setattr(eb, "plan_steps", lambda costs, left, reserve, most: 29)  # a new plan is not taken
    record = train_eagle(target, out, replace(SMALL, time_limit=20.0), prompts=PROMPTS, resume=True)
    assert record["resumed_from"] == 5 and record["time_limit"]["steps"] == 12
    assert len(record["loss"]["history"]) == 12 and record["loss"]["history"] == whole["loss"]["history"]
    a, b = load_eagle3(out)[1], load_eagle3(tmp_path / "whole")[1]
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


# ------------------------------------------------------------------------------------------ the CLI


def test_the_cli_takes_a_time_limit_and_a_held_out_share_and_says_what_it_planned(target, tmp_path):
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(PROMPTS))
    out = tmp_path / "head"
    r = CliRunner().invoke(main, ["eagle", "train", str(target), "-o", str(out), "--prompts", str(prompts),
                                  "--steps", "6", "--seq-len", "32", "--sequences", "16", "--draft-vocab", "64",
                                  "--batch-size", "4", "--compute", "float32", "--time-limit", "20",
                                  "--heldout", "0.3"])
    assert r.exit_code == 0, r.output
    assert "steps: 6 of the 6 allowed, planned 6 at" in r.output and "to end within 20 min" in r.output
    record = json.loads((out / "training.json").read_text())
    assert record["config"]["time_limit"] == 20.0 and record["config"]["heldout_fraction"] == 0.3
    # 3 of the 10 prompts held out (the default 0.1: one), one greedy reply each
    assert record["data"]["prompts_heldout"] == 3 and record["data"]["sequences_heldout"] == 3
    assert "(from " in r.output and " over 3 held-out sequences;" in r.output
    for option, bad in (("--time-limit", "0"), ("--time-limit", "-3"), ("--time-limit", "soon"), ("--heldout", "0"),
                        ("--heldout", "1"), ("--heldout", "a tenth")):
        r = CliRunner().invoke(main, ["eagle", "train", str(target), "-o", str(tmp_path / "x"), option, bad])
        assert r.exit_code == 2 and option in r.output and not (tmp_path / "x").exists()
    with pytest.raises(ConfigError, match="time_limit"):
        EagleTrainConfig(time_limit=float("inf"))


def test_the_cli_says_when_a_warm_start_ends_worse_than_it_began(target, tmp_path, monkeypatch):
    """A short or data-poor run can leave an --init head worse on the held-out replies; the closing lines say so."""
    import specrt.export.eagle.train as et

    def fake(model, output, cfg, **kwargs):
        return {"heldout": {"alpha1": 0.474, "tokens_per_pass": 1.79}, "compute": "float32", "device": "cpu",
                "heldout_init": {"alpha1": 0.502, "tokens_per_pass": 1.85}, "time_s": {"total_this_run": 60.0},
                "data": {"generation_cut": None}, "time_limit": None}

    monkeypatch.setattr(et, "train_eagle", fake)
    args = ["eagle", "train", str(target), "-o", str(tmp_path / "h")]
    r = CliRunner().invoke(main, [*args, "--init", str(tmp_path / "old")])
    assert r.exit_code == 0, r.output
    assert "first draft 0.474 (from 0.502), 1.79 tokens per target pass at depth 3 (from 1.85;" in r.output
    assert f"note: {tmp_path / 'old'} drafted better on these held-out replies than the new head" in r.output
    assert "note:" not in CliRunner().invoke(main, args).output  # a fresh head: nothing to compare with
