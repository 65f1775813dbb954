# SPDX-License-Identifier: Apache-2.0
"""vgpud restarts: inherited listening sockets (socket activation), files that keep their
inodes, the compiled programs waiting for a restarting vgpud, and takeovers.

Real vgpud processes on simgpu, real unix sockets and signals; the sockets are bound by
support/socket_activation.py (what vgpud.socket does) or by systemd-socket-activate."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from support.paths import LIBVGPU, NATIVE_BIN, TEST_BIN
from support.process import clean_env, pids_running, read_line
from support.socket_activation import activated_vgpud, listening_socket
from support.vgpud_harness import Takeover, Vgpud, pb

from arbiter.daemon.activation import ActivationError, from_environ
from shim.lifecycle import lifecycle_socket, request

MiB = 1 << 20
GiB = 1 << 30
PROBE = str(TEST_BIN / "vgpu_probe")


@pytest.fixture
def act(tmp_path):
    _, a = activated_vgpud(tmp_path, {"hook": {"wait_s": 5}})
    yield a
    a.close()


def alloc(v: Vgpud, owner: str, memory: int = GiB, **kw) -> pb.AllocateResponse:
    kw.setdefault("owner_pid", os.getpid())  # a live owner: the reconciler keeps it
    return v.stub.Allocate(pb.AllocateRequest(owner=owner, memory_bytes=memory, **kw), timeout=10)


# ---- the protocol (arbiter.daemon.activation), on real sockets ------------------------------

def _passed(tmp_path: Path, *socks: socket.socket) -> int:
    """Dup socks to consecutive free fds (as a manager passes fds 3, 4, ...); the first."""
    base = 200
    for i, s in enumerate(socks):
        os.dup2(s.fileno(), base + i, inheritable=False)
    return base


def test_sockets_matched_by_path_and_variables_removed(tmp_path):
    a = listening_socket(tmp_path / "a.sock")
    b = listening_socket(tmp_path / "b.sock")
    first = _passed(tmp_path, a, b)
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "2", "LISTEN_FDNAMES": "vgpud:vgpud",
           "OTHER": "x"}
    got = from_environ(env, first_fd=first)
    assert env == {"OTHER": "x"}  # never reaches a child
    assert got.activated
    # One FileDescriptorName for both: the bound path decides.
    sb = got.take("lifecycle_socket", tmp_path / "b.sock")
    sa = got.take("socket", tmp_path / "a.sock")
    assert (sa.fileno(), sb.fileno()) == (first, first + 1)
    assert got.take("socket", tmp_path / "a.sock") is None and got.leftovers() == []
    sa.close()
    sb.close()


def test_a_socket_found_by_its_name_when_no_path_matches(tmp_path):
    s = listening_socket(tmp_path / "x.sock")
    first = _passed(tmp_path, s)
    got = from_environ({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "1",
                        "LISTEN_FDNAMES": "socket"}, first_fd=first)
    assert got.take("lifecycle_socket", tmp_path / "elsewhere") is None
    taken = got.take("socket", tmp_path / "moved.sock")
    assert taken is not None
    taken.close()


def test_variables_for_another_pid_are_ignored_and_removed():
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "a:b"}
    got = from_environ(env)
    assert env == {} and not got.activated


@pytest.mark.parametrize(("make", "fds", "names", "reason"), [
    ("pipe", "1", None, "is not a socket"),
    ("dgram", "1", None, "is not a unix stream socket"),
    ("unlistened", "1", None, "is not listening"),
    ("stream", "x", None, "LISTEN_FDS='x' is not a count"),
    ("stream", "1", "a:b", "names 2 sockets, LISTEN_FDS=1"),
], ids=["pipe", "datagram", "not-listening", "bad-count", "names-mismatch"])
def test_what_vgpud_cannot_serve_on_is_one_line(tmp_path, make, fds, names, reason):
    keep: list[object] = []
    if make == "pipe":
        r, w = os.pipe()
        keep = [r, w]
        fd = r
    else:
        kind = socket.SOCK_DGRAM if make == "dgram" else socket.SOCK_STREAM
        s = socket.socket(socket.AF_UNIX, kind)
        s.bind(str(tmp_path / "s"))
        if make == "stream":
            s.listen(1)
        keep = [s]
        fd = s.fileno()
    os.dup2(fd, 200, inheritable=False)
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": fds}
    if names:
        env["LISTEN_FDNAMES"] = names
    with pytest.raises(ActivationError) as info:
        from_environ(env, first_fd=200)
    assert reason in str(info.value) and "\n" not in str(info.value)
    assert env == {}
    os.close(200)
    for k in keep:
        if isinstance(k, int):
            os.close(k)
        else:
            k.close()


# ---- vgpud under socket activation ------------------------------------------------------

def _environ_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")


def _broker_pids(sched: Path) -> list[int]:
    return pids_running("vgpu-broker", str(sched))


def test_inherited_sockets_served_kept_across_restarts_and_never_unlinked(act):
    v = act.vgpud
    before = [p.stat().st_ino for p in act.paths]
    s = alloc(v, "c1", 256 * MiB).slice
    v.wait_for(lambda: "(inherited)" in v.log(), what="vgpud serving inherited sockets")
    reply = request(act.paths[1], [("op", "release"), ("id", "nobody")])
    assert reply.get("status") == "ok"
    # Children of vgpud (the broker) are not told they were passed sockets.
    [broker] = _broker_pids(v.run_dir / "sched")
    assert not [e for e in _environ_of(broker) if e.startswith("LISTEN_")]
    for _ in range(2):
        act.restart()
        assert [p.stat().st_ino for p in act.paths] == before  # the same sockets, unlinked never
        assert v.stub.Get(pb.GetRequest(id=s.id), timeout=5).owner == "c1"
        assert request(act.paths[1], [("op", "release"), ("id", "nobody")]).get("status") == "ok"
    # gRPC itself listens privately (0600, in the run dir) behind the relay.
    assert oct((v.run_dir / "vgpud.grpc.sock").stat().st_mode & 0o777) == "0o600"
    act.down()
    assert all(p.exists() for p in act.paths)  # systemd's: still there, still listening


def test_calls_made_while_vgpud_is_down_are_answered_once_it_is_back(act):
    """The kernel backlog holds them: a client needs no retry at all."""
    act.down()
    t0 = time.monotonic()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(act.paths[1]))  # accepted by the kernel while nobody serves
        from shim.lifecycle import VERSION, read_frame, write_frame
        write_frame(s, [("v", VERSION), ("op", "release"), ("id", "nobody")])
        act.up()
        s.settimeout(30)
        assert read_frame(s).get("status") == "ok"
    assert time.monotonic() - t0 < 30
    health = act.vgpud.stub.Health(pb.HealthRequest(), timeout=10)
    assert health.status == "ok"


def test_restart_keeps_inodes_limits_and_updates_of_a_running_process(act, simgpu_env):
    v = act.vgpud
    s = alloc(v, "c1", 256 * MiB, compute_percent=30).slice
    region = Path(s.vgpus[0].region_path)
    files = [region, Path(f"{region}.usage"), *sorted((v.run_dir / "sched").iterdir())]
    inodes = {p: p.stat().st_ino for p in files}
    env = dict(simgpu_env, SIMGPU_STATE=v.env["SIMGPU_STATE"],
               LD_PRELOAD=str(LIBVGPU), VGPU_REGION_DIR=s.region_dir,
               VGPU_SCHED_DIR=str(v.run_dir / "sched"))
    p = subprocess.Popen([PROBE, f"alloc:mem:{32 * MiB}", "info", "sleep:200", "info",
                          f"fill:mem:{16 * MiB}"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    seen = []
    while not seen or seen[-1]["op"] != "info":
        seen.append(json.loads(read_line(p)))
    assert [x["result"] for x in seen if x["op"] == "alloc"] == ["CUDA_SUCCESS"]
    assert seen[-1]["total"] == 256 * MiB
    os.kill(p.pid, signal.SIGSTOP)  # holds the files open (mapped) across both restarts
    try:
        act.restart()
        act.restart()
        assert {f: f.stat().st_ino for f in files} == inodes
        start = v.events("start")[-1]
        assert (start["regions_made"], start["regions_fixed"]) == ([], [])
        # A limit changed after the restarts reaches the process that started before them.
        v.stub.Update(pb.UpdateRequest(id=s.id, memory_bytes=96 * MiB), timeout=10)
    finally:
        os.kill(p.pid, signal.SIGCONT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    after = next(x for x in lines if x["op"] == "info")
    fill = next(x for x in lines if x["op"] == "fill")
    assert (after["total"], after["free"]) == (96 * MiB, 64 * MiB)
    # Refused at the limit: 32 MiB held + 4 x 16 MiB, then out of memory.
    assert (fill["count"], fill["result"]) == (4, "CUDA_ERROR_OUT_OF_MEMORY")
    assert region.stat().st_ino == inodes[region]


def test_the_real_systemd_socket_activate_passes_sockets_vgpud_serves(tmp_path, simgpu_env):
    """One start under systemd's own implementation of the protocol."""
    tool = shutil.which("systemd-socket-activate")
    if tool is None:
        pytest.skip("systemd-socket-activate is not installed (Debian: the systemd package)")
    (tmp_path / "d").mkdir()
    v = Vgpud(tmp_path / "d", simgpu_env)
    lifecycle = lifecycle_socket(v.socket)
    names = sorted(k for k in v.env if k.startswith(("SIMGPU_", "PYTHON", "LD_")) or k == "PATH")
    cmd = [tool, "-l", str(v.socket), "-l", str(lifecycle), "--fdname=vgpud:vgpud",
           *[f"-E{k}" for k in names], *v.command()]
    log = open(v.log_path, "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(cmd, env=v.env, stdout=log, stderr=log)
    log.close()
    try:
        # The socket's file appears at bind(), a moment before listen(): until then a
        # connection is refused (seen under load), so wait for one that is accepted.
        # It execs vgpud at the first connection, as its own pid (LISTEN_PID).
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline and proc.poll() is None, v.log()
            try:
                reply = request(lifecycle, [("op", "release"), ("id", "nobody")], timeout=30)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.02)
        assert reply.get("status") == "ok", v.log()
        with grpc.insecure_channel(f"unix:{v.socket}") as ch:
            from arbiter.proto import vgpu_pb2_grpc
            assert vgpu_pb2_grpc.ArbiterStub(ch).Health(pb.HealthRequest(),
                                                        timeout=10).status == "ok"
        # Logged as start() ends, after the sockets already answer.
        v.wait_for(lambda: "(inherited)" in v.log(), what="vgpud serving inherited sockets")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert v.socket.exists() and lifecycle.exists()  # never vgpud's to remove
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- without socket activation: the programs wait, takeovers wait -------------------------

def _hook_prestart(tmp_path: Path, v: Vgpud) -> subprocess.Popen[str]:
    """vgpu-hook prestart for a request vgpud refuses (so no mount is needed): its answer
    shows the hook reached vgpud."""
    (tmp_path / "rootfs").mkdir(exist_ok=True)
    ann = {"vgpu.io/memory": "lots"}
    (tmp_path / "config.json").write_text(json.dumps(
        {"root": {"path": "rootfs"}, "process": {"env": []}, "annotations": ann}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": os.getpid(),
                        "bundle": str(tmp_path), "status": "created", "annotations": ann})
    env = dict(clean_env(), VGPU_CONFIG=str(v.config_file), VGPU_SOCKET=str(v.socket))
    (tmp_path / "state.json").write_text(state)
    with open(tmp_path / "state.json") as stdin:
        return subprocess.Popen([str(NATIVE_BIN / "vgpu-hook"), "prestart"], env=env,
                                stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)


def test_the_hook_waits_for_a_vgpud_restarted_by_hand_within_wait_s(tmp_path, simgpu_env):
    (tmp_path / "d").mkdir()
    v = Vgpud(tmp_path / "d", simgpu_env, {"hook": {"wait_s": 20}})
    try:
        v.start()
        v.stop()
        assert not lifecycle_socket(v.socket).exists()  # removed: the hook gets ENOENT
        p = _hook_prestart(tmp_path, v)
        time.sleep(1)
        assert p.poll() is None  # still waiting
        v.start()
        _, err = p.communicate(timeout=30)
        # vgpud's own answer (one line): the hook reached it once it was back.
        assert p.returncode == 1 and err.count("\n") == 1, err
        assert err.startswith("vgpu: vgpu.io/memory=lots: not a memory quantity"), err
    finally:
        v.close()


def test_the_hook_gives_up_after_wait_s_with_one_line_naming_the_socket(tmp_path, simgpu_env):
    (tmp_path / "d").mkdir()
    v = Vgpud(tmp_path / "d", simgpu_env, {"hook": {"wait_s": 1}})
    # A socket file nobody listens on (a vgpud killed mid-restart): ECONNREFUSED, retried.
    listening_socket(v.socket).close()
    t0 = time.monotonic()
    p = _hook_prestart(tmp_path, v)
    _, err = p.communicate(timeout=30)
    took = time.monotonic() - t0
    assert p.returncode == 1 and err.count("\n") == 1, err
    assert f"vgpud at {lifecycle_socket(v.socket)} did not answer within 1s" in err
    assert 0.9 < took < 10


def test_a_takeover_waits_for_the_lock_and_serves_once_the_old_one_exits(tmp_path, simgpu_env):
    (tmp_path / "d").mkdir()
    old = Vgpud(tmp_path / "d", simgpu_env)
    try:
        old.start()
        s = alloc(old, "c1", 256 * MiB).slice
        with Takeover(old, tmp_path / "new.log") as new:
            new.wait_waiting()
            time.sleep(0.5)
            assert new.proc.poll() is None and "serving on" not in new.log()
            # Ready meanwhile (a DaemonSet's readiness probe reads /metrics).
            assert "serving metrics on http://" in new.log()
            # The old one still serves meanwhile.
            assert old.stub.Get(pb.GetRequest(id=s.id), timeout=5).owner == "c1"
            t0 = time.monotonic()
            assert old.stop() == 0
            with grpc.insecure_channel(f"unix:{old.socket}") as ch:
                from arbiter.proto import vgpu_pb2_grpc
                stub = vgpu_pb2_grpc.ArbiterStub(ch)
                got = None
                while got is None:
                    assert new.proc.poll() is None and time.monotonic() - t0 < 30, new.log()
                    try:
                        got = stub.Get(pb.GetRequest(id=s.id), timeout=1)
                    except grpc.RpcError:
                        time.sleep(0.02)
            assert got.owner == "c1"
            assert new.stop() == 0
    finally:
        old.close()


def test_wait_lock_gives_up_with_one_line(tmp_path, simgpu_env):
    (tmp_path / "d").mkdir()
    old = Vgpud(tmp_path / "d", simgpu_env)
    try:
        old.start()
        p = subprocess.run([*old.command(), "--wait-lock", "0.5"], env=old.env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1
        lines = [x for x in p.stderr.splitlines() if not x.startswith("vgpud: INFO")]
        assert lines == [f"vgpud: another vgpud (pid {old.proc.pid}, serving {old.socket}) "
                         f"holds the state dir {old.state_dir}"], p.stderr
        assert old.stub.Health(pb.HealthRequest(), timeout=5).status == "ok"
        # The broker it stood by with went with it; the old one serves on.
        assert "standing by" in p.stderr
        assert _broker_pids(old.run_dir / "sched") == [
            int((old.run_dir / "vgpu-broker.pid").read_text())]
    finally:
        old.close()


def test_a_second_vgpud_under_activation_does_not_take_a_running_ones_sockets(act, tmp_path):
    """Sockets passed to a vgpud that then cannot lock the state dir stay untouched."""
    v = act.vgpud
    inodes = [x.stat().st_ino for x in act.paths]
    p = subprocess.run(v.command(), env=v.env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "holds the state dir" in p.stderr
    assert [x.stat().st_ino for x in act.paths] == inodes
    assert act.health().status == "ok"


# ---- the broker outlives vgpud -----------------------------------------------------------

def test_the_broker_keeps_serving_through_restarts_and_the_next_vgpud_adopts_it(act):
    v = act.vgpud
    sched = v.run_dir / "sched"
    [broker] = _broker_pids(sched)
    for _ in range(3):
        act.restart()
        # The same process served throughout (throttled slices wait on its grants).
        assert _broker_pids(sched) == [broker]
        assert f"vgpu-broker {broker} adopted" in v.log()
    # Killed, it is started again by the vgpud that adopted it (not its parent).
    os.kill(broker, signal.SIGKILL)
    v.wait_for(lambda: _broker_pids(sched) not in ([], [broker]), what="a new broker")
    [new] = _broker_pids(sched)
    # Without a vgpud it goes after broker.orphan_s (the harness: 2 s), not at once.
    act.down()
    assert _broker_pids(sched) == [new]
    v.wait_for(lambda: _broker_pids(sched) == [], timeout=10, what="the orphan broker exiting")
