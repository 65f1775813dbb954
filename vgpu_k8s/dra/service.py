# SPDX-License-Identifier: Apache-2.0
"""The DRAPlugin service, API v1 and v1beta1 on one unix socket (the two have the same
messages; the kubelet picks the newest both sides speak)."""
from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from vgpu_k8s.dra.claims import ClaimRef
from vgpu_k8s.dra.prepare import Preparer
from vgpu_k8s.proto import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from vgpu_k8s.unixserver import UnixGrpcServer

__all__ = ["DraServer"]

#: The kubelet prepares the claims of several pods at once.
_WORKERS = 8


class _Servicer:
    """DRAPlugin of one API version, answering through the Preparer."""

    def __init__(self, api: ModuleType, preparer: Preparer) -> None:
        self.api = api
        self.preparer = preparer

    def NodePrepareResources(self, request: Any,  # noqa: N802 - gRPC method name
                             context: grpc.ServicerContext) -> Any:
        """Every claim asked for gets an entry: its devices, or its error."""
        api, out = self.api, {}
        for c in request.claims:
            answer = self.preparer.prepare(ClaimRef(c.namespace, c.name, c.uid))
            out[c.uid] = api.NodePrepareResourceResponse(error=answer.error) if answer.error \
                else api.NodePrepareResourceResponse(devices=[
                    api.Device(request_names=[d.request] if d.request else [],
                               pool_name=d.pool, device_name=d.device,
                               cdi_device_ids=list(answer.cdi_device_ids))
                    for d in answer.devices])
        return api.NodePrepareResourcesResponse(claims=out)

    def NodeUnprepareResources(self, request: Any,  # noqa: N802
                               context: grpc.ServicerContext) -> Any:
        """Every claim asked for gets an entry; unknown claims are fine."""
        api = self.api
        return api.NodeUnprepareResourcesResponse(claims={
            c.uid: api.NodeUnprepareResourceResponse(
                error=self.preparer.unprepare(ClaimRef(c.namespace, c.name, c.uid)))
            for c in request.claims})


class DraServer(UnixGrpcServer):
    """The DRA socket: both API versions, one Preparer."""

    def __init__(self, socket: Path, preparer: Preparer) -> None:
        self.preparer = preparer

        def add(server: grpc.Server) -> None:
            dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
                _Servicer(dra_v1_pb2, preparer), server)
            dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
                _Servicer(dra_v1beta1_pb2, preparer), server)
        super().__init__(socket, add, workers=_WORKERS, name="dra")

    def stop(self, grace_s: float = 2.0) -> None:
        """Finish the calls in flight (up to grace_s), stop, remove the socket."""
        super().stop(grace_s)
