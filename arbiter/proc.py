# SPDX-License-Identifier: Apache-2.0
"""What /proc says about processes: start times, pid namespaces, the process tree, and
whether a recorded process (pid + start time, in some pid namespace) still runs.

A pid alone is not a process: pids are reused, and a container's processes carry the
pids of their own namespace. A process is known by its pid, its start time (field 22
of /proc/<pid>/stat, clock ticks since boot) and its pid namespace's inode. Every
function takes the /proc to read so tests point it at a fixture tree; the liveness
rules are the twin of libvgpu's vg_slots.c (vg_pid_alive, vg_pid_visible).
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "PID_NS_INIT",
    "ProcessView",
    "pid_alive",
    "pid_namespace_inode",
    "pids",
    "pids_by_namespace",
    "proc_start_time",
    "process_tree",
    "stat_fields",
    "visible_pid",
]

#: Inode of the initial pid namespace (the kernel's PROC_PID_INIT_INO).
PID_NS_INIT = 0xEFFFFFFC
_PID_LIMIT = 1 << 31  # pid_t is a signed 32-bit int: anything larger names no process


def stat_fields(pid: int | str, proc: Path = Path("/proc")) -> list[bytes]:
    """Fields 3 onward (state, ppid, ...) of /proc/<pid>/stat; [] when unreadable."""
    try:
        # os-level: Path.read_bytes costs six more syscalls (fstat, ioctl, lseeks), and
        # this runs on every Allocate and for every process of a guard's /proc scan. The
        # kernel makes the whole line at the first read: a short read is all of it.
        fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)
            if len(data) == 4096:
                while chunk := os.read(fd, 4096):
                    data += chunk
        finally:
            os.close(fd)
    except OSError:
        return []
    # comm may hold spaces and parentheses: fields restart after the last ')'.
    _, sep, rest = data.rpartition(b")")
    return rest.split() if sep else []


def _start_and_state(pid: int, proc: Path) -> tuple[int, str]:
    """(start time, state) of pid: fields 22 and 3; (0, "?") when unknown."""
    fields = stat_fields(pid, proc)
    if len(fields) < 20:
        return 0, "?"
    try:
        return int(fields[19]), fields[0].decode()
    except (ValueError, UnicodeDecodeError):
        return 0, "?"


def proc_start_time(pid: int, proc: Path = Path("/proc")) -> int:
    """Start time of pid (field 22 of /proc/<pid>/stat, clock ticks), 0 when unknown."""
    return _start_and_state(pid, proc)[0]


def _running_since(pid: int, start_time: int, proc: Path) -> bool:
    """pid runs (a zombie holds no memory: gone) and started at start_time (0: any)."""
    now, state = _start_and_state(pid, proc)
    if state in ("Z", "X", "x"):
        return False
    # /proc may be unreadable (hidepid); then trust that the pid exists.
    return start_time == 0 or now == 0 or now == start_time


def pid_namespace_inode(pid: int | str, proc: Path = Path("/proc")) -> int:
    """Inode of pid's pid namespace ("self" works), 0 when unreadable.

    Read from the link's text (`pid:[4026531836]`), which is the inode a stat of the
    link would give, without opening the namespace."""
    try:
        text = os.readlink(proc / str(pid) / "ns" / "pid")
    except OSError:
        return 0
    inode = text.removeprefix("pid:[").removesuffix("]")
    return int(inode) if inode.isdigit() and text.startswith("pid:[") else 0


def pids(proc: Path = Path("/proc")) -> list[int]:
    """Every pid /proc shows; raises OSError when /proc cannot be listed."""
    return [int(e) for e in os.listdir(proc) if e.isdigit()]


def pids_by_namespace(proc: Path = Path("/proc")) -> dict[int, set[int]]:
    """Pid namespace inode -> the pids /proc shows in it (as our namespace numbers them).

    Raises OSError when /proc cannot be listed; a process whose namespace is unreadable
    (gone meanwhile, hidepid) is left out."""
    out: dict[int, set[int]] = {}
    for pid in pids(proc):
        ns = pid_namespace_inode(pid, proc)
        if ns:
            out.setdefault(ns, set()).add(pid)
    return out


def process_tree(proc: Path = Path("/proc")) -> dict[int, set[int]]:
    """Parent pid -> its child pids (field 4 of each /proc/<pid>/stat); {} when unlistable."""
    out: dict[int, set[int]] = {}
    try:
        every = pids(proc)
    except OSError:
        return out
    for pid in every:
        fields = stat_fields(pid, proc)
        if len(fields) > 1 and fields[1].isdigit():
            out.setdefault(int(fields[1]), set()).add(pid)
    return out


class ProcessView:
    """One look at /proc for many liveness questions (a region's slots, say).

    The calling process's pid namespace is read once, and the map of namespaces to
    their processes is built at most once, on the first question about a process of
    another namespace (a container's, seen from the host). The twin of vg_slots.c's
    foreign_lookup / vg_pid_alive / vg_pid_visible.
    """

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = Path(proc)
        self.mine = pid_namespace_inode("self", self.proc)
        self._by_ns: dict[int, set[int]] | None = None

    def _foreign(self, pid_ns: int) -> bool:
        return bool(pid_ns and self.mine and pid_ns != self.mine)

    def find(self, pid_ns: int, start_time: int) -> int:
        """Our pid of the process of namespace pid_ns started at start_time.

        >0 found, 0 gone, -1 cannot tell (no process of that namespace in our /proc).
        """
        if self._by_ns is None:
            try:
                self._by_ns = pids_by_namespace(self.proc)
            except OSError:
                return -1
        members = sorted(self._by_ns.get(pid_ns, ()))
        for pid in members:
            if _running_since(pid, start_time, self.proc):
                return pid
        # The initial namespace's /proc shows everyone: nobody there means gone.
        return 0 if members or self.mine == PID_NS_INIT else -1

    def alive(self, pid: int, start_time: int, pid_ns: int = 0) -> bool:
        """True when pid runs and, unless start_time is 0, started at start_time.

        pid_ns is the inode of the pid namespace pid is numbered in (0: ours); where
        /proc cannot tell about another namespace, the process counts as alive.
        """
        if not 0 < pid < _PID_LIMIT:
            return False
        if self._foreign(pid_ns):
            return self.find(pid_ns, start_time) != 0
        try:
            os.kill(pid, 0)
        except PermissionError:
            pass  # alive, someone else's
        except OSError:
            return False
        return _running_since(pid, start_time, self.proc)

    def visible(self, pid: int, start_time: int, pid_ns: int = 0) -> int:
        """The process's pid as our namespace numbers it (host pid of a container process),
        0 when gone or not visible."""
        if self._foreign(pid_ns):
            return max(0, self.find(pid_ns, start_time))
        return pid if self.alive(pid, start_time) else 0


def pid_alive(pid: int, start_time: int, proc: Path = Path("/proc"), pid_ns: int = 0) -> bool:
    """True when pid runs and, unless start_time is 0, started at start_time (vg_pid_alive)."""
    return ProcessView(proc).alive(pid, start_time, pid_ns)


def visible_pid(pid: int, start_time: int, proc: Path = Path("/proc"), pid_ns: int = 0) -> int:
    """The process's pid as our namespace numbers it, 0 when gone (vg_pid_visible)."""
    return ProcessView(proc).visible(pid, start_time, pid_ns)
