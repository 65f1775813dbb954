# SPDX-License-Identifier: Apache-2.0
"""A private vgpud on simgpu for the benchmarks (every path in a temporary tree)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from arbiter.proto import vgpu_pb2 as pb  # noqa: E402
from arbiter.proto import vgpu_pb2_grpc  # noqa: E402


def simgpu_env(tmp: Path, devices: str) -> dict[str, str]:
    """The environment of a process that sees the benchmark's simulated GPUs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPU_", "SIMGPU_"))}
    env.pop("LD_PRELOAD", None)
    env["SIMGPU_STATE"] = str(tmp / "simgpu.state")
    env["SIMGPU_DEVICES"] = devices
    env["LD_LIBRARY_PATH"] = str(ROOT / "build" / "simgpu")
    env["PYTHONPATH"] = str(ROOT)
    return env


def start_vgpud(tmp: Path, run_dir: Path,
                devices: str = "16Gi,16Gi,16Gi,16Gi") -> tuple[subprocess.Popen[bytes], Path]:
    """vgpud on a private simgpu; returns the process and its socket."""
    env = simgpu_env(tmp, devices)
    config = tmp / "config.yaml"
    # The reconciler's interval stays long: it must not take the bench's slices for dead.
    config.write_text("metrics:\n  address: ''\nreconcile:\n  interval_s: 3600\n"
                      # The broker outlives vgpud (restarts); a bench's goes soon after.
                      "broker:\n  orphan_s: 1\n"
                      "devices:\n  nodes: {'*': [/dev/null]}\n")
    sock = tmp / "vgpud.sock"
    log = open(tmp / "vgpud.log", "wb")  # noqa: SIM115 - lives as long as vgpud
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpud", "--config", str(config), "--socket", str(sock),
         "--state-dir", str(tmp / "state"), "--run-dir", str(run_dir),
         "--log-level", "warning"], cwd=ROOT, env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"bench: vgpud exited {proc.returncode}:\n"
                     f"{(tmp / 'vgpud.log').read_text()}")
        if sock.exists():
            with grpc.insecure_channel(f"unix:{sock}") as ch:
                try:
                    vgpu_pb2_grpc.ArbiterStub(ch).Health(pb.HealthRequest(), timeout=2)
                    return proc, sock
                except grpc.RpcError:
                    pass
        time.sleep(0.1)
    proc.kill()
    sys.exit("bench: vgpud did not start")


def stop_vgpud(proc: subprocess.Popen[bytes], run_dir: Path) -> None:
    """SIGTERM vgpud and wait for it, then lazily unmount what it left mounted under run_dir
    (each slice's tmpfs and its .req bind outlive vgpud, as running containers need them;
    a temporary run dir cannot be removed over them)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    unmount_under(run_dir)


def unmount_under(run_dir: Path) -> None:
    """Lazily unmount everything at or below run_dir, deepest first."""
    top = str(run_dir).rstrip("/")
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        points = [line.split()[4] for line in f]
    for point in sorted((p for p in points if p == top or p.startswith(top + "/")),
                        key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def request(owner: str, devices: list[str] | None = None) -> pb.AllocateRequest:
    """The benchmarks' Allocate: 64 MiB and 2 % compute, for a process (this one)."""
    return pb.AllocateRequest(owner=owner, memory_bytes=64 << 20, compute_percent=2, count=1,
                              owner_kind="process", owner_pid=os.getpid(),
                              devices=devices or [])


def preset(sock: Path, n: int) -> None:
    """Place n slices on GPU 0 (each the benchmarks' Allocate)."""
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        stub = vgpu_pb2_grpc.ArbiterStub(ch)
        for i in range(n):
            stub.Allocate(request(f"bench-preset-{i}", ["0"]), timeout=10)
        on0 = [s for s in stub.List(pb.ListRequest(), timeout=10).slices
               if s.vgpus and s.vgpus[0].gpu_index == 0]
        assert len(on0) == n, f"expected {n} slices on GPU 0, found {len(on0)}"


def _stat(stat: str) -> tuple[int, int]:
    """(parent pid, CPU ticks: user + system) from the text of a /proc/<pid>/stat."""
    fields = stat.rsplit(")", 1)[1].split()  # comm may hold spaces: fields after it
    return int(fields[1]), int(fields[11]) + int(fields[12])


def own_cpu(pid: int, proc: Path = Path("/proc")) -> float:
    """CPU seconds (user + system) that pid alone has used, from /proc."""
    return _stat((proc / str(pid) / "stat").read_text())[1] / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int, proc: Path = Path("/proc")) -> float:
    """CPU seconds (user + system) that pid and every process below it (vgpud's broker)
    have used, from /proc; 0 when pid is gone."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            stat = (proc / entry / "stat").read_text()
        except OSError:
            continue
        parent[int(entry)], ticks[int(entry)] = _stat(stat)

    def below(p: int) -> bool:
        seen = set()
        while p > 1 and p not in seen:
            if p == pid:
                return True
            seen.add(p)
            p = parent.get(p, 0)
        return False

    return sum(t for p, t in ticks.items() if below(p)) / os.sysconf("SC_CLK_TCK")
