# SPDX-License-Identifier: Apache-2.0
"""End to end with Podman and CDI.

The last test runs the whole DRA path through the plugin. The first two make by hand what
it makes, to pin the spec's parts: a claim's slice in vgpud (gRPC Allocate, owner kind
`claim`), its CDI spec written with oci_hook.cdi into /var/run/cdi (where Podman reads
specs), `podman run --device vgpu.io/claim=<name>`: no hooks.d, no runtime, no
annotation: Podman applies the spec (mounts, device nodes, env) and runs its
createRuntime hook, `vgpu-hook claim`. A CUDA client inside sees exactly the claim's
memory limit. After the release (the spec removed, the slice released, as Unprepare
does) a new run with that device fails cleanly.

Podman runs as in test_e2e_podman.py (private storage, cgroupfs, runc). Specs and slices
are removed even when a test fails.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
import pytest
from support.engines import require, simulated_host
from support.fake_apiserver import FakeApiServer, result
from support.fake_apiserver import claim as fake_claim
from support.fake_kubelet import FakeKubelet
from support.fake_kubelet_dra import DraKubelet
from support.images import build_tarball
from support.paths import LIBVGPU, NATIVE_BIN, ROOT
from support.prereq import require as require_that
from support.process import clean_env
from support.vgpud_harness import Vgpud, pb
from test_e2e_podman import IMAGE, Podman

from oci_hook import cdi

require("podman", "conmon", "runc")
require_that(os.geteuid() == 0, "podman with CDI needs root here")

MI = 1 << 20
CDI_DIR = cdi.SPEC_DIRS[-1]   # /var/run/cdi


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e-cdi-podman")
    sim, vgpud = simulated_host(tmp, ["/run/runc"])
    hooks_dir = tmp / "hooks.d"      # empty: no hooks.d file, CDI alone
    hooks_dir.mkdir()
    runroot = Path(tempfile.mkdtemp(prefix="vgpu-podman-"))
    podman = Podman(tmp / "podman", runroot, hooks_dir)
    vgpud.start()
    try:
        podman("import", str(build_tarball(tmp / "rootfs.tar")), IMAGE)
        yield podman, vgpud, sim
    finally:
        podman("rm", "--all", "--force", "--time", "0", check=False)
        vgpud.close()
        shutil.rmtree(runroot, ignore_errors=True)


class Claim:
    """A claim prepared as the DRA plugin prepares one: a claim slice and its CDI spec."""

    def __init__(self, vgpud: Vgpud, uid: str, memory: int, compute: int) -> None:
        self.vgpud = vgpud
        self.name = f"{uid}-{os.getpid()}"
        self.slice = vgpud.stub.Allocate(pb.AllocateRequest(
            owner=uid, owner_kind="claim", memory_bytes=memory, compute_percent=compute),
            timeout=10).slice
        spec = cdi.claim_spec(cdi.view_of_message(self.slice), name=self.name, libvgpu=LIBVGPU,
                              hook=NATIVE_BIN / "vgpu-hook",
                              hook_env={"VGPU_SOCKET": str(vgpud.socket),
                                        "VGPU_CONFIG": str(vgpud.config_file)})
        self.path = cdi.write_spec(CDI_DIR, self.name, spec)

    def release(self) -> None:
        """What Unprepare does: the spec goes, then the slice."""
        cdi.remove_spec(CDI_DIR, self.name)
        self.vgpud.stub.Release(pb.ReleaseRequest(id=self.slice.id), timeout=10)


@pytest.fixture
def claim(world):
    _, vgpud, _ = world
    made: list[Claim] = []

    def make(uid: str, memory: int, compute: int = 30) -> Claim:
        made.append(Claim(vgpud, uid, memory, compute))
        return made[-1]
    yield make
    for c in made:
        cdi.remove_spec(CDI_DIR, c.name)
        with contextlib.suppress(grpc.RpcError):  # released by the test already
            c.release()


def run(podman: Podman, sim: Path, device: str, script: str, check: bool = True):
    return podman("run", "--rm", "--network", "none",
                  "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                  "--device", device, "-v", f"{sim}:/sim", "-e", "SIMGPU_STATE=/sim/simgpu.state",
                  IMAGE, "/bin/sh", "-c", script, check=check)


def test_a_cdi_device_gives_the_container_exactly_the_claim_s_slice(world, claim):
    podman, vgpud, sim = world
    c = claim("claim-a", 300 * MI)
    p = run(podman, sim, cdi.device_id(c.name),
            "cat /etc/ld.so.preload; grep ' /dev/vgpu0 ' /proc/mounts; vgpu_probe info")
    lines = p.stdout.splitlines()
    assert lines[0] == "/usr/lib/vgpu/libvgpu.so"
    assert " ro," in lines[1], "the region is read-only inside"
    info = next(json.loads(x) for x in lines if x.startswith("{") and '"info"' in x)
    assert info["total"] == 300 * MI
    # The claim still holds its slice after the container is gone.
    assert [s.id for s in vgpud.stub.List(pb.ListRequest(), timeout=5).slices
            if s.id == c.slice.id] == [c.slice.id]


def test_after_the_release_the_device_fails_cleanly(world, claim):
    podman, vgpud, sim = world
    c = claim("claim-b", 128 * MI)
    assert run(podman, sim, cdi.device_id(c.name), "vgpu_probe info").returncode == 0
    c.release()
    assert not c.path.exists()
    assert not [s for s in vgpud.stub.List(pb.ListRequest(), timeout=5).slices
                if s.id == c.slice.id]
    p = run(podman, sim, cdi.device_id(c.name), "true", check=False)
    assert p.returncode != 0
    assert cdi.device_id(c.name) in p.stderr and "unresolvable" in p.stderr.lower(), p.stderr


def test_the_dra_plugin_s_prepared_claim_under_podman(world, tmp_path, short_tmp):
    """The whole DRA path: the plugin (a real process, registered with a fake kubelet,
    reading the claim from a fake API server) prepares the claim into vgpud and the CDI
    dir Podman reads; `podman run --device <the id it answered>` gets exactly the claim's
    limit; Unprepare releases the slice and the spec, and the device then fails cleanly."""
    podman, vgpud, sim = world
    api = FakeApiServer().start()
    kubelet = DraKubelet(short_tmp / "kubelet").start()
    env = clean_env()
    env["PYTHONPATH"] = str(ROOT)
    log = tmp_path / "plugin.log"
    with open(log, "wb") as out:
        plugin = subprocess.Popen(
            [sys.executable, "-m", "vgpu_k8s.dra.main", "--node-name", "node-a",
             "--kubelet-dir", str(kubelet.dir), "--cdi-dir", str(CDI_DIR),
             "--socket", str(vgpud.socket), "--kubeconfig",
             str(api.kubeconfig(tmp_path / "kubeconfig")), "--poll-interval", "0.2"],
            env=env, cwd=ROOT, stdout=out, stderr=out)
    uid = ""
    try:
        registered = kubelet.wait_registered("vgpu.io")
        obj = api.add_claim(fake_claim("default", "podman-claim", [
            result("gpu", "gpu-0", "node-a", memory="320Mi", compute="30")], node="node-a"))
        uid = obj["metadata"]["uid"]
        ref = [("default", "podman-claim", uid)]
        answer = registered.prepare(ref)[uid]
        assert answer.error == "", log.read_text()
        [device] = answer.devices
        assert list(device.request_names) == ["gpu"] and device.device_name == "gpu-0"
        [cdi_id] = device.cdi_device_ids
        p = run(podman, sim, cdi_id, "vgpu_probe info")
        info = next(json.loads(x) for x in p.stdout.splitlines()
                    if x.startswith("{") and '"info"' in x)
        assert info["total"] == 320 * MI
        assert registered.unprepare(ref)[uid].error == ""
        assert not [s for s in vgpud.stub.List(pb.ListRequest(), timeout=5).slices
                    if s.owner_kind == "claim"]
        p = run(podman, sim, cdi_id, "true", check=False)
        assert p.returncode != 0 and cdi_id in p.stderr, p.stderr
    finally:
        plugin.terminate()
        plugin.wait(timeout=30)
        kubelet.stop()
        api.stop()
        for spec in CDI_DIR.glob(f"vgpu.io-claim_{uid or 'none'}*.json"):
            spec.unlink()


def test_the_device_plugin_s_cdi_devices_under_podman(world, tmp_path):
    """vgpu-device-plugin --cdi (a real process, registered with a fake kubelet): the CDI
    devices its Allocate answers for memory and for compute, given to `podman run --device`
    (no hooks.d, no runtime, no annotation), make one slice with that memory and that
    compute, mounted by the memory device's vgpu-hook; its poststop releases the slice."""
    podman, vgpud, sim = world
    kubelet = FakeKubelet(tmp_path / "device-plugins").start()
    env = dict(clean_env(), PYTHONPATH=str(ROOT))
    log = tmp_path / "plugin.log"
    with open(log, "wb") as out:
        plugin = subprocess.Popen(
            [sys.executable, "-m", "vgpu_k8s.deviceplugin.main", "--kubelet-dir",
             str(kubelet.dir), "--socket", str(vgpud.socket), "--memory-unit", "64Mi",
             "--poll-interval", "0.2", "--cdi", "--cdi-dir", str(CDI_DIR),
             "--nvidia-cdi-dir", ""], env=env, cwd=ROOT, stdout=out, stderr=out)
    names: list[str] = []
    try:
        mem = kubelet.wait_registered("vgpu.io/memory")
        comp = kubelet.wait_registered("vgpu.io/compute")
        FakeKubelet.wait_devices(comp, lambda d: len(d) > 0, "compute devices")
        FakeKubelet.wait_devices(mem, lambda d: len(d) > 0, "memory devices")
        gpu = vgpud.stub.Devices(pb.DevicesRequest(), timeout=5).devices[0]
        ids = [i for i in mem.devices if i.startswith(gpu.uuid)][:5]
        [m] = mem.allocate(ids).container_responses
        [c] = comp.allocate([i for i in comp.devices][:37]).container_responses
        devices = [d.name for d in m.cdi_devices] + [d.name for d in c.cdi_devices]
        assert devices == [f"vgpu.io/vgpu=memory-320Mi-{gpu.uuid}", "vgpu.io/vgpu=compute-37"]
        names = [d.partition("=")[2] for d in devices]
        before = len(vgpud.events("allocate"))
        p = podman("run", "--rm", "--network", "none",
                   "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                   *(a for d in devices for a in ("--device", d)),
                   "-v", f"{sim}:/sim", "-e", "SIMGPU_STATE=/sim/simgpu.state",
                   IMAGE, "/bin/sh", "-c",
                   "cat /etc/ld.so.preload; echo $CUDA_VISIBLE_DEVICES; vgpu_probe info")
        lines = p.stdout.splitlines()
        assert lines[:2] == ["/usr/lib/vgpu/libvgpu.so", gpu.uuid], p.stdout
        info = next(json.loads(x) for x in lines if x.startswith("{") and '"info"' in x)
        assert info["total"] == 320 * MI
        [event] = vgpud.events("allocate")[before:]
        assert [(g["memory"], g["compute"]) for g in event["grants"]] == [(320 * MI, 37)]
        # poststop gave it back: no container slice is left.
        assert not [s for s in vgpud.stub.List(pb.ListRequest(), timeout=5).slices
                    if s.owner_kind != "claim"]
    finally:
        plugin.terminate()
        plugin.wait(timeout=30)
        kubelet.stop()
        for name in names:
            cdi.spec_path(CDI_DIR, name, cdi.REQUEST_KIND).unlink(missing_ok=True)
