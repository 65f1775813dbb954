#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Added cost of libvgpu's interception, against simgpu alone, measured in one run.

For cuLaunchKernel and for a cuMemAlloc_v2 + cuMemFree_v2 pair, the same C
client (build/tests/vgpu_probe) runs on the same simulated GPU without and
with LD_PRELOAD=build/libvgpu.so (a 16 GiB limit in a shared region dir, so
every path is enforced). Runs alternate and the median of several rounds is
reported, first for one process, then for N processes in one slice at once.

    python3 bench/interception.py [--rounds 5] [--procs 8]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "build" / "tests" / "vgpu_probe"
LIBVGPU = ROOT / "build" / "libvgpu.so"


def environment(state: Path, region: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPU_", "SIMGPU_"))}
    env.pop("LD_PRELOAD", None)
    env["SIMGPU_STATE"] = str(state)
    env["SIMGPU_DEVICES"] = "64Gi"
    env["LD_LIBRARY_PATH"] = str(ROOT / "build" / "simgpu")
    if region is not None:
        env["LD_PRELOAD"] = str(LIBVGPU)
        env["VGPU_MEMORY_LIMIT"] = "16Gi"
        env["VGPU_REGION_DIR"] = str(region)
    return env


def measure(env: dict[str, str], op: str, key: str, procs: int) -> float:
    """Median over `procs` simultaneous processes of one probe figure."""
    running = [subprocess.Popen([str(PROBE), op], env=env, stdout=subprocess.PIPE, text=True)
               for _ in range(procs)]
    figures = []
    for p in running:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            sys.exit(f"bench: {PROBE} {op} exited {p.returncode}")
        figures.append([json.loads(x) for x in out.splitlines() if key in x][-1][key])
    return statistics.median(figures)


def compare(tmp: Path, op: str, key: str, procs: int, rounds: int) -> tuple[float, float]:
    base, hooked = [], []
    for r in range(rounds):
        base.append(measure(environment(tmp / "state", None), op, key, procs))
        region = tmp / f"region-{procs}-{r}"
        hooked.append(measure(environment(tmp / "state", region), op, key, procs))
    return statistics.median(base), statistics.median(hooked)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--launches", type=int, default=2_000_000)
    ap.add_argument("--allocs", type=int, default=100_000)
    args = ap.parse_args()
    if not PROBE.exists() or not LIBVGPU.exists():
        sys.exit("bench: run `make` first")
    rows = []
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-") as d:
        tmp = Path(d)
        for procs in (1, args.procs):
            for label, op, key, target in (
                ("cuLaunchKernel", f"bench_launch:{args.launches}", "ns_per_call", 100.0),
                ("cuMemAlloc_v2+cuMemFree_v2", f"bench_alloc:{1 << 20}:{args.allocs}",
                 "ns_per_pair", 2000.0),
            ):
                base, hooked = compare(tmp, op, key, procs, args.rounds)
                rows.append((label, procs, base, hooked, hooked - base, target))
    print(f"{'call':<28} {'procs':>5} {'simgpu ns':>10} {'+libvgpu ns':>12} {'added ns':>9}"
          f" {'ratio':>6} {'target':>8}")
    for label, procs, base, hooked, added, target in rows:
        verdict = "ok" if added <= target else "MISS"
        print(f"{label:<28} {procs:>5} {base:>10.1f} {hooked:>12.1f} {added:>9.1f}"
              f" {hooked / base:>6.3f} {'<=' + format(target, '.0f'):>6} {verdict}")


if __name__ == "__main__":
    main()
