#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vgpu-dra-plugin: NodePrepareResources latency for one claim, against vgpud's own
Allocate + Release round trip measured in the same run.

A private vgpud on simgpu (4 GPUs), the fake API server and fake kubelet of tests/support
(real HTTP, real gRPC on unix sockets: tests/support/fake_apiserver.py,
fake_kubelet_dra.py) and the plugin as a process of this checkout. Each of `--claims`
claims (64Mi and 2 % on one GPU, round robin) is prepared with its own
NodePrepareResources call, as the kubelet calls it before a pod starts: the plugin reads
the claim from the API server, allocates the slice, writes its CDI spec and its
checkpoint (both fsynced). The baseline, alternating with it: a bare Allocate of the same
vGPU (owner kind claim) and its Release on vgpud's socket. Unprepare is timed too.
Reported: p50 and p99 of each, the ratio prepare / baseline, and the target.

    python3 bench/dra.py [--claims 50] [--dir /var/tmp]
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
import grpc  # noqa: E402
from vgpud_proc import pb, start_vgpud, stop_vgpud, vgpu_pb2_grpc  # noqa: E402

TARGET_P99_MS = 50.0     # issue 13
NODE = "bench-node"
WARMUP = 5


def pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, round(q * len(ys)) - 1))]


def line(name: str, xs: list[float]) -> str:
    return (f"{name:<34} p50 {statistics.median(xs):7.2f} ms   p99 {pct(xs, 0.99):7.2f} ms"
            f"   ({len(xs)} calls)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--claims", type=int, default=50)
    ap.add_argument("--dir", default="/var/tmp", help="where the temporary tree goes")
    args = ap.parse_args()
    from support.fake_apiserver import FakeApiServer, claim, result
    from support.fake_kubelet_dra import DraKubelet

    with tempfile.TemporaryDirectory(prefix="vgpu-drabench-", dir=args.dir) as d, \
            tempfile.TemporaryDirectory(prefix="vgpu-drabench-run-", dir="/dev/shm") as r:
        tmp = Path(d)
        daemon, sock = start_vgpud(tmp, Path(r))
        api = FakeApiServer().start()
        kubelet = DraKubelet(tmp / "kubelet").start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
        env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        log = open(tmp / "plugin.log", "wb")  # noqa: SIM115 - lives as long as the plugin
        plugin_proc = subprocess.Popen(
            [sys.executable, "-m", "vgpu_k8s.dra.main", "--node-name", NODE,
             "--kubelet-dir", str(kubelet.dir), "--cdi-dir", str(tmp / "cdi"),
             "--socket", str(sock), "--kubeconfig", str(api.kubeconfig(tmp / "kubeconfig"))],
            cwd=ROOT, env=env, stdout=log, stderr=log)
        channel = grpc.insecure_channel(f"unix:{sock}")
        arbiter = vgpu_pb2_grpc.ArbiterStub(channel)
        try:
            plugin = kubelet.wait_registered("vgpu.io")
            gpus = list(arbiter.Devices(pb.DevicesRequest(), timeout=5).devices)
            prepare, unprepare, baseline = [], [], []
            refs = []
            for i in range(args.claims + WARMUP):
                g = gpus[i % len(gpus)]
                obj = api.add_claim(claim("bench", f"c{i}", [result(
                    "gpu", f"gpu-{g.index}", NODE, memory="64Mi", compute="2")], node=NODE))
                ref = ("bench", f"c{i}", obj["metadata"]["uid"])
                refs.append(ref)
                owner = f"bench-{uuid.uuid4().hex}"
                t0 = time.perf_counter()
                arbiter.Allocate(pb.AllocateRequest(
                    owner=owner, owner_kind="claim", vgpus=[pb.VGpuRequest(
                        memory_bytes=64 << 20, compute_percent=2, device=g.uuid)]), timeout=10)
                arbiter.Release(pb.ReleaseRequest(owner=owner), timeout=10)
                baseline.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                answer = plugin.prepare([ref])[ref[2]]
                prepare.append((time.perf_counter() - t0) * 1000)
                if answer.error:
                    sys.exit(f"bench: prepare failed: {answer.error}")
            for ref in refs:
                t0 = time.perf_counter()
                error = plugin.unprepare([ref])[ref[2]].error
                unprepare.append((time.perf_counter() - t0) * 1000)
                if error:
                    sys.exit(f"bench: unprepare failed: {error}")
            prepare, baseline = prepare[WARMUP:], baseline[WARMUP:]
            unprepare = unprepare[WARMUP:]
            p99 = pct(prepare, 0.99)
            print(f"vgpu-dra-plugin, {args.claims} claims (64Mi + 2 % on one of "
                  f"{len(gpus)} simulated GPUs), one claim per call; load average "
                  f"{os.getloadavg()[0]:.2f}")
            print(line("vgpud Allocate + Release (baseline)", baseline))
            print(line("NodePrepareResources", prepare))
            print(line("NodeUnprepareResources", unprepare))
            ratio = statistics.median(prepare) / statistics.median(baseline)
            print(f"prepare / baseline: p50 x{ratio:.2f}, p99 x{p99 / pct(baseline, 0.99):.2f}")
            print(f"target p99 <= {TARGET_P99_MS:.0f} ms: "
                  f"{'met' if p99 <= TARGET_P99_MS else 'MISSED'} ({p99:.2f} ms)")
        finally:
            channel.close()
            plugin_proc.send_signal(signal.SIGTERM)
            try:
                plugin_proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                plugin_proc.kill()
            log.close()
            kubelet.stop()
            api.stop()
            stop_vgpud(daemon, Path(r))


if __name__ == "__main__":
    main()
