# SPDX-License-Identifier: Apache-2.0
"""End to end on real runc: bundles with vgpu.io/* annotations, vgpu-hook as the prestart and
poststop hooks, a real vgpud on simgpu, vgpu_probe inside the container."""
from __future__ import annotations

import array
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.measure import measured
from support.runc_host import PRELOAD_OWN, Host, MiB, probe_lines

pytestmark = pytest.mark.skipif(shutil.which("runc") is None or os.geteuid() != 0,
                                reason="needs runc and root")

@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.close()


def test_limits_inside_and_slice_released_after_exit(host):
    b, cid = host.bundle(
        "ls /dev/vgpu0 && cat /etc/ld.so.preload && vgpu_probe info fill:mem:16777216",
        {"vgpu.io/memory": "256Mi", "vgpu.io/compute": "20"}, image_preload=True)
    p = host.run(b, cid)
    assert p.returncode == 0, p.stderr
    assert "/dev/vgpu0" in p.stdout
    assert f"/usr/lib/vgpu/libvgpu.so\n{PRELOAD_OWN}\n" in p.stdout  # ours first, image's kept
    lines = probe_lines(p.stdout)
    info = next(x for x in lines if x["op"] == "info")
    fill = next(x for x in lines if x["op"] == "fill")
    assert info["total"] == 256 * MiB
    assert fill["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert fill["count"] * fill["bytes_each"] <= 256 * MiB
    assert host.slices() == []
    # The image's own file is untouched on the host side.
    assert (b / "rootfs/etc/ld.so.preload").read_text() == PRELOAD_OWN + "\n"
    [event] = host.vgpud.events("allocate")
    assert event["owner"] == cid and event["grants"][0]["compute"] == 20


@pytest.mark.timing
def test_two_containers_share_the_gpu_by_their_compute_shares(host):
    """Each container finds its GPU's scheduling region and gets its share of GPU time
    (measured again, as tests/libvgpu/test_compute.py's timing tests are, while a failure comes
    with CPU time the VM's host took)."""
    measured(lambda attempt: _two_containers_share(host))


def _two_containers_share(host) -> None:
    seconds, warm = 3.0, 0.5
    start = time.monotonic_ns() + 2_000_000_000     # both containers are up by then
    until = start + int(seconds * 1e9)
    runs = []
    for pct in (30, 70):
        script = (f"ls /run/vgpu/sched/ && gpu_load --kernel busy_1000us --start-at {start} "
                  f"--until {until} --trace /sim/trace{pct}")
        b, cid = host.bundle(script, {"vgpu.io/memory": "256Mi", "vgpu.io/compute": str(pct),
                                      "vgpu.io/policy": "fixed"})
        runs.append(subprocess.Popen(host.runc("run", "--bundle", str(b), cid),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=60) for p in runs]
    for p, (out, err) in zip(runs, outs, strict=False):
        assert p.returncode == 0, err
        assert "GPU-" in out            # the GPU's scheduling region is mounted
    for pct in (30, 70):
        raw = array.array("Q", (host.sim / f"trace{pct}").read_bytes())
        a, b = start + int(warm * 1e9), until
        busy = sum(g for t, g in zip(raw[0::3], raw[1::3], strict=False) if a <= t < b)
        assert busy / (b - a) * 100 == pytest.approx(pct, abs=4)
    assert host.slices() == []


BAD = [
    ("memory-lots", {"vgpu.io/memory": "lots"},
     "vgpu: vgpu.io/memory=lots: not a memory quantity: use an integer with an optional suffix"),
    ("compute-1", {"vgpu.io/memory": "1Gi", "vgpu.io/compute": "1"},
     "vgpu: vgpu.io/compute=1: not a compute share: use an integer percent from 2 to 100"),
    ("count-above-gpus", {"vgpu.io/memory": "1Gi", "vgpu.io/count": "2"},
     "vgpu.io/count: 2 vGPUs need 2 distinct GPUs but this host has 1"),
    ("priority-urgent", {"vgpu.io/memory": "1Gi", "vgpu.io/priority": "urgent"},
     "vgpu: vgpu.io/priority=urgent: not a priority: use high, normal or low"),
    ("memory-above-gpu", {"vgpu.io/memory": "64Gi"}, "no GPU has room for 64Gi memory"),
]


@pytest.mark.parametrize(("annotations", "line"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_request_fails_with_one_clear_line(host, annotations, line):
    b, cid = host.bundle("echo should-not-run", annotations)
    p = host.run(b, cid)
    assert p.returncode != 0
    assert "should-not-run" not in p.stdout
    assert line in p.stderr
    # runc wraps the hook's stderr: the hook itself printed exactly one line.
    hook_out = p.stderr.split("stderr: ", 1)[1]
    assert hook_out.strip().count("vgpu:") == 1, p.stderr
    assert host.slices() == []


def test_container_without_keys_runs_as_without_hooks(host):
    script = "ls /dev; cat /etc/ld.so.preload 2>&1; ls /usr/lib/vgpu 2>&1; echo done"
    with_hooks, cid1 = host.bundle(script)
    plain, cid2 = host.bundle(script, hooks=False)
    p1, p2 = host.run(with_hooks, cid1), host.run(plain, cid2)
    assert p1.returncode == p2.returncode == 0, p1.stderr + p2.stderr
    assert p1.stdout == p2.stdout
    assert "vgpu0" not in p1.stdout and p1.stderr == p2.stderr == ""
    assert host.slices() == []
    assert not (with_hooks / "rootfs/etc/ld.so.preload").exists()
    assert host.vgpud.events("allocate") == []


def test_two_containers_at_once_with_different_limits(host):
    script = "vgpu_probe info; sleep 1.5"
    (b1, c1), (b2, c2) = (host.bundle(script, {"vgpu.io/memory": "256Mi"}),
                          host.bundle(script, {"vgpu.io/memory": "1Gi", "vgpu.io/compute": "50"}))
    procs = [subprocess.Popen(host.runc("run", "--bundle", str(b), c), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for b, c in ((b1, c1), (b2, c2))]
    host.vgpud.wait_for(lambda: len(host.slices()) == 2, what="two slices at once")
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    totals = [next(x for x in probe_lines(o) if x["op"] == "info")["total"] for o, _ in outs]
    assert totals == [256 * MiB, 1024 * MiB]
    assert host.slices() == []


def test_env_request_is_honoured_where_the_config_allows(host):
    b, cid = host.bundle("vgpu_probe info", env=["VGPU_MEMORY=128Mi"])
    p = host.run(b, cid)
    assert p.returncode == 0, p.stderr
    assert next(x for x in probe_lines(p.stdout) if x["op"] == "info")["total"] == 128 * MiB


def _hook_pids(socket: Path) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if (b"vgpu-hook" in cmd and b"prestart" in cmd
                and f"VGPU_SOCKET={socket}".encode() in env):
            pids.append(int(d.name))
    return pids


def test_hook_killed_half_way_leaves_no_slice(tmp_path):
    host = Host(tmp_path, reconcile_s=0.5)
    try:
        b, cid = host.bundle("echo should-not-run", {"vgpu.io/memory": "256Mi"})
        vgpud = host.vgpud.proc
        assert vgpud is not None
        vgpud.send_signal(signal.SIGSTOP)  # the hook's Allocate waits in the socket
        try:
            run = subprocess.Popen(host.runc("run", "--bundle", str(b), cid),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + 20
            while not (pids := _hook_pids(host.vgpud.socket)):
                assert time.monotonic() < deadline, "the prestart hook never started"
                time.sleep(0.02)
            time.sleep(0.3)  # well inside the call to vgpud
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            out, _ = run.communicate(timeout=30)
            assert run.returncode != 0 and "should-not-run" not in out
        finally:
            vgpud.send_signal(signal.SIGCONT)
        # Whatever of the hook's Allocate reached vgpud, the container and its state are
        # gone: after a few reconcile passes no slice is left.
        time.sleep(2)
        host.vgpud.wait_for(lambda: host.slices() == [], timeout=20, what="no slice left")
        # The release's event is written once the release is durable, just after the
        # slice leaves the list.
        # A slice the hook's undo released writes "release"; one the reconciler found
        # orphaned writes "reconcile.release". Either is the one release it gets.
        host.vgpud.wait_for(lambda: len(host.vgpud.events("allocate"))
                            == len(host.vgpud.events("release"))
                            + len(host.vgpud.events("reconcile.release")), timeout=10,
                            what="a release event for each allocate")
    finally:
        host.close()


def test_hostile_image_links_stay_inside_the_rootfs(host, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    b, cid = host.bundle("cat /etc/ld.so.preload; ls /dev/vgpu0; vgpu_probe info",
                         {"vgpu.io/memory": "64Mi"})
    shutil.rmtree(b / "rootfs/etc")
    (b / "rootfs/etc").symlink_to(outside)          # /etc -> a real host directory
    (b / "rootfs/usr/lib/vgpu").symlink_to("../../../../../..")  # a relative escape
    p = host.run(b, cid)
    assert p.returncode == 0, p.stderr
    assert "/usr/lib/vgpu/libvgpu.so" in p.stdout
    assert next(x for x in probe_lines(p.stdout) if x["op"] == "info")["total"] == 64 * MiB
    assert os.listdir(outside) == []
    assert not (tmp_path.parent / "libvgpu.so").exists()
    assert host.slices() == []


def test_mount_failure_releases_the_slice(host):
    b, cid = host.bundle("echo should-not-run", {"vgpu.io/memory": "64Mi"})
    (b / "rootfs/etc/ld.so.preload").mkdir()
    p = host.run(b, cid)
    assert p.returncode != 0 and "should-not-run" not in p.stdout
    assert "vgpu: failed to set up the vGPU mounts:" in p.stderr
    assert "/etc/ld.so.preload" in p.stderr
    assert host.slices() == []
    assert len(host.vgpud.events("allocate")) == len(host.vgpud.events("release")) == 1
