# SPDX-License-Identifier: Apache-2.0
"""Keeps this node's ResourceSlice in the API server equal to the GPUs vgpud reports.

A change (a GPU lost or back, vgpud's inventory) replaces the slice with the next pool
generation; the generation continues from what the API server holds, so a restarted
plugin still moves it forward. Slices of this node and driver under another name (an
older plugin's) are deleted: the pool is then exactly the one slice it declares.
`resync` publishes again when the slice in the API server is no longer the one written
(the kubelet deletes its node's slices when it starts). After each write the object the
server stored is read back: a server that dropped the sharing fields is said in one line.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from vgpu_k8s.dra.apiserver import Cluster
from vgpu_k8s.dra.resourceslice import dropped_sharing_fields, resource_slice, slice_name
from vgpu_k8s.dra.vgpud import Gpu

__all__ = ["SHARING_OFF", "Publisher"]

log = logging.getLogger("vgpu-dra-plugin")

#: The one line a server without consumable capacity gets (%s: the fields, the slice).
SHARING_OFF = ("the API server dropped %s from ResourceSlice %s: GPU sharing is off on "
               "this cluster, each GPU goes whole to one claim at a time; it needs the "
               "DRAConsumableCapacity feature gate on the API server and the scheduler "
               "(alpha in Kubernetes 1.34 and 1.35, off by default; beta and on by default "
               "since 1.36)")


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
        self._version: str | None = None         # the resourceVersion the server gave it
        #: Whether the server keeps the sharing fields (None: nothing published yet).
        self.sharing: bool | None = None

    def publish(self, gpus: Sequence[Gpu]) -> bool:
        """Publish when the device list differs from the last one; True when it did.
        ApiError when the API server did not take it (the caller tries again later)."""
        devices = resource_slice(self.node, gpus, 0)["spec"]["devices"]
        if devices == self._devices:
            return False
        self._write(gpus, devices, self.cluster.node_slices(self.node))
        return True

    def resync(self, gpus: Sequence[Gpu]) -> bool:
        """Publish again when the API server no longer holds exactly the slice last
        written (the kubelet deletes its node's slices when it starts; an operator may
        delete or edit one); True when it did. The test is the resourceVersion the
        server gave the slice: any write by anyone changes it, and it does not depend on
        which fields the server kept (see dropped_sharing_fields)."""
        devices = resource_slice(self.node, gpus, 0)["spec"]["devices"]
        if self._devices is None or devices != self._devices:
            return self.publish(gpus)
        existing = self.cluster.node_slices(self.node)
        name = slice_name(self.node)
        if [(s["metadata"]["name"], s["metadata"].get("resourceVersion")) for s in existing] \
                == [(name, self._version)]:
            return False
        what = "changed" if any(s["metadata"]["name"] == name for s in existing) else "gone"
        log.info("ResourceSlice %s is %s in the API server: publishing it again", name, what)
        self._write(gpus, devices, existing)
        return True

    def _write(self, gpus: Sequence[Gpu], devices: list[Any],
               existing: list[dict[str, Any]]) -> None:
        generation = max([self.generation, *(_generation(s) for s in existing)]) + 1
        body = resource_slice(self.node, gpus, generation)
        name = slice_name(self.node)
        mine = [s for s in existing if s["metadata"]["name"] == name]
        self._devices = None     # until the server took it: a failure is retried
        if mine:
            body["metadata"]["resourceVersion"] = mine[0]["metadata"].get("resourceVersion")
            stored = self.cluster.replace_slice(body)
        else:
            stored = self.cluster.create_slice(body)
        for s in existing:
            if s["metadata"]["name"] != name:
                self.cluster.delete_slice(s["metadata"]["name"])
        self.generation = generation
        self._devices = devices
        self._version = (stored.get("metadata") or {}).get("resourceVersion")
        log.info("published ResourceSlice %s (pool %s generation %d): %s", name, self.node,
                 generation, ", ".join(d["name"] for d in devices) or "no devices")
        self._check_sharing(devices, (stored.get("spec") or {}).get("devices") or [])

    def _check_sharing(self, sent: list[Any], stored: list[Any]) -> None:
        """Say once (until it changes) that the server dropped the sharing fields."""
        dropped = dropped_sharing_fields(sent, stored)
        sharing = not dropped
        if sharing == self.sharing or not sent:
            return
        if not sharing:
            log.warning(SHARING_OFF, " and ".join(dropped), slice_name(self.node))
        elif self.sharing is False:
            log.info("the API server keeps allowMultipleAllocations and requestPolicy now: "
                     "GPUs are shared")
        self.sharing = sharing

    def withdraw(self) -> None:
        """Delete every ResourceSlice of this node and driver (a clean stop)."""
        for s in self.cluster.node_slices(self.node):
            self.cluster.delete_slice(s["metadata"]["name"])
        self._devices = None
        self._version = None
        log.info("deleted the ResourceSlices of node %s", self.node)
