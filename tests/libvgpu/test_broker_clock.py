# SPDX-License-Identifier: Apache-2.0
"""The broker serves on a host whose monotonic clock is young.

CLOCK_MONOTONIC counts from boot, so on a VM up for less than a minute (a fresh GPU node,
a CI runner) every "now minus a window" the broker computes is small. One such bound
wrapped around: a standalone broker took on no slice in the host's first 60 s (the real
GPU check met it on a freshly started H200: `no broker serves this slice yet; waiting`,
then killed by its timeout). A time namespace gives gpu_load a clock that reads 10 s.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.gpu_loads import GPU_LOAD, load_env

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare (time namespaces)")


@pytest.mark.parametrize("clock_s", [10, 1])
def test_a_standalone_broker_serves_on_a_host_up_for_seconds(tmp_path: Path, clock_s: int) -> None:
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    offset = clock_s - int(uptime)
    (tmp_path / "sched").mkdir()
    env = {**load_env(tmp_path, "16Gi"), "VGPU_COMPUTE_LIMIT": "50", "VGPU_POLICY": "fixed"}
    p = subprocess.run(["unshare", "--time", f"--monotonic={offset}", "--fork", "--",
                        str(GPU_LOAD), "--kernel", "busy_1000us", "--seconds", "1"],
                       env=env, capture_output=True, text=True, timeout=15)
    assert p.returncode == 0, p.stderr
    assert "no broker serves" not in p.stderr
    got = json.loads(p.stdout)
    assert 0.40 <= got["gpu_ns"] / 1e9 <= 0.60, got  # throttled to its 50 %, not stuck
