# SPDX-License-Identifier: Apache-2.0
"""The memory guard's decisions: which slice holds more device memory than its limit, and
which of its processes to stop. Pure functions, no I/O (arbiter.guardian measures and acts;
the reconciler's slower drift pass uses the same decisions).

libvgpu charges an allocation before making it, so a slice that allocates only
through libvgpu never holds more than its limit. What bypasses it (a static
binary, a driver opened with dlmopen(), a tenant that zeroes its usage file)
is seen by NVML, which reports the device memory of every host process. The
guard sums NVML's figures over the processes the host attributes to the slice
(arbiter.attribution.SlicePids.host: the owner, its descendants, its
container's pid namespace; never pids a tenant wrote) on each GPU, and compares
the sum with the slice's limit there plus `margin` per process: NVML counts
each process's CUDA context, which libvgpu charges only as
defaults.context_reserve (0 by default), so an honest slice at its limit shows
up to one context per process above it on a real GPU.

A finding must hold in CONFIRM consecutive measurements: a process of the slice
that frees memory gives its charge back to libvgpu a moment before NVML stops
counting the memory, so one sample may briefly show a neighbouring allocation on
top of the old one. At the guard's 0.5 s interval that is caught within 1.5 s.

Whom to stop: the slice's processes holding memory on that GPU, largest first,
until what the rest hold fits (a bypass holding most of the memory goes; an
honest small process of the same slice stays).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arbiter.model import Slice

__all__ = [
    "CONFIRM",
    "DEFAULT_ACTION",
    "DEFAULT_MARGIN",
    "MemoryFinding",
    "MemoryUse",
    "findings",
    "process_memory",
    "slice_uses",
    "victims",
]

#: kill. A slice above its memory limit holds memory that placement promised to
#: its neighbours: their allocations fail until it is given back. Killing gives it
#: back within a second; throttle (the freezer) gives nothing back, a frozen
#: process keeps its allocations; flag only reports while the neighbours fail.
#: Through libvgpu no slice ever gets there (charge before allocate), so a finding
#: is a bypass, not an honest overshoot, once `margin` covers the contexts NVML counts.
DEFAULT_ACTION = "kill"

#: Bytes per process that NVML may show above the limit before it is a finding:
#: about one CUDA context on current GPUs (libvgpu charges contexts only as
#: defaults.context_reserve). 0 where context_reserve covers the context (or on simgpu).
DEFAULT_MARGIN = 512 << 20

#: Consecutive measurements a slice must be over before it is a finding.
CONFIRM = 2


@dataclass(frozen=True)
class MemoryUse:
    """One vGPU of a slice as measured: its memory limit and its processes' device memory."""

    slice_id: str
    gpu: int
    limit: int                  # bytes the slice may hold on this GPU
    pids: Mapping[int, int]     # host pid -> bytes NVML reports (only this slice's pids)

    @property
    def used(self) -> int:
        """Bytes the slice's processes hold on this GPU together."""
        return sum(self.pids.values())


@dataclass(frozen=True)
class MemoryFinding:
    """A slice measured above its memory limit (plus margin) on one GPU."""

    slice_id: str
    gpu: int
    used: int
    limit: int
    allowed: int                # limit + margin per process holding memory
    pids: tuple[int, ...]       # the slice's processes holding memory on this GPU, sorted
    victims: tuple[int, ...]    # whom to stop, largest holder first


def _allowed(limit: int, margin: int, holders: int) -> int:
    return limit + margin * holders


def victims(pids: Mapping[int, int], limit: int, margin: int = 0) -> tuple[int, ...]:
    """The fewest processes, largest first, whose end leaves the rest within the limit."""
    holders = sorted(((b, p) for p, b in pids.items() if b > 0), reverse=True)
    left = sum(b for b, _ in holders)
    out = []
    for n, (b, p) in enumerate(holders):
        if left <= _allowed(limit, margin, len(holders) - n):
            break
        out.append(p)
        left -= b
    return tuple(out)


def findings(uses: Iterable[MemoryUse], margin: int = 0) -> list[MemoryFinding]:
    """Every vGPU whose slice holds more than its limit plus margin per process, in order."""
    out = []
    for use in uses:
        holders = tuple(sorted(p for p, b in use.pids.items() if b > 0))
        allowed = _allowed(use.limit, margin, len(holders))
        if use.used <= allowed:
            continue
        out.append(MemoryFinding(use.slice_id, use.gpu, use.used, use.limit, allowed,
                                 holders, victims(use.pids, use.limit, margin)))
    return out


def process_memory(samples: Mapping[int, Any]) -> dict[int, dict[int, int]]:
    """GPU index -> host pid -> bytes, from inventory.DeviceSample.processes (NVML)."""
    out: dict[int, dict[int, int]] = {}
    for gpu, smp in samples.items():
        per_pid: Mapping[int, int] = getattr(smp, "processes", None) or {}
        out[gpu] = {int(p): int(b) for p, b in per_pid.items()}
    return out


def slice_uses(slices: Sequence[Slice], memory: Mapping[int, Mapping[int, int]],
               host: Mapping[str, set[int]]) -> list[MemoryUse]:
    """Each vGPU of each slice with the memory of the host pids attributed to the slice."""
    return [MemoryUse(s.id, g.gpu_index, g.memory,
                      {p: b for p, b in memory.get(g.gpu_index, {}).items()
                       if p in host.get(s.id, ())})
            for s in slices for g in s.grants]
