# SPDX-License-Identifier: Apache-2.0
"""Per-vGPU amounts (AllocateRequest.vgpus, a DRA claim) through a real vgpud on simgpu."""
from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest
from support.vgpud_harness import Vgpud, pb

from arbiter.files.region_file import open_region

GiB = 1 << 30


@pytest.fixture
def vgpud(tmp_path, simgpu_env):
    v = Vgpud(tmp_path, simgpu_env, devices="16Gi,16Gi")
    yield v.start()
    v.close()


def ask(memory: int, compute: int = 0, device: str = "") -> pb.VGpuRequest:
    return pb.VGpuRequest(memory_bytes=memory, compute_percent=compute, device=device)


def allocate(v: Vgpud, owner: str, *vgpus: pb.VGpuRequest, **kw) -> pb.AllocateResponse:
    kw.setdefault("owner_pid", os.getpid())
    return v.stub.Allocate(pb.AllocateRequest(owner=owner, vgpus=list(vgpus), **kw), timeout=10)


def test_two_asks_get_exactly_their_grants_and_region_files(vgpud):
    r = allocate(vgpud, "claim-a", ask(4 * GiB, 30, "1"), ask(GiB, 0, "0"))
    s = r.slice
    assert [(g.index, g.gpu_index, g.memory_bytes, g.compute_percent) for g in s.vgpus] == [
        (0, 1, 4 * GiB, 30), (1, 0, GiB, 10)]  # 0 = the config's default compute
    for g in s.vgpus:
        with open_region(Path(g.region_path), writable=False) as region:
            assert (region.memory_limit, region.compute_share) == (g.memory_bytes,
                                                                   g.compute_percent)
    devices = {d.index: d for d in vgpud.stub.Devices(pb.DevicesRequest()).devices}
    assert (devices[0].memory_allocated_bytes, devices[1].memory_allocated_bytes) == (
        GiB, 4 * GiB)
    # Idempotent per owner: a retry gets the same slice, whatever it asks.
    again = allocate(vgpud, "claim-a", ask(8 * GiB))
    assert again.existing and again.slice.id == s.id
    # The grants survive a restart as they were.
    vgpud.stop()
    vgpud.start()
    got = vgpud.stub.Get(pb.GetRequest(id=s.id))
    assert [(g.gpu_index, g.memory_bytes, g.compute_percent) for g in got.vgpus] == [
        (1, 4 * GiB, 30), (0, GiB, 10)]
    event = vgpud.events("allocate")[-1]
    assert event["grants"] == [{"gpu": 1, "memory": 4 * GiB, "compute": 30},
                               {"gpu": 0, "memory": GiB, "compute": 10}]


def test_unpinned_asks_go_to_distinct_gpus_where_they_fit(vgpud):
    allocate(vgpud, "big", ask(12 * GiB, device="0"))
    # 8 GiB only fits on GPU 1, so the 2 GiB ask (placed later, smaller) takes GPU 0.
    s = allocate(vgpud, "claim", ask(2 * GiB), ask(8 * GiB)).slice
    assert [(g.gpu_index, g.memory_bytes) for g in s.vgpus] == [(0, 2 * GiB), (1, 8 * GiB)]


def test_update_of_one_amount_keeps_each_vgpus_other(vgpud):
    s = allocate(vgpud, "c", ask(4 * GiB, 30), ask(GiB, 20)).slice
    u = vgpud.stub.Update(pb.UpdateRequest(id=s.id, compute_percent=40), timeout=10)
    assert [(g.memory_bytes, g.compute_percent) for g in u.vgpus] == [(4 * GiB, 40), (GiB, 40)]


@pytest.mark.parametrize(("kw", "code", "message"), [
    (dict(memory_bytes=GiB), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to allocate slice: memory_bytes 1073741824 must be unset when vgpus is set"),
    (dict(compute_percent=20), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to allocate slice: compute_percent 20 must be unset when vgpus is set"),
    (dict(count=2), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to allocate slice: count 2 must be unset when vgpus is set"),
    (dict(devices=["0"]), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to allocate slice: devices ['0'] must be unset when vgpus is set"),
    (dict(vgpus=[ask(GiB), ask(0)]), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to allocate slice: vgpus[1].memory_bytes 0 must be a positive number of bytes"),
    (dict(vgpus=[ask(GiB, 101)]), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to allocate slice: vgpus[0].compute_percent 101 must be a percent from 2 to 100"),
    (dict(vgpus=[ask(GiB), ask(GiB), ask(GiB)]), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to allocate slice: vgpus 3 vGPUs need as many distinct GPUs but this host has 2"),
    (dict(vgpus=[ask(GiB, device="1"), ask(GiB, device="1")]),
     grpc.StatusCode.INVALID_ARGUMENT, "vgpus[1].device: GPU 1 is named twice"),
    (dict(vgpus=[ask(GiB, device="7")]), grpc.StatusCode.INVALID_ARGUMENT,
     "vgpus[0].device: GPU 7 does not exist (have 0-1)"),
    (dict(vgpus=[ask(GiB), ask(20 * GiB, device="0")]), grpc.StatusCode.RESOURCE_EXHAUSTED,
     "vgpus[1]: GPU 0 has no room for 20Gi memory and 10% compute: 16Gi memory and 100% "
     "compute are free on it"),
    (dict(vgpus=[ask(10 * GiB), ask(20 * GiB)]), grpc.StatusCode.RESOURCE_EXHAUSTED,
     "no 2 distinct GPUs have room for 10Gi memory and 10% compute + 20Gi memory and 10% "
     "compute: free are GPU 0 16Gi memory and 100% compute, GPU 1 16Gi memory and 100% "
     "compute"),
], ids=["memory", "compute", "count", "devices", "zero-memory", "compute-too-big",
        "more-than-gpus", "pin-twice", "bad-pin", "pinned-full", "none-fits"])
def test_bad_requests_are_one_line_and_allocate_nothing(vgpud, kw, code, message):
    kw.setdefault("vgpus", [ask(GiB)])
    with pytest.raises(grpc.RpcError) as info:
        vgpud.stub.Allocate(pb.AllocateRequest(owner="c1", owner_pid=os.getpid(), **kw),
                            timeout=10)
    e = info.value
    assert (e.code(), "\n" in e.details()) == (code, False)
    assert e.details().startswith(message), e.details()
    assert vgpud.stub.List(pb.ListRequest()).slices == []
    slices_dir = vgpud.run_dir / "slices"
    assert not slices_dir.exists() or list(slices_dir.iterdir()) == []
    assert vgpud.events("allocate") == []
