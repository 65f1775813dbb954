#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Container start-to-exit time: plain runc against vgpu-runtime with a vGPU request.

Both run the same bundle (the test rootfs, process /bin/true) through `runc run`;
the vGPU runs go through vgpu-runtime (the compiled one, build/bin/vgpu-runtime:
a private vgpud on simgpu allocates the slice and adds the hooks over its
lifecycle socket; the compiled vgpu-hook mounts it) with `vgpu.io/memory=64Mi`.
Runs alternate; the median and p99 of each and the added median are reported, then
20 vGPU containers are started at once and their p99 is compared with the
single-start median; 20 plain runc containers at once give the same ratio for
plain runc, for context.

By default the previous release runs beside the tree (as in bench/arbiter.py:
--against REF builds that commit or tag in a temporary git worktree, bench/against.py;
while no v* tag exists, bfd1b41): its own vgpud, vgpu-runtime and vgpu-hook start the
same bundles, in the same alternation, and its rows and added time are printed beside
the tree's. Start i of each build ran back to back: a median slower than the other
build's is a finding only when more of those pairs were slower than chance makes
(bench/paired.py). --against none: the tree alone.

    python3 bench/containers.py [--runs 30] [--concurrent 20] [--against REF|none]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
from against import (  # noqa: E402
    NONE,
    PREVIOUS_FALLBACK,
    Tree,
    built_tree,
    exit_on_sigterm,
    previous_release,
    start_vgpud,
    this_tree,
    vgpud_proc,
)
from paired import against, past_noise  # noqa: E402
from vgpud_proc import stop_vgpud  # noqa: E402

TARGET_ADDED_MS = 25.0   # issue 11: start overhead <= +25 ms median over plain runc
TARGET_CONCURRENT_RATIO = 3.0


def base_spec(tmp: Path) -> dict:
    subprocess.run(["runc", "spec"], cwd=tmp, check=True)
    spec = json.loads((tmp / "config.json").read_text())
    (tmp / "config.json").unlink()
    return spec


def make_bundle(path: Path, spec: dict, rootfs: Path, state: Path, vgpu: bool) -> Path:
    path.mkdir()
    spec = json.loads(json.dumps(spec))
    spec["root"] = {"path": str(rootfs), "readonly": True}
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["/bin/true"]
    spec["process"]["env"].append(f"SIMGPU_STATE={state / 'simgpu.state'}")
    spec["mounts"].append({"destination": str(state), "type": "bind", "source": str(state),
                           "options": ["rbind", "rw"]})
    if vgpu:
        spec["annotations"] = {"vgpu.io/memory": "64Mi", "vgpu.io/compute": "2"}
    (path / "config.json").write_text(json.dumps(spec))
    return path


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    return elapsed * 1000


def pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, round(q * len(ys)) - 1))]


def at_once(cmds: list[list[str]], env: dict[str, str]) -> list[float]:
    """Start every command at the same moment; each one's start-to-exit ms."""
    out: list[float] = []
    lock = threading.Lock()

    def start(cmd: list[str]) -> None:
        ms = timed(cmd, env)
        with lock:
            out.append(ms)

    threads = [threading.Thread(target=start, args=(c,)) for c in cmds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@dataclass
class Build:
    """One build's private vgpud and the environment its vgpu-runtime runs in."""

    tree: Tree
    runtime: Path
    env: dict[str, str]
    state: Path  # its simgpu state's directory, bind-mounted into its containers
    single: list[float] = field(default_factory=list)
    together: list[float] = field(default_factory=list)


def start_build(tree: Tree, stack: contextlib.ExitStack) -> Build:
    """Start tree's vgpud on a private simgpu; its vgpu-runtime points at it."""
    runtime = tree.path / "build" / "bin" / "vgpu-runtime"
    if not runtime.exists():
        sys.exit(f"bench: {runtime} is missing (run make)")
    proc_mod = vgpud_proc(tree)
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vgpu-cbench-",
                                                               dir="/var/tmp")))
    run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vgpu-cbench-run-",
                                                                   dir="/dev/shm")))
    daemon, sock = start_vgpud(tree, tmp, run_dir)
    stack.callback(stop_vgpud, daemon, run_dir)
    env = proc_mod.simgpu_env(tmp, "16Gi,16Gi,16Gi,16Gi")
    config = tmp / "runtime.yaml"
    config.write_text(f"paths:\n  socket: {sock}\n  run_dir: {run_dir}\n"
                      "runtime:\n  lower: runc\n")
    env.update(VGPU_CONFIG=str(config), VGPU_SOCKET=str(sock))
    return Build(tree, runtime, env, tmp)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=f"The previous release is the newest v* tag before HEAD; with none tagged, "
               f"{PREVIOUS_FALLBACK} (main on 2026-12-02). Now: {previous_release()}.")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--concurrent", type=int, default=20)
    ap.add_argument("--against", default=None, metavar="REF",
                    help="a commit or tag to build in a temporary worktree and measure beside "
                         "the tree (default: the previous release); 'none': the tree alone")
    args = ap.parse_args()
    if shutil.which("runc") is None:
        sys.exit("bench: runc is not installed (apt-get install runc)")
    from support.images import build_rootfs

    ref = previous_release() if args.against is None else args.against
    exit_on_sigterm()
    with contextlib.ExitStack() as stack:
        trees = [this_tree()]
        if ref != NONE:
            trees.append(stack.enter_context(built_tree(ref)))
        builds = [start_build(t, stack) for t in trees]
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vgpu-cbench-",
                                                                   dir="/var/tmp")))
        rootfs = build_rootfs(tmp / "rootfs")
        spec = base_spec(tmp)
        plain_env = builds[0].env
        n = 0

        def one(b: Build | None) -> float:
            nonlocal n
            n += 1
            state = b.state if b is not None else builds[0].state
            bundle = make_bundle(tmp / f"b{n}", spec, rootfs, state, b is not None)
            cmd = [str(b.runtime)] if b is not None else ["runc"]
            return timed([*cmd, "run", "-b", str(bundle), f"bench-{n}"],
                         b.env if b is not None else plain_env)

        one(None)
        for b in builds:
            one(b)  # warm caches
        plain: list[float] = []
        for i in range(args.runs):
            plain.append(one(None))
            for b in builds if i % 2 == 0 else builds[::-1]:
                b.single.append(one(b))
        for k, b in enumerate(builds):
            bundles = [make_bundle(tmp / f"c{k}-{i}", spec, rootfs, b.state, True)
                       for i in range(args.concurrent)]
            b.together = at_once([[str(b.runtime), "run", "-b", str(x), f"conc-{k}-{i}"]
                                  for i, x in enumerate(bundles)], b.env)
        plain_bundles = [make_bundle(tmp / f"p{i}", spec, rootfs, builds[0].state, False)
                         for i in range(args.concurrent)]
        plain_together = at_once([["runc", "run", "-b", str(x), f"plain-conc-{i}"]
                                  for i, x in enumerate(plain_bundles)], plain_env)
    report(args, builds, plain, plain_together)


def paired_starts(tree: list[float], ref: list[float]) -> list[float]:
    """Start i of the tree over start i of the other build: they ran back to back."""
    return [t / r for t, r in zip(tree, ref, strict=False) if r]


def verdict(tree: list[float], ref: list[float], tree_together: list[float],
            ref_together: list[float]) -> str:
    """Never below the other build: a median start no slower, a p99 no later (alone and
    at once). A median slower counts only past this machine's noise (bench/paired.py: more
    of the back-to-back pairs slower than chance makes); a p99 is one figure a build, with
    no pairs to weigh it, and counts as it is."""
    later = (pct(tree, 0.99) > pct(ref, 0.99)
             or pct(tree_together, 0.99) > pct(ref_together, 0.99))
    slower = statistics.median(tree) > statistics.median(ref)
    if not later and not slower:
        return "met"
    ratios = paired_starts(tree, ref)
    if slower and past_noise(against(ratios, higher_is_worse=True), len(ratios)):
        return "MISSED"
    return "MISSED (p99)" if later else "within this run's noise"


def report(args: argparse.Namespace, builds: list[Build], plain: list[float],
           plain_together: list[float]) -> None:
    med = statistics.median
    print(f"container start to exit (/bin/true), {args.runs} runs each, {os.cpu_count()} CPUs")
    if len(builds) > 1:
        print(f"builds: tree = this checkout as it is; {builds[1].tree.label} = "
              f"{builds[1].tree.commit[:12]}, built in a worktree; runs alternate")
    print(f"{'runtime':<44} {'median ms':>10} {'p99 ms':>8}")
    print(f"{'runc':<44} {med(plain):>10.1f} {pct(plain, 0.99):>8.1f}")
    for b in builds:
        name = f"vgpu-runtime ({b.tree.label}) + vgpu.io/memory=64Mi"
        print(f"{name:<44} {med(b.single):>10.1f} {pct(b.single, 0.99):>8.1f}")
    for b in builds:
        name = f"{args.concurrent} vGPU containers at once ({b.tree.label})"
        print(f"{name:<44} {med(b.together):>10.1f} {pct(b.together, 0.99):>8.1f}")
    name = f"{args.concurrent} runc containers at once"
    print(f"{name:<44} {med(plain_together):>10.1f} {pct(plain_together, 0.99):>8.1f}")
    plain_ratio = pct(plain_together, 0.99) / med(plain)
    for b in builds:
        added = med(b.single) - med(plain)
        ratio = pct(b.together, 0.99) / med(b.single)
        print(f"{b.tree.label}: added median {added:.1f} ms (target <= {TARGET_ADDED_MS:.0f}: "
              f"{'met' if added <= TARGET_ADDED_MS else 'MISSED'}); "
              f"p99 of {args.concurrent} at once / single median {ratio:.2f}x "
              f"(target <= {TARGET_CONCURRENT_RATIO:.0f}x: "
              f"{'met' if ratio <= TARGET_CONCURRENT_RATIO else 'MISSED'}; plain runc "
              f"{plain_ratio:.2f}x); p99 of {args.concurrent} vGPU / {args.concurrent} runc at "
              f"once {pct(b.together, 0.99) / pct(plain_together, 0.99):.2f}x")
    if len(builds) > 1:
        tree, ref = builds[0], builds[1]
        added_t, added_r = med(tree.single) - med(plain), med(ref.single) - med(plain)
        slower = against(paired_starts(tree.single, ref.single), higher_is_worse=True)
        print(f"tree / {ref.tree.label}: added median {added_t:.1f} / {added_r:.1f} ms "
              f"(tree slower in {slower} of {min(len(tree.single), len(ref.single))} "
              f"paired starts), p99 x{pct(tree.single, 0.99) / pct(ref.single, 0.99):.2f}, "
              f"p99 of {args.concurrent} at once "
              f"x{pct(tree.together, 0.99) / pct(ref.together, 0.99):.2f} "
              f"(never below {ref.tree.label}: "
              f"{verdict(tree.single, ref.single, tree.together, ref.together)})")
    print("command: python3 bench/containers.py" + "".join(f" {a}" for a in sys.argv[1:]))


if __name__ == "__main__":
    main()
