# SPDX-License-Identifier: Apache-2.0
"""One vgpud per state dir: an flock on <state_dir>/vgpud.lock, held for the daemon's life.

Two vgpuds on one state dir (whatever their sockets) would both hand out the same
memory. The lock is taken before vgpud touches anything else, so a second one
fails without changing a file, a socket or a directory. The holder writes its pid
and socket into the lock file; a refused start names them. flock (not a pid file)
because the kernel drops it when its holder dies, even by SIGKILL: no stale lock.
"""
from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from arbiter.errors import VgpuError

__all__ = ["LOCK_NAME", "StateDirInUseError", "StateLock"]

#: The lock file's name inside the state dir.
LOCK_NAME = "vgpud.lock"
#: The most of a lock file a refused start reads (its holder writes two short lines).
_READ_MAX = 4096
#: How often a waiting start tries the lock again (flock has no timeout of its own).
_RETRY_S = 0.02


class StateDirInUseError(VgpuError):
    """Another vgpud holds the state dir's lock."""

    def __init__(self, state_dir: Path, pid: int | None, socket: str | None) -> None:
        self.state_dir = state_dir
        self.pid = pid
        self.socket = socket
        who = f"pid {pid}" if pid is not None else "pid unknown"
        if socket:
            who += f", serving {socket}"
        super().__init__(f"another vgpud ({who}) holds the state dir {state_dir}")


class StateLock:
    """The exclusive lock of one state dir; close() (or the process's end) lets it go."""

    def __init__(self, state_dir: Path, fd: int) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, state_dir: Path, socket: Path | str, *, wait_s: float = 0) -> StateLock:
        """Take the lock of state_dir (made 0700 when missing) or raise StateDirInUseError
        (once `wait_s` seconds passed with another holder: a takeover waits for the old
        vgpud to exit).

        Raises OSError when the directory or the lock file cannot be made or opened.
        """
        state_dir = Path(state_dir)
        if not state_dir.is_dir():
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # O_NOFOLLOW: the state dir is root's, but a link here is never ours to follow.
        fd = os.open(state_dir / LOCK_NAME,
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        deadline = time.monotonic() + wait_s
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if (e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN)
                            or time.monotonic() >= deadline):
                        raise
                    time.sleep(_RETRY_S)
        except OSError as e:
            try:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    pid, sock = _holder(fd)
                    raise StateDirInUseError(state_dir, pid, sock) from None
                raise
            finally:
                os.close(fd)
        try:
            # Ours now: say who holds it (a refused start reads this, nothing else does).
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n{socket}\n".encode(), 0)
        except OSError:
            pass  # the lock still holds; a refused start then says "pid unknown"
        return cls(state_dir, fd)

    def close(self) -> None:
        """Let the lock go (the file stays: removing it would race the next holder)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _holder(fd: int) -> tuple[int | None, str | None]:
    """(pid, socket) the holder wrote into the lock file; None where unreadable."""
    try:
        text = os.pread(fd, _READ_MAX, 0).decode("utf-8", "replace")
    except OSError:
        return None, None
    lines = text.splitlines()
    pid = int(lines[0]) if lines and lines[0].isdigit() else None
    sock = lines[1].strip() if len(lines) > 1 and lines[1].strip() else None
    return pid, sock
