# SPDX-License-Identifier: Apache-2.0
"""What the DRA plugin asks vgpud, over its gRPC socket: the GPUs, and claim slices.

A claim's slice has owner kind `claim`: vgpud's reconciler never frees it for want of a
container; the plugin releases it (NodeUnprepareResources, or its start-up reconcile).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from arbiter.proto import vgpu_pb2 as pb
from arbiter.proto import vgpu_pb2_grpc
from vgpu_k8s.dra.errors import VgpudError

__all__ = ["OWNER_KIND", "Gpu", "VGpuAsk", "Vgpud"]

OWNER_KIND = "claim"


@dataclass(frozen=True)
class Gpu:
    """One GPU as vgpud reports it."""

    index: int
    uuid: str
    name: str
    memory: int                # bytes
    driver_version: str = ""
    cuda_version: str = ""
    unhealthy: str = ""        # empty: healthy; else why not, in NVML's words


@dataclass(frozen=True)
class VGpuAsk:
    """One vGPU of a claim's slice: its amounts and the GPU (UUID) it must be on."""

    memory: int                # bytes
    compute: int               # percent
    gpu_uuid: str


def _details(e: grpc.RpcError) -> str:
    return e.details() or str(e.code())


class Vgpud:
    """A client of vgpud on its unix socket (the channel reconnects by itself)."""

    def __init__(self, socket: str, timeout_s: float = 5.0) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        # Reconnect soon after a vgpud restart (gRPC's default backoff grows to 2 min),
        # and let a call wait for the connection within its deadline.
        self._channel = grpc.insecure_channel(f"unix:{socket}", options=[
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000)])
        self._stub: Any = vgpu_pb2_grpc.ArbiterStub(self._channel)

    def _call(self, verb: str, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s,
                                               wait_for_ready=True)
        except grpc.RpcError as e:
            refused = e.code() not in (grpc.StatusCode.UNAVAILABLE,
                                       grpc.StatusCode.DEADLINE_EXCEEDED)
            cause = _details(e) if refused else f"vgpud at {self.socket}: {_details(e)}"
            raise VgpudError(verb, cause, refused=refused) from e

    def gpus(self) -> list[Gpu]:
        """Every GPU vgpud uses, healthy or not."""
        reply = self._call("list GPUs", "Devices", pb.DevicesRequest())
        return [Gpu(d.index, d.uuid, d.name, d.memory_total_bytes, d.driver_version,
                    d.cuda_version, d.unhealthy) for d in reply.devices]

    def paths(self) -> dict[str, str]:
        """Where vgpud keeps things (its Health answer): config, socket, libvgpu, hook..."""
        return dict(self._call("ask vgpud's health", "Health", pb.HealthRequest()).paths)

    def allocate(self, owner: str, vgpus: Sequence[VGpuAsk],
                 labels: Mapping[str, str]) -> tuple[Any, bool]:
        """The owner's slice (made now, or the one it has): (pb.Slice, existing)."""
        reply = self._call("allocate the claim's slice", "Allocate", pb.AllocateRequest(
            owner=owner, owner_kind=OWNER_KIND, labels=dict(labels),
            vgpus=[pb.VGpuRequest(memory_bytes=v.memory, compute_percent=v.compute,
                                  device=v.gpu_uuid) for v in vgpus]))
        return reply.slice, reply.existing

    def release(self, owner: str) -> bool:
        """Release the owner's slice (unconditionally: no container holds a claim's);
        False when it had none."""
        reply = self._call("release the claim's slice", "Release",
                           pb.ReleaseRequest(owner=owner))
        return bool(reply.released)

    def claim_slices(self) -> list[Any]:
        """Every slice of owner kind `claim`."""
        reply = self._call("list slices", "List", pb.ListRequest())
        return [s for s in reply.slices if s.owner_kind == OWNER_KIND]

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()
