# SPDX-License-Identifier: Apache-2.0
"""NVIDIA's CUDA runtime (libcudart) from the PyPI wheels in the `test` extra.

nvidia-cuda-runtime-cu12 installs nvidia/cuda_runtime/lib/libcudart.so.12 and
nvidia-cuda-runtime (13.x) nvidia/cu13/lib/libcudart.so.13, both into the `nvidia`
namespace package. VGPU_TEST_CUDART=PATH[,PATH] names the libraries instead (a GPU
machine without the wheels: tests/gpu/README.md).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

# wheel directory under nvidia/ -> the library in its lib/
_WHEEL_LIBS = (("cuda_runtime", "libcudart.so.12"), ("cu13", "libcudart.so.13"))


def runtime_libs() -> dict[str, Path]:
    """{"cuda12": path, "cuda13": path} for every runtime found (keyed by its major)."""
    named = os.environ.get("VGPU_TEST_CUDART")
    if named:
        paths = [Path(p) for p in named.split(",") if p]
    else:
        try:
            import nvidia  # namespace package of the wheels
        except ImportError:
            return {}
        paths = [Path(d) / sub / "lib" / lib for d in nvidia.__path__ for sub, lib in _WHEEL_LIBS]
    found = {}
    for p in paths:
        m = re.fullmatch(r"libcudart\.so\.(\d+)", p.name)
        if m and p.is_file():
            found.setdefault(f"cuda{m.group(1)}", p)
    return found
