# SPDX-License-Identifier: Apache-2.0
"""The node's GPUs as vgpud reports them (its Devices RPC), and the device lists they make.

While vgpud does not answer (a restart, an upgrade) the plugin keeps the last list it
got: containers cannot start meanwhile anyway (the hook asks vgpud), and a restart must
not shrink the node's capacity. After `grace_s` without an answer every device turns
Unhealthy, so the scheduler stops sending pods; the first answer brings them back.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from arbiter.proto import vgpu_pb2 as pb
from arbiter.proto import vgpu_pb2_grpc
from vgpu_k8s.deviceplugin.ids import COMPUTE_PER_GPU, MEMORY, device_id
from vgpu_k8s.errors import VgpudUnreachableError

__all__ = ["HEALTHY", "UNHEALTHY", "Gpu", "Vgpud", "device_list", "health_of"]

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class Gpu:
    """What the plugin needs of one GPU: its UUID, size and why it is unusable (if it is)."""

    index: int
    uuid: str
    memory: int          # bytes
    unhealthy: str = ""  # empty: healthy
    device_nodes: tuple[str, ...] = ()   # host paths, as vgpud's inventory names them


class Vgpud:
    """A client of vgpud's Devices RPC on its unix socket (reconnects by itself)."""

    def __init__(self, socket: str, timeout_s: float = 2.0) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(f"unix:{socket}")
        self._stub: Any = vgpu_pb2_grpc.ArbiterStub(self._channel)

    def gpus(self) -> list[Gpu]:
        """Every GPU vgpud uses; VgpudUnreachableError when it does not answer."""
        try:
            reply = self._stub.Devices(pb.DevicesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise VgpudUnreachableError(self.socket, e.details() or str(e.code())) from e
        return [Gpu(d.index, d.uuid, d.memory_total_bytes, d.unhealthy, tuple(d.device_nodes))
                for d in reply.devices]

    def paths(self) -> dict[str, str]:
        """Where vgpud keeps things (its Health answer: hook, socket, config, ...);
        VgpudUnreachableError when it does not answer."""
        try:
            reply = self._stub.Health(pb.HealthRequest(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise VgpudUnreachableError(self.socket, e.details() or str(e.code())) from e
        return dict(reply.paths)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


def device_list(resource: str, gpus: Sequence[Gpu], memory_unit: int,
                down: bool = False) -> list[tuple[str, str]]:
    """(ID, health) of every device of resource on gpus; down: vgpud is gone for long."""
    out: list[tuple[str, str]] = []
    for g in gpus:
        health = UNHEALTHY if down or g.unhealthy else HEALTHY
        count = g.memory // memory_unit if resource == MEMORY else COMPUTE_PER_GPU
        out += [(device_id(resource, g.uuid, n), health) for n in range(count)]
    return out


def health_of(fetch: Callable[[], list[Gpu]], last: list[Gpu] | None, down_since: float | None,
              grace_s: float, now: Callable[[], float] = time.monotonic
              ) -> tuple[list[Gpu] | None, float | None, bool, str]:
    """One poll of vgpud: (GPUs to advertise, unreachable since, all down, error line).

    The GPUs are the answer, or the last answer while vgpud is unreachable; down is
    true once it has been unreachable for grace_s.
    """
    try:
        return fetch(), None, False, ""
    except VgpudUnreachableError as e:
        since = down_since if down_since is not None else now()
        return last, since, now() - since >= grace_s, str(e)

