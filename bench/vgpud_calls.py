#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Python calls vgpud makes a pair of Allocate+Release: a count, not a time.

On a VM whose speed moves 10-30 % within seconds, bench/arbiter.py resolves about 2 % a
row with 20 rounds. This counts instead: vgpud starts with a profile hook on every thread
(sys.setprofile and threading.setprofile, from a sitecustomize this bench puts first on
its PYTHONPATH) that counts each Python function called and each C function Python calls,
by the file of the Python code that ran or made the call. After warm-up pairs it counts
--pairs pairs from one client, and prints calls a pair for the tree and, by default, the
previous release (bench/against.py), split into vgpud's own code, gRPC's Python, the
threading and futures modules, and the rest. vgpud's background threads (the broker watch
looks every 0.5 s) add a few calls a pair. The hook slows vgpud down; the counts do not
depend on the machine's speed.

    python3 bench/vgpud_calls.py [--pairs 200] [--preset 0] [--against REF|none]
                                 [--dir /var/tmp] [--run-dir-parent /dev/shm]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from arbiter.proto import vgpu_pb2 as pb  # noqa: E402
from arbiter.proto import vgpu_pb2_grpc  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from against import NONE, Tree, built_tree, previous_release, this_tree, vgpud_proc  # noqa: E402
from vgpud_proc import preset, request, stop_vgpud  # noqa: E402

#: The sitecustomize vgpud imports at its start: counts calls while <out>.on exists, and
#: writes them to <out> (JSON) when <out>.dump appears, then deletes <out>.dump.
_HOOK = '''
import collections, json, os, sys, threading, time
_out = os.environ.get("VGPU_BENCH_CALLS")
if _out:
    _counts = collections.Counter()
    _on = [False]

    def _count(frame, event, arg):
        if _on[0] and event in ("call", "c_call"):
            _counts[frame.f_code.co_filename] += 1

    def _control():
        while True:
            time.sleep(0.02)
            if not _on[0] and os.path.exists(_out + ".on"):
                _counts.clear()
                _on[0] = True
            if _on[0] and os.path.exists(_out + ".dump"):
                _on[0] = False
                with open(_out, "w") as f:
                    json.dump(dict(_counts), f)
                os.unlink(_out + ".dump")

    sys.setprofile(_count)
    threading.setprofile(_count)
    threading.Thread(target=_control, name="bench-calls", daemon=True).start()
'''


def kind_of(filename: str) -> str:
    """Which part of vgpud a Python file is: its own code, gRPC's, threads', or other."""
    if "site-packages" not in filename and ("/arbiter/" in filename or "/vgpud/" in filename
                                            or "/shim/" in filename):
        return "vgpud"
    if "/grpc/" in filename:
        return "grpc"
    if filename.endswith(("/threading.py", "/queue.py")) or "/concurrent/" in filename:
        return "threads"
    if filename == "<string>":  # dataclasses' and namedtuples' generated methods
        return "vgpud"
    return "other"


def count(tree: Tree, pairs: int, slices: int, hook_dir: Path,
          dirs: tuple[str, str] = ("/var/tmp", "/dev/shm")) -> dict[str, float]:
    """Start that build's vgpud with the hook, run warm-up pairs, count `pairs` pairs; calls
    a pair by kind_of."""
    module = vgpud_proc(tree)
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-", dir=dirs[0]) as state, \
            tempfile.TemporaryDirectory(prefix="vgpu-bench-run-", dir=dirs[1]) as run:
        out = Path(state) / "calls.json"
        plain_env = module.simgpu_env

        def env(tmp: Path, devices: str) -> dict[str, str]:
            e = plain_env(tmp, devices)
            e["PYTHONPATH"] = f"{hook_dir}:{e['PYTHONPATH']}"
            e["VGPU_BENCH_CALLS"] = str(out)
            return e

        module.simgpu_env = env
        try:
            proc, sock = module.start_vgpud(Path(state), Path(run))
        finally:
            module.simgpu_env = plain_env
        try:
            preset(sock, slices)  # the tree's: any build's vgpud takes its Allocates
            with grpc.insecure_channel(f"unix:{sock}") as ch:
                stub = vgpu_pb2_grpc.ArbiterStub(ch)

                def pair(i: int) -> None:
                    r = stub.Allocate(request(f"calls-{i}"), timeout=30)
                    stub.Release(pb.ReleaseRequest(id=r.slice.id), timeout=30)

                for i in range(50):
                    pair(i)
                Path(f"{out}.on").touch()
                time.sleep(0.2)  # the hook's control thread looks every 20 ms
                for i in range(50, 50 + pairs):
                    pair(i)
                Path(f"{out}.dump").touch()
                deadline = time.monotonic() + 30
                while Path(f"{out}.dump").exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
            if not out.exists():
                sys.exit(f"bench: {tree.label}'s vgpud wrote no counts: the simgpu_env of its "
                         "bench/vgpud_proc.py does not set PYTHONPATH")
            counts = json.loads(out.read_text())
        finally:
            stop_vgpud(proc, Path(run))  # the tree's, as bench/arbiter.py stops both
    by: collections.Counter[str] = collections.Counter()
    for filename, n in counts.items():
        by[kind_of(filename)] += n
    return {k: by[k] / pairs for k in ("vgpud", "grpc", "threads", "other")} | {
        "all": sum(by.values()) / pairs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=200, help="pairs counted (after 50 warm-up)")
    ap.add_argument("--preset", type=int, default=0, help="slices placed on GPU 0 first")
    ap.add_argument("--dir", default="/var/tmp", help="where the state dir goes (a disk)")
    ap.add_argument("--run-dir-parent", default="/dev/shm",
                    help="where the run dir goes: tmpfs, as /run is in production")
    ap.add_argument("--against", default=None, metavar="REF",
                    help="a commit or tag counted beside the tree (default: the previous "
                         "release); 'none': the tree alone")
    args = ap.parse_args()
    if args.pairs < 1:
        ap.error(f"--pairs {args.pairs}: must be at least 1")
    ref = previous_release() if args.against is None else args.against
    with contextlib.ExitStack() as stack:
        hook_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vgpu-calls-")))
        (hook_dir / "sitecustomize.py").write_text(_HOOK)
        trees = [this_tree()]
        if ref != NONE:
            trees.append(stack.enter_context(built_tree(ref, parent=args.dir)))
        rows = [(t.label, count(t, args.pairs, args.preset, hook_dir,
                                (args.dir, args.run_dir_parent))) for t in trees]
    print(f"Python calls vgpud makes a pair of Allocate+Release, 1 client, {args.pairs} pairs"
          f" after 50, {args.preset} slices on GPU 0")
    print(f"{'build':10s}{'all':>8s}{'vgpud':>8s}{'grpc':>8s}{'threads':>9s}{'other':>8s}")
    for label, c in rows:
        print(f"{label:10s}{c['all']:8.0f}{c['vgpud']:8.0f}{c['grpc']:8.0f}{c['threads']:9.0f}"
              f"{c['other']:8.0f}")
    if len(rows) > 1:
        print(f"tree / {rows[1][0]}: x{rows[0][1]['all'] / rows[1][1]['all']:.3f}")
    print("vgpud: its own code (and generated dataclass methods); threads: threading, queue, "
          "concurrent.futures; a C function counts where Python called it")
    print("command: python3 bench/vgpud_calls.py" + "".join(f" {a}" for a in sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
