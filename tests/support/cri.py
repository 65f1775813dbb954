# SPDX-License-Identifier: Apache-2.0
"""A CRI v1 client that drives a real containerd's CRI plugin the way the kubelet does.

The API is tests/support/cri_api/runtime_v1.proto (the kubelet's names and field numbers),
compiled with grpcio-tools on first use into build/cri_api/<hash of the .proto>/ (no
generated code in the tree, never stale). `Cri(socket)` wraps both services; `PodSpec`
and `ContainerSpec` hold what a pod manifest and a device plugin's Allocate response give
the kubelet, and `Cri.run_pod` / `Cri.create_container` build the CRI requests from them
as the kubelet does for a host-network pod (empty hostname, network NODE, pid CONTAINER).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from support.paths import BUILD

__all__ = ["ContainerSpec", "Cri", "PodSpec", "api", "read_log"]

PROTO = Path(__file__).resolve().parent / "cri_api" / "runtime_v1.proto"


def _compiled_dir() -> Path:
    """build/cri_api/<hash>/ with runtime_v1_pb2(_grpc).py, made once (atomically: two
    test processes may compile at the same moment)."""
    text = PROTO.read_bytes()
    out = BUILD / "cri_api" / hashlib.sha256(text).hexdigest()[:16]
    if (out / "runtime_v1_pb2_grpc.py").exists():
        return out
    from grpc_tools import protoc  # grpcio-tools: the test extra

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".cri-", dir=out.parent))
    rc = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={tmp}",
                      f"--grpc_python_out={tmp}", str(PROTO)])
    if rc != 0:
        raise RuntimeError(f"failed to compile {PROTO}: protoc exited {rc}")
    try:
        tmp.rename(out)
    except OSError:  # another process got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _load() -> tuple[ModuleType, ModuleType]:
    if "runtime_v1_pb2_grpc" in sys.modules:
        return sys.modules["runtime_v1_pb2"], sys.modules["runtime_v1_pb2_grpc"]
    out = _compiled_dir()
    mods = []
    # The generated _grpc module imports `runtime_v1_pb2` by that top-level name.
    for name in ("runtime_v1_pb2", "runtime_v1_pb2_grpc"):
        spec = importlib.util.spec_from_file_location(name, out / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        mods.append(mod)
    return mods[0], mods[1]


api, _api_grpc = _load()


@dataclass
class PodSpec:
    """What the kubelet knows of a pod when it runs its sandbox."""

    name: str
    uid: str
    namespace: str = "default"
    annotations: dict[str, str] = field(default_factory=dict)
    runtime_handler: str = "vgpu"
    log_directory: str = ""


@dataclass
class ContainerSpec:
    """One container as the kubelet hands it to CRI: the pod manifest's command, env and
    volumes plus what the device plugin's Allocate returned (envs, mounts, devices,
    annotations)."""

    name: str
    image: str
    command: list[str]
    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)  # host, container, ro
    devices: list[tuple[str, str, str]] = field(default_factory=list)  # host, container, perm
    annotations: dict[str, str] = field(default_factory=dict)

    def add_allocation(self, response: Any) -> None:
        """Merge a device plugin's ContainerAllocateResponse as the kubelet does (its
        envs, mounts, devices and annotations join the container's own)."""
        self.envs.update(response.envs)
        self.mounts += [(m.host_path, m.container_path, m.read_only) for m in response.mounts]
        self.devices += [(d.host_path, d.container_path, d.permissions)
                         for d in response.devices]
        self.annotations.update(response.annotations)


@dataclass
class Pod:
    """A sandbox that runs: its id and the config it was made with (CreateContainer
    needs it again)."""

    id: str
    config: Any


class Cri:
    """RuntimeService and ImageService of one CRI endpoint (a unix socket)."""

    def __init__(self, socket: Path, timeout: float = 60) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.runtime = _api_grpc.RuntimeServiceStub(self.channel)
        self.images = _api_grpc.ImageServiceStub(self.channel)
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def version(self) -> Any:
        return self.runtime.Version(api.VersionRequest(version="v1"), timeout=self.timeout)

    def image_id(self, ref: str) -> str:
        """The id of a local image, "" when CRI does not know it."""
        reply = self.images.ImageStatus(api.ImageStatusRequest(image=api.ImageSpec(image=ref)),
                                        timeout=self.timeout)
        return str(reply.image.id)

    @staticmethod
    def _namespaces() -> Any:
        # hostNetwork: true; the kubelet's defaults for the rest of a v1 pod.
        return api.NamespaceOption(network=api.NODE, pid=api.CONTAINER, ipc=api.POD)

    def pod_config(self, pod: PodSpec) -> Any:
        return api.PodSandboxConfig(
            metadata=api.PodSandboxMetadata(name=pod.name, uid=pod.uid,
                                            namespace=pod.namespace, attempt=0),
            hostname="",  # host network: CRI keeps the node's
            log_directory=pod.log_directory,
            labels={"io.kubernetes.pod.name": pod.name,
                    "io.kubernetes.pod.namespace": pod.namespace,
                    "io.kubernetes.pod.uid": pod.uid},
            annotations=pod.annotations,
            linux=api.LinuxPodSandboxConfig(security_context=api.LinuxSandboxSecurityContext(
                namespace_options=self._namespaces())))

    def run_pod(self, pod: PodSpec) -> Pod:
        config = self.pod_config(pod)
        reply = self.runtime.RunPodSandbox(
            api.RunPodSandboxRequest(config=config, runtime_handler=pod.runtime_handler),
            timeout=self.timeout)
        return Pod(reply.pod_sandbox_id, config)

    def create_container(self, pod: Pod, c: ContainerSpec) -> str:
        config = api.ContainerConfig(
            metadata=api.ContainerMetadata(name=c.name, attempt=0),
            image=api.ImageSpec(image=c.image),
            command=c.command,
            envs=[api.KeyValue(key=k, value=v) for k, v in c.envs.items()],
            mounts=[api.Mount(host_path=h, container_path=p, readonly=ro)
                    for h, p, ro in c.mounts],
            devices=[api.Device(host_path=h, container_path=p, permissions=perm)
                     for h, p, perm in c.devices],
            labels={"io.kubernetes.container.name": c.name},
            annotations=c.annotations,
            log_path=f"{c.name}/0.log" if pod.config.log_directory else "",
            linux=api.LinuxContainerConfig(security_context=api.LinuxContainerSecurityContext(
                namespace_options=self._namespaces())))
        reply = self.runtime.CreateContainer(
            api.CreateContainerRequest(pod_sandbox_id=pod.id, config=config,
                                       sandbox_config=pod.config), timeout=self.timeout)
        return str(reply.container_id)

    def start_container(self, cid: str) -> None:
        self.runtime.StartContainer(api.StartContainerRequest(container_id=cid),
                                    timeout=self.timeout)

    def container_status(self, cid: str) -> Any:
        return self.runtime.ContainerStatus(api.ContainerStatusRequest(container_id=cid),
                                            timeout=self.timeout).status

    def wait_exited(self, cid: str, timeout: float = 60) -> Any:
        """The container's status once it has exited."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.container_status(cid)
            if status.state == api.CONTAINER_EXITED:
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"container {cid} still {status.state} after {timeout}s")
            time.sleep(0.05)

    def containers(self, pod: Pod | None = None) -> list[Any]:
        flt = api.ContainerFilter(pod_sandbox_id=pod.id if pod else "")
        return list(self.runtime.ListContainers(api.ListContainersRequest(filter=flt),
                                                timeout=self.timeout).containers)

    def pods(self) -> list[Any]:
        return list(self.runtime.ListPodSandbox(api.ListPodSandboxRequest(),
                                                timeout=self.timeout).items)

    def remove_pod(self, pod: Pod | str) -> None:
        """Stop and remove a sandbox and its containers, as the kubelet does at pod
        deletion (idempotent)."""
        pid = pod.id if isinstance(pod, Pod) else pod
        self.runtime.StopPodSandbox(api.StopPodSandboxRequest(pod_sandbox_id=pid),
                                    timeout=self.timeout)
        self.runtime.RemovePodSandbox(api.RemovePodSandboxRequest(pod_sandbox_id=pid),
                                      timeout=self.timeout)

    def remove_all(self) -> None:
        """Remove every pod this endpoint runs (a test's cleanup)."""
        for p in self.pods():
            with contextlib.suppress(grpc.RpcError):
                self.remove_pod(p.id)


def read_log(path: Path | str) -> str:
    """A container's output from its CRI log file (`<time> <stream> <P|F> <text>` lines:
    P is a partial line that the next record continues)."""
    if not os.path.exists(path):
        return ""
    out: list[str] = []
    for record in Path(path).read_text(errors="replace").splitlines():
        parts = record.split(" ", 3)
        if len(parts) < 3:
            continue
        text = parts[3] if len(parts) == 4 else ""
        out.append(text if parts[2] == "P" else text + "\n")
    return "".join(out)
