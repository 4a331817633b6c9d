"""The drafter-calibration reading: each tree node's outcome off the finished sequence, binned; and, end to end,
that the nodes it says were kept are exactly the ones the loop's verification accepted."""

from __future__ import annotations

import math

import pytest

from specrt.measure.calibration import NodeOutcome, calibration, recorded_trees, tree_outcomes
from specrt.runtime.drafters import METHODS
from specrt.runtime.tree import TokenTree


def _tree() -> TokenTree:
    # node 0 (5) and 1 (6) under the root; 2 (7) under 0; 3 (8) under 2
    return TokenTree([5, 6, 7, 8], [-1, -1, 0, 2], points=True, scores=[math.log(p) for p in (0.6, 0.3, 0.4, 0.1)])


def test_a_node_is_kept_when_the_sequence_spells_its_whole_path():
    got = tree_outcomes(_tree(), 2, [1, 2, 5, 7, 9])
    assert [(round(o.probability, 6), o.depth, o.kept) for o in got] == [
        (0.6, 1, True), (0.3, 1, False), (0.4, 2, True), (0.1, 3, False)]
    # The same tokens at the wrong depth do not count: 7 follows 6 nowhere
    assert [o.kept for o in tree_outcomes(_tree(), 2, [1, 2, 6, 7, 8])] == [False, True, False, False]


def test_nodes_past_the_end_of_the_sequence_are_left_out():
    got = tree_outcomes(_tree(), 2, [1, 2, 5, 7])  # the generation stopped after 7: node 3 is undecided
    assert [o.depth for o in got] == [1, 1, 2]
    assert tree_outcomes(_tree(), 2, [1, 2]) == []


def test_a_tree_without_scores_is_refused():
    with pytest.raises(ValueError, match="no drafter scores"):
        tree_outcomes(TokenTree([5], [-1]), 0, [5])


def test_bins_depths_and_per_tree_sums_by_hand():
    trees = [[NodeOutcome(0.6, 1, True), NodeOutcome(0.3, 1, False), NodeOutcome(0.4, 2, True)],
             [NodeOutcome(1.0, 1, True), NodeOutcome(0.04, 2, False)]]
    got = calibration(trees, edges=(0.0, 0.1, 0.5, 1.0))
    assert got["trees"] == 2 and got["nodes"] == 5
    assert got["predicted_per_tree"] == pytest.approx((0.6 + 0.3 + 0.4 + 1.0 + 0.04) / 2)
    assert got["kept_per_tree"] == pytest.approx(3 / 2)
    low, mid, high = got["bins"]
    assert (low["low"], low["nodes"], low["kept"]) == (0.0, 1, 0.0)
    assert (mid["nodes"], mid["predicted"], mid["kept"]) == (2, pytest.approx(0.35), 0.5)
    assert (high["high"], high["nodes"], high["kept"]) == (1.0, 2, 1.0)  # the last bin holds 1.0 itself
    assert [(d["depth"], d["nodes"], d["kept"]) for d in got["depths"]] == [(1, 3, pytest.approx(2 / 3)), (2, 2, 0.5)]
    # An empty bin is left out, not reported as 0 of 0
    assert [b["low"] for b in calibration(trees, edges=(0.0, 0.01, 0.1, 1.0))["bins"]] == [0.01, 0.1]
    with pytest.raises(ValueError, match="no tree nodes"):
        calibration([[]])


def test_the_kept_nodes_are_the_ones_verification_accepted(eagle_bundle):
    import specrt

    gen = specrt.load(eagle_bundle, threads=1)
    before = METHODS["eagle-tree"]
    accepted, steps = 0, 0
    with recorded_trees() as trees:
        for prompt in ("def f(x):", "import os\n", "class A:"):
            stats = gen.generate(prompt, max_new_tokens=24, method="eagle-tree", eagle_tree="2,3,5").stats
            accepted += stats.accepted
            steps += stats.target_passes - 1
    assert METHODS["eagle-tree"] is before  # the registry is restored
    assert trees and all(len(t) > 0 for t in trees)
    # Each tree's kept nodes are its accepted path: as many as the loop accepted, over every step (a random
    # head's few: 2 of ~190 nodes here; a reading one position off finds others, or none)
    assert accepted > 0
    assert sum(o.kept for tree in trees for o in tree) == accepted
    for tree in trees:  # a kept node's parent is kept: one path per tree
        kept = [o.depth for o in tree if o.kept]
        assert kept == list(range(1, len(kept) + 1))
    assert all(0.0 < o.probability <= 1.0 for tree in trees for o in tree)
    assert len(trees) <= steps
