# SPDX-License-Identifier: Apache-2.0
"""arbiter.slices.identity and the Arbiter's use of it: who holds a slice, whether it lives,
who may take or release it (same container id twice, a missed poststop)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from arbiter.daemon.events import EventLog
from arbiter.files.slice_dirs import Regions
from arbiter.model import Gpu, OwnerKind, Request
from arbiter.proc import proc_start_time
from arbiter.slices.arbiter import Arbiter, HeldError
from arbiter.slices.identity import Cgroups, Holder, Liveness, read_cgroup
from arbiter.slices.store import Store

MiB = 1 << 20
GPUS = [Gpu(0, "GPU-0", "sim", 1 << 34, 0)]


# --- the cgroup a container is known by -------------------------------------------------------

def fake_proc(tmp: Path, cgroups: dict[str, str], mountinfo: str = "") -> Path:
    """A /proc with <pid>/cgroup files (pid "self" is vgpud) and self/mountinfo."""
    proc = tmp / "proc"
    for pid, text in cgroups.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cgroup").write_text(text)
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    return proc


HYBRID_SELF = "9:name=systemd:/\n8:pids:/\n4:memory:/vgpud\n0::/\n"


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("0::/kubepods/pod1/c1\n", ":/kubepods/pod1/c1", id="v2"),
    pytest.param("9:name=systemd:/c1\n8:pids:/c1\n4:memory:/vgpud/c1\n0::/\n", "pids:/c1",
                 id="v1-pids-first"),
    pytest.param("4:memory:/c1\n1:cpu,cpuacct:/c1\n", "memory:/c1", id="v1-memory"),
    pytest.param("1:cpu,cpuacct:/c1\n", "cpu,cpuacct:/c1", id="v1-any"),
    pytest.param("8:pids:/\n4:memory:/vgpud\n0::/\n", "", id="vgpud-own-cgroups"),
    pytest.param("8:pids:/../other\n", "", id="outside-our-namespace"),
    pytest.param("", "", id="unreadable"),
])
def test_read_cgroup_picks_the_containers_own(tmp_path, text, expected):
    proc = fake_proc(tmp_path, {"self": HYBRID_SELF, "42": text})
    assert read_cgroup(42, proc) == expected


def test_a_cgroup_that_holds_vgpud_is_never_recorded(tmp_path):
    # A runtime without cgroups leaves the init in its caller's cgroup (here vgpud's
    # parent): "any process left in it" would keep the slice forever.
    proc = fake_proc(tmp_path, {"self": "0::/system.slice/vgpud\n",
                                "42": "0::/system.slice\n"})
    assert read_cgroup(42, proc) == ""


def test_populated_v2_and_v1(tmp_path):
    v2, v1 = tmp_path / "cg2", tmp_path / "cg1"
    (v2 / "c1").mkdir(parents=True)
    (v2 / "c1" / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    (v2 / "c2").mkdir()
    (v2 / "c2" / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    (v1 / "c1" / "nested").mkdir(parents=True)
    (v1 / "c1" / "cgroup.procs").write_text("")
    (v1 / "c1" / "nested" / "cgroup.procs").write_text("77\n")
    (v1 / "c2").mkdir()
    (v1 / "c2" / "cgroup.procs").write_text("")
    mountinfo = (f"30 25 0:26 / {v2} rw - cgroup2 cgroup2 rw\n"
                 f"31 25 0:27 / {v1} rw - cgroup cgroup rw,pids\n")
    cg = Cgroups(fake_proc(tmp_path, {}, mountinfo))
    assert cg.directory(":/c1") == v2 / "c1"
    assert cg.directory("pids:/c1") == v1 / "c1"
    assert cg.directory("memory:/c1") is None       # no such mount: no signal
    assert cg.populated(":/c1") and not cg.populated(":/c2")
    assert cg.populated("pids:/c1")                 # a process in a nested cgroup
    assert not cg.populated("pids:/c2")
    assert not cg.populated("pids:/gone")           # removed with its container


# --- liveness ---------------------------------------------------------------------------------

def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_liveness_rule(tmp_path, sleeper):
    from arbiter.model import Slice

    cg = tmp_path / "cg2"
    (cg / "full").mkdir(parents=True)
    (cg / "full" / "cgroup.events").write_text("populated 1\n")
    (cg / "empty").mkdir()
    (cg / "empty" / "cgroup.events").write_text("populated 0\n")
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(f"30 25 0:26 / {cg} rw - cgroup2 cgroup2 rw\n")
    # Pids are looked up in the real /proc through a link: the fixture only adds mounts.
    p = sleeper()
    (proc / str(p.pid)).symlink_to(f"/proc/{p.pid}")
    now = [1000.0]
    roots = tmp_path / "runc"
    roots.mkdir()
    live = Liveness(proc, runtime_state_roots=[roots], pending_grace_s=60, clock=lambda: now[0])
    start = proc_start_time(p.pid)

    def s(**kw: object) -> Slice:
        fields: dict[str, object] = {"id": "s", "owner": "c1", "grants": (),
                                     "created_ms": 1_000_000, **kw}
        return Slice(**fields)  # type: ignore[arg-type]

    gone = dead_pid()
    assert live.alive(s(owner_pid=p.pid, owner_start=start))
    assert not live.alive(s(owner_pid=p.pid, owner_start=start + 1))   # pid reused
    assert not live.alive(s(owner_pid=gone, owner_start=1, owner_cgroup=":/empty"))
    assert live.alive(s(owner_pid=gone, owner_start=1, owner_cgroup=":/full"))  # a child left
    assert not live.alive(s(owner_pid=gone, owner_start=1, owner_cgroup=":/full",
                            owner_kind=OwnerKind.PROCESS))
    # Runtime state never keeps a started container...
    (roots / "c1").mkdir()
    assert not live.alive(s(owner_pid=gone, owner_start=1))
    # ...only one allocated at create and not started yet; where no runtime state was
    # ever seen (another runtime or root), for a grace period.
    now[0] += 30
    assert live.alive(s(id="s2", owner="c2"))
    now[0] += 31
    assert not live.alive(s(id="s2", owner="c2"))
    assert live.alive(s())
    (roots / "c1").rmdir()
    assert not live.alive(s())       # the runtime deleted it: gone
    now[0] -= 60
    assert not live.alive(s())       # even within the grace period


# --- the Arbiter: who may take and release a slice ---------------------------------------------

@pytest.fixture
def parts(tmp_path):
    class Parts:
        store: Store | None = None

        def arbiter(self) -> Arbiter:
            if self.store is not None:
                self.store.close()
            self.store = Store(tmp_path / "state")
            a = Arbiter(gpus=GPUS, store=self.store, regions=Regions(tmp_path / "run"),
                        events=EventLog(None))
            a.start()
            return a

    p = Parts()
    yield p
    if p.store is not None:
        p.store.close()


def req(owner: str, pid: int = 0, bundle: str = "", **kw: object) -> Request:
    return Request(owner=owner, memory=MiB, compute=10, owner_pid=pid, bundle=bundle,
                   **kw)  # type: ignore[arg-type]


def events(a: Arbiter, kind: str) -> list[dict]:
    return [e for e in a.events.recent() if e["kind"] == kind]  # type: ignore[attr-defined]


def test_allocate_by_another_live_container_is_refused_with_one_line(parts, sleeper):
    a = parts.arbiter()
    first, second = sleeper(), sleeper()
    s = a.allocate(req("c1", first.pid, "/b1")).slice
    assert (s.owner_pid, s.owner_start, s.owner_bundle) == (
        first.pid, proc_start_time(first.pid), "/b1")
    assert a.allocate(req("c1", first.pid, "/b1")).existing          # its own retry
    for pid, bundle in ((second.pid, "/b2"), (0, "/b2"), (0, "/b1"), (second.pid, "/b1")):
        with pytest.raises(HeldError) as info:
            a.allocate(req("c1", pid, bundle))
        line = str(info.value)
        assert "\n" not in line
        assert line.startswith(f"container id 'c1' is in use: slice {s.id}: a running "
                               f"container (init pid {first.pid}, bundle /b1) holds it")
    assert [x.id for x in a.slices()] == [s.id]
    assert len(events(a, "allocate.refused")) == 4


def test_a_slice_whose_container_is_gone_is_replaced(parts):
    a = parts.arbiter()
    old = a.allocate(req("c1", dead_pid(), "/b1")).slice
    new = a.allocate(req("c1", 0, "/b1"))          # a restart after a missed poststop
    assert not new.existing and new.slice.id != old.id
    assert [x.id for x in a.slices()] == [new.slice.id]


def test_create_then_attach_binds_the_init_durably(parts, sleeper):
    a = parts.arbiter()
    s = a.allocate(req("c1", 0, "/b1")).slice          # vgpu-runtime create: no init yet
    assert a.allocate(req("c1", 0, "/b1")).existing     # create retried
    with pytest.raises(HeldError, match="being created"):
        a.allocate(req("c1", 0, "/b2"))                 # another bundle while it is made
    init = sleeper()
    bound = a.attach(s.id, "c1", init.pid, "/b1")
    assert (bound.owner_pid, bound.owner_start) == (init.pid, proc_start_time(init.pid))
    assert a.attach(s.id, "c1", init.pid, "/b1") == bound   # prestart run twice
    other = sleeper()
    with pytest.raises(HeldError):
        a.attach(s.id, "c1", other.pid, "/b2")
    with pytest.raises(HeldError):
        a.allocate(req("c1", other.pid, "/b2"))
    # The binding is in the store: a restarted vgpud knows the init.
    b = parts.arbiter()
    [again] = b.slices()
    assert (again.id, again.owner_pid, again.owner_start, again.owner_bundle) == (
        s.id, init.pid, bound.owner_start, "/b1")


def test_attach_names_the_slice_its_spec_names(parts, sleeper):
    # The runtime's bundle and the state's may be spelt differently: the slice id in the
    # container's own spec identifies the slice before its start.
    a = parts.arbiter()
    s = a.allocate(req("c1", 0, "/run/x/../b1")).slice
    assert s.owner_bundle == "/run/b1"
    init = sleeper()
    bound = a.attach(s.id, "c1", init.pid, "/run/b1/.")
    assert (bound.owner_pid, bound.owner_bundle) == (init.pid, "/run/b1")


def test_attach_to_a_slice_that_is_not_the_owners_is_not_found(parts, sleeper):
    from arbiter.errors import NotFoundError

    a = parts.arbiter()
    s = a.allocate(req("c1", 0, "/b1")).slice
    a.allocate(req("c2", 0, "/b2"))
    with pytest.raises(NotFoundError):
        a.attach(s.id, "c2", sleeper().pid, "/b2")


def test_release_checks_who_asks(parts, sleeper):
    a = parts.arbiter()
    holder, other = sleeper(), sleeper()
    s = a.allocate(req("c1", holder.pid, "/b1")).slice
    # The second container's poststop or rollback: kept, whatever it names.
    for pid, bundle in ((0, "/b2"), (other.pid, "/b2"), (0, "/b1")):
        with pytest.raises(HeldError, match="its container still runs"):
            a.release(owner="c1", pid=pid, bundle=bundle, asker=True)
    assert [x.id for x in a.slices()] == [s.id]
    assert len(events(a, "release.refused")) == 3
    # The holder's own rollback (its init waits in prestart) releases.
    assert a.release(owner="c1", pid=holder.pid, bundle="/b1", asker=True) is not None
    # Once the holder is gone, its poststop (no pid in a stopped state) releases.
    s = a.allocate(req("c1", holder.pid, "/b1")).slice
    holder.kill()
    holder.wait()
    assert a.release(owner="c1", bundle="/b1", asker=True) == s
    # An operator's release asks no questions.
    a.allocate(req("c2", other.pid, "/b3"))
    assert a.release(owner="c2") is not None


def test_release_before_start_needs_the_same_bundle(parts):
    a = parts.arbiter()
    s = a.allocate(req("c1", 0, "/b1")).slice
    with pytest.raises(HeldError, match="allocated for bundle /b1, not /b2"):
        a.release(owner="c1", bundle="/b2", asker=True)
    assert a.release(owner="c1", bundle="/b1", asker=True) == s


def test_process_slices_are_judged_by_pid_and_start_time(parts, sleeper):
    a = parts.arbiter()
    p = sleeper()
    s = a.allocate(req("run-1", p.pid, owner_kind=OwnerKind.PROCESS)).slice
    assert s.owner_cgroup == ""                    # a host process's cgroup is not its own
    with pytest.raises(HeldError):
        a.allocate(req("run-1", sleeper().pid, owner_kind=OwnerKind.PROCESS))
    assert Holder.of(s).is_process(Holder(p.pid, s.owner_start))
    assert not Holder.of(s).is_process(Holder(p.pid, s.owner_start + 1))


# --- the API, over a real socket ----------------------------------------------------------------

def test_attach_allocate_and_release_over_grpc(tmp_path, simgpu_env, sleeper):
    """Attach, Allocate and Release as gRPC clients send them: the holder is recorded and
    another container with the same id is refused, on every call."""
    import grpc
    from support.vgpud_harness import Vgpud, pb

    v = Vgpud(tmp_path, simgpu_env).start()
    try:
        made = v.stub.Allocate(pb.AllocateRequest(owner="c1", memory_bytes=MiB,
                                                  bundle="/b1"), timeout=10).slice
        assert (made.owner_pid, made.owner_bundle) == (0, "/b1")
        init, other = sleeper(), sleeper()
        view = v.stub.Attach(pb.AttachRequest(id=made.id, owner="c1", owner_pid=init.pid,
                                              bundle="/b1"), timeout=10)
        assert view.id == made.id
        got = v.stub.Get(pb.GetRequest(id=made.id), timeout=10)
        assert (got.owner_pid, got.owner_start) == (init.pid, proc_start_time(init.pid))
        with pytest.raises(grpc.RpcError) as info:
            v.stub.Allocate(pb.AllocateRequest(owner="c1", memory_bytes=MiB,
                                               owner_pid=other.pid, bundle="/b2"), timeout=10)
        assert info.value.code() == grpc.StatusCode.ABORTED
        assert info.value.details().startswith("container id 'c1' is in use")
        # The second container's poststop: kept, and said why.
        resp = v.stub.Release(pb.ReleaseRequest(owner="c1", bundle="/b2"), timeout=10)
        assert (resp.released, resp.id) == (False, made.id)
        assert "its container still runs" in resp.kept
        assert not v.stub.Release(pb.ReleaseRequest(owner="c1", bundle="/b2"),
                                  timeout=10).released
        # The holder's own rollback releases.
        assert v.stub.Release(pb.ReleaseRequest(owner="c1", owner_pid=init.pid, bundle="/b1"),
                              timeout=10).released
        assert [e["kind"] for e in v.events() if e["kind"].endswith(".refused")] == [
            "allocate.refused", "release.refused", "release.refused"]
    finally:
        v.close()
