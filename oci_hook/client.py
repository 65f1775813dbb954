# SPDX-License-Identifier: Apache-2.0
"""vgpud over gRPC, as the hook needs it: Allocate, Attach, Get and Release with bounded waits.

grpc and the generated stubs are imported when a Vgpud is made, never on the path of a
container without a request (the hook's start-up time counts in every container start).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from arbiter.model import Request
from oci_hook.errors import VgpudError

__all__ = ["SliceView", "VGpuView", "Vgpud", "import_grpc"]

# Reconnect quickly while vgpud comes up: gRPC's default first backoff is a whole second.
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.enable_http_proxy", 0),
)


@dataclass(frozen=True)
class VGpuView:
    """One vGPU of a slice, as the mounts need it."""

    index: int
    gpu_uuid: str
    region_path: str
    device_nodes: tuple[str, ...]


@dataclass(frozen=True)
class SliceView:
    """A granted slice, as the mounts need it."""

    id: str
    owner: str
    region_dir: str
    vgpus: tuple[VGpuView, ...]


def import_grpc() -> Any:
    """grpc, imported quietly: a runtime's or hook's stderr is the one line the engine
    shows the user, so gRPC's own log lines (e.g. a transient thread-creation retry)
    must not add to it; our errors are reported by us."""
    if "grpc" not in sys.modules:
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    import grpc

    return grpc


class Vgpud:
    """A channel to vgpud's unix socket; every call has a deadline."""

    def __init__(self, socket: str, stub: Any = None) -> None:
        """A channel to `socket`; or, with `stub` (vgpud's in-process one), no channel."""
        grpc = import_grpc()

        from arbiter.proto import vgpu_pb2, vgpu_pb2_grpc

        self.socket = socket
        self._grpc: Any = grpc
        self.pb: Any = vgpu_pb2
        self._channel = None if stub is not None else grpc.insecure_channel(
            f"unix:{socket}", options=_CHANNEL_OPTIONS)
        self._stub = stub if stub is not None else vgpu_pb2_grpc.ArbiterStub(self._channel)

    def close(self) -> None:
        """Close the channel (before the process forks or exits)."""
        if self._channel is not None:
            self._channel.close()

    def _call(self, verb: str, method: str, request: Any, timeout: float,
              wait: bool) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=max(timeout, 0.05),
                                               wait_for_ready=wait)
        except self._grpc.RpcError as e:
            raise self._error(verb, e, timeout, wait) from None

    def _error(self, verb: str, e: Any, timeout: float, wait: bool) -> VgpudError:
        code = e.code()
        status = self._grpc.StatusCode
        details = " ".join((e.details() or code.name).split())
        if code == status.UNAVAILABLE or (code == status.DEADLINE_EXCEEDED and wait):
            return VgpudError(verb, f"vgpud at {self.socket} did not answer within "
                                    f"{timeout:g}s (is vgpud running?)", unavailable=True)
        if code == status.DEADLINE_EXCEEDED:
            return VgpudError(verb, f"vgpud at {self.socket} did not answer within {timeout:g}s")
        return VgpudError(verb, details, not_found=code == status.NOT_FOUND)

    def allocate(self, req: Request, given: frozenset[str], *, timeout: float,
                 wait: bool = True) -> SliceView:
        """The owner's slice (made now, or the one it has); `given` names the keys the
        request set, so vgpud applies its own config defaults to the others."""
        from arbiter.convert import request_to_proto

        msg = request_to_proto(req)
        if "vgpu.io/compute" not in given:
            msg.compute_percent = 0
        if "vgpu.io/priority" not in given:
            msg.priority = 0
        if "vgpu.io/policy" not in given:
            msg.policy = 0
        resp = self._call("allocate a vGPU", "Allocate", msg, timeout, wait)
        return _view(resp.slice)

    def get(self, slice_id: str, *, timeout: float, wait: bool = True) -> SliceView:
        """The slice with that id."""
        return _view(self._call("get the vGPU slice", "Get", self.pb.GetRequest(id=slice_id),
                                timeout, wait))

    def attach(self, slice_id: str, owner: str, pid: int, bundle: str, *, timeout: float,
               wait: bool = True) -> SliceView:
        """Bind the slice vgpu-runtime allocated to the container's init (prestart)."""
        request = self.pb.AttachRequest(id=slice_id, owner=owner, owner_pid=pid, bundle=bundle)
        try:
            return _view(self._stub.Attach(request, timeout=max(timeout, 0.05),
                                           wait_for_ready=wait))
        except self._grpc.RpcError as e:
            if e.code() != self._grpc.StatusCode.UNIMPLEMENTED:
                raise self._error("allocate a vGPU", e, timeout, wait) from None
        # An older vgpud: the slice as it is (it judges liveness by runtime state).
        return self.get(slice_id, timeout=timeout, wait=wait)

    def release(self, owner: str, *, timeout: float, wait: bool = True, pid: int = 0,
                bundle: str = "") -> bool:
        """Release the owner's slice; False when it had none (release is idempotent) or,
        when the container asking names itself (pid, bundle), when it does not hold it."""
        resp = self._call("release the vGPU slice", "Release",
                          self.pb.ReleaseRequest(owner=owner, owner_pid=pid, bundle=bundle),
                          timeout, wait)
        return bool(resp.released)


def _view(msg: Any) -> SliceView:
    return SliceView(
        id=msg.id, owner=msg.owner, region_dir=msg.region_dir,
        vgpus=tuple(VGpuView(index=v.index, gpu_uuid=v.gpu_uuid, region_path=v.region_path,
                             device_nodes=tuple(v.device_nodes)) for v in msg.vgpus))
