# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: the built artefacts and a private simulated GPU per test."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.paths import ROOT, SIMGPU_DIR
from support.process import clean_env


@pytest.fixture(scope="session", autouse=True)
def built() -> None:
    """Build once per session so `pytest` alone works after a checkout.

    VGPU_TEST_NO_BUILD=1 skips it (developers building one target by hand).
    """
    if os.environ.get("VGPU_TEST_NO_BUILD") != "1":
        subprocess.run(["make", "-s", "-C", str(ROOT), "all"], check=True)


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
