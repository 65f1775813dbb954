# SPDX-License-Identifier: Apache-2.0
"""vgpu-hook: the OCI prestart/poststop hook that gives a container its vGPU slice."""

__all__: list[str] = []
