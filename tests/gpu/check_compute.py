#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compute shares and priority of libvgpu on a real NVIDIA GPU (not for CI).

    python3 tests/gpu/check_compute.py [--window 5] [--size 4096]

Each worker is a process running a PyTorch (or CuPy) matmul loop under
LD_PRELOAD=build/libvgpu.so with its own VGPU_COMPUTE_LIMIT / VGPU_POLICY /
VGPU_PRIORITY; all name one VGPU_SCHED_DIR. A worker's share is its matmul rate
over the window divided by the rate of the same loop running alone with no
limit, which on a GPU that runs one context at a time is its share of GPU time.
Prints the same table as bench/compute.py: targets 2..70 % against a greedy
neighbour, splits 10:90 30:70 50:50 20:30:50, and a priority pair.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "build" / "libvgpu.so"

WORKER = r"""
import json, sys, time
size, start, until = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
try:
    import torch
    a = torch.randn(size, size, device="cuda"); b = torch.randn(size, size, device="cuda")
    mm, sync = (lambda: a @ b), torch.cuda.synchronize
except ImportError:
    import cupy
    a = cupy.random.rand(size, size, dtype=cupy.float32)
    b = cupy.random.rand(size, size, dtype=cupy.float32)
    mm, sync = (lambda: a @ b), cupy.cuda.Device().synchronize
mm(); sync()
while time.monotonic_ns() < start:
    time.sleep(0.001)
n = 0
while time.monotonic_ns() < until:
    for _ in range(4):
        mm()
    sync()
    n += 4
print(json.dumps({"n": n}))
"""


def run(workers: list[dict[str, str]], window: float, size: int, starts: list[float] | None = None
        ) -> list[float]:
    """Matmuls per second of each worker over its window."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sched").mkdir()
        t0 = time.monotonic_ns() + int(8e9)           # CUDA start-up takes seconds
        procs = []
        for i, extra in enumerate(workers):
            env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
            env.update(LD_PRELOAD=str(LIB), VGPU_SCHED_DIR=f"{tmp}/sched", **extra)
            s = t0 + int((starts[i] if starts else 0) * 1e9)
            procs.append((s, subprocess.Popen(
                [sys.executable, "-c", WORKER, str(size), str(s), str(t0 + int(window * 1e9))],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        rates = []
        for s, p in procs:
            out, err = p.communicate(timeout=window + 120)
            if p.returncode != 0:
                sys.exit(f"worker failed: {err.strip()[-500:]}")
            span = (t0 + int(window * 1e9) - s) / 1e9
            rates.append(json.loads(out)["n"] / span)
        return rates


def lim(pct: int, policy: str, prio: str = "normal") -> dict[str, str]:
    return {"VGPU_COMPUTE_LIMIT": str(pct), "VGPU_POLICY": policy, "VGPU_PRIORITY": prio}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=4096)
    args = ap.parse_args()
    if not LIB.exists():
        sys.exit(f"{LIB} missing: run make")
    w, n = args.window, args.size
    (alone,) = run([{}], w, n)
    print(f"matmul {n}x{n} alone: {alone:.1f}/s; shares over {w:g} s windows")
    print("case                   achieved  err pp")
    for x in (2, 5, 10, 30, 50, 70):
        r = run([lim(x, "fixed"), lim(100 - x, "burst")], w, n)
        got = r[0] / alone * 100
        print(f"{x:>3}% vs greedy          {got:7.2f}  {abs(got - x):6.2f}  "
              f"(neighbour {r[1] / alone * 100:.1f}%)", flush=True)
    for split in ((10, 90), (30, 70), (50, 50), (20, 30, 50)):
        r = run([lim(p, "fixed") for p in split], w, n)
        got = [x / alone * 100 for x in r]
        print(f"split {':'.join(map(str, split)):<12}   {':'.join(f'{g:.1f}' for g in got)}  "
              f"{max(abs(g - p) for g, p in zip(got, split, strict=False)):6.2f}", flush=True)
    (high_alone,) = run([lim(50, "burst", "high")], w, n)
    low, high = run([lim(50, "burst", "low"), lim(50, "burst", "high")], w, n, starts=[0, w / 2])
    print(f"priority: high alone {high_alone:.1f}/s, with a greedy low {high:.1f}/s "
          f"(ratio {high / high_alone:.3f}); low {low:.1f}/s over the whole window")


if __name__ == "__main__":
    main()
