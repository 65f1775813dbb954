# SPDX-License-Identifier: Apache-2.0
"""End to end on containerd: `ctr run --runtime io.containerd.vgpu.v2 --annotation vgpu.io/...`.

One containerd (temporary root, state and socket) and one vgpud on two simulated
GPUs serve the whole module; containerd's PATH holds containerd-shim-vgpu-v2 (this
checkout). Inside, vgpu_probe (tests/support/images.py) sees the slice through libvgpu.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from support.engines import Containerd, engine_env, point_at, require, simulated_host, vgpu_bin_dir
from support.images import build_oci_archive
from support.vgpud_harness import pb

require("containerd", "ctr", "containerd-shim-runc-v2", "runc")

IMAGE = "docker.io/library/vgpu-test:latest"
RUNTIME = "io.containerd.vgpu.v2"
MI = 1 << 20


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sim_dir, self.vgpud = simulated_host(tmp, ["/run/containerd/runc"])
        env = engine_env(vgpu_bin_dir(tmp / "bin"))
        point_at(env, self.vgpud)
        (tmp / "containerd").mkdir()
        self.containerd = Containerd(tmp / "containerd", env)
        self.n = 0

    def start(self) -> World:
        self.vgpud.start()
        self.containerd.start()
        archive = build_oci_archive(self.tmp / "image.tar", IMAGE)
        self.containerd.ctr("images", "import", str(archive))
        return self

    def stop(self) -> None:
        self.containerd.stop()
        self.vgpud.close()

    def name(self, prefix: str = "c") -> str:
        self.n += 1
        return f"{prefix}-{self.n}"

    def run_args(self, cid: str, annotations: dict[str, str], *cmd: str,
                 runtime: str = RUNTIME, rm: bool = True, detach: bool = False) -> list[str]:
        args = ["run"]
        args += ["--rm"] if rm else []
        args += ["-d"] if detach else []
        args += ["--runtime", runtime,
                 "--mount", f"type=bind,src={self.sim_dir},dst={self.sim_dir},options=rbind:rw",
                 "--env", f"SIMGPU_STATE={self.sim_dir / 'simgpu.state'}"]
        for k, v in annotations.items():
            args += ["--annotation", f"{k}={v}"]
        return [*args, IMAGE, cid, *cmd]

    def run(self, annotations: dict[str, str], *cmd: str, check: bool = True,
            **kw) -> subprocess.CompletedProcess[str]:
        cid = kw.pop("cid", None) or self.name()
        return self.containerd.ctr(*self.run_args(cid, annotations, *cmd, **kw), check=check)

    def popen(self, annotations: dict[str, str], *cmd: str) -> subprocess.Popen[str]:
        c = self.containerd
        return subprocess.Popen(
            ["ctr", "--address", str(c.socket), "--namespace", c.namespace,
             *self.run_args(self.name(), annotations, *cmd)],
            env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def slices(self) -> list:
        return list(self.vgpud.stub.List(pb.ListRequest(), timeout=5).slices)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("e2e-containerd"))
    try:
        yield w.start()
    finally:
        w.stop()


def lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture(autouse=True)
def no_leak_carries_over(world):
    """A slice one test leaked fails that test only: release leftovers after each."""
    yield
    for s in world.slices():
        world.vgpud.stub.Release(pb.ReleaseRequest(id=s.id), timeout=5)


def by_op(out: str, op: str) -> list[dict]:
    return [r for r in lines(out) if r["op"] == op]


def test_limit_oom_and_device_node(world):
    p = world.run({"vgpu.io/memory": "64Mi"}, "sh", "-c",
                  "test -e /dev/vgpu0 && echo has-vgpu0; "
                  "vgpu_probe info fill:mem:16777216")
    assert "has-vgpu0" in p.stdout, p.stdout + p.stderr
    [info] = by_op(p.stdout, "info")
    assert info["total"] == 64 * MI
    [fill] = by_op(p.stdout, "fill")
    assert fill["count"] == 4 and fill["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert world.slices() == []


def test_two_containers_share_one_gpu_with_different_limits(world):
    procs = [world.popen({"vgpu.io/memory": mem, "vgpu.io/devices": "0"},
                         "vgpu_probe", "info", "sleep:3000", "info")
             for mem in ("64Mi", "128Mi")]
    try:
        deadline = time.monotonic() + 30
        while len(seen := world.slices()) < 2:
            assert time.monotonic() < deadline, "both slices never existed at once"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.1)
        assert sorted(s.vgpus[0].memory_bytes for s in seen) == [64 * MI, 128 * MI]
        assert {s.vgpus[0].gpu_index for s in seen} == {0}
    finally:
        outs = [p.communicate(timeout=60) for p in procs]
    for (out, err), want in zip(outs, (64 * MI, 128 * MI), strict=True):
        assert {r["total"] for r in by_op(out, "info")} == {want}, out + err
    assert world.slices() == []


def test_count_two_sees_two_devices(world):
    p = world.run({"vgpu.io/memory": "64Mi", "vgpu.io/count": "2"}, "sh", "-c",
                  "ls /dev/vgpu0 /dev/vgpu1 && vgpu_probe count info device:1 info")
    [count] = by_op(p.stdout, "count")
    assert count["count"] == 2
    assert [i["total"] for i in by_op(p.stdout, "info")] == [64 * MI, 64 * MI]
    assert world.slices() == []


@pytest.mark.parametrize(("annotations", "line"), [
    pytest.param({"vgpu.io/memory": "lots"}, "vgpu.io/memory=lots: not a memory quantity",
                 id="memory-lots"),
    pytest.param({"vgpu.io/memory": "64Mi", "vgpu.io/compute": "1"},
                 "vgpu.io/compute=1: not a compute share", id="compute-1"),
    pytest.param({"vgpu.io/memory": "64Mi", "vgpu.io/count": "3"},
                 "vgpu.io/count: 3 vGPUs need 3 distinct GPUs", id="count-3"),
    pytest.param({"vgpu.io/memory": "64Mi", "vgpu.io/priority": "urgent"},
                 "vgpu.io/priority=urgent: not a priority", id="priority-urgent"),
])
def test_bad_request_fails_clearly_and_leaves_no_slice(world, annotations, line):
    cid = world.name("bad")
    p = world.run(annotations, "true", cid=cid, check=False)
    assert p.returncode != 0
    assert line in p.stderr, p.stderr
    world.containerd.ctr("containers", "delete", cid, check=False)
    assert world.slices() == []


def test_sigkilled_container_leaves_no_slice(world):
    cid = world.name("kill")
    world.run({"vgpu.io/memory": "64Mi"}, "sleep", "60", cid=cid, rm=False, detach=True)
    try:
        world.vgpud.wait_for(lambda: [s for s in world.slices() if s.owner == cid],
                             what="the slice")
        world.containerd.ctr("tasks", "kill", "-s", "SIGKILL", cid)
        deadline = time.monotonic() + 20
        while "STOPPED" not in world.containerd.ctr("tasks", "ls").stdout:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        world.containerd.ctr("tasks", "delete", cid, check=False)
        world.containerd.ctr("containers", "delete", cid, check=False)
    assert world.slices() == []


def test_container_without_keys_is_as_under_plain_runc(world):
    script = ("env | sort; ls /dev; cat /etc/ld.so.preload 2>&1; "
              "cat /proc/self/cgroup >/dev/null; echo done")
    plain = world.run({}, "sh", "-c", script, runtime="io.containerd.runc.v2", cid="same")
    ours = world.run({}, "sh", "-c", script, cid="same")
    assert ours.stdout == plain.stdout
    assert "done" in ours.stdout and "vgpu" not in ours.stdout
    assert world.slices() == []
