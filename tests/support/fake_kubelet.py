# SPDX-License-Identifier: Apache-2.0
"""A fake kubelet for device plugins: the kubelet's side of the device-plugin API v1beta1.

A real gRPC Registration server on `<dir>/kubelet.sock`; on each Register it does what the
kubelet's device manager does: dial the plugin's socket (`<dir>/<endpoint>`), open
ListAndWatch and keep the latest device list. Tests then call Allocate and
GetPreferredAllocation through the plugin's socket, as the kubelet would at admission and
container creation. `restart()` is a kubelet restart: every file in the dir is removed
(plugin sockets included) and a new kubelet.sock appears.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from vgpu_k8s.proto import deviceplugin_v1beta1_pb2 as api
from vgpu_k8s.proto import deviceplugin_v1beta1_pb2_grpc as api_grpc

__all__ = ["FakeKubelet", "Plugin", "api"]


@dataclass
class Plugin:
    """One registered resource: what it sent, its channel, and its devices as last streamed."""

    request: Any                       # the RegisterRequest
    channel: grpc.Channel
    stub: Any
    devices: dict[str, str] = field(default_factory=dict)   # ID -> health
    updates: int = 0                   # ListAndWatch responses seen
    stream_ended: bool = False
    lock: threading.Condition = field(default_factory=threading.Condition)

    def allocate(self, *containers: Sequence[str], timeout: float = 5) -> Any:
        """Allocate: one ContainerAllocateRequest per container, as the kubelet sends."""
        return self.stub.Allocate(api.AllocateRequest(container_requests=[
            api.ContainerAllocateRequest(devices_ids=list(ids)) for ids in containers]),
            timeout=timeout)

    def preferred(self, available: Sequence[str], size: int,
                  must_include: Sequence[str] = (), timeout: float = 5) -> list[str]:
        """GetPreferredAllocation for one container."""
        reply = self.stub.GetPreferredAllocation(api.PreferredAllocationRequest(
            container_requests=[api.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available), must_include_deviceIDs=list(must_include),
                allocation_size=size)]), timeout=timeout)
        return list(reply.container_responses[0].deviceIDs)


class _Registration(api_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unsupported device plugin API version {request.version!r}")
        self.kubelet._add(request)
        return api.Empty()


class FakeKubelet:
    """The kubelet's Registration server and device-manager client, in a test's tmp dir."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket = self.dir / "kubelet.sock"
        self.plugins: dict[str, Plugin] = {}
        self.registrations: list[Any] = []
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None

    def start(self) -> FakeKubelet:
        """Serve Registration on kubelet.sock."""
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and drop every plugin connection."""
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        with self._cond:
            plugins, self.plugins = list(self.plugins.values()), {}
        for p in plugins:
            p.channel.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    def restart(self) -> None:
        """A kubelet restart: every file in the dir goes, then a new kubelet.sock."""
        self.stop()
        for path in self.dir.iterdir():
            if not path.is_dir():
                path.unlink()
        self.start()

    def _add(self, request: Any) -> None:
        # Like the device manager: dial the endpoint the plugin named, then ListAndWatch.
        channel = grpc.insecure_channel(f"unix:{self.dir / request.endpoint}")
        plugin = Plugin(request, channel, api_grpc.DevicePluginStub(channel))
        with self._cond:
            old = self.plugins.get(request.resource_name)
            self.plugins[request.resource_name] = plugin
            self.registrations.append(request)
            self._cond.notify_all()
        if old is not None:
            old.channel.close()
        threading.Thread(target=self._watch, args=(plugin,), daemon=True).start()

    def _watch(self, plugin: Plugin) -> None:
        try:
            for reply in plugin.stub.ListAndWatch(api.Empty()):
                with plugin.lock:
                    plugin.devices = {d.ID: d.health for d in reply.devices}
                    plugin.updates += 1
                    plugin.lock.notify_all()
        except grpc.RpcError:
            pass
        with plugin.lock:
            plugin.stream_ended = True
            plugin.lock.notify_all()

    def wait_registered(self, resource: str, count: int = 1, timeout: float = 20) -> Plugin:
        """The plugin of resource once it registered `count` times in all."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: sum(r.resource_name == resource for r in self.registrations) >= count,
                timeout)
            if not ok:
                raise AssertionError(f"{resource} did not register {count} time(s) in "
                                     f"{timeout}s; registrations: "
                                     f"{[r.resource_name for r in self.registrations]}")
            return self.plugins[resource]

    @staticmethod
    def wait_devices(plugin: Plugin, predicate: Callable[[dict[str, str]], bool],
                     what: str, timeout: float = 20) -> dict[str, str]:
        """The plugin's streamed device list once predicate holds for it."""
        deadline = time.monotonic() + timeout
        with plugin.lock:
            while not predicate(plugin.devices):
                left = deadline - time.monotonic()
                if left <= 0:
                    healths = sorted(set(plugin.devices.values()))
                    raise AssertionError(f"timed out waiting for {what}: "
                                         f"{len(plugin.devices)} devices, health {healths}")
                plugin.lock.wait(left)
            return dict(plugin.devices)
