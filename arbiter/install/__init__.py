# SPDX-License-Identifier: Apache-2.0
"""Versioned installs of the native parts and the files vgpu ships."""
