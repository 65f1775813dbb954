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

    python3 bench/containers.py [--runs 30] [--concurrent 20]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
from vgpud_proc import simgpu_env, start_vgpud  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--concurrent", type=int, default=20)
    args = ap.parse_args()
    if shutil.which("runc") is None:
        sys.exit("bench: runc is not installed (apt-get install runc)")
    native = ROOT / "build" / "bin" / "vgpu-runtime"
    if not native.exists():
        sys.exit("bench: build/bin/vgpu-runtime is missing (run make)")
    from support.images import build_rootfs

    with tempfile.TemporaryDirectory(prefix="vgpu-cbench-", dir="/var/tmp") as d, \
            tempfile.TemporaryDirectory(prefix="vgpu-cbench-run-", dir="/dev/shm") as r:
        tmp = Path(d)
        daemon, sock = start_vgpud(tmp, Path(r))
        try:
            rootfs = build_rootfs(tmp / "rootfs")
            spec = base_spec(tmp)
            env = simgpu_env(tmp, "16Gi,16Gi,16Gi,16Gi")
            config = tmp / "runtime.yaml"
            config.write_text(f"paths:\n  socket: {sock}\n  run_dir: {r}\n"
                              "runtime:\n  lower: runc\n")
            env.update(VGPU_CONFIG=str(config), VGPU_SOCKET=str(sock))
            runtime = [str(native)]
            n = 0

            def one(vgpu: bool) -> float:
                nonlocal n
                n += 1
                b = make_bundle(tmp / f"b{n}", spec, rootfs, tmp, vgpu)
                cmd = [*runtime] if vgpu else ["runc"]
                return timed([*cmd, "run", "-b", str(b), f"bench-{n}"], env)

            one(False), one(True)  # warm caches
            plain, vgpu = [], []
            for _ in range(args.runs):
                plain.append(one(False))
                vgpu.append(one(True))
            bundles = [make_bundle(tmp / f"c{i}", spec, rootfs, tmp, True)
                       for i in range(args.concurrent)]
            plain_bundles = [make_bundle(tmp / f"p{i}", spec, rootfs, tmp, False)
                             for i in range(args.concurrent)]
            together = at_once([[*runtime, "run", "-b", str(b), f"conc-{i}"]
                                for i, b in enumerate(bundles)], env)
            plain_together = at_once([["runc", "run", "-b", str(b), f"plain-conc-{i}"]
                                      for i, b in enumerate(plain_bundles)], env)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    added = statistics.median(vgpu) - statistics.median(plain)
    ratio = pct(together, 0.99) / statistics.median(vgpu)
    plain_ratio = pct(plain_together, 0.99) / statistics.median(plain)
    print(f"container start to exit (/bin/true), {args.runs} runs each, {os.cpu_count()} CPUs")
    print(f"{'runtime':<34} {'median ms':>10} {'p99 ms':>8}")
    print(f"{'runc':<34} {statistics.median(plain):>10.1f} {pct(plain, 0.99):>8.1f}")
    print(f"{'vgpu-runtime + vgpu.io/memory=64Mi':<34} {statistics.median(vgpu):>10.1f}"
          f" {pct(vgpu, 0.99):>8.1f}")
    print(f"{f'{args.concurrent} vGPU containers at once':<34} {statistics.median(together):>10.1f}"
          f" {pct(together, 0.99):>8.1f}")
    print(f"{f'{args.concurrent} runc containers at once':<34}"
          f" {statistics.median(plain_together):>10.1f} {pct(plain_together, 0.99):>8.1f}")
    print(f"added median: {added:.1f} ms (target <= {TARGET_ADDED_MS:.0f}: "
          f"{'met' if added <= TARGET_ADDED_MS else 'MISSED'})")
    print(f"p99 of {args.concurrent} at once / single median: {ratio:.2f}x "
          f"(target <= {TARGET_CONCURRENT_RATIO:.0f}x: "
          f"{'met' if ratio <= TARGET_CONCURRENT_RATIO else 'MISSED'}); "
          f"plain runc: {plain_ratio:.2f}x")
    print(f"p99 of {args.concurrent} vGPU at once / p99 of {args.concurrent} runc at once: "
          f"{pct(together, 0.99) / pct(plain_together, 0.99):.2f}x")
    print("command: python3 bench/containers.py" + "".join(f" {a}" for a in sys.argv[1:]))


if __name__ == "__main__":
    main()
