# SPDX-License-Identifier: Apache-2.0
"""A ResourceClaim's allocation, read as what vgpud must make: pure, the claim (a plain
resource.k8s.io/v1 object) and the node's GPUs in, a plan or a ClaimError out.

The allocation results of driver `vgpu.io` on this node's pool each name a device
(`gpu-<index>`) and, with consumable capacity, what the scheduler charged to it
(`consumedCapacity`: memory bytes, compute percent; an amount it left out is the
request policy's default, resourceslice.py) and a `shareID`. The claim becomes one slice:
one vGPU per GPU it was given. Two results on one GPU (two requests of the claim placed
on the same device) become one vGPU with the sum of their amounts, which is what the
scheduler charged to that GPU; a sum above 100 % compute is refused.

The slice's owner key is the claim's UID and a digest of its shareIDs: a claim that was
deallocated and allocated again (same UID, new shares) gets a new slice, a retry the same.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils import parse_quantity

from vgpu_k8s.dra.errors import ClaimError
from vgpu_k8s.dra.resourceslice import (
    COMPUTE,
    COMPUTE_MAX,
    COMPUTE_MIN,
    DRIVER,
    MEMORY,
    MEMORY_STEP,
    device_name,
    gpu_index,
)
from vgpu_k8s.dra.vgpud import Gpu, VGpuAsk

__all__ = ["OWNER_PREFIX", "AnsweredDevice", "ClaimRef", "Plan", "owner_key", "plan"]

#: Every claim slice this plugin makes has an owner that starts so.
OWNER_PREFIX = "vgpu.io/claim/"


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class AnsweredDevice:
    """One device of the kubelet's answer (CDI IDs added when the spec is written)."""

    request: str         # the claim's request the result is for (the kubelet routes by it)
    pool: str
    device: str


@dataclass(frozen=True)
class Plan:
    """What one claim needs: the slice's owner key, its vGPUs, and the answer's devices."""

    claim: ClaimRef
    owner: str
    vgpus: tuple[VGpuAsk, ...]
    devices: tuple[AnsweredDevice, ...]


def owner_key(uid: str, share_ids: Sequence[str]) -> str:
    """vgpud's owner for the claim's slice: its UID, and a digest of its shareIDs if any
    (a UID is 36 characters; the digest keeps the key short whatever the share count)."""
    if not share_ids:
        return f"{OWNER_PREFIX}{uid}"
    digest = hashlib.sha256(",".join(sorted(share_ids)).encode()).hexdigest()[:16]
    return f"{OWNER_PREFIX}{uid}/{digest}"


def _amount(claim: ClaimRef, result: Mapping[str, Any], key: str, default: int) -> int:
    consumed = result.get("consumedCapacity") or {}
    if not isinstance(consumed, Mapping):
        raise ClaimError(str(claim), f"device {result.get('device')}: consumedCapacity is "
                         "not a map")
    if key not in consumed:
        return default
    text = consumed[key]
    try:
        value = parse_quantity(text)  # type: ignore[no-untyped-call]
    except (ValueError, InvalidOperation, TypeError):
        raise ClaimError(str(claim), f"device {result.get('device')}: consumedCapacity "
                         f"{key}={text!r} is not a quantity") from None
    if value != value.to_integral_value() or value < 0:
        raise ClaimError(str(claim), f"device {result.get('device')}: consumedCapacity "
                         f"{key}={text!r} is not a whole number")
    return int(Decimal(value))


def plan(claim_obj: Mapping[str, Any], ref: ClaimRef, node: str,
         gpus: Sequence[Gpu]) -> Plan:
    """The plan of one allocated claim on this node; ClaimError says why there is none."""
    meta = claim_obj.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise ClaimError(str(ref), f"the API server has UID {meta.get('uid')!r}, the kubelet "
                         f"asked for {ref.uid!r} (the claim was deleted and made again)")
    allocation = (claim_obj.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(str(ref), "is not allocated")
    results = [r for r in ((allocation.get("devices") or {}).get("results") or [])
               if isinstance(r, Mapping) and r.get("driver") == DRIVER]
    ours = [r for r in results if r.get("pool") == node]
    if not ours:
        where = f" (pools {', '.join(sorted({str(r.get('pool')) for r in results}))})" \
            if results else ""
        raise ClaimError(str(ref), f"has no device of driver {DRIVER} in pool {node}{where}")
    by_index = {g.index: g for g in gpus}
    # GPU uuid -> [memory, compute], in the order of first appearance.
    amounts: dict[str, list[int]] = {}
    devices: list[AnsweredDevice] = []
    shares: list[str] = []
    for r in ours:
        name = str(r.get("device"))
        index = gpu_index(name)
        gpu = by_index.get(index) if index is not None else None
        if gpu is None:
            known = ", ".join(device_name(i) for i in sorted(by_index)) or "none"
            raise ClaimError(str(ref), f"device {name} is not a GPU of this node ({known})")
        if gpu.unhealthy:
            raise ClaimError(str(ref), f"device {name} ({gpu.uuid}) is unhealthy: "
                             f"{gpu.unhealthy}")
        memory = _amount(ref, r, MEMORY, gpu.memory - gpu.memory % MEMORY_STEP)
        compute = _amount(ref, r, COMPUTE, COMPUTE_MAX)
        if memory < 1:
            raise ClaimError(str(ref), f"device {name}: consumedCapacity memory must be > 0")
        slot = amounts.setdefault(gpu.uuid, [0, 0])
        slot[0] += memory
        slot[1] += compute
        if r.get("shareID"):
            shares.append(str(r["shareID"]))
        devices.append(AnsweredDevice(str(r.get("request") or ""), node, name))
    for uuid, (memory, compute) in amounts.items():
        name = device_name(next(g.index for g in gpus if g.uuid == uuid))
        if memory > next(g.memory for g in gpus if g.uuid == uuid):
            raise ClaimError(str(ref), f"device {name}: {memory} bytes of memory is more than "
                             "the GPU has")
        if not COMPUTE_MIN <= compute <= COMPUTE_MAX:
            raise ClaimError(str(ref), f"device {name}: compute {compute} is not a percent "
                             f"from {COMPUTE_MIN} to {COMPUTE_MAX}")
    return Plan(claim=ref, owner=owner_key(ref.uid, shares),
                vgpus=tuple(VGpuAsk(m, c, u) for u, (m, c) in amounts.items()),
                devices=tuple(devices))
