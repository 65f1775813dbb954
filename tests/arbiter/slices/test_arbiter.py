# SPDX-License-Identifier: Apache-2.0
"""arbiter.slices.arbiter.Arbiter with its real parts: SQLite in tmp_path, region files,
events, metrics."""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import threading

import pytest
from prometheus_client import CollectorRegistry

from arbiter.daemon.events import EventLog
from arbiter.daemon.metrics import Metrics
from arbiter.errors import (
    BadPinError,
    CountError,
    NoCapacityError,
    NotFoundError,
    QuantityError,
    RegionError,
    RequestError,
)
from arbiter.files.region_file import VgpuUsage, open_region
from arbiter.files.slice_dirs import Regions
from arbiter.model import Gpu, OwnerKind, Priority, Request
from arbiter.slices.arbiter import Arbiter, Settings
from arbiter.slices.inventory import DeviceSample
from arbiter.slices.store import Store

GiB = 1 << 30
GPUS = [Gpu(0, "GPU-0", "sim", 16 * GiB, 0, ("/dev/null",)),
        Gpu(1, "GPU-1", "sim", 16 * GiB, 1, ("/dev/null",))]


class Parts:
    def __init__(self, tmp_path, **settings):
        self.tmp = tmp_path
        self.killed: list[tuple[int, int]] = []
        self.registry = CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.events = EventLog(tmp_path / "events.jsonl")
        self.settings = Settings(**settings)
        self.store: Store | None = None

    def arbiter(self, sample=None) -> Arbiter:
        if self.store is not None:
            self.store.close()
        self.store = Store(self.tmp / "state")
        a = Arbiter(gpus=GPUS, store=self.store, regions=Regions(self.tmp / "run"),
                    events=self.events, settings=self.settings, metrics=self.metrics,
                    sample=sample, kill=lambda pid, sig: self.killed.append((pid, sig)))
        a.start()
        return a

    def value(self, name, **labels) -> float:
        v = self.registry.get_sample_value(name, labels)
        return 0.0 if v is None else v

    def kinds(self) -> list[str]:
        return [e["kind"] for e in self.events.recent()]


@pytest.fixture
def parts(tmp_path) -> Parts:
    return Parts(tmp_path)


def req(owner="c1", memory=GiB, compute=10, **kw) -> Request:
    return Request(owner=owner, memory=memory, compute=compute, **kw)


def test_allocate_places_stores_and_makes_regions(parts):
    a = parts.arbiter()
    r = a.allocate(req(count=2, compute=40))
    assert not r.existing and r.evicted == ()
    s = r.slice
    assert [(g.gpu_index, g.memory, g.compute) for g in s.grants] == [(0, GiB, 40), (1, GiB, 40)]
    assert parts.store.get(s.id) == s
    for i in range(2):
        with open_region(a.regions.region_path(s.id, i)) as region:
            assert (region.memory_limit, region.compute_share) == (GiB, 40)
    assert parts.kinds() == ["start", "allocate"]
    assert parts.value("vgpu_allocations_total", outcome="ok") == 1


def test_allocate_is_idempotent_also_under_concurrency(parts):
    a = parts.arbiter()
    ids: list[str] = []
    threads = [threading.Thread(target=lambda: ids.append(a.allocate(req("same")).slice.id))
               for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1
    assert len(parts.store.slices()) == 1
    assert a.allocate(req("same", memory=2 * GiB)).existing
    assert parts.value("vgpu_allocations_total", outcome="existing") == 16


@pytest.mark.parametrize("request_, error, match", [
    (req(owner=""), RequestError, "owner '' is empty"),
    (req(owner="a b"), RequestError, "printable characters without spaces"),
    (req(owner="x" * 300), RequestError, "1..256"),
    (req(memory=0), RequestError, "memory 0 must be a positive number of bytes"),
    (req(compute=1), RequestError, "compute 1 must be a percent from 2 to 100"),
    (req(compute=101), RequestError, "compute 101"),
    (req(count=0), RequestError, "count 0 must be at least 1"),
    (req(owner_kind="vm"), RequestError, "owner_kind 'vm'"),
    (req(devices=("",)), RequestError, "devices"),
    (req(count=3), CountError, "3 vGPUs need 3 distinct GPUs but this host has 2"),
    (req(devices=("5",)), BadPinError, "GPU 5 does not exist"),
    (req(memory=17 * GiB), NoCapacityError, "no GPU has room for 17Gi memory"),
], ids=["empty-owner", "space-owner", "long-owner", "zero-memory", "compute-1", "compute-101",
        "count-0", "owner-kind", "empty-pin", "count-3", "bad-pin", "too-big"])
def test_bad_requests_are_refused_and_change_nothing(parts, request_, error, match):
    a = parts.arbiter()
    with pytest.raises(error, match=match):
        a.allocate(request_)
    assert a.slices() == [] and parts.store.slices() == []
    assert list(a.regions.root.iterdir()) == []


def test_release_by_id_or_owner_is_idempotent(parts):
    a = parts.arbiter()
    s1 = a.allocate(req("a")).slice
    s2 = a.allocate(req("b")).slice
    assert a.release(s1.id) == s1
    assert a.release(s1.id) is None
    assert a.release(owner="b") == s2
    assert a.release(s2.id, owner="someone-else") is None
    assert a.slices() == [] and parts.store.slices() == []
    assert not a.regions.exists(s1.id)
    assert parts.value("vgpu_releases_total", reason="release") == 2
    with pytest.raises(RequestError, match="give a slice id or an owner"):
        a.release()


class SlowFinish(Regions):
    """Regions whose finish() (a release's unmounts) waits until the test says go."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.entered, self.go = threading.Event(), threading.Event()

    def finish(self, r):
        self.entered.set()
        assert self.go.wait(30)
        return super().finish(r)


def test_a_release_unmounts_its_files_outside_the_lock(parts):
    """Unmounting waits on the kernel's mount locks and an RCU grace period: an allocation
    and a listing go on meanwhile, and the release returns once the files are gone."""
    regions = SlowFinish(parts.tmp / "run")
    parts.store = Store(parts.tmp / "state")
    a = Arbiter(gpus=GPUS, store=parts.store, regions=regions, events=parts.events,
                settings=parts.settings, metrics=parts.metrics)
    a.start()
    s = a.allocate(req("a")).slice
    released: list[object] = []
    t = threading.Thread(target=lambda: released.append(a.release(s.id)))
    t.start()
    assert regions.entered.wait(30)
    got: list[object] = []
    other = threading.Thread(target=lambda: got.append(a.allocate(req("b")).slice))
    other.start()
    other.join(30)
    assert got and [x.owner for x in a.slices()] == ["b"]  # not behind the release
    assert not regions.exists(s.id) and released == []    # gone for others already
    regions.go.set()
    t.join(30)
    assert released == [s] and not regions.slice_dir(s.id).exists()


class FailingCreate(Regions):
    """Regions whose files cannot be made (a full run dir, a refused mount)."""

    def create(self, s):
        raise RegionError(self.slice_dir(s.id), "create", "No space left on device")


def test_slice_files_that_cannot_be_made_leave_nothing_stored(parts):
    """The insert is queued before the files are made (the writer commits it meanwhile):
    when they cannot be, a delete queued after it leaves the store as it was."""
    parts.store = Store(parts.tmp / "state")
    a = Arbiter(gpus=GPUS, store=parts.store, regions=FailingCreate(parts.tmp / "run"),
                events=parts.events, settings=parts.settings, metrics=parts.metrics)
    a.start()
    with pytest.raises(RegionError, match="No space left on device"):
        a.allocate(req("a"))
    parts.store.flush()
    assert a.slices() == [] and parts.store.slices() == []
    a.regions = Regions(parts.tmp / "run")
    assert a.allocate(req("a")).slice.owner == "a"  # the owner is free again


def test_get_and_not_found(parts):
    a = parts.arbiter()
    s = a.allocate(req("a")).slice
    assert a.get(s.id) == s == a.get(owner="a")
    with pytest.raises(NotFoundError, match="failed to get slice: no slice with id 'zz'"):
        a.get("zz")
    with pytest.raises(NotFoundError, match="for owner 'b'"):
        a.get(owner="b")


def test_update_rewrites_store_and_regions(parts):
    a = parts.arbiter()
    s = a.allocate(req("a", count=2)).slice
    new = a.update(s.id, memory=2 * GiB)
    assert [(g.memory, g.compute) for g in new.grants] == [(2 * GiB, 10)] * 2
    new = a.update(s.id, compute=30)
    assert [(g.memory, g.compute) for g in new.grants] == [(2 * GiB, 30)] * 2
    assert parts.store.get(s.id) == new == a.get(s.id)
    with open_region(a.regions.region_path(s.id, 1)) as region:
        assert (region.memory_limit, region.compute_share) == (2 * GiB, 30)
    assert a.update(s.id) == new  # nothing to change
    a.allocate(req("b", memory=10 * GiB, devices=("0",)))
    with pytest.raises(NoCapacityError, match="GPU 0 has no room"):
        a.update(s.id, memory=7 * GiB)
    with pytest.raises(RequestError):
        a.update(s.id, compute=1)
    with pytest.raises(NotFoundError):
        a.update("nosuch", memory=GiB)
    assert a.get(s.id) == new


def test_preemption_off_refuses_on_evicts_and_kills(tmp_path):
    off = Parts(tmp_path)
    a = off.arbiter()
    low = a.allocate(req("low", memory=12 * GiB, devices=("0",), priority=Priority.LOW)).slice
    a.allocate(req("other", memory=12 * GiB, devices=("1",)))
    with pytest.raises(NoCapacityError, match="preemption is disabled"):
        a.allocate(req("hi", memory=8 * GiB, priority=Priority.HIGH))
    assert off.value("vgpu_allocations_total", outcome="no_capacity") == 1

    a.reload(Settings(allow_preemption=True))
    with pytest.raises(NoCapacityError):  # normal requests never evict
        a.allocate(req("normal", memory=8 * GiB))
    r = a.allocate(req("hi", memory=8 * GiB, priority=Priority.HIGH))
    assert r.evicted == (low.id,)
    assert [g.gpu_index for g in r.slice.grants] == [0]
    assert {s.owner for s in off.store.slices()} == {"other", "hi"}
    assert not a.regions.exists(low.id)
    evict = [e for e in off.events.recent() if e["kind"] == "evict"]
    assert [(e["slice"], e["by"]) for e in evict] == [(low.id, r.slice.id)]
    assert off.value("vgpu_evictions_total") == 1
    assert off.value("vgpu_allocations_total", outcome="evicted") == 1


def test_evicted_slice_processes_are_killed_and_only_they(parts):
    parts.settings = Settings(allow_preemption=True)
    a = parts.arbiter()
    owner = subprocess.Popen(["sleep", "30"])          # the evicted slice's own process
    neighbour = subprocess.Popen(["sleep", "30"])      # someone else's
    try:
        low = a.allocate(req(f"pid:{owner.pid}", memory=16 * GiB, devices=("0",),
                             priority=Priority.LOW, owner_kind=OwnerKind.PROCESS,
                             owner_pid=owner.pid)).slice
        a.allocate(req("x", memory=16 * GiB, devices=("1",)))
        # Its tenant names the neighbour in its usage file, as a forged libvgpu slot would.
        usage = a.regions.region_path(low.id, 0).with_name("vgpu0.usage")
        with open(usage, "r+b") as f:
            f.seek(VgpuUsage.slots.offset)
            f.write(struct.pack("I", neighbour.pid))
            f.seek(VgpuUsage.slot_high_water.offset)
            f.write(struct.pack("I", 1))
        assert a.regions.pids(low) == {0: {neighbour.pid}}  # the tenant's word
        a.allocate(req("hi", memory=GiB, priority=Priority.HIGH))
        assert parts.killed == [(owner.pid, signal.SIGKILL)]
    finally:
        for p in (owner, neighbour):
            p.kill()
            p.wait()


def test_start_repairs_regions_from_the_store(parts):
    a = parts.arbiter()
    s = a.allocate(req("a")).slice
    a.regions.remove(s.id)                                 # crash after commit
    (a.regions.root / "0123456789ab").mkdir()               # crash before commit
    b = parts.arbiter()
    assert b.slices() == [s]
    assert b.regions.exists(s.id)
    assert not (b.regions.root / "0123456789ab").exists()
    start = [e for e in parts.events.recent() if e["kind"] == "start"][-1]
    assert (start["regions_made"], start["regions_removed"]) == ([s.id], ["0123456789ab"])


def test_failed_commit_leaves_no_region(parts, monkeypatch):
    a = parts.arbiter()

    def boom(db, new, evicted):
        raise OSError("disk on fire")

    # The write both the batched and the synchronous commit run.
    monkeypatch.setattr(parts.store, "_write_allocation", boom)
    with pytest.raises(OSError):
        a.allocate(req("a"))
    assert list(a.regions.root.iterdir()) == [] and a.slices() == []
    assert parts.value("vgpu_allocations_total", outcome="error") == 1


def test_devices_and_health(parts):
    samples = {0: DeviceSample(index=0, used=3 * GiB, total=16 * GiB, utilization=40),
               1: DeviceSample(index=1, used=0, total=16 * GiB, utilization=None)}
    a = parts.arbiter(sample=lambda gpus: samples)
    a.allocate(req("a", memory=2 * GiB, compute=30, count=2))
    a.allocate(req("b", memory=GiB, compute=5, devices=("0",)))
    views = a.devices()
    assert [(d.gpu.index, d.memory_allocated, d.compute_allocated, d.slices, d.memory_used,
             d.utilization) for d in views] == [(0, 3 * GiB, 35, 2, 3 * GiB, 40),
                                                 (1, 2 * GiB, 30, 1, 0, 0)]
    h = a.health()
    assert (h.status, h.devices, h.slices) == ("ok", 2, 2) and h.uptime_seconds >= 0


def test_a_failing_sampler_does_not_fail_devices(parts):
    def broken(gpus):
        raise RuntimeError("NVML went away")

    a = parts.arbiter(sample=broken)
    assert [d.memory_used for d in a.devices()] == [0, 0]


def test_owner_kind_and_pid_are_kept(parts):
    a = parts.arbiter()
    s = a.allocate(req("pid:1", owner_kind=OwnerKind.PROCESS, owner_pid=os.getpid())).slice
    assert (s.owner_kind, s.owner_pid) == ("process", os.getpid())
    assert a.owner_start_time(s.id) > 0


def test_quantities_checked_by_placement_on_update(parts):
    a = parts.arbiter()
    s = a.allocate(req("a")).slice
    with pytest.raises((QuantityError, RequestError)):
        a.update(s.id, memory=-1)
