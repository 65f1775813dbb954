# SPDX-License-Identifier: Apache-2.0
"""Where NVIDIA's CUDA headers are, for the tests that check vgpu against them.

No CUDA toolkit is needed: the `test` extra installs NVIDIA's `nvidia-cuda-runtime` wheel
(CUDA 13.0's cuda.h and cudaTypedefs.h, the headers tools/gen_cuda_procs.py generated
simgpu's entry-point table from). CUDA_HOME / CUDA_PATH, when set, win; a toolkit in
/usr/local/cuda comes last.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def _wheel_include() -> Path | None:
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        d = Path(base) / "cu13" / "include"
        if (d / "cuda.h").is_file():
            return d
    return None


def cuda_include_dirs() -> list[Path]:
    """The places looked in, in order."""
    dirs = [Path(os.environ[v]) / "include"
            for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    wheel = _wheel_include()
    if wheel is not None:
        dirs.append(wheel)
    dirs.append(Path("/usr/local/cuda/include"))
    return dirs


def find_cuda_include(header: str = "cuda.h") -> Path | None:
    """The first of cuda_include_dirs() that holds header."""
    return next((d for d in cuda_include_dirs() if (d / header).is_file()), None)
