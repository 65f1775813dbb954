# SPDX-License-Identifier: Apache-2.0
"""Measuring GPU shares in tests: tolerances, the retry rule for a robbed VM, and share runs."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from support.gpu_loads import Load, StealClock, run_loads

TOL = 4.0          # percentage points; bench/compute.py measures the real accuracy
WARM = 0.5         # seconds left out at the start of every measured window


def timing(test):
    """Run a measuring test again (in a fresh directory) if a run fails: once whatever
    happened, and up to four runs in all while the failures come with CPU time the VM's
    host took (StealClock); if every run was robbed so, the test is skipped, saying so.

    The CI machine is a 2-core VM whose host sometimes stops it for tens of ms (and at
    times takes a fifth of its CPU for minutes); a 2.5 s window sees 100 ms lost as 4
    percentage points. Behaviour that is wrong fails on a quiet machine too.
    """
    @functools.wraps(test)
    def run_again(tmp_path: Path, *args, **kwargs):
        return measured(lambda attempt: test(tmp_path / f"attempt{attempt}", *args, **kwargs),
                        lambda attempt: (tmp_path / f"attempt{attempt}").mkdir())
    return pytest.mark.timing(run_again)


def measured(run, prepare=lambda attempt: None, attempts: int = 4):
    """run(attempt) until it passes: see `timing`. A test that calls this carries
    @pytest.mark.timing itself (`make test` runs those alone, after the others)."""
    stolen = 0.0
    for attempt in range(1, attempts + 1):
        prepare(attempt)
        clock = StealClock()
        try:
            return run(attempt)
        except AssertionError:
            stolen = clock.stolen()
            if attempt >= 2 and stolen < StealClock.STOLEN:
                raise
    pytest.skip(f"the VM's host took {stolen:.0%} of its CPU time in each of {attempts} runs: "
                "nothing could be measured")


def fixed(pct: int, **env: str) -> dict[str, str]:
    return {"VGPU_COMPUTE_LIMIT": str(pct), "VGPU_POLICY": "fixed", **env}


def burst(pct: int, **env: str) -> dict[str, str]:
    return {"VGPU_COMPUTE_LIMIT": str(pct), "VGPU_POLICY": "burst", **env}


def shares(tmp: Path, loads: list[Load], seconds: float = 3.0, **kw) -> list[float]:
    r = run_loads(tmp, loads, seconds, **kw)
    for i, t in enumerate(r.traces):
        assert t.summary["returncode"] == 0, f"load {i}: {t.stderr}"
    return [t.share(r.at(WARM), r.at(seconds)) for t in r.traces]
