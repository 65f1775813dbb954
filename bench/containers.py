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
plain runc, for context. All of it is done --rounds times (5), and the figures are
over every round's starts.

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
from paired import against, gmean, spread, worse_past_noise  # noqa: E402
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
    single: list[list[float]] = field(default_factory=list)    # a round's starts, ms
    together: list[list[float]] = field(default_factory=list)  # a round's starts at once

    @property
    def singles(self) -> list[float]:
        return [ms for r in self.single for ms in r]

    @property
    def togethers(self) -> list[float]:
        return [ms for r in self.together for ms in r]


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
    ap.add_argument("--rounds", type=int, default=5,
                    help="how many times to do it all (a p99 is compared round by round)")
    ap.add_argument("--against", default=None, metavar="REF",
                    help="a commit or tag to build in a temporary worktree and measure beside "
                         "the tree (default: the previous release); 'none': the tree alone")
    args = ap.parse_args()
    for key in ("runs", "concurrent", "rounds"):
        if getattr(args, key) < 1:
            ap.error(f"--{key} {getattr(args, key)}: must be 1 or more")
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
        plain_together: list[float] = []
        for r in range(args.rounds):
            for b in builds:
                b.single.append([])
            for i in range(args.runs):
                plain.append(one(None))
                for b in builds if (r * args.runs + i) % 2 == 0 else builds[::-1]:
                    b.single[r].append(one(b))
            for k, b in enumerate(builds if r % 2 == 0 else builds[::-1]):
                bundles = [make_bundle(tmp / f"c{r}-{k}-{i}", spec, rootfs, b.state, True)
                           for i in range(args.concurrent)]
                b.together.append(at_once([[str(b.runtime), "run", "-b", str(x),
                                            f"conc-{r}-{k}-{i}"]
                                           for i, x in enumerate(bundles)], b.env))
            plain_bundles = [make_bundle(tmp / f"p{r}-{i}", spec, rootfs, builds[0].state,
                                         False) for i in range(args.concurrent)]
            plain_together += at_once([["runc", "run", "-b", str(x), f"plain-conc-{r}-{i}"]
                                       for i, x in enumerate(plain_bundles)], plain_env)
    report(args, builds, plain, plain_together)


def paired_starts(tree: list[float], ref: list[float]) -> list[float]:
    """Start i of the tree over start i of the other build: they ran back to back."""
    return [t / r for t, r in zip(tree, ref, strict=False) if r]


def paired_p99s(tree: list[list[float]], ref: list[list[float]]) -> list[float]:
    """Round i's p99 of the tree over round i's of the other build (back to back)."""
    return [pct(t, 0.99) / pct(r, 0.99) for t, r in zip(tree, ref, strict=False) if t and r]


def verdict(tree: Build, ref: Build) -> str:
    """Never below the other build: a start no slower (the paired starts' geometric mean at
    most x1.00) and a p99 no later, alone and at once (the paired rounds' p99s likewise).

    met: every mean says so. MISSED: one does not, and more of its pairs went against the
    tree than this machine's noise makes by chance (bench/paired.py's sign test: 86 of 150
    starts, 5 of 5 rounds); it names what. Otherwise "within this run's noise"."""
    measures = {"median": paired_starts(tree.singles, ref.singles),
                "p99": paired_p99s(tree.single, ref.single),
                "p99 at once": paired_p99s(tree.together, ref.together)}
    if all(gmean(xs) <= 1.0 for xs in measures.values() if xs):
        return "met"
    missed = [name for name, xs in measures.items()
              if xs and worse_past_noise(xs, higher_is_worse=True)]
    if missed:
        return f"MISSED ({', '.join(missed)})"
    return "within this run's noise"


def report(args: argparse.Namespace, builds: list[Build], plain: list[float],
           plain_together: list[float]) -> None:
    med = statistics.median
    print(f"container start to exit (/bin/true), {args.runs} runs each and {args.concurrent} at "
          f"once, {args.rounds} round(s), {os.cpu_count()} CPUs")
    if len(builds) > 1:
        print(f"builds: tree = this checkout as it is; {builds[1].tree.label} = "
              f"{builds[1].tree.commit[:12]}, built in a worktree; runs alternate")
    print(f"{'runtime':<44} {'median ms':>10} {'p99 ms':>8}")
    print(f"{'runc':<44} {med(plain):>10.1f} {pct(plain, 0.99):>8.1f}")
    for b in builds:
        name = f"vgpu-runtime ({b.tree.label}) + vgpu.io/memory=64Mi"
        print(f"{name:<44} {med(b.singles):>10.1f} {pct(b.singles, 0.99):>8.1f}")
    for b in builds:
        name = f"{args.concurrent} vGPU containers at once ({b.tree.label})"
        print(f"{name:<44} {med(b.togethers):>10.1f} {pct(b.togethers, 0.99):>8.1f}")
    name = f"{args.concurrent} runc containers at once"
    print(f"{name:<44} {med(plain_together):>10.1f} {pct(plain_together, 0.99):>8.1f}")
    plain_ratio = pct(plain_together, 0.99) / med(plain)
    for b in builds:
        added = med(b.singles) - med(plain)
        ratio = pct(b.togethers, 0.99) / med(b.singles)
        print(f"{b.tree.label}: added median {added:.1f} ms (target <= {TARGET_ADDED_MS:.0f}: "
              f"{'met' if added <= TARGET_ADDED_MS else 'MISSED'}); "
              f"p99 of {args.concurrent} at once / single median {ratio:.2f}x "
              f"(target <= {TARGET_CONCURRENT_RATIO:.0f}x: "
              f"{'met' if ratio <= TARGET_CONCURRENT_RATIO else 'MISSED'}; plain runc "
              f"{plain_ratio:.2f}x); p99 of {args.concurrent} vGPU / {args.concurrent} runc at "
              f"once {pct(b.togethers, 0.99) / pct(plain_together, 0.99):.2f}x")
    if len(builds) > 1:
        tree, ref = builds[0], builds[1]
        added_t, added_r = med(tree.singles) - med(plain), med(ref.singles) - med(plain)
        starts = paired_starts(tree.singles, ref.singles)
        p99s, at_once_p99s = paired_p99s(tree.single, ref.single), paired_p99s(tree.together,
                                                                               ref.together)
        p99_spread = spread(p99s, higher_is_worse=True, worse="later")
        at_once_spread = spread(at_once_p99s, higher_is_worse=True, worse="later")
        print(f"tree / {ref.tree.label}: added median {added_t:.1f} / {added_r:.1f} ms "
              f"(starts x{gmean(starts):.2f}, tree slower in "
              f"{against(starts, higher_is_worse=True)} of {len(starts)} paired starts), "
              f"p99 x{gmean(p99s):.2f}{p99_spread}, p99 of {args.concurrent} at once "
              f"x{gmean(at_once_p99s):.2f}{at_once_spread} "
              f"(never below {ref.tree.label}: {verdict(tree, ref)})")
    print("command: python3 bench/containers.py" + "".join(f" {a}" for a in sys.argv[1:]))


if __name__ == "__main__":
    main()
