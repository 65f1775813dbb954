#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vgpud restarts under socket activation: time to serving again, and what a container
start waiting on the lifecycle socket sees meanwhile.

Binds vgpud's two sockets itself (what vgpud.socket does), starts vgpud on simgpu with
them passed (LISTEN_FDS), then:

1. restart to serving: SIGTERM sent -> the first successful Health on the public socket
   (a call made at once and held in the kernel backlog), p50/p99 over --restarts, split
   into the old vgpud's stop (SIGTERM -> exit) and the new one's start (exec -> serving);
2. lifecycle round trips (the call every container start makes; `release` of no
   container, answered without touching the store) in a loop for --loop-s without
   restarts (the baseline) and again across --loop-restarts restarts: the longest wait
   of each and the ratio.

vgpud runs with a bytecode cache in the bench's temporary dir (PYTHONPYCACHEPREFIX; the
first start fills it), as an installed vgpud runs: pip compiles a package's modules at
install. `--no-bytecode` compiles every module at every start instead (a source checkout
under PYTHONDONTWRITEBYTECODE=1: ~150 ms more per start here).

The target is a restart p99 <= 1 s; the figures depend on the machine (print the load
average with them). Not a timed test.

    python3 bench/restart.py [--restarts 20] [--loop-s 6] [--loop-restarts 3] [--no-bytecode]
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
from vgpud_proc import ROOT, simgpu_env

sys.path.insert(0, str(ROOT / "tests"))
from support.socket_activation import listening_socket

from arbiter.proto import vgpu_pb2 as pb
from arbiter.proto import vgpu_pb2_grpc
from shim.lifecycle import request


class Activated:
    """vgpud started with inherited sockets, as systemd would."""

    def __init__(self, tmp: Path, bytecode: bool = True) -> None:
        self.tmp = tmp
        self.sock = tmp / "vgpud.sock"
        self.lifecycle = Path(f"{self.sock}.lifecycle")
        self.listeners = [listening_socket(self.sock), listening_socket(self.lifecycle)]
        self.fds = [os.dup(s.fileno()) for s in self.listeners]
        for fd in self.fds:
            os.set_inheritable(fd, True)
        self.env = simgpu_env(tmp, "16Gi,16Gi")
        self.env.update(LISTEN_FDS="2", LISTEN_FDNAMES="vgpud:vgpud")
        if bytecode:
            self.env.pop("PYTHONDONTWRITEBYTECODE", None)
            self.env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
        else:
            self.env["PYTHONDONTWRITEBYTECODE"] = "1"
        config = tmp / "config.yaml"
        config.write_text("metrics:\n  address: ''\nreconcile:\n  interval_s: 3600\n"
                          # The broker outlives vgpud; a bench's goes soon after.
                          "broker:\n  orphan_s: 5\n"
                          "devices:\n  nodes: {'*': [/dev/null]}\n")
        moves = " ".join(f"{3 + i}<&{fd} {fd}<&-" for i, fd in enumerate(self.fds))
        self.cmd = ["bash", "-c", f'exec {moves}; LISTEN_PID=$$ exec "$@"', "vgpud",
                    sys.executable, "-m", "vgpud", "--config", str(config), "--socket",
                    str(self.sock), "--state-dir", str(tmp / "state"), "--run-dir",
                    str(tmp / "run"), "--log-level", "warning"]
        self.log = open(tmp / "vgpud.log", "ab")  # noqa: SIM115 - lives as long as vgpud
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=self.log,
                                     stderr=self.log, pass_fds=self.fds)

    def health(self, timeout: float = 60) -> None:
        """Returns once a fresh channel's Health succeeds (held in the backlog meanwhile)."""
        with grpc.insecure_channel(f"unix:{self.sock}") as ch:
            vgpu_pb2_grpc.ArbiterStub(ch).Health(pb.HealthRequest(), timeout=timeout,
                                                 wait_for_ready=True)

    def restart(self) -> tuple[float, float, float]:
        """(total, stop, start) seconds: SIGTERM -> serving, SIGTERM -> exit, exit -> serving."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        t1 = time.monotonic()
        self.start()
        self.health()
        t2 = time.monotonic()
        return t2 - t0, t1 - t0, t2 - t1

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def rpc_latency(path: Path, n: int) -> tuple[float, float]:
    """(p50, p99) seconds of List calls on one channel to the unix socket at path."""
    with grpc.insecure_channel(f"unix:{path}") as ch:
        stub = vgpu_pb2_grpc.ArbiterStub(ch)
        stub.Health(pb.HealthRequest(), timeout=10)
        times = []
        for _ in range(n):
            t = time.monotonic()
            stub.List(pb.ListRequest(), timeout=10)
            times.append(time.monotonic() - t)
    return pct(times, 50), pct(times, 99)


def lifecycle_loop(a: Activated, seconds: float, restarts: int) -> list[float]:
    """Round-trip times of back-to-back lifecycle calls for `seconds`, with `restarts`
    restarts spread over them; every call must be answered."""
    times: list[float] = []
    failures: list[str] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            t = time.monotonic()
            try:
                r = request(a.lifecycle, [("op", "release"), ("id", "nobody")], timeout=30)
                if r.get("status") != "ok":
                    failures.append(str(r.items))
            except OSError as e:
                failures.append(str(e))
            times.append(time.monotonic() - t)

    th = threading.Thread(target=loop)
    th.start()
    t_end = time.monotonic() + seconds
    for _i in range(restarts):
        time.sleep(seconds / (restarts + 1))
        a.restart()
    time.sleep(max(0.0, t_end - time.monotonic()))
    stop.set()
    th.join()
    if failures:
        sys.exit(f"bench: {len(failures)} lifecycle calls failed: {failures[:3]}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--restarts", type=int, default=20)
    ap.add_argument("--loop-s", type=float, default=6.0)
    ap.add_argument("--loop-restarts", type=int, default=3)
    ap.add_argument("--no-bytecode", dest="bytecode", action="store_false",
                    help="compile every module at every start (no bytecode cache)")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}; bytecode cache: "
          f"{'yes' if args.bytecode else 'no'}")
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-restart-") as d:
        a = Activated(Path(d), bytecode=args.bytecode)
        try:
            t0 = time.monotonic()
            a.start()
            a.health()
            print(f"first start to serving: {1000 * (time.monotonic() - t0):.0f} ms")
            # The relay's cost: List (what `vgpu ls` calls) through the inherited socket
            # vs straight on the gRPC server's private socket, alternated.
            relay, direct = [], []
            for _ in range(5):
                relay.append(rpc_latency(a.sock, 200))
                direct.append(rpc_latency(a.tmp / "run" / "vgpud.grpc.sock", 200))
            r50, d50 = (statistics.median(x[0] for x in v) for v in (relay, direct))
            r99, d99 = (statistics.median(x[1] for x in v) for v in (relay, direct))
            print(f"List via the relay: p50 {1000 * r50:.2f} ms, p99 {1000 * r99:.2f} ms; "
                  f"direct: p50 {1000 * d50:.2f} ms, p99 {1000 * d99:.2f} ms "
                  f"(relay +{1000 * (r50 - d50):.2f} ms at p50)")
            runs = [a.restart() for _ in range(args.restarts)]
            total, stops, starts = ([r[i] for r in runs] for i in range(3))
            print(f"restart to serving over {len(runs)}: p50 {1000 * pct(total, 50):.0f} ms, "
                  f"p99 {1000 * pct(total, 99):.0f} ms (target p99 <= 1000 ms); "
                  f"stop p50 {1000 * statistics.median(stops):.0f} ms, "
                  f"start p50 {1000 * statistics.median(starts):.0f} ms")
            base = lifecycle_loop(a, args.loop_s, 0)
            during = lifecycle_loop(a, args.loop_s, args.loop_restarts)
            print(f"lifecycle calls without restarts: {len(base)}, p50 "
                  f"{1000 * statistics.median(base):.2f} ms, longest {1000 * max(base):.1f} ms")
            print(f"lifecycle calls across {args.loop_restarts} restarts: {len(during)}, "
                  f"0 failed, p50 {1000 * statistics.median(during):.2f} ms, longest "
                  f"{1000 * max(during):.0f} ms ({max(during) / max(base):.0f}x the "
                  f"baseline's longest)")
        finally:
            a.close()
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
