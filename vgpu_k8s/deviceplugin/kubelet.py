# SPDX-License-Identifier: Apache-2.0
"""Registration with the kubelet, and noticing when the kubelet restarted.

The kubelet serves Registration on `<dir>/kubelet.sock`. When it restarts it makes a new
socket (a new inode) and removes every other file in the dir, our sockets included; it
then knows no plugin until each registers again. So a restart is seen by a poll of the
socket's inode (cheap, no inotify dependency), and answered by serving anew and
registering again.
"""
from __future__ import annotations

import os
from pathlib import Path

import grpc

from vgpu_k8s.deviceplugin.plugin import Endpoint
from vgpu_k8s.proto import deviceplugin_v1beta1_pb2 as api
from vgpu_k8s.proto import deviceplugin_v1beta1_pb2_grpc as api_grpc

__all__ = ["API_VERSION", "KUBELET_SOCKET", "RegistrationError", "inode", "register"]

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


class RegistrationError(Exception):
    """The kubelet did not take a registration (not there yet, or it refused)."""


def inode(path: Path) -> int:
    """The file's inode, 0 when there is none."""
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return 0


def register(kubelet_dir: Path, endpoint: Endpoint, timeout_s: float = 5.0) -> None:
    """Register one endpoint with the kubelet (it then dials our socket by its name)."""
    channel = grpc.insecure_channel(f"unix:{kubelet_dir / KUBELET_SOCKET}")
    try:
        api_grpc.RegistrationStub(channel).Register(api.RegisterRequest(
            version=API_VERSION, endpoint=endpoint.socket.name,
            resource_name=endpoint.resource, options=endpoint.options), timeout=timeout_s)
    except grpc.RpcError as e:
        raise RegistrationError(f"failed to register {endpoint.resource} with the kubelet at "
                                f"{kubelet_dir / KUBELET_SOCKET}: {e.details() or e.code()}"
                                ) from e
    finally:
        channel.close()
