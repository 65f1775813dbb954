# SPDX-License-Identifier: Apache-2.0
"""A fake kubelet for DRA plugins: the plugin watcher and the DRA manager's calls.

Like the kubelet's plugin watcher it scans `<kubelet dir>/plugins_registry/` for sockets
(at start, then every 50 ms, where the kubelet uses inotify), calls GetInfo on each new
one (again on the next scan when it could not reach it, as the kubelet's reconciler
does), checks the answer (type DRAPlugin, an endpoint socket, a DRA version it speaks),
dials the endpoint and answers NotifyRegistrationStatus. A socket that disappears is
deregistered. Tests then call NodePrepareResources / NodeUnprepareResources through the
registered endpoint over API v1 or v1beta1, as the kubelet does before a pod's containers
start and after they stopped. `restart()` is a kubelet restart: connections dropped, and
the new watcher finds the registration sockets still in the dir and registers them anew;
`wipe` is the start-up deletion of the node's ResourceSlices the real kubelet does beside
its watcher (`FakeApiServer.kubelet_wipe`), run before the watcher or `wipe_after` seconds
after it starts (the kubelet's wipe runs in the background and can land either side).
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from vgpu_k8s.proto import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from vgpu_k8s.proto import pluginregistration_v1_pb2 as reg
from vgpu_k8s.proto import pluginregistration_v1_pb2_grpc as reg_grpc

__all__ = ["DraKubelet", "DraPlugin"]

#: Service name the plugin lists -> (messages, stub) the kubelet then uses.
VERSIONS = {"v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
            "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}
ClaimT = tuple[str, str, str]   # (namespace, name, uid)


@dataclass
class DraPlugin:
    """One registered DRA plugin: its info and a channel to its endpoint."""

    info: Any
    channel: grpc.Channel
    registration_socket: Path
    inode: int
    statuses: list[Any] = field(default_factory=list)

    def _stub(self, version: str) -> tuple[Any, Any]:
        api, api_grpc = VERSIONS[f"{version}.DRAPlugin"]
        return api, api_grpc.DRAPluginStub(self.channel)

    def prepare(self, claims: Sequence[ClaimT], version: str = "v1",
                timeout: float = 30) -> dict[str, Any]:
        """NodePrepareResources; the response's entries by claim UID."""
        api, stub = self._stub(version)
        reply = stub.NodePrepareResources(api.NodePrepareResourcesRequest(claims=[
            api.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]),
            timeout=timeout)
        return dict(reply.claims)

    def unprepare(self, claims: Sequence[ClaimT], version: str = "v1",
                  timeout: float = 30) -> dict[str, Any]:
        """NodeUnprepareResources; the response's entries by claim UID."""
        api, stub = self._stub(version)
        reply = stub.NodeUnprepareResources(api.NodeUnprepareResourcesRequest(claims=[
            api.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]),
            timeout=timeout)
        return dict(reply.claims)


class DraKubelet:
    """The plugin watcher and DRA client of one kubelet dir."""

    def __init__(self, kubelet_dir: Path) -> None:
        self.dir = kubelet_dir
        self.registry = kubelet_dir / "plugins_registry"
        self.registry.mkdir(parents=True, exist_ok=True)
        (kubelet_dir / "plugins").mkdir(exist_ok=True)
        self.plugins: dict[str, DraPlugin] = {}
        self.registrations: list[Any] = []       # every PluginInfo accepted, in order
        self.refusals: list[str] = []
        self._seen: dict[Path, int] = {}         # registration socket -> inode handled
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> DraKubelet:
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        with self._cond:
            plugins, self.plugins = list(self.plugins.values()), {}
            self._seen = {}
        for p in plugins:
            p.channel.close()

    def restart(self, wipe: Callable[[], object] | None = None,
                wipe_after: float | None = None) -> None:
        """A kubelet restart: it forgets every plugin, then its watcher scans the dir;
        `wipe` runs before the watcher starts, or `wipe_after` seconds after."""
        self.stop()
        if wipe is not None and wipe_after is None:
            wipe()
        self.start()
        if wipe is not None and wipe_after is not None:
            timer = threading.Timer(wipe_after, wipe)
            timer.daemon = True
            timer.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            present: dict[Path, int] = {}
            for path in sorted(self.registry.glob("*.sock")):
                try:
                    present[path] = os.stat(path).st_ino
                except FileNotFoundError:
                    continue
            for path, inode in present.items():
                if self._seen.get(path) != inode:
                    self._seen[path] = inode
                    if not self._register(path, inode):
                        # The kubelet's reconciler tries a socket it could not reach
                        # again on its next pass (a plugin under load answers late).
                        del self._seen[path]
            for path in [p for p in self._seen if p not in present]:
                del self._seen[path]
                with self._cond:
                    for name, p in list(self.plugins.items()):
                        if p.registration_socket == path:
                            del self.plugins[name]
                            p.channel.close()
            self._stop.wait(0.05)

    def _register(self, path: Path, inode: int) -> bool:
        """Register the plugin at `path`; False when it could not be reached."""
        channel = grpc.insecure_channel(f"unix:{path}")
        reached = True
        try:
            stub = reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(reg.InfoRequest(), timeout=5)
            why = self._refuse(info)
            stub.NotifyRegistrationStatus(reg.RegistrationStatus(
                plugin_registered=not why, error=why), timeout=5)
        except grpc.RpcError as e:
            why = f"registration socket {path}: {e.code()}"
            info = None
            reached = False
        finally:
            channel.close()
        with self._cond:
            if why or info is None:
                if why not in self.refusals[-1:]:
                    self.refusals.append(why)
            else:
                old = self.plugins.get(info.name)
                self.plugins[info.name] = DraPlugin(
                    info, grpc.insecure_channel(f"unix:{info.endpoint}"), path, inode)
                self.registrations.append(info)
                if old is not None:
                    old.channel.close()
            self._cond.notify_all()
        return reached

    @staticmethod
    def _refuse(info: Any) -> str:
        """Why the kubelet would refuse this plugin ("" when it takes it)."""
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not DRAPlugin"
        if not info.endpoint or not os.path.isabs(info.endpoint) or \
                not Path(info.endpoint).is_socket():
            return f"endpoint {info.endpoint!r} is not a socket"
        if not set(info.supported_versions) & set(VERSIONS):
            return f"none of the versions {list(info.supported_versions)} is supported"
        return ""

    def wait_registered(self, name: str, count: int = 1, timeout: float = 30) -> DraPlugin:
        """The plugin `name` once it registered `count` times in all."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while sum(i.name == name for i in self.registrations) < count or \
                    name not in self.plugins:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{name} did not register {count} time(s) in {timeout}s; "
                        f"registrations: {[i.name for i in self.registrations]}, "
                        f"refusals: {self.refusals}")
                self._cond.wait(left)
            return self.plugins[name]
