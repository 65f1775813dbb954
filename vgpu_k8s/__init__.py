# SPDX-License-Identifier: Apache-2.0
"""vgpu's Kubernetes node agents: the kubelet device plugin (deviceplugin/), the DRA plugin
(dra/) and the kubelet APIs they speak (proto/). They ask vgpud, through arbiter's API, what
the node's GPUs are."""

__all__: list[str] = []
