# SPDX-License-Identifier: Apache-2.0
"""bench/paired.py, the sign test both side-by-side benchmarks read their pairs with, and
bench/containers.py's verdict on its back-to-back starts and rounds. Made-up figures, no
containers."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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


RUNS = 30
SAME = [40.0] * 5


def build(single: list[list[float]], together: list[list[float]]):
    return containers.Build(None, Path("/nonexistent"), {}, Path("/nonexistent"), single,
                            together)


def rounds(ms: float, slowest: list[float], n: int = RUNS) -> list[list[float]]:
    """One round per figure in `slowest`: n - 1 starts of `ms` and that slowest one (the
    round's p99 with 30 starts)."""
    return [[ms] * (n - 1) + [s] for s in slowest]


def test_containers_the_same_starts_are_met():
    tree = build(rounds(30, SAME), rounds(300, SAME, 20))
    ref = build(rounds(30, SAME), rounds(300, SAME, 20))
    assert containers.verdict(tree, ref) == "met"


def test_containers_starts_slower_pair_by_pair_are_missed_on_the_median():
    # Every start of the tree but each round's slowest 1 ms later: 145 of 150 paired
    # starts, the p99s the same.
    tree = build(rounds(31, SAME), rounds(300, SAME, 20))
    ref = build(rounds(30, SAME), rounds(300, SAME, 20))
    assert containers.verdict(tree, ref) == "MISSED (median)"


def test_containers_slower_median_with_pairs_on_both_sides_is_noise():
    # The paired starts' mean x1.015 against the tree, but pairs 2 and 4 go its way: the
    # machine moved.
    tree, ref = [106, 99, 107, 98, 106], [101, 101, 101, 101, 104]
    assert paired.gmean(containers.paired_starts(tree, ref)) > 1.0
    assert containers.paired_starts(tree, ref)[1] < 1.0
    assert containers.verdict(build([tree], [[300]]), build([ref], [[300]])) \
        == "within this run's noise"


def test_containers_a_p99_later_in_every_round_is_missed_even_with_the_same_median():
    tree = build(rounds(30, [48, 50, 45, 52, 47]), rounds(300, SAME, 20))
    ref = build(rounds(30, [40, 44, 41, 43, 40]), rounds(300, SAME, 20))
    assert containers.verdict(tree, ref) == "MISSED (p99)"


def test_containers_a_p99_at_once_later_in_every_round_is_missed():
    tree = build(rounds(30, SAME), rounds(300, [330, 340, 320, 335, 345], 20))
    ref = build(rounds(30, SAME), rounds(300, [310, 320, 315, 318, 322], 20))
    assert containers.verdict(tree, ref) == "MISSED (p99 at once)"


def test_containers_one_slow_start_is_the_noise_it_is():
    # Round 3 of the tree had one start of 150 ms (the VM): its p99 x3.75, the other
    # rounds on the tree's side. One p99 a build, compared as it was, said MISSED.
    tree = build(rounds(30, [39, 39, 150, 38, 39]), rounds(300, SAME, 20))
    ref = build(rounds(30, SAME), rounds(300, SAME, 20))
    assert containers.verdict(tree, ref) == "within this run's noise"


@pytest.mark.parametrize("later", [4, 3])
def test_containers_p99s_later_in_fewer_than_all_five_rounds_are_noise(later):
    tree_p99 = [44.0] * later + [38.0] * (5 - later)
    tree = build(rounds(30, tree_p99), rounds(300, SAME, 20))
    ref = build(rounds(30, SAME), rounds(300, SAME, 20))
    assert containers.verdict(tree, ref) == "within this run's noise"


def test_containers_the_line_shows_the_paired_rounds():
    assert paired.spread([1.1, 0.9, 1.2], higher_is_worse=True, worse="later") \
        == " (rounds x0.90-1.20, 2 of 3 later)"
    assert paired.spread([1.1], higher_is_worse=True) == ""
    assert containers.paired_p99s(rounds(30, [44.0, 40.0]), rounds(30, [40.0, 40.0])) == [
        pytest.approx(1.1), pytest.approx(1.0)]


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
