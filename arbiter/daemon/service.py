# SPDX-License-Identifier: Apache-2.0
"""The gRPC servicer: a thin adapter from vgpu.v1.Arbiter calls to arbiter.slices.arbiter.Arbiter.

Every error becomes a gRPC status with the error's one-line message:
no capacity -> RESOURCE_EXHAUSTED; a bad request, pin, count or quantity ->
INVALID_ARGUMENT; no such slice -> NOT_FOUND; a state conflict (an owner held by
another live container) -> ABORTED;
state, region or anything unexpected -> INTERNAL (logged with its traceback).
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import grpc

from arbiter.convert import device_to_proto, request_from_proto, slice_to_proto
from arbiter.errors import (
    BadPinError,
    CountError,
    NoCapacityError,
    NotFoundError,
    QuantityError,
    RegionError,
    RequestError,
    StateError,
    VgpuError,
)
from arbiter.model import Slice
from arbiter.proto import vgpu_pb2 as pb
from arbiter.proto import vgpu_pb2_grpc
from arbiter.slices.arbiter import Arbiter, HeldError
from arbiter.version import version

__all__ = ["ArbiterService", "status_for"]

log = logging.getLogger("vgpud")

T = TypeVar("T")


_VERSION = version()


def status_for(e: BaseException) -> grpc.StatusCode:
    """The gRPC status code an error maps to."""
    if isinstance(e, NoCapacityError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(e, BadPinError | CountError | QuantityError | RequestError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(e, NotFoundError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(e, StateError):
        if e.code == StateError.NOT_FOUND:
            return grpc.StatusCode.NOT_FOUND
        if e.code == StateError.CONFLICT:
            return grpc.StatusCode.ABORTED
        return grpc.StatusCode.INTERNAL
    if isinstance(e, RegionError):
        return grpc.StatusCode.INTERNAL
    if isinstance(e, VgpuError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL


def _rpc(verb: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Turn exceptions of a servicer method into a status with a one-line message."""
    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def method(self: ArbiterService, request: Any, context: grpc.ServicerContext) -> T:
            try:
                return fn(self, request, context)
            except VgpuError as e:
                code = status_for(e)
                if code == grpc.StatusCode.INTERNAL:
                    log.error("%s: %s", verb, e)
                context.abort(code, str(e))
            except Exception as e:
                log.exception("%s failed", verb)
                context.abort(grpc.StatusCode.INTERNAL,
                              f"failed to {verb}: internal error: {type(e).__name__}: {e}")
            raise AssertionError("unreachable")  # context.abort raises
        return method
    return wrap


class ArbiterService(vgpu_pb2_grpc.ArbiterServicer):  # type: ignore[misc]
    """vgpu.v1.Arbiter served from one Arbiter."""

    def __init__(self, arbiter: Arbiter, paths: Mapping[str, str] | None = None) -> None:
        self.arbiter = arbiter
        self.paths = dict(paths or {})

    def _slice(self, s: Slice, *, with_usage: bool = True) -> pb.Slice:
        a = self.arbiter
        return slice_to_proto(s, region_dir=a.region_dir(s),
                              used=a.usage(s) if with_usage else (),
                              device_nodes=a.device_nodes())

    @_rpc("allocate slice")
    def Allocate(self, request: pb.AllocateRequest,  # noqa: N802 - gRPC method name
                 context: grpc.ServicerContext) -> pb.AllocateResponse:
        """Allocate (idempotent per owner)."""
        compute, priority, policy = self.arbiter.defaults()
        req = request_from_proto(request, default_compute=compute, default_priority=priority,
                                 default_policy=policy)
        result = self.arbiter.allocate(req)
        return pb.AllocateResponse(slice=self._slice(result.slice, with_usage=result.existing),
                                   existing=result.existing, evicted=list(result.evicted))

    @_rpc("release slice")
    def Release(self, request: pb.ReleaseRequest,  # noqa: N802
                context: grpc.ServicerContext) -> pb.ReleaseResponse:
        """Release by id or owner; released=False when there was no such slice, or when
        the container asking (owner_pid, bundle) does not hold it (kept says why)."""
        try:
            s = self.arbiter.release(request.id, request.owner, pid=request.owner_pid,
                                     bundle=request.bundle,
                                     asker=bool(request.owner_pid or request.bundle))
        except HeldError as e:
            return pb.ReleaseResponse(released=False, id=e.slice.id, kept=str(e))
        return pb.ReleaseResponse(released=s is not None, id=s.id if s else request.id)

    @_rpc("attach slice")
    def Attach(self, request: pb.AttachRequest,  # noqa: N802
               context: grpc.ServicerContext) -> pb.Slice:
        """Bind the owner's slice to its container's init (prestart)."""
        return self._slice(self.arbiter.attach(request.id, request.owner, request.owner_pid,
                                               request.bundle), with_usage=False)

    @_rpc("get slice")
    def Get(self, request: pb.GetRequest,  # noqa: N802
            context: grpc.ServicerContext) -> pb.Slice:
        """One slice by id or owner."""
        return self._slice(self.arbiter.get(request.id, request.owner))

    @_rpc("list slices")
    def List(self, request: pb.ListRequest,  # noqa: N802
             context: grpc.ServicerContext) -> pb.ListResponse:
        """Every slice."""
        return pb.ListResponse(slices=[self._slice(s) for s in self.arbiter.slices()])

    @_rpc("list devices")
    def Devices(self, request: pb.DevicesRequest,  # noqa: N802
                context: grpc.ServicerContext) -> pb.DevicesResponse:
        """Every GPU with allocated and measured use."""
        return pb.DevicesResponse(devices=[device_to_proto(d) for d in self.arbiter.devices()])

    @_rpc("update slice")
    def Update(self, request: pb.UpdateRequest,  # noqa: N802
               context: grpc.ServicerContext) -> pb.Slice:
        """Change a slice's limits in place."""
        s = self.arbiter.update(request.id, request.memory_bytes, request.compute_percent)
        return self._slice(s)

    @_rpc("check health")
    def Health(self, request: pb.HealthRequest,  # noqa: N802
               context: grpc.ServicerContext) -> pb.HealthResponse:
        """Liveness and counts."""
        h = self.arbiter.health()
        return pb.HealthResponse(status=h.status, version=_VERSION, devices=h.devices,
                                 slices=h.slices, uptime_seconds=h.uptime_seconds,
                                 paths=self.paths)
