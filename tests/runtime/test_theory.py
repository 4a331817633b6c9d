import math

import numpy as np
import pytest

from specrt import theory


def test_expected_tokens_hand_values():
    assert theory.expected_tokens(0.0, 4) == 1.0
    assert theory.expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert theory.expected_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)  # 3.3616
    assert theory.expected_tokens(0.8, 4) == pytest.approx(3.3616)
    assert theory.expected_tokens(1.0, 7) == 8.0
    # Continuous at alpha -> 1.
    assert theory.expected_tokens(1 - 1e-9, 7) == pytest.approx(8.0, rel=1e-6)


def test_speedup_hand_values():
    # The seed table: alpha 0.8, c 0.02, gamma 10 gives 3.81x.
    assert theory.speedup(0.8, 10, 0.02) == pytest.approx((1 - 0.8**11) / 0.2 / 1.2)
    assert round(theory.speedup(0.8, 10, 0.02), 2) == 3.81
    assert theory.speedup(0.0, 3, 0.5) == pytest.approx(1 / 2.5)


def test_optimal_gamma_is_the_argmax():
    for alpha, c in [(0.8, 0.02), (0.6, 0.1), (0.9, 0.05), (0.3, 0.5)]:
        g = theory.optimal_gamma(alpha, c)
        best = max(range(1, 65), key=lambda k: theory.speedup(alpha, k, c))
        assert g == best
    # alpha 0.8, c 0.02: the true optimum is gamma 11 (3.817x), just above gamma 10 (3.809x).
    assert theory.optimal_gamma(0.8, 0.02) == 11
    assert theory.speedup(0.8, 11, 0.02) == pytest.approx(3.8167, abs=1e-4)
    assert theory.speedup(0.8, 12, 0.02) < theory.speedup(0.8, 11, 0.02)
    assert theory.optimal_gamma(1.0, 0.0, max_gamma=16) == 16
    assert theory.optimal_gamma(0.0, 0.1) == 1


def test_acceptance_rate():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.6, 0.1, 0.2])
    assert theory.acceptance_rate(p, q) == pytest.approx(0.1 + 0.3 + 0.1)
    assert theory.acceptance_rate(p, p) == pytest.approx(1.0)
    assert theory.acceptance_rate([1, 0], [0, 1]) == 0.0


@pytest.mark.parametrize("bad", [lambda: theory.expected_tokens(1.5, 2), lambda: theory.speedup(0.5, 2, -1),
                                 lambda: theory.optimal_gamma(0.5, 0.1, 0),
                                 lambda: theory.acceptance_rate([1.0], [0.5, 0.5])])
def test_bad_values_raise(bad):
    with pytest.raises(ValueError):
        bad()


def test_speedup_formula_consistency():
    for alpha in (0.1, 0.5, 0.9):
        for g in (1, 3, 8):
            assert theory.speedup(alpha, g, 0.0) == pytest.approx(sum(alpha**i for i in range(g + 1)))
            assert math.isfinite(theory.speedup(alpha, g, 1.0))


def test_ops_factor_and_oracle_against_the_paper():
    # Leviathan et al.: with gamma = 1 the walltime improvement is (1 + alpha) / (1 + c) ...
    for alpha, c in [(0.6, 0.1), (0.9, 0.05)]:
        assert theory.speedup(alpha, 1, c) == pytest.approx((1 + alpha) / (1 + c))
    # ... E[tokens] with unlimited gamma is 1 / (1 - alpha): 5 at alpha 0.8, approached as gamma grows.
    assert theory.oracle_tokens(0.8) == pytest.approx(5.0)
    assert theory.expected_tokens(0.8, 4) < theory.expected_tokens(0.8, 16) < theory.oracle_tokens(0.8)
    assert theory.expected_tokens(0.8, 200) == pytest.approx(5.0)
    assert theory.oracle_tokens(0.0) == 1.0 and theory.oracle_tokens(1.0) == math.inf
    # Eq. 11 by hand: (1 - a)(g mu + g + 1) / (1 - a^(g+1)).
    assert theory.ops_factor(0.5, 2, 0.1) == pytest.approx(0.5 * 3.2 / 0.875)  # 1.828571
    assert theory.ops_factor(0.0, 3, 0.5) == pytest.approx(5.5)  # nothing accepted: every pass buys 1 token
    assert theory.ops_factor(1.0, 3, 0.1) == pytest.approx(4.3 / 4)  # the alpha = 1 limit
    assert theory.ops_factor(1 - 1e-9, 3, 0.1) == pytest.approx(4.3 / 4, rel=1e-6)
    assert theory.ops_factor(0.8, 1, 0.0) == pytest.approx(2 / 1.8)


@pytest.mark.parametrize("bad", [lambda: theory.ops_factor(0.5, 2, -0.1), lambda: theory.ops_factor(1.2, 2, 0.1),
                                 lambda: theory.ops_factor(0.5, -1, 0.1), lambda: theory.oracle_tokens(-0.1)])
def test_ops_factor_and_oracle_reject_bad_values(bad):
    with pytest.raises(ValueError):
        bad()


def test_verify_cost_curve_reads_and_extrapolates():
    costs = (1.0, 1.2, 1.5, 1.9)
    assert theory.verify_cost_at(None, 7) == 1.0  # the paper's memory-bound pass
    assert theory.verify_cost_at(costs, 1) == 1.0 and theory.verify_cost_at(costs, 3) == 1.5
    assert theory.verify_cost_at(costs, 6) == pytest.approx(1.9 + 2 * 0.4)  # the last two points' line
    assert theory.verify_cost_at((1.0, 1.3, 1.2), 5) == 1.2  # a falling tail is not extended downwards
    with pytest.raises(ValueError):
        theory.verify_cost_at(costs, 0)


def test_speedup_with_verify_costs_divides_by_the_pass_it_pays():
    costs = (1.0, 1.21, 1.57, 1.71)
    assert theory.speedup(0.53, 2, 0.23, costs) == pytest.approx(theory.expected_tokens(0.53, 2) / (0.46 + 1.57))
    assert theory.speedup(0.8, 3, 0.1, (1.0,) * 4) == theory.speedup(0.8, 3, 0.1)


def test_costly_rows_shorten_the_optimal_gamma():
    # the SmolLM2 int8 bundle's measured curve: a chain of one, where the memory-bound assumption asks for 3
    int8 = (1.0, 1.21, 1.57, 1.71, 2.0, 2.17, 2.51, 2.75, 3.03)
    assert theory.optimal_gamma(0.6, 0.1) == 3
    assert theory.optimal_gamma(0.6, 0.1, verify_costs=int8) == 1
    flat = (1.0, 1.1, 1.21, 1.21, 1.25, 1.35, 1.59, 1.8, 1.8)  # its fp32 bundle: near-free rows up to six
    assert theory.optimal_gamma(0.75, 0.05, 16, flat) == 4
    for alpha, c in [(0.5, 0.1), (0.8, 0.05), (0.95, 0.01)]:
        g = theory.optimal_gamma(alpha, c, 16, int8)
        assert g == max(range(1, 17), key=lambda k: (theory.speedup(alpha, k, c, int8), -k))


def test_verify_costs_from_times_is_relative_and_never_falls():
    assert theory.verify_costs_from_times([0.010, 0.012, 0.011, 0.015]) == pytest.approx((1.0, 1.2, 1.2, 1.5))
    with pytest.raises(ValueError):
        theory.verify_costs_from_times([])


def test_draft_cost_is_a_draft_pass_over_one_rows_share_of_the_verify_pass():
    # a 3-row verify pass of 30 ms where 3 rows cost 1.5 one-row passes: one row is 20 ms, a 2 ms draft pass 0.1
    assert theory.draft_cost(0.002, 0.030, 3, (1.0, 1.2, 1.5)) == pytest.approx(0.1)
    assert theory.draft_cost(0.002, 0.020, 5) == pytest.approx(0.1)  # no curve: every row free, v = 1
    with pytest.raises(ValueError):
        theory.draft_cost(0.002, 0.0, 3)


def test_moving_average_starts_at_the_first_value_then_weighs_each_new_one():
    assert theory.moving_average(None, 4.0, 0.3) == 4.0
    assert theory.moving_average(4.0, 1.0, 0.3) == pytest.approx(0.7 * 4.0 + 0.3 * 1.0)
