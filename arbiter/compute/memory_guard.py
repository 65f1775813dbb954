# SPDX-License-Identifier: Apache-2.0
"""The memory guard's decisions: which slice holds more device memory than its limit, and
which of its processes to stop. Pure functions, no I/O (arbiter.compute.guardian measures and acts;
the reconciler's slower drift pass uses the same decisions).

libvgpu charges an allocation before making it, so a slice that allocates only
through libvgpu never holds more than its limit. What bypasses it (a static
binary, a driver opened with dlmopen(), a tenant that zeroes its usage file)
is seen by NVML, which reports the device memory of every host process. The
guard sums NVML's figures over the processes the host attributes to the slice
(arbiter.slices.attribution.SlicePids.host: the owner, its descendants, its
container's pid namespace; never pids a tenant wrote) on each GPU, and compares
the sum with the slice's limit there plus `margin`, once per slice: a margin per
process would grow with the processes a tenant starts (64 processes with a
512 MiB margin each hold 32 GiB past a 1 GiB limit unseen).

NVML also counts each process's CUDA context, which no allocation call shows.
libvgpu charges it against the slice's limit as context_reserve (config
defaults.context_reserve, per process and GPU, DEFAULT_CONTEXT_RESERVE when
unset), so an honest slice's contexts fit inside its limit and need no margin
of their own, provided context_reserve is at least what a context holds on the
GPU (see DEFAULT_CONTEXT_RESERVE).

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
    "DEFAULT_CONTEXT_RESERVE",
    "DEFAULT_ESCALATE_ACTION",
    "DEFAULT_ESCALATE_AFTER",
    "DEFAULT_ESCALATE_WINDOW_S",
    "DEFAULT_MARGIN",
    "ESCALATE_ACTIONS",
    "MemoryFinding",
    "MemoryUse",
    "escalates",
    "findings",
    "process_memory",
    "recent",
    "slice_uses",
    "victims",
]

#: kill. A slice above its memory limit holds memory that placement promised to
#: its neighbours: their allocations fail until it is given back. Killing gives it
#: back within a second; throttle (the freezer) gives nothing back, a frozen
#: process keeps its allocations; flag only reports while the neighbours fail.
#: Through libvgpu no slice ever gets there (charge before allocate), so a finding
#: is a bypass, not an honest overshoot, once context_reserve covers the contexts NVML counts.
DEFAULT_ACTION = "kill"

#: Bytes per slice and GPU that NVML may show above the limit before it is a finding:
#: what NVML counts that libvgpu does not charge besides contexts (a real GPU maps
#: allocations in pages of up to 2 MiB; libvgpu charges the bytes asked for). Per
#: slice, never per process: see the module's docstring.
DEFAULT_MARGIN = 128 << 20

#: What one CUDA context holds on its GPU, as NVML's per-process used memory shows
#: it for a process that only made a context, per process and GPU: simgpu's model,
#: which holds none unless SIMGPU_CONTEXT_MEMORY says so (libvgpu/simgpu/cuda_ctx.c
#: charges that per context; NVML shows it in the process's used memory). A CUDA 12
#: context on a recent datacenter GPU holds a few hundred MiB (the driver's
#: per-context state, local memory for its threads, the printf FIFO and the device
#: malloc heap; more SMs and newer CUDA, more; lazy loading, less): set
#: defaults.context_reserve to what nvidia-smi shows there (docs/guard.md).
DEFAULT_CONTEXT_RESERVE = 0

#: Consecutive measurements a slice must be over before it is a finding.
CONFIRM = 2

#: What the guard may do to a whole slice whose bypass keeps coming back: freeze its
#: cgroup for good (the processes stay, for an admin to look at, and cannot respawn
#: anything; the finding's largest holders are still killed, so the memory goes back)
#: or kill every process of the slice.
ESCALATE_ACTIONS = ("freeze", "kill")

#: kill: a frozen slice keeps its place on the GPU (and a container that looks
#: alive) until someone removes it; killed, its container ends and the slice is released.
DEFAULT_ESCALATE_ACTION = "kill"

#: Memory findings the guard acted on (a new episode, or a round that killed someone
#: new) within DEFAULT_ESCALATE_WINDOW_S that make it stop the whole slice. Killing
#: the largest holders ends one bypass; a supervisor that starts it again takes the
#: memory back within a second each time. Through libvgpu a slice never gets one
#: finding, so three in a minute are a bypass that comes back, not bad luck.
DEFAULT_ESCALATE_AFTER = 3
DEFAULT_ESCALATE_WINDOW_S = 60.0


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
    allowed: int                # limit + margin (per slice)
    pids: tuple[int, ...]       # the slice's processes holding memory on this GPU, sorted
    victims: tuple[int, ...]    # whom to stop, largest holder first


def victims(pids: Mapping[int, int], limit: int, margin: int = 0) -> tuple[int, ...]:
    """The fewest processes, largest first, whose end leaves the rest within limit + margin."""
    holders = sorted(((b, p) for p, b in pids.items() if b > 0), reverse=True)
    left = sum(b for b, _ in holders)
    out = []
    for b, p in holders:
        if left <= limit + margin:
            break
        out.append(p)
        left -= b
    return tuple(out)


def findings(uses: Iterable[MemoryUse], margin: int = 0) -> list[MemoryFinding]:
    """Every vGPU whose slice holds more than its limit plus margin (per slice), in order."""
    out = []
    for use in uses:
        allowed = use.limit + margin
        if use.used <= allowed:
            continue
        holders = tuple(sorted(p for p, b in use.pids.items() if b > 0))
        out.append(MemoryFinding(use.slice_id, use.gpu, use.used, use.limit, allowed,
                                 holders, victims(use.pids, use.limit, margin)))
    return out


def recent(times: Iterable[float], now: float, window_s: float) -> list[float]:
    """The times (monotonic s) that fall within the last window_s before now."""
    return [t for t in times if now - window_s <= t <= now]


def escalates(times: Iterable[float], now: float, after: int, window_s: float) -> bool:
    """Whether the findings at `times` call for stopping the whole slice: `after` or more
    within the last window_s (after 0: never)."""
    return after > 0 and len(recent(times, now, window_s)) >= after


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
