# SPDX-License-Identifier: Apache-2.0
"""Registration with the kubelet's plugin watcher.

The watcher looks for sockets in `<kubelet dir>/plugins_registry/` (at its start it scans
the dir, then it watches it), calls GetInfo on each, checks the answer, dials the endpoint
named there, and says how that went with NotifyRegistrationStatus. A kubelet restart
needs nothing from the plugin's sockets but their still being there; a socket removed from
the dir (by hand, or by a cleanup) is made again by the agent. The kubelet also deletes
its node's ResourceSlices when it starts, so the agent looks at the published slice again
after each registration.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from vgpu_k8s.proto import pluginregistration_v1_pb2 as reg
from vgpu_k8s.proto import pluginregistration_v1_pb2_grpc as reg_grpc
from vgpu_k8s.unixserver import UnixGrpcServer

__all__ = ["PLUGIN_TYPE", "SUPPORTED_VERSIONS", "RegistrationServer", "registration_socket"]

log = logging.getLogger("vgpu-dra-plugin")

PLUGIN_TYPE = "DRAPlugin"
#: The DRA gRPC services served on the endpoint, in the kubelet's words (its
#: pkg/apis/dra/*/types.go DRAPluginService), newest first.
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


class _Servicer(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, info: reg.PluginInfo,
                 on_registered: Callable[[], None] | None = None) -> None:
        self.info = info
        self.registered = threading.Event()
        self.on_registered = on_registered

    def GetInfo(self, request: reg.InfoRequest,  # noqa: N802 - gRPC method name
                context: grpc.ServicerContext) -> reg.PluginInfo:
        return self.info

    def NotifyRegistrationStatus(self, request: reg.RegistrationStatus,  # noqa: N802
                                 context: grpc.ServicerContext
                                 ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("registered with the kubelet as DRA driver %s", self.info.name)
            self.registered.set()
            if self.on_registered is not None:
                self.on_registered()
        else:
            log.error("the kubelet refused the registration: %s",
                      " ".join(request.error.split()))
        return reg.RegistrationStatusResponse()


def registration_socket(registry_dir: Path, driver: str) -> Path:
    """The socket the kubelet's plugin watcher finds the driver by."""
    return registry_dir / f"{driver}-reg.sock"


class RegistrationServer(UnixGrpcServer):
    """Registration on `<registry dir>/<driver>-reg.sock`; `on_registered` is called (on
    a gRPC thread: keep it short) each time the kubelet says it took the plugin, which
    is also how a kubelet restart shows."""

    def __init__(self, registry_dir: Path, driver: str, endpoint: Path,
                 on_registered: Callable[[], None] | None = None) -> None:
        self.servicer = _Servicer(reg.PluginInfo(
            type=PLUGIN_TYPE, name=driver, endpoint=str(endpoint),
            supported_versions=list(SUPPORTED_VERSIONS)), on_registered)
        super().__init__(registration_socket(registry_dir, driver),
                         lambda server: reg_grpc.add_RegistrationServicer_to_server(
                             self.servicer, server), workers=2, name="dra-reg")

    def stop(self, grace_s: float = 0.5) -> None:
        """Stop and remove our socket file."""
        super().stop(grace_s)
