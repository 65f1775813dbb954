# SPDX-License-Identifier: Apache-2.0
"""arbiter.slices.placement: tables for the policies, pins and messages; properties with
hypothesis."""
from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbiter.errors import BadPinError, CountError, NoCapacityError, QuantityError, VgpuError
from arbiter.model import Gpu, Grant, Priority, Request, Slice, VGpuAsk
from arbiter.slices.placement import (
    POLICIES,
    Capacity,
    Placement,
    free_capacity,
    place,
    resolve_pin,
    validate_update,
)

MI, GI = 1 << 20, 1 << 30
LOW, NORMAL, HIGH = Priority.LOW, Priority.NORMAL, Priority.HIGH


def gpus_of(*sizes: int) -> list[Gpu]:
    return [Gpu(i, f"GPU-{i:04x}", "Sim", size, i) for i, size in enumerate(sizes)]


def slice_on(sid: str, *grants: tuple[int, int, int], priority: Priority = NORMAL,
             created_ms: int = 0) -> Slice:
    """A slice with grants (gpu index, memory, compute) on the GPUs of gpus_of()."""
    return Slice(sid, f"owner-{sid}",
                 tuple(Grant(i, f"GPU-{i:04x}", m, c) for i, m, c in grants),
                 priority=priority, created_ms=created_ms)


def req(memory: int, compute: int = 10, count: int = 1, priority: Priority = NORMAL,
        devices: tuple[str, ...] = ()) -> Request:
    return Request("c1", memory, compute, count=count, priority=priority, devices=devices)


def indices(p: Placement) -> list[int]:
    return [g.gpu_index for g in p.grants]


# --- tables ---------------------------------------------------------------------------------

# (id, gpus, slices, request, policy, expected GPU indices)
POLICY_CASES = [
    ("binpack-empty-lowest-index", gpus_of(16 * GI, 16 * GI), [], req(4 * GI), "binpack", [0]),
    ("spread-empty-lowest-index", gpus_of(16 * GI, 16 * GI), [], req(4 * GI), "spread", [0]),
    ("binpack-fullest", gpus_of(16 * GI, 16 * GI), [slice_on("a", (1, 8 * GI, 10))],
     req(4 * GI), "binpack", [1]),
    ("spread-emptiest", gpus_of(16 * GI, 16 * GI), [slice_on("a", (0, 8 * GI, 10))],
     req(4 * GI), "spread", [1]),
    ("binpack-skips-full", gpus_of(16 * GI, 16 * GI), [slice_on("a", (1, 14 * GI, 10))],
     req(4 * GI), "binpack", [0]),
    ("binpack-compute-full", gpus_of(16 * GI, 16 * GI), [slice_on("a", (1, 1 * GI, 95))],
     req(1 * GI, 10), "binpack", [0]),
    ("binpack-compute-tiebreak", gpus_of(16 * GI, 16 * GI),
     [slice_on("a", (0, 4 * GI, 10)), slice_on("b", (1, 4 * GI, 80))],
     req(1 * GI), "binpack", [1]),
    ("spread-compute-tiebreak", gpus_of(16 * GI, 16 * GI),
     [slice_on("a", (0, 4 * GI, 80)), slice_on("b", (1, 4 * GI, 10))],
     req(1 * GI), "spread", [1]),
    ("binpack-smaller-gpu", gpus_of(32 * GI, 16 * GI), [], req(4 * GI), "binpack", [1]),
    ("spread-bigger-gpu", gpus_of(16 * GI, 32 * GI), [], req(4 * GI), "spread", [1]),
    ("exact-fit", gpus_of(16 * GI), [slice_on("a", (0, 12 * GI, 50))], req(4 * GI, 50),
     "binpack", [0]),
    ("count2-binpack", gpus_of(16 * GI, 16 * GI, 16 * GI), [slice_on("a", (2, 8 * GI, 10))],
     req(4 * GI, count=2), "binpack", [0, 2]),
    ("count2-spread", gpus_of(16 * GI, 16 * GI, 16 * GI), [slice_on("a", (0, 8 * GI, 10))],
     req(4 * GI, count=2), "spread", [1, 2]),
    ("count-all", gpus_of(16 * GI, 16 * GI, 16 * GI), [], req(16 * GI, 100, count=3),
     "binpack", [0, 1, 2]),
    ("pin-index", gpus_of(16 * GI, 16 * GI), [slice_on("a", (1, 8 * GI, 10))],
     req(4 * GI, devices=("0",)), "binpack", [0]),
    ("pin-uuid", gpus_of(16 * GI, 16 * GI), [], req(4 * GI, devices=("GPU-0001",)),
     "binpack", [1]),
    ("pin-order-is-vgpu-order", gpus_of(16 * GI, 16 * GI, 16 * GI), [],
     req(4 * GI, count=2, devices=("2", "GPU-0000")), "binpack", [2, 0]),
    ("pin-count-below-pins", gpus_of(16 * GI, 16 * GI, 16 * GI),
     [slice_on("a", (2, 8 * GI, 10))], req(4 * GI, devices=("1", "2")), "binpack", [2]),
    ("pin-leading-zero", gpus_of(16 * GI, 16 * GI), [], req(4 * GI, devices=("01",)),
     "binpack", [1]),
    ("grant-on-missing-gpu-ignored", gpus_of(16 * GI),
     [Slice("x", "ox", (Grant(5, "GPU-gone", 16 * GI, 100),))], req(16 * GI, 100),
     "binpack", [0]),
]


@pytest.mark.parametrize(("gpus", "slices", "request_", "policy", "expected"),
                         [c[1:] for c in POLICY_CASES], ids=[c[0] for c in POLICY_CASES])
def test_policy_table(gpus, slices, request_, policy, expected):
    p = place(request_, gpus, slices, policy=policy, allow_preemption=False)
    assert indices(p) == expected
    assert p.evict == ()
    by_index = {g.index: g for g in gpus}
    assert [g.gpu_uuid for g in p.grants] == [by_index[i].uuid for i in expected]
    assert all(g.memory == request_.memory and g.compute == request_.compute for g in p.grants)


# (id, gpus, slices, request, allow_preemption, exact message)
ERROR_CASES = [
    ("none-fits", gpus_of(16 * GI, 16 * GI),
     [slice_on("a", (0, 10 * GI, 60)), slice_on("b", (1, 12 * GI, 20))],
     req(8 * GI, 50, count=3), False, CountError,
     "vgpu.io/count: 3 vGPUs need 3 distinct GPUs but this host has 2"),
    ("contract-example", gpus_of(16 * GI, 16 * GI, 16 * GI),
     [slice_on("a", (0, 10 * GI, 60)), slice_on("b", (1, 12 * GI, 60)),
      slice_on("c", (2, 16 * GI, 70))],
     req(8 * GI, 50, count=3), False, NoCapacityError,
     "no GPU has room for 3 x 8Gi memory and 50% compute: "
     "the most free on any GPU is 6Gi memory and 40% compute"),
    ("single", gpus_of(16 * GI), [slice_on("a", (0, 15 * GI + 512 * MI, 30))],
     req(1 * GI), False, NoCapacityError,
     "no GPU has room for 1Gi memory and 10% compute: "
     "the most free on any GPU is 512Mi memory and 70% compute"),
    ("nothing-free", gpus_of(16 * GI), [slice_on("a", (0, 16 * GI, 100))],
     req(1 * GI), False, NoCapacityError,
     "no GPU has room for 1Gi memory and 10% compute: "
     "the most free on any GPU is 0 memory and 0% compute"),
    ("compute-short", gpus_of(16 * GI), [slice_on("a", (0, 1 * GI, 95))],
     req(1 * GI), False, NoCapacityError,
     "no GPU has room for 1Gi memory and 10% compute: "
     "the most free on any GPU is 15Gi memory and 5% compute"),
    ("some-fit", gpus_of(16 * GI, 16 * GI, 16 * GI), [slice_on("a", (2, 14 * GI, 10))],
     req(4 * GI, count=3), False, NoCapacityError,
     "only 2 GPUs have room for 3 x 4Gi memory and 10% compute (each vGPU needs its own "
     "GPU): the most free on any other GPU is 2Gi memory and 90% compute"),
    ("pinned-full", gpus_of(16 * GI, 16 * GI), [slice_on("a", (1, 14 * GI, 10))],
     req(4 * GI, devices=("1",)), False, NoCapacityError,
     "no pinned GPU has room for 4Gi memory and 10% compute: "
     "the most free on any pinned GPU is 2Gi memory and 90% compute"),
    ("decimal-quantity", gpus_of(16 * GI), [slice_on("a", (0, 16 * GI - 10**9, 10))],
     req(2 * 10**9), False, NoCapacityError,
     "no GPU has room for 1953125Ki memory and 10% compute: "  # format_memory: binary first
     "the most free on any GPU is 1G memory and 90% compute"),
    ("preemption-disabled", gpus_of(16 * GI), [slice_on("a", (0, 12 * GI, 10), priority=LOW)],
     req(8 * GI, priority=HIGH), False, NoCapacityError,
     "no GPU has room for 8Gi memory and 10% compute: the most free on any GPU is 4Gi "
     "memory and 90% compute; evicting low priority slices would make room, but "
     "preemption is disabled in the config"),
    ("normal-never-preempts", gpus_of(16 * GI),
     [slice_on("a", (0, 12 * GI, 10), priority=LOW)], req(8 * GI), True, NoCapacityError,
     "no GPU has room for 8Gi memory and 10% compute: "
     "the most free on any GPU is 4Gi memory and 90% compute"),
    ("normal-slices-are-safe", gpus_of(16 * GI),
     [slice_on("a", (0, 12 * GI, 10), priority=NORMAL)], req(8 * GI, priority=HIGH), True,
     NoCapacityError, "no GPU has room for 8Gi memory and 10% compute: "
     "the most free on any GPU is 4Gi memory and 90% compute"),
    ("pin-missing-index", gpus_of(16 * GI, 16 * GI), [], req(GI, devices=("7",)), False,
     BadPinError, "vgpu.io/devices: GPU 7 does not exist (have 0-1)"),
    ("pin-missing-uuid", gpus_of(16 * GI, 16 * GI), [], req(GI, devices=("GPU-dead",)), False,
     BadPinError, "vgpu.io/devices: GPU GPU-dead does not exist (have 0-1)"),
    ("pin-twice", gpus_of(16 * GI, 16 * GI), [], req(GI, count=2, devices=("0", "GPU-0000")),
     False, BadPinError,
     "vgpu.io/devices: GPU GPU-0000 is named twice (GPU 0 is GPU-0000) (have 0-1)"),
    ("pin-empty-name", gpus_of(16 * GI), [], req(GI, devices=("",)), False, BadPinError,
     "vgpu.io/devices: GPU '' does not exist (have 0)"),
    ("count-above-pins", gpus_of(16 * GI, 16 * GI, 16 * GI), [],
     req(GI, count=2, devices=("1",)), False, CountError,
     "vgpu.io/count: 2 vGPUs need 2 distinct GPUs but vgpu.io/devices names only 1"),
    ("count-zero", gpus_of(16 * GI), [], req(GI, count=0), False, CountError,
     "vgpu.io/count: 0 is not a positive number of vGPUs"),
    ("no-gpus", [], [], req(GI), False, CountError,
     "vgpu.io/count: 1 vGPUs need 1 distinct GPUs but this host has 0"),
    ("compute-range", gpus_of(16 * GI), [], req(GI, compute=101), False, QuantityError,
     "invalid compute quantity '101': expected an integer percent from 2 to 100"),
]


@pytest.mark.parametrize(("gpus", "slices", "request_", "allow", "error", "message"),
                         [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_error_table(gpus, slices, request_, allow, error, message):
    with pytest.raises(error) as info:
        place(request_, gpus, slices, policy="binpack", allow_preemption=allow)
    assert str(info.value) == message
    assert isinstance(info.value, VgpuError)
    assert "\n" not in str(info.value)


def test_no_capacity_attributes():
    gpus = gpus_of(16 * GI, 16 * GI)
    slices = [slice_on("a", (0, 10 * GI, 60)), slice_on("b", (1, 12 * GI, 20))]
    with pytest.raises(NoCapacityError) as info:
        place(req(8 * GI, 50, count=2), gpus, slices, policy="spread", allow_preemption=True)
    e = info.value
    assert (e.memory, e.compute, e.count, e.fitting, e.free_memory, e.free_compute) == (
        8 * GI, 50, 2, 0, 6 * GI, 80)
    assert not e.pinned and not e.preemption_would_help


def test_bad_pin_and_count_attributes():
    with pytest.raises(BadPinError) as pin:
        resolve_pin(["9"], gpus_of(GI, GI, GI))
    assert (pin.value.pin, pin.value.have) == ("9", (0, 1, 2))
    with pytest.raises(CountError) as count:
        place(req(GI, count=4), gpus_of(GI, GI), [], policy="binpack", allow_preemption=False)
    assert (count.value.count, count.value.available, count.value.pinned) == (4, 2, False)


def test_unknown_policy():
    with pytest.raises(ValueError, match="fast"):
        place(req(GI), gpus_of(GI), [], policy="fast", allow_preemption=False)


# (id, slices, request, expected evict, expected GPUs)
PREEMPT_CASES = [
    ("one-low-enough", [slice_on("a", (0, 12 * GI, 10), priority=LOW)], req(8 * GI), ["a"],
     [0]),
    ("fewest-over-smallest",
     [slice_on("a", (0, 4 * GI, 10), priority=LOW, created_ms=1),
      slice_on("b", (0, 4 * GI, 10), priority=LOW, created_ms=2),
      slice_on("c", (0, 8 * GI, 10), priority=LOW, created_ms=3)],
     req(8 * GI), ["c"], [0]),
    ("smallest-that-suffices",
     [slice_on("a", (0, 4 * GI, 10), priority=LOW, created_ms=1),
      slice_on("b", (0, 6 * GI, 10), priority=LOW, created_ms=2),
      slice_on("c", (0, 6 * GI, 10), priority=LOW, created_ms=3)],
     req(4 * GI), ["a"], [0]),
    ("newest-first",
     [slice_on("a", (0, 8 * GI, 10), priority=LOW, created_ms=1),
      slice_on("b", (0, 8 * GI, 10), priority=LOW, created_ms=2)],
     req(8 * GI), ["b"], [0]),
    ("two-needed",
     [slice_on("a", (0, 6 * GI, 10), priority=LOW, created_ms=1),
      slice_on("b", (0, 6 * GI, 10), priority=LOW, created_ms=2),
      slice_on("n", (0, 4 * GI, 10), priority=NORMAL)],
     req(12 * GI), ["a", "b"], [0]),
    ("compute-bound",
     [slice_on("a", (0, 1 * GI, 30), priority=LOW),
      slice_on("b", (0, 1 * GI, 60), priority=LOW),
      slice_on("n", (0, 1 * GI, 10))],
     req(1 * GI, 50), ["b"], [0]),
]


@pytest.mark.parametrize(("slices", "request_", "evict", "expected"),
                         [c[1:] for c in PREEMPT_CASES], ids=[c[0] for c in PREEMPT_CASES])
def test_preemption_table(slices, request_, evict, expected):
    gpus = gpus_of(16 * GI)
    high = replace(request_, priority=HIGH)
    p = place(high, gpus, slices, policy="binpack", allow_preemption=True)
    assert sorted(p.evict) == evict
    assert indices(p) == expected


def test_preemption_multi_gpu_low_slice():
    # One low slice spanning both GPUs frees room on both: a 2-GPU request needs only it.
    gpus = gpus_of(16 * GI, 16 * GI)
    slices = [slice_on("wide", (0, 10 * GI, 10), (1, 10 * GI, 10), priority=LOW),
              slice_on("a", (0, 2 * GI, 10), priority=LOW),
              slice_on("b", (1, 2 * GI, 10), priority=LOW)]
    p = place(req(8 * GI, count=2, priority=HIGH), gpus, slices, policy="binpack",
              allow_preemption=True)
    assert p.evict == ("wide",)
    assert indices(p) == [0, 1]


def test_no_preemption_when_it_fits():
    gpus = gpus_of(16 * GI, 16 * GI)
    slices = [slice_on("a", (0, 12 * GI, 10), priority=LOW)]
    p = place(req(8 * GI, priority=HIGH), gpus, slices, policy="binpack", allow_preemption=True)
    assert p.evict == () and indices(p) == [1]


def test_preemption_that_cannot_help():
    gpus = gpus_of(16 * GI)
    slices = [slice_on("a", (0, 4 * GI, 10), priority=LOW), slice_on("n", (0, 10 * GI, 10))]
    with pytest.raises(NoCapacityError) as info:
        place(req(8 * GI, priority=HIGH), gpus, slices, policy="binpack", allow_preemption=True)
    assert not info.value.preemption_would_help


def test_preemption_with_many_low_slices_falls_back_to_a_minimal_set():
    # 60 low slices of 256Mi + 1 big one: the search budget runs out before size 17
    # combinations of small ones; the result must still fit and be minimal.
    gpus = gpus_of(16 * GI)
    slices = [slice_on(f"s{i:02d}", (0, 256 * MI, 1), priority=LOW, created_ms=i)
              for i in range(60)]
    slices.append(slice_on("n", (0, 1 * GI, 10)))
    request = req(12 * GI, priority=HIGH)
    p = place(request, gpus, slices, policy="binpack", allow_preemption=True)
    check_eviction_minimal(request, gpus, slices, p)
    assert len(p.evict) == 48


# --- validate_update ------------------------------------------------------------------------

def test_validate_update_grows_in_place():
    gpus = gpus_of(16 * GI, 16 * GI)
    s = slice_on("a", (1, 4 * GI, 10), (0, 4 * GI, 10))
    others = [s, slice_on("b", (0, 8 * GI, 50))]
    assert validate_update(s, gpus, others, 8 * GI, 50) == (
        Grant(1, "GPU-0001", 8 * GI, 50), Grant(0, "GPU-0000", 8 * GI, 50))
    assert validate_update(s, gpus, others, 1 * GI, 2) == (
        Grant(1, "GPU-0001", 1 * GI, 2), Grant(0, "GPU-0000", 1 * GI, 2))


@pytest.mark.parametrize(("memory", "compute", "message"), [
    (9 * GI, 10, "GPU 0 has no room to give slice a 9Gi memory and 10% compute: "
                 "at most 8Gi memory and 50% compute are free for it"),
    (4 * GI, 60, "GPU 0 has no room to give slice a 4Gi memory and 60% compute: "
                 "at most 8Gi memory and 50% compute are free for it"),
], ids=["memory", "compute"])
def test_validate_update_refuses(memory, compute, message):
    gpus = gpus_of(16 * GI, 16 * GI)
    s = slice_on("a", (1, 4 * GI, 10), (0, 4 * GI, 10))
    with pytest.raises(NoCapacityError) as info:
        validate_update(s, gpus, [s, slice_on("b", (0, 8 * GI, 50))], memory, compute)
    assert str(info.value) == message
    assert info.value.slice_id == "a"


def test_validate_update_gpu_gone():
    s = Slice("a", "o", (Grant(3, "GPU-gone", GI, 10),))
    with pytest.raises(NoCapacityError, match=r"^GPU 3 \(GPU-gone\) of slice a is not in"):
        validate_update(s, gpus_of(16 * GI), [s], GI, 10)


def test_validate_update_bad_quantity():
    s = slice_on("a", (0, GI, 10))
    with pytest.raises(QuantityError):
        validate_update(s, gpus_of(16 * GI), [s], GI, 1)
    with pytest.raises(QuantityError):
        validate_update(s, gpus_of(16 * GI), [s], 0, 10)


def test_free_capacity():
    gpus = gpus_of(16 * GI, 8 * GI)
    slices = [slice_on("a", (0, 4 * GI, 10), (1, 4 * GI, 30)), slice_on("b", (0, GI, 5))]
    assert free_capacity(gpus, slices) == {0: Capacity(11 * GI, 85), 1: Capacity(4 * GI, 70)}


# --- properties -----------------------------------------------------------------------------

SIZES = [4 * GI, 8 * GI, 16 * GI]
MEMORIES = [512 * MI, 1 * GI, 2 * GI, 3 * GI, 4 * GI, 6 * GI, 8 * GI, 16 * GI]
COMPUTES = [2, 5, 10, 25, 30, 50, 70, 100]


@st.composite
def inventories(draw):
    sizes = draw(st.lists(st.sampled_from(SIZES), min_size=1, max_size=4))
    return gpus_of(*sizes)


@st.composite
def requests(draw, gpus):
    count = draw(st.integers(1, len(gpus)))
    devices: tuple[str, ...] = ()
    if draw(st.booleans()) and draw(st.booleans()):
        pinned = draw(st.permutations(gpus))[: draw(st.integers(count, len(gpus)))]
        devices = tuple(str(g.index) if draw(st.booleans()) else g.uuid for g in pinned)
    return Request(
        owner="x", memory=draw(st.sampled_from(MEMORIES)),
        compute=draw(st.sampled_from(COMPUTES)), count=count,
        priority=draw(st.sampled_from(list(Priority))), devices=devices)


def total_used(gpus, slices) -> dict[int, tuple[int, int]]:
    """Independent accounting (by UUID) for the checks."""
    uuid_index = {g.uuid: g.index for g in gpus}
    used = {g.index: [0, 0] for g in gpus}
    for s in slices:
        for grant in s.grants:
            used[uuid_index[grant.gpu_uuid]][0] += grant.memory
            used[uuid_index[grant.gpu_uuid]][1] += grant.compute
    return {i: (m, c) for i, (m, c) in used.items()}


def assert_not_overcommitted(gpus, slices):
    used = total_used(gpus, slices)
    for g in gpus:
        assert used[g.index][0] <= g.memory, f"GPU {g.index} memory over-committed"
        assert used[g.index][1] <= 100, f"GPU {g.index} compute over-committed"


def eligible_of(request, gpus):
    return resolve_pin(request.devices, gpus) if request.devices else tuple(gpus)


def fits_plainly(request, gpus, slices) -> bool:
    """Brute force: do `count` eligible GPUs each have room (independent of placement.py)?"""
    used = total_used(gpus, slices)
    room = [g for g in eligible_of(request, gpus)
            if g.memory - used[g.index][0] >= request.memory
            and 100 - used[g.index][1] >= request.compute]
    return len(room) >= request.count


def without(slices, ids):
    return [s for s in slices if s.id not in set(ids)]


def check_eviction_minimal(request, gpus, slices, p):
    by_id = {s.id: s for s in slices}
    assert all(by_id[e].priority == LOW for e in p.evict)
    assert not fits_plainly(request, gpus, slices)  # evicting only when needed
    assert fits_plainly(request, gpus, without(slices, p.evict))
    for e in p.evict:  # none could be spared
        spared = [x for x in p.evict if x != e]
        assert not fits_plainly(request, gpus, without(slices, spared)), f"{e} was not needed"


def check_grants(request, gpus, p):
    assert len(p.grants) == request.count
    assert len({g.gpu_uuid for g in p.grants}) == request.count  # distinct GPUs
    by_uuid = {g.uuid: g for g in gpus}
    for g in p.grants:
        assert by_uuid[g.gpu_uuid].index == g.gpu_index
        assert (g.memory, g.compute) == (request.memory, request.compute)
    if request.devices:
        allowed = {g.uuid for g in eligible_of(request, gpus)}
        assert {g.gpu_uuid for g in p.grants} <= allowed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_sequences_never_overcommit(data):
    gpus = data.draw(inventories(), label="gpus")
    policy = data.draw(st.sampled_from(POLICIES), label="policy")
    allow = data.draw(st.booleans(), label="allow_preemption")
    slices: list[Slice] = []
    for step in range(data.draw(st.integers(1, 25), label="steps")):
        if slices and data.draw(st.integers(0, 3)) == 0:
            gone = data.draw(st.sampled_from(slices))
            before = free_capacity(gpus, slices)
            slices = without(slices, [gone.id])
            after = free_capacity(gpus, slices)
            for g in gone.grants:  # release restores capacity exactly
                before[g.gpu_index] = Capacity(before[g.gpu_index].memory + g.memory,
                                               before[g.gpu_index].compute + g.compute)
            assert after == before
            continue
        request = data.draw(requests(gpus))
        try:
            p = place(request, gpus, slices, policy=policy, allow_preemption=allow)
        except NoCapacityError as e:
            assert not fits_plainly(request, gpus, slices)
            lows = [s.id for s in slices if s.priority == LOW]
            helps = fits_plainly(request, gpus, without(slices, lows))
            if request.priority == HIGH and allow:
                assert not helps  # preemption was possible but refused
            assert e.preemption_would_help == (helps and request.priority == HIGH and not allow)
            continue
        # Deterministic, and independent of the order the caller lists things in.
        again = place(request, gpus, slices, policy=policy, allow_preemption=allow)
        shuffled = place(request, random.Random(step).sample(gpus, len(gpus)),
                         random.Random(step).sample(slices, len(slices)),
                         policy=policy, allow_preemption=allow)
        assert again == p == shuffled
        check_grants(request, gpus, p)
        if p.evict:
            assert request.priority == HIGH and allow
            check_eviction_minimal(request, gpus, slices, p)
        else:
            assert fits_plainly(request, gpus, slices)
        kept = without(slices, p.evict)
        new = Slice(f"s{step}", f"o{step}", p.grants, priority=request.priority,
                    created_ms=step)
        # Releasing the new slice restores the capacity; placing again gives the same grants.
        assert place(request, gpus, kept, policy=policy, allow_preemption=False).grants == (
            p.grants)
        slices = [*kept, new]
        assert_not_overcommitted(gpus, slices)
        assert free_capacity(gpus, kept) == {
            i: Capacity(c.memory + sum(g.memory for g in p.grants if g.gpu_index == i),
                        c.compute + sum(g.compute for g in p.grants if g.gpu_index == i))
            for i, c in free_capacity(gpus, slices).items()}


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_eviction_is_fewest_possible(data):
    gpus = data.draw(inventories(), label="gpus")
    slices: list[Slice] = []
    # Fill the GPUs with random low and normal slices (placed, so never over-committed).
    for i in range(data.draw(st.integers(0, 10), label="fill")):
        r = data.draw(requests(gpus))
        r = replace(r, priority=data.draw(st.sampled_from([LOW, LOW, NORMAL])), devices=())
        try:
            p = place(r, gpus, slices, policy="spread", allow_preemption=False)
        except NoCapacityError:
            continue
        slices.append(Slice(f"f{i}", f"o{i}", p.grants, priority=r.priority, created_ms=i))
    request = replace(data.draw(requests(gpus)), priority=HIGH)
    policy = data.draw(st.sampled_from(POLICIES))
    try:
        p = place(request, gpus, slices, policy=policy, allow_preemption=True)
    except NoCapacityError:
        lows = [s.id for s in slices if s.priority == LOW]
        assert not fits_plainly(request, gpus, without(slices, lows))
        return
    assert_not_overcommitted(gpus, [*without(slices, p.evict),
                                    Slice("new", "new", p.grants)])
    if not p.evict:
        return
    check_eviction_minimal(request, gpus, slices, p)
    lows = [s.id for s in slices if s.priority == LOW]
    fewest = next(k for k in range(1, len(lows) + 1)
                  if any(fits_plainly(request, gpus, without(slices, c))
                         for c in itertools.combinations(lows, k)))
    assert len(p.evict) == fewest


# --- per-vGPU amounts (Request.vgpus) -------------------------------------------------------

def claim(*asks: tuple[int, int, str], priority: Priority = NORMAL) -> Request:
    return Request("claim", 0, 0, count=len(asks), priority=priority,
                   vgpus=tuple(VGpuAsk(m, c, d) for m, c, d in asks))


@pytest.mark.parametrize(("gpus", "slices", "request_", "policy", "expected"), [
    pytest.param(gpus_of(16 * GI, 16 * GI), [], claim((4 * GI, 10, "1"), (GI, 10, "0")),
                 "binpack", [(1, 4 * GI), (0, GI)], id="pins-in-ask-order"),
    # Largest first: 8Gi only fits GPU 1, so the 2Gi ask must not take it.
    pytest.param(gpus_of(16 * GI, 16 * GI), [slice_on("a", (0, 12 * GI, 10))],
                 claim((2 * GI, 10, ""), (8 * GI, 10, "")), "binpack",
                 [(0, 2 * GI), (1, 8 * GI)], id="largest-first"),
    # Binpack likes the fuller GPU 0 for the 4Gi ask, but the 50% ask fits only there:
    # the matching check sends the 4Gi ask to GPU 1 instead of failing the request.
    pytest.param(gpus_of(16 * GI, 16 * GI),
                 [slice_on("a", (0, 11 * GI, 2)), slice_on("b", (1, GI, 60))],
                 claim((4 * GI, 10, ""), (2 * GI, 50, "")), "binpack",
                 [(1, 4 * GI), (0, 2 * GI)], id="matching-keeps-room"),
    pytest.param(gpus_of(16 * GI, 16 * GI, 16 * GI), [slice_on("a", (2, 8 * GI, 10))],
                 claim((4 * GI, 10, "0"), (GI, 10, "")), "binpack",
                 [(0, 4 * GI), (2, GI)], id="unpinned-avoids-pinned-gpu"),
])
def test_per_vgpu_table(gpus, slices, request_, policy, expected):
    p = place(request_, gpus, slices, policy=policy, allow_preemption=False)
    assert [(g.gpu_index, g.memory) for g in p.grants] == expected
    assert [g.compute for g in p.grants] == [a.compute for a in request_.vgpus]


def test_per_vgpu_pinned_gpu_without_room_says_which_and_what_is_free():
    gpus = gpus_of(16 * GI, 16 * GI)
    with pytest.raises(NoCapacityError) as info:
        place(claim((GI, 10, ""), (6 * GI, 30, "GPU-0001")), gpus,
              [slice_on("a", (1, 12 * GI, 80))], policy="binpack", allow_preemption=False)
    assert str(info.value) == ("vgpus[1]: GPU 1 has no room for 6Gi memory and 30% compute: "
                               "4Gi memory and 20% compute are free on it")


def test_per_vgpu_preemption_evicts_only_what_is_needed():
    gpus = gpus_of(16 * GI, 16 * GI)
    slices = [slice_on("l0", (0, 10 * GI, 10), priority=LOW),
              slice_on("l1", (1, 10 * GI, 10), priority=LOW)]
    p = place(claim((8 * GI, 10, "1"), (GI, 10, ""), priority=HIGH), gpus, slices,
              policy="binpack", allow_preemption=True)
    assert p.evict == ("l1",)
    assert [(g.gpu_index, g.memory) for g in p.grants] == [(1, 8 * GI), (0, GI)]


@st.composite
def claims(draw, gpus):
    n = draw(st.integers(1, len(gpus)))
    pins = draw(st.permutations(gpus))
    asks = []
    for i in range(n):
        device = ""
        if draw(st.integers(0, 2)) == 0:
            g = pins[i]
            device = str(g.index) if draw(st.booleans()) else g.uuid
        asks.append(VGpuAsk(draw(st.sampled_from(MEMORIES)), draw(st.sampled_from(COMPUTES)),
                            device))
    return Request("x", 0, 0, count=n, priority=draw(st.sampled_from(list(Priority))),
                   vgpus=tuple(asks))


def claim_fits_plainly(request, gpus, slices) -> bool:
    """Brute force over every assignment of the asks to distinct GPUs."""
    used = total_used(gpus, slices)
    for perm in itertools.permutations(gpus, len(request.vgpus)):
        if all((not a.device or resolve_pin([a.device], gpus)[0] == g)
               and g.memory - used[g.index][0] >= a.memory
               and 100 - used[g.index][1] >= a.compute
               for a, g in zip(request.vgpus, perm, strict=True)):
            return True
    return False


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_per_vgpu_sequences_never_overcommit_and_honour_pins(data):
    gpus = data.draw(inventories(), label="gpus")
    policy = data.draw(st.sampled_from(POLICIES), label="policy")
    allow = data.draw(st.booleans(), label="allow_preemption")
    slices: list[Slice] = []
    for step in range(data.draw(st.integers(1, 20), label="steps")):
        if slices and data.draw(st.integers(0, 3)) == 0:
            gone = data.draw(st.sampled_from(slices))
            before = free_capacity(gpus, slices)
            slices = without(slices, [gone.id])
            after = free_capacity(gpus, slices)
            for g in gone.grants:  # release restores capacity exactly
                before[g.gpu_index] = Capacity(before[g.gpu_index].memory + g.memory,
                                               before[g.gpu_index].compute + g.compute)
            assert after == before
            continue
        if data.draw(st.booleans()):
            request = data.draw(claims(gpus))
            fits = claim_fits_plainly
        else:
            request = data.draw(requests(gpus))
            fits = fits_plainly
        try:
            p = place(request, gpus, slices, policy=policy, allow_preemption=allow)
        except NoCapacityError:
            assert not fits(request, gpus, slices)
            if request.priority == HIGH and allow:
                lows = [s.id for s in slices if s.priority == LOW]
                assert not fits(request, gpus, without(slices, lows))
            continue
        shuffled = place(request, random.Random(step).sample(gpus, len(gpus)),
                         random.Random(step).sample(slices, len(slices)),
                         policy=policy, allow_preemption=allow)
        assert shuffled == p
        if request.vgpus:
            assert len(p.grants) == len(request.vgpus)
            assert len({g.gpu_uuid for g in p.grants}) == len(p.grants)  # distinct GPUs
            for a, g in zip(request.vgpus, p.grants, strict=True):
                assert (g.memory, g.compute) == (a.memory, a.compute)
                if a.device:  # pins honoured
                    assert resolve_pin([a.device], gpus)[0].uuid == g.gpu_uuid
        else:
            check_grants(request, gpus, p)
        if p.evict:
            assert request.priority == HIGH and allow
            assert not fits(request, gpus, slices)
            assert fits(request, gpus, without(slices, p.evict))
        else:
            assert fits(request, gpus, slices)
        kept = without(slices, p.evict)
        slices = [*kept, Slice(f"s{step}", f"o{step}", p.grants, priority=request.priority,
                               created_ms=step)]
        assert_not_overcommitted(gpus, slices)
