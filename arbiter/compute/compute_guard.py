# SPDX-License-Identifier: Apache-2.0
"""The compute guard's decisions: who uses more than its share, and how hard to throttle it.

Pure functions, no I/O (the thread that measures and acts is arbiter.compute.guardian).
libvgpu holds compute shares only for processes that load it; a static binary or
a driver opened with dlmopen() bypasses it. NVML's per-process utilisation sees
every process, so the guard compares what each slice's host processes use on a
GPU (the sum of their SM %, over the last window) with what the slice may use:

- a slice with 100% of a GPU may use all of it: never a finding;
- a fixed slice may use its share;
- a burst slice may also use what the slices active on its GPU leave idle:
  max(share, 100 - the shares of the other slices that used the GPU lately).

A finding is a use above that allowance plus a margin (DEFAULT_MARGIN): libvgpu's
own scheduler may overshoot a share by a few points for a lease, and NVML
reports whole percents sampled over its own period, so an honest slice must not
be caught by noise.

Throttling freezes the slice's cgroup for part of every period; the fraction of
the period it runs starts at allowance / measured (a greedy process thawed for
that fraction uses about its allowance) and is corrected each window by the
ratio of the allowance to what was measured, because work queued before a
freeze still runs on the GPU while the process is frozen.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_ACTION",
    "DEFAULT_MARGIN",
    "GUARD_ACTIONS",
    "MIN_RUN_FRACTION",
    "Finding",
    "SliceUse",
    "allowance",
    "findings",
    "first_run_fraction",
    "next_run_fraction",
]

#: What the guard may do with a finding: report it, SIGKILL the processes, or
#: freeze their cgroup in a duty cycle that holds the slice to its allowance.
GUARD_ACTIONS = ("flag", "kill", "throttle")

#: throttle: it keeps the neighbours' shares (which flag does not) without
#: destroying the offender's work (which kill does); a mistaken finding costs the
#: slice nothing it was promised, only the use above its own share.
DEFAULT_ACTION = "throttle"

#: Percentage points above the allowance that are not yet a finding.
DEFAULT_MARGIN = 10

#: The least fraction of a period a throttled cgroup runs (never frozen for good).
MIN_RUN_FRACTION = 0.02


@dataclass(frozen=True)
class SliceUse:
    """One vGPU of a slice as measured: its share of one GPU and its processes' SM %."""

    slice_id: str
    gpu: int
    share: int                  # percent of the GPU granted
    burst: bool                 # may use idle time beyond its share
    pids: Mapping[int, int]     # host pid -> SM % over the window (only this slice's pids)

    @property
    def used(self) -> int:
        """The slice's SM % on this GPU (its processes together, at most 100)."""
        return min(100, sum(self.pids.values()))


@dataclass(frozen=True)
class Finding:
    """A slice measured above its allowance on one GPU."""

    slice_id: str
    gpu: int
    used: int
    allowed: int
    pids: tuple[int, ...]       # the slice's processes that used this GPU, sorted


def allowance(use: SliceUse, others: Iterable[SliceUse]) -> int:
    """Percent of its GPU the slice may use (others: the other slices' uses of any GPU)."""
    if use.share >= 100:
        return 100
    if not use.burst:
        return use.share
    active = sum(o.share for o in others
                 if o.gpu == use.gpu and o.slice_id != use.slice_id and o.used > 0)
    return max(use.share, 100 - min(100, active))


def findings(uses: Sequence[SliceUse], margin: int = DEFAULT_MARGIN) -> list[Finding]:
    """Every vGPU whose slice used more than its allowance plus margin, in input order."""
    out = []
    for use in uses:
        allowed = allowance(use, uses)
        if allowed >= 100 or use.used <= allowed + margin:
            continue
        out.append(Finding(use.slice_id, use.gpu, use.used, allowed,
                           tuple(sorted(p for p, u in use.pids.items() if u > 0))))
    return out


def _clamp(f: float) -> float:
    return min(1.0, max(MIN_RUN_FRACTION, f))


def first_run_fraction(allowed: int, used: int) -> float:
    """Fraction of each period to run, for a process that used `used` % unthrottled."""
    if used <= 0:
        return 1.0
    return _clamp(allowed / used)


def next_run_fraction(current: float, allowed: int, used: int) -> float:
    """The run fraction after a window at `current` measured `used` % (at most x2 or /2 a step).

    1.0 means the throttle no longer holds anything back: the caller lifts it.
    """
    if used <= 0:
        return _clamp(current * 2)
    f = current * allowed / used
    return _clamp(min(current * 2, max(current / 2, f)))
