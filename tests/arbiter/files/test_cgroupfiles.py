# SPDX-License-Identifier: Apache-2.0
"""arbiter.files.cgroupfiles: a cgroup's processes from /proc, where its files are leased."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from support.paths import TEST_BIN

from arbiter.compute.freezer import DutyCycle, Freezer, find_root
from arbiter.files.cgroupfiles import pids_in, read

LEASER = TEST_BIN / "leaser"


def proc_tree(tmp_path: Path, cgroups: dict[int, str]) -> Path:
    proc = tmp_path / "proc"
    for pid, text in cgroups.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    (proc / "self").mkdir()  # not a pid
    return proc


def test_pids_in_reads_each_processs_cgroup_line(tmp_path):
    proc = proc_tree(tmp_path, {
        10: "0::/ctr\n", 11: "0::/ctr/sub\n", 12: "0::/ctr-other\n", 13: "0::/\n",
        14: "4:memory:/ctr\n1:name=systemd:/x\n0::/elsewhere\n",
    })
    assert pids_in(":/ctr", proc) == {10, 11}          # the cgroup and below, not a prefix
    assert pids_in("memory:/ctr", proc) == {14}        # a v1 hierarchy by its controllers
    assert pids_in(":/", proc) == {10, 11, 12, 13, 14}
    assert pids_in("no-colon", proc) == set() and pids_in(":relative", proc) == set()


def test_read_of_a_file_nobody_leased(tmp_path):
    f = tmp_path / "cgroup.events"
    f.write_text("populated 1\nfrozen 0\n")
    assert read(f) == "populated 1\nfrozen 0\n"


def test_a_leased_cgroup_freeze_ends_a_throttle_at_once_and_says_so(tmp_path):
    """A tenant's lease on cgroup.freeze (the real leaser, a real cgroup v2): the duty cycle
    neither waits lease-break-time on it nor goes on as if it held; it says `leased`, which
    the guard answers by killing the cgroup's processes (guardian._kill_leased)."""
    root = find_root()
    if root is None or os.geteuid() != 0 or not LEASER.exists():
        pytest.skip("needs root, a cgroup v2 hierarchy and build/tests/leaser")
    cg = f"/vgpu-test-lease-{os.getpid()}"
    d = root / cg.lstrip("/")
    d.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    state = tmp_path / "leases.json"
    leaser = None
    try:
        (d / "cgroup.procs").write_text(str(sleeper.pid))
        leaser = subprocess.Popen([str(LEASER), "30", str(state), str(d / "cgroup.freeze")])
        deadline = time.monotonic() + 10
        while not (state.exists() and json.loads(state.read_text())["files"][0]["lease"]
                   == "write"):
            assert time.monotonic() < deadline, "no lease taken"
            time.sleep(0.05)
        cycle = DutyCycle(Freezer(root), cg, 0.5, period_s=0.1)
        t0 = time.monotonic()
        cycle.start()
        cycle._thread.join(timeout=5)
        assert not cycle._thread.is_alive() and cycle.leased
        assert time.monotonic() - t0 < 2  # not the 45 s of lease-break-time
        assert pids_in(f":{cg}") == {sleeper.pid}  # /proc still says who is in it
        assert Freezer(root).members(cg) == {sleeper.pid}
    finally:
        if leaser is not None:
            leaser.kill()
            leaser.wait()
        sleeper.kill()
        sleeper.wait()
        time.sleep(0.1)
        d.rmdir()
