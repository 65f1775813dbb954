# SPDX-License-Identifier: Apache-2.0
"""Allocate and GetPreferredAllocation, as pure functions of the IDs the kubelet passes.

Allocate keeps no state, looks up no pod, takes no node lock and asks no API server:
the IDs alone say what a container gets. The kubelet calls each resource's plugin
separately and merges the annotations of both into the container's CRI config:
- `vgpu.io/memory` IDs give `vgpu.io/memory` = count x unit and `vgpu.io/devices` = the
  UUID of their GPU (the request format has one memory amount per vGPU, so all of one
  container's memory IDs must be on one GPU; GetPreferredAllocation packs them so);
- `vgpu.io/compute` IDs give `vgpu.io/compute` = their count (percent of that GPU).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from arbiter.quantity import COMPUTE_MAX, COMPUTE_MIN, format_memory
from vgpu_k8s.deviceplugin.ids import COMPUTE, MEMORY, Kind, parse_id
from vgpu_k8s.errors import AllocationError

__all__ = ["DEVICES", "container_annotations", "preferred"]

#: The request key that pins a vGPU to a GPU (oci_hook/request.py: indices or UUIDs).
DEVICES = "vgpu.io/devices"
_SHOWN = 4  # IDs quoted in an error line


def _shown(ids: Sequence[str]) -> str:
    more = f" (+{len(ids) - _SHOWN} more)" if len(ids) > _SHOWN else ""
    return ",".join(ids[:_SHOWN]) + more


def _parse_all(resource: str, ids: Sequence[str]) -> list[Kind]:
    kinds = []
    for text in ids:
        kind = parse_id(resource, text)
        if kind is None:
            raise AllocationError(resource, _shown(ids),
                                  f"{text!r} is not a {resource} device ID of this plugin")
        kinds.append(kind)
    return kinds


def container_annotations(resource: str, ids: Sequence[str], memory_unit: int) -> dict[str, str]:
    """The container annotations for the IDs of one resource given to one container."""
    if not ids:
        return {}
    kinds = _parse_all(resource, ids)
    if len(set(ids)) != len(ids):
        raise AllocationError(resource, _shown(ids), "an ID is listed twice")
    if resource == MEMORY:
        gpus = sorted({k.gpu for k in kinds})
        if len(gpus) > 1:
            raise AllocationError(
                resource, _shown(ids),
                f"the IDs span {len(gpus)} GPUs ({', '.join(gpus)}): one container's vGPU "
                "memory must come from one GPU; ask for at most one GPU's worth")
        return {MEMORY: format_memory(len(ids) * memory_unit), DEVICES: gpus[0]}
    if not COMPUTE_MIN <= len(ids) <= COMPUTE_MAX:
        raise AllocationError(resource, _shown(ids),
                              f"{len(ids)} IDs: the compute share must be a percent from "
                              f"{COMPUTE_MIN} to {COMPUTE_MAX}")
    return {COMPUTE: str(len(ids))}


def preferred(resource: str, available: Sequence[str], must_include: Sequence[str],
              size: int) -> list[str]:
    """The IDs to take for a container: `size` of `available`, `must_include` among them.

    Memory is packed onto one GPU, best fit: of the GPUs that can hold the whole
    request, the one with the fewest available IDs (the big holes stay for big
    requests), ties to the lowest UUID; the IDs taken there are must_include first,
    then the lowest-numbered. When must_include names one GPU, only that GPU is a
    candidate. When no single GPU fits, the answer spans GPUs, fullest-free first,
    and Allocate will refuse it with a line that says so. Compute IDs: any `size`.
    """
    must = list(dict.fromkeys(must_include))
    if size <= len(must):
        return must
    by_gpu: dict[str, list[Kind]] = defaultdict(list)
    text_of: dict[Kind, str] = {}
    for text in dict.fromkeys(available):
        kind = parse_id(resource, text)
        if kind is not None and text not in must:
            by_gpu[kind.gpu].append(kind)
            text_of[kind] = text
    for kinds in by_gpu.values():
        kinds.sort(key=lambda k: k.n)
    need = size - len(must)
    if resource == MEMORY:
        must_gpus = {k.gpu for k in (parse_id(resource, t) for t in must) if k is not None}
        room: Mapping[str, int] = {g: len(ks) for g, ks in by_gpu.items()}
        fits = [g for g in by_gpu if room[g] >= need and must_gpus <= {g}]
        if fits:
            gpu = min(fits, key=lambda g: (room[g], g))
            return must + [text_of[k] for k in by_gpu[gpu][:need]]
    order = sorted(by_gpu, key=lambda g: (-len(by_gpu[g]), g))
    rest = [text_of[k] for g in order for k in by_gpu[g]]
    return must + rest[:need]
