# SPDX-License-Identifier: Apache-2.0
"""The container side inside vgpud: vgpu-runtime's decisions (the spec modifiers), the
lifecycle socket the compiled programs (oci_hook/native/, shim/native/) ask, and `vgpu install`."""

__all__: list[str] = []
