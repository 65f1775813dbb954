# SPDX-License-Identifier: Apache-2.0
"""vgpud against its operator's mistakes: real daemon processes, real sockets, real ports.

One vgpud per state dir; a metrics address that is taken or unresolvable; a start
that fails midway; a --config / VGPU_CONFIG naming a missing file; the run dir's
modes. Each case: one line, the right exit status, no socket left behind.
"""
from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.paths import ROOT
from support.vgpud_harness import Vgpud, pb, unmount_under

from arbiter.config import DEFAULT_CONFIG_PATH
from shim.lifecycle import lifecycle_socket

GiB = 1 << 30


@pytest.fixture
def daemons(tmp_path, simgpu_env):
    made: list[Vgpud] = []

    def make(config: dict[str, Any] | None = None, name: str = "d") -> Vgpud:
        d = tmp_path / name
        d.mkdir()
        v = Vgpud(d, simgpu_env, config)
        made.append(v)
        return v

    yield make
    for v in made:
        v.close()


def run(cmd: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def sockets_under(root: Path) -> list[Path]:
    """Every unix socket file under root."""
    return [p for p in root.rglob("*") if stat.S_ISSOCK(p.lstat().st_mode)]


def tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """(mode, size, mtime) of everything under root, by relative path."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def serve_containers(v: Vgpud, owner: str) -> None:
    """A real Allocate, List and Release over gRPC."""
    r = v.stub.Allocate(pb.AllocateRequest(owner=owner, memory_bytes=GiB,
                                           owner_pid=os.getpid()), timeout=10)
    listed = v.stub.List(pb.ListRequest(), timeout=10)
    assert r.slice.id in [s.id for s in listed.slices]
    v.stub.Release(pb.ReleaseRequest(id=r.slice.id), timeout=10)


def warnings(v: Vgpud) -> list[str]:
    """vgpud's warning and error lines about its metrics endpoint."""
    return [line for line in v.log().splitlines()
            if ("WARNING" in line or "ERROR" in line) and "metrics" in line]


# ---- one vgpud per state dir ---------------------------------------------------------

def test_second_vgpud_on_the_state_dir_with_another_socket_touches_nothing(daemons, tmp_path):
    first = daemons().start()
    other = tmp_path / "other"
    other.mkdir()
    before = tree(first.state_dir)
    socks = {p: p.stat().st_ino for p in (first.socket, lifecycle_socket(first.socket))}
    cmd = [sys.executable, "-m", "vgpud", "--config", str(first.config_file),
           "--socket", str(other / "b.sock"), "--state-dir", str(first.state_dir),
           "--run-dir", str(other / "run")]
    p = run(cmd, first.env)
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1, p.stderr
    assert str(first.state_dir) in p.stderr and f"pid {first.proc.pid}" in p.stderr, p.stderr
    assert str(first.socket) in p.stderr  # where the holder serves
    assert list(other.iterdir()) == []    # no socket, no lock, no run dir
    assert tree(first.state_dir) == before  # nothing of the first one changed
    assert {p: p.stat().st_ino for p in socks} == socks
    assert first.stub.Health(pb.HealthRequest(), timeout=5).status == "ok"
    serve_containers(first, "c1")


def test_second_vgpud_with_the_same_command_leaves_the_socket_alone(daemons):
    first = daemons().start()
    inode = first.socket.stat().st_ino
    p = run(first.command(), first.env)
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert "another vgpud" in p.stderr and str(first.state_dir) in p.stderr
    assert first.socket.stat().st_ino == inode
    assert first.stub.Health(pb.HealthRequest(), timeout=5).status == "ok"


def test_the_state_dir_lock_goes_with_its_holder(daemons):
    """flock, not a pid file: a vgpud killed with SIGKILL leaves nothing that blocks the next."""
    v = daemons().start()
    v.kill()
    v.start()
    assert v.stub.Health(pb.HealthRequest(), timeout=5).status == "ok"


# ---- metrics address -------------------------------------------------------------------

def test_metrics_port_taken_serves_containers_then_metrics_when_freed(daemons):
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    address = f"127.0.0.1:{port}"
    try:
        v = daemons({"metrics": {"address": address}}).start()
        lines = warnings(v)
        assert len(lines) == 1, v.log()
        assert "metrics.address" in lines[0] and repr(address) in lines[0]
        assert "Address already in use" in lines[0] and "retrying" in lines[0]
        serve_containers(v, "c1")
        assert lifecycle_socket(v.socket).exists()
    finally:
        taken.close()
    v.wait_for(lambda: f"serving metrics on http://127.0.0.1:{port}/metrics" in v.log(),
               timeout=40, what="the metrics endpoint after the port was freed")
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        assert 'vgpu_allocations_total{outcome="ok"} 1.0' in r.read().decode()
    assert v.stop() == 0
    assert "Traceback" not in v.log()
    assert sockets_under(v.tmp) == []


def test_unresolvable_metrics_host_is_one_line_and_vgpud_serves(daemons):
    address = "no-such-host.invalid:9400"
    v = daemons({"metrics": {"address": address}}).start()
    lines = warnings(v)
    assert len(lines) == 1, v.log()
    assert "metrics.address" in lines[0] and repr(address) in lines[0]
    assert "cannot resolve host 'no-such-host.invalid'" in lines[0]
    serve_containers(v, "c1")
    assert v.stop() == 0
    assert "Traceback" not in v.log()
    assert sockets_under(v.tmp) == []


# ---- any other failed start ----------------------------------------------------------------

def test_a_start_that_fails_midway_is_one_line_and_leaves_no_socket(daemons):
    # The event log is opened after the socket's lock and the broker: a late failure.
    v = daemons({"paths": {"event_log": "/dev/null/events.jsonl"}})
    p = run([*v.command(), "--log-level", "warning"], v.env)
    assert p.returncode == 1, p.stderr
    ours = [line for line in p.stderr.splitlines() if not line.startswith("vgpu-broker:")]
    assert len(ours) == 1 and "Traceback" not in p.stderr, p.stderr
    assert ours[0].startswith("vgpud: failed to start vgpud: /dev/null: "), p.stderr
    assert sockets_under(v.tmp) == []
    v.write_config({})
    v.start()  # nothing left behind blocks the next start (locks, broker)


# ---- --config and VGPU_CONFIG ----------------------------------------------------------

@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_named_config_file_that_is_missing_is_an_error(daemons, tmp_path, how):
    v = daemons()
    missing = tmp_path / "nosuch.yaml"
    cmd = [sys.executable, "-m", "vgpud", "--socket", str(v.socket),
           "--state-dir", str(v.state_dir), "--run-dir", str(v.run_dir)]
    env = dict(v.env)
    if how == "flag":
        cmd += ["--config", str(missing)]
    else:
        env["VGPU_CONFIG"] = str(missing)
    p = run(cmd, env)
    assert p.returncode == 2
    assert p.stderr == f"vgpud: failed to load config {missing}: no such file\n"
    assert not v.state_dir.exists() and not v.run_dir.exists() and not v.socket.exists()


@pytest.mark.skipif(DEFAULT_CONFIG_PATH.exists(), reason=f"{DEFAULT_CONFIG_PATH} exists here")
def test_the_default_config_path_missing_means_defaults(daemons):
    v = daemons()
    env = {k: val for k, val in v.env.items() if k != "VGPU_CONFIG"}
    # The defaults' metrics address (127.0.0.1:9400) may be taken here: vgpud serves anyway.
    v.command = lambda: [sys.executable, "-m", "vgpud",  # type: ignore[method-assign]
                         "--socket", str(v.socket), "--state-dir", str(v.state_dir),
                         "--run-dir", str(v.run_dir)]
    v.env = env
    v.start()
    assert v.stop() == 0
    assert "failed to load config" not in v.log()


# ---- the run dir -----------------------------------------------------------------------------

def writable_by_others(run_dir: Path, skip: tuple[str, ...] = ()) -> list[Path]:
    """Files under run_dir another host user can reach by name and write."""
    found = []
    for dirpath, dirnames, filenames in os.walk(run_dir):
        here = Path(dirpath)
        # os.walk goes top-down: prune what others cannot pass through.
        dirnames[:] = [d for d in dirnames if os.lstat(here / d).st_mode & stat.S_IXOTH
                       and (here != run_dir or d not in skip)]
        for name in filenames:
            if os.lstat(here / name).st_mode & stat.S_IWOTH:
                found.append(here / name)
    return found


def test_run_dir_is_closed_to_other_users_even_from_a_0755_one_and_umask_0(daemons):
    v = daemons()
    # What an older vgpud left: everything 0755.
    (v.run_dir / "sched").mkdir(parents=True)
    os.chmod(v.run_dir, 0o755)
    os.chmod(v.run_dir / "sched", 0o755)
    command = v.command()
    v.command = lambda: ["sh", "-c", 'umask 000 && exec "$@"', "sh",  # type: ignore[method-assign]
                         *command]
    v.start()
    v.stub.Allocate(pb.AllocateRequest(owner="c1", memory_bytes=GiB, owner_pid=os.getpid()),
                    timeout=10)  # its sched files (.req) too
    mode = {p: stat.S_IMODE(os.stat(p).st_mode) for p in (v.run_dir, v.run_dir / "sched")}
    assert mode == {v.run_dir: 0o711, v.run_dir / "sched": 0o700}
    assert os.stat(v.run_dir).st_uid == os.geteuid()
    for sock in (v.socket, lifecycle_socket(v.socket)):
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600, sock
    # slices/ and the slices' own directories are Regions'
    # (tests/arbiter/files/test_slice_dirs.py).
    assert writable_by_others(v.run_dir, skip=("slices",)) == []
    lock = v.state_dir / "vgpud.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert lock.read_text() == f"{v.proc.pid}\n{v.socket}\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the run dir away")
def test_a_run_dir_owned_by_another_user_is_refused(daemons):
    v = daemons()
    v.run_dir.mkdir()
    os.chown(v.run_dir, 1000, 1000)
    p = run(v.command(), v.env)
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert f"{v.run_dir} belongs to uid 1000" in p.stderr
    assert sockets_under(v.tmp) == []


def test_sigterm_leaves_no_socket(daemons):
    v = daemons().start()
    assert sorted(sockets_under(v.tmp)) == sorted([v.socket, lifecycle_socket(v.socket)])
    v.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert v.stop() == 0
    assert sockets_under(v.tmp) == []


def test_a_storm_of_signals_never_wedges_vgpud(daemons):
    """Python runs a signal's handler in the main thread between any two bytecodes, even
    inside a `with lock:` of that thread's own. vgpud's handlers set threading.Events that
    its main loop waited on and cleared: a signal that came while the loop held one's lock
    waited for it forever, and vgpud no longer stopped (seen once in CI: SIGTERM right
    after the start, no exit in 30 s). Now they take no lock. Thousands of SIGHUPs, each a
    chance to land in such a window, then SIGTERM: vgpud reloads, answers, and exits 0."""
    v = daemons().start()
    assert v.proc is not None
    deadline = time.monotonic() + 3
    sent = 0
    while time.monotonic() < deadline:
        v.proc.send_signal(signal.SIGHUP)
        sent += 1
    assert v.stub.Health(pb.HealthRequest(), timeout=10).status == "ok"
    assert v.stop(timeout=20) == 0, f"vgpud did not stop after {sent} SIGHUPs and a SIGTERM"
    assert sockets_under(v.tmp) == []


# ---- run-dir parts deleted while vgpud runs -------------------------------------------------

def test_deleted_run_dir_parts_are_made_again_on_demand(daemons):
    """An operator (or a cleanup job) deletes run/slices and run/sched under a running
    vgpud: the next allocation works, an Update remakes its slice's files, the reconciler
    remakes the scheduling files, the broker serves them, and each is one warning event."""
    import shutil

    from arbiter.files.sched_files import open_sched

    v = daemons(config={"reconcile": {"interval_s": 0.2}}).start()
    first = v.stub.Allocate(pb.AllocateRequest(owner="c1", memory_bytes=256 << 20,
                                               owner_pid=os.getpid()), timeout=10).slice
    # The slices' own tmpfs and their .req binds: `rm -rf` could only empty them.
    unmount_under(v.run_dir / "slices")
    unmount_under(v.run_dir / "sched")
    shutil.rmtree(v.run_dir / "slices")
    shutil.rmtree(v.run_dir / "sched")
    second = v.stub.Allocate(pb.AllocateRequest(owner="c2", memory_bytes=256 << 20,
                                                owner_pid=os.getpid()), timeout=10).slice
    assert Path(second.vgpus[0].region_path).is_file()
    assert stat.S_IMODE((v.run_dir / "slices").stat().st_mode) == 0o711
    v.stub.Update(pb.UpdateRequest(id=first.id, memory_bytes=128 << 20), timeout=10)
    assert Path(first.vgpus[0].region_path).is_file()
    gpu = v.run_dir / "sched" / second.vgpus[0].gpu_uuid
    v.wait_for(gpu.is_file, what="the GPU's scheduling file made again")
    assert stat.S_IMODE((v.run_dir / "sched").stat().st_mode) == 0o700

    def served() -> bool:
        with open_sched(gpu) as s:
            snap = s.snapshot()
        return snap.broker_pid > 0 and {e.key for e in snap.entries if e.key} != set()

    v.wait_for(served, what="the broker serving the new file and listing the slices")
    remade = {(e["what"], Path(e["path"]).name) for e in v.events("rundir.remade")}
    assert {("directory", "slices"), ("slice", first.id)} <= remade, remade
    assert ("directory", "sched") in remade or ("file", gpu.name) in remade, remade
    assert v.proc is not None and v.proc.poll() is None
