# SPDX-License-Identifier: Apache-2.0
"""Where the native parts are: libvgpu.so and the compiled programs, shipped inside the
package or built in a source checkout; `own_files` lists them for a versioned install
(arbiter.install.versions), which is what vgpud mounts into containers and engines run."""
from __future__ import annotations

import os
from pathlib import Path

from arbiter.errors import LibraryNotFoundError

__all__ = ["FILEOPS_NAME", "LIBRARY_NAME", "PROGRAMS", "fileops_path", "libvgpu_path",
           "own_files", "program_path"]

LIBRARY_NAME = "libvgpu.so"
#: vgpud's own library (arbiter.files.fileops), loaded in its process, never mounted into
#: a container: not among own_files.
FILEOPS_NAME = "libvgpu-fileops.so"
#: The compiled programs (oci_hook/native/, shim/native/, libvgpu/): `make` builds them
#: into build/bin/.
#: shim/runc is containerd-shim-vgpu-v2's private `runc` (it runs vgpu-runtime).
PROGRAMS = ("vgpu-runtime", "vgpu-hook", "vgpu-broker", "containerd-shim-vgpu-v2", "shim/runc")
_PACKAGE_DIR = Path(__file__).resolve().parent
# arbiter/native/ -> arbiter/ -> repository root (only meaningful in a checkout).
_CHECKOUT_ROOT = _PACKAGE_DIR.parent.parent


def libvgpu_path(
    package_dir: Path = _PACKAGE_DIR, checkout_root: Path = _CHECKOUT_ROOT
) -> Path:
    """Return the packaged libvgpu.so, else a source checkout's build/libvgpu.so."""
    return _library_path(LIBRARY_NAME, package_dir, checkout_root)


def fileops_path(
    package_dir: Path = _PACKAGE_DIR, checkout_root: Path = _CHECKOUT_ROOT
) -> Path:
    """Return the packaged libvgpu-fileops.so, else a source checkout's build/ one."""
    return _library_path(FILEOPS_NAME, package_dir, checkout_root)


def _library_path(name: str, package_dir: Path, checkout_root: Path) -> Path:
    candidates = [package_dir / name, checkout_root / "build" / name]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise LibraryNotFoundError(candidates)


def program_path(name: str, package_dir: Path = _PACKAGE_DIR,
                 checkout_root: Path = _CHECKOUT_ROOT) -> Path | None:
    """The packaged (arbiter/native/bin/) else the checkout's (build/bin/) program `name`.

    None when neither exists (not built).
    """
    for candidate in (package_dir / "bin" / name, checkout_root / "build" / "bin" / name):
        if not candidate.is_file():
            continue
        if not os.access(candidate, os.X_OK):
            # Wheels may drop the executable bit of package data.
            try:
                candidate.chmod(candidate.stat().st_mode | 0o111)
            except OSError:
                continue
        return candidate
    return None


def own_files(package_dir: Path = _PACKAGE_DIR,
              checkout_root: Path = _CHECKOUT_ROOT) -> dict[str, Path]:
    """This installation's native files by their path inside a versioned install:
    libvgpu.so and bin/<program> for each program that is built (arbiter.install.versions)."""
    files = {LIBRARY_NAME: libvgpu_path(package_dir, checkout_root)}
    for name in PROGRAMS:
        found = program_path(name, package_dir, checkout_root)
        if found is not None:
            files[f"bin/{name}"] = found
    return files
