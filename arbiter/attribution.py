# SPDX-License-Identifier: Apache-2.0
"""Which host processes belong to which vGPU of a slice.

NVML reports host pids. A slice's processes are the pids libvgpu registered in its
region slots (host pids for `vgpu run`), its owner pid, and, for a container, every
process in the owner's pid namespace (libvgpu inside a container registers the
container's own pid numbers, which mean nothing on the host). Used by the drift
guard (memory measured above the limit) and by the per-slice compute metric.

`SlicePids.host` is the trusted subset, for the compute guard that kills or
freezes what it finds: region slots are written by the tenant (a slot could name
a neighbour's pid), so it takes only what the host itself says: the owner pid,
its descendants (a `vgpu run` child), and for a container the processes in the
owner's pid namespace.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from arbiter.model import OwnerKind, Slice

__all__ = ["SlicePids", "descendants", "pid_namespace"]


def pid_namespace(proc: Path, pid: str) -> str:
    """The pid namespace of /proc/<pid> ("pid:[4026531836]"), "" when unreadable."""
    try:
        return os.readlink(proc / pid / "ns" / "pid")
    except OSError:
        return ""


def _children(proc: Path) -> dict[int, set[int]]:
    """Parent pid -> its child pids, from /proc/<pid>/stat (the field after the comm)."""
    out: dict[int, set[int]] = {}
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return out
    for e in entries:
        try:
            stat = (proc / e / "stat").read_text()
        except OSError:
            continue
        # comm may hold spaces and parentheses: the fields start after the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[1].isdigit():
            out.setdefault(int(fields[1]), set()).add(int(e))
    return out


def descendants(children: Mapping[int, set[int]], pid: int) -> set[int]:
    """Every pid below pid in the process tree given as parent -> children."""
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out and c != pid:
                out.add(c)
                todo.append(c)
    return out


def _pids_by_namespace(proc: Path) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return out
    for e in entries:
        ns = pid_namespace(proc, e)
        if ns:
            out.setdefault(ns, set()).add(int(e))
    return out


class SlicePids:
    """Maps slices to host pids for one pass (the /proc scan is made once, when needed)."""

    def __init__(self, region_pids: Callable[[Slice], Mapping[int, set[int]]],
                 proc: Path = Path("/proc")) -> None:
        self._region_pids = region_pids
        self._proc = Path(proc)
        self._own_ns = pid_namespace(self._proc, "self")
        self._by_ns: dict[str, set[int]] | None = None
        self._children: dict[int, set[int]] | None = None

    def of(self, s: Slice) -> list[set[int]]:
        """Host pids of each vGPU of s (index = vGPU ordinal); never vgpud itself."""
        per_vgpu = self._region_pids(s)
        extra: set[int] = set()
        if s.owner_pid:
            extra.add(s.owner_pid)
            extra |= self._namespace_of(s)
        me = {os.getpid()}
        return [(per_vgpu.get(i, set()) | extra) - me for i in range(len(s.grants))]

    def host(self, s: Slice) -> set[int]:
        """Pids the host attributes to s (owner, its descendants, its container's pid
        namespace), none taken from tenant-writable region slots; never vgpud itself."""
        if not s.owner_pid:
            return set()
        if self._children is None:
            self._children = _children(self._proc)
        out = {s.owner_pid} | descendants(self._children, s.owner_pid) | self._namespace_of(s)
        return out - {os.getpid()}

    def _namespace_of(self, s: Slice) -> set[int]:
        """Host pids in a container owner's pid namespace (empty for a host process)."""
        if s.owner_kind != OwnerKind.CONTAINER or not s.owner_pid:
            return set()
        ns = pid_namespace(self._proc, str(s.owner_pid))
        # A host process as owner shares our namespace: that is not its container.
        if not ns or ns == self._own_ns:
            return set()
        if self._by_ns is None:
            self._by_ns = _pids_by_namespace(self._proc)
        return self._by_ns.get(ns, set())
