# SPDX-License-Identifier: Apache-2.0
"""vgpud end to end: a real daemon process on simgpu, real gRPC on a unix socket, real signals."""
from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from support.paths import LIBVGPU, ROOT, TEST_BIN
from support.vgpud_harness import Vgpud, pb

from arbiter.files.sched_files import slice_key_of
from arbiter.files.slicefs import detach

MiB = 1 << 20
GiB = 1 << 30
PROBE = str(TEST_BIN / "vgpu_probe")


@pytest.fixture
def daemons(tmp_path, simgpu_env):
    made: list[Vgpud] = []

    def make(config=None, devices="16Gi", name="d") -> Vgpud:
        d = tmp_path / name
        d.mkdir()
        v = Vgpud(d, simgpu_env, config, devices)
        made.append(v)
        return v

    yield make
    for v in made:
        v.close()


@pytest.fixture
def vgpud(daemons) -> Vgpud:
    return daemons(devices="16Gi,16Gi").start()


def alloc(v: Vgpud, owner: str, memory: int = GiB, **kw) -> pb.AllocateResponse:
    kw.setdefault("owner_pid", os.getpid())  # a live owner: the reconciler keeps it
    return v.stub.Allocate(pb.AllocateRequest(owner=owner, memory_bytes=memory, **kw), timeout=10)


def rpc_error(call, *args, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=10, **kw)
    return info.value


# ---- the API -------------------------------------------------------------------

def test_every_call_works(vgpud):
    v = vgpud
    assert stat.S_IMODE(v.socket.stat().st_mode) == 0o600
    health = v.stub.Health(pb.HealthRequest())
    assert (health.status, health.devices, health.slices) == ("ok", 2, 0)

    r = alloc(v, "c1", 2 * GiB, compute_percent=30, labels={"app": "x"})
    s = r.slice
    assert not r.existing and len(s.id) == 12
    assert (s.owner, s.owner_kind, s.priority, s.policy) == ("c1", "container", pb.NORMAL,
                                                            pb.FIXED)
    assert [(g.memory_bytes, g.compute_percent) for g in s.vgpus] == [(2 * GiB, 30)]
    assert s.vgpus[0].device_nodes == ["/dev/null"]
    assert s.region_dir == str(v.run_dir / "slices" / s.id)
    assert dict(s.labels) == {"app": "x"}
    assert sorted(p.name for p in Path(s.region_dir).iterdir()) == [  # its own tmpfs
        f"{s.vgpus[0].gpu_uuid}.{slice_key_of(s.id, 0):016x}.req", "vgpu0", "vgpu0.usage"]
    # The limits are vgpud's (read-only in a container); the usage any container uid writes.
    assert stat.S_IMODE(Path(s.vgpus[0].region_path).stat().st_mode) == 0o644
    assert stat.S_IMODE((Path(s.region_dir) / "vgpu0.usage").stat().st_mode) == 0o666

    assert v.stub.Get(pb.GetRequest(id=s.id)).owner == "c1"
    assert v.stub.Get(pb.GetRequest(owner="c1")).id == s.id
    assert [x.id for x in v.stub.List(pb.ListRequest()).slices] == [s.id]

    devices = v.stub.Devices(pb.DevicesRequest()).devices
    assert [d.index for d in devices] == [0, 1]
    assert devices[0].memory_total_bytes == 16 * GiB
    assert sum(d.memory_allocated_bytes for d in devices) == 2 * GiB
    assert sum(d.compute_allocated_percent for d in devices) == 30
    assert sum(d.slices for d in devices) == 1

    u = v.stub.Update(pb.UpdateRequest(id=s.id, memory_bytes=3 * GiB))
    assert [(g.memory_bytes, g.compute_percent) for g in u.vgpus] == [(3 * GiB, 30)]
    u = v.stub.Update(pb.UpdateRequest(id=s.id, compute_percent=50))
    assert [(g.memory_bytes, g.compute_percent) for g in u.vgpus] == [(3 * GiB, 50)]

    rel = v.stub.Release(pb.ReleaseRequest(id=s.id))
    assert (rel.released, rel.id) == (True, s.id)
    assert not Path(s.region_dir).exists()
    assert not v.stub.Release(pb.ReleaseRequest(id=s.id)).released  # idempotent
    assert v.stub.List(pb.ListRequest()).slices == []
    kinds = [e["kind"] for e in v.events()]
    assert kinds[:1] == ["start"] and kinds[1:] == ["allocate", "update", "update", "release"]
    assert v.stop() == 0
    assert not v.socket.exists()


def test_allocate_is_idempotent_per_owner(vgpud):
    first = alloc(vgpud, "c1")
    again = alloc(vgpud, "c1", 4 * GiB)  # a retried hook: the same slice, never a second
    assert again.existing and again.slice.id == first.slice.id
    results: list[str] = []

    def worker() -> None:
        results.append(alloc(vgpud, "c2").slice.id)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    assert len(vgpud.stub.List(pb.ListRequest()).slices) == 2


@pytest.mark.parametrize("kw, code, message", [
    (dict(memory_bytes=100 * GiB), grpc.StatusCode.RESOURCE_EXHAUSTED,
     "no GPU has room for 100Gi memory and 10% compute: the most free on any GPU is "
     "16Gi memory and 100% compute"),
    (dict(memory_bytes=GiB, count=2, compute_percent=60, devices=["1"]),
     grpc.StatusCode.INVALID_ARGUMENT, "vgpu.io/count: 2 vGPUs need 2 distinct GPUs"),
    (dict(memory_bytes=GiB, count=3), grpc.StatusCode.INVALID_ARGUMENT,
     "vgpu.io/count: 3 vGPUs need 3 distinct GPUs but this host has 2"),
    (dict(memory_bytes=GiB, devices=["7"]), grpc.StatusCode.INVALID_ARGUMENT,
     "vgpu.io/devices: GPU 7 does not exist (have 0-1)"),
    (dict(memory_bytes=0), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to allocate slice: memory 0 must be a positive number of bytes"),
    (dict(memory_bytes=GiB, compute_percent=1), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to allocate slice: compute 1 must be a percent from 2 to 100"),
    (dict(memory_bytes=GiB, owner=""), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to allocate slice: owner '' is empty"),
    (dict(memory_bytes=GiB, owner_kind="vm"), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to allocate slice: owner_kind 'vm' is not one of container, process"),
    (dict(memory_bytes=GiB, priority=9), grpc.StatusCode.INVALID_ARGUMENT,
     "failed to allocate slice: priority 9 is not a known priority"),
], ids=["no-capacity", "count-over-pin", "count-over-host", "bad-pin", "zero-memory",
        "compute-too-small", "no-owner", "bad-owner-kind", "bad-priority"])
def test_errors_map_to_status_and_one_clear_line(vgpud, kw, code, message):
    kw.setdefault("owner", "c1")
    e = rpc_error(vgpud.stub.Allocate, pb.AllocateRequest(**kw))
    assert e.code() == code
    assert e.details().startswith(message), e.details()
    assert "\n" not in e.details()


def test_no_capacity_names_the_most_free(vgpud):
    alloc(vgpud, "a", 12 * GiB, compute_percent=50)
    alloc(vgpud, "b", 10 * GiB, compute_percent=70)
    e = rpc_error(vgpud.stub.Allocate, pb.AllocateRequest(owner="c", memory_bytes=8 * GiB))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.details() == ("no GPU has room for 8Gi memory and 10% compute: the most free on "
                           "any GPU is 6Gi memory and 50% compute")


def test_not_found_and_bad_updates(vgpud):
    e = rpc_error(vgpud.stub.Get, pb.GetRequest(id="nosuch"))
    assert (e.code(), e.details()) == (grpc.StatusCode.NOT_FOUND,
                                       "failed to get slice: no slice with id 'nosuch'")
    e = rpc_error(vgpud.stub.Update, pb.UpdateRequest(id="nosuch", memory_bytes=GiB))
    assert e.code() == grpc.StatusCode.NOT_FOUND
    e = rpc_error(vgpud.stub.Get, pb.GetRequest())
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    s = alloc(vgpud, "c1", 8 * GiB, devices=["0"]).slice
    alloc(vgpud, "c2", 8 * GiB, devices=["0"])
    e = rpc_error(vgpud.stub.Update, pb.UpdateRequest(id=s.id, memory_bytes=9 * GiB))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "GPU 0 has no room to give slice" in e.details()
    e = rpc_error(vgpud.stub.Update, pb.UpdateRequest(id=s.id, compute_percent=101))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert vgpud.stub.Get(pb.GetRequest(id=s.id)).vgpus[0].memory_bytes == 8 * GiB


def test_multi_gpu_slices_and_pins(vgpud):
    gpus = vgpud.stub.Devices(pb.DevicesRequest()).devices
    two = alloc(vgpud, "two", 4 * GiB, count=2).slice
    assert sorted(g.gpu_index for g in two.vgpus) == [0, 1]
    assert [g.index for g in two.vgpus] == [0, 1]
    assert sorted(p.name for p in Path(two.region_dir).iterdir()
                  if not p.name.endswith(".req")) == [
        "vgpu0", "vgpu0.usage", "vgpu1", "vgpu1.usage"]
    by_uuid = alloc(vgpud, "uuid", GiB, devices=[gpus[1].uuid]).slice
    assert [g.gpu_index for g in by_uuid.vgpus] == [1]
    by_index = alloc(vgpud, "index", GiB, devices=["1", "0"], count=2).slice
    assert [g.gpu_index for g in by_index.vgpus] == [1, 0]  # pin order is vGPU order


def test_preemption_off_then_on_with_sighup(daemons):
    v = daemons(devices="16Gi").start()
    low = alloc(v, "low", 12 * GiB, priority=pb.LOW).slice
    e = rpc_error(v.stub.Allocate, pb.AllocateRequest(owner="hi", memory_bytes=8 * GiB,
                                                      priority=pb.HIGH, owner_pid=os.getpid()))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "preemption is disabled in the config" in e.details()
    # A normal request never evicts, even with preemption allowed.
    v.write_config({"placement": {"allow_preemption": True}})
    v.proc.send_signal(signal.SIGHUP)
    v.wait_for(lambda: v.events("reload"), what="reload event")
    assert "allow_preemption" in v.events("reload")[-1]["changed"]
    e = rpc_error(v.stub.Allocate, pb.AllocateRequest(owner="n", memory_bytes=8 * GiB,
                                                      owner_pid=os.getpid()))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    r = alloc(v, "hi", 8 * GiB, priority=pb.HIGH)
    assert list(r.evicted) == [low.id]
    assert not Path(low.region_dir).exists()
    assert [s.owner for s in v.stub.List(pb.ListRequest()).slices] == ["hi"]
    (ev,) = v.events("evict")
    assert (ev["slice"], ev["by"]) == (low.id, r.slice.id)
    metrics = scrape(v)
    assert "vgpu_evictions_total 1.0" in metrics


def test_bad_reload_keeps_running_config(daemons):
    v = daemons().start()
    v.config_file.write_text("placement:\n  policy: fast\n")
    v.proc.send_signal(signal.SIGHUP)
    v.wait_for(lambda: "reload refused" in v.log(), what="refused reload")
    assert "placement.policy" in v.log()
    assert alloc(v, "c1").slice.id


# ---- regions and running processes ------------------------------------------------

def test_update_reaches_a_running_process(vgpud, simgpu_env):
    s = alloc(vgpud, "c1", 256 * MiB).slice
    env = dict(simgpu_env, SIMGPU_DEVICES="16Gi,16Gi", LD_PRELOAD=str(LIBVGPU),
               VGPU_REGION_DIR=s.region_dir)
    p = subprocess.Popen([PROBE, f"alloc:mem:{32 * MiB}", "info", "sleep:1500", "info",
                          f"fill:mem:{16 * MiB}"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    lines = []
    for line in p.stdout:
        lines.append(json.loads(line))
        if lines[-1]["op"] == "info":
            used = vgpud.stub.Get(pb.GetRequest(id=s.id)).vgpus[0].memory_used_bytes
            assert used >= 32 * MiB
            vgpud.stub.Update(pb.UpdateRequest(id=s.id, memory_bytes=96 * MiB))
            break
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    lines += [json.loads(x) for x in out.splitlines()]
    before, after = [x for x in lines if x["op"] == "info"]
    assert before["total"] == 256 * MiB
    assert (after["total"], after["free"]) == (96 * MiB, 64 * MiB)
    assert [x for x in lines if x["op"] == "fill"][-1]["count"] == 4


def test_restart_reloads_state_and_repairs_regions(vgpud):
    a = alloc(vgpud, "a", count=2).slice
    b = alloc(vgpud, "b").slice
    assert vgpud.stop() == 0
    # What a crash could leave: a committed slice without its directory, a directory
    # without a slice, a half-built temporary directory, a region with stale limits.
    import shutil

    from arbiter.files.region_file import open_region
    detach(Path(a.region_dir))  # its own tmpfs: `rm -rf` could only empty it
    shutil.rmtree(a.region_dir)
    (vgpud.run_dir / "slices" / "0123456789ab").mkdir()
    (vgpud.run_dir / "slices" / ".feedfacecafe.tmp").mkdir()
    with open_region(Path(b.region_dir) / "vgpu0") as r:
        r.set_limits(memory_limit=5 * MiB)
    vgpud.start()
    slices = {s.id: s for s in vgpud.stub.List(pb.ListRequest()).slices}
    assert set(slices) == {a.id, b.id}
    assert slices[a.id].vgpus == a.vgpus
    assert sorted(p.name for p in (vgpud.run_dir / "slices").iterdir()) == sorted([a.id, b.id])
    assert sorted(p.name for p in Path(a.region_dir).iterdir()
                  if not p.name.endswith(".req")) == [
        "vgpu0", "vgpu0.usage", "vgpu1", "vgpu1.usage"]
    with open_region(Path(b.region_dir) / "vgpu0") as r:
        assert r.memory_limit == GiB
    start = vgpud.events("start")[-1]
    assert (start["regions_made"], start["regions_removed"]) == ([a.id], ["0123456789ab"])
    assert start["regions_fixed"] == [b.id]
    # The same owner still gets the same slice after the restart.
    assert alloc(vgpud, "a").slice.id == a.id


def test_kill_9_in_a_burst_loses_no_acknowledged_slice(daemons):
    v = daemons(devices="64Gi,64Gi,64Gi,64Gi").start()
    acked: dict[str, str] = {}
    requested: set[str] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def client(n: int) -> None:
        i = 0
        while not stop.is_set():
            owner = f"c{n}-{i}"
            i += 1
            with lock:
                requested.add(owner)
            try:
                r = alloc(v, owner, 64 * MiB, compute_percent=2)
            except grpc.RpcError:
                return
            with lock:
                acked[owner] = r.slice.id

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    time.sleep(random.uniform(0.3, 1.2))
    v.kill()
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert acked, "no allocation finished before the kill"
    v.start()
    stored = {s.owner: s.id for s in v.stub.List(pb.ListRequest()).slices}
    for owner, sid in acked.items():
        assert stored.get(owner) == sid, f"acknowledged slice {sid} of {owner} was lost"
    # Anything else stored was in flight at the kill (committed, reply lost): one per client.
    extra = set(stored) - set(acked)
    assert extra <= requested and len(extra) <= len(threads)
    dirs = {p.name for p in (v.run_dir / "slices").iterdir()}
    assert dirs == set(stored.values())  # every slice has its regions, nothing half made
    for sid in stored.values():
        assert (v.run_dir / "slices" / sid / "vgpu0").is_file()


# ---- reconciliation ------------------------------------------------------------

def test_reconciler_releases_a_dead_process_owner(daemons):
    v = daemons(config={"reconcile": {"interval_s": 0.2}}).start()
    owner = subprocess.Popen(["sleep", "60"])
    try:
        s = alloc(v, f"pid:{owner.pid}", owner_kind="process", owner_pid=owner.pid).slice
        keep = alloc(v, "container-1", owner_pid=0).slice
        (v.runc / "container-1").mkdir()  # the runtime still knows the container
        time.sleep(0.6)
        assert {x.id for x in v.stub.List(pb.ListRequest()).slices} == {s.id, keep.id}
    finally:
        owner.kill()
        owner.wait()
    v.wait_for(lambda: [x.id for x in v.stub.List(pb.ListRequest()).slices] == [keep.id],
               what="release of the dead owner's slice")
    # The event is written once the release is durable and its files are gone, after
    # List stops showing it.
    (ev,) = v.wait_for(lambda: v.events("reconcile.release"), what="reconcile.release event")
    assert ev["slice"] == s.id
    assert not Path(s.region_dir).exists()
    (v.runc / "container-1").rmdir()  # the container is gone
    v.wait_for(lambda: not v.stub.List(pb.ListRequest()).slices, what="container release")


def test_reconciler_at_start_releases_what_died_while_down(daemons):
    v = daemons().start()
    owner = subprocess.Popen(["sleep", "60"])
    s = alloc(v, "p", owner_kind="process", owner_pid=owner.pid).slice
    assert v.stop() == 0
    owner.kill()
    owner.wait()
    v.start()
    assert v.stub.List(pb.ListRequest()).slices == []
    assert not Path(s.region_dir).exists()


# ---- metrics, config, socket ------------------------------------------------------

def scrape(v: Vgpud) -> str:
    assert v.metrics_port, v.log()
    with urllib.request.urlopen(f"http://127.0.0.1:{v.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_metrics_serve_per_gpu_and_per_slice_series(vgpud):
    s = alloc(vgpud, "c1", 2 * GiB, compute_percent=25).slice
    text = scrape(vgpud)
    uuid = s.vgpus[0].gpu_uuid
    gpu = s.vgpus[0].gpu_index
    assert f'vgpu_gpu_memory_total_bytes{{gpu="{gpu}",uuid="{uuid}"}} 1.7179869184e+10' in text
    assert f'vgpu_gpu_memory_allocated_bytes{{gpu="{gpu}",uuid="{uuid}"}} 2.147483648e+09' in text
    for name in ("vgpu_gpu_memory_used_bytes", "vgpu_gpu_compute_allocated_percent",
                 "vgpu_gpu_compute_used_percent", "vgpu_gpu_slices",
                 "vgpu_slice_memory_used_bytes", "vgpu_slice_compute_used_percent",
                 "vgpu_slice_info", "vgpu_allocation_seconds_bucket"):
        assert name in text, name
    limit = [line for line in text.splitlines()
             if line.startswith("vgpu_slice_memory_limit_bytes{")]
    assert len(limit) == 1 and f'slice="{s.id}"' in limit[0] and 'owner="c1"' in limit[0]
    share = [line for line in text.splitlines()
             if line.startswith("vgpu_slice_compute_share_percent{")]
    assert share[0].endswith(" 25.0")
    assert 'vgpu_allocations_total{outcome="ok"} 1.0' in text


def test_slice_compute_used_counts_the_slices_own_kernels(vgpud, simgpu_env):
    """NVML's per-process utilisation of the slice's processes, and of nobody else."""
    s = alloc(vgpud, "c1", 256 * MiB, compute_percent=30).slice
    idle = alloc(vgpud, "c2", 256 * MiB, compute_percent=30).slice
    env = dict(simgpu_env, SIMGPU_DEVICES="16Gi,16Gi", LD_PRELOAD=str(LIBVGPU),
               VGPU_REGION_DIR=s.region_dir)
    # 5000 kernels of 1 ms keep the engine busy for 5 s after they are queued.
    p = subprocess.Popen([PROBE, f"alloc:mem:{MiB}", "launch:busy_1000us:5000", "hold"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if '"hold"' in line:
                break

        def used(slice_id: str) -> float:
            for line in scrape(vgpud).splitlines():
                if line.startswith("vgpu_slice_compute_used_percent{") and slice_id in line:
                    return float(line.rsplit(" ", 1)[1])
            raise AssertionError(f"no compute series for {slice_id}")

        # Queued kernels count once they run: wait for the engine to be busy a while.
        deadline = time.monotonic() + 4.0
        while used(s.id) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert 0 < used(s.id) <= 100
        assert used(idle.id) == 0
    finally:
        p.kill()
        p.wait()


def test_config_error_is_one_line_and_exit_2(daemons):
    v = daemons()
    v.config_file.write_text("placement:\n  policy: binpack\n  polcy: spread\n")
    p = subprocess.run(v.command(), env=v.env, cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "line 3" in lines[0] and "polcy" in lines[0], p.stderr
    assert not v.socket.exists()


def test_second_daemon_refused_and_stale_socket_removed(daemons, vgpud):
    p = subprocess.run(vgpud.command(), env=vgpud.env, cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1
    assert "another vgpud" in p.stderr and str(vgpud.socket) in p.stderr
    assert vgpud.stub.Health(pb.HealthRequest()).status == "ok"  # the first one still serves
    vgpud.kill()
    assert vgpud.socket.exists()  # stale after kill -9
    vgpud.start()
    assert vgpud.stub.Health(pb.HealthRequest()).status == "ok"


def test_drift_measured_by_nvml_is_killed(daemons, simgpu_env):
    v = daemons(config={"reconcile": {"interval_s": 0.2, "drift_action": "kill"}}).start()
    # A process that bypasses libvgpu (no LD_PRELOAD) and holds 64 MiB on the GPU.
    hog = subprocess.Popen([PROBE, f"alloc:mem:{64 * MiB}", "hold"], env=v.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert hog.stdout is not None
        for line in hog.stdout:
            if '"hold"' in line:
                break
        s = alloc(v, "hog", 16 * MiB, owner_kind="process", owner_pid=hog.pid).slice
        v.wait_for(lambda: v.events("reconcile.kill"), what="drift kill")
        assert hog.wait(timeout=10) == -signal.SIGKILL
    finally:
        hog.kill()
        hog.wait()
    drift = v.events("reconcile.drift")[0]
    assert (drift["slice"], drift["limit"], drift["pids"]) == (s.id, 16 * MiB, [hog.pid])
    assert drift["used"] >= 64 * MiB


def test_existing_socket_directory_keeps_its_mode(daemons, tmp_path):
    """vgpud in a shared directory (like /tmp, mode 1777) must not change its mode."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    v = daemons()
    v.socket = shared / "vgpud.sock"
    v.start()
    assert (os.stat(shared).st_mode & 0o7777) == 0o1777
    assert (os.stat(v.socket).st_mode & 0o777) == 0o600


# ---- compute scheduling: sched regions, slice keys, live compute changes ------------

def _broker_entry(path: Path, key: int, timeout: float = 5.0):
    """The broker's entry of slice `key` in a GPU's scheduling file, once it lists the slice."""
    from arbiter.files.sched_files import open_sched

    deadline = time.monotonic() + timeout
    while True:
        with open_sched(path) as sched:
            summary = sched.summary(time.monotonic_ns())
        entry = next((e for e in summary.entries if e.key == key), None)
        if entry is not None or time.monotonic() > deadline:
            return summary, entry
        time.sleep(0.01)


def test_sched_files_survive_restarts_and_the_broker_serves_them(daemons):
    from arbiter.files.region_file import open_region
    from arbiter.files.sched_files import BROKER_LOCK_NAME, conf_text

    v = daemons(devices="16Gi,16Gi", config={"reconcile": {"interval_s": 0.2}}).start()
    sched_dir = v.run_dir / "sched"
    assert v.stub.Health(pb.HealthRequest()).paths["sched_dir"] == str(sched_dir)
    uuids = [d.uuid for d in v.stub.Devices(pb.DevicesRequest()).devices]
    # (and the brokers' lock, which no container gets: arbiter.files.sched_files.BROKER_LOCK_NAME)
    assert sorted(p.name for p in sched_dir.iterdir() if p.name != BROKER_LOCK_NAME) \
        == sorted(uuids)
    assert stat.S_IMODE(sched_dir.stat().st_mode) == 0o700  # root alone: .req files inside
    for u in uuids:
        # The broker's: every slice reads it, none may write it.
        assert stat.S_IMODE((sched_dir / u).stat().st_mode) == 0o644

    s = alloc(v, "c1", GiB, compute_percent=30, devices=[uuids[0]]).slice
    key = slice_key_of(s.id, 0)
    with open_region(s.vgpus[0].region_path, writable=False) as r:
        assert r.slice_key == key  # libvgpu finds its .req by it
    req = sched_dir / f"{uuids[0]}.{key:016x}.req"
    conf = sched_dir / f"{uuids[0]}.{key:016x}.conf"
    assert stat.S_IMODE(req.stat().st_mode) == 0o666
    assert stat.S_IMODE(conf.stat().st_mode) == 0o644
    assert conf.read_text() == conf_text(30, 1, 0, 0)
    # vgpud's broker lists the slice with vgpud's settings.
    summary, entry = _broker_entry(sched_dir / uuids[0], key)
    assert entry is not None and (entry.share, entry.priority, entry.policy) == (30, 1, 0)
    assert summary.broker_pid > 0

    # A restart keeps a good file (same inode: containers have it bind-mounted) and
    # replaces a damaged one, saying so.
    inodes = {u: (sched_dir / u).stat().st_ino for u in (*uuids, req.name)}
    assert v.stop() == 0
    with (sched_dir / uuids[1]).open("r+b") as f:
        f.seek(4)
        f.write((7).to_bytes(4, "little"))  # another layout version
    v.start()
    assert (sched_dir / uuids[0]).stat().st_ino == inodes[uuids[0]]
    assert req.stat().st_ino == inodes[req.name]
    assert (sched_dir / uuids[1]).stat().st_ino != inodes[uuids[1]]
    assert f"replacing scheduling region {sched_dir / uuids[1]}: layout version 7" in v.log()
    _, entry = _broker_entry(sched_dir / uuids[0], key)
    assert entry is not None and entry.share == 30

    # Deleted files are made again by the next reconciliation pass; released slices' go.
    (sched_dir / uuids[0]).unlink()
    detach(req)  # bind-mounted from the slice's own tmpfs (arbiter.files.slicefs)
    req.unlink()
    v.wait_for(lambda: (sched_dir / uuids[0]).is_file() and req.is_file(),
               what="the deleted scheduling files made again")
    v.stub.Release(pb.ReleaseRequest(id=s.id), timeout=10)
    assert not req.exists() and not conf.exists()
    assert sorted(p.name for p in sched_dir.iterdir() if p.name != BROKER_LOCK_NAME) \
        == sorted(uuids)


def test_a_killed_broker_is_restarted(daemons):
    from arbiter.files.sched_files import open_sched

    v = daemons().start()
    (gpu,) = [p for p in (v.run_dir / "sched").iterdir() if "." not in p.name]

    def broker_pid() -> int:
        with open_sched(gpu) as sched:
            return sched.summary(time.monotonic_ns()).broker_pid

    v.wait_for(lambda: broker_pid() > 0, what="the broker serving the GPU")
    first = broker_pid()
    os.kill(first, signal.SIGKILL)
    v.wait_for(lambda: broker_pid() not in (0, first), what="a new broker")
    assert "vgpu-broker exited" in v.log()


def test_update_changes_compute_in_place_within_100ms(vgpud):
    """libvgpu reads compute_share on every admission: the file it mapped must change."""
    from arbiter.files.region_file import open_region

    s = alloc(vgpud, "c1", GiB, compute_percent=20).slice
    path = Path(s.vgpus[0].region_path)
    inode = path.stat().st_ino
    with open_region(path, writable=False) as r:  # a running process's mapping
        key, gen = r.slice_key, r.generation
        for share in (55, 2, 100):
            vgpud.stub.Update(pb.UpdateRequest(id=s.id, compute_percent=share), timeout=10)
            returned = time.monotonic()
            while r.compute_share != share and time.monotonic() - returned < 0.1:
                time.sleep(0.001)
            assert r.compute_share == share
            assert time.monotonic() - returned < 0.1
        assert r.generation == gen + 3 and r.slice_key == key
        assert r.memory_limit == GiB
    assert path.stat().st_ino == inode
    # The broker, which enforces it, has the last one within 100 ms too (20 ms rescans).
    sched = vgpud.run_dir / "sched" / s.vgpus[0].gpu_uuid
    _, entry = _broker_entry(sched, slice_key_of(s.id, 0))
    returned = time.monotonic()
    while entry is None or entry.share != 100:
        assert time.monotonic() - returned < 0.1, entry
        _, entry = _broker_entry(sched, slice_key_of(s.id, 0))


def test_priority_floor_from_config_and_sighup(daemons):
    from arbiter.files.region_file import open_region

    v = daemons(config={"defaults": {"priority_floor": 5}}).start()
    s = alloc(v, "low", GiB, priority=pb.LOW).slice
    path = Path(s.vgpus[0].region_path)
    inode = path.stat().st_ino
    with open_region(path, writable=False) as r:
        assert r.priority_floor == 5
        v.write_config({"defaults": {"priority_floor": 20}})
        v.proc.send_signal(signal.SIGHUP)
        v.wait_for(lambda: v.events("reload"), what="reload event")
        assert "priority_floor" in v.events("reload")[-1]["changed"]
        assert r.priority_floor == 20  # running processes see it: same file, in place
    assert path.stat().st_ino == inode
    t = alloc(v, "next", GiB).slice
    with open_region(t.vgpus[0].region_path, writable=False) as r:
        assert r.priority_floor == 20
    # An Update keeps the configured floor; a restart with another floor applies it.
    v.stub.Update(pb.UpdateRequest(id=s.id, compute_percent=40))
    assert v.stop() == 0
    v.write_config({"defaults": {"priority_floor": 0}})
    v.start()
    with open_region(path, writable=False) as r:
        assert (r.priority_floor, r.compute_share) == (0, 40)
    assert path.stat().st_ino == inode


def test_gpu_seconds_of_a_slice_measured_by_libvgpu(vgpud, simgpu_env):
    """End to end: a process of the slice launches 300 x 1 ms; its GPU time is counted."""
    s = alloc(vgpud, "c1", 256 * MiB, compute_percent=50).slice
    env = dict(simgpu_env, SIMGPU_DEVICES="16Gi,16Gi", LD_PRELOAD=str(LIBVGPU),
               VGPU_REGION_DIR=s.region_dir, VGPU_SCHED_DIR=str(vgpud.run_dir / "sched"))
    p = subprocess.run([PROBE, f"alloc:mem:{MiB}", "launch:busy_1000us:300"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    v = s.vgpus[0]
    # Labels in the exposition's (sorted) order; a slice outside Kubernetes names no pod.
    prefix = (f'vgpu_slice_gpu_seconds_total{{container="",gpu="{v.gpu_index}",namespace="",'
              f'owner="c1",pod="",slice="{s.id}",uuid="{v.gpu_uuid}"}} ')
    [line] = [x for x in scrape(vgpud).splitlines() if x.startswith(prefix)]
    # At least the kernels' own time; a loaded machine may stretch the hold, not shrink it.
    assert 0.29 <= float(line.removeprefix(prefix)) < 30


def _mount_point(path: Path) -> bool:
    """Whether something is mounted at path (a bind of a directory onto itself too, which
    os.path.ismount cannot tell: same device, same inode)."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return str(path) in points


def test_a_vgpud_that_stops_with_no_slice_leaves_no_mount_behind(daemons):
    """vgpud binds run_dir onto itself (shared propagation, arbiter.files.slicefs.share) where it
    can mount: at a stop with no slice left it undoes that, so the directory can go (the
    demo's temporary run dir could not be removed: EBUSY). With a slice left it stays: the
    slice's containers have their files below it."""
    if os.geteuid() != 0:
        pytest.skip("vgpud mounts only as root")
    v = daemons().start()
    assert _mount_point(v.run_dir)
    s = alloc(v, "c1", 64 << 20).slice
    v.stop()
    assert _mount_point(v.run_dir)  # a slice is left: kept
    v.start()
    v.stub.Release(pb.ReleaseRequest(id=s.id), timeout=10)
    v.stop()
    assert not _mount_point(v.run_dir)
