# SPDX-License-Identifier: Apache-2.0
"""vgpu-dra-plugin end to end: a real plugin process, a real vgpud on simgpu, a fake
kubelet (plugin watcher + DRA calls over real gRPC on unix sockets, API v1 and v1beta1)
and a fake API server (real HTTP; the official kubernetes client talks to it through a
kubeconfig; resource.k8s.io/v1 objects)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fake_apiserver import FakeApiServer, claim, result
from support.fake_kubelet_dra import DraKubelet
from support.paths import ROOT, SIMGPU_DIR, TEST_BIN
from support.process import clean_env
from support.vgpud_harness import pb, simgpu_vgpud

NODE = "node-a"
DRIVER = "vgpu.io"
GI, MI = 1 << 30, 1 << 20


class DraPluginProc:
    """One vgpu-dra-plugin process (python -m, this checkout); start()/stop() repeat."""

    def __init__(self, node: Node, *extra: str) -> None:
        self.log_path = node.tmp / "plugin.log"
        self.command = [sys.executable, "-m", "vgpu_k8s.dra.main", "--node-name", NODE,
                        "--kubelet-dir", str(node.kubelet.dir), "--cdi-dir", str(node.cdi),
                        "--socket", str(node.vgpud.socket), "--kubeconfig",
                        str(node.kubeconfig), "--poll-interval", "0.2", *extra]
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

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Node:
    """vgpud on two simulated GPUs (4Gi, 8Gi), a fake API server and kubelet (its dir
    under `short`: the plugin's sockets go there), the plugin."""

    def __init__(self, tmp: Path, short: Path) -> None:
        self.tmp = tmp
        self.sim, self.vgpud = simgpu_vgpud(tmp, {}, devices="4Gi,8Gi")
        self.api = FakeApiServer().start()
        self.kubeconfig = self.api.kubeconfig(tmp / "kubeconfig")
        self.kubelet = DraKubelet(short / "kubelet").start()
        self.cdi = tmp / "cdi"
        self.plugin = DraPluginProc(self)
        self.gpus = list(self.vgpud.stub.Devices(pb.DevicesRequest(), timeout=5).devices)

    @property
    def checkpoint(self) -> Path:
        return self.kubelet.dir / "plugins" / DRIVER / "checkpoint.json"

    def claim(self, name: str, *results: dict[str, Any]) -> tuple[str, str, str]:
        obj = self.api.add_claim(claim("default", name, results, node=NODE))
        return ("default", name, obj["metadata"]["uid"])

    def claim_slices(self) -> list[Any]:
        return [s for s in self.vgpud.stub.List(pb.ListRequest(), timeout=5).slices
                if s.owner_kind == "claim"]

    def slice_of(self, uid: str) -> Any:
        found = [s for s in self.claim_slices() if s.labels.get("dra.vgpu.io/claim-uid") == uid]
        assert len(found) <= 1, found
        return found[0] if found else None

    def spec(self, uid: str) -> Path:
        return self.cdi / f"vgpu.io-claim_{uid}.json"

    def simgpu(self, *args: str) -> None:
        env = clean_env()
        env["SIMGPU_STATE"] = str(self.sim / "simgpu.state")
        env["LD_LIBRARY_PATH"] = str(SIMGPU_DIR)
        subprocess.run([str(TEST_BIN / "simgpu_ctl"), *args], env=env, check=True, timeout=10)

    def registered(self, count: int = 1) -> Any:
        plugin = self.kubelet.wait_registered(DRIVER, count)
        self.published(lambda devs: len(devs) == 2, "both GPUs published")
        return plugin

    def published(self, predicate: Any, what: str) -> list[dict[str, Any]]:
        """The devices of the node's one slice once predicate(devices) holds."""
        slices = self.api.wait_slices(
            lambda ss: len(ss) == 1 and predicate(ss[0]["spec"]["devices"]), what)
        return slices[0]["spec"]["devices"]

    def close(self) -> None:
        self.plugin.close()
        self.kubelet.stop()
        self.api.stop()
        self.vgpud.close()


@pytest.fixture
def node(tmp_path: Path, short_tmp: Path) -> Iterator[Node]:
    n = Node(tmp_path, short_tmp)
    try:
        n.plugin.start()
        yield n
    finally:
        n.close()


@pytest.fixture
def bare_node(tmp_path: Path, short_tmp: Path) -> Iterator[Node]:
    """A node whose plugin the test starts (with its own flags)."""
    n = Node(tmp_path, short_tmp)
    try:
        yield n
    finally:
        n.close()


def devices_of(answer: Any) -> list[tuple[list[str], str, str, list[str]]]:
    return [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
            for d in answer.devices]


def test_registers_and_publishes_one_shareable_device_per_gpu(node: Node):
    plugin = node.registered()
    info = plugin.info
    assert (info.type, info.name) == ("DRAPlugin", DRIVER)
    assert info.endpoint == str(node.kubelet.dir / "plugins" / DRIVER / "dra.sock")
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert (node.kubelet.registry / "vgpu.io-reg.sock").is_socket()
    [s] = node.api.slices()
    assert s["apiVersion"] == "resource.k8s.io/v1" and s["kind"] == "ResourceSlice"
    spec = s["spec"]
    assert (spec["driver"], spec["nodeName"]) == (DRIVER, NODE)
    assert spec["pool"]["name"] == NODE and spec["pool"]["resourceSliceCount"] == 1
    assert spec["pool"]["generation"] >= 1
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    for d, g, size in zip(spec["devices"], node.gpus, (4 * GI, 8 * GI), strict=True):
        assert d["allowMultipleAllocations"] is True
        attrs = d["attributes"]
        assert attrs["uuid"] == {"string": g.uuid}
        assert attrs["index"] == {"int": g.index}
        assert attrs["productName"] == {"string": g.name}
        assert g.driver_version and g.cuda_version    # simgpu reports both
        for key, value in (("driverVersion", g.driver_version),
                           ("cudaVersion", g.cuda_version)):
            # A semantic version CEL can compare: 12.8 -> 12.8.0
            parts = [str(int(p)) for p in value.split(".")]
            assert attrs[key] == {"version": ".".join([*parts, "0", "0"][:3])}
        assert d["capacity"] == {
            "memory": {"value": str(size), "requestPolicy": {
                "default": str(size), "validRange": {"min": str(MI), "step": str(MI)}}},
            "compute": {"value": "100", "requestPolicy": {
                "default": "100", "validRange": {"min": "2", "max": "100", "step": "1"}}},
        }


def test_a_claim_for_2gi_and_30_percent_on_gpu_1_is_exactly_that(node: Node):
    plugin = node.registered()
    ref = node.claim("c1", result("gpu", "gpu-1", NODE, memory="2Gi", compute="30"))
    uid = ref[2]
    reply = plugin.prepare([ref])
    assert set(reply) == {uid} and reply[uid].error == ""
    cdi_id = f"vgpu.io/claim={uid}"
    assert devices_of(reply[uid]) == [(["gpu"], NODE, "gpu-1", [cdi_id])]
    s = node.slice_of(uid)
    assert s.owner_kind == "claim"
    assert [(v.gpu_uuid, v.memory_bytes, v.compute_percent) for v in s.vgpus] == [
        (node.gpus[1].uuid, 2 * GI, 30)]
    assert s.labels["dra.vgpu.io/claim"] == "default/c1"
    # Metrics and events name the claim's namespace (no pod: a claim may serve several).
    assert s.labels["k8s.vgpu.io/namespace"] == "default"
    assert "k8s.vgpu.io/pod" not in s.labels
    spec = json.loads(node.spec(uid).read_text())
    assert spec["kind"] == "vgpu.io/claim"
    assert [d["name"] for d in spec["devices"]] == [uid]
    assert s.region_dir in json.dumps(spec)
    # Prepared twice (over v1beta1 this time): the same answer, the same one slice.
    again = plugin.prepare([ref], version="v1beta1")
    assert devices_of(again[uid]) == devices_of(reply[uid]) and again[uid].error == ""
    assert [x.id for x in node.claim_slices()] == [s.id]
    entry = json.loads(node.checkpoint.read_text())["claims"][uid]
    assert (entry["slice_id"], entry["cdi_device_ids"]) == (s.id, [cdi_id])


def test_two_devices_make_one_two_vgpu_slice_and_absent_amounts_take_the_default(node: Node):
    plugin = node.registered()
    ref = node.claim("c2", result("a", "gpu-0", NODE, memory="1Gi", compute="20"),
                     result("b", "gpu-1", NODE))            # no consumedCapacity: defaults
    uid = ref[2]
    reply = plugin.prepare([ref])[uid]
    assert reply.error == ""
    cdi_id = f"vgpu.io/claim={uid}"
    assert devices_of(reply) == [(["a"], NODE, "gpu-0", [cdi_id]),
                                 (["b"], NODE, "gpu-1", [cdi_id])]
    s = node.slice_of(uid)
    assert [(v.gpu_uuid, v.memory_bytes, v.compute_percent) for v in s.vgpus] == [
        (node.gpus[0].uuid, GI, 20), (node.gpus[1].uuid, 8 * GI, 100)]


def test_unprepare_releases_the_slice_and_removes_the_spec_idempotently(node: Node):
    plugin = node.registered()
    ref = node.claim("c3", result("gpu", "gpu-0", NODE, memory="512Mi", compute="10"))
    uid = ref[2]
    assert plugin.prepare([ref])[uid].error == ""
    assert node.slice_of(uid) is not None and node.spec(uid).exists()
    never = ("default", "never", "00000000-0000-0000-0000-000000000000")
    reply = plugin.unprepare([ref, never])
    assert set(reply) == {uid, never[2]}
    assert reply[uid].error == "" and reply[never[2]].error == ""
    assert node.slice_of(uid) is None and not node.spec(uid).exists()
    assert json.loads(node.checkpoint.read_text())["claims"] == {}
    assert plugin.unprepare([ref], version="v1beta1")[uid].error == ""
    # Prepared again after an unprepare: a new slice.
    assert plugin.prepare([ref])[uid].error == ""
    assert node.slice_of(uid) is not None


@pytest.mark.parametrize(("results", "says"), [
    ([result("gpu", "gpu-7", NODE, memory="1Gi")],
     "device gpu-7 is not a GPU of this node (gpu-0, gpu-1)"),
    ([result("gpu", "gpu-0", "node-b", memory="1Gi")],
     "has no device of driver vgpu.io in pool node-a (pools node-b)"),
    ([result("gpu", "gpu-0", NODE, memory="1Gi", compute="150")],
     "compute 150 is not a percent from 2 to 100"),
    ([result("gpu", "gpu-0", NODE, memory="3Gi", compute="30")],   # 1Gi is left
     "has no room for 3Gi memory"),
], ids=["unknown-device", "other-pool", "compute-above-100", "vgpud-full"])
def test_a_claim_that_cannot_be_prepared_gets_one_line_and_leaves_nothing(
        node: Node, results, says):
    plugin = node.registered()
    first = node.claim("big", result("gpu", "gpu-0", NODE, memory="3Gi", compute="50"))
    assert plugin.prepare([first])[first[2]].error == ""
    ref = node.claim("bad", *results)
    uid = ref[2]
    reply = plugin.prepare([ref, first])
    error = reply[uid].error
    assert error.startswith(f"failed to prepare claim default/bad ({uid}): "), error
    assert says in error and "\n" not in error
    assert not reply[uid].devices
    assert reply[first[2]].error == ""       # the other claim of the call is unaffected
    assert node.slice_of(uid) is None and not node.spec(uid).exists()
    assert uid not in json.loads(node.checkpoint.read_text())["claims"]
    assert f"failed to prepare claim default/bad ({uid})" in node.plugin.log()
    # `kubectl describe` on the claim shows why: one Warning Event, posted once however
    # often the kubelet retries.
    assert plugin.prepare([ref])[uid].error == error
    (event,) = [e for e in node.api.events.values()
                if e["involvedObject"].get("uid") == uid]
    assert event["type"] == "Warning" and event["reason"] == "VgpuPrepareFailed"
    assert event["involvedObject"] == {"apiVersion": "resource.k8s.io/v1",
                                       "kind": "ResourceClaim", "namespace": "default",
                                       "name": "bad", "uid": uid}
    assert says in event["message"] and NODE in event["message"]
    assert event["metadata"]["namespace"] == "default"
    assert not [e for e in node.api.events.values()
                if e["involvedObject"].get("uid") == first[2]]


def test_restart_keeps_a_prepared_claim_and_reconciles_with_vgpud(node: Node):
    plugin = node.registered()
    ref = node.claim("keep", result("gpu", "gpu-1", NODE, memory="1Gi", compute="25"))
    gone = node.claim("gone", result("gpu", "gpu-0", NODE, memory="256Mi", compute="5"))
    uid = ref[2]
    first = plugin.prepare([ref, gone])
    assert first[uid].error == "" and first[gone[2]].error == ""
    before = node.slice_of(uid)
    assert node.plugin.stop(signal.SIGTERM) == 0, node.plugin.log()
    # A clean stop: no sockets, no ResourceSlices of the node; the claims' slices stay.
    assert not list(node.kubelet.registry.glob("*.sock"))
    assert node.api.slices() == []
    assert node.slice_of(uid).id == before.id
    # While it was down: the slice of `gone` vanished (an operator's release), and a claim
    # slice the checkpoint does not know appeared (a crash between Allocate and the save).
    node.vgpud.stub.Release(pb.ReleaseRequest(owner=node.slice_of(gone[2]).owner), timeout=5)
    node.vgpud.stub.Allocate(pb.AllocateRequest(
        owner="vgpu.io/claim/stray", owner_kind="claim",
        labels={"dra.vgpu.io/node": NODE},
        vgpus=[pb.VGpuRequest(memory_bytes=64 * MI, compute_percent=2)]), timeout=5)
    del node.api.claims[("default", "keep")]   # answered from the checkpoint, not the API
    node.plugin.start()
    plugin = node.registered(count=2)
    again = plugin.prepare([ref])
    assert devices_of(again[uid]) == devices_of(first[uid]) and again[uid].error == ""
    assert node.slice_of(uid).id == before.id
    owners = {s.owner for s in node.claim_slices()}
    assert "vgpu.io/claim/stray" not in owners
    remade = node.slice_of(gone[2])
    assert remade is not None and [(v.memory_bytes, v.compute_percent) for v in remade.vgpus] \
        == [(256 * MI, 5)]
    assert remade.region_dir in node.spec(gone[2]).read_text()
    assert plugin.unprepare([ref])[uid].error == ""
    assert node.slice_of(uid) is None


def test_reregisters_after_a_kubelet_restart_and_a_removed_socket(node: Node):
    node.registered()
    node.kubelet.restart()
    plugin = node.kubelet.wait_registered(DRIVER, count=2)
    (node.kubelet.registry / "vgpu.io-reg.sock").unlink()
    plugin = node.kubelet.wait_registered(DRIVER, count=3)
    ref = node.claim("after", result("gpu", "gpu-0", NODE, memory="1Gi", compute="10"))
    assert plugin.prepare([ref])[ref[2]].error == ""


def test_a_lost_gpu_is_republished_without_it_and_back(node: Node):
    node.registered()
    generation = node.api.slices()[0]["spec"]["pool"]["generation"]
    node.simgpu("lose", "1")
    devs = node.published(lambda ds: [d["name"] for d in ds] == ["gpu-0"], "gpu-1 withdrawn")
    assert devs[0]["attributes"]["uuid"] == {"string": node.gpus[0].uuid}
    [s] = node.api.slices()
    assert s["spec"]["pool"]["generation"] > generation
    node.simgpu("restore", "1")
    node.published(lambda ds: [d["name"] for d in ds] == ["gpu-0", "gpu-1"], "gpu-1 back")


def test_vgpud_restart_keeps_the_published_slice(node: Node):
    plugin = node.registered()
    [before] = node.api.slices()
    node.vgpud.stop()
    ref = node.claim("wait", result("gpu", "gpu-0", NODE, memory="1Gi", compute="10"))
    error = plugin.prepare([ref])[ref[2]].error
    assert error.startswith(f"failed to prepare claim default/wait ({ref[2]}): ")
    assert node.api.slices() == [before]          # not withdrawn while vgpud is away
    node.vgpud.start()
    assert plugin.prepare([ref])[ref[2]].error == ""


def generation(s: dict[str, Any]) -> int:
    return int(s["spec"]["pool"]["generation"])


def slice_writes(api: FakeApiServer) -> list[tuple[str, str]]:
    """The plugin's creates and replaces of ResourceSlices so far."""
    return [(m, p) for m, p in api.requests if m in ("POST", "PUT") and "resourceslices" in p]


SHARING_OFF = ("vgpu-dra-plugin: the API server dropped allowMultipleAllocations and "
               f"requestPolicy from ResourceSlice {NODE}-{DRIVER}: GPU sharing is off on this "
               "cluster, each GPU goes whole to one claim at a time; it needs the "
               "DRAConsumableCapacity feature gate on the API server and the scheduler "
               "(alpha in Kubernetes 1.34 and 1.35, off by default; beta and on by default "
               "since 1.36)")


@pytest.mark.parametrize("wipe_after", [None, 0.5],
                         ids=["wipe-before-registration", "wipe-after-registration"])
def test_the_pool_a_kubelet_restart_wiped_is_back_after_its_registration(
        bare_node: Node, wipe_after):
    node = bare_node
    # A resync interval far longer than the test: only the registration can bring it back.
    node.plugin = DraPluginProc(node, "--resync-interval", "600")
    node.plugin.start()
    node.registered()
    [before] = node.api.slices()
    wiped: list[tuple[float, list[str]]] = []
    node.kubelet.restart(wipe=lambda: wiped.append(
        (time.monotonic(), node.api.kubelet_wipe(NODE))), wipe_after=wipe_after)
    node.kubelet.wait_registered(DRIVER, count=2)
    [after] = node.api.wait_slices(
        lambda ss: wiped and len(ss) == 1 and generation(ss[0]) > generation(before),
        "the slice published again")
    took = time.monotonic() - wiped[0][0]
    assert wiped[0][1] == [f"{NODE}-{DRIVER}"]
    assert took < 4.0, f"the pool came back {took:.1f}s after the kubelet's wipe"
    assert after["spec"]["devices"] == before["spec"]["devices"]
    assert after["spec"]["pool"]["name"] == NODE
    assert f"ResourceSlice {NODE}-{DRIVER} is gone in the API server: publishing it again" \
        in node.plugin.log()
    assert "DRAConsumableCapacity" not in node.plugin.log()   # this server keeps sharing
    plugin = node.kubelet.plugins[DRIVER]
    ref = node.claim("after", result("gpu", "gpu-0", NODE, memory="1Gi", compute="10"))
    assert plugin.prepare([ref])[ref[2]].error == ""


def test_a_slice_deleted_without_a_kubelet_restart_is_back_within_the_resync_interval(
        bare_node: Node):
    node = bare_node
    node.plugin = DraPluginProc(node, "--resync-interval", "1")
    node.plugin.start()
    node.registered()
    [before] = node.api.slices()
    writes = len(slice_writes(node.api))
    # Past the looks that follow the registration (0, 1, 2, 4 and 8 s after it; the next
    # is at 16 s): only the periodic resync can see what happens now. Meanwhile it found
    # the slice in place ~9 times and wrote nothing.
    time.sleep(9.0)
    assert node.api.slices() == [before]
    assert len(slice_writes(node.api)) == writes
    assert node.api.kubelet_wipe(NODE) == [f"{NODE}-{DRIVER}"]   # an operator's delete
    t0 = time.monotonic()
    [after] = node.api.wait_slices(lambda ss: len(ss) == 1, "the slice published again")
    took = time.monotonic() - t0
    assert took < 3.0, f"the pool came back {took:.1f}s after the delete (resync 1 s)"
    assert generation(after) == generation(before) + 1
    assert after["spec"]["devices"] == before["spec"]["devices"]


def test_a_server_without_consumable_capacity_is_said_in_one_line(bare_node: Node):
    node = bare_node
    node.api.consumable_capacity = False
    node.plugin = DraPluginProc(node, "--resync-interval", "0.5")
    node.plugin.start()
    node.registered()
    [stored] = node.api.slices()
    for d in stored["spec"]["devices"]:          # what such a server keeps
        assert "allowMultipleAllocations" not in d
        assert [c.get("requestPolicy") for c in d["capacity"].values()] == [None, None]
        assert set(d["capacity"]) == {"memory", "compute"}

    def said() -> list[str]:
        return [ln for ln in node.plugin.log().splitlines() if "DRAConsumableCapacity" in ln]

    deadline = time.monotonic() + 10
    while not said() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert said() == [SHARING_OFF]
    # What it stored differs from what was sent: that is no reason to publish again.
    time.sleep(2.0)
    assert node.api.slices() == [stored]
    # Published anew after a kubelet restart: the same server, still one line.
    node.kubelet.restart(wipe=lambda: node.api.kubelet_wipe(NODE))
    node.api.wait_slices(lambda ss: len(ss) == 1 and generation(ss[0]) > generation(stored),
                         "the slice published again")
    time.sleep(1.0)
    assert said() == [SHARING_OFF]


@pytest.mark.parametrize(("args", "line"), [
    ([], "vgpu-dra-plugin: --node-name=: is required (or $NODE_NAME): the node whose GPUs "
         "are published"),
    (["--node-name", "Node_A"], "vgpu-dra-plugin: --node-name=Node_A: is not a Kubernetes "
                                "node name (lowercase letters, digits, '-' and '.', at most "
                                "253)"),
    (["--node-name", "n", "--kubeconfig", "/nonexistent"],
     "vgpu-dra-plugin: --kubeconfig=/nonexistent: no such file"),
    (["--node-name", "n", "--resync-interval", "0"],
     "vgpu-dra-plugin: --resync-interval=0.0: must be a positive number of seconds"),
    # gRPC cannot bind a unix socket past 107 bytes of path (it said so in a traceback).
    (["--node-name", "n", "--kubelet-dir", "/" + "k" * 100],
     f"vgpu-dra-plugin: --kubelet-dir=/{'k' * 100}: puts the socket "
     f"/{'k' * 100}/plugins/vgpu.io/dra.sock at 126 bytes, and a unix socket's path holds "
     "at most 107"),
], ids=["no-node", "bad-node", "no-kubeconfig", "zero-resync", "kubelet-dir-too-long"])
def test_bad_flags_are_one_line(tmp_path: Path, args, line):
    env = clean_env()
    env.pop("NODE_NAME", None)
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.run([sys.executable, "-m", "vgpu_k8s.dra.main", "--kubelet-dir",
                        str(tmp_path), *args], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [line]
    assert not any(tmp_path.iterdir())


def test_a_claim_s_answer_names_nvidia_s_cdi_device_of_its_gpu(bare_node: Node):
    """Where NVIDIA's toolkit wrote a CDI spec (--nvidia-cdi-dir), a claim's answer names
    the device of each of its GPUs beside vgpu's, so the engine adds the driver too."""
    node = bare_node
    nvidia_dir = node.tmp / "nvidia-cdi"
    nvidia_dir.mkdir()
    (nvidia_dir / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: '0'\n  - name: '1'\n"
        f"  - name: {node.gpus[1].uuid}\n  - name: all\n")
    node.plugin.command += ["--nvidia-cdi-dir", str(nvidia_dir)]
    node.plugin.start()
    plugin = node.registered()
    ref = node.claim("c1", result("gpu", "gpu-1", NODE, memory="1Gi", compute="20"))
    uid = ref[2]
    reply = plugin.prepare([ref])
    ids = [f"vgpu.io/claim={uid}", f"nvidia.com/gpu={node.gpus[1].uuid}"]
    assert devices_of(reply[uid]) == [(["gpu"], NODE, "gpu-1", ids)], node.plugin.log()
    assert json.loads(node.checkpoint.read_text())["claims"][uid]["cdi_device_ids"] == ids
