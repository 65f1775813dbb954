# SPDX-License-Identifier: Apache-2.0
"""bench/arbiter.py's verdict on "never below the previous release": its rounds are paired
(each round of the tree ran back to back with one of the other build), the ratios' geometric
mean says which side the tree is on, and a mean below counts as a miss only when more paired
rounds went against the tree than chance makes (a sign test). Made-up rounds, no vgpud."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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


def test_met_reads_the_paired_ratios_not_the_medians():
    # Medians: tree 500 < ref 510. Paired: x1.25, x0.98, x0.98, mean above x1.00.
    tree, ref = (row("tree", [500, 500, 500], [15] * 3),
                 row("ref", [400, 510, 510], [15] * 3))
    assert tree.rate < ref.rate
    assert bench.verdict(tree, ref) == "met"


def test_a_tree_slower_in_every_one_of_five_paired_rounds_missed():
    assert bench.verdict(row("tree", [480, 470, 490, 485, 470], [15] * 5),
                         row("ref", [500, 490, 495, 500, 480], [15] * 5)) == "MISSED"


def test_nine_of_ten_rounds_against_the_tree_is_a_miss_and_eight_is_noise():
    ref = row("ref", [500] * 10, [15] * 10)
    nine = row("tree", [480] * 9 + [510], [15] * 10)
    eight = row("tree", [480] * 8 + [510, 510], [15] * 10)
    assert bench.verdict(nine, ref) == "MISSED"  # 11 in 1024 by chance
    assert bench.verdict(eight, ref) == "within this run's noise"  # 56 in 1024


def test_a_p99_later_in_every_paired_round_missed_even_when_faster():
    assert bench.verdict(row("tree", [510, 520, 530, 510, 520], [17, 18, 19, 17, 18]),
                         row("ref", [500] * 5, [15, 16, 17, 16, 16])) == "MISSED"


def test_a_mean_below_with_rounds_on_both_sides_is_noise():
    # Round 2 on the tree's side: the machine, not the build, moved the mean.
    tree, ref = row("tree", [480, 530, 490], [15, 15, 15]), row("ref", [500, 500, 500],
                                                                 [15, 15, 15])
    assert bench.verdict(tree, ref) == "within this run's noise"


@pytest.mark.parametrize("rounds", [1, 4])
def test_too_few_rounds_cannot_make_a_miss(rounds):
    # Even all of them below: 1 in 2, 1 in 16 by chance, more than ALPHA.
    assert bench.verdict(row("tree", [480] * rounds, [15] * rounds),
                         row("ref", [500] * rounds, [15] * rounds)) == "within this run's noise"


@pytest.mark.parametrize(("tree_rates", "shown"), [([480, 530, 490], "x0.96-1.06, 2 of 3 worse"),
                                                    ([500], "")])
def test_the_comparison_line_shows_the_paired_rounds_range(tree_rates, shown):
    tree = row("tree", tree_rates, [15] * len(tree_rates))
    ref = row("ref", [500] * len(tree_rates), [15] * len(tree_rates))
    line = bench.comparison([tree, ref], ["tree", "ref"])[0]
    assert line.startswith("tree / ref, empty, 8 clients: pairs/s x")
    assert (f"(rounds {shown})" in line) == bool(shown)


def test_the_pooled_line_finds_a_small_gap_no_row_shows_alone():
    # Each row 7 of 10 rounds a little below: 17 % by chance, noise. Two rows together,
    # 14 of 20: 6 %, still noise. Three rows, 21 of 30: 2 %, below.
    rows: list[bench.Row] = []
    for scenario in ("empty", "50 on GPU 0", "other"):
        rows += [bench.Row(scenario, 8, "tree", row("tree", [480] * 7 + [510] * 3,
                                                    [15] * 10).rounds),
                 bench.Row(scenario, 8, "ref", row("ref", [500] * 10, [15] * 10).rounds)]
        *each, pooled = bench.comparison(rows, ["tree", "ref"])
        assert all(line.endswith("within this run's noise)") for line in each), each
        if len(each) == 2:
            assert pooled.endswith("(chance 0.058: not below ref past this run's noise)"), pooled
    assert "21 of 30 paired rounds worse" in pooled
    assert pooled.endswith("(chance 0.021: below ref past this run's noise)"), pooled


def test_the_pooled_line_leaves_out_the_transport_baseline():
    rows = [bench.Row("2x Health", 8, "tree", row("tree", [400] * 5, [15] * 5).rounds),
            bench.Row("2x Health", 8, "ref", row("ref", [500] * 5, [15] * 5).rounds)]
    assert bench.comparison(rows, ["tree", "ref"]) == []


def cpu_row(build: str, cpu_us: list[float]) -> bench.Row:
    """Rounds of 500 pairs in 1 s at the same p99, with vgpud's CPU a pair as given."""
    return bench.Row("empty", 8, build, [
        bench.Result("empty", 8, 500, 0, 1.0, [0.015] * 500, build, cpu_s=us * 500 / 1e6)
        for us in cpu_us])


def test_cpu_a_pair_is_paired_and_pooled_beside_the_rates():
    tree = cpu_row("tree", [3300] * 9 + [2900])
    ref = cpu_row("ref", [3000] * 10)
    assert tree.cpu_us == pytest.approx(3300)
    line, rates, cpus = bench.comparison([tree, ref], ["tree", "ref"])
    assert "CPU a pair x1.09 (rounds x0.97-1.10, 9 of 10 worse)" in line, line
    assert line.endswith("(never below ref: met)"), line  # the verdict is the rates' and p99s'
    assert rates.endswith("(chance 1: not below ref past this run's noise)"), rates
    assert cpus == ("tree / ref, all Allocate+Release rows: vgpud CPU a pair x1.09, 9 of 10 "
                    "paired rounds more (chance 0.011: more than ref past this run's noise)")


def test_rounds_without_cpu_measured_leave_it_out():
    tree, ref = row("tree", [500] * 3, [15] * 3), row("ref", [500] * 3, [15] * 3)
    assert tree.cpu_us != tree.cpu_us  # nan: no CPU measured
    assert all("CPU" not in line for line in bench.comparison([tree, ref], ["tree", "ref"]))


def test_tree_cpu_counts_the_processes_below_vgpud(tmp_path):
    """A parent that only waits, its child that burns CPU: the child's time is the
    parent's tree's (vgpud's broker is its child), and no one else's."""
    import os
    import signal
    import subprocess
    import time

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n" \
           "open(r'%s', 'w').close()\ntime.sleep(30)\n" % (tmp_path / "burnt")
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               f"{burn!r}])"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "burnt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stat = Path(f"/proc/{parent.pid}/stat").read_text()
        own = sum(int(x) for x in stat.rsplit(")", 1)[1].split()[11:13]) / os.sysconf(
            "SC_CLK_TCK")
        assert own < 0.2
        assert bench.tree_cpu(parent.pid) >= own + 0.25
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    assert bench.tree_cpu(parent.pid) == 0.0  # gone: nothing below it
