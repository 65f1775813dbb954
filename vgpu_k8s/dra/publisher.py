# SPDX-License-Identifier: Apache-2.0
"""Keeps this node's ResourceSlice in the API server equal to the GPUs vgpud reports.

A change (a GPU lost or back, vgpud's inventory) replaces the slice with the next pool
generation; the generation continues from what the API server holds, so a restarted
plugin still moves it forward. Slices of this node and driver under another name (an
older plugin's) are deleted: the pool is then exactly the one slice it declares.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from vgpu_k8s.dra.apiserver import Cluster
from vgpu_k8s.dra.resourceslice import resource_slice, slice_name
from vgpu_k8s.dra.vgpud import Gpu

__all__ = ["Publisher"]

log = logging.getLogger("vgpu-dra-plugin")


def _generation(s: dict[str, Any]) -> int:
    try:
        return int(s["spec"]["pool"]["generation"])
    except (KeyError, TypeError, ValueError):
        return 0


class Publisher:
    """The node's ResourceSlice, republished when the devices it lists change."""

    def __init__(self, cluster: Cluster, node: str) -> None:
        self.cluster = cluster
        self.node = node
        self.generation = 0
        self._devices: list[Any] | None = None   # the devices last published

    def publish(self, gpus: Sequence[Gpu]) -> bool:
        """Publish when the device list differs from the last one; True when it did.
        ApiError when the API server did not take it (the caller tries again later)."""
        devices = resource_slice(self.node, gpus, 0)["spec"]["devices"]
        if devices == self._devices:
            return False
        existing = self.cluster.node_slices(self.node)
        generation = max([self.generation, *(_generation(s) for s in existing)]) + 1
        body = resource_slice(self.node, gpus, generation)
        name = slice_name(self.node)
        mine = [s for s in existing if s["metadata"]["name"] == name]
        if mine:
            body["metadata"]["resourceVersion"] = mine[0]["metadata"].get("resourceVersion")
            self.cluster.replace_slice(body)
        else:
            self.cluster.create_slice(body)
        for s in existing:
            if s["metadata"]["name"] != name:
                self.cluster.delete_slice(s["metadata"]["name"])
        self.generation = generation
        self._devices = devices
        log.info("published ResourceSlice %s (pool %s generation %d): %s", name, self.node,
                 generation, ", ".join(d["name"] for d in devices) or "no devices")
        return True

    def withdraw(self) -> None:
        """Delete every ResourceSlice of this node and driver (a clean stop)."""
        for s in self.cluster.node_slices(self.node):
            self.cluster.delete_slice(s["metadata"]["name"])
        self._devices = None
        log.info("deleted the ResourceSlices of node %s", self.node)
