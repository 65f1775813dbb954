# SPDX-License-Identifier: Apache-2.0
"""`vgpu install containerd --set-as-default` on a node's config, through containerd's CRI.

containerd (tests/support/engines.CriContainerd: the node's own CRI settings, then `vgpu
install containerd`) is configured once more with --set-as-default, so pods that name no
runtime handler run through vgpu's: one whose annotations ask for a vGPU gets a slice, one
that asks for nothing runs with its OCI spec untouched (no vgpu hook, nothing from vgpud)
and holds none; the node's own CRI settings (sandbox image, the runc handler) still work.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.cri import ContainerSpec, Cri, Pod, PodSpec
from support.engines import CriContainerd, engine_env, point_at, require, vgpu_bin_dir
from support.paths import ROOT
from support.process import clean_env
from support.vgpud_harness import pb, simgpu_vgpud

require("containerd", "ctr", "containerd-shim-runc-v2", "runc")

IMAGE = "docker.io/library/vgpu-test:latest"
PAUSE = "registry.local/vgpu-test/pause:1"
MI = 1 << 20


class DefaultVgpuContainerd(CriContainerd):
    """CriContainerd whose node config then gets `vgpu install containerd --set-as-default`."""

    def write_config(self) -> None:
        first = not self.config.exists()
        super().write_config()
        if not first:
            return
        env = clean_env()
        env["PYTHONPATH"] = str(ROOT)
        p = subprocess.run([sys.executable, "-m", "vgpu_cli", "install", "containerd",
                            "--config-file", str(self.config), "--set-as-default",
                            "--bin-dir", str(self.tmp / "install-bin"),
                            "--lib-dir", str(self.tmp / "install-lib")],
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cri-default")
    (tmp / "vgpud").mkdir()
    sim, vgpud = simgpu_vgpud(tmp / "vgpud", {
        "reconcile": {"runtime_state_roots": ["/run/containerd/runc/k8s.io"]},
        # The pods here ask through their own annotations (no device plugin): a pod
        # author's memory key counts only in a namespace the config lists (oci_hook.trust).
        "requests": {"trusted_sources": {"pod_annotations": {"default": ["memory"]}}}})
    env = engine_env(vgpu_bin_dir(tmp / "bin"))
    point_at(env, vgpud)
    (tmp / "containerd").mkdir()
    containerd = DefaultVgpuContainerd(tmp / "containerd", env, PAUSE)
    cri = None
    try:
        containerd.start_with_images(IMAGE)
        cri = Cri(containerd.socket)
        yield tmp, sim, vgpud, containerd, cri
    finally:
        if cri is not None:
            cri.close()
        containerd.stop()
        vgpud.close()


def run_pod(node: Any, name: str, annotations: dict[str, str], handler: str = "") -> tuple[
        Pod, str]:
    tmp, sim, _, _, cri = node
    uid = str(uuid.uuid4())
    logs = tmp / "logs" / uid
    logs.mkdir(parents=True)
    pod = cri.run_pod(PodSpec(name, uid, annotations=annotations, runtime_handler=handler,
                              log_directory=str(logs)))
    spec = ContainerSpec("main", IMAGE, ["sh", "-c", "exec sleep 600"],
                         envs={"SIMGPU_STATE": "/sim/simgpu.state"},
                         mounts=[(str(sim), "/sim", False)])
    cid = cri.create_container(pod, spec)
    cri.start_container(cid)
    return pod, cid


def oci_spec(containerd: CriContainerd, cid: str) -> dict[str, Any]:
    """The OCI spec containerd gave the runtime for a container (its bundle's config.json)."""
    (bundle,) = Path(containerd.state).glob(f"io.containerd.runtime.v2.task/*/{cid}")
    return dict(json.loads((bundle / "config.json").read_text()))


def owners(vgpud: Any) -> dict[str, int]:
    return {s.owner: s.vgpus[0].memory_bytes
            for s in vgpud.stub.List(pb.ListRequest(), timeout=5).slices}


def test_the_default_handler_is_vgpu_and_the_nodes_settings_stay(node):
    _, _, _, containerd, _ = node
    p = subprocess.run(["containerd", "--config", str(containerd.config), "config", "dump"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    cri = tomllib.loads(p.stdout)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["default_runtime_name"] == "vgpu"
    assert cri["sandbox_image"] == PAUSE and cri["restrict_oom_score_adj"] is True
    assert set(cri["containerd"]["runtimes"]) == {"runc", "vgpu"}


def test_a_pod_that_names_no_handler_gets_its_vgpu(node):
    _, _, vgpud, containerd, cri = node
    pod, cid = run_pod(node, "asks", {"vgpu.io/memory": "128Mi"})
    try:
        # The application container holds the slice; the sandbox none.
        assert owners(vgpud) == {cid: 128 * MI}
        # What the pass-through test below looks for is there when vgpu acts.
        assert "vgpu-hook" in json.dumps(oci_spec(containerd, cid).get("hooks", {}))
    finally:
        cri.remove_pod(pod)
    vgpud.wait_for(lambda: not owners(vgpud), timeout=30, what="the slice released")


def test_the_slice_its_events_and_metrics_name_the_pod(node):
    # containerd writes the pod's namespace, its name and the container's name on the spec;
    # the slice keeps them, and an operator sees the pod, not a container id.
    _, _, vgpud, _, cri = node
    pod, cid = run_pod(node, "trainer-0", {"vgpu.io/memory": "64Mi"})
    want = {"namespace": "default", "pod": "trainer-0", "container": "main"}
    try:
        (s,) = vgpud.stub.List(pb.ListRequest(), timeout=5).slices
        assert {k.removeprefix("k8s.vgpu.io/"): v for k, v in s.labels.items()} == want
        (event,) = [e for e in vgpud.events("allocate") if e["owner"] == cid]
        assert {k: event.get(k) for k in want} == want
        body = urllib.request.urlopen(
            f"http://127.0.0.1:{vgpud.metrics_port}/metrics", timeout=10).read().decode()
        (limit,) = [m for f in text_string_to_metric_families(body) for m in f.samples
                    if m.name == "vgpu_slice_memory_limit_bytes"]
        assert {k: limit.labels[k] for k in want} == want
        assert limit.labels["owner"] == cid and limit.value == 64 * MI
    finally:
        cri.remove_pod(pod)
    vgpud.wait_for(lambda: not owners(vgpud), timeout=30, what="the slice released")
    (event,) = [e for e in vgpud.events("release") if e["owner"] == cid]
    assert {k: event.get(k) for k in want} == want


def test_a_pod_that_asks_for_nothing_passes_through_untouched(node):
    _, _, vgpud, containerd, cri = node
    pod, cid = run_pod(node, "plain", {})
    try:
        assert owners(vgpud) == {}
        spec = oci_spec(containerd, cid)
        hooks = json.dumps(spec.get("hooks", {}))
        assert "vgpu" not in hooks
        assert not any(e.startswith("VGPU_") for e in spec["process"].get("env", []))
        assert not any("vgpu" in m["destination"] for m in spec.get("mounts", []))
    finally:
        cri.remove_pod(pod)


def test_the_runc_handler_still_runs(node):
    _, _, vgpud, _, cri = node
    pod, _ = run_pod(node, "runc", {"vgpu.io/memory": "128Mi"}, handler="runc")
    try:
        assert owners(vgpud) == {}   # runc knows nothing of vgpu.io keys
    finally:
        cri.remove_pod(pod)
