# SPDX-License-Identifier: Apache-2.0
"""Slices of owner kind "claim" (a DRA ResourceClaim): no container holds them, only an
explicit release frees them, containers that use them are recorded as users."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import grpc
import pytest
from support.vgpud_harness import Vgpud, pb

from arbiter.daemon.events import EventLog
from arbiter.daemon.reconcile import Reconciler
from arbiter.errors import NotFoundError, RequestError
from arbiter.files.slice_dirs import Regions
from arbiter.model import Gpu, OwnerKind, Request, User, VGpuAsk
from arbiter.slices.arbiter import Arbiter
from arbiter.slices.attribution import SlicePids
from arbiter.slices.store import Store

GiB = 1 << 30
MiB = 1 << 20


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# --- through a real vgpud ---------------------------------------------------------------------

@pytest.fixture
def vgpud(tmp_path, simgpu_env):
    v = Vgpud(tmp_path, simgpu_env, devices="16Gi,16Gi")
    yield v.start()
    v.close()


def claim(v: Vgpud, uid: str, **kw) -> pb.Slice:
    return v.stub.Allocate(pb.AllocateRequest(
        owner=uid, owner_kind="claim", vgpus=[pb.VGpuRequest(memory_bytes=GiB)], **kw),
        timeout=10).slice


def test_claim_slice_survives_reconcile_and_restart_without_a_container(vgpud):
    s = claim(vgpud, "claim-uid-1", owner_pid=os.getpid())  # the plugin's pid: not a holder
    assert (s.owner_kind, s.owner_pid, s.owner_cgroup) == ("claim", 0, "")
    gone = vgpud.stub.Allocate(pb.AllocateRequest(owner="ctr", memory_bytes=GiB,
                                                  owner_pid=dead_pid()), timeout=10).slice
    vgpud.stop()
    vgpud.start()  # the start pass: the dead container's slice goes, the claim's stays
    assert [x.id for x in vgpud.stub.List(pb.ListRequest()).slices] == [s.id]
    assert [e["slice"] for e in vgpud.events("reconcile.release")] == [gone.id]
    # The plugin asks again (restarted, another pid): the same slice.
    again = vgpud.stub.Allocate(pb.AllocateRequest(
        owner="claim-uid-1", owner_kind="claim", owner_pid=1,
        vgpus=[pb.VGpuRequest(memory_bytes=GiB)]), timeout=10)
    assert again.existing and again.slice.id == s.id


def test_container_release_keeps_a_claim_slice_and_operator_release_frees_it(vgpud):
    s = claim(vgpud, "claim-uid-2")
    # A container's poststop or rollback names itself: the claim's slice is kept.
    for kw in (dict(owner_pid=os.getpid()), dict(bundle="/run/x/bundle"),
               dict(owner_pid=dead_pid(), bundle="/run/x/bundle")):
        r = vgpud.stub.Release(pb.ReleaseRequest(id=s.id, **kw), timeout=10)
        assert (r.released, r.id) == (False, s.id)
        assert "only its plugin or an operator releases it" in r.kept, r.kept
        assert "\n" not in r.kept
    assert vgpud.stub.Get(pb.GetRequest(id=s.id)).id == s.id
    assert len(vgpud.events("release.refused")) == 3
    # A container's Attach to it is refused.
    with pytest.raises(grpc.RpcError) as info:
        vgpud.stub.Attach(pb.AttachRequest(id=s.id, owner="claim-uid-2",
                                           owner_pid=os.getpid()), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is the slice of claim 'claim-uid-2'" in info.value.details()
    # A container whose id is the claim's owner cannot take it either.
    with pytest.raises(grpc.RpcError) as info:
        vgpud.stub.Allocate(pb.AllocateRequest(owner="claim-uid-2", memory_bytes=GiB,
                                               owner_pid=os.getpid()), timeout=10)
    assert info.value.code() == grpc.StatusCode.ABORTED
    assert info.value.details().startswith("claim 'claim-uid-2' is in use")
    # The plugin (or an operator) releases by owner, without a container's identity.
    r = vgpud.stub.Release(pb.ReleaseRequest(owner="claim-uid-2"), timeout=10)
    assert (r.released, r.id) == (True, s.id)
    assert vgpud.stub.List(pb.ListRequest()).slices == []
    assert not (vgpud.run_dir / "slices" / s.id).exists()
    assert [e["slice"] for e in vgpud.events("release")] == [s.id]


def test_devices_report_the_driver_and_cuda_versions(tmp_path, simgpu_env):
    env = dict(simgpu_env, SIMGPU_DRIVER_VERSION="575.51.03")
    v = Vgpud(tmp_path, env, devices="16Gi,16Gi").start()
    try:
        devices = v.stub.Devices(pb.DevicesRequest(), timeout=10).devices
        assert [(d.driver_version, d.cuda_version) for d in devices] == [
            ("575.51.03", "13.0")] * 2
    finally:
        v.close()


def test_devices_default_simgpu_driver_version(vgpud):
    devices = vgpud.stub.Devices(pb.DevicesRequest(), timeout=10).devices
    assert {(d.driver_version, d.cuda_version) for d in devices} == {("580.95.05", "13.0")}


# --- users, in process (the lifecycle op calls add_user inside vgpud) -------------------------

GPUS = [Gpu(0, "GPU-0", "sim", 16 * GiB, 0), Gpu(1, "GPU-1", "sim", 16 * GiB, 1)]


@pytest.fixture
def arbiter(tmp_path):
    store = Store(tmp_path / "state")
    a = Arbiter(gpus=GPUS, store=store, regions=Regions(tmp_path / "run"),
                events=EventLog(None))
    a.start()
    yield a
    store.close()


def claim_request(uid: str) -> Request:
    return Request(owner=uid, memory=0, compute=0, count=2, owner_kind=OwnerKind.CLAIM,
                   vgpus=(VGpuAsk(4 * GiB, 20, "1"), VGpuAsk(GiB, 10, "0")))


def test_users_are_attributed_and_dropped_when_gone(arbiter, sleeper, tmp_path):
    s = arbiter.allocate(claim_request("claim-3")).slice
    a, b = sleeper(), sleeper()
    assert arbiter.add_user(s.id, a.pid, "/run/c/a").id == s.id
    arbiter.add_user(s.id, b.pid, "/run/c/b")
    arbiter.add_user(s.id, b.pid, "/run/c/b")  # idempotent
    users = arbiter.users_of(s.id)
    assert [(u.pid, u.bundle) for u in users] == [(a.pid, "/run/c/a"), (b.pid, "/run/c/b")]
    assert all(u.start > 0 for u in users)  # read from /proc by vgpud
    # The guards attribute the users' processes to the claim's slice.
    assert SlicePids(arbiter.regions.pids, users=arbiter.users_of).host(
        arbiter.get(s.id)) >= {a.pid, b.pid}

    b.kill()
    b.wait()
    report = Reconciler(arbiter).run_once()
    assert report.users_dropped == [(s.id, b.pid)] and report.released == []
    assert [u.pid for u in arbiter.users_of(s.id)] == [a.pid]
    assert b.pid not in SlicePids(arbiter.regions.pids, users=arbiter.users_of).host(
        arbiter.get(s.id))
    assert [e["pid"] for e in arbiter.events.recent() if e["kind"] == "user.drop"] == [b.pid]

    # Durable: a vgpud restarted on the same state knows the live user.
    again = Arbiter(gpus=GPUS, store=arbiter.store, regions=Regions(tmp_path / "run"),
                    events=EventLog(None))
    again.start()
    assert again.users_of(s.id) == (User(s.id, a.pid, users[0].start, users[0].cgroup,
                                         "/run/c/a"),)
    # Released (its plugin): the users go with it.
    assert again.release(s.id) is not None
    assert again.users_of(s.id) == () and arbiter.store.users() == []


def test_add_user_refusals(arbiter, sleeper):
    p = sleeper()
    ctr = arbiter.allocate(Request(owner="ctr", memory=MiB, compute=10,
                                   owner_pid=os.getpid())).slice
    with pytest.raises(RequestError, match=r"is the slice of container 'ctr', not a claim's"):
        arbiter.add_user(ctr.id, p.pid)
    with pytest.raises(NotFoundError):
        arbiter.add_user("nosuch", p.pid)
    s = arbiter.allocate(claim_request("claim-4")).slice
    with pytest.raises(RequestError, match=r"pid 0 must be the container's init pid"):
        arbiter.add_user(s.id, 0)
    assert arbiter.users_of(s.id) == () and arbiter.store.users() == []


def test_health_names_the_libvgpu_and_hook_that_containers_get(vgpud):
    from arbiter.install.versions import own_install

    paths = vgpud.stub.Health(pb.HealthRequest(), timeout=10).paths
    own = own_install(Path(paths["lib_dir"]))  # what vgpud/ hands the lifecycle ops
    assert (paths["libvgpu"], paths["hook"]) == (str(own.libvgpu),
                                                 str(own.program("vgpu-hook")))
    assert Path(paths["libvgpu"]).is_file()
    assert os.access(paths["hook"], os.X_OK)
