# SPDX-License-Identifier: Apache-2.0
"""A hostile tenant whose memory bypass comes back, end to end on real runc (issue 22).

The container runs a supervisor: a shell loop that starts build/tests/dlmopen_load (the
driver opened with dlmopen(), past the preloaded libvgpu) holding 1 GiB of its
256 MiB slice, and starts it again whenever it dies. The memory guard kills the bypass
within 1.5 s each time; without escalation the loop takes the memory back a moment
later, forever. With it, the third finding within the window stops the whole slice:
`kill` ends the container (and its slice), `freeze` freezes its cgroup for good with
the last bypass killed, so the memory goes back either way.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from support.hostile import Host
from support.paths import SIMGPU_DIR, TEST_BIN
from support.prereq import require
from support.process import clean_env

from arbiter.compute.freezer import Freezer, find_root

LOAD = TEST_BIN / "dlmopen_load"
require(LOAD.exists(), "make builds build/tests/dlmopen_load")

MiB = 1 << 20
#: The supervisor: restart the bypass 0.2 s after each death, and count the starts. (In
#: the test image ld.so lives in /usr/lib64, where a fresh dlmopen() namespace does not look.)
LOOP = ("n=0; while true; do n=$((n+1)); echo start $n; "
        f"LD_LIBRARY_PATH=/usr/lib64 dlmopen_load --queue 0 --alloc {1024 * MiB} "
        "--seconds 600 > /dev/null; "
        "sleep 0.2; done")
#: From the container's start: three findings (about 1.5 s each) and the kill, with room for
#: a loaded 2-CPU host starting the container and the bypasses slowly.
BOUND_S = 30.0


def make_host(tmp_path, **guard: object) -> Host:
    # The compute guard only flags: the bypass launches nothing anyway.
    return Host(tmp_path, {"guard": {"action": "flag", "memory_action": "kill", **guard}})


@pytest.fixture
def host(tmp_path, request):
    h = make_host(tmp_path, **request.param)
    yield h
    h.close()


def gpu_used(host: Host) -> int:
    """Device memory in use on the host's simulated GPU, as NVML reports it."""
    env = clean_env()
    env.update(SIMGPU_STATE=str(host.sim / "simgpu.state"), LD_LIBRARY_PATH=str(SIMGPU_DIR))
    out = subprocess.run([str(TEST_BIN / "nvml_client"), "info"], env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    [dev] = json.loads(out)["devices"]
    return int(dev["memory"]["used"])


def starts(out: str) -> int:
    return sum(1 for line in out.splitlines() if line.startswith("start "))


@pytest.mark.parametrize("host", [{"memory_escalate_after": 3, "memory_escalate_window_s": 60,
                                   "memory_escalate_action": "kill"}], indirect=True)
def test_a_respawning_bypass_gets_its_container_killed(host):
    t0 = time.monotonic()
    p, _ = host.start(LOOP, {"vgpu.io/memory": "256Mi"}, extra_bin=LOAD)
    try:
        out, err = p.communicate(timeout=BOUND_S + 10)
    except Exception:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"the container outlived {BOUND_S + 10} s: {starts(out)} starts"
                             f" {host.vgpud.events('guard.kill')}") from None
    took = time.monotonic() - t0
    assert took <= BOUND_S, f"stopped after {took:.1f} s"
    assert p.returncode != 0, (out, err)          # SIGKILLed, its init with it
    # The guard says so once the kills are done: the container may exit before that.
    (ev,) = host.vgpud.wait_for(lambda: host.vgpud.events("guard.escalate"), timeout=5,
                                what="the guard's escalate event")
    assert ev["action"] == "kill" and ev["findings"] == 3, ev
    assert "a bypass that comes back" in ev["reason"] and ev["limit"] == 256 * MiB
    assert len(host.vgpud.events("guard.kill")) == 3  # three bypasses killed, then the slice
    assert 3 <= starts(out) <= 4, out
    host.vgpud.wait_for(lambda: host.slices() == [], timeout=10, what="the slice released")
    assert gpu_used(host) == 0                    # the neighbours have the memory back


@pytest.mark.parametrize("host", [{"memory_escalate_after": 0}], indirect=True)
def test_without_escalation_the_loop_keeps_the_memory_coming_back(host):
    """What escalation is for: the guard kills one bypass after another, and the loop
    lives on for as long as one cares to watch."""
    p, _ = host.start(LOOP, {"vgpu.io/memory": "256Mi"}, extra_bin=LOAD)
    try:
        host.vgpud.wait_for(lambda: len(host.vgpud.events("guard.kill")) >= 4, timeout=BOUND_S,
                            what="four kills")
        assert p.poll() is None and host.vgpud.events("guard.escalate") == []
    finally:
        p.kill()
        p.communicate()


@pytest.mark.parametrize("host", [{"memory_escalate_after": 3, "memory_escalate_window_s": 60,
                                   "memory_escalate_action": "freeze"}], indirect=True)
def test_a_respawning_bypass_gets_its_container_frozen(host):
    root = find_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy to freeze in")
    p, _ = host.start(LOOP, {"vgpu.io/memory": "256Mi"}, extra_bin=LOAD)
    try:
        (ev,) = host.vgpud.wait_for(lambda: host.vgpud.events("guard.escalate"),
                                    timeout=BOUND_S, what="guard.escalate")
        assert ev["action"] == "freeze" and ev["findings"] == 3 and ev["cgroups"], ev
        [cg] = ev["cgroups"]
        freezer = Freezer(root)
        host.vgpud.wait_for(lambda: freezer.frozen(cg), timeout=5, what="frozen")
        time.sleep(1.0)  # a bypass started just before the freeze is killed in this second
        kills = len(host.vgpud.events("guard.kill"))
        time.sleep(2.0)  # four ticks: nothing new starts, nothing more to kill
        assert p.poll() is None and freezer.frozen(cg)
        assert len(host.vgpud.events("guard.kill")) == kills
        assert gpu_used(host) <= 256 * MiB            # frozen, and holding nothing past its limit
        assert host.vgpud.events("guard.over_memory")[-1]["slice"] == ev["slice"]
    finally:
        p.kill()


LEASER = TEST_BIN / "leaser"
#: The tenant leases its own cgroup's files before it starts the loop: the engine mounts its
#: cgroup into it (a cgroup namespace: its /sys/fs/cgroup), and its root owns them as host
#: root does. On a host with hybrid cgroups (v1 controllers, v2 at /sys/fs/cgroup/unified,
#: where vgpud finds the container) the test mounts the v2 hierarchy read-only instead.
LEASED_LOOP = (
    "cg=$(grep '^0::' /proc/self/cgroup | cut -d: -f3); "
    "if [ -e /sys/fs/cgroup/cgroup.procs ]; then d=/sys/fs/cgroup; "
    "else d=/sys/fs/cgroup/unified$cg; fi; "
    # (not cgroup.kill: it is write-only, 0200, so no open of it is allowed to take a lease on)
    "leaser 300 /sim/cgroup-leases.json $d/cgroup.procs $d/cgroup.events $d/cgroup.freeze "
    "2> /sim/leaser.err & sleep 1; " + LOOP)
UNIFIED = Path("/sys/fs/cgroup/unified")


@pytest.mark.parametrize("host", [{"memory_escalate_after": 3, "memory_escalate_window_s": 60,
                                   "memory_escalate_action": "kill"}], indirect=True)
def test_leases_on_its_cgroup_files_neither_stall_the_guard_nor_hide_the_bypass(host):
    """Issue 22, item 2, for the cgroup files: the guard reads the container's cgroup.procs
    to find its processes and writes cgroup.kill to stop it. A blocking open of a leased
    file waited 45 s (lease-break-time) for each, longer than the whole bound here; now
    every open is O_NONBLOCK and a leased file's processes come from /proc."""
    require(LEASER.exists(), "make builds build/tests/leaser")
    t0 = time.monotonic()
    hybrid = (UNIFIED / "cgroup.procs").exists()
    p, _ = host.start(LEASED_LOOP, {"vgpu.io/memory": "256Mi"}, extra_bin=(LOAD, LEASER),
                      cgroupns=not hybrid, mounts=[{"destination": str(UNIFIED), "type": "bind",
                                              "source": str(UNIFIED),
                                              "options": ["rbind", "ro"]}] if hybrid else [])
    leases = host.sim / "cgroup-leases.json"
    host.vgpud.wait_for(lambda: leases.exists() and sum(
        f["lease"] != "none" for f in json.loads(leases.read_text())["files"]) >= 2,
        timeout=20, what="leases on the container's cgroup files")
    try:
        p.communicate(timeout=BOUND_S + 10)
    except Exception:
        p.kill()
        out, _ = p.communicate()
        raise AssertionError(f"the container outlived {BOUND_S + 10} s: {starts(out)} starts, "
                             f"{json.loads(leases.read_text())}") from None
    assert time.monotonic() - t0 <= BOUND_S
    (ev,) = host.vgpud.wait_for(lambda: host.vgpud.events("guard.escalate"), timeout=5,
                                what="the guard's escalate event")
    assert ev["action"] == "kill" and ev["findings"] == 3, ev
    host.vgpud.wait_for(lambda: host.slices() == [], timeout=10, what="the slice released")
    assert gpu_used(host) == 0
