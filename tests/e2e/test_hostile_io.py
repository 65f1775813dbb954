# SPDX-License-Identifier: Apache-2.0
"""A hostile tenant against vgpud's own I/O on the files it can reach, on real runc.

The files it may write (its usage file, its .req) are on its slice's own tmpfs, sized to
them: what it writes past their end costs the host no more than that.

A container's root owns the files vgpu mounts into it, so it may take a file lease on
them, even read-only: an open that would break the lease then waits for the kernel's
lease-break-time (45 s). vgpud opens them without waiting (O_NONBLOCK) and holds them open
while in use, so a lease cannot be taken then at all; one taken while vgpud was away
(a restart) is said and tried again, never waited on.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.hostile import Host
from support.paths import TEST_BIN
from support.prereq import require
from support.vgpud_harness import pb

from arbiter.errors import RegionError
from arbiter.files.region_file import REGION_SIZE, USAGE_SIZE, open_region, usage_path_of
from arbiter.files.sched_files import REQ_SIZE
from arbiter.files.slicefs import slice_fs_bytes

LEASER = TEST_BIN / "leaser"
require(LEASER.exists(), "make builds build/tests/leaser")

MiB = 1 << 20
#: Far below the 45 s a lease break takes: what each of vgpud's answers must come within.
BOUND_S = 10.0


@pytest.fixture
def host(tmp_path):
    # A reconciler pass each second: what retries the files a lease kept from vgpud.
    h = Host(tmp_path, {"reconcile": {"interval_s": 1}})
    yield h
    h.close()


def _timed(what: str, call, times: dict[str, float]):
    t = time.monotonic()
    out = call()
    times[what] = time.monotonic() - t
    return out


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=BOUND_S) as r:
        return str(r.read().decode())


def _leases(state: Path) -> dict[str, str]:
    try:
        report = json.loads(state.read_text())
    except (OSError, ValueError):
        return {}
    return {f["path"]: f["lease"] for f in report["files"]}


def _answers(host: Host, slice_id: str, memory: int, times: dict[str, float]) -> None:
    """A metrics scrape, `vgpu ls` and an Update of the slice, each timed."""
    port = host.vgpud.metrics_port
    assert "vgpu_slice_memory" in _timed("scrape", lambda: _scrape(port), times)
    cli = [sys.executable, "-m", "vgpu_cli", "--socket", str(host.vgpud.socket), "ls"]
    ls = _timed("vgpu ls", lambda: subprocess.run(cli, capture_output=True, text=True,
                                                  env=host.env, timeout=BOUND_S), times)
    assert ls.returncode == 0 and slice_id in ls.stdout, ls.stderr
    u = _timed("update", lambda: host.vgpud.stub.Update(
        pb.UpdateRequest(id=slice_id, memory_bytes=memory), timeout=BOUND_S), times)
    assert u.vgpus[0].memory_bytes == memory


def test_a_tenants_file_leases_never_stall_vgpud(host):
    """leaser, as the container's root, leases its region, usage and .req and the GPU's
    file, taking each again whenever free. While vgpud runs it holds them all open, so
    no lease is granted; across a vgpud restart the tenant gets its leases, and the next
    vgpud's start (its reconcile), a metrics scrape, `vgpu ls` and an Update still answer
    at once; the Update reaches the mounted file when the leases end."""
    state = Path("/sim/lease.json")
    script = (
        f"leaser 300 {state} /dev/vgpu0 /dev/vgpu0.usage /run/vgpu/sched/* "
        "2> /sim/leaser.err; echo leaser-exit $?; "
        "while [ ! -e /sim/go ]; do sleep 0.05; done; "
        f"vgpu_probe alloc:mem:{384 * MiB} > /sim/probe.out 2> /sim/probe.err; echo done")
    p, _ = host.start(script, {"vgpu.io/memory": "256Mi"}, extra_bin=LEASER)
    host_state = host.sim / state.name
    host.vgpud.wait_for(lambda: len(_leases(host_state)) == 4, timeout=20, what="the leaser")
    [s] = host.slices()
    region = Path(s.vgpus[0].region_path)
    inode = region.stat().st_ino
    time.sleep(0.5)  # ~100 rounds of tries

    times: dict[str, float] = {}
    _answers(host, s.id, 300 * MiB, times)
    print("seconds:", {k: round(v, 3) for k, v in times.items()})
    assert max(times.values()) < BOUND_S, times
    # vgpud holds every file open: not one lease was granted.
    assert set(_leases(host_state).values()) == {"none"}, host_state.read_text()

    # vgpud away: the tenant takes its leases (a write lease on its own files).
    host.vgpud.stop()
    mine = ("/dev/vgpu0", "/dev/vgpu0.usage")
    host.vgpud.wait_for(lambda: all(_leases(host_state).get(f) == "write" for f in mine),
                        timeout=20, what="the tenant's leases")
    assert p.poll() is None
    times = {}
    _timed("restart", lambda: host.vgpud.start(timeout=BOUND_S), times)
    _answers(host, s.id, 512 * MiB, times)
    print("seconds:", {k: round(v, 3) for k, v in times.items()})
    assert max(times.values()) < BOUND_S, times
    # Said, not waited on: an event naming the slice; the file was kept (same inode).
    assert [e for e in host.vgpud.events("file.leased") if e["slice"] == s.id]
    assert region.stat().st_ino == inode

    # The leases end: the next reconciler pass writes the Update into the mounted file.
    (host.sim / f"{state.name}.stop").touch()

    def limit() -> int:
        try:
            with open_region(region, writable=False) as r:
                return r.memory_limit
        except RegionError as e:  # the leaser not gone yet
            assert e.busy, e
            return 0
    host.vgpud.wait_for(lambda: limit() == 512 * MiB, timeout=10, what="the update")
    assert region.stat().st_ino == inode and usage_path_of(region).exists()
    (host.sim / "go").touch()
    out, err = p.communicate(timeout=60)
    assert "leaser-exit 0" in out and "done" in out, (out, err)
    probe = [json.loads(x) for x in (host.sim / "probe.out").read_text().splitlines()
             if x.startswith("{")]
    # 384 MiB fits only under the updated 512 MiB limit, in the container's own file.
    assert [r["result"] for r in probe if r.get("op") == "alloc"] == ["CUDA_SUCCESS"], probe
    assert host.healthy()


def _used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_a_gib_written_past_its_files_costs_the_host_at_most_the_slices_bound(host):
    """The container's root writes 1 GiB past the end of each file it may write (its usage
    file and its .req). Each slice's directory is a tmpfs of its own sized to its files
    (arbiter.files.slicefs): the writes stop there (ENOSPC), the run dir's filesystem does not
    grow, and vgpud and the slice go on: scrapes, `vgpu ls`, an Update, an allocation."""
    script = (
        "for f in /dev/vgpu0.usage /run/vgpu/sched/*.req; do "
        "dd if=/dev/zero of=$f bs=1M count=1024 seek=1 conv=notrunc 2>> /sim/dd.err; "
        "echo dd-exit $?; done; touch /sim/written; "
        "while [ ! -e /sim/go ]; do sleep 0.05; done; "
        f"vgpu_probe alloc:mem:{200 * MiB} > /sim/probe.out 2> /sim/probe.err; echo done")
    run_fs = host.vgpud.run_dir / "slices"
    before = _used(run_fs)
    p, _ = host.start(script, {"vgpu.io/memory": "256Mi"})
    host.vgpud.wait_for(lambda: (host.sim / "written").exists() or p.poll() is not None,
                        timeout=120, what="the writes")
    assert p.poll() is None, p.communicate()
    [s] = host.slices()
    slice_dir = Path(s.region_dir)
    bound = slice_fs_bytes(1, (REGION_SIZE, USAGE_SIZE, REQ_SIZE))
    usage = usage_path_of(Path(s.vgpus[0].region_path))
    [req] = [f for f in slice_dir.iterdir() if f.name.endswith(".req")]
    for f in (usage, req):
        assert f.stat().st_blocks * 512 <= bound, (f, f.stat().st_blocks * 512, bound)
    assert _used(slice_dir) <= bound
    assert _used(run_fs) - before < 64 * MiB  # not the 2 GiB written (others' noise aside)
    assert "No space left on device" in (host.sim / "dd.err").read_text()
    times: dict[str, float] = {}
    _answers(host, s.id, 300 * MiB, times)
    print("seconds:", {k: round(v, 3) for k, v in times.items()})
    assert max(times.values()) < BOUND_S, times
    (host.sim / "go").touch()
    out, err = p.communicate(timeout=60)
    assert "done" in out, (out, err)
    probe = [json.loads(x) for x in (host.sim / "probe.out").read_text().splitlines()
             if x.startswith("{")]
    assert [r["result"] for r in probe if r.get("op") == "alloc"] == ["CUDA_SUCCESS"], probe
    assert host.healthy()
