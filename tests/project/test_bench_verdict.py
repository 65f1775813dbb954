# SPDX-License-Identifier: Apache-2.0
"""bench/arbiter.py's verdict on "never below the previous release": its rounds are paired
(each round of the tree ran back to back with one of the other build), and a median below
counts as a miss only when every paired round says so. Made-up rounds, no vgpud."""
from __future__ import annotations

import importlib.util
import sys

import pytest
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
# Loaded under another name: bench/arbiter.py would shadow the arbiter package.
_spec = importlib.util.spec_from_file_location("arbiter_bench", ROOT / "bench" / "arbiter.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["arbiter_bench"] = bench  # dataclasses look their module up
_spec.loader.exec_module(bench)


def row(build: str, rates: list[float], p99_ms: list[float]) -> bench.Row:
    """Rounds of 1 s with that many pairs, each pair taking the round's p99 (so every
    percentile is it)."""
    return bench.Row("empty", 8, build, [
        bench.Result("empty", 8, int(r), 0, 1.0, [ms / 1000] * int(r), build)
        for r, ms in zip(rates, p99_ms, strict=True)])


def test_a_tree_at_least_as_fast_with_no_later_p99_is_met():
    assert bench.verdict(row("tree", [500, 520, 510], [15, 14, 16]),
                         row("ref", [500, 505, 490], [15, 16, 16])) == "met"


def test_a_tree_slower_in_every_paired_round_missed():
    assert bench.verdict(row("tree", [480, 470, 490], [15, 15, 15]),
                         row("ref", [500, 490, 495], [15, 15, 15])) == "MISSED"


def test_a_p99_later_in_every_paired_round_missed_even_when_faster():
    assert bench.verdict(row("tree", [510, 520, 530], [17, 18, 19]),
                         row("ref", [500, 500, 500], [15, 16, 17])) == "MISSED"


def test_a_median_below_with_rounds_on_both_sides_is_noise():
    # Round 2 on the tree's side: the machine, not the build, moved the median.
    tree, ref = row("tree", [480, 530, 490], [15, 15, 15]), row("ref", [500, 500, 500],
                                                                 [15, 15, 15])
    assert tree.rate < ref.rate
    assert bench.verdict(tree, ref) == "within this run's noise"


def test_one_round_below_is_a_miss():
    assert bench.verdict(row("tree", [499], [15]), row("ref", [500], [15])) == "MISSED"


@pytest.mark.parametrize(("tree_rates", "shown"), [([480, 530, 490], "x0.96-1.06"),
                                                    ([500], "")])
def test_the_comparison_line_shows_the_paired_rounds_range(tree_rates, shown):
    tree = row("tree", tree_rates, [15] * len(tree_rates))
    ref = row("ref", [500] * len(tree_rates), [15] * len(tree_rates))
    [line] = bench.comparison([tree, ref], ["tree", "ref"])
    assert line.startswith("tree / ref, empty, 8 clients: pairs/s x")
    assert (f"(rounds {shown})" in line) == bool(shown)
