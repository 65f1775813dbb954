# SPDX-License-Identifier: Apache-2.0
"""Which host processes belong to which vGPU of a slice.

NVML reports host pids. A slice's processes are the pids libvgpu registered in its
region slots (host pids for `vgpu run`), its owner pid, and, for a container, every
process in the owner's pid namespace (libvgpu inside a container registers the
container's own pid numbers, which mean nothing on the host). Used by the drift
guard (memory measured above the limit) and by the per-slice compute metric.

`SlicePids.host` is the trusted subset, for the guard and the drift check that
kill or freeze what they find: region slots are written by the tenant (a slot
could name a neighbour's pid), so it takes only what the host itself says:

- the owner pid, while it is the process recorded (its /proc start time: a pid
  reused after the owner died is someone else's), and its descendants (a
  `vgpu run` child);
- for a container, the processes in the owner's pid namespace (not the host's),
  and those in the cgroup its runtime made for it (the cgroup recorded at
  prestart, from the path component that names the container id down: a
  `--pid=host` container, `docker exec` into one). A recorded cgroup that does
  not name the container (a runtime without cgroups leaves the init in its
  caller's, shared with others) or that holds vgpud is not used.

A DRA claim's slice has no holder: its processes are those of the containers recorded
as its users (arbiter.model.User), each attributed as a started container's (its init,
pid namespace, and the cgroup its runtime made for it, whose id a component of its
bundle path names).

Never vgpud itself; pid 1 and vgpud's own ancestors never bring their
descendants (the whole host would be the slice's).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from arbiter.files import cgroupfiles
from arbiter.model import OwnerKind, Slice, User
from arbiter.proc import pid_namespace_inode, pids_by_namespace, proc_start_time, process_tree
from arbiter.slices.identity import Cgroups

__all__ = ["SlicePids", "as_holder", "container_cgroup", "descendants"]

#: Cgroup directories walked below a container's cgroup (nested cgroups of its own).
_WALK_MAX = 256


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


def _ancestors(children: Mapping[int, set[int]], pid: int) -> set[int]:
    """pid's ancestors in the process tree given as parent -> children."""
    parent = {c: p for p, cs in children.items() for c in cs}
    out: set[int] = set()
    while pid in parent and parent[pid] not in out:
        pid = parent[pid]
        out.add(pid)
    return out


def _names(component: str, container_id: str) -> bool:
    """Whether a cgroup path component is the one a runtime names after the container:
    <id> (cgroupfs: runc, docker, kubepods), <id>.scope, <prefix>-<id>.scope (systemd:
    runc-, docker-, cri-containerd-, crio-, libpod-)."""
    return component in (container_id, f"{container_id}.scope") or \
        component.endswith(f"-{container_id}.scope")


def container_cgroup(s: Slice) -> str:
    """The part of s's recorded cgroup (`<controllers>:<path>`) its runtime made for it
    (down to the last component that names the container id); "" when none does."""
    if s.owner_kind != OwnerKind.CONTAINER or not s.owner or not s.owner_cgroup:
        return ""
    key, sep, path = s.owner_cgroup.partition(":")
    if not sep or not path.startswith("/"):
        return ""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts), 0, -1):
        if _names(parts[i - 1], s.owner):
            return f"{key}:/" + "/".join(parts[:i])
    return ""


#: Shortest bundle path component taken for a container id (docker and podman ids are
#: 12 or 64 hex digits; CRI ids 64): shorter ones are directories such as "k8s.io".
_ID_MIN = 12


def as_holder(s: Slice, u: User) -> Slice:
    """Claim slice s as if user u's container held it (for the holder rules above): the
    container id is the bundle path component that names its recorded cgroup, else the
    bundle's last component."""
    parts = [p for p in u.bundle.split("/") if p]
    owner = parts[-1] if parts else ""
    probe = dataclasses.replace(s, owner_kind=OwnerKind.CONTAINER, owner_pid=u.pid,
                                owner_start=u.start, owner_cgroup=u.cgroup, owner_bundle=u.bundle)
    for part in reversed(parts):
        if len(part) >= _ID_MIN and container_cgroup(dataclasses.replace(probe, owner=part)):
            owner = part
            break
    return dataclasses.replace(probe, owner=owner)


class SlicePids:
    """Maps slices to host pids for one pass (the /proc scan is made once, when needed)."""

    def __init__(self, region_pids: Callable[[Slice], Mapping[int, set[int]]],
                 proc: Path = Path("/proc"), *,
                 users: Callable[[str], Sequence[User]] = lambda _slice_id: ()) -> None:
        self._region_pids = region_pids
        self._users = users
        self._proc = Path(proc)
        self._own_ns = pid_namespace_inode("self", self._proc)
        self._by_ns: dict[int, set[int]] | None = None
        self._children: dict[int, set[int]] | None = None
        self._never: set[int] | None = None       # pid 1 and vgpud's ancestors
        self._cgroups = Cgroups(self._proc)

    def of(self, s: Slice) -> list[set[int]]:
        """Host pids of each vGPU of s (index = vGPU ordinal); never vgpud itself."""
        per_vgpu = self._region_pids(s)
        extra: set[int] = set()
        for u in self._users(s.id) if s.owner_kind == OwnerKind.CLAIM else ():
            holder = as_holder(s, u)
            extra.add(u.pid)
            extra |= self._namespace_of(holder)
        if s.owner_pid:
            extra.add(s.owner_pid)
            extra |= self._namespace_of(s)
        me = {os.getpid()}
        return [(per_vgpu.get(i, set()) | extra) - me for i in range(len(s.grants))]

    def host(self, s: Slice) -> set[int]:
        """Pids the host attributes to s (owner, its descendants, its container's pid
        namespace and cgroup), none taken from tenant-writable region slots; never vgpud."""
        out: set[int] = set()
        if s.owner_kind == OwnerKind.CLAIM:
            for u in self._users(s.id):
                out |= self.host(as_holder(s, u))
            return out - self._excluded()
        owner = s.owner_pid
        if owner and self._is_owner(owner, s.owner_start):
            out.add(owner)
            if owner not in self._excluded():
                assert self._children is not None
                out |= descendants(self._children, owner)
            out |= self._namespace_of(s)
        out |= self._cgroup_of(s)
        return out - self._excluded()

    def _excluded(self) -> set[int]:
        """Never the slice's: vgpud, its ancestors and pid 1 (a wrong owner pid would
        otherwise hand the guard the whole host)."""
        if self._never is None:
            if self._children is None:
                self._children = process_tree(self._proc)
            self._never = {1} | _ancestors(self._children, os.getpid())
        return self._never | {os.getpid()}

    def _is_owner(self, pid: int, start: int) -> bool:
        """pid is in /proc and, where both are known, started when the owner did."""
        if not (self._proc / str(pid)).is_dir():
            return False
        now = proc_start_time(pid, self._proc)
        return not start or not now or now == start

    def _cgroup_of(self, s: Slice) -> set[int]:
        """Host pids in the cgroup the container's runtime made for it (and below it)."""
        cgroup = container_cgroup(s)
        top = self._cgroups.directory(cgroup) if cgroup else None
        if top is None:
            return set()
        out: set[int] = set()
        for seen, (here, dirs, _) in enumerate(os.walk(top), 1):
            try:
                out |= {int(x) for x in cgroupfiles.read(Path(here) / "cgroup.procs").split()}
            except BlockingIOError:  # its tenant leased it: /proc says the same, unleased
                out = cgroupfiles.pids_in(cgroup, self._proc)
                break
            except (OSError, ValueError):
                pass
            if seen >= _WALK_MAX:
                del dirs[:]
        # A cgroup that holds vgpud holds more than the container (identity never
        # records one; a stale record must not make vgpud's neighbours the slice's).
        return set() if os.getpid() in out else out

    def _namespace_of(self, s: Slice) -> set[int]:
        """Host pids in a container owner's pid namespace (empty for a host process).

        The caller has checked that owner_pid is the recorded process."""
        if s.owner_kind != OwnerKind.CONTAINER or not s.owner_pid:
            return set()
        ns = pid_namespace_inode(s.owner_pid, self._proc)
        # A host process as owner shares our namespace: that is not its container.
        if not ns or ns == self._own_ns:
            return set()
        if self._by_ns is None:
            try:
                self._by_ns = pids_by_namespace(self._proc)
            except OSError:
                self._by_ns = {}
        return self._by_ns.get(ns, set())
