# SPDX-License-Identifier: Apache-2.0
"""vgpud's lifecycle socket (shim/lifecycle.py framing, shim/service.py ops): protocol v2 on a
real vgpud, and the decisions it serves to the compiled vgpu-runtime and vgpu-hook."""
from __future__ import annotations

import json
import os
import socket
import stat
import struct
import subprocess
from pathlib import Path

import pytest
from support.paths import NATIVE_BIN
from support.process import clean_env
from support.vgpud_harness import Vgpud, pb

from arbiter.config import Config
from arbiter.errors import LibraryNotFoundError
from arbiter.install.versions import installed
from arbiter.version import version
from shim import lifecycle
from shim.lifecycle import (
    VERSION,
    Fields,
    LifecycleServer,
    ProtocolError,
    Reply,
    decode,
    encode,
    lifecycle_socket,
    request,
)
from shim.service import LifecycleOps

SPEC = {
    "ociVersion": "1.0.2",
    "process": {"args": ["sh"], "env": ["PATH=/bin"], "cwd": "/"},
    "root": {"path": "rootfs"},
}


# --- framing --------------------------------------------------------------------------------

def test_frames_round_trip_with_repeated_keys_in_order():
    items = [("v", "1"), ("mount", "rw,dev"), ("source", "/a=b"), ("mount", ""), ("x", "")]
    frame = encode(items)
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert decode(frame[4:]).items == items


@pytest.mark.parametrize(("body", "reason"), [
    pytest.param(b"v=1", "NUL-terminated", id="unterminated"),
    pytest.param(b"novalue\0", "not key=value", id="no-equals"),
    pytest.param(b"=x\0", "not key=value", id="empty-key"),
    pytest.param(b"k=\xff\0", "not UTF-8", id="not-utf8"),
])
def test_bad_frames_are_refused(body, reason):
    with pytest.raises(ProtocolError, match=reason):
        decode(body)


@pytest.mark.parametrize("item", [("k=", "v"), ("k", "a\0b")], ids=["equals-in-key", "nul"])
def test_unframeable_fields_are_refused(item):
    with pytest.raises(ProtocolError):
        encode([item])


@pytest.mark.parametrize(("op", "v", "client"), [
    pytest.param("runtime-create", "1", "vgpu-runtime", id="runtime-v1"),
    pytest.param("prestart", "3", "vgpu-hook", id="hook-v3"),
    pytest.param("poststop", "", "vgpu-hook", id="hook-no-version"),
])
def test_another_protocol_version_is_one_line_naming_both(op, v, client):
    """Answered in the client's version: its program prints vgpud's line as it is."""
    server = LifecycleServer(Path("/run/x.lifecycle"), {op: lambda req: Reply.of("ok")})
    reply = dict(server.dispatch(Fields([("v", v), ("op", op)])).items)
    assert reply == {"v": v or VERSION, "status": "error", "message":
                     f"vgpu: {client} speaks lifecycle protocol v{v or '?'}; "
                     f"vgpud at /run/x.lifecycle speaks v{VERSION}"}


def test_the_previous_release_is_accepted_and_answered_in_its_version():
    """The rule (docs/upgrading.md): vgpud N answers N's and N-1's programs, each in its own
    version; 0.1.0's programs speak v2, as this release does."""
    assert lifecycle.ACCEPTED == (VERSION, lifecycle.PREVIOUS) or \
        lifecycle.ACCEPTED == (VERSION,) == (lifecycle.PREVIOUS,)
    assert lifecycle.PREVIOUS == "2"   # what 0.1.0's vg_defaults.h says (the drill runs it)


@pytest.mark.parametrize(("v", "status"), [("4", "error"), ("3", "ok"), ("2", "ok"),
                                           ("1", "error")], ids=["newer", "own", "prev", "older"])
def test_negotiation_once_the_protocol_moves_on(monkeypatch, v, status):
    """A vgpud of v3 (as the next bump makes it) still answers a v2 client in v2, and
    refuses v1 and v4 with one line naming every version it speaks."""
    monkeypatch.setattr(lifecycle, "VERSION", "3")
    monkeypatch.setattr(lifecycle, "ACCEPTED", ("3", "2"))
    server = LifecycleServer(Path("/run/x.lifecycle"), {"prestart": lambda req: Reply.of("ok")})
    reply = server.dispatch(Fields([("v", v), ("op", "prestart")])).items
    assert reply[0] == ("v", v) and dict(reply)["status"] == status
    if status == "error":
        assert dict(reply)["message"] == ("vgpu: vgpu-hook speaks lifecycle protocol "
                                          f"v{v}; vgpud at /run/x.lifecycle speaks v3 and v2")


def test_unknown_ops_are_an_error_and_known_ones_answer():
    server = LifecycleServer(Path("/x"), {"ok": lambda req: Reply.of("ok")})
    reply = dict(server.dispatch(Fields([("v", VERSION), ("op", "nope")])).items)
    assert reply["status"] == "error" and "unknown lifecycle op 'nope'" in reply["message"]
    assert server.dispatch(Fields([("v", VERSION), ("op", "ok")])).items == \
        [("v", VERSION), ("status", "ok")]


def test_a_flood_of_connections_does_not_become_a_flood_of_threads(tmp_path):
    import threading
    import time

    server = LifecycleServer(tmp_path / "l.sock", {"ok": lambda req: Reply.of("ok")})
    server.start()
    idle = []
    try:
        before = threading.active_count()
        for _ in range(3 * 32):        # connected, saying nothing: each would hold a thread
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(tmp_path / "l.sock"))
            idle.append(c)
        time.sleep(0.3)
        assert threading.active_count() - before <= 32
        for c in idle:                 # hanging up frees the threads; requests go on
            c.close()
        idle.clear()
        reply = request(tmp_path / "l.sock", [("op", "ok")], timeout=10)
        assert reply.get("status") == "ok"
    finally:
        for c in idle:
            c.close()
        server.close()


def test_warm_runs_once_serving_and_a_failing_one_is_one_line(tmp_path, caplog):
    """What the ops need (the request schema) is made once the socket serves, not before."""
    import threading
    import time

    warmed = threading.Event()

    def warm() -> None:
        warmed.set()
        raise OSError("request.schema.json: no such file")

    server = LifecycleServer(tmp_path / "l.sock", {"ok": lambda req: Reply.of("ok")}, warm=warm)
    assert not warmed.is_set()
    server.start()
    try:
        assert warmed.wait(10)
        assert request(tmp_path / "l.sock", [("op", "ok")], timeout=10).get("status") == "ok"
    finally:
        server.close()

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if "preparing" in r.getMessage()]

    deadline = time.monotonic() + 10   # the warm thread logs right after it raised
    while not logged() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert logged() == ["lifecycle: preparing the ops failed: request.schema.json: no such file"]


def test_close_answers_what_is_in_flight_and_leaves_later_connections_queued(tmp_path):
    """A restart's stop: the answer being worked out reaches its client before close()
    returns; a connection made after it waits in the inherited socket for the next server."""
    import threading
    import time

    path = tmp_path / "l.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    started, release = threading.Event(), threading.Event()

    def slow(req: Fields) -> Reply:
        started.set()
        release.wait(10)
        return Reply.of("ok", ("by", "first"))

    first = LifecycleServer(path, {"slow": slow})
    first.serve_on(listener.dup())  # the server closes its copy, the "manager" keeps one
    first.start()
    answers: list[Fields] = []
    client = threading.Thread(target=lambda: answers.append(request(path, [("op", "slow")])))
    client.start()
    assert started.wait(10)
    closing = threading.Thread(target=first.close)
    closing.start()
    time.sleep(0.3)
    assert closing.is_alive()  # waits for the answer in flight
    release.set()
    closing.join(10)
    client.join(10)
    assert not closing.is_alive()
    assert [a.get("by") for a in answers] == ["first"]

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as late:
        late.settimeout(10)
        late.connect(str(path))
        lifecycle.write_frame(late, [("v", VERSION), ("op", "slow")])
        second = LifecycleServer(path, {"slow": lambda req: Reply.of("ok", ("by", "second"))})
        second.serve_on(listener)
        second.start()
        try:
            assert lifecycle.read_frame(late).get("by") == "second"
        finally:
            second.close()
    assert path.exists()  # inherited: never unlinked


# --- on a real vgpud ---------------------------------------------------------------------------

@pytest.fixture
def vgpud(tmp_path, simgpu_env):
    (tmp_path / "vgpud").mkdir()
    d = Vgpud(tmp_path / "vgpud", simgpu_env, config={
        "hook": {"wait_s": 2},
        "requests": {"trusted_sources": {"pod_annotations": {"ml": ["priority"]}}}}).start()
    yield d
    d.close()


def ask_fields(d: Vgpud, op: str, **fields: str) -> Fields:
    return request(lifecycle_socket(d.socket), [("op", op), *fields.items()])


def ask(d: Vgpud, op: str, **fields: str) -> dict[str, str]:
    return ask_fields(d, op, **fields).as_dict()


def bundle_with(tmp_path: Path, annotations: dict[str, str], name: str = "b",
                env: tuple[str, ...] = ()) -> Path:
    b = tmp_path / name
    (b / "rootfs").mkdir(parents=True)
    spec = {**SPEC, "annotations": annotations}
    spec["process"] = {**SPEC["process"], "env": ["PATH=/bin", *env]}
    (b / "config.json").write_text(json.dumps(spec))
    return b


def slices(d: Vgpud) -> list:
    return list(d.stub.List(pb.ListRequest(), timeout=5).slices)


def test_socket_is_beside_the_grpc_socket_root_only(vgpud):
    st = os.stat(lifecycle_socket(vgpud.socket))
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    health = vgpud.stub.Health(pb.HealthRequest(), timeout=5)
    assert health.paths["lifecycle_socket"] == str(lifecycle_socket(vgpud.socket))


def test_the_domain_daemon_alone_serves_no_lifecycle_socket(tmp_path, simgpu_env):
    """arbiter.daemon.server knows nothing of containers: vgpud (vgpud.main) attaches the socket."""
    (tmp_path / "d").mkdir()
    d = Vgpud(tmp_path / "d", simgpu_env)
    plain = d.command()
    assert plain[1:3] == ["-m", "vgpud"]
    d.command = lambda: [plain[0], "-m", "arbiter.daemon.server", *plain[3:]]  # type: ignore[method-assign]
    d.start()
    try:
        health = d.stub.Health(pb.HealthRequest(), timeout=5)
        assert "lifecycle_socket" not in health.paths
        assert not lifecycle_socket(d.socket).exists()
    finally:
        d.close()


def test_runtime_create_modifies_the_spec_with_hooks_naming_the_installed_hook(vgpud, tmp_path):
    """The hook of vgpud's versioned install: a later install never replaces it under the
    container (its poststop runs the program its prestart ran)."""
    [own] = installed(vgpud.state_dir / "lib")
    assert own.program("vgpu-hook").read_bytes() == (NATIVE_BIN / "vgpu-hook").read_bytes()
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    reply = ask_fields(vgpud, "runtime-create", bundle=str(b), id="c1").items
    assert reply == [("v", VERSION), ("status", "ok")]
    [s] = slices(vgpud)
    spec = json.loads((b / "config.json").read_text())
    assert spec["annotations"]["vgpu.io/slice"] == s.id and s.owner == "c1"
    assert s.owner_bundle == str(b)
    for phase in ("prestart", "poststop"):
        [hook] = spec["hooks"][phase]
        assert hook["path"] == str(own.program("vgpu-hook"))
        assert hook["args"] == [str(own.program("vgpu-hook")), phase]
        # The hook asks the vgpud that decided (its socket, its config), nothing else.
        assert sorted(e.partition("=")[0] for e in hook["env"]) == \
            ["PATH", "VGPU_CONFIG", "VGPU_SOCKET"]
        assert f"VGPU_SOCKET={vgpud.socket}" in hook["env"]
        assert f"VGPU_CONFIG={vgpud.config_file}" in hook["env"]
        assert hook["timeout"] == 2 + 20   # hook.wait_s + the mounts' margin
    assert spec["process"]["env"][-2:] == [f"CUDA_VISIBLE_DEVICES={s.vgpus[0].gpu_uuid}",
                                           f"NVIDIA_VISIBLE_DEVICES={s.vgpus[0].gpu_uuid}"]


@pytest.mark.parametrize(("annotations", "env"), [
    pytest.param({"io.example/x": "vgpu.io-lookalike"}, (), id="lookalike-annotation"),
    pytest.param({"vgpu.io/slice": "abc"}, (), id="internal-annotation-only"),
    pytest.param({}, ("VGPU_LOG_LEVEL=3",), id="libvgpu-setting-env"),
])
def test_runtime_create_without_request_changes_nothing(vgpud, tmp_path, annotations, env):
    b = bundle_with(tmp_path, annotations, env=env)
    before = (b / "config.json").read_bytes()
    reply = ask(vgpud, "runtime-create", bundle=str(b), id="c1")
    assert reply["status"] == "ok"
    assert (b / "config.json").read_bytes() == before
    assert slices(vgpud) == []


def test_runtime_create_reads_env_requests_where_the_config_allows(vgpud, tmp_path):
    b = bundle_with(tmp_path, {}, env=("VGPU_MEMORY=64Mi",))
    assert ask(vgpud, "runtime-create", bundle=str(b), id="c1")["status"] == "ok"
    spec = json.loads((b / "config.json").read_text())
    assert spec["annotations"]["vgpu.io/env-requests"] == "allowed"
    [s] = slices(vgpud)
    assert s.vgpus[0].memory_bytes == 64 << 20


def test_runtime_create_leaves_a_broken_bundle_to_the_lower_runtime(vgpud, tmp_path):
    b = tmp_path / "b"
    b.mkdir()
    (b / "config.json").write_text("{not json")
    assert ask(vgpud, "runtime-create", bundle=str(b), id="c1")["status"] == "ok"
    assert (b / "config.json").read_text() == "{not json" and slices(vgpud) == []


def test_runtime_create_refuses_a_bundle_vgpud_cannot_see(vgpud, tmp_path):
    """vgpu-runtime asks only after reading the bundle's config.json: a vgpud that finds
    none (in a pod without the engine's bundle dir) must not let the container start
    unsliced."""
    b = tmp_path / "on-the-node-only"
    reply = ask(vgpud, "runtime-create", bundle=str(b), id="c1")
    assert reply["status"] == "error", reply
    assert reply["message"] == (
        f"vgpu: failed to give a vGPU: vgpud cannot see {b}/config.json (No such file or "
        "directory): mount the engine's bundle directory into vgpud's container at the "
        "node's own path"), reply
    assert slices(vgpud) == []


@pytest.mark.parametrize(("op", "fields", "line"), [
    pytest.param("runtime-create", {"annotations": {"vgpu.io/memory": "lots"}},
                 "vgpu: vgpu.io/memory=lots: not a memory quantity", id="create-memory-lots"),
    pytest.param("runtime-create", {"annotations": {"vgpu.io/memory": "64Gi"}},
                 "vgpu: no GPU has room", id="create-no-room"),
    pytest.param("runtime-create", {"annotations": {"vgpu.io/memory": "1Gi",
                                                    "vgpu.io/colour": "red"}},
                 "vgpu: vgpu.io/colour=red: unknown key", id="create-unknown-key"),
    pytest.param("runtime-create", {"id": ""}, "vgpu: failed to give a vGPU: runtime-create "
                 "needs an absolute bundle and an id", id="create-no-id"),
    pytest.param("prestart", {"annotations": {"vgpu.io/compute": "1", "vgpu.io/memory": "1"}},
                 "vgpu: vgpu.io/compute=1: not a compute share", id="prestart-compute-1"),
    pytest.param("prestart", {"annotations": {"vgpu.io/memory": "64Gi"}},
                 "vgpu: failed to allocate a vGPU: no GPU has room", id="prestart-no-room"),
    pytest.param("prestart", {"state": "{not json"}, "vgpu: failed to read the OCI state",
                 id="prestart-bad-state"),
    pytest.param("prestart", {"annotations": {"vgpu.io/memory": "1"}, "pid": 0},
                 "vgpu: failed to read the OCI state on stdin: no container pid",
                 id="prestart-no-pid"),
])
def test_bad_requests_answer_one_line_and_leave_no_slice(vgpud, tmp_path, op, fields, line):
    b = bundle_with(tmp_path, fields.get("annotations", {}))
    state = fields.get("state") or json.dumps({"id": "c1", "pid": fields.get("pid", os.getpid()),
                                               "bundle": str(b), "status": "created"})
    extra = ({"bundle": str(b), "id": fields.get("id", "c1")}
             if op == "runtime-create" else {"state": state, "phase": "prestart"})
    reply = ask(vgpud, op, **extra)
    assert reply["status"] == "error", reply
    assert reply["message"].startswith(line), reply
    assert "\n" not in reply["message"]
    assert slices(vgpud) == []


def test_prestart_answers_the_plan_and_poststop_releases(vgpud, tmp_path):
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    state = {"id": "c1", "pid": os.getpid(), "bundle": str(b), "status": "created"}
    items = ask_fields(vgpud, "prestart", phase="prestart", state=json.dumps(state)).items
    reply = dict(items)
    assert reply["status"] == "mount" and reply["id"] == "c1" and reply["pid"] == str(os.getpid())
    assert reply["rootfs"] == str(b / "rootfs")
    assert reply["preload_host"] == str(b / "vgpu-ld.so.preload")
    targets = [v for k, v in items if k == "target"]
    assert targets[:3] == ["/usr/lib/vgpu/libvgpu.so", "/dev/vgpu0", "/dev/vgpu0.usage"]
    # libvgpu.so comes from vgpud's versioned install, and the slice records which.
    [own] = installed(vgpud.state_dir / "lib")
    assert next(v for k, v in items if k == "source") == str(own.libvgpu)
    assert own.name.startswith(f"{version()}-")
    assert targets[3].startswith("/run/vgpu/sched/GPU-")  # the GPU's file: the broker's
    assert targets[4].startswith(targets[3] + ".") and targets[4].endswith(".req")  # the slice's
    assert targets[5:] == ["/dev/null", "/etc/ld.so.preload"]
    # Read-only (the limits too) but for the slice's own usage and requests, and the node.
    assert [v for k, v in items if k == "mount"] == ["exec", "", "rw", "", "rw", "rw,dev", ""]
    [s] = slices(vgpud)
    assert s.owner_pid == os.getpid()  # the container's init, recorded at prestart
    assert s.libvgpu_version == own.name
    assert [x.libvgpu_version for x in vgpud.stub.List(pb.ListRequest(), timeout=5).slices] \
        == [own.name]
    state["status"] = "stopped"
    assert ask(vgpud, "poststop", state=json.dumps(state))["status"] == "ok"
    assert slices(vgpud) == []


def test_prestart_attaches_the_slice_made_at_create(vgpud, tmp_path):
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    assert ask(vgpud, "runtime-create", bundle=str(b), id="c1")["status"] == "ok"
    [made] = slices(vgpud)
    state = {"id": "c1", "pid": os.getpid(), "bundle": str(b), "status": "created"}
    reply = ask(vgpud, "prestart", phase="createRuntime", state=json.dumps(state))
    assert reply["status"] == "mount"
    [s] = slices(vgpud)
    assert s.id == made.id and s.owner_pid == os.getpid()
    assert len(vgpud.events("allocate")) == 1


def test_a_stopped_state_at_prestart_is_a_poststop(vgpud, tmp_path):
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    assert ask(vgpud, "runtime-create", bundle=str(b), id="c1")["status"] == "ok"
    state = {"id": "c1", "pid": 0, "bundle": str(b), "status": "stopped"}
    assert ask(vgpud, "prestart", phase="prestart", state=json.dumps(state))["status"] == "ok"
    assert slices(vgpud) == []


def test_prestart_without_a_request_is_ok_and_asks_nothing(vgpud, tmp_path):
    b = bundle_with(tmp_path, {})
    state = {"id": "c1", "pid": os.getpid(), "bundle": str(b), "status": "created"}
    assert ask_fields(vgpud, "prestart", phase="prestart", state=json.dumps(state)).items == \
        [("v", VERSION), ("status", "ok")]
    assert slices(vgpud) == [] and vgpud.events("allocate") == []


CRI = "io.kubernetes.cri.container-type"
CRIO = "io.kubernetes.cri-o.ContainerType"


def run_lifecycle(d: Vgpud, b: Path, cid: str) -> list[str]:
    """runtime-create, prestart, poststop of one container, as the compiled programs ask:
    each status, and the slices held after each of the first two."""
    seen = [ask(d, "runtime-create", bundle=str(b), id=cid)["status"]]
    seen.append(str(len(slices(d))))
    state = {"id": cid, "pid": os.getpid(), "bundle": str(b), "status": "created"}
    seen.append(ask(d, "prestart", phase="createRuntime", state=json.dumps(state))["status"])
    seen.append(str(len(slices(d))))
    state.update(status="stopped", pid=0)
    seen.append(ask(d, "poststop", state=json.dumps(state))["status"])
    return seen


@pytest.mark.parametrize("annotations", [
    pytest.param({CRI: "sandbox", "vgpu.io/memory": "64Mi", "vgpu.io/priority": "high"},
                 id="containerd-sandbox"),
    pytest.param({CRIO: "sandbox", "vgpu.io/memory": "64Mi"}, id="crio-sandbox"),
    pytest.param({CRI: "sandbox", "vgpu.io/memory": "lots"}, id="sandbox-bad-request"),
    pytest.param({CRI: "container", "vgpu.io/priority": "high"}, id="pod-priority-only"),
    pytest.param({CRIO: "container", "vgpu.io/compute": "1"}, id="pod-bad-compute-only"),
])
def test_a_pod_sandbox_or_memoryless_container_runs_without_a_slice(vgpud, tmp_path,
                                                                    annotations):
    """The pod's vgpu.io/* keys reach its sandbox and every container (pod_annotations):
    neither the sandbox nor a container whose keys name no memory gets a slice or fails."""
    b = bundle_with(tmp_path, annotations, env=("VGPU_MEMORY=64Mi",))
    before = (b / "config.json").read_bytes()
    assert run_lifecycle(vgpud, b, "c1") == ["ok", "0", "ok", "0", "ok"]
    assert (b / "config.json").read_bytes() == before
    assert vgpud.events("allocate") == []


def test_a_pod_container_gets_the_pod_keys_with_its_own(vgpud, tmp_path):
    """containerd lays the container's keys over the pod's: both make its request, the
    pod's where the config trusts them (its sandbox's spec holds the pod's alone)."""
    bundle_with(tmp_path, {CRI: "sandbox", "vgpu.io/priority": "high"}, name="sb")
    b = bundle_with(tmp_path, {CRI: "container", "io.kubernetes.cri.sandbox-id": "sb",
                               "io.kubernetes.cri.sandbox-namespace": "ml",
                               "vgpu.io/priority": "high",
                               "vgpu.io/memory": "64Mi", "vgpu.io/compute": "30"})
    assert ask(vgpud, "runtime-create", bundle=str(b), id="app")["status"] == "ok"
    [s] = slices(vgpud)
    assert s.owner == "app" and s.vgpus[0].memory_bytes == 64 << 20
    assert s.priority == pb.HIGH and s.vgpus[0].compute_percent == 30
    state = {"id": "app", "pid": 0, "bundle": str(b), "status": "stopped"}
    assert ask(vgpud, "poststop", state=json.dumps(state))["status"] == "ok"
    assert slices(vgpud) == []


def test_a_plain_container_without_memory_is_still_refused(vgpud, tmp_path):
    """Outside a pod the keys are the container's own: an incomplete request is one line."""
    b = bundle_with(tmp_path, {"vgpu.io/compute": "30"})
    reply = ask(vgpud, "runtime-create", bundle=str(b), id="c1")
    assert reply["status"] == "error"
    assert reply["message"].startswith("vgpu: vgpu.io/memory: missing"), reply
    assert slices(vgpud) == []


def test_release_gives_back_the_slice_of_a_failed_exec(vgpud, tmp_path):
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    assert ask(vgpud, "runtime-create", bundle=str(b), id="c1")["status"] == "ok"
    other = bundle_with(tmp_path, {}, name="other")
    # Another container with the same id (another bundle) does not take it away.
    assert ask(vgpud, "release", id="c1", bundle=str(other))["status"] == "ok"
    assert len(slices(vgpud)) == 1
    assert ask(vgpud, "release", id="c1", bundle=str(b))["status"] == "ok"
    assert slices(vgpud) == []
    assert ask(vgpud, "release")["message"] == \
        "vgpu: failed to release the vGPU slice: no container id"


def test_a_client_gone_before_the_answer_leaves_no_slice(vgpud, tmp_path):
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    state = {"id": "c1", "pid": os.getpid(), "bundle": str(b), "status": "created"}
    frame = encode([("v", VERSION), ("op", "prestart"), ("state", json.dumps(state))])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(lifecycle_socket(vgpud.socket)))
        s.sendall(frame)   # and close at once: vgpud's answer finds nobody (a killed hook)
    vgpud.wait_for(lambda: len(vgpud.events("release")) == 1, what="the undo's release")
    assert slices(vgpud) == [] and len(vgpud.events("allocate")) == 1


def test_garbage_is_dropped_and_the_socket_keeps_serving(vgpud):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(lifecycle_socket(vgpud.socket)))
        s.sendall(struct.pack(">I", 1 << 30))
        assert s.recv(16) == b""   # closed without an answer
    assert ask(vgpud, "release", id="nobody")["status"] == "ok"


def test_a_v1_client_is_told_both_versions_over_the_socket(vgpud, tmp_path):
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(lifecycle_socket(vgpud.socket)))
        s.sendall(encode([("v", "1"), ("op", "runtime-create"), ("bundle", str(b)),
                          ("id", "c1"), ("config", str(vgpud.config_file))]))
        (size,) = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))
        reply = decode(s.recv(size, socket.MSG_WAITALL)).as_dict()
    assert reply["v"] == "1" and reply["status"] == "error"
    assert reply["message"] == (f"vgpu: vgpu-runtime speaks lifecycle protocol v1; vgpud at "
                                f"{lifecycle_socket(vgpud.socket)} speaks v{VERSION}")
    assert slices(vgpud) == []


# --- the decision with the domain in process (real SQLite and region files) ------------------


def test_runtime_create_without_the_compiled_hook_fails_and_allocates_nothing(domain, tmp_path):
    ops = LifecycleOps(domain, Config(), hook=lambda: None).ops()
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    before = (b / "config.json").read_bytes()
    reply = ops["runtime-create"](Fields([("bundle", str(b)), ("id", "c1")]))
    assert reply.items == [("v", VERSION), ("status", "error"), (
        "message", "vgpu: failed to add the vgpu hooks: the compiled vgpu-hook is neither "
                   "in arbiter/native/bin nor in build/bin (build it with make)")]
    assert domain.slices() == [] and (b / "config.json").read_bytes() == before


def test_a_prestart_that_fails_after_the_grant_gives_the_slice_back(domain, tmp_path):
    def no_library() -> Path:
        raise LibraryNotFoundError([tmp_path / "libvgpu.so"])
    ops = LifecycleOps(domain, Config(), libvgpu=no_library).ops()
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    state = json.dumps({"id": "c1", "pid": os.getpid(), "bundle": str(b), "status": "created"})
    reply = dict(ops["prestart"](Fields([("phase", "prestart"), ("state", state)])).items)
    assert reply["status"] == "error"
    assert reply["message"].startswith("vgpu: failed to find libvgpu.so"), reply
    assert domain.slices() == []
    assert [e["kind"] for e in domain.events.recent()][-2:] == ["allocate", "release"]
    # A container that asks for nothing never needs the library.
    plain = bundle_with(tmp_path, {}, name="plain")
    state = json.dumps({"id": "c2", "pid": os.getpid(), "bundle": str(plain),
                        "status": "created"})
    assert ops["prestart"](Fields([("state", state)])).items == [("v", VERSION), ("status", "ok")]


# --- the compiled programs on the socket -----------------------------------------------------

def run_native(program: str, args: list[str], d: Vgpud, **kw) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env.update(VGPU_CONFIG=str(d.config_file), VGPU_SOCKET=str(d.socket), **kw.pop("env", {}))
    return subprocess.run([str(NATIVE_BIN / program), *args], env=env, capture_output=True,
                          text=True, timeout=60, **kw)


def test_hook_poststop_with_vgpud_down_leaves_it_to_the_reconciler(vgpud, tmp_path):
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    vgpud.stop()
    state = json.dumps({"id": "c1", "pid": 0, "bundle": str(b), "status": "stopped"})
    p = run_native("vgpu-hook", ["poststop"], vgpud, input=state)
    assert p.returncode == 0, p.stderr
    assert "the reconciler will release" in p.stderr and len(p.stderr.splitlines()) == 1


@pytest.mark.parametrize("args", [[], ["start"], ["prestart", "x"]], ids=["none", "bad", "two"])
def test_hook_usage(args, vgpud):
    p = run_native("vgpu-hook", args, vgpud, input="")
    assert p.returncode == 2 and p.stderr.startswith("usage: vgpu-hook")


def test_every_op_names_its_client_in_a_version_refusal(domain):
    """An old client is told which program speaks the old protocol (CLIENTS)."""
    assert set(LifecycleOps(domain, Config()).ops()) == set(lifecycle.CLIENTS)


def test_vgpud_s_ops_look_for_cdi_specs_in_the_configured_dirs(domain, tmp_path):
    """runtime.cdi_spec_dirs reaches the ops that serve() builds (containerd 1.6's path)."""
    from shim.service import serve
    config = Config(socket=tmp_path / "vgpud.sock",
                    cdi_spec_dirs=(tmp_path / "a", tmp_path / "b"))
    server = serve(domain, config)
    b = bundle_with(tmp_path, {"cdi.k8s.io/vgpu.io_u1": "vgpu.io/claim=u1"})
    reply = dict(server.ops["runtime-create"](Fields([("bundle", str(b)), ("id", "c1")])).items)
    assert reply["message"] == (
        f"vgpu: failed to resolve the CDI device vgpu.io/claim=u1: no spec in {tmp_path / 'a'}, "
        f"{tmp_path / 'b'} (is the claim prepared on this node?)")
