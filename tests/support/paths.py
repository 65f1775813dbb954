# SPDX-License-Identifier: Apache-2.0
"""Where the checkout and its built artefacts are."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
SIMGPU_DIR = BUILD / "simgpu"
LIBVGPU = BUILD / "libvgpu.so"
TEST_BIN = BUILD / "tests"
NATIVE_BIN = BUILD / "bin"   # the compiled vgpu-runtime, vgpu-hook, containerd-shim-vgpu-v2
