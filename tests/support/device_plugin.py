# SPDX-License-Identifier: Apache-2.0
"""vgpu-device-plugin as a process, and the calls the kubelet makes on its sockets.

`DevicePlugin(kubelet_dir, vgpud_socket)` runs `python -m vgpu_k8s.deviceplugin.main`
(its sockets appear in kubelet_dir whether or not a kubelet is there to register with);
`KubeletSide` does what the kubelet's device manager does for a pod: learn the healthy IDs
from ListAndWatch, let GetPreferredAllocation pick (where the plugin offers it) and call
Allocate with one ContainerAllocateRequest per container. Registration itself is tested
with a fake kubelet in tests/vgpu_k8s/.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from support.paths import ROOT
from support.process import clean_env
from vgpu_k8s.deviceplugin.gpus import HEALTHY
from vgpu_k8s.deviceplugin.plugin import ENDPOINTS
from vgpu_k8s.proto import deviceplugin_v1beta1_pb2 as dp
from vgpu_k8s.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc

__all__ = ["DevicePlugin", "KubeletSide", "dp"]


class DevicePlugin:
    """One vgpu-device-plugin process serving its sockets in `kubelet_dir`."""

    def __init__(self, kubelet_dir: Path, vgpud_socket: Path, memory_unit: str = "64Mi",
                 log: Path | None = None) -> None:
        self.kubelet_dir = kubelet_dir
        kubelet_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log or kubelet_dir.parent / "device-plugin.log"
        env = clean_env()
        env["PYTHONPATH"] = str(ROOT)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vgpu_k8s.deviceplugin.main", "--kubelet-dir",
                 str(kubelet_dir), "--memory-unit", memory_unit, "--socket", str(vgpud_socket),
                 "--poll-interval", "0.5"], env=env, cwd=ROOT, stdout=out, stderr=out)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_serving(self, timeout: float = 30) -> DevicePlugin:
        deadline = time.monotonic() + timeout
        sockets = [self.kubelet_dir / name for name in ENDPOINTS.values()]
        while not all(s.exists() for s in sockets):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the device plugin does not serve:\n{self.log()}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class KubeletSide:
    """The device manager's calls on the plugin's sockets, one channel per resource."""

    def __init__(self, kubelet_dir: Path) -> None:
        self.channels = {r: grpc.insecure_channel(f"unix:{kubelet_dir / name}")
                         for r, name in ENDPOINTS.items()}
        self.stubs = {r: dp_grpc.DevicePluginStub(c) for r, c in self.channels.items()}

    def close(self) -> None:
        for c in self.channels.values():
            c.close()

    def healthy(self, resource: str, timeout: float = 10) -> list[str]:
        """The healthy IDs of the first list ListAndWatch sends."""
        stream = self.stubs[resource].ListAndWatch(dp.Empty(), timeout=timeout)
        try:
            first = next(stream)
        finally:
            stream.cancel()
        return [d.ID for d in first.devices if d.health == HEALTHY]

    def pick(self, resource: str, available: list[str], size: int) -> list[str]:
        """The IDs the kubelet takes for `size` units: the plugin's preference when it
        offers one, else the first `size` available (as the device manager does)."""
        stub = self.stubs[resource]
        if stub.GetDevicePluginOptions(dp.Empty(), timeout=5).get_preferred_allocation_available:
            reply = stub.GetPreferredAllocation(dp.PreferredAllocationRequest(container_requests=[
                dp.ContainerPreferredAllocationRequest(available_deviceIDs=available,
                                                       allocation_size=size)]), timeout=5)
            return list(reply.container_responses[0].deviceIDs)
        return available[:size]

    def allocate(self, resource: str, per_container: list[list[str]],
                 timeout: float = 5) -> list[Any]:
        """One ContainerAllocateResponse per container, in order."""
        reply = self.stubs[resource].Allocate(dp.AllocateRequest(container_requests=[
            dp.ContainerAllocateRequest(devices_ids=ids) for ids in per_container]),
            timeout=timeout)
        return list(reply.container_responses)
