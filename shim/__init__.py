# SPDX-License-Identifier: Apache-2.0
"""vgpu-runtime and containerd-shim-vgpu-v2: OCI runtime wrappers that inject the vgpu hooks."""

__all__: list[str] = []
