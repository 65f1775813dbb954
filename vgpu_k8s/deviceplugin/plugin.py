# SPDX-License-Identifier: Apache-2.0
"""One resource's DevicePlugin service (kubelet API v1beta1) on its own unix socket."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from arbiter.errors import VgpuError
from vgpu_k8s.deviceplugin.allocate import container_annotations, preferred
from vgpu_k8s.deviceplugin.board import Board
from vgpu_k8s.deviceplugin.cdi import CdiAnswer
from vgpu_k8s.deviceplugin.ids import COMPUTE, MEMORY
from vgpu_k8s.errors import AllocationError
from vgpu_k8s.proto import deviceplugin_v1beta1_pb2 as api
from vgpu_k8s.proto import deviceplugin_v1beta1_pb2_grpc as api_grpc
from vgpu_k8s.unixserver import UnixGrpcServer

__all__ = ["ENDPOINTS", "Endpoint", "PluginServer", "Servicer"]

log = logging.getLogger("vgpu-device-plugin")

#: The socket each resource serves, in the kubelet's device-plugins dir.
ENDPOINTS = {MEMORY: "vgpu-memory.sock", COMPUTE: "vgpu-compute.sock"}
#: How often a ListAndWatch stream checks that the kubelet is still there.
_STREAM_CHECK_S = 1.0
#: Worker threads per socket: each ListAndWatch stream holds one while it lasts.
_WORKERS = 16


@dataclass(frozen=True)
class Endpoint:
    """Where one resource is served and what it tells the kubelet at registration."""

    resource: str
    socket: Path

    @property
    def options(self) -> api.DevicePluginOptions:
        """Only memory has a preference (pack onto one GPU); compute IDs are a count."""
        return api.DevicePluginOptions(pre_start_required=False,
                                       get_preferred_allocation_available=self.resource == MEMORY)


class Servicer(api_grpc.DevicePluginServicer):  # type: ignore[misc]
    """v1beta1.DevicePlugin for one resource, its devices read from a Board."""

    def __init__(self, endpoint: Endpoint, board: Board, memory_unit: int,
                 cdi: CdiAnswer | None = None) -> None:
        self.endpoint = endpoint
        self.board = board
        self.memory_unit = memory_unit
        self.cdi = cdi

    def GetDevicePluginOptions(self, request: api.Empty,  # noqa: N802 - gRPC method name
                               context: grpc.ServicerContext) -> api.DevicePluginOptions:
        """The options given at registration."""
        return self.endpoint.options

    def ListAndWatch(self, request: api.Empty,  # noqa: N802
                     context: grpc.ServicerContext) -> Iterator[api.ListAndWatchResponse]:
        """The device list now, then again at every change, until either side stops."""
        version, devices = self.board.current()
        if version:
            yield _response(devices)
        while context.is_active() and not self.board.closed:
            change = self.board.wait(version, _STREAM_CHECK_S)
            if change is not None:
                version, devices = change
                yield _response(devices)

    def GetPreferredAllocation(self, request: api.PreferredAllocationRequest,  # noqa: N802
                               context: grpc.ServicerContext
                               ) -> api.PreferredAllocationResponse:
        """Per container: the IDs to take, memory packed onto one GPU."""
        return api.PreferredAllocationResponse(container_responses=[
            api.ContainerPreferredAllocationResponse(deviceIDs=preferred(
                self.endpoint.resource, list(c.available_deviceIDs),
                list(c.must_include_deviceIDs), c.allocation_size))
            for c in request.container_requests])

    def Allocate(self, request: api.AllocateRequest,  # noqa: N802
                 context: grpc.ServicerContext) -> api.AllocateResponse:
        """Per container: the vgpu.io/* annotations its IDs make (stateless), or with
        --cdi the CDI devices that carry them (vgpu_k8s.deviceplugin.cdi)."""
        try:
            keys = [container_annotations(self.endpoint.resource, list(c.devices_ids),
                                          self.memory_unit) for c in request.container_requests]
            if self.cdi is None:
                return api.AllocateResponse(container_responses=[
                    api.ContainerAllocateResponse(annotations=k) for k in keys])
            cdi = self.cdi
            return api.AllocateResponse(container_responses=[
                api.ContainerAllocateResponse(cdi_devices=[
                    api.CDIDevice(name=n) for n in cdi.devices(k)]) for k in keys])
        except AllocationError as e:
            log.warning("%s", e)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable") from e  # context.abort raises
        except VgpuError as e:
            line = " ".join(f"failed to allocate {self.endpoint.resource}: {e}".split())
            log.warning("%s", line)
            context.abort(grpc.StatusCode.UNAVAILABLE, line)
            raise AssertionError("unreachable") from e

    def PreStartContainer(self, request: api.PreStartContainerRequest,  # noqa: N802
                          context: grpc.ServicerContext) -> api.PreStartContainerResponse:
        """Nothing to prepare (not asked for at registration)."""
        return api.PreStartContainerResponse()


def _response(devices: tuple[tuple[str, str], ...]) -> api.ListAndWatchResponse:
    return api.ListAndWatchResponse(devices=[api.Device(ID=i, health=h) for i, h in devices])


class PluginServer(UnixGrpcServer):
    """A gRPC server for one Servicer on its socket; start() replaces a stale socket file."""

    def __init__(self, servicer: Servicer) -> None:
        self.servicer = servicer
        super().__init__(servicer.endpoint.socket,
                         lambda server: api_grpc.add_DevicePluginServicer_to_server(
                             servicer, server), workers=_WORKERS, name="dp")
