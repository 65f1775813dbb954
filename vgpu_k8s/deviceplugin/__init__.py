# SPDX-License-Identifier: Apache-2.0
"""vgpu-device-plugin: the kubelet device-plugin API v1beta1 for `vgpu.io/memory` and
`vgpu.io/compute`. Allocate is stateless: it turns device IDs into container annotations."""

__all__: list[str] = []
