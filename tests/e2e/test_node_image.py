# SPDX-License-Identifier: Apache-2.0
"""The node image end to end: `make image` builds the image the DaemonSet names with
Podman, its init container and vgpud run with the DaemonSet's own mounts and command
(read from configs/kubernetes/daemonset.yaml), and a container the node's runc starts
through vgpu-runtime gets its slice from that vgpud.

No image registry is reachable here, so the base is a Debian 12 rootfs made with
debootstrap and `podman import`ed, and pip installs from a wheelhouse of the versions
this Python runs (support/node_image.py; both cached): the build runs with
`--network none`. The node is a private mount namespace in which each hostPath the pod
uses is a fresh directory bind-mounted at its own path (/etc/vgpu, /run/vgpu,
/var/lib/vgpu, /opt/vgpu, ...), so every path vgpud hands out means the same in its
container and on this node, as on a real one; /dev and /sys/fs/cgroup are the machine's.
simgpu stands for the GPU: its state file is shared by vgpud and the workload, and its
libnvidia-ml.so.1 is mounted into vgpud's container from build/simgpu, the part the
NVIDIA Container Toolkit plays on a real node (the image carries no driver library).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from support.engines import require
from support.images import make_bundle
from support.node_image import base_tarball, wheelhouse
from support.paths import ROOT, SIMGPU_DIR
from support.process import clean_env
from support.runc_host import MiB, probe_lines

from arbiter.daemon.events import read_events
from arbiter.proto import vgpu_pb2 as pb
from arbiter.proto import vgpu_pb2_grpc

require("podman", "conmon", "runc", "debootstrap", "unshare", "nsenter")

MANIFESTS = ROOT / "configs" / "kubernetes"
BASE = "localhost/vgpu-test-debian:12"
#: The node's own, not the pod's to fake: the machine's devices and cgroup tree.
MACHINE_PATHS = ("/dev", "/sys/fs/cgroup")
SIMGPU_IN_POD = "/usr/local/simgpu"   # where the test mounts build/simgpu into vgpud's pod
#: Where containerd's CRI keeps a pod container's bundle and its runc state.
TASKS = "/run/containerd/io.containerd.runtime.v2.task/k8s.io"
RUNC_ROOT = "/run/containerd/runc/k8s.io"
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


def pod_spec() -> dict[str, Any]:
    """The DaemonSet's pod template spec."""
    doc = yaml.safe_load((MANIFESTS / "daemonset.yaml").read_text())
    return doc["spec"]["template"]["spec"]


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    every = [*spec.get("initContainers", []), *spec["containers"]]
    return next(c for c in every if c["name"] == name)


def volume_flags(spec: dict[str, Any], c: dict[str, Any],
                 configmap_dir: Path) -> list[str]:
    """podman -v flags for a container's volumeMounts: hostPath at its own path, the
    ConfigMap from `configmap_dir`, readOnly and Bidirectional as the kubelet applies them."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    flags = []
    for m in c.get("volumeMounts", []):
        v = volumes[m["name"]]
        source = v["hostPath"]["path"] if "hostPath" in v else str(configmap_dir)
        options = ["ro"] if m.get("readOnly") else ["rw"]
        propagation = {"Bidirectional": "rshared", "HostToContainer": "rslave"}
        if m.get("mountPropagation") in propagation:
            options.append(propagation[m["mountPropagation"]])
        flags += ["-v", f"{source}:{m['mountPath']}:{','.join(options)}"]
    return flags


def env_flags(env: dict[str, str]) -> list[str]:
    return [f for name, value in env.items() for f in ("-e", f"{name}={value}")]


def host_paths(spec: dict[str, Any], names: list[str]) -> list[str]:
    """The hostPaths the named containers mount, but the machine's own."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    paths = {volumes[m["name"]]["hostPath"]["path"]
             for n in names for m in container(spec, n).get("volumeMounts", [])
             if "hostPath" in volumes[m["name"]]}
    return sorted(p for p in paths if p not in MACHINE_PATHS)


class Node:
    """A private mount namespace standing for a node, with `paths` private to it."""

    def __init__(self, tmp: Path, paths: list[str]) -> None:
        self.created: list[Path] = []
        self.holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                                        "sleep", "infinity"])
        own = os.readlink("/proc/self/ns/mnt")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{self.holder.pid}/ns/mnt") == own:
            assert time.monotonic() < deadline, "unshare made no mount namespace"
            time.sleep(0.01)
        # Shared inside the namespace only (its peer groups are new): Bidirectional
        # mounts from vgpud's container reach the node as on a real one.
        self.run(["mount", "--make-rshared", "/"])
        for path in paths:
            source = tmp / path.lstrip("/")
            source.mkdir(parents=True)
            self._mountpoint(Path(path))
            self.run(["mount", "--bind", str(source), path])
            # Its own peer group, not the one of the tree `source` lives in.
            self.run(["mount", "--make-private", path])
            self.run(["mount", "--make-shared", path])

    def _mountpoint(self, path: Path) -> None:
        """The mount point on the machine (DirectoryOrCreate); removed at close if made."""
        missing = []
        for p in (path, *path.parents):
            if p.exists():
                break
            missing.append(p)
        for p in reversed(missing):
            p.mkdir()
            self.created.append(p)

    def command(self, args: list[str]) -> list[str]:
        return ["nsenter", "-t", str(self.holder.pid), "-m", "--", *args]

    def run(self, args: list[str], *, check: bool = True, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(self.command(args), capture_output=True, text=True,
                           timeout=timeout, env=env or clean_env())
        if check and p.returncode != 0:
            raise AssertionError(f"{shlex.join(args)} exited {p.returncode}:\n"
                                 f"{p.stdout[-4000:]}{p.stderr[-4000:]}")
        return p

    def close(self) -> None:
        self.holder.send_signal(signal.SIGKILL)
        self.holder.wait()
        for p in reversed(self.created):
            with contextlib.suppress(OSError):
                p.rmdir()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Node, list[str], Path]]:
    """The node, podman's command line on it (storage of its own), the test's tmp dir."""
    spec = pod_spec()
    paths = {*host_paths(spec, ["install", "vgpud"]), str(Path(TASKS).parent)}
    n = Node(tmp_path / "node", sorted(paths))
    # Podman refuses a runroot path longer than 50 characters: pytest's are longer.
    runroot = Path(tempfile.mkdtemp(prefix="vgpu-podman-"))
    podman = ["podman", "--root", str(tmp_path / "podman"), "--runroot", str(runroot),
              "--tmpdir", str(tmp_path / "libpod"), "--storage-driver", "overlay",
              "--cgroup-manager", "cgroupfs", "--events-backend", "file", "--runtime", "runc"]
    try:
        yield n, podman, tmp_path
    finally:
        n.run([*podman, "rm", "--all", "--force", "--time", "5"], check=False)
        n.run(["runc", "--root", RUNC_ROOT, "delete", "-f", "vgpu-node-e2e"], check=False)
        n.run([*podman, "system", "reset", "--force"], check=False, timeout=300)
        n.close()
        shutil.rmtree(runroot, ignore_errors=True)


def node_config() -> str:
    """The ConfigMap's config.yaml, plus what simgpu needs (a node with a GPU has neither):
    NVML from build/simgpu, and no /dev/nvidia* nodes to give containers."""
    doc = yaml.safe_load((MANIFESTS / "config.yaml").read_text())
    config = yaml.safe_load(doc["data"]["config.yaml"]) or {}
    config.setdefault("nvml", {})["library"] = f"{SIMGPU_IN_POD}/libnvidia-ml.so.1"
    config.setdefault("devices", {})["nodes"] = {"*": ["/dev/null"]}
    return yaml.safe_dump(config)


def wait_health(channel: grpc.Channel, vgpud_log: Any, timeout: float = 60) -> Any:
    """A client of vgpud on `channel` once Health answers."""
    stub = vgpu_pb2_grpc.ArbiterStub(channel)
    deadline = time.monotonic() + timeout
    while True:
        try:
            stub.Health(pb.HealthRequest(), timeout=2)
            return stub
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise AssertionError(f"vgpud did not answer:\n{vgpud_log()}") from None
            time.sleep(0.2)


def test_the_image_serves_a_runc_container_from_the_daemonsets_pod(node) -> None:
    n, podman, tmp = node
    spec = pod_spec()
    init, vgpud = container(spec, "install"), container(spec, "vgpud")
    image = vgpud["image"]
    assert init["image"] == image

    # make image, as a user runs it, with the locally made base and the wheelhouse.
    n.run([*podman, "import", str(base_tarball()), BASE], timeout=300)
    build_flags = ["--build-arg", f"BASE={BASE}", "--build-arg", "WHEELS=/wheels",
                   "--volume", f"{wheelhouse()}:/wheels:ro", "--network", "none"]
    built = n.run(["make", "-s", "-C", str(ROOT), "image", f"IMAGE_ENGINE={shlex.join(podman)}",
                   f"IMAGE_FLAGS={shlex.join(build_flags)}"], timeout=900)
    # The build checked its native files against the glibc baseline.
    assert re.search(r"check-glibc: \d+ files need at most GLIBC_", built.stdout + built.stderr)

    # The init container: its script, env and mounts, but VGPU_RESTART empty (the
    # script's own "restart nothing"): this machine's containerd is not the node's.
    configmap = tmp / "configmap"
    configmap.mkdir()
    (configmap / "config.yaml").write_text(node_config())
    init_env = {e["name"]: e["value"] for e in init.get("env", [])}
    assert "VGPU_RESTART" in init_env, "the init container could restart this machine's engine"
    init_env["VGPU_RESTART"] = ""
    p = n.run([*podman, "run", "--rm", "--network", "none", *ULIMITS, "--privileged",
               "--pid", "host", *env_flags(init_env), *volume_flags(spec, init, configmap),
               image, *init["command"], *init["args"]], timeout=300)
    assert f"{init_env['VGPU_ENGINE']} was not restarted" in p.stdout, p.stdout

    # vgpud, as the DaemonSet runs it: host pids, privileged, its mounts and command.
    sim = tmp / "sim"
    sim.mkdir()
    env = {e["name"]: e["value"] for e in vgpud.get("env", [])}
    env.update(SIMGPU_STATE="/sim/simgpu.state", SIMGPU_DEVICES="4Gi")
    assert vgpud["securityContext"]["privileged"] is True and spec["hostPID"] is True
    n.run([*podman, "run", "-d", "--name", "vgpud", "--network", "none", *ULIMITS,
           "--privileged", "--pid", "host", *env_flags(env),
           *volume_flags(spec, vgpud, configmap),
           "-v", f"{SIMGPU_DIR}:{SIMGPU_IN_POD}:ro", "-v", f"{sim}:/sim:rw",
           image, *vgpud["command"]], timeout=120)

    def log() -> str:
        out = n.run([*podman, "logs", "vgpud"], check=False)
        return (out.stdout + out.stderr)[-6000:]

    # The socket seen from the machine: the node's /run/vgpu is bound from there.
    channel = grpc.insecure_channel(f"unix:{tmp / 'node/run/vgpu/vgpud.sock'}")
    try:
        serves_a_container(n, podman, tmp, vgpud, wait_health(channel, log), log)
    finally:
        channel.close()


def serves_a_container(n: Node, podman: list[str], tmp: Path, vgpud: dict[str, Any],
                       stub: Any, log: Any) -> None:
    """vgpud's readiness, then a runc container through the node's vgpu-runtime."""
    # Its readiness probe's endpoint answers in the pod's network namespace.
    probe = vgpud["readinessProbe"]["httpGet"]
    [port] = [p["containerPort"] for p in vgpud["ports"] if p["name"] == probe["port"]]
    n.run([*podman, "exec", "vgpud", str(Path(vgpud["command"][0]).with_name("python")), "-c",
           "import sys, urllib.request; "
           f"sys.exit(0 if b'vgpu' in urllib.request.urlopen('http://127.0.0.1:{port}"
           f"{probe['path']}', timeout=10).read() else 1)"])

    # A container on the node's runc, through the vgpu-runtime the init container installed
    # (the one containerd's handler runs), with the defaults a node has: /etc/vgpu/config.yaml
    # and /run/vgpu/vgpud.sock.
    runtime = "/var/lib/vgpu/lib/current/bin/vgpu-runtime"
    cid = "vgpu-node-e2e"
    make_bundle(tmp / "node" / TASKS.lstrip("/") / cid,
                args=["/bin/sh", "-c", "md5sum /usr/lib/vgpu/libvgpu.so && vgpu_probe info"],
                annotations={"vgpu.io/memory": "256Mi"},
                env=["SIMGPU_STATE=/sim/simgpu.state"],
                mounts=[{"destination": "/sim", "type": "bind", "source": str(tmp / "sim"),
                         "options": ["rbind", "rw"]}])
    # Run where containerd keeps it (the same directory, bound there on the node).
    p = n.run([runtime, "--root", RUNC_ROOT, "run", "--bundle", f"{TASKS}/{cid}", cid],
              check=False, timeout=120)
    assert p.returncode == 0, f"{p.stdout}{p.stderr}\n{log()}"
    info = next(x for x in probe_lines(p.stdout) if x["op"] == "info")
    assert info["total"] == 256 * MiB, p.stdout
    # The slice was vgpud's, released when the container exited; the library preloaded
    # was the image's, from vgpud's versioned install on the node (the one path it hands
    # out means the same file in its pod and here).
    [event] = [e for e in read_events(tmp / "node/var/lib/vgpu/events.jsonl")
               if e["kind"] == "allocate"]
    assert event["owner"] == cid, event
    assert list(stub.List(pb.ListRequest(), timeout=5).slices) == []
    venv = Path(vgpud["command"][0]).parents[1]   # /opt/vgpu/<version>, the image's
    [shipped] = (tmp / "node" / venv.relative_to("/")).glob(
        "lib/python3*/site-packages/arbiter/native/libvgpu.so")
    digest = hashlib.md5(shipped.read_bytes()).hexdigest()
    assert p.stdout.split()[0] == digest, p.stdout
