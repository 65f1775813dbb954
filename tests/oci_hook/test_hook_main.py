# SPDX-License-Identifier: Apache-2.0
"""The compiled vgpu-hook as a subprocess with the OCI state on stdin, asking a real vgpud:
phases, the quiet path without vgpud, errors as one line."""
from __future__ import annotations

import json
import subprocess
import time

import pytest
from support.paths import NATIVE_BIN
from support.process import clean_env
from support.runc_host import Host, MiB, probe_lines
from support.vgpud_harness import Vgpud

from arbiter.proto import vgpu_pb2 as pb


def hook(args, stdin: str, env: dict[str, str] | None = None):
    full = dict(clean_env(), **(env or {}))
    return subprocess.run([str(NATIVE_BIN / "vgpu-hook"), *args], input=stdin,
                          capture_output=True, text=True, env=full, timeout=60)


@pytest.fixture
def vgpud(tmp_path, simgpu_env):
    (tmp_path / "vgpud").mkdir()
    d = Vgpud(tmp_path / "vgpud", simgpu_env,
              config={"hook": {"wait_s": 2, "allow_env_requests": False}}).start()
    yield d
    d.close()


def at(d: Vgpud) -> dict[str, str]:
    return {"VGPU_CONFIG": str(d.config_file), "VGPU_SOCKET": str(d.socket)}


def bundle_with(tmp_path, annotations=None, env=()):
    (tmp_path / "rootfs").mkdir(exist_ok=True)
    spec = {"root": {"path": "rootfs"}, "process": {"env": list(env)},
            "annotations": annotations or {}}
    (tmp_path / "config.json").write_text(json.dumps(spec))
    return tmp_path


def state(bundle, annotations=None, pid=1, status="created", cid="c1"):
    return json.dumps({"ociVersion": "1.0.2", "id": cid, "pid": pid, "bundle": str(bundle),
                       "status": status, "annotations": annotations or {}})


@pytest.mark.parametrize("args", [[], ["start"], ["prestart", "extra"]],
                         ids=["none", "unknown-phase", "two-args"])
def test_usage(args):
    p = hook(args, "")
    assert p.returncode == 2 and p.stderr.startswith("usage: vgpu-hook")


@pytest.mark.parametrize("phase", ["prestart", "createRuntime", "poststop"])
def test_no_request_is_silent_and_needs_no_vgpud(tmp_path, phase):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("hook:\n  wait_s: 30\n")
    b = bundle_with(tmp_path, env=["PATH=/bin", "NOT_VGPU_MEMORY=1Gi"])
    start = time.monotonic()
    p = hook([phase], state(b, {"other": "x"}),
             env={"VGPU_CONFIG": str(cfg), "VGPU_SOCKET": str(tmp_path / "none.sock")})
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")
    assert time.monotonic() - start < 5   # it did not wait for vgpud


@pytest.mark.parametrize(("stdin", "reason"), [
    ("[]", "not a JSON object"),
    ('{"pid": 1, "bundle": "/x"}', "no container id"),
    ('{"id": "c", "pid": 1, "bundle": "relative"}', "is not an absolute path"),
], ids=["array", "no-id", "relative-bundle"])
def test_bad_state_is_vgpud_s_one_line(stdin, reason, vgpud):
    p = hook(["prestart"], stdin, env=at(vgpud))
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("vgpu: failed to read")
    assert reason in p.stderr


def test_bad_request_is_vgpud_s_one_line(tmp_path, vgpud):
    b = bundle_with(tmp_path, {"vgpu.io/memory": "lots"})
    p = hook(["prestart"], state(b, {"vgpu.io/memory": "lots"}), env=at(vgpud))
    assert p.returncode == 1
    assert p.stderr == ("vgpu: vgpu.io/memory=lots: not a memory quantity: use an integer with "
                        "an optional suffix Ki, Mi, Gi, Ti, K, M, G or T (no suffix = MiB)\n")


def test_env_request_ignored_where_vgpud_s_config_forbids(tmp_path, vgpud):
    b = bundle_with(tmp_path, env=["VGPU_MEMORY=1Gi"])
    with subprocess.Popen(["sleep", "30"]) as sleeper:
        p = hook(["prestart"], state(b, pid=sleeper.pid), env=at(vgpud))
        sleeper.kill()
    assert (p.returncode, p.stderr) == (0, "")
    assert vgpud.events("allocate") == []


def test_vgpud_down_prestart_waits_bounded_then_fails_clearly(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("hook:\n  wait_s: 1\n")
    b = bundle_with(tmp_path, {"vgpu.io/memory": "1Gi"})
    # A real process to enter: the mount helper starts, then the wait for vgpud fails.
    with subprocess.Popen(["sleep", "30"]) as sleeper:
        start = time.monotonic()
        p = hook(["prestart"], state(b, {"vgpu.io/memory": "1Gi"}, pid=sleeper.pid),
                 env={"VGPU_CONFIG": str(cfg), "VGPU_SOCKET": str(tmp_path / "none.sock")})
        took = time.monotonic() - start
        sleeper.kill()
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    assert "did not answer within 1s (is vgpud running?)" in p.stderr
    assert 0.9 < took < 6


@pytest.mark.parametrize(("args", "status"), [(["poststop"], "stopped"),
                                              (["prestart"], "stopped")],
                         ids=["poststop", "hooks.d-one-command-stopped"])
def test_vgpud_down_poststop_says_so_and_succeeds(tmp_path, args, status):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("hook:\n  wait_s: 0.5\n")
    b = bundle_with(tmp_path, {"vgpu.io/memory": "1Gi"})
    p = hook(args, state(b, {"vgpu.io/memory": "1Gi"}, pid=0, status=status),
             env={"VGPU_CONFIG": str(cfg), "VGPU_SOCKET": str(tmp_path / "none.sock")})
    assert p.returncode == 0 and p.stderr.count("\n") == 1
    assert "failed to release the vGPU slice of c1" in p.stderr
    assert p.stderr.endswith("the reconciler will release it\n")


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.close()


def test_slice_allocated_by_the_runtime_is_used(host):
    b, cid = host.bundle("vgpu_probe info", {"vgpu.io/memory": "1Gi"})
    # What vgpu-runtime does: allocate first (owner pid 0), then annotate the spec.
    got = host.vgpud.stub.Allocate(pb.AllocateRequest(owner=cid, memory_bytes=128 * MiB),
                                   timeout=5).slice
    spec = json.loads((b / "config.json").read_text())
    spec["annotations"]["vgpu.io/slice"] = got.id
    (b / "config.json").write_text(json.dumps(spec))
    p = host.run(b, cid)
    assert p.returncode == 0, p.stderr
    # The runtime's slice (128Mi), not a new one from the annotation (1Gi).
    assert next(x for x in probe_lines(p.stdout) if x["op"] == "info")["total"] == 128 * MiB
    assert len(host.vgpud.events("allocate")) == 1
    assert host.slices() == []


def test_slice_annotation_naming_another_owner_is_not_trusted(host):
    other = host.vgpud.stub.Allocate(pb.AllocateRequest(owner="someone-else",
                                                        memory_bytes=4096 * MiB),
                                     timeout=5).slice
    b, cid = host.bundle("vgpu_probe info",
                         {"vgpu.io/memory": "64Mi", "vgpu.io/slice": other.id})
    p = host.run(b, cid)
    assert p.returncode == 0, p.stderr
    assert next(x for x in probe_lines(p.stdout) if x["op"] == "info")["total"] == 64 * MiB
    assert [s.owner for s in host.slices()] == ["someone-else"]
