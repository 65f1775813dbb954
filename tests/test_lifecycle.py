# SPDX-License-Identifier: Apache-2.0
"""vgpud's lifecycle socket (arbiter/lifecycle.py, shim/fastpath.py) on a real vgpud, and
the compiled programs' way back to Python when it cannot answer."""
from __future__ import annotations

import json
import os
import socket
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NATIVE_BIN, ROOT
from vgpud_harness import Vgpud, pb

from arbiter.lifecycle import (
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


def test_dispatch_answers_fallback_for_other_versions_and_unknown_ops():
    server = LifecycleServer(Path("/nonexistent"), {"ok": lambda req: Reply.of("ok")})
    assert server.dispatch(Fields([("v", "2"), ("op", "ok")])).items[1] == ("status", "fallback")
    assert server.dispatch(Fields([("v", VERSION), ("op", "nope")])).items[1] == \
        ("status", "fallback")
    assert server.dispatch(Fields([("v", VERSION), ("op", "ok")])).items[1] == ("status", "ok")


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


# --- on a real vgpud ---------------------------------------------------------------------------

@pytest.fixture
def vgpud(tmp_path, simgpu_env):
    (tmp_path / "vgpud").mkdir()
    d = Vgpud(tmp_path / "vgpud", simgpu_env, config={"hook": {"wait_s": 2}}).start()
    yield d
    d.close()


def ask_fields(d: Vgpud, op: str, **fields: str) -> Fields:
    items = [("op", op), ("config", str(d.config_file)), ("socket", str(d.socket)),
             *fields.items()]
    return request(lifecycle_socket(d.socket), items)


def ask(d: Vgpud, op: str, **fields: str) -> dict[str, str]:
    return ask_fields(d, op, **fields).as_dict()


def bundle_with(tmp_path: Path, annotations: dict[str, str], name: str = "b") -> Path:
    b = tmp_path / name
    (b / "rootfs").mkdir(parents=True)
    (b / "config.json").write_text(json.dumps({**SPEC, "annotations": annotations}))
    return b


def slices(d: Vgpud) -> list:
    return list(d.stub.List(pb.ListRequest(), timeout=5).slices)


def test_socket_is_beside_the_grpc_socket_root_only(vgpud):
    st = os.stat(lifecycle_socket(vgpud.socket))
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


def test_runtime_create_modifies_the_spec_and_answers_the_lower_runtime(vgpud, tmp_path):
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    reply = ask(vgpud, "runtime-create", bundle=str(b), id="c1",
                path=os.environ["PATH"], self=str(NATIVE_BIN / "vgpu-runtime"))
    assert reply["status"] == "exec", reply
    assert Path(reply["lower"]).name == "runc"
    [s] = slices(vgpud)
    spec = json.loads((b / "config.json").read_text())
    assert spec["annotations"]["vgpu.io/slice"] == s.id and s.owner == "c1"
    assert spec["hooks"]["prestart"][0]["path"] == str(NATIVE_BIN / "vgpu-hook")


def test_runtime_create_without_request_changes_nothing(vgpud, tmp_path):
    b = bundle_with(tmp_path, {"io.example/x": "vgpu.io-lookalike"})
    before = (b / "config.json").read_bytes()
    reply = ask(vgpud, "runtime-create", bundle=str(b), id="c1", path=os.environ["PATH"])
    assert reply["status"] == "exec"
    assert (b / "config.json").read_bytes() == before
    assert slices(vgpud) == []


@pytest.mark.parametrize(("op", "fields", "line"), [
    pytest.param("runtime-create", {"annotations": {"vgpu.io/memory": "lots"}},
                 "vgpu: vgpu.io/memory=lots: not a memory quantity", id="create-memory-lots"),
    pytest.param("runtime-create", {"annotations": {"vgpu.io/memory": "64Gi"}},
                 "vgpu: no GPU has room", id="create-no-room"),
    pytest.param("prestart", {"annotations": {"vgpu.io/compute": "1", "vgpu.io/memory": "1"}},
                 "vgpu: vgpu.io/compute=1: not a compute share", id="prestart-compute-1"),
    pytest.param("prestart", {"state": "{not json"}, "vgpu: failed to read the OCI state",
                 id="prestart-bad-state"),
])
def test_bad_requests_answer_one_line_and_leave_no_slice(vgpud, tmp_path, op, fields, line):
    b = bundle_with(tmp_path, fields.get("annotations", {}))
    state = fields.get("state") or json.dumps({"id": "c1", "pid": os.getpid(),
                                               "bundle": str(b), "status": "created"})
    extra = ({"bundle": str(b), "id": "c1", "path": os.environ["PATH"]}
             if op == "runtime-create" else {"state": state, "phase": "prestart"})
    reply = ask(vgpud, op, **extra)
    assert reply["status"] == "error", reply
    assert reply["message"].startswith(line) and "\n" not in reply["message"]
    assert slices(vgpud) == []


def test_prestart_answers_the_plan_and_poststop_releases(vgpud, tmp_path):
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    state = {"id": "c1", "pid": os.getpid(), "bundle": str(b), "status": "created"}
    items = ask_fields(vgpud, "prestart", phase="prestart", state=json.dumps(state)).items
    reply = dict(items)
    assert reply["status"] == "mount" and reply["id"] == "c1" and reply["pid"] == str(os.getpid())
    assert reply["rootfs"] == str(b / "rootfs")
    targets = [v for k, v in items if k == "target"]
    assert targets[:3] == ["/usr/lib/vgpu/libvgpu.so", "/dev/vgpu0", "/dev/vgpu0.usage"]
    assert targets[3].startswith("/run/vgpu/sched/GPU-")  # the GPU's file: the broker's
    assert targets[4].startswith(targets[3] + ".") and targets[4].endswith(".req")  # the slice's
    assert targets[5:] == ["/dev/null", "/etc/ld.so.preload"]
    # Read-only (the limits too) but for the slice's own usage and requests, and the node.
    assert [v for k, v in items if k == "mount"] == ["exec", "", "rw", "", "rw", "rw,dev", ""]
    assert len(slices(vgpud)) == 1
    state["status"] = "stopped"
    assert ask(vgpud, "poststop", state=json.dumps(state))["status"] == "ok"
    assert slices(vgpud) == []


def test_a_client_gone_before_the_answer_leaves_no_slice(vgpud, tmp_path):
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    state = {"id": "c1", "pid": os.getpid(), "bundle": str(b), "status": "created"}
    frame = encode([("v", VERSION), ("op", "prestart"), ("config", str(vgpud.config_file)),
                    ("socket", str(vgpud.socket)), ("state", json.dumps(state))])
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


def test_a_client_of_another_vgpud_is_sent_to_python(vgpud, tmp_path):
    reply = request(lifecycle_socket(vgpud.socket), [
        ("op", "release"), ("config", str(vgpud.config_file)),
        ("socket", str(tmp_path / "other.sock")), ("id", "c1")]).as_dict()
    assert reply["status"] == "fallback" and "other.sock" in reply["reason"]


# --- the compiled programs fall back to Python ------------------------------------------------

def run_native(program: str, args: list[str], d: Vgpud, **kw) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPU_", "SIMGPU_"))}
    env.update(PYTHONPATH=str(ROOT), VGPU_CONFIG=str(d.config_file), VGPU_SOCKET=str(d.socket),
               VGPU_PYTHON=sys.executable, **kw.pop("env", {}))
    return subprocess.run([str(NATIVE_BIN / program), *args], env=env, capture_output=True,
                          text=True, timeout=60, **kw)


@pytest.mark.parametrize("how", ["no-socket", "older-vgpud"])
def test_runtime_without_an_answering_socket_runs_python(vgpud, tmp_path, how):
    lower = tmp_path / "lower"
    lower.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$0.argv\"\n")
    lower.chmod(0o755)
    vgpud.stop()
    vgpud.write_config({"runtime": {"lower": str(lower)}})
    vgpud.start()
    server = None
    if how == "older-vgpud":   # a socket that speaks no op we know: a vgpud from before
        path = tmp_path / "old.lifecycle"
        server = LifecycleServer(path, {})
        server.start()
    else:
        path = tmp_path / "absent.lifecycle"
    try:
        b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
        p = run_native("vgpu-runtime", ["create", "--bundle", str(b), "c9"], vgpud,
                       env={"VGPU_LIFECYCLE_SOCKET": str(path)})
    finally:
        if server is not None:
            server.close()
    assert p.returncode == 0, p.stderr
    assert Path(f"{lower}.argv").read_text().split() == ["create", "--bundle", str(b), "c9"]
    [s] = slices(vgpud)
    spec = json.loads((b / "config.json").read_text())
    assert s.owner == "c9" and spec["annotations"]["vgpu.io/slice"] == s.id


def test_hook_poststop_with_vgpud_down_runs_python_and_succeeds(vgpud, tmp_path):
    b = bundle_with(tmp_path, {"vgpu.io/memory": "64Mi"})
    vgpud.stop()
    state = json.dumps({"id": "c1", "pid": 0, "bundle": str(b), "status": "stopped"})
    p = run_native("vgpu-hook", ["poststop"], vgpud, input=state)
    assert p.returncode == 0, p.stderr
    # The Python hook's own words: it waited (bounded) for vgpud, then let the reconciler do it.
    assert "the reconciler will release the slice of c1" in p.stderr


@pytest.mark.parametrize("args", [[], ["start"], ["prestart", "x"]], ids=["none", "bad", "two"])
def test_hook_usage(args, vgpud):
    p = run_native("vgpu-hook", args, vgpud, input="")
    assert p.returncode == 2 and p.stderr.startswith("usage: vgpu-hook")


def test_c_and_python_agree_on_the_version_and_the_socket_name():
    native = (ROOT / "shim" / "native" / "vg_msg.h").read_text()
    common = (ROOT / "shim" / "native" / "vg_common.h").read_text()
    assert f'#define VG_PROTOCOL_VERSION "{VERSION}"' in native
    suffix = str(lifecycle_socket("/x")).removeprefix("/x")
    assert f'#define VG_LIFECYCLE_SUFFIX "{suffix}"' in common
