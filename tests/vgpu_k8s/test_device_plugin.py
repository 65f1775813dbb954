# SPDX-License-Identifier: Apache-2.0
"""vgpu-device-plugin end to end: a real plugin process, a real vgpud on simgpu, and a fake
kubelet (a real gRPC Registration server on a unix socket that dials the plugin's sockets
and watches its device lists, as the kubelet's device manager does)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.fake_kubelet import FakeKubelet
from support.paths import ROOT, SIMGPU_DIR, TEST_BIN
from support.process import clean_env
from support.vgpud_harness import pb, simgpu_vgpud

MEMORY, COMPUTE = "vgpu.io/memory", "vgpu.io/compute"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


class DevicePlugin:
    """One vgpu-device-plugin process (python -m, this checkout); start()/stop() repeat."""

    def __init__(self, kubelet_dir: Path, vgpud_socket: Path, log: Path, *extra: str) -> None:
        self.log_path = log
        self.command = [sys.executable, "-m", "vgpu_k8s.deviceplugin.main",
                        "--kubelet-dir", str(kubelet_dir), "--socket", str(vgpud_socket),
                        "--poll-interval", "0.2", *extra]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = clean_env()
        env["PYTHONPATH"] = str(ROOT)
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command, env=env, cwd=ROOT, stdout=log,
                                         stderr=log)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Node:
    """vgpud on two simulated GPUs (4Gi, 2Gi), a fake kubelet and the plugin."""

    def __init__(self, tmp: Path) -> None:
        self.sim, self.vgpud = simgpu_vgpud(tmp, {}, devices="4Gi,2Gi")
        self.kubelet = FakeKubelet(tmp / "device-plugins").start()
        self.plugin = DevicePlugin(self.kubelet.dir, self.vgpud.socket, tmp / "plugin.log",
                                   "--vgpud-grace", "1")
        self.gpus = list(self.vgpud.stub.Devices(pb.DevicesRequest(), timeout=5).devices)

    def simgpu(self, *args: str) -> None:
        env = clean_env()
        env["SIMGPU_STATE"] = str(self.sim / "simgpu.state")
        env["LD_LIBRARY_PATH"] = str(SIMGPU_DIR)
        subprocess.run([str(TEST_BIN / "simgpu_ctl"), *args], env=env, check=True, timeout=10)

    def ids(self, resource: str, gpu: int) -> list[str]:
        infix = "mem" if resource == MEMORY else "compute"
        plugin = self.kubelet.plugins[resource]
        prefix = f"{self.gpus[gpu].uuid}-{infix}-"
        return sorted((i for i in plugin.devices if i.startswith(prefix)),
                      key=lambda i: int(i.rsplit("-", 1)[1]))

    def close(self) -> None:
        self.plugin.close()
        self.kubelet.stop()
        self.vgpud.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    try:
        n.plugin.start()
        yield n
    finally:
        n.close()


def registered(node: Node, count: int = 1) -> tuple:
    mem = node.kubelet.wait_registered(MEMORY, count)
    comp = node.kubelet.wait_registered(COMPUTE, count)
    for p, n in ((mem, 16 + 8), (comp, 200)):
        FakeKubelet.wait_devices(p, lambda d, n=n: len(d) == n, f"{n} devices")
    return mem, comp


def test_registers_both_resources_and_lists_ids_that_name_their_gpu(node: Node):
    mem, comp = registered(node)
    assert (mem.request.version, mem.request.endpoint) == ("v1beta1", "vgpu-memory.sock")
    assert (comp.request.version, comp.request.endpoint) == ("v1beta1", "vgpu-compute.sock")
    assert mem.request.options.get_preferred_allocation_available
    assert not comp.request.options.get_preferred_allocation_available
    assert not mem.request.options.pre_start_required
    assert mem.stub.GetDevicePluginOptions(pb_empty(), timeout=5) == mem.request.options
    # 256Mi per memory ID: 4Gi -> 16, 2Gi -> 8; 100 compute IDs per GPU.
    assert node.ids(MEMORY, 0) == [f"{node.gpus[0].uuid}-mem-{n}" for n in range(16)]
    assert node.ids(MEMORY, 1) == [f"{node.gpus[1].uuid}-mem-{n}" for n in range(8)]
    assert len(node.ids(COMPUTE, 0)) == len(node.ids(COMPUTE, 1)) == 100
    assert set(mem.devices.values()) == set(comp.devices.values()) == {HEALTHY}
    assert all(len(i) <= 63 for i in [*mem.devices, *comp.devices])


def pb_empty():
    from support.fake_kubelet import api
    return api.Empty()


def test_a_lost_gpu_turns_its_devices_unhealthy_and_back(node: Node):
    mem, comp = registered(node)
    node.simgpu("lose", "1")
    lost = set(node.ids(MEMORY, 1))

    def gpu1_down(d: dict[str, str]) -> bool:
        return all((h == UNHEALTHY) == (i in lost) for i, h in d.items())
    FakeKubelet.wait_devices(mem, gpu1_down, "GPU 1's memory IDs Unhealthy, GPU 0's Healthy")
    FakeKubelet.wait_devices(
        comp, lambda d: {d[i] for i in node.ids(COMPUTE, 1)} == {UNHEALTHY}
        and {d[i] for i in node.ids(COMPUTE, 0)} == {HEALTHY}, "GPU 1's compute IDs Unhealthy")
    # vgpud says why, in NVML's words.
    devices = node.vgpud.stub.Devices(pb.DevicesRequest(), timeout=5).devices
    assert [d.unhealthy for d in devices] == ["", "GPU is lost"]
    node.simgpu("restore", "1")
    FakeKubelet.wait_devices(mem, lambda d: set(d.values()) == {HEALTHY}, "all Healthy again")


def test_allocate_turns_ids_into_annotations_per_container(node: Node):
    mem, comp = registered(node)
    g0, g1 = node.ids(MEMORY, 0), node.ids(MEMORY, 1)
    reply = mem.allocate(g0[:2], g1[3:6])
    assert [dict(c.annotations) for c in reply.container_responses] == [
        {MEMORY: "512Mi", "vgpu.io/devices": node.gpus[0].uuid},
        {MEMORY: "768Mi", "vgpu.io/devices": node.gpus[1].uuid}]
    assert all(not c.envs and not c.mounts and not c.devices for c in reply.container_responses)
    reply = comp.allocate(node.ids(COMPUTE, 1)[:30], [])
    assert [dict(c.annotations) for c in reply.container_responses] == [
        {COMPUTE: "30"}, {}]


@pytest.mark.parametrize(("resource", "pick", "says"), [
    (MEMORY, lambda n: n.ids(MEMORY, 0)[:1] + n.ids(MEMORY, 1)[:1], "the IDs span 2 GPUs"),
    (MEMORY, lambda n: ["GPU-x-compute-1"], "is not a vgpu.io/memory device ID"),
    (COMPUTE, lambda n: n.ids(COMPUTE, 0)[:1], "the compute share must be a percent from 2"),
], ids=["memory-across-gpus", "foreign-id", "compute-below-2"])
def test_allocate_refuses_with_one_line(node: Node, resource, pick, says):
    registered(node)
    with pytest.raises(grpc.RpcError) as e:
        node.kubelet.plugins[resource].allocate(pick(node))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in e.value.details() and "\n" not in e.value.details()
    assert e.value.details().startswith(f"failed to allocate {resource} ")


def test_preferred_allocation_packs_memory_onto_one_gpu(node: Node):
    mem, _ = registered(node)
    g0, g1 = node.ids(MEMORY, 0), node.ids(MEMORY, 1)
    # Best fit: 6 units fit on both; GPU 1 has fewer free (8 < 16), so GPU 1.
    assert mem.preferred(g0 + g1, 6) == g1[:6]
    # 10 units only fit on GPU 0.
    assert mem.preferred(g1 + g0, 10) == g0[:10]
    # must_include pins the GPU.
    assert mem.preferred(g0 + g1, 3, must_include=[g0[5]]) == [g0[5], *g0[:2]]


def test_reregisters_after_a_kubelet_restart(node: Node):
    registered(node)
    node.kubelet.restart()
    mem, _ = registered(node, count=2)
    assert mem.allocate(node.ids(MEMORY, 0)[:1]).container_responses[0].annotations[MEMORY] \
        == "256Mi"


def test_sigterm_removes_the_sockets_and_a_new_plugin_registers(node: Node):
    registered(node)
    sockets = [node.kubelet.dir / "vgpu-memory.sock", node.kubelet.dir / "vgpu-compute.sock"]
    assert all(s.exists() for s in sockets)
    assert node.plugin.stop(signal.SIGTERM) == 0, node.plugin.log()
    assert not any(s.exists() for s in sockets)
    assert node.kubelet.socket.exists()
    node.plugin.start()
    registered(node, count=2)


def test_a_storm_of_sigterms_still_stops_it_cleanly(node: Node):
    """Its handler set the Event the main loop waits on: a SIGTERM that came while the
    loop, or the handler of the one before, held that Event's lock waited for it forever.
    Now the handlers take no lock and a thread sets the Event (arbiter.signals)."""
    import os
    registered(node)
    sockets = [node.kubelet.dir / "vgpu-memory.sock", node.kubelet.dir / "vgpu-compute.sock"]
    proc = node.plugin.proc
    assert proc is not None
    for _ in range(500):
        os.kill(proc.pid, signal.SIGTERM)
    # It stops cleanly; one of the burst that comes during the interpreter's teardown (which
    # gives SIGTERM back its default action) may end it with that signal after its stop.
    assert proc.wait(timeout=20) in (0, -signal.SIGTERM), node.plugin.log()
    assert "stopped" in node.plugin.log()
    assert not any(s.exists() for s in sockets)


def test_vgpud_restart_turns_devices_unhealthy_after_the_grace_then_back(node: Node):
    mem, _ = registered(node)
    before = dict(mem.devices)
    node.vgpud.stop()
    FakeKubelet.wait_devices(mem, lambda d: set(d.values()) == {UNHEALTHY},
                             "every device Unhealthy once vgpud is gone for 1 s")
    node.vgpud.start()
    after = FakeKubelet.wait_devices(mem, lambda d: set(d.values()) == {HEALTHY},
                                     "Healthy again once vgpud answers")
    assert after == before   # same GPUs, same IDs
    assert "every device Unhealthy" in node.plugin.log()


def test_bad_memory_unit_is_one_line(tmp_path: Path):
    p = DevicePlugin(tmp_path, tmp_path / "vgpud.sock", tmp_path / "log", "--memory-unit", "lots")
    p.start()
    assert p.proc is not None and p.proc.wait(timeout=20) == 2
    lines = p.log().strip().splitlines()
    assert lines == ["vgpu-device-plugin: --memory-unit=lots: invalid memory quantity 'lots': "
                     "expected an integer with an optional suffix Ki, Mi, Gi, Ti, K, M, G or T "
                     "(no suffix = MiB)"]


def test_a_kubelet_dir_too_long_for_a_socket_is_one_line(tmp_path: Path):
    """gRPC cannot bind a unix socket past 107 bytes of path: said before anything starts."""
    deep = "/" + "k" * 100
    p = DevicePlugin(tmp_path, tmp_path / "vgpud.sock", tmp_path / "log", "--kubelet-dir", deep)
    p.start()
    assert p.proc is not None and p.proc.wait(timeout=20) == 2
    assert p.log().strip().splitlines() == [
        f"vgpu-device-plugin: --kubelet-dir={deep}: puts the socket {deep}/vgpu-memory.sock "
        "at 118 bytes, and a unix socket's path holds at most 107"]
    assert not Path(deep).exists()


def test_waits_for_the_kubelet_and_for_vgpud_before_registering(tmp_path: Path):
    n = Node(tmp_path)
    try:
        n.kubelet.stop()
        n.vgpud.stop()
        n.plugin.start()
        # No list from vgpud yet: nothing served (the kubelet would see zero devices).
        with pytest.raises(AssertionError):
            n.kubelet.wait_registered(MEMORY, timeout=1)
        assert not (n.kubelet.dir / "vgpu-memory.sock").exists()
        n.vgpud.start()
        n.kubelet.start()          # the kubelet comes up last
        registered(n)
        assert n.plugin.proc is not None and n.plugin.proc.poll() is None
    finally:
        n.close()


def test_a_surge_update_hands_the_sockets_to_the_newer_plugin_without_a_fight(node: Node,
                                                                              tmp_path: Path):
    """Two plugins on one kubelet dir (a DaemonSet's maxSurge update): the newer takes the
    sockets and registers once; the older stands aside while the newer answers (it does not
    take the paths back, so there is no re-registration loop) and keeps running; when the
    newer goes away first, the older serves and registers again."""
    import os
    import time
    registered(node)
    sockets = [node.kubelet.dir / "vgpu-memory.sock", node.kubelet.dir / "vgpu-compute.sock"]
    older = node.plugin
    newer = DevicePlugin(node.kubelet.dir, node.vgpud.socket, tmp_path / "newer.log",
                         "--vgpud-grace", "1")
    newer.start()
    try:
        mem, _ = registered(node, count=2)
        time.sleep(0.5)
        settled = [r.resource_name for r in node.kubelet.registrations].count(MEMORY)
        inodes = [os.stat(s).st_ino for s in sockets]
        time.sleep(3)   # 15 of the older plugin's ticks: nobody registers or serves anew
        assert [r.resource_name for r in node.kubelet.registrations].count(MEMORY) \
            == settled <= 3, older.log() + newer.log()
        assert [os.stat(s).st_ino for s in sockets] == inodes
        assert older.proc is not None and older.proc.poll() is None
        assert "standing aside while it answers" in older.log()
        # The kubelet's connection is the newer one's, and it answers.
        reply = mem.allocate(node.ids(MEMORY, 0)[:2])
        assert reply.container_responses[0].annotations[MEMORY] == "512Mi"
        assert not mem.stream_ended
        # The newer goes (a rollback, or it failed): the older takes over again.
        assert newer.stop(signal.SIGTERM) == 0, newer.log()
        mem, _ = registered(node, count=3)
        assert all(s.exists() for s in sockets)
        assert "serving and registering again" in older.log()
        assert mem.allocate(node.ids(MEMORY, 1)[:1]).container_responses[0].annotations[
            MEMORY] == "256Mi"
    finally:
        newer.close()
    # The older one's own stop leaves no file behind it.
    assert older.stop(signal.SIGTERM) == 0
    assert not any(s.exists() for s in sockets)


def test_with_cdi_allocate_answers_cdi_devices_and_writes_their_specs(tmp_path: Path):
    """--cdi: no annotation; one vgpu.io/vgpu device per answer, its spec written once in
    --cdi-dir; NVIDIA's device of the GPU beside it where its spec (YAML, as nvidia-ctk
    writes it) names that GPU by UUID or index."""
    n = Node(tmp_path)
    cdi_dir, nvidia_dir = tmp_path / "cdi", tmp_path / "nvidia-cdi"
    nvidia_dir.mkdir()
    (nvidia_dir / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        f"  - name: '0'\n    containerEdits: {{}}\n"
        f"  - name: {n.gpus[0].uuid}\n    containerEdits: {{}}\n"
        "  - name: all\n    containerEdits: {}\n")
    n.plugin.command += ["--cdi", "--cdi-dir", str(cdi_dir), "--nvidia-cdi-dir", str(nvidia_dir)]
    try:
        n.plugin.start()
        mem, comp = registered(n)
        reply = mem.allocate(n.ids(MEMORY, 0)[:2], n.ids(MEMORY, 1)[:1])
        u0, u1 = n.gpus[0].uuid, n.gpus[1].uuid
        assert [[d.name for d in c.cdi_devices] for c in reply.container_responses] == [
            [f"vgpu.io/vgpu=memory-512Mi-{u0}", f"nvidia.com/gpu={u0}"],
            [f"vgpu.io/vgpu=memory-256Mi-{u1}"]]   # the toolkit's spec does not name GPU 1
        assert all(not c.annotations for c in reply.container_responses)
        reply = comp.allocate(n.ids(COMPUTE, 1)[:30])
        assert [d.name for d in reply.container_responses[0].cdi_devices] == [
            "vgpu.io/vgpu=compute-30"]
        assert sorted(p.name for p in cdi_dir.iterdir()) == [
            "vgpu.io-vgpu_compute-30.json", f"vgpu.io-vgpu_memory-256Mi-{u1}.json",
            f"vgpu.io-vgpu_memory-512Mi-{u0}.json"]
        spec = json.loads((cdi_dir / f"vgpu.io-vgpu_memory-512Mi-{u0}.json").read_text())
        health = n.vgpud.stub.Health(pb.HealthRequest(), timeout=5)
        [hook, _] = spec["devices"][0]["containerEdits"]["hooks"]
        assert hook["path"] == health.paths["hook"]
        assert hook["args"][2:] == ["vgpu.io/memory=512Mi", f"vgpu.io/devices={u0}"]
        # The same answer again rewrites nothing.
        before = (cdi_dir / "vgpu.io-vgpu_compute-30.json").stat().st_mtime_ns
        comp.allocate(n.ids(COMPUTE, 0)[:30])
        assert (cdi_dir / "vgpu.io-vgpu_compute-30.json").stat().st_mtime_ns == before
    finally:
        n.close()


def test_cdi_dir_must_be_absolute(tmp_path: Path):
    p = subprocess.run([sys.executable, "-m", "vgpu_k8s.deviceplugin.main", "--cdi",
                        "--cdi-dir", "run/cdi"], capture_output=True, text=True, cwd=ROOT,
                       env=dict(clean_env(), PYTHONPATH=str(ROOT)), timeout=60)
    assert (p.returncode, p.stderr) == (
        2, "vgpu-device-plugin: --cdi-dir=run/cdi: must be an absolute directory\n")
