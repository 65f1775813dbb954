# SPDX-License-Identifier: Apache-2.0
"""Attribution that cannot be forged: a slice's processes are what the host says (owner,
descendants, its container's pid namespace), never pids its tenant wrote in its slots.

The attack: a tenant writes a neighbour's host pid in its own usage slot (pid_ns set to the
host's, start time 0: "any"), so that the neighbour's NVML memory counts as its own; with a
guard or drift check that kills, vgpud would SIGKILL the neighbour. Real processes and real
signals throughout; the end-to-end test forges the slot in a real vgpud's usage file.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import ROOT, TEST_BIN
from support.vgpud_harness import Vgpud

from arbiter.compute.freezer import find_root
from arbiter.compute.guardian import Guardian
from arbiter.daemon.events import EventLog
from arbiter.daemon.reconcile import Reconciler
from arbiter.files import region_file
from arbiter.files.slice_dirs import Regions
from arbiter.model import Gpu, Grant, OwnerKind, Request, Slice
from arbiter.proc import pid_namespace_inode, proc_start_time, visible_pid
from arbiter.slices.arbiter import Arbiter
from arbiter.slices.attribution import SlicePids, container_cgroup
from arbiter.slices.inventory import DeviceSample
from arbiter.slices.store import Store

MiB = 1 << 20
GiB = 1 << 30
GPUS = [Gpu(0, "GPU-0", "sim", 16 * GiB, 0)]
PROBE = str(TEST_BIN / "vgpu_probe")


@pytest.fixture
def arbiter(tmp_path: Path) -> Iterator[Arbiter]:
    store = Store(tmp_path / "state")
    a = Arbiter(gpus=GPUS, store=store, regions=Regions(tmp_path / "run"), events=EventLog(None))
    a.start()
    yield a
    store.close()


@pytest.fixture
def procs() -> Iterator:
    made: list[subprocess.Popen[bytes]] = []

    def make(*cmd: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(list(cmd or ("sleep", "60")))
        made.append(p)
        return p

    yield make
    for p in made:
        p.kill()
        p.wait()


def kinds(a: Arbiter, kind: str) -> list[dict]:
    return [e for e in a.events.recent() if e["kind"] == kind]  # type: ignore[attr-defined]


def forge(a: Arbiter, monkeypatch: pytest.MonkeyPatch, victim: int) -> None:
    """Every slice's slots name victim, as a tenant that rewrote its usage file would."""
    monkeypatch.setattr(a.regions, "pids", lambda s: {i: {victim} for i in range(len(s.grants))})


def one_gpu(pid_bytes: dict[int, int]):
    return lambda: {0: DeviceSample(index=0, used=sum(pid_bytes.values()), total=16 * GiB,
                                    utilization=0, processes=pid_bytes)}


def test_forged_slots_reach_the_untrusted_view_but_not_the_hosts(arbiter, procs, monkeypatch):
    tenant, neighbour = procs(), procs()
    s = arbiter.allocate(Request(owner="t", memory=16 * MiB, compute=10,
                                 owner_kind=OwnerKind.PROCESS, owner_pid=tenant.pid)).slice
    forge(arbiter, monkeypatch, neighbour.pid)
    owners = SlicePids(arbiter.regions.pids)
    assert neighbour.pid in owners.of(s)[0]          # what a tenant writes reaches of()...
    assert owners.host(s) == {tenant.pid}            # ...never host(), which acts


def test_drift_kill_spares_a_neighbour_named_in_forged_slots(arbiter, procs, monkeypatch):
    tenant, neighbour = procs(), procs()
    arbiter.allocate(Request(owner="t", memory=16 * MiB, compute=10,
                             owner_kind=OwnerKind.PROCESS, owner_pid=tenant.pid))
    forge(arbiter, monkeypatch, neighbour.pid)
    rec = Reconciler(arbiter, drift_action="kill", sample=one_gpu({neighbour.pid: GiB}))
    report = rec.run_once()
    assert report.drift == [] and report.killed == []
    time.sleep(0.2)
    assert neighbour.poll() is None and tenant.poll() is None
    assert kinds(arbiter, "reconcile.kill") == []


def test_memory_guard_kill_spares_a_neighbour_named_in_forged_slots(arbiter, procs, monkeypatch):
    tenant, neighbour = procs(), procs()
    arbiter.allocate(Request(owner="t", memory=16 * MiB, compute=10,
                             owner_kind=OwnerKind.PROCESS, owner_pid=tenant.pid))
    forge(arbiter, monkeypatch, neighbour.pid)
    g = Guardian(arbiter, lambda: {0: {neighbour.pid: 100}},
                 memory=lambda: {0: {neighbour.pid: GiB}},
                 action="kill", memory_action="kill", memory_margin=0)
    for _ in range(3):
        found = g.tick()
        assert found.compute == [] and found.memory == []
    time.sleep(0.2)
    assert neighbour.poll() is None and tenant.poll() is None


def test_a_containers_processes_are_its_pid_namespace(arbiter, procs):
    """A container owner in a pid namespace of its own: its processes there count, the
    host's do not (needs root for the namespace)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a pid namespace needs root and unshare(1)")
    holder = procs("unshare", "--pid", "--fork", "--kill-child", "sh", "-c",
                   "sleep 60 & sleep 60 & wait")
    neighbour = procs()
    children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children")
    inside: list[int] = []
    deadline = time.monotonic() + 10
    while len(inside) < 3 and time.monotonic() < deadline:  # the forked sh and its sleeps
        kids = [int(c) for c in children.read_text().split()]
        ns = pid_namespace_inode(kids[0]) if kids else 0
        if ns and ns != pid_namespace_inode("self"):
            inside = sorted(int(p) for p in os.listdir("/proc")
                            if p.isdigit() and pid_namespace_inode(p) == ns)
        time.sleep(0.05)
    if len(inside) < 3:
        pytest.skip("unshare --pid did not make a pid namespace here")
    init = kids[0]
    s = arbiter.allocate(Request(owner="ctr", memory=16 * MiB, compute=10,
                                 owner_pid=init)).slice
    assert SlicePids(arbiter.regions.pids).host(s) == set(inside)
    sleeper = max(inside)
    rec = Reconciler(arbiter, drift_action="kill",
                     sample=one_gpu({sleeper: GiB, neighbour.pid: GiB}))
    rec.owner_alive = lambda sl: True  # type: ignore[method-assign]
    report = rec.run_once()
    assert report.killed == [sleeper]
    assert neighbour.poll() is None


CID = "0123456789abcdef"


@pytest.mark.parametrize(("cgroup", "expected"), [
    pytest.param(f":/system.slice/docker-{CID}.scope", f":/system.slice/docker-{CID}.scope",
                 id="docker-systemd"),
    pytest.param(f":/docker/{CID}", f":/docker/{CID}", id="docker-cgroupfs"),
    pytest.param(f":/kubepods.slice/kubepods-pod1.slice/cri-containerd-{CID}.scope",
                 f":/kubepods.slice/kubepods-pod1.slice/cri-containerd-{CID}.scope",
                 id="containerd-systemd"),
    pytest.param(f":/machine.slice/libpod-{CID}.scope/container",
                 f":/machine.slice/libpod-{CID}.scope", id="podman-nested-init"),
    pytest.param(f"pids:/{CID}", f"pids:/{CID}", id="v1-runc"),
    pytest.param(":/user.slice/user-1000.slice/session-3.scope", "",
                 id="callers-session-not-the-containers"),
    pytest.param(f":/x/{CID}-other", "", id="id-inside-another-name"),
    pytest.param("", "", id="none-recorded"),
    pytest.param(f"/{CID}", "", id="malformed"),
])
def test_container_cgroup_is_the_one_named_after_it(cgroup: str, expected: str) -> None:
    s = Slice("s1", CID, (Grant(0, "GPU-0", MiB, 10),), owner_cgroup=cgroup)
    assert container_cgroup(s) == expected
    assert container_cgroup(dataclasses.replace(s, owner_kind=OwnerKind.PROCESS)) == ""


def test_a_reused_owner_pid_is_not_the_owner(procs) -> None:
    """The owner died and its pid went to a neighbour: the start time tells them apart."""
    neighbour = procs()
    child = procs("sh", "-c", "sleep 60")
    s = Slice("s1", "p", (Grant(0, "GPU-0", MiB, 10),), owner_kind=OwnerKind.PROCESS,
              owner_pid=neighbour.pid, owner_start=proc_start_time(neighbour.pid) + 1)
    assert SlicePids(lambda _s: {}).host(s) == set()
    same = dataclasses.replace(s, owner_start=proc_start_time(neighbour.pid))
    assert SlicePids(lambda _s: {}).host(same) == {neighbour.pid}
    assert child.pid not in SlicePids(lambda _s: {}).host(same)


def test_pid_1_and_vgpuds_ancestors_are_never_a_slices() -> None:
    s = Slice("s1", "p", (Grant(0, "GPU-0", MiB, 10),), owner_kind=OwnerKind.PROCESS,
              owner_pid=1)
    assert SlicePids(lambda _s: {}).host(s) == set()          # not the whole host
    s = dataclasses.replace(s, owner_pid=os.getppid())
    assert os.getpid() not in SlicePids(lambda _s: {}).host(s)
    assert os.getppid() not in SlicePids(lambda _s: {}).host(s)


@pytest.fixture
def cgroup_v2() -> Path:
    """The cgroup v2 root, where this test may make groups (root only)."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    root = find_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy under /sys/fs/cgroup")
    return root


def test_a_containers_cgroup_counts_even_without_its_init(cgroup_v2, procs):
    """A --pid=host container whose init is gone: what its runtime's cgroup holds is its;
    a cgroup that does not name it is not used."""
    root = cgroup_v2
    mine, other = root / f"vgpu-test-{CID}.scope", root / "vgpu-test-other.scope"
    try:
        for d in (mine, other):
            d.mkdir()
        inside, stranger = procs(), procs()
        (mine / "cgroup.procs").write_text(str(inside.pid))
        (other / "cgroup.procs").write_text(str(stranger.pid))
        gone = subprocess.Popen(["true"])
        gone.wait()
        s = Slice("s1", CID, (Grant(0, "GPU-0", MiB, 10),), owner_pid=gone.pid,
                  owner_cgroup=f":/{mine.name}")
        assert SlicePids(lambda _s: {}).host(s) == {inside.pid}
        elsewhere = dataclasses.replace(s, owner="another-id", owner_cgroup=f":/{other.name}")
        assert SlicePids(lambda _s: {}).host(elsewhere) == set()
    finally:
        for d in (mine, other):
            if d.exists():
                for pid in (d / "cgroup.procs").read_text().split():
                    (root / "cgroup.procs").write_text(pid)
                d.rmdir()


# --- a real vgpud: the slot forged in the tenant's own usage file -----------------------

FORGE = """
import os, struct, sys
from pathlib import Path
from arbiter.proc import pid_namespace_inode
from arbiter.files.region_file import VgpuUsage, VgSlot, usage_path_of
victim = int(sys.argv[1])
path = usage_path_of(Path(os.environ["VGPU_REGION_DIR"]) / "vgpu0")
slot = VgSlot(pid=victim, flags=0, start_time=0, used=0,
              pid_ns=pid_namespace_inode("self"))
fd = os.open(path, os.O_RDWR)
os.pwrite(fd, bytes(slot), VgpuUsage.slots.offset)
os.pwrite(fd, struct.pack("I", 1), VgpuUsage.slot_high_water.offset)
os.close(fd)
print("forged", path, flush=True)
sys.stdin.read()
"""


def test_forged_slot_in_a_real_vgpud_gets_no_neighbour_killed(tmp_path, simgpu_env):
    if not hasattr(region_file, "usage_path_of"):
        pytest.skip("forges a slot of the per-slice usage file (vgpu<i>.usage)")
    v = Vgpud(tmp_path, simgpu_env, {
        "reconcile": {"interval_s": 0.2, "drift_action": "kill"},
        "guard": {"action": "kill", "memory_action": "kill", "memory_margin": 0},
    }).start()
    cli = [sys.executable, "-m", "vgpu_cli", "--socket", str(v.socket), "run"]
    # The neighbour: 1 GiB through libvgpu, within its own 2 GiB slice.
    neighbour = subprocess.Popen([*cli, "--memory", "2Gi", "--", PROBE,
                                  f"alloc:mem:{GiB}", "hold"],
                                 cwd=ROOT, env=v.env, text=True, stdout=subprocess.PIPE)
    tenant = None
    try:
        assert neighbour.stdout is not None
        victim = next((json.loads(line)["pid"] for line in neighbour.stdout
                       if '"hold"' in line), None)
        assert victim is not None, f"the neighbour did not start: exit {neighbour.wait()}"
        # The tenant: a 16 MiB slice whose process writes the victim into its slot.
        tenant = subprocess.Popen([*cli, "--memory", "16Mi", "--", sys.executable, "-c",
                                   FORGE, str(victim)],
                                  cwd=ROOT, env=v.env, text=True, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
        assert tenant.stdout is not None
        line = tenant.stdout.readline()
        assert line.startswith("forged"), line
        usage = Path(line.split()[1])
        assert usage == region_file.usage_path_of(usage.with_name("vgpu0"))
        # The forgery took: vgpud's reading of the slots names the victim, alive.
        ((pid, start, _used, ns),) = region_file.read_slots(usage)
        assert (pid, start) == (victim, 0) and visible_pid(pid, start, pid_ns=ns) == victim
        time.sleep(3.0)                  # 15 reconcile passes, 6 guard ticks
        assert neighbour.poll() is None, "the neighbour was killed"
        assert tenant.poll() is None
        assert v.events("reconcile.drift") == [] and v.events("reconcile.kill") == []
        assert v.events("guard.over_memory") == [] and v.events("guard.kill") == []
    finally:
        for p in (neighbour, tenant):
            if p is not None:
                p.kill()
                p.wait(timeout=30)
        v.close()
