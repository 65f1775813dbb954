# SPDX-License-Identifier: Apache-2.0
"""The compiled vgpu-hook (the hooks.d path: no vgpu-runtime before it) asking a real vgpud
about a container a tenant shaped: a pod's own keys and env count only where the config
trusts them, and an annotation cannot turn env requests on."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from support.paths import NATIVE_BIN
from support.process import clean_env
from support.vgpud_harness import Vgpud

CRI_APP = {"io.kubernetes.cri.container-type": "container",
           "io.kubernetes.cri.sandbox-id": "sandbox1"}


@pytest.fixture
def vgpud(tmp_path, simgpu_env):
    (tmp_path / "vgpud").mkdir()
    d = Vgpud(tmp_path / "vgpud", simgpu_env, config={
        "hook": {"wait_s": 2, "allow_env_requests": False},
        "requests": {"trusted_sources": {"pod_annotations": {"ml": ["priority"]}}},
    }).start()
    yield d
    d.close()


@contextmanager
def init() -> Iterator[int]:
    """A container init stand-in in a mount namespace of its own: whatever a hook that lets
    the request through mounts lands there, never on the host."""
    with subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                           "sleep", "60"]) as p:
        try:
            yield p.pid
        finally:
            p.kill()


def prestart(vgpud: Vgpud, bundle, annotations, pid: int) -> subprocess.CompletedProcess:
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": pid, "bundle": str(bundle),
                        "status": "created", "annotations": annotations})
    env = dict(clean_env(), VGPU_CONFIG=str(vgpud.config_file), VGPU_SOCKET=str(vgpud.socket))
    return subprocess.run([str(NATIVE_BIN / "vgpu-hook"), "prestart"], input=state,
                          capture_output=True, text=True, env=env, timeout=60)


def pod(tmp_path, pod_annotations, annotations, env=()):
    """A container's bundle beside its sandbox's, as containerd's runc shim lays them out."""
    (tmp_path / "sandbox1").mkdir()
    (tmp_path / "sandbox1" / "config.json").write_text(json.dumps(
        {"root": {"path": "rootfs"}, "annotations": pod_annotations}))
    bundle = tmp_path / "c1"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps(
        {"root": {"path": "rootfs"}, "process": {"env": list(env)},
         "annotations": annotations}))
    return bundle


def test_a_pod_s_priority_is_refused_outside_the_trusted_namespaces(tmp_path, vgpud):
    annotations = {**CRI_APP, "io.kubernetes.cri.sandbox-namespace": "team-a",
                   "vgpu.io/memory": "64Mi", "vgpu.io/priority": "high"}
    bundle = pod(tmp_path, {"vgpu.io/priority": "high"}, annotations)
    with init() as pid:
        p = prestart(vgpud, bundle, annotations, pid)
    assert (p.returncode, p.stderr) == (1, (
        "vgpu: vgpu.io/priority=high from the pod's annotations is not allowed in namespace "
        "team-a (requests.trusted_sources.pod_annotations lists no key for it)\n"))
    assert vgpud.events("allocate") == []


def test_a_pod_without_a_readable_sandbox_spec_is_refused(tmp_path, vgpud):
    annotations = {**CRI_APP, "io.kubernetes.cri.sandbox-id": "gone",
                   "io.kubernetes.cri.sandbox-namespace": "ml", "vgpu.io/memory": "64Mi"}
    bundle = pod(tmp_path, {}, annotations)
    with init() as pid:
        p = prestart(vgpud, bundle, annotations, pid)
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("vgpu: failed to read the pod's sandbox spec "), p.stderr
    assert vgpud.events("allocate") == []


def test_the_env_requests_annotation_cannot_turn_env_requests_on(tmp_path, vgpud):
    # Not a pod (docker run --annotation): only the config says whether env counts.
    annotations = {"vgpu.io/env-requests": "allowed"}
    bundle = pod(tmp_path, {}, annotations, env=["VGPU_MEMORY=64Mi", "VGPU_PRIORITY=high"])
    with init() as pid:
        p = prestart(vgpud, bundle, annotations, pid)
    assert (p.returncode, p.stderr) == (0, "")
    assert vgpud.events("allocate") == []


def keyed_hooks(hook: str, memory: str, compute: str) -> dict:
    """config.json's hooks as an engine writes them from the device plugin's two CDI devices
    (oci_hook.cdi.request_spec): the memory device's and the compute device's."""
    return {"createRuntime": [
        {"path": hook, "args": ["vgpu-hook", "createRuntime", f"vgpu.io/memory={memory}"]},
        {"path": hook, "args": ["vgpu-hook", "createRuntime", f"vgpu.io/compute={compute}"]}]}


def keyed_prestart(vgpud: Vgpud, bundle, annotations, pid: int) -> subprocess.CompletedProcess:
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": pid, "bundle": str(bundle),
                        "status": "created", "annotations": annotations})
    env = dict(clean_env(), VGPU_CONFIG=str(vgpud.config_file), VGPU_SOCKET=str(vgpud.socket))
    return subprocess.run([str(NATIVE_BIN / "vgpu-hook"), "createRuntime", "vgpu.io/memory=64Mi"],
                          input=state, capture_output=True, text=True, env=env, timeout=60)


def test_the_keys_of_the_device_plugin_s_cdi_hooks_are_the_kubelet_s(tmp_path, vgpud):
    """No vgpu.io/* annotation reaches the spec (containerd's default handler passes none):
    the memory and compute the hooks carry make the request, and they are trusted in a
    namespace that trusts no pod key (a pod cannot write hooks)."""
    annotations = {**CRI_APP, "io.kubernetes.cri.sandbox-namespace": "team-a"}
    bundle = pod(tmp_path, {}, annotations)
    doc = json.loads((bundle / "config.json").read_text())
    doc["hooks"] = keyed_hooks(str(NATIVE_BIN / "vgpu-hook"), "64Mi", "30")
    (bundle / "config.json").write_text(json.dumps(doc))
    with init() as pid:
        keyed_prestart(vgpud, bundle, annotations, pid)
    [event] = vgpud.events("allocate")
    assert [(g["memory"], g["compute"]) for g in event["grants"]] == [(64 << 20, 30)]


def test_a_pod_s_own_key_beside_the_cdi_hooks_keys_is_still_refused(tmp_path, vgpud):
    annotations = {**CRI_APP, "io.kubernetes.cri.sandbox-namespace": "team-a",
                   "vgpu.io/priority": "high"}
    bundle = pod(tmp_path, {"vgpu.io/priority": "high"}, annotations)
    doc = json.loads((bundle / "config.json").read_text())
    doc["hooks"] = keyed_hooks(str(NATIVE_BIN / "vgpu-hook"), "64Mi", "30")
    (bundle / "config.json").write_text(json.dumps(doc))
    with init() as pid:
        p = keyed_prestart(vgpud, bundle, annotations, pid)
    assert (p.returncode, p.stderr) == (1, (
        "vgpu: vgpu.io/priority=high from the pod's annotations is not allowed in namespace "
        "team-a (requests.trusted_sources.pod_annotations lists no key for it)\n"))
    assert vgpud.events("allocate") == []
