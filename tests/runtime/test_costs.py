"""The verify-cost curve kept in specrt's cache: measured once per graph, backend and machine, read back by the
next process, measured again whenever what it depends on changes or its file cannot be trusted."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import specrt
from specrt.runtime.costs import measure_verify_costs, remembered_verify_costs, timed_rows


class Stand:
    """The slice of CachedModel the measurement uses: a pass of r rows takes ``base`` + r ms."""

    def __init__(self, ms_per_row: float = 1e-3, base: float = 0.0):
        self.forward_s, self.feeds, self.ms_per_row, self.base = 0.0, 0, ms_per_row, base
        self.fed: set[int] = set()
        self.cache = type("Cache", (), {"max_context": 64, "truncate": lambda c, n: None})()

    def reset(self):
        pass

    def feed(self, tokens, sampling, last=1):
        self.feeds += 1
        self.fed.add(len(tokens))
        self.forward_s += self.base + self.ms_per_row * len(tokens)


def test_a_long_curve_times_every_chain_count_then_a_few_and_draws_the_lines_between():
    model = Stand(base=0.01)  # a 10 ms pass + 1 ms a row
    costs = measure_verify_costs(model, max_rows=22, context=30)
    assert costs == pytest.approx(tuple((10 + r) / 11 for r in range(1, 23)))  # exact on a straight line
    assert model.fed - {30} == set(timed_rows(22)) == {*range(1, 10), 12, 16, 22}  # 30: the context's prefill
    assert timed_rows(5) == [1, 2, 3, 4, 5] and timed_rows(33) == [*range(1, 10), 12, 16, 22, 28, 33]
    bent = Stand(base=0.01)
    bent.feed = lambda tokens, sampling, last=1: setattr(  # 12 rows and beyond cost 5 ms more: a kernel's step
        bent, "forward_s", bent.forward_s + 0.01 + 1e-3 * len(tokens) + (5e-3 if len(tokens) >= 12 else 0.0))
    v = measure_verify_costs(bent, max_rows=16, context=4)
    assert v[8] == pytest.approx(19 / 11) and v[11] == pytest.approx(27 / 11)  # timed: 9 and 12 rows
    assert v[9] == pytest.approx((19 + 8 / 3) / 11)  # 10 rows: a third of the way from 9's to 12's


KEY = {"graph": "/b/target.onnx", "bytes": 10, "mtime_ns": 1, "threads": 2}


def test_measured_once_then_read_back_by_a_fresh_model(tmp_path):
    first = Stand()
    costs = remembered_verify_costs(first, KEY, 6, tmp_path)
    assert first.feeds > 0 and costs == pytest.approx(tuple(float(r) for r in range(1, 7)))
    (kept,) = (tmp_path / "verify-costs").iterdir()
    assert json.loads(kept.read_text())["key"] == KEY
    again = Stand(ms_per_row=5e-3)  # another process: nothing measured, the kept curve returned
    assert remembered_verify_costs(again, KEY, 6, tmp_path) == costs and again.feeds == 0
    assert remembered_verify_costs(again, KEY, 4, tmp_path) == costs[:4] and again.feeds == 0


def test_another_key_or_more_rows_is_measured_again(tmp_path):
    remembered_verify_costs(Stand(), KEY, 4, tmp_path)
    other = Stand()
    remembered_verify_costs(other, {**KEY, "mtime_ns": 2}, 4, tmp_path)  # the graph was rewritten
    assert other.feeds > 0
    longer = Stand()
    assert len(remembered_verify_costs(longer, KEY, 8, tmp_path)) == 8 and longer.feeds > 0
    after = Stand()
    assert len(remembered_verify_costs(after, KEY, 8, tmp_path)) == 8 and after.feeds == 0  # the longer one kept


def test_an_unreadable_entry_or_unwritable_folder_costs_a_measurement_not_an_error(tmp_path):
    remembered_verify_costs(Stand(), KEY, 4, tmp_path)
    (kept,) = (tmp_path / "verify-costs").iterdir()
    kept.write_text('{"key": ')  # cut short
    redo = Stand()
    assert remembered_verify_costs(redo, KEY, 4, tmp_path) == pytest.approx((1.0, 2.0, 3.0, 4.0)) and redo.feeds > 0
    assert json.loads(kept.read_text())["key"] == KEY  # rewritten whole
    blocked = tmp_path / "file"
    blocked.write_text("")  # the cache folder's place holds a file: nothing can be written under it
    for _ in range(2):
        model = Stand()
        assert remembered_verify_costs(model, KEY, 4, blocked) == pytest.approx((1.0, 2.0, 3.0, 4.0))
        assert model.feeds > 0


def test_a_second_load_reads_the_curve_and_a_rewritten_graph_measures_it_again(close_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path / "cache"))
    bundle = shutil.copytree(close_bundle, tmp_path / "bundle")

    def load_counting():
        gen = specrt.load(bundle, threads=1)
        decoder = gen._models["target"].decoder
        real, calls = decoder.forward, []
        decoder.forward = lambda *a, **k: calls.append(1) or real(*a, **k)
        return gen, calls

    gen, calls = load_counting()
    costs = gen.verify_costs()
    assert calls and costs[0] == 1.0
    gen, calls = load_counting()
    assert gen.verify_costs() == costs and not calls
    target = bundle / gen.manifest.target.file
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 10**9))
    gen, calls = load_counting()
    gen.verify_costs()
    assert calls  # a new graph file: its own curve
    assert gen.verify_cost_key()["graph"] == str(target.resolve())


def test_a_gpu_provider_measures_per_load_and_keeps_nothing(close_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path / "cache"))
    gen = specrt.load(close_bundle, threads=1)
    gen._models["target"].decoder.provider = "CUDAExecutionProvider"  # milliseconds there; engine shapes unkeyed
    assert gen.verify_costs()[0] == 1.0
    assert not (tmp_path / "cache" / "verify-costs").exists()
