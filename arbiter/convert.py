# SPDX-License-Identifier: Apache-2.0
"""Conversions between the model (arbiter.model) and the gRPC messages (arbiter.proto).

The proto enums keep 0 for "unspecified" (the config's default), so their
values are the model's (the region file's) plus one.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from arbiter.errors import RequestError
from arbiter.model import Gpu, Grant, OwnerKind, Policy, Priority, Request, Slice, VGpuAsk
from arbiter.proto import vgpu_pb2 as pb

__all__ = [
    "DeviceView",
    "device_to_proto",
    "policy_from_name",
    "policy_from_proto",
    "policy_to_proto",
    "priority_from_name",
    "priority_from_proto",
    "priority_to_proto",
    "request_from_proto",
    "request_to_proto",
    "slice_from_proto",
    "slice_to_proto",
]

_U32_MAX = (1 << 32) - 1
_OFFSET = 1  # proto value = model value + 1; 0 = unspecified


@dataclass(frozen=True)
class DeviceView:
    """One GPU with what the slices hold on it and what NVML measures."""

    gpu: Gpu
    memory_allocated: int
    compute_allocated: int
    slices: int
    memory_used: int = 0
    utilization: int = 0
    unhealthy: str = ""      # why NVML cannot use the GPU now; empty: healthy
    driver_version: str = ""  # NVML's, e.g. "570.86.15"
    cuda_version: str = ""    # the driver's CUDA version, e.g. "12.8"
    broker: str = ""          # why its token broker does not serve it; empty: it does


def priority_from_name(name: str) -> Priority:
    """Priority for a config/CLI word such as ``normal``."""
    try:
        return Priority[name.upper()]
    except KeyError:
        raise RequestError("read priority", "priority", name,
                           "is not one of high, normal, low") from None


def policy_from_name(name: str) -> Policy:
    """Policy for a config/CLI word such as ``fixed``."""
    try:
        return Policy[name.upper()]
    except KeyError:
        raise RequestError("read policy", "policy", name, "is not one of fixed, burst") from None


def priority_to_proto(p: Priority) -> int:
    """Proto Priority value of a model priority."""
    return int(p) + _OFFSET


def policy_to_proto(p: Policy) -> int:
    """Proto Policy value of a model policy."""
    return int(p) + _OFFSET


def priority_from_proto(value: int, default: Priority) -> Priority:
    """Model priority of a proto value; UNSPECIFIED is `default`, unknown values are refused."""
    if value == pb.PRIORITY_UNSPECIFIED:
        return default
    try:
        return Priority(value - _OFFSET)
    except ValueError:
        raise RequestError("allocate slice", "priority", value,
                           "is not a known priority (LOW=1, NORMAL=2, HIGH=3)") from None


def policy_from_proto(value: int, default: Policy) -> Policy:
    """Model policy of a proto value; UNSPECIFIED is `default`, unknown values are refused."""
    if value == pb.POLICY_UNSPECIFIED:
        return default
    try:
        return Policy(value - _OFFSET)
    except ValueError:
        raise RequestError("allocate slice", "policy", value,
                           "is not a known policy (FIXED=1, BURST=2)") from None


def request_from_proto(msg: pb.AllocateRequest, *, default_compute: int,
                       default_priority: Priority, default_policy: Policy) -> Request:
    """Model request of an AllocateRequest, the config's defaults filling unset fields.

    Range checks (owner, memory, compute, count) are the arbiter's (core.validate). With
    `vgpus` set, memory_bytes, compute_percent, count and devices must be unset (each vGPU
    names its own); a RequestError names the first that is not.
    """
    vgpus = tuple(VGpuAsk(v.memory_bytes, v.compute_percent or default_compute, v.device)
                  for v in msg.vgpus)
    if vgpus:
        for key, value in (("memory_bytes", msg.memory_bytes),
                           ("compute_percent", msg.compute_percent), ("count", msg.count),
                           ("devices", list(msg.devices))):
            if value:
                raise RequestError("allocate slice", key, value,
                                   "must be unset when vgpus is set (each vGPU names its own "
                                   "memory, compute and device)")
    return Request(
        owner=msg.owner,
        memory=msg.memory_bytes,
        compute=0 if vgpus else msg.compute_percent or default_compute,
        count=len(vgpus) or msg.count or 1,
        priority=priority_from_proto(msg.priority, default_priority),
        policy=policy_from_proto(msg.policy, default_policy),
        devices=tuple(msg.devices),
        vgpus=vgpus,
        owner_kind=msg.owner_kind or OwnerKind.CONTAINER,
        owner_pid=msg.owner_pid,
        labels=tuple(sorted(msg.labels.items())),
        bundle=msg.bundle,
    )


def request_to_proto(r: Request) -> pb.AllocateRequest:
    """AllocateRequest of a model request (clients)."""
    if r.vgpus:
        return pb.AllocateRequest(
            owner=r.owner, priority=priority_to_proto(r.priority),
            policy=policy_to_proto(r.policy), owner_kind=r.owner_kind, owner_pid=r.owner_pid,
            labels=dict(r.labels), bundle=r.bundle,
            vgpus=[pb.VGpuRequest(memory_bytes=a.memory, compute_percent=a.compute,
                                  device=a.device) for a in r.vgpus],
        )
    return pb.AllocateRequest(
        owner=r.owner, memory_bytes=r.memory, compute_percent=r.compute, count=r.count,
        priority=priority_to_proto(r.priority), policy=policy_to_proto(r.policy),
        devices=list(r.devices), owner_kind=r.owner_kind, owner_pid=r.owner_pid,
        labels=dict(r.labels), bundle=r.bundle,
    )


def slice_to_proto(s: Slice, *, region_dir: str = "", used: Sequence[int] = (),
                   device_nodes: Mapping[int, Sequence[str]] | None = None) -> pb.Slice:
    """Slice message of a model slice; `used` holds libvgpu's usage per vGPU."""
    nodes = device_nodes or {}
    vgpus = []
    for i, g in enumerate(s.grants):
        vgpus.append(pb.VGpu(
            index=i, gpu_index=g.gpu_index, gpu_uuid=g.gpu_uuid, memory_bytes=g.memory,
            compute_percent=g.compute,
            region_path=f"{region_dir}/vgpu{i}" if region_dir else "",
            memory_used_bytes=used[i] if i < len(used) else 0,
            device_nodes=list(nodes.get(g.gpu_index, ())),
        ))
    return pb.Slice(
        id=s.id, owner=s.owner, owner_kind=s.owner_kind, owner_pid=min(s.owner_pid, _U32_MAX),
        priority=priority_to_proto(s.priority), policy=policy_to_proto(s.policy),
        vgpus=vgpus, region_dir=region_dir, created_unix_ms=s.created_ms, labels=dict(s.labels),
        owner_start=s.owner_start, owner_cgroup=s.owner_cgroup, owner_bundle=s.owner_bundle,
        libvgpu_version=s.libvgpu_version,
    )


def slice_from_proto(msg: pb.Slice) -> Slice:
    """Model slice of a Slice message (clients)."""
    return Slice(
        id=msg.id, owner=msg.owner,
        grants=tuple(Grant(v.gpu_index, v.gpu_uuid, v.memory_bytes, v.compute_percent)
                     for v in msg.vgpus),
        priority=priority_from_proto(msg.priority, Priority.NORMAL),
        policy=policy_from_proto(msg.policy, Policy.FIXED),
        owner_kind=msg.owner_kind, owner_pid=msg.owner_pid, created_ms=msg.created_unix_ms,
        labels=tuple(sorted(msg.labels.items())),
        owner_start=msg.owner_start, owner_cgroup=msg.owner_cgroup,
        owner_bundle=msg.owner_bundle, libvgpu_version=msg.libvgpu_version,
    )


def device_to_proto(d: DeviceView) -> pb.Device:
    """Device message of a device view."""
    g = d.gpu
    return pb.Device(
        index=g.index, uuid=g.uuid, name=g.name, memory_total_bytes=g.memory,
        memory_allocated_bytes=d.memory_allocated, memory_used_bytes=d.memory_used,
        compute_allocated_percent=d.compute_allocated, minor=max(g.minor, 0),
        device_nodes=list(g.device_nodes), slices=d.slices,
        utilization_percent=d.utilization, unhealthy=d.unhealthy,
        driver_version=d.driver_version, cuda_version=d.cuda_version, broker=d.broker,
    )
