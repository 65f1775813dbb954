# SPDX-License-Identifier: Apache-2.0
"""`pip install .` ships libvgpu.so inside the package (an installed vgpu is complete)."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import ROOT


def test_wheel_ships_libvgpu_and_types(tmp_path: Path) -> None:
    # No build isolation: the installed setuptools builds it, so this runs offline.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("vgpu-*.whl")
    assert "-py3-none-linux_" in wheel.name  # platform wheel: it holds a native library
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        lib = zf.read("arbiter/native/libvgpu.so")
        programs = {n: zf.read(f"arbiter/native/bin/{n}")
                    for n in ("vgpu-runtime", "vgpu-hook", "vgpu-broker")}
        modes = {n: zf.getinfo(f"arbiter/native/bin/{n}").external_attr >> 16 for n in programs}
        sidecar = zf.read("arbiter/native/bin/vgpu-python").decode()
        entry_points = zf.read(
            next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
    assert lib.startswith(b"\x7fELF")
    # The compiled fast path, executable, and the interpreter its Python fallback runs.
    assert all(p.startswith(b"\x7fELF") for p in programs.values())
    assert all(m & 0o111 for m in modes.values()), modes
    assert sidecar == sys.executable + "\n"
    for name in ("arbiter/py.typed", "oci_hook/py.typed", "shim/py.typed",
                 "arbiter/native/__init__.py", "arbiter/configs/vgpud.schema.json",
                 "arbiter/configs/vgpu.yaml", "arbiter/proto/vgpu_pb2.py"):
        assert name in names
    assert not any(n.startswith(("tests/", "libvgpu/")) for n in names)
    assert "vgpud = arbiter.daemon:main" in entry_points.decode()
    assert "vgpu = vgpu_cli.main:main" in entry_points.decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Requires-Python: >=3.11" in metadata
