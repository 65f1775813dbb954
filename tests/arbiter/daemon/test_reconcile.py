# SPDX-License-Identifier: Apache-2.0
"""arbiter.daemon.reconcile: dead owners' slices are released, drift is flagged or killed."""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from arbiter.daemon.events import EventLog
from arbiter.daemon.reconcile import Reconciler, runtime_state_exists
from arbiter.files.slice_dirs import Regions
from arbiter.model import Gpu, OwnerKind, Request
from arbiter.slices.arbiter import Arbiter
from arbiter.slices.inventory import DeviceSample
from arbiter.slices.store import Store

MiB = 1 << 20
GPUS = [Gpu(0, "GPU-0", "sim", 1 << 34, 0)]


@pytest.fixture
def arbiter(tmp_path):
    store = Store(tmp_path / "state")
    a = Arbiter(gpus=GPUS, store=store, regions=Regions(tmp_path / "run"),
                events=EventLog(None))
    a.start()
    yield a
    store.close()


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def kinds(a: Arbiter, kind: str) -> list[dict]:
    return [e for e in a.events.recent() if e["kind"] == kind]  # type: ignore[attr-defined]


@pytest.mark.parametrize("layout", [
    "runc/{id}", "containerd/k8s.io/{id}", "docker/moby/{id}",
], ids=["runc", "containerd-namespace", "docker-moby"])
def test_runtime_state_is_found_at_depth_one_or_two(tmp_path, layout):
    roots = [tmp_path / "runc", tmp_path / "containerd", tmp_path / "docker"]
    for r in roots:
        r.mkdir()
    (tmp_path / layout.format(id="abc")).mkdir(parents=True)
    assert runtime_state_exists("abc", roots)
    assert not runtime_state_exists("abd", roots)
    assert not runtime_state_exists("..", roots)
    assert not runtime_state_exists("", roots)
    assert not runtime_state_exists("abc", [tmp_path / "missing"])


def test_process_owner_released_when_its_pid_dies(arbiter, sleeper):
    alive = sleeper()
    keep = arbiter.allocate(Request(owner="p1", memory=MiB, compute=10,
                                    owner_kind=OwnerKind.PROCESS, owner_pid=alive.pid)).slice
    gone = arbiter.allocate(Request(owner="p2", memory=MiB, compute=10,
                                    owner_kind=OwnerKind.PROCESS, owner_pid=dead_pid())).slice
    rec = Reconciler(arbiter)
    report = rec.run_once()
    assert report.released == [gone.id]
    assert [s.id for s in arbiter.slices()] == [keep.id]
    assert not arbiter.regions.exists(gone.id)
    (ev,) = kinds(arbiter, "reconcile.release")
    assert (ev["slice"], ev["reason"]) == (gone.id, "owner_gone")
    assert rec.run_once().released == []


def test_a_reused_pid_is_not_the_owner(arbiter, sleeper):
    p = sleeper()
    s = arbiter.allocate(Request(owner="p", memory=MiB, compute=10,
                                 owner_kind=OwnerKind.PROCESS, owner_pid=p.pid)).slice
    assert arbiter.owner_start_time(s.id) > 0
    # As if the pid had been reused by a process started at another time.
    arbiter._slices[s.id] = dataclasses.replace(s, owner_start=1)
    assert Reconciler(arbiter).run_once().released == [s.id]


def test_started_container_is_judged_by_its_init_not_runtime_state(arbiter, sleeper, tmp_path):
    root = tmp_path / "runc"
    root.mkdir()
    init = sleeper()
    with_pid = arbiter.allocate(Request(owner="c-pid", memory=MiB, compute=10,
                                        owner_pid=init.pid)).slice
    no_pid = arbiter.allocate(Request(owner="c-nopid", memory=MiB, compute=10)).slice
    (root / "c-nopid").mkdir()
    (root / "c-pid").mkdir()
    rec = Reconciler(arbiter, runtime_state_roots=[root], pending_grace_s=0)
    assert rec.run_once().released == []
    init.kill()
    init.wait()
    # Started: its init is gone (and it has no cgroup of its own): runtime state or not.
    assert rec.run_once().released == [with_pid.id]
    # Not started yet (no init recorded): the runtime's state keeps it, past the grace.
    assert rec.run_once().released == []
    (root / "c-nopid").rmdir()
    assert rec.run_once().released == [no_pid.id]
    assert arbiter.slices() == []


def sample_with(pid_usage: dict[int, int]):
    return lambda: {0: DeviceSample(index=0, used=sum(pid_usage.values()), total=1 << 34,
                                    utilization=0, processes=pid_usage)}


@pytest.mark.parametrize("action", ["flag", "kill"])
def test_drift_is_flagged_or_killed(arbiter, sleeper, action):
    p = sleeper()
    s = arbiter.allocate(Request(owner="p", memory=16 * MiB, compute=10,
                                 owner_kind=OwnerKind.PROCESS, owner_pid=p.pid)).slice
    killed: list[tuple[int, int]] = []
    rec = Reconciler(arbiter, drift_action=action, sample=sample_with({p.pid: 64 * MiB}),
                     kill=lambda pid, sig: killed.append((pid, sig)))
    report = rec.run_once()
    assert report.drift == [(s.id, 0, 64 * MiB, 16 * MiB)]
    (ev,) = kinds(arbiter, "reconcile.drift")
    assert (ev["slice"], ev["used"], ev["limit"], ev["pids"]) == (s.id, 64 * MiB, 16 * MiB,
                                                                   [p.pid])
    if action == "kill":
        assert killed == [(p.pid, signal.SIGKILL)]
        assert [e["pids"] for e in kinds(arbiter, "reconcile.kill")] == [[p.pid]]
    else:
        assert killed == [] and kinds(arbiter, "reconcile.kill") == []


def test_usage_within_the_limit_or_of_other_processes_is_no_drift(arbiter, sleeper):
    p = sleeper()
    other = sleeper()
    arbiter.allocate(Request(owner="p", memory=16 * MiB, compute=10,
                             owner_kind=OwnerKind.PROCESS, owner_pid=p.pid))
    rec = Reconciler(arbiter, drift_action="kill",
                     sample=sample_with({p.pid: 16 * MiB, other.pid: 1 << 30}),
                     kill=lambda pid, sig: pytest.fail("killed"))
    assert rec.run_once().drift == []


def test_container_drift_counts_its_pid_namespace(arbiter, tmp_path):
    # A fake /proc: the container's init (pid 100) and a helper (101) share a pid
    # namespace; 200 is a host process; "self" is vgpud's namespace.
    proc = tmp_path / "proc"
    for pid, ns in (("self", "pid:[1]"), ("100", "pid:[9]"), ("101", "pid:[9]"),
                    ("200", "pid:[1]")):
        (proc / pid / "ns").mkdir(parents=True)
        os.symlink(ns, proc / pid / "ns" / "pid")
    s = arbiter.allocate(Request(owner="ctr", memory=16 * MiB, compute=10,
                                 owner_pid=100)).slice
    rec = Reconciler(arbiter, proc=proc, runtime_state_roots=[],
                     sample=sample_with({101: 20 * MiB, 200: 1 << 30}))
    rec.owner_alive = lambda sl: True  # type: ignore[method-assign]
    assert rec.run_once().drift == [(s.id, 0, 20 * MiB, 16 * MiB)]


def test_thread_runs_passes_and_stops(arbiter):
    gone = arbiter.allocate(Request(owner="p", memory=MiB, compute=10,
                                    owner_kind=OwnerKind.PROCESS, owner_pid=dead_pid())).slice
    rec = Reconciler(arbiter, interval_s=0.05)
    rec.start()
    try:
        deadline = time.monotonic() + 10
        while arbiter.slices() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert arbiter.slices() == []
        rec.configure(drift_action="kill", interval_s=3600)
        assert rec.drift_action == "kill"
    finally:
        rec.stop()
    assert not rec._thread.is_alive()  # type: ignore[union-attr]
    assert Path(arbiter.regions.root).exists() and not arbiter.regions.exists(gone.id)


def test_a_pass_never_takes_a_slice_allocated_meanwhile_for_a_stray(arbiter, sleeper):
    """The pass repairs the scheduling files against the slices as they are under the
    arbiter's lock: a slice allocated between a snapshot and the pass's look at the
    directory had its .req and .conf deleted as strays (no broker would ever serve it)."""
    from arbiter.files.sched_files import slice_file_keys, slice_key_of

    owner = sleeper()
    rec = Reconciler(arbiter)
    stop = threading.Event()

    def passes() -> None:
        while not stop.is_set():
            rec.run_once()

    t = threading.Thread(target=passes)
    t.start()
    made = []
    try:
        for n in range(300):   # 40 at a time (2 % each), the oldest released
            made.append(arbiter.allocate(Request(
                owner=f"p{n}", memory=MiB, compute=2, owner_kind=OwnerKind.PROCESS,
                owner_pid=owner.pid)).slice)
            if len(made) > 40:
                arbiter.release(made.pop(0).id)
            # Its files are there once allocate returns, whatever a pass did meanwhile.
            assert slice_key_of(made[-1].id, 0) in slice_file_keys(arbiter.regions.sched_root)
    finally:
        stop.set()
        t.join()
    live = {slice_key_of(s.id, 0) for s in arbiter.slices()}
    assert live == {slice_key_of(s.id, 0) for s in made}
    assert slice_file_keys(arbiter.regions.sched_root) == live


def test_an_allocate_during_a_repair_waits_for_one_slice_not_the_pass(arbiter, sleeper):
    """The pass checks each slice's scheduling files under the arbiter's lock on their own
    and lets the lock go between two: an Allocate that comes while the first is checked
    takes the lock before the pass ends. (Held for the whole pass, it waited for every
    slice's check: 6.4 ms with 50 slices under load, every pass.)"""
    owner = sleeper()
    for n in range(30):
        arbiter.allocate(Request(owner=f"p{n}", memory=MiB, compute=2,
                                 owner_kind=OwnerKind.PROCESS, owner_pid=owner.pid))
    checked: list[str] = []      # the slices the pass checked, in order
    locked_after: list[int] = []  # how many it had checked when the Allocate took the lock
    repair, create = arbiter.regions.repair_slice_sched, arbiter.regions.create
    late = threading.Thread(target=lambda: arbiter.allocate(Request(
        owner="late", memory=MiB, compute=2, owner_kind=OwnerKind.PROCESS,
        owner_pid=owner.pid)))

    def repair_one(s):
        if not checked:
            late.start()
            time.sleep(0.05)  # it comes to the lock this check holds, and waits there
        repair(s)
        checked.append(s.id)

    def create_one(s):
        locked_after.append(len(checked))
        return create(s)

    arbiter.regions.repair_slice_sched = repair_one
    arbiter.regions.create = create_one
    arbiter.repair_sched()
    late.join(timeout=10)
    assert not late.is_alive() and len(checked) == 30
    assert locked_after[0] < len(checked), locked_after
    assert any(s.owner == "late" for s in arbiter.slices())
