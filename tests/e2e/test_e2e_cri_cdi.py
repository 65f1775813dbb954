# SPDX-License-Identifier: Apache-2.0
"""End to end: a DRA claim on containerd 1.6 (no CDI), through the CDI annotation.

Kubelets up to 1.30 hand a container its claim's CDI devices as the annotation
`cdi.k8s.io/<driver>_<claim uid>: vgpu.io/claim=<name>`; containerd 1.6 cannot read CDI
specs, so the pod runs with runtime handler `vgpu` and vgpud's runtime-create applies the
spec itself from its CDI dirs (config runtime.cdi_spec_dirs: a private dir here, never
the host's /var/run/cdi). The claim is prepared as vgpu-dra-plugin prepares one: a claim
slice through vgpud's gRPC Allocate (owner kind `claim`, per-vGPU amounts), its spec
written with oci_hook.cdi.write_spec.

A real containerd with its CRI plugin (tests/support/engines.CriContainerd), driven over
the CRI v1 API as the kubelet drives it, and a vgpud on two simulated GPUs. Checks: the
container's CUDA client sees exactly the claim's limits; the pod's sandbox, which carries
the same annotation at pod level, gets nothing; the claim keeps its slice after the pod
is removed (only the plugin releases it); after the release a container naming the
device fails with one line. A pod sets `cdi.k8s.io/*` annotations itself, so a pod of
another namespace that names the claim's device fails to start with one line naming the
annotation and the claim, and the claim records no user for it (its slice is labelled as
the plugin labels it: `dra.vgpu.io/claim` = namespace/name). Pods, slice and spec are
removed even when a test fails.
"""
from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.cri import ContainerSpec, Cri, Pod, PodSpec, api, read_log
from support.engines import CriContainerd, engine_env, point_at, require, vgpu_bin_dir
from support.paths import LIBVGPU, NATIVE_BIN
from support.vgpud_harness import pb, simgpu_vgpud

from oci_hook import cdi

require("containerd", "ctr", "containerd-shim-runc-v2", "runc", "gcc")  # gcc: the pause image

IMAGE = "docker.io/library/vgpu-test:latest"
PAUSE = "registry.local/vgpu-test/pause:1"
MI = 1 << 20
#: The claim: 192Mi and 30 % of GPU 0, 320Mi and 20 % of GPU 1 (one two-vGPU slice).
AMOUNTS = ((192 * MI, 30, "0"), (320 * MI, 20, "1"))
#: Prints what the container sees of both vGPUs, then keeps it (and its use) alive.
PROBE_THEN_WAIT = ("cat /etc/ld.so.preload; vgpu_probe info device:1 info && "
                   "exec sleep 600")
#: The claims' namespace (their pods'), and another tenant's.
NAMESPACE = "team-a"
OTHER_NAMESPACE = "team-b"


class World:
    """containerd 1.6 + CRI, the `vgpu` handler, and a vgpud whose CDI dir is private."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cdi_dir = tmp / "cdi"
        (tmp / "vgpud").mkdir()
        self.sim, self.vgpud = simgpu_vgpud(tmp / "vgpud", {
            "hook": {"wait_s": 10},
            # The runc shim keeps CRI's containers under the k8s.io namespace's root.
            "reconcile": {"runtime_state_roots": ["/run/containerd/runc/k8s.io"]},
            "runtime": {"cdi_spec_dirs": [str(self.cdi_dir)]},
        }, devices="1Gi,1Gi")
        env = engine_env(vgpu_bin_dir(tmp / "bin"))
        point_at(env, self.vgpud)
        (tmp / "containerd").mkdir()
        self.containerd = CriContainerd(tmp / "containerd", env, PAUSE)
        self.cri: Cri | None = None

    def start(self) -> World:
        self.containerd.start_with_images(IMAGE)
        self.cri = Cri(self.containerd.socket)
        return self

    def stop(self) -> None:
        if self.cri is not None:
            with contextlib.suppress(grpc.RpcError):
                self.cri.remove_all()
            self.cri.close()
        self.containerd.stop()
        self.vgpud.close()

    def pod(self, name: str, annotations: dict[str, str], namespace: str = NAMESPACE) -> Pod:
        uid = str(uuid.uuid4())
        log_dir = self.tmp / "logs" / uid
        log_dir.mkdir(parents=True)
        assert self.cri is not None
        return self.cri.run_pod(PodSpec(name, uid, namespace=namespace,
                                        annotations=annotations, runtime_handler="vgpu",
                                        log_directory=str(log_dir)))

    def container(self, name: str, script: str, annotations: dict[str, str]) -> ContainerSpec:
        """A container of the test image that sees the simulated GPUs."""
        return ContainerSpec(name, IMAGE, ["sh", "-c", script],
                             envs={"SIMGPU_STATE": "/sim/simgpu.state"},
                             mounts=[(str(self.sim), "/sim", False)], annotations=annotations)

    def bundle_spec(self, container_id: str) -> dict[str, Any]:
        """The OCI spec containerd handed the runtime for a container or a sandbox."""
        path = (self.containerd.state / "io.containerd.runtime.v2.task" / "k8s.io"
                / container_id / "config.json")
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc

    def slices(self) -> list[pb.Slice]:
        return list(self.vgpud.stub.List(pb.ListRequest(), timeout=5).slices)


class Claim:
    """A claim prepared as vgpu-dra-plugin's NodePrepareResources prepares one."""

    def __init__(self, world: World, uid: str, name: str = "train") -> None:
        self.world = world
        self.uid = uid
        #: namespace/name, as the plugin labels the slice (dra.vgpu.io/claim).
        self.ref = f"{NAMESPACE}/{name}"
        self.slice = world.vgpud.stub.Allocate(pb.AllocateRequest(
            owner=f"vgpu.io/claim/{uid}", owner_kind="claim",
            labels={cdi.LABEL_CLAIM: self.ref, cdi.LABEL_UID: uid, cdi.LABEL_NODE: "node-1"},
            vgpus=[pb.VGpuRequest(memory_bytes=m, compute_percent=c, device=d)
                   for m, c, d in AMOUNTS]), timeout=10).slice
        spec = cdi.claim_spec(cdi.view_of_message(self.slice), name=uid, libvgpu=LIBVGPU,
                              hook=NATIVE_BIN / "vgpu-hook",
                              hook_env={"VGPU_SOCKET": str(world.vgpud.socket),
                                        "VGPU_CONFIG": str(world.vgpud.config_file)})
        self.path = cdi.write_spec(world.cdi_dir, uid, spec)
        #: What a kubelet up to 1.30 puts on the container (and a pod may set itself).
        self.key = f"{cdi.ANNOTATION_PREFIX}vgpu.io_{uid}"
        self.annotation = {self.key: cdi.device_id(uid)}

    def release(self) -> None:
        """What Unprepare does: the spec goes, then the slice (idempotent)."""
        cdi.remove_spec(self.world.cdi_dir, self.uid)
        with contextlib.suppress(grpc.RpcError):   # released already
            self.world.vgpud.stub.Release(pb.ReleaseRequest(id=self.slice.id), timeout=10)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("e2e-cri-cdi"))
    try:
        yield w.start()
    finally:
        w.stop()


@pytest.fixture
def claim(world):
    made: list[Claim] = []

    def make() -> Claim:
        made.append(Claim(world, str(uuid.uuid4())))
        return made[-1]
    yield make
    assert world.cri is not None
    world.cri.remove_all()
    for c in made:
        c.release()


def users_of(world: World, c: Claim) -> list[dict[str, Any]]:
    """The containers vgpud recorded as users of the claim's slice (once there is one)."""
    found: list[dict[str, Any]] = world.vgpud.wait_for(
        lambda: [u for u in world.vgpud.events("user.add") if u["slice"] == c.slice.id],
        what="the claim's user")
    return found


def infos(world: World, cid: str) -> tuple[list[str], list[dict[str, Any]]]:
    """The container's log lines and its probe's `info` lines, once both vGPUs are seen."""
    assert world.cri is not None
    path = world.cri.container_status(cid).log_path

    def seen() -> tuple[list[str], list[dict[str, Any]]] | None:
        lines = read_log(path).splitlines()
        got = [r for r in (json.loads(x) for x in lines if x.startswith("{"))
               if r["op"] == "info"]
        return (lines, got) if len(got) == len(AMOUNTS) else None
    found: tuple[list[str], list[dict[str, Any]]] = world.vgpud.wait_for(
        seen, timeout=30, what=f"the probe's output in {cid}")
    return found


def test_a_cdi_annotation_gives_the_container_the_claim_s_slice_and_the_sandbox_none(
        world, claim):
    c = claim()
    pod = world.pod("claim", c.annotation)
    assert world.cri is not None
    cid = world.cri.create_container(pod, world.container("app", PROBE_THEN_WAIT,
                                                          c.annotation))
    world.cri.start_container(cid)
    lines, seen = infos(world, cid)
    assert lines[0] == "/usr/lib/vgpu/libvgpu.so"
    assert [i["total"] for i in seen] == [m for m, _, _ in AMOUNTS]
    # The handler applied the spec's edits to the container, and the claim's hook ran
    # for it: one user of the slice, the app container (its bundle).
    app = world.bundle_spec(cid)
    assert app["annotations"].items() >= c.annotation.items()
    assert [h["args"] for h in app["hooks"]["createRuntime"]
            if h["path"] == str(NATIVE_BIN / "vgpu-hook")] == [
        ["vgpu-hook", cdi.HOOK_COMMAND, c.slice.id]]
    assert [(u["slice"], Path(u["bundle"]).name) for u in users_of(world, c)] == [
        (c.slice.id, cid)]
    # The sandbox carries the pod's annotation and is left as containerd made it.
    sandbox = world.bundle_spec(pod.id)
    assert sandbox["annotations"].items() >= c.annotation.items()
    text = json.dumps(sandbox)
    assert "vgpu-hook" not in text and "/dev/vgpu" not in text and "VGPU_" not in text
    # Removing the pod leaves the claim its slice: only the plugin releases it.
    world.cri.remove_pod(pod)
    assert [(s.id, s.owner_kind) for s in world.slices()] == [(c.slice.id, "claim")]
    c.release()
    assert world.slices() == []


def test_after_the_release_a_container_naming_the_claim_fails_with_one_line(world, claim):
    c = claim()
    c.release()
    pod = world.pod("released", {})
    assert world.cri is not None
    cid = world.cri.create_container(pod, world.container("app", "echo must-not-run",
                                                          c.annotation))
    with pytest.raises(grpc.RpcError) as err:
        world.cri.start_container(cid)
    details = err.value.details()
    assert (f"vgpu: failed to resolve the CDI device {cdi.device_id(c.uid)}: no spec in "
            f"{world.cdi_dir} (is the claim prepared on this node?)") in details, details
    assert "\n" not in details
    assert world.cri.container_status(cid).state != api.CONTAINER_RUNNING
    assert world.slices() == []


def test_a_pod_of_another_namespace_naming_the_claim_fails_with_one_line(world, claim):
    """The claim's pod runs; a pod in another namespace that sets the claim's CDI annotation
    itself (a pod annotation: containerd passes `cdi.k8s.io/*` on) fails to start with one
    line, the claim records no user for it, and the claim's own container runs on."""
    c = claim()
    assert world.cri is not None
    pod = world.pod("claim", c.annotation)
    cid = world.cri.create_container(pod, world.container("app", PROBE_THEN_WAIT,
                                                          c.annotation))
    world.cri.start_container(cid)
    infos(world, cid)
    thief = world.pod("thief", c.annotation, namespace=OTHER_NAMESPACE)
    tid = world.cri.create_container(thief, world.container("app", "echo must-not-run", {}))
    with pytest.raises(grpc.RpcError) as err:
        world.cri.start_container(tid)
    details = err.value.details()
    assert (f"vgpu: failed to use the CDI device {cdi.device_id(c.uid)} of annotation "
            f"{c.key}: claim {c.ref} is not this pod's (the pod is in namespace "
            f"{OTHER_NAMESPACE})") in details, details
    assert "\n" not in details
    assert world.cri.container_status(tid).state != api.CONTAINER_RUNNING
    # Refused before runc ran: no hook, so the claim's one user is its own container.
    assert [Path(u["bundle"]).name for u in users_of(world, c)] == [cid]
    assert world.cri.container_status(cid).state == api.CONTAINER_RUNNING
    assert [(s.id, s.owner_kind) for s in world.slices()] == [(c.slice.id, "claim")]
