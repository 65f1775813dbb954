# SPDX-License-Identifier: Apache-2.0
"""The device IDs the plugin advertises: every ID names its GPU by UUID.

`vgpu.io/memory`: `<gpu-uuid>-mem-<n>`, one per memory unit of the GPU (n from 0);
`vgpu.io/compute`: `<gpu-uuid>-compute-<n>`, one per percent, 100 per GPU. A UUID survives
reboots and re-enumeration, so the IDs the kubelet checkpointed keep naming the same GPU,
and Allocate needs no lookup to turn an ID into its GPU. NVML UUIDs are 40 characters
(`GPU-` and 36), well inside the 63 the API allows.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["COMPUTE", "COMPUTE_PER_GPU", "MEMORY", "Kind", "device_id", "parse_id"]

MEMORY = "vgpu.io/memory"
COMPUTE = "vgpu.io/compute"
COMPUTE_PER_GPU = 100

#: Resource -> the infix of its IDs.
_INFIX = {MEMORY: "mem", COMPUTE: "compute"}
_ID_RE = re.compile(r"(?P<gpu>[A-Za-z0-9_.:-]+?)-(?P<infix>mem|compute)-(?P<n>0|[1-9][0-9]*)",
                    re.ASCII)
_MAX_ID = 63


@dataclass(frozen=True)
class Kind:
    """What one ID stands for: unit n of resource on GPU gpu (its UUID)."""

    resource: str
    gpu: str
    n: int


def device_id(resource: str, gpu_uuid: str, n: int) -> str:
    """The ID of unit n of resource on the GPU with that UUID."""
    return f"{gpu_uuid}-{_INFIX[resource]}-{n}"


def parse_id(resource: str, text: str) -> Kind | None:
    """What an ID of resource names, or None when it is not one of ours."""
    m = _ID_RE.fullmatch(text) if len(text) <= _MAX_ID else None
    if m is None or m["infix"] != _INFIX[resource]:
        return None
    return Kind(resource, m["gpu"], int(m["n"]))
