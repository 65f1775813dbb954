# SPDX-License-Identifier: Apache-2.0
"""Which host processes belong to which vGPU of a slice.

NVML reports host pids. A slice's processes are the pids libvgpu registered in its
region slots (host pids for `vgpu run`), its owner pid, and, for a container, every
process in the owner's pid namespace (libvgpu inside a container registers the
container's own pid numbers, which mean nothing on the host). Used by the drift
guard (memory measured above the limit) and by the per-slice compute metric.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from arbiter.model import OwnerKind, Slice

__all__ = ["SlicePids", "pid_namespace"]


def pid_namespace(proc: Path, pid: str) -> str:
    """The pid namespace of /proc/<pid> ("pid:[4026531836]"), "" when unreadable."""
    try:
        return os.readlink(proc / pid / "ns" / "pid")
    except OSError:
        return ""


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

    def of(self, s: Slice) -> list[set[int]]:
        """Host pids of each vGPU of s (index = vGPU ordinal); never vgpud itself."""
        per_vgpu = self._region_pids(s)
        extra: set[int] = set()
        if s.owner_pid:
            extra.add(s.owner_pid)
            if s.owner_kind == OwnerKind.CONTAINER:
                ns = pid_namespace(self._proc, str(s.owner_pid))
                # A host process as owner shares our namespace: that is not its container.
                if ns and ns != self._own_ns:
                    if self._by_ns is None:
                        self._by_ns = _pids_by_namespace(self._proc)
                    extra |= self._by_ns.get(ns, set())
        me = {os.getpid()}
        return [(per_vgpu.get(i, set()) | extra) - me for i in range(len(s.grants))]
