"""specrt verify's checks: each passes on a good bundle and fails on a broken one."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter

import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

import specrt
from specrt.check.verify import (
    check_draft_pays,
    check_golden,
    check_greedy,
    check_sampling,
    compare_to_exact,
    exact_distribution,
    row_count_tie,
)
from specrt.cli import main
from specrt.measure.plan import plan_table


def shift_draft_vocab(bundle) -> None:
    """Break a bundle on purpose: the draft's logits rotated by one id (a draft with shifted tokens)."""
    path = bundle / "draft.onnx"
    model = onnx.load(str(path))
    g = model.graph
    for node in g.node:
        node.output[:] = ["logits_raw" if o == "logits" else o for o in node.output]
    ints = lambda name, vals: helper.make_tensor(name, onnx.TensorProto.INT64, [len(vals)], vals)  # noqa: E731
    g.initializer.extend([ints("s1", [1]), ints("e_big", [1 << 62]), ints("s0", [0]), ints("ax", [2])])
    g.node.extend([
        helper.make_node("Slice", ["logits_raw", "s1", "e_big", "ax"], ["tail"]),
        helper.make_node("Slice", ["logits_raw", "s0", "s1", "ax"], ["head"]),
        helper.make_node("Concat", ["tail", "head"], ["logits"], axis=2),
    ])
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def close(close_bundle):
    return specrt.load(close_bundle, threads=1)


def test_golden_logits_pass_and_catch_a_changed_graph(close, close_bundle, tmp_path):
    assert all(check_golden(close, role).passed for role in ("target", "draft"))
    bundle = tmp_path / "b"
    shutil.copytree(close_bundle, bundle)
    m = json.loads((bundle / "specrt.json").read_text())
    m["models"]["target"]["golden"]["top_logits"][3][0] += 0.01
    (bundle / "specrt.json").write_text(json.dumps(m))
    ch = check_golden(specrt.load(bundle, threads=1), "target")
    assert not ch.passed and ch.figures["max_abs_diff"] > 0.009


def test_greedy_and_sampling_checks_pass_on_an_exact_runtime(close):
    prompts = ["def fib(n):", "import os\n"]
    greedy, alpha, c = check_greedy(close, "draft", prompts, 24, 4)
    assert greedy.passed and 0 < alpha < 1 and c > 0
    seen = []
    ch = check_sampling(close, "draft", prompts[0], samples=300, gamma=4, on_sample=seen.append)
    assert ch.passed and ch.figures["outcomes"] <= 16 and seen == list(range(1, 301))
    # fp32: one-row and multi-row passes agree, so the threshold is the statistical one alone
    assert ch.figures["shape_tv"] < 1e-3 and "pass shapes" not in ch.detail
    assert close.reuse_prefix is False  # the draws shared the prompt's K/V, and the setting is put back


def test_the_exact_distribution_is_the_same_decoded_one_row_at_a_time(close):
    from specrt.runtime.sampling import SamplingConfig

    ids = close.encode("def fib(n):")
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    whole, rows = exact_distribution(close, ids, 3, cfg), exact_distribution(close, ids, 3, cfg, one_row=True)
    assert whole.keys() == rows.keys() and len(whole) == 27
    assert sum(rows.values()) == pytest.approx(1.0) and max(abs(whole[k] - rows[k]) for k in whole) < 1e-5


def test_pass_shape_slack_widens_the_threshold_and_says_so():
    """Where the target's own distribution moves by δ with the passes' shapes (quantized kernels), a sampler
    that is δ off the reference is the target's: the threshold grows by δ, and the detail shows it."""
    exact = {(1,): 0.6, (2,): 0.4}
    off = Counter({(1,): 1300, (2,): 700})  # 0.05 from the reference
    assert not compare_to_exact("x", off, exact, "").passed
    ch = compare_to_exact("x", off, exact, "", slack=0.05)
    assert ch.passed and ch.figures["shape_tv"] == 0.05 and "0.050 is what pass shapes alone move" in ch.detail


def test_the_sampling_check_catches_a_biased_sampler():
    """A sampler that over-draws the likelier of two outcomes by 5 points fails at 2000 draws; the exact
    frequencies pass, and an outcome the target cannot produce counts against it."""
    exact = {(1,): 0.6, (2,): 0.4}
    assert compare_to_exact("x", Counter({(1,): 1200, (2,): 800}), exact, "").passed
    biased = compare_to_exact("x", Counter({(1,): 1300, (2,): 700}), exact, "")
    assert not biased.passed and biased.figures["tv"] == pytest.approx(0.05)
    impossible = compare_to_exact("x", Counter({(1,): 1100, (2,): 800, (3,): 100}), exact, "")
    assert not impossible.passed and impossible.figures["outcomes"] == 3


def test_shifted_draft_fails_the_draft_check(close_bundle, tmp_path):
    bundle = tmp_path / "shifted"
    shutil.copytree(close_bundle, bundle)
    shift_draft_vocab(bundle)
    gen = specrt.load(bundle, threads=1)
    greedy, alpha, c = check_greedy(gen, "draft", ["def fib(n):", "class A:"], 24, 4)
    assert greedy.passed  # exact acceptance hides the broken draft from the output...
    assert alpha < 0.05  # ...but not from the acceptance rate
    assert not check_draft_pays(alpha, 0.1).passed
    assert not check_golden(gen, "draft").passed


def test_draft_pays_is_the_theory():
    assert check_draft_pays(0.8, 0.05).passed
    ch = check_draft_pays(0.1, 0.3)
    assert not ch.passed and ch.figures["best_speedup"] < 1
    assert not check_draft_pays(None, 0.1).passed


def test_draft_pays_weighs_what_verifying_rows_costs():
    """A sound draft (α 0.5, c 0.2: 1.25x by the paper's cost) cannot pay where each extra verify row costs
    0.4-0.6 of a plain pass (a quantized target on a CPU): the check says so, and says the draft is fine."""
    dear = (1.0, 1.6, 2.0, 2.4, 2.8, 3.2, 3.6, 4.0, 4.4)
    assert check_draft_pays(0.5, 0.2).passed
    ch = check_draft_pays(0.5, 0.2, verify_costs=dear)
    assert not ch.passed and ch.figures["best_speedup"] < 1 < ch.figures["paper_speedup"]
    assert "the draft is sound" in ch.detail and "2 rows cost 1.60x one" in ch.detail
    cheap = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4)
    ch = check_draft_pays(0.5, 0.2, verify_costs=cheap)
    assert ch.passed and "verify cost v(" in ch.detail


def test_verify_cli_reports_pass_fail(close_bundle):
    res = CliRunner().invoke(main, ["verify", "--bundle", str(close_bundle), "--samples", "200",
                                    "--max-new-tokens", "16", "--prompt-set", "code"])
    assert "PASS  greedy draft == plain" in res.output and "PASS  target logits vs PyTorch" in res.output
    # The close pair's draft is as large as its target (c ~ 1): it cannot pay for itself. Its c is timed, so
    # the verdict is held to the theory at the c it printed: at c >= 1 nothing pays, whatever α and verify cost.
    line = next(x for x in res.output.splitlines() if "draft pays for itself" in x)
    c = float(re.search(r", c ([0-9.]+)", line).group(1))
    best = float(re.search(r"best predicted speedup ([0-9.]+)x", line).group(1))
    assert line.startswith("FAIL") == (best <= 1.0)
    # c is a draft pass over a plain one-row pass of the same size (measured 1.0-1.24): half that already fails
    # the verdict. Timing a verify pass in the loop against the engine-only verify curve once gave 0.16 (PASS).
    assert c > 0.5 and line.startswith("FAIL")
    assert res.exit_code == (1 if "FAIL" in res.output else 0)


def test_plan_table_and_cli():
    rows = plan_table(0.8, 0.02, 16)
    best = max(rows, key=lambda r: r.speedup)
    assert best.gamma == 11 and round(rows[9].speedup, 2) == 3.81
    assert rows[0].expected_tokens == pytest.approx(1.8) and rows[0].relative_cost == pytest.approx(1.02)
    res = CliRunner().invoke(main, ["plan", "--alpha", "0.8", "--c", "0.02"])
    assert res.exit_code == 0 and "optimal γ = 11: 3.82x" in res.output
    res = CliRunner().invoke(main, ["plan", "--alpha", "2", "--c", "0.1"])
    assert res.exit_code == 1 and "alpha must be in [0, 1]" in res.output
    res = CliRunner().invoke(main, ["plan", "--alpha", "0.5"])
    assert res.exit_code == 2


def test_plan_measures_a_bundle(close_bundle):
    res = CliRunner().invoke(main, ["plan", "--bundle", str(close_bundle), "--temperature", "0", "--max-gamma", "8"])
    assert res.exit_code == 0, res.output
    assert "measured on" in res.output and "optimal γ" in res.output
    assert "verify cost v(1..9) on this backend: 1.00, " in res.output and "cost γc+v(γ+1)" in res.output


def test_plan_with_a_verify_cost_curve_shortens_gamma():
    rows = plan_table(0.6, 0.1, 6, verify_costs=(1.0, 1.21, 1.57, 1.71))
    assert rows[1].relative_cost == pytest.approx(0.2 + 1.57) and rows[4].relative_cost == pytest.approx(0.5 + 1.99)
    res = CliRunner().invoke(main, ["plan", "--alpha", "0.6", "--c", "0.1", "--verify-costs", "1,1.21,1.57,1.71,2.0"])
    assert res.exit_code == 0 and "optimal γ = 1: 1.22x" in res.output
    assert "optimal γ = 3" in CliRunner().invoke(main, ["plan", "--alpha", "0.6", "--c", "0.1"]).output
    for bad in ("1,0.9", "1.2,1.3", "one"):
        res = CliRunner().invoke(main, ["plan", "--alpha", "0.6", "--c", "0.1", "--verify-costs", bad])
        assert res.exit_code == 1 and "--verify-costs must" in res.output


def test_plan_plot_writes_a_png_or_names_the_extra(tmp_path):
    out = tmp_path / "speedup.png"
    res = CliRunner().invoke(main, ["plan", "--alpha", "0.7", "--c", "0.05", "--plot", str(out)])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert res.exit_code == 1 and "pip install 'specrt[plot]'" in res.output
    else:
        assert res.exit_code == 0 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _RowCountDecoder:
    """A target whose logits for tokens a=1 and b=2 depend only on how many rows the pass had."""

    def __init__(self, diff_by_rows: dict[int, float]) -> None:
        self.diff_by_rows = diff_by_rows

    def new_cache(self, n):
        import types

        return types.SimpleNamespace(advance=lambda k: None)

    def forward(self, cache, ids, positions, mask):
        import types

        import numpy as np

        logits = np.zeros((len(ids), 4), np.float32)
        logits[-1, 1] = self.diff_by_rows[len(ids)]
        return types.SimpleNamespace(logits=logits)


def _gen_with(decoder):
    import types

    return types.SimpleNamespace(decoders={"target": decoder})


def test_a_greedy_mismatch_is_a_row_count_tie_only_where_pass_shapes_reorder_the_two_tokens():
    ids = [5, 6, 7, 8]
    # one row prefers a by 0.02, three rows prefer b: both outputs are the target's own
    tie = row_count_tie(_gen_with(_RowCountDecoder({1: 0.02, 2: 0.015, 3: -0.01, 4: 0.0})), ids, 1, 2, 3)
    assert tie == (True, pytest.approx(0.02), pytest.approx(0.03))
    # a clear winner that rounding barely moves: a verify pass that chose b is a bug, not a tie
    clear = row_count_tie(_gen_with(_RowCountDecoder({1: 3.0, 2: 2.999, 3: 3.001, 4: 3.0})), ids, 1, 2, 3)
    assert clear == (False, pytest.approx(3.0), pytest.approx(0.001, abs=1e-4))
    # a gap within how far pass shapes move this position's logits: tied, though no shape reorders them
    small = row_count_tie(_gen_with(_RowCountDecoder({1: 0.2, 2: 0.6, 3: 0.5, 4: 0.2})), ids, 1, 2, 3)
    assert small[0] and small[1] == pytest.approx(0.2)


def test_check_greedy_passes_row_count_ties_and_fails_real_differences(monkeypatch):
    import types

    import specrt.check.verify as V

    plain, spec = [10, 11, 12, 13], [10, 11, 99, 13]
    result = lambda ids: types.SimpleNamespace(token_ids=ids, stats=types.SimpleNamespace(  # noqa: E731
        alpha_estimate=0.5, target_passes=3, draft_s=0.3, draft_passes=6, verify_s=0.2))
    monkeypatch.setattr(V, "_generate", lambda gen, prompt, chat, method, **o: result(plain if method == "none" else spec))
    monkeypatch.setattr(V, "_encode", lambda gen, prompt, chat: [1, 2])
    seen = []
    monkeypatch.setattr(V, "row_count_tie", lambda gen, ids, a, b, rows: (seen.append((ids, a, b, rows)), (True, 0.01, 0.3))[1])
    ch, alpha, c = V.check_greedy(None, "eagle", ["p"], 4, 2)
    assert ch.passed and ch.figures["row_count_ties"] == 1 and "near-tie" in ch.detail
    assert seen == [([1, 2, 10, 11], 12, 99, 3)] and alpha == 0.5 and c == pytest.approx(0.05)
    monkeypatch.setattr(V, "row_count_tie", lambda gen, ids, a, b, rows: (False, 4.2, 0.3))
    ch, *_ = V.check_greedy(None, "eagle", ["p"], 4, 2)
    assert not ch.passed and "prompt 0 differs at token 2" in ch.detail
