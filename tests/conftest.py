# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: the built artefacts and a private simulated GPU per test."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import ROOT, SIMGPU_DIR
from support.process import clean_env
from support.vgpud_harness import unmount_under

from arbiter.compute.freezer import find_root

# `make test` hands whole files to pytest-xdist's workers in collection order
# (--dist loadfile --no-loadscope-reorder). These files take 25 s or more in its parallel
# phase (measured with --durations), so they go first, longest first: the workers then end
# together instead of one running a long file alone at the end.
SLOW_FIRST = (
    "arbiter/daemon/test_server.py", "vgpu_k8s/test_dra_plugin.py", "e2e/test_node_image.py",
    "project/test_bench_against.py", "shim/test_lifecycle.py", "e2e/test_upgrade_drill.py",
    "e2e/test_hostile_broker.py", "arbiter/slices/test_liveness.py", "e2e/test_e2e_runc.py",
    "vgpu_k8s/test_device_plugin.py", "libvgpu/test_gpucheck.py",
    "arbiter/compute/test_memory_guard.py", "libvgpu/test_compute.py",
    "libvgpu/test_compute_accuracy.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    tests = Path(__file__).parent

    def place(item: pytest.Item) -> int:
        return rank.get(item.path.relative_to(tests).as_posix(), len(rank))

    items.sort(key=place)   # stable: each file's tests keep their order


@pytest.fixture(scope="session", autouse=True)
def built() -> None:
    """Build once per session so `pytest` alone works after a checkout.

    VGPU_TEST_NO_BUILD=1 skips it (developers building one target by hand). pytest-xdist's
    workers each run it: one at a time (a lock in build/), so two never write the same
    object file.
    """
    if os.environ.get("VGPU_TEST_NO_BUILD") != "1":
        (ROOT / "build").mkdir(exist_ok=True)
        with open(ROOT / "build" / ".tests.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subprocess.run(["make", "-s", "-C", str(ROOT), "all"], check=True)


@pytest.fixture(autouse=True)
def _unmount_slice_fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Unmount the slices' own tmpfs (arbiter.files.slicefs) a test's vgpud or Regions left under
    the test's directories: the mounts would outlive it (and its temporary directory)."""
    yield
    unmount_under(tmp_path_factory.getbasetemp())


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh directory with a short path, removed afterwards: for unix sockets, whose
    path holds at most 107 bytes (pytest's own directories, pytest-xdist's longer still,
    leave too little for a kubelet's plugins_registry/<driver>-reg.sock)."""
    path = Path(tempfile.mkdtemp(prefix="vgpu-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


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
