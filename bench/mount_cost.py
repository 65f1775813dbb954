#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What a slice's two mounts cost, under a private parent and under a shared one.

vgpud mounts a tmpfs on each slice's directory and binds its .req into the scheduling
directory, and unmounts both at release (arbiter.files.slicefs). Both sit under run_dir,
which vgpud makes a shared mount point for the previous release's hook (docs/upgrading.md).
This times those four system calls, N times each, in a temporary directory bound onto
itself: once private (the baseline) and once shared, as run_dir is. Needs root
(CAP_SYS_ADMIN). Not a timed test: the ratio is the result.

    sudo python3 bench/mount_cost.py [--n 2000] [--dir /dev/shm]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MS_BIND, MS_REC, MS_PRIVATE, MS_SHARED = 0x1000, 0x4000, 1 << 18, 1 << 20
MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MNT_DETACH = 0x2
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                   ctypes.c_ulong(flags), data.encode() if data else None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), target)


def _umount(target: str) -> None:
    if _libc.umount2(target.encode(), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), target)


def measure(parent: Path, n: int) -> dict[str, float]:
    """Median microseconds of each call, n slices' worth, under parent."""
    slice_dir, sched = parent / "slice", parent / "sched"
    slice_dir.mkdir()
    sched.mkdir()
    req_src, req_dst = slice_dir / "vgpu0.req", sched / "gpu.key.req"
    took: dict[str, list[float]] = {"tmpfs mount": [], ".req bind": [], ".req umount": [],
                                    "tmpfs umount": []}

    def timed(what: str, fn: Callable[..., None], *args: object) -> None:
        t0 = time.perf_counter()
        fn(*args)
        took[what].append(time.perf_counter() - t0)

    for _ in range(n):
        timed("tmpfs mount", _mount, "tmpfs", str(slice_dir), "tmpfs",
              MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=65536,nr_inodes=8,mode=711")
        req_src.write_bytes(b"\0" * 64)
        req_dst.touch()
        timed(".req bind", _mount, str(req_src), str(req_dst), None, MS_BIND, None)
        timed(".req umount", _umount, str(req_dst))
        timed("tmpfs umount", _umount, str(slice_dir))
        req_dst.unlink()
    return {k: 1e6 * statistics.median(v) for k, v in took.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="slices' worth of mounts per case")
    ap.add_argument("--dir", default="/dev/shm", help="where the temporary parent goes")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: mount_cost.py needs root (it mounts)")
    cases: dict[str, dict[str, float]] = {}
    for name, flag in (("private", MS_PRIVATE), ("shared", MS_SHARED)):
        with tempfile.TemporaryDirectory(prefix="vgpu-mounts-", dir=args.dir) as tmp:
            _mount(tmp, tmp, None, MS_BIND, None)
            try:
                _mount("none", tmp, None, flag, None)
                cases[name] = measure(Path(tmp), args.n)
            finally:
                _umount(tmp)
    print(f"a slice's mounts, median us of {args.n} each (parent bound onto itself in "
          f"{args.dir})")
    print(f"{'call':14s}{'private':>9s}{'shared':>9s}  shared/private")
    for what in cases["private"]:
        p, s = cases["private"][what], cases["shared"][what]
        print(f"{what:14s}{p:9.1f}{s:9.1f}  x{s / p:.2f}")
    p, s = sum(cases["private"].values()), sum(cases["shared"].values())
    print(f"{'a slice':14s}{p:9.1f}{s:9.1f}  x{s / p:.2f}")
    print("command: python3 bench/mount_cost.py" + "".join(f" {a}" for a in sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
