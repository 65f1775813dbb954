# SPDX-License-Identifier: Apache-2.0
"""bench/paired.py, the sign test both side-by-side benchmarks read their pairs with, and
bench/containers.py's verdict on its back-to-back starts. Made-up figures, no containers."""
from __future__ import annotations

import importlib.util
import sys

import pytest
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import paired

_spec = importlib.util.spec_from_file_location("containers_bench", ROOT / "bench" / "containers.py")
containers = importlib.util.module_from_spec(_spec)
sys.modules["containers_bench"] = containers  # dataclasses look their module up
_spec.loader.exec_module(containers)


def test_chance_of_is_the_binomial_tail():
    assert paired.chance_of(5, 5) == 1 / 32
    assert paired.chance_of(9, 10) == 11 / 1024
    assert paired.chance_of(0, 7) == 1.0


@pytest.mark.parametrize(("worse", "n", "past"), [(5, 5, True), (4, 5, False), (9, 10, True),
                                                 (8, 10, False), (15, 20, True),
                                                 (14, 20, False), (20, 30, True),
                                                 (19, 30, False), (4, 4, False), (0, 0, False)])
def test_past_noise_needs_more_pairs_against_than_chance_makes(worse, n, past):
    assert paired.past_noise(worse, n) is past


def test_gmean_lets_opposite_ratios_cancel():
    assert paired.gmean([0.5, 2.0]) == pytest.approx(1.0)
    assert paired.gmean([0.9] * 3) == pytest.approx(0.9)


def test_containers_no_slower_median_and_no_later_p99_is_met():
    assert containers.verdict([100, 101, 99, 100, 100], [100, 102, 100, 101, 100],
                              [300, 310], [305, 320]) == "met"


def test_containers_slower_median_in_every_one_of_five_pairs_is_missed():
    assert containers.verdict([104, 105, 103, 106, 104], [100, 101, 100, 102, 100],
                              [300], [300]) == "MISSED"


def test_containers_slower_median_with_pairs_on_both_sides_is_noise():
    # Medians 103 against 101, but pairs 2, 4 and 5 go the tree's way: the machine moved.
    tree, ref = [103, 99, 104, 98, 103], [101, 101, 101, 101, 104]
    assert containers.paired_starts(tree, ref)[1] < 1.0
    assert containers.verdict(tree, ref, [300], [300]) == "within this run's noise"


def test_containers_a_later_p99_counts_as_it_is():
    # One figure a build: no pairs to weigh it.
    assert containers.verdict([100] * 5, [100] * 5, [300, 330], [300, 310]) == "MISSED (p99)"
    assert containers.verdict([100, 100, 100, 100, 140], [100] * 5, [300], [300]) \
        == "MISSED (p99)"


def test_against_counts_by_which_way_is_worse():
    ratios = [0.9, 1.1, 1.2, 1.0]
    assert paired.against(ratios, higher_is_worse=True) == 2  # times: above x1
    assert paired.against(ratios, higher_is_worse=False) == 1  # rates: below x1


def test_worse_past_noise_needs_the_mean_and_the_pairs_on_the_worse_side():
    assert paired.worse_past_noise([0.9] * 5, higher_is_worse=False)
    assert not paired.worse_past_noise([0.9] * 5, higher_is_worse=True)
    # 5 of 5 pairs above x1, but by so little that one deep pair puts the mean below.
    assert not paired.worse_past_noise([1.01] * 5 + [0.5], higher_is_worse=True)
    assert not paired.worse_past_noise([0.9] * 4, higher_is_worse=False)  # 1 in 16
