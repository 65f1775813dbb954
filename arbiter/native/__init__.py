# SPDX-License-Identifier: Apache-2.0
"""Where libvgpu.so is: shipped inside the package, or built in a source checkout."""
from __future__ import annotations

from pathlib import Path

from arbiter.errors import LibraryNotFoundError

__all__ = ["LIBRARY_NAME", "libvgpu_path"]

LIBRARY_NAME = "libvgpu.so"
_PACKAGE_DIR = Path(__file__).resolve().parent
# arbiter/native/ -> arbiter/ -> repository root (only meaningful in a checkout).
_CHECKOUT_ROOT = _PACKAGE_DIR.parent.parent


def libvgpu_path(
    package_dir: Path = _PACKAGE_DIR, checkout_root: Path = _CHECKOUT_ROOT
) -> Path:
    """Return the packaged libvgpu.so, else a source checkout's build/libvgpu.so."""
    candidates = [package_dir / LIBRARY_NAME, checkout_root / "build" / LIBRARY_NAME]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise LibraryNotFoundError(candidates)
