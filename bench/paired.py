# SPDX-License-Identifier: Apache-2.0
"""Two builds measured in back-to-back pairs (bench/arbiter.py's rounds, bench/containers.py's
starts): how to tell a gap from this machine's noise.

The VM's speed moves by 10-30 % within seconds, so a pair's two halves see the same machine
and the pairs do not. A build is below the other past the noise when more of the pairs went
against it than chance makes with no difference at all: an exact one-sided sign test, each
pair a coin toss under that null. Its size is the geometric mean of the pairs' ratios (a
x0.5 and a x2 cancel).
"""
from __future__ import annotations

import math
import statistics

__all__ = ["ALPHA", "against", "chance_of", "gmean", "past_noise", "spread",
           "worse_past_noise"]

#: Below past the noise: more pairs against it than this likely by chance (chance_of).
ALPHA = 0.05


def gmean(ratios: list[float]) -> float:
    """The geometric mean of paired ratios (nan for none)."""
    return math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else float("nan")


def chance_of(worse: int, n: int) -> float:
    """How likely `worse` or more of n pairs go against a build when the two are the same
    (each pair a coin toss): the binomial tail, 1 for worse <= 0."""
    return sum(math.comb(n, k) for k in range(max(worse, 0), n + 1)) / 2 ** n


def past_noise(worse: int, n: int) -> bool:
    """Whether `worse` of n pairs against a build is more than chance makes (under ALPHA:
    5 of 5, 9 of 10, 15 of 20, 20 of 30)."""
    return n > 0 and chance_of(worse, n) < ALPHA


def against(ratios: list[float], *, higher_is_worse: bool) -> int:
    """How many pairs (ratio: the build over the other) went against the build: above x1
    for a figure where higher is worse (a time), below x1 for one where it is better (a rate)."""
    return sum(x > 1.0 if higher_is_worse else x < 1.0 for x in ratios)


def spread(ratios: list[float], *, higher_is_worse: bool, worse: str = "worse") -> str:
    """The pairs' range and how many went against the build, as the benchmarks print it
    beside a geometric mean: " (rounds x0.91-1.08, 3 of 10 worse)"; "" for one pair."""
    if len(ratios) < 2:
        return ""
    return (f" (rounds x{min(ratios):.2f}-{max(ratios):.2f}, "
            f"{against(ratios, higher_is_worse=higher_is_worse)} of {len(ratios)} {worse})")


def worse_past_noise(ratios: list[float], *, higher_is_worse: bool) -> bool:
    """Whether the pairs say the build is worse past the noise: their geometric mean on the
    worse side of x1, and more of them against it than chance makes."""
    mean = gmean(ratios)
    return ((mean > 1.0 if higher_is_worse else mean < 1.0)
            and past_noise(against(ratios, higher_is_worse=higher_is_worse), len(ratios)))
