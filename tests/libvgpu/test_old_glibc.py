# SPDX-License-Identifier: Apache-2.0
"""libvgpu.so and the node programs, built here (Debian 12, glibc 2.36), on an older glibc.

libvgpu.so is preloaded into every process of a workload image, whatever glibc the image
has, and the compiled programs run on the node. A Debian 11 rootfs (glibc 2.31: older than
2.34, where dlopen and pthread_create moved into libc.so.6 under new versions; as Ubuntu
20.04) made with debootstrap and kept in the tests' cache (support.node_image) stands for
such an image: simgpu and vgpu_probe are built inside it with its own gcc, as a workload
of that image would be, and run under the libvgpu.so built here, which must load and hold
its limit. A build bound to glibc 2.34's symbols fails every process there with
"version `GLIBC_2.34' not found" (libvgpu/common/vg_glibc.h).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.node_image import debian_tarball
from support.paths import ROOT
from support.prereq import require

MiB = 1 << 20
#: Debian 11: glibc 2.31.
SUITE = "bullseye"
PACKAGES = ("gcc", "libc6-dev", "make")
#: The node programs (Makefile NATIVE_BIN, static).
PROGRAMS = ("vgpu-runtime", "vgpu-hook", "containerd-shim-vgpu-v2", "vgpu-broker")

require(os.geteuid() == 0 and shutil.which("chroot") is not None
        and shutil.which("debootstrap") is not None,
        "needs root, chroot and debootstrap (scripts/install-deps.sh installs debootstrap)")


def in_root(root: Path, script: str, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`sh -c script` in the old rootfs, with only `env` (and a PATH)."""
    clean = {"PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})}
    return subprocess.run(["chroot", str(root), "/usr/bin/env", "-i",
                           *(f"{k}={v}" for k, v in clean.items()), "/bin/sh", "-c", script],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def old_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("old-glibc") / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", str(debian_tarball(SUITE, PACKAGES))],
                   check=True)
    src = root / "src"
    src.mkdir()
    shutil.copytree(ROOT / "libvgpu", src / "libvgpu",
                    ignore=shutil.ignore_patterns("*.o", "__pycache__"))
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, src / name)
    built = in_root(root, "make -s -C /src build/simgpu/libcuda.so.1 build/tests/vgpu_probe")
    assert built.returncode == 0, built.stdout + built.stderr
    (root / "vgpu" / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "build" / "libvgpu.so", root / "vgpu" / "libvgpu.so")
    for name in PROGRAMS:
        shutil.copy(ROOT / "build" / "bin" / name, root / "vgpu" / "bin" / name)
    yield root


def test_the_rootfs_has_a_glibc_older_than_the_build_s(old_root: Path) -> None:
    p = in_root(old_root, "ldd --version")
    first = (p.stdout + p.stderr).splitlines()[0]
    version = tuple(int(x) for x in first.rsplit(" ", 1)[1].split("."))
    assert version < (2, 34), first


def probe(root: Path, *ops: str, **env: str) -> list[dict]:
    p = in_root(root, "exec /src/build/tests/vgpu_probe " + " ".join(ops), {
        "LD_LIBRARY_PATH": "/src/build/simgpu", "SIMGPU_STATE": "/tmp/simgpu.state",
        "SIMGPU_DEVICES": "4Gi", **env})
    assert p.returncode == 0, p.stdout + p.stderr
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def test_a_workload_of_an_older_glibc_loads_libvgpu_and_keeps_its_limit(
        old_root: Path) -> None:
    alone = probe(old_root, "info")
    assert alone[-1]["total"] == 4 << 30                       # simgpu, no limit
    lines = probe(old_root, "info", f"alloc:mem:{200 * MiB}", f"alloc:mem:{100 * MiB}",
                  LD_PRELOAD="/vgpu/libvgpu.so", VGPU_MEMORY_LIMIT="256Mi")
    init, info, first, second = lines[:4]
    assert init == {"op": "init", "result": "CUDA_SUCCESS"}
    assert info["total"] == 256 * MiB and info["free"] <= 256 * MiB, info
    assert first["result"] == "CUDA_SUCCESS", first
    assert second["result"] == "CUDA_ERROR_OUT_OF_MEMORY", second


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_node_programs_run_on_an_older_glibc(old_root: Path, program: str) -> None:
    """Static: each starts and answers (its usage or version line), whatever the node's
    glibc; a dynamic one would stop at the loader."""
    arg = "--version" if program in ("vgpu-runtime", "containerd-shim-vgpu-v2") else ""
    p = in_root(old_root, f"/vgpu/bin/{program} {arg}; echo rc=$?")
    out = p.stdout + p.stderr
    assert "not found" not in out and "GLIBC" not in out, out
    assert out.strip(), program
