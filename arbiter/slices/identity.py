# SPDX-License-Identifier: Apache-2.0
"""Who holds a slice, as the host sees it, and whether that holder still lives.

A container's slice is bound at prestart to the container's init: its host pid (from
the OCI state the runtime hands the hook), that pid's start time (field 22 of
/proc/<pid>/stat) and its cgroup (/proc/<pid>/cgroup), read by vgpud itself, never
taken from the tenant. The rule (`Liveness.alive`):

- a started slice (one with a recorded pid) lives while its init runs with the same
  start time, or while any process is left in its recorded cgroup; whatever runtime
  (runc, crun) or state root (`runc --root DIR`) runs the container;
- a slice allocated but not started yet (vgpu-runtime allocates at `create`, before
  the init exists) lives while an OCI runtime keeps state for its id under
  `reconcile.runtime_state_roots`, and, where none ever did (another runtime or root),
  for a grace period after its allocation;
- a host process's slice (`vgpu run`) lives while its pid runs with the same start time;
- a DRA claim's slice always lives: only its plugin (or an operator) releases it. The
  containers that use it (`User`) live by the started-container rule, each on its own:
  one that is gone is forgotten, the slice stays.

A cgroup that holds more than the container cannot tell its life: the root, and
vgpud's own cgroup and its ancestors (a runtime without cgroups leaves the init in
its caller's) are never recorded.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from arbiter.files import cgroupfiles
from arbiter.model import OwnerKind, Slice, User
from arbiter.proc import pid_alive, proc_start_time

__all__ = ["PENDING_GRACE_S", "Cgroups", "Holder", "Liveness", "read_cgroup",
           "runtime_state_exists"]

#: How long a slice allocated at `create` counts as alive before its prestart binds it
#: (the lower runtime's create runs in between: well under a minute).
PENDING_GRACE_S = 60.0
#: Descendant cgroups looked at when v1 has no cgroup.events (nested containers).
_WALK_MAX = 256
#: Which cgroup names a container: the unified one, else pids, else any other.
_PREFERRED = ("", "pids", "memory", "name=systemd")


@dataclass(frozen=True)
class Holder:
    """The identity a container (or process) shows when it asks for, binds or releases
    a slice: its init pid (0: not started yet), that pid's start time, its cgroup
    (`<controllers>:<path>`, "" for v2's controllers) and its OCI bundle."""

    pid: int = 0
    start: int = 0
    cgroup: str = ""
    bundle: str = ""

    @classmethod
    def of(cls, s: Slice) -> Holder:
        """The holder recorded on a slice."""
        return cls(s.owner_pid, s.owner_start, s.owner_cgroup, s.owner_bundle)

    def is_process(self, other: Holder) -> bool:
        """The same process (pid and, where both are known, start time)."""
        return bool(self.pid) and self.pid == other.pid and (
            not self.start or not other.start or self.start == other.start)


def _cgroup_lines(pid: int | str, proc: Path) -> dict[str, str]:
    """controllers -> path of /proc/<pid>/cgroup ("" is v2's unified hierarchy)."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            out.setdefault(parts[1], parts[2])
    return out


def _within(path: str, ancestor: str) -> bool:
    return path == ancestor or path.startswith(ancestor.rstrip("/") + "/")


def read_cgroup(pid: int, proc: Path = Path("/proc")) -> str:
    """The cgroup that tells pid's container's life (`<controllers>:<path>`), "" if none.

    Never the root, a path outside our cgroup namespace, or one that holds vgpud."""
    lines = _cgroup_lines(pid, proc)
    mine = _cgroup_lines("self", proc)
    keys = [k for k in _PREFERRED if k in lines] + [k for k in lines if k not in _PREFERRED]
    for key in keys:
        path = lines[key]
        if path == "/" or "/../" in f"{path}/" or " " in path:
            continue
        if key in mine and _within(mine[key], path):
            continue
        return f"{key}:{path}"
    return ""


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (\\040 for a space)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


class Cgroups:
    """The cgroup mounts vgpud sees (from <proc>/self/mountinfo, read once)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = Path(proc)
        self._mounts: list[tuple[str, str, frozenset[str]]] | None = None  # root, point, opts

    def _load(self) -> list[tuple[str, str, frozenset[str]]]:
        if self._mounts is None:
            mounts = []
            try:
                text = (self._proc / "self" / "mountinfo").read_text()
            except OSError:
                text = ""
            for line in text.splitlines():
                left, sep, right = line.partition(" - ")
                f, r = left.split(), right.split()
                if not sep or len(f) < 5 or len(r) < 3 or r[0] not in ("cgroup", "cgroup2"):
                    continue
                opts = frozenset(r[2].split(",")) if r[0] == "cgroup" else frozenset({"*v2"})
                mounts.append((_unescape(f[3]), _unescape(f[4]), opts))
            self._mounts = mounts
        return self._mounts

    def directory(self, cgroup: str) -> Path | None:
        """The directory of a recorded cgroup, None where no mount shows it."""
        key, sep, path = cgroup.partition(":")
        if not sep or not path.startswith("/"):
            return None
        want = frozenset({"*v2"}) if key == "" else frozenset(key.split(","))
        for root, point, opts in self._load():
            if not want <= opts:
                continue
            if _within(path, root):
                rel = path[len(root.rstrip("/")):].lstrip("/")
                return Path(point) / rel if rel else Path(point)
        return None

    def populated(self, cgroup: str) -> bool:
        """True while a process is in the cgroup or below it."""
        d = self.directory(cgroup)
        if d is None:
            return False
        try:
            for line in cgroupfiles.read(d / "cgroup.events").splitlines():
                if line.startswith("populated "):
                    return line.split()[1] == "1"
        except BlockingIOError:  # its tenant leased it (cgroupfiles): /proc, unleased
            return bool(cgroupfiles.pids_in(cgroup, self._proc))
        except OSError:
            pass  # v1 has no cgroup.events: look at the processes
        for seen, (here, dirs, _) in enumerate(os.walk(d), 1):
            try:
                if cgroupfiles.read(Path(here) / "cgroup.procs").strip():
                    return True
            except BlockingIOError:
                return bool(cgroupfiles.pids_in(cgroup, self._proc))
            except OSError:
                pass
            if seen >= _WALK_MAX:
                del dirs[:]
        return False


def runtime_state_exists(container_id: str, roots: Iterable[Path]) -> bool:
    """True when an OCI runtime keeps state for container_id under a root (depth 1 or 2)."""
    if not container_id or "/" in container_id or container_id in (".", ".."):
        return False
    for root in roots:
        root = Path(root)
        if (root / container_id).exists():
            return True
        try:
            subdirs = [d for d in root.iterdir() if d.is_dir()]
        except OSError:
            continue
        for d in subdirs:  # containerd namespaces, docker's "moby"
            if (d / container_id).exists():
                return True
    return False


class Liveness:
    """The one rule for whether a slice's holder lives (the module's docstring)."""

    def __init__(self, proc: Path = Path("/proc"), *,
                 runtime_state_roots: Sequence[Path] = (),
                 pending_grace_s: float = PENDING_GRACE_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.proc = Path(proc)
        self.runtime_state_roots = tuple(Path(r) for r in runtime_state_roots)
        self.pending_grace_s = pending_grace_s
        self.cgroups = Cgroups(self.proc)
        self._clock = clock
        # Unstarted slices whose runtime state was seen: once it goes, so did the container.
        self._state_seen: set[str] = set()

    def observe(self, pid: int, *, kind: str = OwnerKind.CONTAINER, bundle: str = "") -> Holder:
        """What the host says of pid now: its start time and (for a container) cgroup."""
        if pid <= 0:
            return Holder(bundle=bundle)
        cgroup = read_cgroup(pid, self.proc) if kind == OwnerKind.CONTAINER else ""
        return Holder(pid, proc_start_time(pid, self.proc), cgroup, bundle)

    def init_alive(self, s: Slice) -> bool:
        """The recorded init (or process) runs, with the recorded start time."""
        return bool(s.owner_pid) and pid_alive(s.owner_pid, s.owner_start, self.proc)

    def user_alive(self, u: User) -> bool:
        """A claim's user lives while its init runs with the recorded start time, or while
        a process is left in its recorded cgroup."""
        if pid_alive(u.pid, u.start, self.proc):
            return True
        return bool(u.cgroup) and self.cgroups.populated(u.cgroup)

    def alive(self, s: Slice) -> bool:
        """True while the slice's holder exists (the module's rule)."""
        if s.owner_kind == OwnerKind.CLAIM:
            return True
        if s.owner_pid:
            self._state_seen.discard(s.id)
            if self.init_alive(s):
                return True
            return (s.owner_kind == OwnerKind.CONTAINER and bool(s.owner_cgroup)
                    and self.cgroups.populated(s.owner_cgroup))
        if s.owner_kind != OwnerKind.CONTAINER:
            return False
        if runtime_state_exists(s.owner, self.runtime_state_roots):
            self._state_seen.add(s.id)
            return True
        if s.id in self._state_seen:
            return False  # its runtime knew it and deleted it: a failed create
        return self._clock() * 1000 - s.created_ms < self.pending_grace_s * 1000

    def forget(self, slice_id: str) -> None:
        """The slice is gone: drop what was remembered of it."""
        self._state_seen.discard(slice_id)
