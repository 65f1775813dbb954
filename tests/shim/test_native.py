# SPDX-License-Identifier: Apache-2.0
"""arbiter.native.libvgpu_path: the packaged copy first, then a checkout's build; the
compiled programs are built, warnings-clean."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.paths import LIBVGPU, ROOT

from arbiter.errors import LibraryNotFoundError, VgpuError
from arbiter.native import libvgpu_path


def test_source_checkout_finds_the_build() -> None:
    if not LIBVGPU.exists():
        pytest.fail(f"{LIBVGPU} is missing: run `make build/libvgpu.so`")
    assert libvgpu_path() == LIBVGPU
    assert libvgpu_path(checkout_root=ROOT) == LIBVGPU


@pytest.mark.parametrize(("packaged", "built", "expected"), [
    (True, True, "package"),
    (True, False, "package"),
    (False, True, "checkout"),
], ids=["both", "package-only", "checkout-only"])
def test_lookup_order(tmp_path: Path, packaged: bool, built: bool, expected: str) -> None:
    package, checkout = tmp_path / "package", tmp_path / "checkout"
    (checkout / "build").mkdir(parents=True)
    package.mkdir()
    if packaged:
        (package / "libvgpu.so").write_bytes(b"")
    if built:
        (checkout / "build" / "libvgpu.so").write_bytes(b"")
    found = libvgpu_path(package_dir=package, checkout_root=checkout)
    assert found == {"package": package / "libvgpu.so",
                     "checkout": checkout / "build" / "libvgpu.so"}[expected]


def test_missing_everywhere_names_both_places(tmp_path: Path) -> None:
    with pytest.raises(LibraryNotFoundError) as info:
        libvgpu_path(package_dir=tmp_path / "pkg", checkout_root=tmp_path / "src")
    message = str(info.value)
    assert str(tmp_path / "pkg" / "libvgpu.so") in message
    assert str(tmp_path / "src" / "build" / "libvgpu.so") in message
    assert message.startswith("failed to find libvgpu.so: neither ")
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, VgpuError)


# --- the compiled container-path programs (oci_hook/native/, shim/native/) --------------------

PROGRAMS = ("vgpu-runtime", "vgpu-hook", "containerd-shim-vgpu-v2")


def test_make_builds_the_programs_and_the_shims_private_runc() -> None:
    for name in (*PROGRAMS, "shim/runc"):
        path = ROOT / "build" / "bin" / name
        assert path.is_file() and os.access(path, os.X_OK), f"{path}: run make"


def test_the_programs_compile_without_warnings(tmp_path: Path) -> None:
    """-Wall -Wextra clean at -O2 (where gcc sees the truncations): -Werror on a fresh build."""
    flags = "-O2 -std=gnu11 -Wall -Wextra -Werror -D_GNU_SOURCE"
    targets = [str(tmp_path / "bin" / name) for name in PROGRAMS]
    p = subprocess.run(["make", "-s", "-C", str(ROOT), f"B={tmp_path}",
                        f"NATIVE_CFLAGS={flags}", *targets],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
