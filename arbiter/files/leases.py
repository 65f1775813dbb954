# SPDX-License-Identifier: Apache-2.0
"""Opening files a tenant can open too, without ever waiting on its file lease.

A container's root owns the files vgpu bind-mounts into it (host root made them), so it
may take a file lease on them (fcntl(2) F_SETLEASE), even on a read-only mount:

- a read lease (its fd read-only, no writer anywhere) makes every open for write wait;
- a write lease (any fd, no other opener anywhere) makes every open, even read-only, wait;

for /proc/sys/fs/lease-break-time (45 s) each time, while the kernel asks the holder to
let go. vgpud never waits so: every open here is O_NONBLOCK, which fails at once with
EWOULDBLOCK instead (the break still starts, and the kernel ends the lease when the time
is up). And `Pins` keeps such files open read-write for as long as they are in use: a
file that has a writer takes no read lease, and one with another opener no write lease,
so while vgpud holds it no tenant can lease it at all.
"""
from __future__ import annotations

import contextlib
import os
import stat
import threading
from pathlib import Path

from arbiter.errors import RegionError

__all__ = ["LEASED", "Pins", "open_tenant_file"]

#: The reason an open gives when a lease held the file (RegionError.busy is then True).
LEASED = "held by another process's file lease; not waited on, tried again later"


def open_tenant_file(path: Path, flags: int, *, verb: str = "open",
                     error: type[RegionError] = RegionError) -> int:
    """os.open(path, flags) that never waits on a lease: `error` (busy) when one holds it."""
    try:
        return os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)
    except BlockingIOError as e:  # EWOULDBLOCK: a lease is being broken
        raise error(path, verb, LEASED, busy=True) from e
    except OSError as e:
        raise error(path, verb, e.strerror or str(e)) from e


class Pins:
    """Files held open read-write, by owner (a slice id), until dropped.

    A file a lease holds is not opened by hold(), which says so at once; a thread of its
    own opens it then, waiting out the break with no lock held, and holds it from then on.
    Its open counts as a writer before it waits (do_dentry_open takes the write access
    before it breaks leases), so the tenant cannot lease the file again meanwhile: a
    nonblocking retry would race the tenant's own retry each time the kernel ends its
    lease, and the tenant, which polls, would win."""

    def __init__(self) -> None:
        # Keyed by the path's str: every Allocate adopts its files under paths made as str
        # (a Path made and hashed costs some twenty Python calls a file).
        self._held: dict[str, dict[str, tuple[int, int]]] = {}
        self._waiting: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def hold(self, owner: str, path: Path) -> None:
        """Keep path open for owner (again, when it is another inode now); RegionError
        (busy when a lease holds it: then it is opened in the background) otherwise."""
        key = str(path)
        with self._lock:
            old = self._held.get(owner, {}).get(key)
            if old is not None and _same_inode(path, old[1]):
                return  # a stat breaks no lease
            if (owner, key) in self._waiting:
                raise RegionError(path, "open", LEASED, busy=True)
        try:
            fd = open_tenant_file(path, os.O_RDWR | os.O_NOFOLLOW)
        except RegionError as e:
            if e.busy:
                self._wait_for(owner, path)
            raise
        self._keep(owner, path, fd)

    def _wait_for(self, owner: str, path: Path) -> None:
        waiting = (owner, str(path))
        with self._lock:
            if waiting in self._waiting:
                return
            self._waiting.add(waiting)
        threading.Thread(target=self._open_waiting, args=(owner, path), daemon=True,
                         name=f"pin {path.name}").start()

    def _open_waiting(self, owner: str, path: Path) -> None:
        """Open path, waiting for the lease break (up to lease-break-time), and keep it."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            fd = -1  # gone meanwhile: the next hold() says why
        waiting = (owner, str(path))
        with self._lock:
            wanted = waiting in self._waiting
            self._waiting.discard(waiting)
        if fd >= 0 and wanted:
            with contextlib.suppress(RegionError):
                self._keep(owner, path, fd)
        elif fd >= 0:
            os.close(fd)  # dropped while it waited

    def adopt(self, owner: str, path: str, fd: int, ino: int) -> None:
        """Hold fd, the regular file (inode ino) vgpud made at path just now (no tenant
        could lease it yet), for owner as hold() would: closed when dropped or taken."""
        self._put(owner, path, fd, ino)

    def _keep(self, owner: str, path: Path, fd: int) -> None:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RegionError(path, "open", "not a regular file")
        except OSError as e:
            os.close(fd)
            raise RegionError(path, "open", e.strerror or str(e)) from e
        except RegionError:
            os.close(fd)
            raise
        self._put(owner, str(path), fd, st.st_ino)

    def _put(self, owner: str, key: str, fd: int, ino: int) -> None:
        with self._lock:
            old = self._held.setdefault(owner, {}).get(key)
            self._held[owner][key] = (fd, ino)
        if old is not None:
            os.close(old[0])

    def held(self, owner: str) -> set[Path]:
        """The paths held for owner."""
        with self._lock:
            return {Path(key) for key in self._held.get(owner, {})}

    def drop(self, owner: str) -> None:
        """Close owner's files (and stop wanting those still being opened)."""
        for fd in self.take(owner):
            os.close(fd)

    def take(self, owner: str) -> list[int]:
        """Let go of owner's files without closing them: their fds, for the caller to
        close (and stop wanting those still being opened)."""
        with self._lock:
            mine = self._held.pop(owner, {})
            if self._waiting:
                self._waiting = {w for w in self._waiting if w[0] != owner}
        return [fd for fd, _ in mine.values()]

    def close(self) -> None:
        """Close every file."""
        with self._lock:
            owners = list(self._held) + [w[0] for w in self._waiting]
        for owner in owners:
            self.drop(owner)

    def __del__(self) -> None:
        self.close()


def _same_inode(path: Path, ino: int) -> bool:
    try:
        return os.stat(path, follow_symlinks=False).st_ino == ino
    except OSError:
        return True  # gone: kept until one is made again
