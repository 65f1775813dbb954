# SPDX-License-Identifier: Apache-2.0
"""The restart drill on real runc: containers start and stop through the compiled
vgpu-runtime while vgpud restarts, under socket activation (support/socket_activation.py:
what vgpud.socket does) and without it (restarted by hand: the programs wait)."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.images import build_rootfs, make_bundle
from support.paths import NATIVE_BIN
from support.process import clean_env
from support.runc_host import MiB, probe_lines
from support.socket_activation import activated_vgpud
from support.vgpud_harness import Vgpud, pb, simgpu_vgpud

pytestmark = pytest.mark.skipif(shutil.which("runc") is None or os.geteuid() != 0,
                                reason="needs runc and root")

RUNTIME = NATIVE_BIN / "vgpu-runtime"
RESTARTS = 5


class Starter:
    """Containers through vgpu-runtime on runc, against one vgpud's sockets."""

    def __init__(self, tmp: Path, sim: Path, v: Vgpud) -> None:
        self.tmp, self.sim, self.v = tmp, sim, v
        config = tmp / "runtime.yaml"
        config.write_text(f"paths:\n  socket: {v.socket}\n  run_dir: {v.run_dir}\n"
                          "hook:\n  wait_s: 20\nruntime:\n  lower: runc\n")
        self.env = dict(clean_env(), VGPU_CONFIG=str(config), VGPU_SOCKET=str(v.socket))
        self.rootfs = build_rootfs(tmp / "rootfs")
        self.n = 0

    def bundle(self, script: str, memory: str, shared_rootfs: bool = True) -> tuple[Path, str]:
        self.n += 1
        cid = f"vgpu-restart-{os.getpid()}-{self.n}"
        b = make_bundle(self.tmp / cid, args=["/bin/sh", "-c", script],
                        annotations={"vgpu.io/memory": memory},
                        env=["SIMGPU_STATE=/sim/simgpu.state"],
                        mounts=[{"destination": "/sim", "type": "bind", "source": str(self.sim),
                                 "options": ["rbind", "rw"]}],
                        rootfs=self.rootfs if shared_rootfs else None)
        return b, cid

    def popen(self, b: Path, cid: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(RUNTIME), "--root", str(self.v.runc), "run", "--bundle",
                                 str(b), cid], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def run(self, b: Path, cid: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(RUNTIME), "--root", str(self.v.runc), "run", "--bundle",
                               str(b), cid], env=self.env, capture_output=True, text=True,
                              timeout=60)

    def slices(self) -> list[pb.Slice]:
        return list(self.v.stub.List(pb.ListRequest(), timeout=10).slices)

    def close(self) -> None:
        for d in self.tmp.iterdir():
            if d.name.startswith("vgpu-restart-"):
                subprocess.run(["runc", "--root", str(self.v.runc), "delete", "-f", d.name],
                               capture_output=True)


def test_five_restarts_while_containers_start_lose_no_start_and_no_slice(tmp_path):
    sim, act = activated_vgpud(tmp_path, {"hook": {"wait_s": 20}})
    host = Starter(tmp_path, sim, act.vgpud)
    try:
        # A running container whose slice must stay enforced through every restart: it
        # holds 32 MiB, sleeps across the restarts, then fills to its 128 MiB limit.
        b, cid = host.bundle(f"vgpu_probe alloc:mem:{32 * MiB} info sleep:12000 "
                             f"fill:mem:{16 * MiB} info", "128Mi", shared_rootfs=False)
        long = host.popen(b, cid)
        deadline = time.monotonic() + 30
        while not host.slices():
            assert time.monotonic() < deadline and long.poll() is None, long.stderr
            time.sleep(0.05)
        [held] = host.slices()
        region = Path(held.vgpus[0].region_path)
        inodes = {p: p.stat().st_ino for p in (region, Path(f"{region}.usage"))}

        stop = threading.Event()
        results: list[tuple[int, str]] = []

        def loop() -> None:
            while not stop.is_set():
                b, cid = host.bundle("vgpu_probe info", "64Mi")
                p = host.run(b, cid)
                info = [x for x in probe_lines(p.stdout) if x["op"] == "info"]
                ok = p.returncode == 0 and [x["total"] for x in info] == [64 * MiB]
                results.append((0 if ok else 1, p.stderr.strip()))

        t = threading.Thread(target=loop)
        t.start()
        took = []
        try:
            for _ in range(RESTARTS):
                time.sleep(0.3)
                took.append(act.restart())
        finally:
            time.sleep(0.5)
            stop.set()
            t.join(120)
        failed = [err for rc, err in results if rc]
        assert failed == [], failed
        assert len(results) >= RESTARTS, results  # starts happened across the restarts
        assert {p: p.stat().st_ino for p in inodes} == inodes

        out, err = long.communicate(timeout=60)
        assert long.returncode == 0, err
        lines = probe_lines(out)
        fill = next(x for x in lines if x["op"] == "fill")
        # 32 MiB held + 6 x 16 MiB = the 128 MiB limit, refused after it.
        assert (fill["count"], fill["result"]) == (6, "CUDA_ERROR_OUT_OF_MEMORY")
        assert host.slices() == []  # every container's slice released at its exit
        print(f"restarts to serving: {[round(x, 2) for x in took]} s; "
              f"{len(results)} container starts, 0 failed")
    finally:
        host.close()
        act.close()


def test_a_start_while_vgpud_is_down_waits_for_it_within_wait_s(tmp_path):
    """Without socket activation (vgpud restarted by hand or by a DaemonSet)."""
    sim, v = simgpu_vgpud(tmp_path, {"hook": {"wait_s": 20}})
    host = Starter(tmp_path, sim, v)
    try:
        assert v.stop() == 0
        b, cid = host.bundle("vgpu_probe info", "64Mi")
        p = host.popen(b, cid)
        time.sleep(1.5)
        assert p.poll() is None  # waiting for vgpud
        v.start()
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert [x["total"] for x in probe_lines(out) if x["op"] == "info"] == [64 * MiB]
        assert host.slices() == []
    finally:
        host.close()
        v.close()
