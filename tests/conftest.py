# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: the built artefacts and a private simulated GPU per test."""
from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import ROOT, SIMGPU_DIR
from support.process import clean_env
from support.vgpud_harness import unmount_under

from arbiter.freezer import find_root


@pytest.fixture(scope="session", autouse=True)
def built() -> None:
    """Build once per session so `pytest` alone works after a checkout.

    VGPU_TEST_NO_BUILD=1 skips it (developers building one target by hand).
    """
    if os.environ.get("VGPU_TEST_NO_BUILD") != "1":
        subprocess.run(["make", "-s", "-C", str(ROOT), "all"], check=True)


@pytest.fixture(autouse=True)
def _unmount_slice_fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Unmount the slices' own tmpfs (arbiter.slicefs) a test's vgpud or Regions left under
    the test's directories: the mounts would outlive it (and its temporary directory)."""
    yield
    unmount_under(tmp_path_factory.getbasetemp())


@pytest.fixture
def simgpu_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a process that sees a private simulated GPU (16 GiB, one device).

    Tests adjust SIMGPU_DEVICES before the first process starts, since the
    first process to touch SIMGPU_STATE creates the devices.
    """
    env = clean_env()
    env["SIMGPU_STATE"] = str(tmp_path / "simgpu.state")
    env["SIMGPU_DEVICES"] = "16Gi"
    env["LD_LIBRARY_PATH"] = str(SIMGPU_DIR) + (
        ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else ""
    )
    return env


@pytest.fixture
def sleeper():
    """make() starts a `sleep 60` (a real live process to own or attribute); all are
    killed and reaped at the end of the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def make() -> subprocess.Popen[bytes]:
        p = subprocess.Popen(["sleep", "60"])
        procs.append(p)
        return p

    yield make
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
def cgroup() -> Iterator[tuple[Path, Path]]:
    """A fresh child of the cgroup v2 root (for a guard to freeze or kill): (root, its
    directory); emptied and removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("freezing a cgroup needs root")
    root = find_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy under /sys/fs/cgroup")
    path = root / f"vgpu-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as e:
        pytest.skip(f"cannot make a cgroup v2 group: {e}")
    if not (path / "cgroup.freeze").exists():
        path.rmdir()
        pytest.skip("this kernel's cgroup v2 has no freezer (cgroup.freeze, Linux >= 5.2)")
    yield root, path
    with contextlib.suppress(OSError):
        (path / "cgroup.freeze").write_text("0")
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            path.rmdir()
            break
        except OSError:
            time.sleep(0.05)
