# SPDX-License-Identifier: Apache-2.0
"""Accounting across pid namespaces: containers' processes are all pid 1 to themselves.

Slots record the owner's pid namespace, so pid 1 of two containers are two owners, the
host never reaps a container's slot it cannot judge, and NVML (simgpu) and vgpud report
container processes by their host pids.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
from support.paths import LIBVGPU, TEST_BIN
from support.process import run

pytestmark = pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                                reason="needs unshare and root")

MiB = 1 << 20
PROBE = str(TEST_BIN / "vgpu_probe")


def holder_in_new_pid_ns(env: dict[str, str], *ops: str) -> tuple[subprocess.Popen[str], int]:
    """A probe as pid 1 of a fresh pid namespace; returns (unshare, the probe's host pid)."""
    p = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", PROBE, *ops, "hold"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    for line in p.stdout:
        entry = json.loads(line)
        if entry["op"] == "hold":
            assert entry["pid"] == 1
            break
    children = (f"/proc/{p.pid}/task/{p.pid}/children")
    with open(children) as f:
        (host_pid,) = (int(x) for x in f.read().split())
    return p, host_pid


def nvml_processes(env: dict[str, str]) -> dict[int, int]:
    info = json.loads(run([str(TEST_BIN / "nvml_client"), "info"], env=env).stdout)
    return {p["pid"]: p["used_memory"] for p in info["devices"][0]["processes"]}


def test_simgpu_counts_pid_1_of_two_namespaces_as_two_processes(simgpu_env):
    a, a_pid = holder_in_new_pid_ns(simgpu_env, f"alloc:mem:{64 * MiB}")
    b, b_pid = holder_in_new_pid_ns(simgpu_env, f"alloc:mem:{32 * MiB}")
    try:
        info = json.loads(run([PROBE, "info"], env=simgpu_env).stdout.splitlines()[-1])
        assert info["total"] - info["free"] == 96 * MiB
        assert nvml_processes(simgpu_env) == {a_pid: 64 * MiB, b_pid: 32 * MiB}
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
    # Gone: the host sees their namespaces empty and gives the memory back (the
    # killed pid 1 takes a moment to die; a loaded machine, longer).
    deadline = time.monotonic() + 5.0
    while True:
        info = json.loads(run([PROBE, "info"], env=simgpu_env).stdout.splitlines()[-1])
        if info["free"] == info["total"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert info["free"] == info["total"]


def test_host_sees_a_containers_slice_usage_by_host_pid(simgpu_env, tmp_path):
    from arbiter.files.region_file import create_region, open_region

    slice_dir = tmp_path / "slice"
    slice_dir.mkdir()
    create_region(slice_dir / "vgpu0", uuid="", device_index=0, memory_limit=256 * MiB)
    env = dict(simgpu_env, LD_PRELOAD=str(LIBVGPU), VGPU_REGION_DIR=str(slice_dir))
    a, a_pid = holder_in_new_pid_ns(env, f"alloc:mem:{48 * MiB}")
    b, b_pid = holder_in_new_pid_ns(env, f"alloc:mem:{16 * MiB}")
    try:
        with open_region(slice_dir / "vgpu0") as region:
            assert region.used_bytes() == 64 * MiB
            assert sorted(region.processes()) == sorted([(a_pid, 48 * MiB), (b_pid, 16 * MiB)])
            a.kill()
            a.wait()
            deadline = time.monotonic() + 5.0
            while region.used_bytes() != 16 * MiB and time.monotonic() < deadline:
                time.sleep(0.05)
            assert region.used_bytes() == 16 * MiB
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
