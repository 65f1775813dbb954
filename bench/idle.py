#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What vgpud and its broker cost while nothing happens: CPU a second, idle.

A node's GPUs sit idle most of the day with their slices allocated; whatever vgpud and its
broker (vgpu-broker, one thread per GPU) burn then is paid all day. This starts vgpud on 4
simulated GPUs, places --slices slices on GPU 0 (none in use), waits a second, and reads
the CPU time (user + system, from /proc) of vgpud's own process and of the processes below
it (its broker) over --window seconds. Each build measures each row once a round, the
builds alternating; the table shows the median of the rounds. --against REF (default: the
previous release, bench/against.py) builds that commit in a worktree and measures it
beside the tree; one with no broker shows none. Not a timed test: the ratios are the
result.

    python3 bench/idle.py [--slices 0,10,50] [--window 5] [--rounds 3] [--against REF|none]
                          [--dir /var/tmp] [--run-dir-parent /dev/shm]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from against import (  # noqa: E402
    NONE,
    Tree,
    built_tree,
    exit_on_sigterm,
    previous_release,
    start_vgpud,
    this_tree,
)
from vgpud_proc import own_cpu, preset, stop_vgpud, tree_cpu  # noqa: E402


def measure(tree: Tree, slices: int, window: float, state_parent: str,
            run_parent: str) -> tuple[float, float]:
    """(vgpud, its broker): milliseconds of CPU a second, idle, with `slices` on GPU 0."""
    with tempfile.TemporaryDirectory(prefix="vgpu-idle-", dir=state_parent) as state, \
            tempfile.TemporaryDirectory(prefix="vgpu-idle-run-", dir=run_parent) as run:
        proc, sock = start_vgpud(tree, Path(state), Path(run))
        try:
            preset(sock, slices)
            time.sleep(1.0)  # the broker takes them on, vgpud's start settles
            own0, all0 = own_cpu(proc.pid), tree_cpu(proc.pid)
            time.sleep(window)
            own1, all1 = own_cpu(proc.pid), tree_cpu(proc.pid)
        finally:
            stop_vgpud(proc, Path(run))
    return (own1 - own0) / window * 1e3, ((all1 - all0) - (own1 - own0)) / window * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slices", default="0,10,50", help="slices on GPU 0, comma separated")
    ap.add_argument("--window", type=float, default=5.0, help="seconds measured per row")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per build")
    ap.add_argument("--against", default=None, metavar="REF",
                    help="another build to measure beside the tree (default: the previous "
                         f"release; '{NONE}': the tree alone)")
    ap.add_argument("--dir", default="/var/tmp", help="parent of the state dirs and worktree")
    ap.add_argument("--run-dir-parent", default="/dev/shm", help="parent of the run dirs")
    args = ap.parse_args()
    levels = [int(x) for x in args.slices.split(",")]
    exit_on_sigterm()
    ref = previous_release() if args.against is None else args.against
    with contextlib.ExitStack() as stack:
        trees = [this_tree()]
        if ref != NONE:
            print(f"bench: building {ref} in a worktree under {args.dir}", flush=True)
            trees.append(stack.enter_context(built_tree(ref, parent=args.dir)))
        got: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for r in range(args.rounds):
            for n in levels:
                # Alternating which build goes first: a drift of the machine hits both.
                for t in trees if r % 2 == 0 else trees[::-1]:
                    got.setdefault((t.label, n), []).append(
                        measure(t, n, args.window, args.dir, args.run_dir_parent))
    print(f"vgpud and its broker, idle: CPU ms a second over {args.window:g} s, median of "
          f"{args.rounds} round(s); {os.cpu_count()} CPUs; 4 simulated GPUs")
    print(f"{'slices on GPU 0':>15}  {'build':10} {'vgpud':>7} {'broker':>7} {'total':>7}")
    for n in levels:
        for t in trees:
            rows = got[(t.label, n)]
            own = statistics.median(v for v, _ in rows)
            broker = statistics.median(b for _, b in rows)
            print(f"{n:>15}  {t.label:10} {own:7.1f} {broker:7.1f} {own + broker:7.1f}")
        if len(trees) == 2:
            mine = statistics.median(v + b for v, b in got[(trees[0].label, n)])
            other = statistics.median(v + b for v, b in got[(trees[1].label, n)])
            ratio = f"x{mine / other:.2f}" if other > 0 else "n/a"
            print(f"{'':>15}  tree / {trees[1].label}: total {ratio}")
    print("command: python3 bench/idle.py " + " ".join(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
