# SPDX-License-Identifier: Apache-2.0
"""End to end on Docker: `docker run --runtime=vgpu -e VGPU_MEMORY=...`.

One dockerd (temporary data root, exec root and socket, on its own containerd)
with `runtimes: {vgpu: {path: vgpu-runtime}}` in its daemon.json, and one vgpud
on two simulated GPUs, serve the whole module. The image is `docker import`ed
from tests/support/images.py's tarball.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.engines import (
    Containerd,
    Dockerd,
    engine_env,
    point_at,
    require,
    simulated_host,
    vgpu_bin_dir,
)
from support.images import build_tarball
from support.vgpud_harness import pb

require("dockerd", "docker", "containerd", "containerd-shim-runc-v2", "runc")

IMAGE = "vgpu-test:latest"
MI = 1 << 20


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        for d in ("containerd", "dockerd"):
            (tmp / d).mkdir()
        bindir = vgpu_bin_dir(tmp / "bin")
        env = engine_env(bindir)
        self.containerd = Containerd(tmp / "containerd", env)
        self.dockerd = Dockerd(tmp / "dockerd", env, self.containerd,
                               {"runtimes": {"vgpu": {"path": str(bindir / "vgpu-runtime")}}})
        # Where runc keeps dockerd's containers: a slice whose container is still
        # there survives vgpud's reconciliation at restart.
        self.sim_dir, self.vgpud = simulated_host(tmp, [str(self.dockerd.runc_root)])
        for e in (self.containerd.env, self.dockerd.env):
            point_at(e, self.vgpud)

    def start(self) -> World:
        self.vgpud.start()
        self.containerd.start()
        self.dockerd.start()
        self.dockerd.docker("import", str(build_tarball(self.tmp / "rootfs.tar")), IMAGE)
        return self

    def stop(self) -> None:
        self.dockerd.stop()
        self.containerd.stop()
        self.vgpud.close()

    def run_args(self, env: dict[str, str], *cmd: str, rm: bool = True,
                 detach: bool = False, runtime: str = "vgpu") -> list[str]:
        args = ["run", "--network", "none", "--runtime", runtime,
                "-v", f"{self.sim_dir}:{self.sim_dir}",
                "-e", f"SIMGPU_STATE={self.sim_dir / 'simgpu.state'}"]
        args += ["--rm"] if rm else []
        args += ["-d"] if detach else []
        for k, v in env.items():
            args += ["-e", f"{k}={v}"]
        return [*args, IMAGE, *cmd]

    def run(self, env: dict[str, str], *cmd: str, check: bool = True, **kw):
        return self.dockerd.docker(*self.run_args(env, *cmd, **kw), check=check)

    def slices(self) -> list:
        return list(self.vgpud.stub.List(pb.ListRequest(), timeout=5).slices)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("e2e-docker"))
    try:
        yield w.start()
    finally:
        w.stop()


@pytest.fixture(autouse=True)
def no_leak_carries_over(world):
    """A slice one test leaked fails that test only: release leftovers after each."""
    yield
    for s in world.slices():
        world.vgpud.stub.Release(pb.ReleaseRequest(id=s.id), timeout=5)


def by_op(out: str, op: str) -> list[dict]:
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [r for r in rows if r["op"] == op]


def test_env_request_limit_oom_and_device_node(world):
    p = world.run({"VGPU_MEMORY": "64Mi"}, "sh", "-c",
                  "test -e /dev/vgpu0 && echo has-vgpu0; vgpu_probe info fill:mem:16777216")
    assert "has-vgpu0" in p.stdout, p.stdout + p.stderr
    [info] = by_op(p.stdout, "info")
    assert info["total"] == 64 * MI
    [fill] = by_op(p.stdout, "fill")
    assert fill["count"] == 4 and fill["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert world.slices() == []


def test_count_two_sees_two_devices(world):
    p = world.run({"VGPU_MEMORY": "64Mi", "VGPU_COUNT": "2"}, "vgpu_probe", "count")
    assert by_op(p.stdout, "count")[0]["count"] == 2
    assert world.slices() == []


@pytest.mark.parametrize(("env", "line"), [
    pytest.param({"VGPU_MEMORY": "lots"}, "vgpu.io/memory=lots: not a memory quantity",
                 id="memory-lots"),
    pytest.param({"VGPU_MEMORY": "64Mi", "VGPU_COUNT": "3"},
                 "vgpu.io/count: 3 vGPUs need 3 distinct GPUs", id="count-3"),
])
def test_bad_request_fails_clearly_and_leaves_no_slice(world, env, line):
    p = world.run(env, "true", check=False)
    assert p.returncode != 0
    assert line in p.stderr, p.stderr
    assert world.slices() == []


def test_sigkilled_container_leaves_no_slice(world):
    cid = world.run({"VGPU_MEMORY": "64Mi"}, "sleep", "60", rm=False, detach=True).stdout.strip()
    try:
        world.vgpud.wait_for(lambda: [s for s in world.slices() if s.owner == cid],
                             what="the slice")
        world.dockerd.docker("kill", "-s", "KILL", cid)
        world.dockerd.docker("wait", cid)
    finally:
        world.dockerd.docker("rm", "-f", cid, check=False)
    assert world.slices() == []


def test_vgpud_restart_keeps_running_container_and_its_slice(world):
    cid = world.run({"VGPU_MEMORY": "64Mi"}, "vgpu_probe", "info", "sleep:5000", "info",
                    "fill:mem:16777216", rm=False, detach=True).stdout.strip()
    try:
        [before] = world.vgpud.wait_for(
            lambda: [s for s in world.slices() if s.owner == cid], what="the slice")
        world.vgpud.stop()
        world.vgpud.start()
        [after] = [s for s in world.slices() if s.owner == cid]
        assert after.id == before.id
        assert world.dockerd.docker("wait", cid, timeout=60).stdout.strip() == "0"
        out = world.dockerd.docker("logs", cid).stdout
    finally:
        world.dockerd.docker("rm", "-f", cid, check=False)
    assert [i["total"] for i in by_op(out, "info")] == [64 * MI, 64 * MI]
    [fill] = by_op(out, "fill")
    assert fill["count"] == 4 and fill["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    deadline = time.monotonic() + 10
    while world.slices():
        assert time.monotonic() < deadline, world.slices()
        time.sleep(0.1)


def test_container_without_keys_is_as_under_plain_runc(world):
    script = "env | grep -v HOSTNAME | sort; ls /dev; cat /etc/ld.so.preload 2>&1; echo done"
    plain = world.run({}, "sh", "-c", script, runtime="runc")
    ours = world.run({}, "sh", "-c", script)
    assert ours.stdout == plain.stdout
    assert "done" in ours.stdout and "vgpu" not in ours.stdout
    assert world.slices() == []
