# SPDX-License-Identifier: Apache-2.0
"""Which Kubernetes pod and container a spec belongs to, as its CRI runtime wrote it.

The slice carries it (arbiter.model.WORKLOAD_LABELS) so that metrics and events name the
pod, its namespace and the container instead of a container id. Only the keys a CRI
runtime writes are read: containerd writes its `io.kubernetes.cri.*` keys after the
annotations it passes through, and CRI-O's are the kubelet's own labels, so a pod author
can set none of them. They name; they decide nothing (oci_hook.trust decides).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from arbiter.model import WORKLOAD_LABELS
from oci_hook.request import CONTAINER_TYPE_KEYS

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["workload_labels"]

#: Per CRI runtime, in the order of CONTAINER_TYPE_KEYS: the keys that hold the pod's
#: namespace, the pod's name and the container's name (WORKLOAD_LABELS' order).
_KEYS = (
    ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name",
     "io.kubernetes.cri.container-name"),
    ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name", "io.kubernetes.container.name"),
)
#: A Kubernetes name is at most 253 characters (a DNS subdomain); longer is not one.
_NAME_MAX = 253


def _name(value: object) -> str:
    if not isinstance(value, str) or len(value) > _NAME_MAX or not value.isprintable():
        return ""
    return value


def workload_labels(annotations: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    """The slice labels naming the spec's pod (namespace, pod, container); () outside a
    CRI runtime. A value that is not a plausible name is left out."""
    for type_key, keys in zip(CONTAINER_TYPE_KEYS, _KEYS, strict=True):
        if type_key in annotations:
            return tuple((label, value) for (_, label), key in zip(WORKLOAD_LABELS, keys,
                                                                  strict=True)
                         if (value := _name(annotations.get(key))))
    return ()
