# SPDX-License-Identifier: Apache-2.0
"""vgpud and the vgpu CLI: inventory, placement, slice regions and state for one host."""

__all__: list[str] = []
