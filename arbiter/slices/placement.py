# SPDX-License-Identifier: Apache-2.0
"""Placement: which GPUs a request's vGPUs go to, and which low slices make room.

Pure functions, state in and decision out: the caller passes the inventory and the
slices it holds and commits the returned decision (arbiter.slices.store) itself.

Rules
- A request gets ``count`` vGPUs on ``count`` distinct GPUs, each with ``memory``
  bytes and ``compute`` percent. On every GPU the sum of the grants' memory never
  exceeds the GPU's memory and the sum of their compute never exceeds 100.
- ``binpack`` puts each vGPU on the fullest GPU that still fits (least free memory
  after placement, then least free compute, then the lowest index), so whole GPUs
  stay free for big requests; ``spread`` on the emptiest (most free memory, then
  most free compute, then the lowest index).
- A pin (``Request.devices``, from vgpu.io/devices) names GPUs by index (``"1"``) or
  UUID. Only pinned GPUs are used; ``count`` may be at most the number of pinned
  GPUs (``count < len(pin)`` lets the policy choose among them). vGPU i is the i-th
  chosen GPU in pin order; without a pin, in index order.
- Per-vGPU amounts (``Request.vgpus``, a DRA claim): vGPU i gets ask i's memory and
  compute, on ask i's GPU where it names one (index or UUID), else where the policy
  chooses; still one GPU per vGPU. Asks are placed pinned first, then largest first
  (memory, compute, then request order), each on the GPU the policy likes best among
  those that leave the remaining asks a GPU each (a bipartite matching check), so a
  request is refused only when no assignment of its asks to distinct GPUs fits.
- Preemption: only a HIGH request, only when the config allows it, only when it does
  not fit as things are, and only LOW slices are evicted (never NORMAL or HIGH). The
  set evicted is the smallest number of slices that makes the request fit; among
  sets of that size the first in the order smallest slice (memory, then compute),
  newest first, then id. No slice in the set could be spared.
- Grants are matched to GPUs by UUID (stable across reboots, unlike indices); a grant
  without a UUID by index. Grants on a GPU that is not in the inventory use nothing.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter

from arbiter.errors import (
    BadPinError,
    CountError,
    NoCapacityError,
    QuantityError,
    _quantity,  # the one memory formatter of every message
)
from arbiter.model import Gpu, Grant, Priority, Request, Slice, VGpuAsk
from arbiter.quantity import COMPUTE_FORMS, COMPUTE_MAX, COMPUTE_MIN

__all__ = [
    "BINPACK",
    "POLICIES",
    "SPREAD",
    "Capacity",
    "Placement",
    "free_capacity",
    "place",
    "resolve_pin",
    "validate_grants",
    "validate_update",
]

BINPACK = "binpack"
SPREAD = "spread"
POLICIES = (BINPACK, SPREAD)

# Most eviction sets tried in the exact (fewest slices) search before falling back to
# a greedy set pruned to a minimal one; bounds admission latency with many low slices.
_SEARCH_BUDGET = 20_000


@dataclass(frozen=True)
class Placement:
    """A decision: the new slice's grants (vGPU order) and the slice ids to evict first."""

    grants: tuple[Grant, ...]
    evict: tuple[str, ...] = ()


@dataclass(frozen=True)
class Capacity:
    """What is not granted on one GPU: memory in bytes, compute in percent (may be < 0)."""

    memory: int
    compute: int


def free_capacity(gpus: Iterable[Gpu], slices: Iterable[Slice]) -> dict[int, Capacity]:
    """Return the free memory and compute of each GPU, keyed by GPU index."""
    gpu_list = list(gpus)
    used = _used(gpu_list, slices)
    return {
        g.index: Capacity(g.memory - used[g.index][0], COMPUTE_MAX - used[g.index][1])
        for g in gpu_list
    }


def resolve_pin(devices: Sequence[str], gpus: Sequence[Gpu], *,
                keys: Sequence[str] = ()) -> tuple[Gpu, ...]:
    """Return the GPUs a pin names, in pin order; BadPinError for an unknown or repeated one
    (naming keys[i] for entry i where given, else vgpu.io/devices)."""
    ordered = sorted(gpus, key=lambda g: g.index)
    have = tuple(g.index for g in ordered)
    by_index = {str(g.index): g for g in ordered}
    by_uuid = {g.uuid: g for g in ordered}
    out: list[Gpu] = []
    for n, raw in enumerate(devices):
        key = {"key": keys[n]} if n < len(keys) else {}
        name = raw.strip()
        gpu = by_index.get(name) if name.isascii() and name.isdigit() else by_uuid.get(name)
        if gpu is None and name.isascii() and name.isdigit():
            gpu = by_index.get(str(int(name)))  # "01" is GPU 1
        if gpu is None:
            raise BadPinError(name or repr(raw), have, **key)
        if gpu in out:
            raise BadPinError(name, have, f"is named twice (GPU {gpu.index} is {gpu.uuid})",
                              **key)
        out.append(gpu)
    return tuple(out)


def place(request: Request, gpus: Sequence[Gpu], slices: Sequence[Slice], *,
          policy: str, allow_preemption: bool) -> Placement:
    """Decide where `request` goes; raise NoCapacityError, BadPinError or CountError."""
    if policy not in POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}: expected one of {POLICIES}")
    inventory = sorted(gpus, key=lambda g: g.index)
    asks = request.asks()
    if request.vgpus:
        for a in asks:
            _check_quantities(a.memory, a.compute)
        options = _per_vgpu_options(asks, inventory)
        pinned = False
    else:
        _check_quantities(request.memory, request.compute)
        pinned = bool(request.devices)
        eligible = resolve_pin(request.devices, inventory) if pinned else tuple(inventory)
        if request.count < 1 or request.count > len(eligible):
            raise CountError(request.count, len(eligible), pinned=pinned)
        options = [eligible] * len(asks)

    free = free_capacity(inventory, slices)  # sums: the same in any order
    chosen = _assign(asks, options, free, policy)
    if chosen is not None:
        return Placement(_grants(request, asks, options, chosen))

    # Which slices to evict depends on their order: never on the order they came in.
    slices = sorted(slices, key=attrgetter("id"))
    low = [s for s in slices if s.priority < Priority.NORMAL]
    low_ids = {s.id for s in low}
    would_help = bool(low) and _assign(
        asks, options, free_capacity(inventory, [s for s in slices if s.id not in low_ids]),
        policy) is not None
    if request.priority >= Priority.HIGH and allow_preemption and would_help:
        evict = _eviction_set(asks, options, inventory, slices, low)
        kept = [s for s in slices if s.id not in evict]
        chosen = _assign(asks, options, free_capacity(inventory, kept), policy)
        assert chosen is not None  # _eviction_set only returns sets that make it fit
        order = {s.id: n for n, s in enumerate(_by_preference(low))}
        return Placement(_grants(request, asks, options, chosen),
                         tuple(sorted(evict, key=order.__getitem__)))

    preemption_would_help = (would_help and request.priority >= Priority.HIGH
                             and not allow_preemption)
    if request.vgpus:
        raise _per_vgpu_no_capacity(asks, options, inventory, free, preemption_would_help)
    eligible = options[0]
    fitting = [g for g in eligible if _fits(asks[0], free[g.index])]
    # "The most free" on the GPUs that cannot take a vGPU: each maximum on its own GPU.
    others = [free[g.index] for g in eligible if g not in fitting]
    raise NoCapacityError(
        memory=request.memory, compute=request.compute, count=request.count,
        fitting=len(fitting),
        free_memory=max(0, max(c.memory for c in others)),
        free_compute=max(0, max(c.compute for c in others)),
        pinned=pinned,
        preemption_would_help=preemption_would_help,
    )


def validate_update(slice: Slice, gpus: Sequence[Gpu], slices: Sequence[Slice],
                    memory: int, compute: int) -> tuple[Grant, ...]:
    """Return `slice`'s grants changed to `memory`/`compute` on the same GPUs, if they fit.

    `slices` may include `slice` itself (its old grants are not counted). Raises
    NoCapacityError naming the first GPU without room, or one no longer in the inventory.
    """
    _check_quantities(memory, compute)
    return validate_grants(slice, gpus, slices,
                           tuple(Grant(g.gpu_index, g.gpu_uuid, memory, compute)
                                 for g in slice.grants))


def validate_grants(slice: Slice, gpus: Sequence[Gpu], slices: Sequence[Slice],
                    grants: Sequence[Grant]) -> tuple[Grant, ...]:
    """Return `grants` (`slice`'s, each vGPU with new amounts, same GPUs) if they fit.

    `slices` may include `slice` itself (its old grants are not counted). Raises
    NoCapacityError naming the first GPU without room, or one no longer in the inventory.
    """
    for g in grants:
        _check_quantities(g.memory, g.compute)
    inventory = list(gpus)
    free = free_capacity(inventory, [s for s in slices if s.id != slice.id])
    by_uuid, by_index = {g.uuid: g for g in inventory}, {g.index: g for g in inventory}
    for grant in grants:
        memory, compute = grant.memory, grant.compute
        gpu = _gpu_of(grant, by_uuid, by_index)
        if gpu is None:
            raise NoCapacityError(
                memory=memory, compute=compute, slice_id=slice.id,
                reason=(f"GPU {grant.gpu_index} ({grant.gpu_uuid}) of slice {slice.id} "
                        "is not in the inventory"))
        room = free[gpu.index]
        if room.memory < memory or room.compute < compute:
            raise NoCapacityError(
                memory=memory, compute=compute, free_memory=max(0, room.memory),
                free_compute=max(0, room.compute), slice_id=slice.id,
                reason=(f"GPU {gpu.index} has no room to give slice {slice.id} "
                        f"{_quantity(memory)} memory and {compute}% compute: at most "
                        f"{_quantity(room.memory)} memory and {max(0, room.compute)}% "
                        "compute are free for it"))
        # Two vGPUs of one slice never share a GPU, but count them both if they did.
        free[gpu.index] = Capacity(room.memory - memory, room.compute - compute)
    return tuple(grants)


# --- internals ------------------------------------------------------------------------------

def _check_quantities(memory: int, compute: int) -> None:
    if memory < 1:
        raise QuantityError("memory", str(memory), "a positive number of bytes")
    if not COMPUTE_MIN <= compute <= COMPUTE_MAX:
        raise QuantityError("compute", str(compute), COMPUTE_FORMS)


def _gpu_of(grant: Grant, by_uuid: dict[str, Gpu], by_index: dict[int, Gpu]) -> Gpu | None:
    if grant.gpu_uuid:
        return by_uuid.get(grant.gpu_uuid)
    return by_index.get(grant.gpu_index)


def _used(gpus: Sequence[Gpu], slices: Iterable[Slice]) -> dict[int, list[int]]:
    # Every allocation sums every slice's grants: _gpu_of inlined, as dict lookups by
    # uuid (or index, for a grant without one) straight to the GPU's running sums.
    sums = {g.index: [0, 0] for g in gpus}
    by_uuid = {g.uuid: sums[g.index] for g in gpus}
    by_index = {g.index: sums[g.index] for g in gpus}
    for s in slices:
        for grant in s.grants:
            used = by_uuid.get(grant.gpu_uuid) if grant.gpu_uuid else by_index.get(grant.gpu_index)
            if used is not None:
                used[0] += grant.memory
                used[1] += grant.compute
    return sums


def _fits(ask: VGpuAsk, room: Capacity) -> bool:
    return room.memory >= ask.memory and room.compute >= ask.compute


def _per_vgpu_options(asks: Sequence[VGpuAsk], inventory: Sequence[Gpu],
                      ) -> list[tuple[Gpu, ...]]:
    """The GPUs each ask may go to: its pin, else any (pins resolved together: one GPU
    named by two asks is refused)."""
    pinned = [n for n, a in enumerate(asks) if a.device]
    gpus = resolve_pin([asks[n].device for n in pinned], inventory,
                       keys=[f"vgpus[{n}].device" for n in pinned])
    by_ask = dict(zip(pinned, gpus, strict=True))
    if len(asks) > len(inventory):
        raise CountError(len(asks), len(inventory))
    return [(by_ask[n],) if n in by_ask else tuple(inventory) for n in range(len(asks))]


def _matchable(todo: Sequence[int], asks: Sequence[VGpuAsk],
               options: Sequence[Sequence[Gpu]], free: dict[int, Capacity],
               taken: set[int]) -> bool:
    """Whether every ask in `todo` can get its own GPU (one that fits it, not in `taken`):
    a bipartite matching by augmenting paths (a handful of asks and GPUs)."""
    holder: dict[int, int] = {}  # GPU index -> ask

    def augment(n: int, seen: set[int]) -> bool:
        for g in options[n]:
            if g.index in taken or g.index in seen or not _fits(asks[n], free[g.index]):
                continue
            seen.add(g.index)
            if g.index not in holder or augment(holder[g.index], seen):
                holder[g.index] = n
                return True
        return False

    return all(augment(n, set()) for n in todo)


def _assign(asks: Sequence[VGpuAsk], options: Sequence[Sequence[Gpu]],
            free: dict[int, Capacity], policy: str) -> list[Gpu] | None:
    """The GPU of each ask (by ask index), or None when no assignment to distinct GPUs fits.

    Pinned asks first, then the largest; each takes the GPU the policy ranks first
    among those that still leave every later ask a GPU of its own."""
    order = sorted(range(len(asks)), key=lambda n: (len(options[n]) != 1, -asks[n].memory,
                                                    -asks[n].compute, n))
    # One ask (most slices) needs no matching: the loop below takes its best fitting GPU.
    if len(asks) > 1 and not _matchable(order, asks, options, free, set()):
        return None
    taken: set[int] = set()
    out: dict[int, Gpu] = {}
    for k, n in enumerate(order):
        ask = asks[n]

        def after(g: Gpu, ask: VGpuAsk = ask) -> tuple[int, int]:
            room = free[g.index]
            return room.memory - ask.memory, room.compute - ask.compute

        fitting = [g for g in options[n] if g.index not in taken and _fits(ask, free[g.index])]
        if policy == BINPACK:
            ranked = sorted(fitting, key=lambda g: (*after(g), g.index))
        else:
            ranked = sorted(fitting, key=lambda g: (-after(g)[0], -after(g)[1], g.index))
        for g in ranked:
            if _matchable(order[k + 1:], asks, options, free, taken | {g.index}):
                out[n] = g
                taken.add(g.index)
                break
        else:  # no GPU fits a lone ask (for more, the matching above ruled it out)
            return None
    return [out[n] for n in range(len(asks))]


def _grants(request: Request, asks: Sequence[VGpuAsk], options: Sequence[Sequence[Gpu]],
            chosen: Sequence[Gpu]) -> tuple[Grant, ...]:
    if not request.vgpus:
        # Equal asks: vGPU order is pin order where pinned (options are in pin order),
        # else index order.
        picked = set(chosen)
        chosen = [g for g in options[0] if g in picked] if options else []
    return tuple(Grant(g.index, g.uuid, a.memory, a.compute)
                 for g, a in zip(chosen, asks, strict=True))


def _asked(asks: Sequence[VGpuAsk], inventory: Sequence[Gpu]) -> str:
    parts = []
    for a in asks:
        part = f"{_quantity(a.memory)} memory and {a.compute}% compute"
        if a.device:
            gpu = resolve_pin([a.device], inventory)[0]
            part += f" on GPU {gpu.index}"
        parts.append(part)
    return " + ".join(parts)


def _per_vgpu_no_capacity(asks: Sequence[VGpuAsk], options: Sequence[Sequence[Gpu]],
                          inventory: Sequence[Gpu], free: dict[int, Capacity],
                          preemption_would_help: bool) -> NoCapacityError:
    """One line: the pinned GPU without room (what was asked, what is free), else every
    GPU's free room."""
    suffix = ("; evicting low priority slices would make room, but preemption is disabled "
              "in the config" if preemption_would_help else "")
    for n, a in enumerate(asks):
        if a.device:
            gpu = options[n][0]
            room = free[gpu.index]
            if not _fits(a, room):
                return NoCapacityError(
                    memory=a.memory, compute=a.compute, count=len(asks),
                    free_memory=max(0, room.memory), free_compute=max(0, room.compute),
                    pinned=True, preemption_would_help=preemption_would_help,
                    reason=(f"vgpus[{n}]: GPU {gpu.index} has no room for "
                            f"{_quantity(a.memory)} memory and {a.compute}% compute: "
                            f"{_quantity(max(0, room.memory))} memory and "
                            f"{max(0, room.compute)}% compute are free on it{suffix}"))
    rooms = ", ".join(f"GPU {g.index} {_quantity(max(0, free[g.index].memory))} memory and "
                      f"{max(0, free[g.index].compute)}% compute" for g in inventory)
    biggest = max(asks, key=lambda a: (a.memory, a.compute))
    return NoCapacityError(
        memory=biggest.memory, compute=biggest.compute, count=len(asks),
        free_memory=max((max(0, c.memory) for c in free.values()), default=0),
        free_compute=max((max(0, c.compute) for c in free.values()), default=0),
        preemption_would_help=preemption_would_help,
        reason=(f"no {len(asks)} distinct GPU{'s' if len(asks) > 1 else ''} have room for "
                f"{_asked(asks, inventory)}: free are {rooms}{suffix}"))


def _by_preference(low: Iterable[Slice]) -> list[Slice]:
    """Eviction preference: smallest first (memory, compute), newest first, then id."""
    return sorted(low, key=lambda s: (sum(g.memory for g in s.grants),
                                      sum(g.compute for g in s.grants),
                                      -s.created_ms, s.id))


def _eviction_set(asks: Sequence[VGpuAsk], options: Sequence[Sequence[Gpu]],
                  inventory: Sequence[Gpu], slices: Sequence[Slice],
                  low: Sequence[Slice]) -> set[str]:
    """The fewest low slices whose eviction makes the asks fit (caller checked all do)."""
    low_ids = {s.id for s in low}
    base = free_capacity(inventory, [s for s in slices if s.id not in low_ids])
    # What evicting each low slice frees on each eligible GPU.
    by_uuid = {g.uuid: g for g in inventory}
    by_index = {g.index: g for g in inventory}
    eligible_idx = {g.index for opts in options for g in opts}
    frees: dict[str, dict[int, tuple[int, int]]] = {}
    for s in low:
        per_gpu: dict[int, tuple[int, int]] = {}
        for grant in s.grants:
            gpu = _gpu_of(grant, by_uuid, by_index)
            if gpu is not None and gpu.index in eligible_idx:
                m, c = per_gpu.get(gpu.index, (0, 0))
                per_gpu[gpu.index] = (m + grant.memory, c + grant.compute)
        frees[s.id] = per_gpu
    # `base` counts every low slice as evicted; start from all of them in place.
    held = {i: [base[i].memory, base[i].compute] for i in eligible_idx}
    for per_gpu in frees.values():
        for i, (m, c) in per_gpu.items():
            held[i][0] -= m
            held[i][1] -= c
    everyone = range(len(asks))

    def fits(evict: Iterable[str]) -> bool:
        room = {i: list(v) for i, v in held.items()}
        for sid in evict:
            for i, (m, c) in frees[sid].items():
                room[i][0] += m
                room[i][1] += c
        return _matchable(everyone, asks, options,
                          {i: Capacity(m, c) for i, (m, c) in room.items()}, set())

    # Only slices on a GPU that could take an ask once emptied of low slices help.
    useful_gpus = {g.index for n, opts in enumerate(options) for g in opts
                   if _fits(asks[n], base[g.index])}
    candidates = [s.id for s in _by_preference(low) if set(frees[s.id]) & useful_gpus]

    budget = _SEARCH_BUDGET
    for k in range(1, len(candidates) + 1):
        for combo in itertools.combinations(candidates, k):
            if fits(combo):
                return set(combo)
            budget -= 1
            if budget <= 0:
                break
        if budget <= 0:
            break

    # Too many combinations: evict biggest first until it fits, then spare every slice
    # that can be spared (so the set is still minimal: none of it could stay).
    chosen: list[str] = []
    for sid in reversed(candidates):
        chosen.append(sid)
        if fits(chosen):
            break
    for sid in list(chosen):
        rest = [x for x in chosen if x != sid]
        if fits(rest):
            chosen = rest
    return set(chosen)
