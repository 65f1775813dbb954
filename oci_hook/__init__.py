# SPDX-License-Identifier: Apache-2.0
"""What vgpu-hook's phases decide (the request, the slice, the mount plan, what poststop
releases), run inside vgpud; the compiled vgpu-hook (oci_hook/native/) applies it."""

__all__: list[str] = []
