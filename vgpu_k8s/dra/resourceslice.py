# SPDX-License-Identifier: Apache-2.0
"""The node's ResourceSlice (resource.k8s.io/v1) as a plain object: one device per healthy
GPU, shareable (`allowMultipleAllocations`), with consumable capacities.

Pure: GPUs in, the object out. Capacities:
- `memory`: the GPU's memory in bytes; a request takes 1Mi at least, in steps of 1Mi;
  a request that names no amount takes the whole GPU (the default must be a multiple of
  the step, so the memory rounded down to 1Mi).
- `compute`: 100 (percent of the GPU); a request takes 2..100 in steps of 1, 100 when it
  names no amount. A claim that asks for a plain `vgpu.io` device with no capacity thus
  gets a whole GPU to itself.
One slice holds the node's whole pool (a node has far fewer GPUs than a slice may hold),
so `resourceSliceCount` is 1 and every change bumps the pool's generation.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from vgpu_k8s.dra.vgpud import Gpu

__all__ = [
    "API_VERSION",
    "COMPUTE",
    "COMPUTE_MAX",
    "COMPUTE_MIN",
    "DRIVER",
    "MEMORY",
    "MEMORY_STEP",
    "device_name",
    "dropped_sharing_fields",
    "gpu_index",
    "published_gpus",
    "resource_slice",
    "slice_name",
    "version_attribute",
]

DRIVER = "vgpu.io"
API_VERSION = "resource.k8s.io/v1"
MEMORY = "memory"
COMPUTE = "compute"
MEMORY_STEP = 1 << 20     # 1Mi: vgpud's granularity
COMPUTE_MIN = 2
COMPUTE_MAX = 100

_DEVICE_RE = re.compile(r"gpu-(0|[1-9][0-9]{0,3})", re.ASCII)
_VERSION_RE = re.compile(r"[0-9]+(\.[0-9]+){0,2}", re.ASCII)


def device_name(index: int) -> str:
    """The device name of the GPU with that index."""
    return f"gpu-{index}"


def gpu_index(name: str) -> int | None:
    """The GPU index a device name stands for; None when it is not one of ours."""
    m = _DEVICE_RE.fullmatch(name)
    return int(m[1]) if m else None


def slice_name(node: str) -> str:
    """The name of the node's ResourceSlice (one per node and driver)."""
    return f"{node}-{DRIVER}"


def version_attribute(text: str) -> dict[str, str]:
    """A driver/CUDA version as a DRA attribute: a semantic version (`12.8` -> `12.8.0`;
    leading zeros dropped: NVIDIA writes `535.104.05`) so CEL can compare it, else the
    plain string."""
    if not _VERSION_RE.fullmatch(text):
        return {"string": text}
    parts = [str(int(p)) for p in text.split(".")]
    return {"version": ".".join(parts + ["0"] * (3 - len(parts)))}


def published_gpus(gpus: Sequence[Gpu]) -> list[Gpu]:
    """The GPUs the slice offers: the healthy ones, by index."""
    return sorted((g for g in gpus if not g.unhealthy), key=lambda g: g.index)


def _device(g: Gpu) -> dict[str, Any]:
    attributes: dict[str, Any] = {"uuid": {"string": g.uuid}, "index": {"int": g.index}}
    if g.name:
        attributes["productName"] = {"string": g.name}
    if g.driver_version:
        attributes["driverVersion"] = version_attribute(g.driver_version)
    if g.cuda_version:
        attributes["cudaVersion"] = version_attribute(g.cuda_version)
    whole = g.memory - g.memory % MEMORY_STEP
    return {
        "name": device_name(g.index),
        "allowMultipleAllocations": True,
        "attributes": attributes,
        "capacity": {
            MEMORY: {"value": str(g.memory), "requestPolicy": {
                "default": str(whole),
                "validRange": {"min": str(MEMORY_STEP), "step": str(MEMORY_STEP)}}},
            COMPUTE: {"value": str(COMPUTE_MAX), "requestPolicy": {
                "default": str(COMPUTE_MAX),
                "validRange": {"min": str(COMPUTE_MIN), "max": str(COMPUTE_MAX),
                               "step": "1"}}},
        },
    }


def resource_slice(node: str, gpus: Sequence[Gpu], generation: int) -> dict[str, Any]:
    """The node's ResourceSlice for its healthy GPUs (none: a slice with no devices,
    so the pool says the node has nothing rather than nothing being known)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [_device(g) for g in published_gpus(gpus)],
        },
    }


def dropped_sharing_fields(sent: Sequence[Any], stored: Sequence[Any]) -> list[str]:
    """The sharing fields the API server did not keep: `allowMultipleAllocations` and the
    capacities' `requestPolicy` of the devices sent, looked for in the devices it stored.
    A server without the DRAConsumableCapacity feature gate drops both without an error
    (its ResourceSlice strategy clears them on create, and on update unless the old slice
    had them), so only reading back what was stored tells."""
    kept = {d.get("name"): d for d in stored if isinstance(d, dict)}
    missing: list[str] = []
    for d in sent:
        got = kept.get(d["name"]) or {}
        if d.get("allowMultipleAllocations") and not got.get("allowMultipleAllocations"):
            missing.append("allowMultipleAllocations")
        for key, capacity in (d.get("capacity") or {}).items():
            if "requestPolicy" in capacity and \
                    "requestPolicy" not in ((got.get("capacity") or {}).get(key) or {}):
                missing.append("requestPolicy")
    return sorted(set(missing))
