# SPDX-License-Identifier: Apache-2.0
"""A container's cgroup files, read and written without ever waiting on its file leases.

The engine mounts a container's cgroup into it (read-only), and its root owns the files
there as host root does, so it may take a file lease on them (F_SETLEASE works on a
read-only fd): a blocking open by vgpud (the guard reading cgroup.procs, the reconciler
reading cgroup.events, a freeze) would then wait /proc/sys/fs/lease-break-time (45 s),
for every slice at once. Every open here is O_NONBLOCK, which fails at once with
EWOULDBLOCK (BlockingIOError) under a lease, and what a leased file would have said comes
from /proc, which takes no leases: a cgroup's processes from each process's
/proc/<pid>/cgroup. So a lease neither stalls vgpud nor hides a process from it.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["pids_in", "read", "write"]


def read(path: Path) -> str:
    """The file's text; BlockingIOError when a lease holds it, OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    finally:
        os.close(fd)


def write(path: Path, text: str) -> None:
    """Write text to a cgroup control file; BlockingIOError when a lease holds it."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def pids_in(cgroup: str, proc: Path = Path("/proc")) -> set[int]:
    """Every process in a recorded cgroup (`<controllers>:<path>`, "" for v2) or below it,
    from /proc/<pid>/cgroup: what its cgroup.procs files say, without opening them."""
    key, sep, path = cgroup.partition(":")
    if not sep or not path.startswith("/"):
        return set()
    top = path.rstrip("/") or "/"
    out: set[int] = set()
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (d / "cgroup").read_text().splitlines():
                _, ctrl, here = line.split(":", 2) if line.count(":") >= 2 else ("", "-", "")
                if ctrl == key and (here == top or here.startswith(top.rstrip("/") + "/")):
                    out.add(int(d.name))
                    break
    return out
