# SPDX-License-Identifier: Apache-2.0
"""End to end through containerd's CRI plugin, driven as the kubelet drives it.

One containerd with its CRI plugin (tests/support/engines.CriContainerd: handlers `runc`
and `vgpu`, the `vgpu.io/*` pod and container annotations passed through, a locally
built pause image) and one vgpud on two simulated GPUs serve the module. Each test runs
pods over the CRI v1 API (tests/support/cri.py): RunPodSandbox with runtime handler
`vgpu`, then CreateContainer / StartContainer with what the kubelet would put there.
Inside, vgpu_probe sees its slice through libvgpu; the simulated GPUs' state is
bind-mounted at /sim. Where the device plugin is in the checkout (vgpu_k8s), a pod's
resources go through its Allocate first, as the kubelet's device manager calls it.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.cri import ContainerSpec, Cri, Pod, PodSpec, api, read_log
from support.engines import CriContainerd, engine_env, point_at, require, vgpu_bin_dir
from support.vgpud_harness import pb, simgpu_vgpud

require("containerd", "ctr", "containerd-shim-runc-v2", "runc", "gcc")  # gcc: the pause image

IMAGE = "docker.io/library/vgpu-test:latest"
PAUSE = "registry.local/vgpu-test/pause:1"
MI = 1 << 20
# Keeps a container (and so its slice) alive after the probe printed what it saw.
PROBE_THEN_WAIT = "vgpu_probe info && exec sleep 600"
#: The namespace whose pods' own vgpu.io/* annotations the module's vgpud trusts.
TRUSTED = "vgpu-trusted"


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        (tmp / "vgpud").mkdir()
        self.sim, self.vgpud = simgpu_vgpud(tmp / "vgpud", {
            "hook": {"wait_s": 10},
            # The runc shim keeps CRI's containers under the k8s.io namespace's root.
            "reconcile": {"runtime_state_roots": ["/run/containerd/runc/k8s.io"]},
            # A pod author's keys count only where listed (oci_hook.trust): memory and
            # priority in TRUSTED; in any namespace, env may give the memory alone.
            "requests": {"trusted_sources": {
                "pod_annotations": {TRUSTED: ["memory", "priority"]},
                "pod_env": {"*": ["memory"], TRUSTED: ["priority"]}}},
        }, devices="1Gi,1Gi")
        env = engine_env(vgpu_bin_dir(tmp / "bin"))
        point_at(env, self.vgpud)
        (tmp / "containerd").mkdir()
        self.containerd = CriContainerd(tmp / "containerd", env, PAUSE)
        self.logs = tmp / "logs"
        self.cri: Cri | None = None

    def start(self) -> World:
        self.containerd.start_with_images(IMAGE)
        self.cri = Cri(self.containerd.socket)
        return self

    def stop(self) -> None:
        if self.cri is not None:
            self.cri.close()
        self.containerd.stop()
        self.vgpud.close()

    def pod(self, name: str, annotations: dict[str, str] | None = None,
            handler: str = "vgpu", namespace: str = "default") -> Pod:
        uid = str(uuid.uuid4())
        log_dir = self.logs / uid
        log_dir.mkdir(parents=True)
        assert self.cri is not None
        return self.cri.run_pod(PodSpec(name, uid, namespace=namespace,
                                        annotations=annotations or {},
                                        runtime_handler=handler, log_directory=str(log_dir)))

    def container(self, name: str, script: str, annotations: dict[str, str] | None = None,
                  envs: dict[str, str] | None = None) -> ContainerSpec:
        """A container of the test image that sees the simulated GPUs (as a real one sees
        the driver's device nodes and libraries)."""
        return ContainerSpec(name, IMAGE, ["sh", "-c", script],
                             envs={"SIMGPU_STATE": "/sim/simgpu.state", **(envs or {})},
                             mounts=[(str(self.sim), "/sim", False)],
                             annotations=dict(annotations or {}))

    def run(self, pod: Pod, spec: ContainerSpec) -> str:
        assert self.cri is not None
        cid = self.cri.create_container(pod, spec)
        self.cri.start_container(cid)
        return cid

    def slices(self) -> list[Any]:
        return list(self.vgpud.stub.List(pb.ListRequest(), timeout=5).slices)

    def owners(self) -> dict[str, int]:
        """Slice owner (container id) -> memory bytes of its one vGPU."""
        return {s.owner: s.vgpus[0].memory_bytes for s in self.slices()}

    def infos(self, cid: str) -> list[dict[str, Any]]:
        """The probe's `info` lines in a container's log, once there is one."""
        assert self.cri is not None
        path = self.cri.container_status(cid).log_path

        def seen() -> list[dict[str, Any]]:
            return [r for r in map(json.loads, (line for line in read_log(path).splitlines()
                                                if line.startswith("{")))
                    if r["op"] == "info"]
        return list(self.vgpud.wait_for(seen, timeout=30, what=f"the probe's output in {cid}"))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("e2e-cri"))
    try:
        yield w.start()
    finally:
        w.stop()


@pytest.fixture(autouse=True)
def clean(world):
    """Each test's pods go, and so do slices it leaked: a leak fails that test's own
    `slices() == []`, never the next test."""
    yield
    assert world.cri is not None
    world.cri.remove_all()
    for s in world.slices():
        world.vgpud.stub.Release(pb.ReleaseRequest(id=s.id), timeout=5)


def test_pod_annotations_give_each_app_container_a_slice_and_the_sandbox_none(world):
    pod = world.pod("annotated", {"vgpu.io/memory": "64Mi"}, namespace=TRUSTED)
    first = world.run(pod, world.container("first", PROBE_THEN_WAIT))
    # A container-level key wins over the pod's (what a device plugin's Allocate sets).
    second = world.run(pod, world.container("second", PROBE_THEN_WAIT,
                                            {"vgpu.io/memory": "128Mi"}))
    assert [i["total"] for i in world.infos(first)] == [64 * MI]
    assert [i["total"] for i in world.infos(second)] == [128 * MI]
    assert world.owners() == {first: 64 * MI, second: 128 * MI}  # none for pod.id
    world.cri.remove_pod(pod)
    assert world.slices() == []


@pytest.fixture(scope="module")
def kubelet(world):
    """A fake kubelet (tests/support/fake_kubelet.py: Registration served, ListAndWatch
    followed) and vgpu-device-plugin on the module's vgpud, 64Mi per vgpu.io/memory ID."""
    fake_kubelet = pytest.importorskip("support.fake_kubelet",
                                       reason="the device plugin (vgpu_k8s) is not here")
    device_plugin = pytest.importorskip("support.device_plugin")
    k = fake_kubelet.FakeKubelet(world.tmp / "device-plugins").start()
    plugin = device_plugin.DevicePlugin(k.dir, world.vgpud.socket,
                                        world.tmp / "device-plugin.log", memory_unit="64Mi")
    try:
        yield k
    finally:
        plugin.stop()
        k.stop()


def healthy_ids(kubelet, resource: str) -> list[str]:
    plugin = kubelet.wait_registered(resource)
    devices = kubelet.wait_devices(plugin, lambda d: bool(d) and set(d.values()) == {"Healthy"},
                                   f"healthy {resource} devices")
    return list(devices)


def test_device_plugin_pod_each_container_sees_its_own_limit_and_the_sandbox_none(world,
                                                                                   kubelet):
    memory, compute = kubelet.wait_registered("vgpu.io/memory"), \
        kubelet.wait_registered("vgpu.io/compute")
    free_memory, free_compute = healthy_ids(kubelet, "vgpu.io/memory"), \
        healthy_ids(kubelet, "vgpu.io/compute")
    # resources.limits: a: vgpu.io/memory 2; b: vgpu.io/memory 3, vgpu.io/compute 30. The
    # device manager takes memory IDs as the plugin prefers (it offers a preference) and
    # compute IDs in list order (it offers none).
    assert memory.request.options.get_preferred_allocation_available
    a_ids = memory.preferred(free_memory, 2)
    b_ids = memory.preferred([i for i in free_memory if i not in a_ids], 3)
    a_mem, b_mem = memory.allocate(a_ids, b_ids).container_responses
    [b_comp] = compute.allocate(free_compute[:30]).container_responses
    pod = world.pod("device-plugin")  # runtimeClassName: vgpu, no annotations
    a = world.container("a", PROBE_THEN_WAIT)
    a.add_allocation(a_mem)
    b = world.container("b", PROBE_THEN_WAIT)
    b.add_allocation(b_mem)
    b.add_allocation(b_comp)
    ca, cb = world.run(pod, a), world.run(pod, b)
    assert [i["total"] for i in world.infos(ca)] == [128 * MI]
    assert [i["total"] for i in world.infos(cb)] == [192 * MI]
    assert world.owners() == {ca: 128 * MI, cb: 192 * MI}  # none for the sandbox
    [b_slice] = [s for s in world.slices() if s.owner == cb]
    assert b_slice.vgpus[0].compute_percent == 30
    world.cri.remove_pod(pod)
    assert world.slices() == []


def test_pod_priority_alone_runs_the_pod_without_a_slice(world):
    pod = world.pod("priority-only", {"vgpu.io/priority": "high"})
    cid = world.run(pod, world.container("app", "echo ran"))
    status = world.cri.wait_exited(cid)
    assert (status.exit_code, read_log(status.log_path)) == (0, "ran\n"), status
    assert world.slices() == []


def test_bad_request_fails_the_container_with_one_line(world):
    pod = world.pod("bad", {})
    spec = world.container("app", "echo must-not-run", {"vgpu.io/memory": "lots"})
    cid = world.cri.create_container(pod, spec)
    with pytest.raises(grpc.RpcError) as err:
        world.cri.start_container(cid)
    # containerd wraps what the runtime printed: "... OCI runtime create failed: <line>: unknown".
    details = err.value.details()
    assert "vgpu: vgpu.io/memory=lots: not a memory quantity" in details, details
    assert "\n" not in details and details.count("vgpu.io/memory") == 1, details
    assert world.cri.container_status(cid).state != api.CONTAINER_RUNNING
    assert world.slices() == []
    # The sandbox asked for nothing and still runs.
    assert [p.state for p in world.cri.pods() if p.id == pod.id] == [api.SANDBOX_READY]


def test_runc_handler_ignores_vgpu_annotations(world):
    pod = world.pod("plain", {"vgpu.io/memory": "64Mi"}, handler="runc")
    cid = world.run(pod, world.container("app", "test -e /dev/vgpu0 || echo no-vgpu"))
    status = world.cri.wait_exited(cid)
    assert read_log(status.log_path) == "no-vgpu\n"
    assert world.slices() == []


def test_containerd_restart_keeps_the_slices_and_removal_releases_them(world):
    pod = world.pod("restart", {"vgpu.io/memory": "64Mi"}, namespace=TRUSTED)
    cid = world.run(pod, world.container("app", PROBE_THEN_WAIT))
    assert [i["total"] for i in world.infos(cid)] == [64 * MI]
    world.containerd.restart()
    assert world.cri.container_status(cid).state == api.CONTAINER_RUNNING
    assert world.owners() == {cid: 64 * MI}
    world.cri.remove_pod(pod)
    assert world.slices() == []


def refused_start(world, pod: Pod, spec: ContainerSpec) -> str:
    """What containerd says when the container's start fails (the runtime's one line)."""
    cid = world.cri.create_container(pod, spec)
    with pytest.raises(grpc.RpcError) as err:
        world.cri.start_container(cid)
    assert world.cri.container_status(cid).state != api.CONTAINER_RUNNING
    details = err.value.details()
    assert "\n" not in details, details
    return details


# A container as the device plugin's Allocate leaves it (container-level keys, which only
# the kubelet sets) in a pod whose author asked for high priority.
DEVICE_PLUGIN_KEYS = {"vgpu.io/memory": "64Mi", "vgpu.io/devices": "0"}


def test_pod_priority_is_refused_where_the_config_does_not_trust_the_pod(world):
    pod = world.pod("greedy", {"vgpu.io/priority": "high"}, namespace="team-a")
    details = refused_start(world, pod, world.container("app", "echo must-not-run",
                                                        DEVICE_PLUGIN_KEYS))
    assert ("vgpu: vgpu.io/priority=high from the pod's annotations is not allowed in "
            "namespace team-a (requests.trusted_sources.pod_annotations lists no key for it)"
            ) in details, details
    assert world.slices() == []
    assert [p.state for p in world.cri.pods() if p.id == pod.id] == [api.SANDBOX_READY]


def test_pod_priority_counts_where_the_config_lists_the_namespace(world):
    pod = world.pod("trusted", {"vgpu.io/priority": "high"}, namespace=TRUSTED)
    cid = world.run(pod, world.container("app", PROBE_THEN_WAIT, DEVICE_PLUGIN_KEYS))
    assert [i["total"] for i in world.infos(cid)] == [64 * MI]
    [s] = world.slices()
    assert (s.owner, s.priority) == (cid, pb.HIGH)


def test_env_priority_is_refused_where_the_config_does_not_trust_the_pod(world):
    pod = world.pod("env", namespace="team-a")
    details = refused_start(world, pod, world.container(
        "app", "echo must-not-run", envs={"VGPU_MEMORY": "64Mi", "VGPU_PRIORITY": "high"}))
    assert ("vgpu: VGPU_PRIORITY=high from the container's env is not allowed in namespace "
            "team-a (requests.trusted_sources.pod_env lists only memory for it)") in details, \
        details
    assert world.slices() == []


def test_env_priority_counts_where_the_config_lists_the_namespace(world):
    pod = world.pod("env-trusted", namespace=TRUSTED)
    cid = world.run(pod, world.container(
        "app", PROBE_THEN_WAIT, envs={"VGPU_MEMORY": "64Mi", "VGPU_PRIORITY": "high"}))
    assert [i["total"] for i in world.infos(cid)] == [64 * MI]
    [s] = world.slices()
    assert (s.owner, s.priority) == (cid, pb.HIGH)
