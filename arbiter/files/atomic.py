# SPDX-License-Identifier: Apache-2.0
"""Atomic file writes: a new file (or link) beside its final name, written whole and then
renamed or linked into place, so a reader sees the old file or the new one, never a part.
Every write-to-temp-then-rename in vgpu goes through here.

The temporary name is `.<name>.<pid>-<n>.tmp`, made with O_EXCL | O_NOFOLLOW (a symlink
or file someone put at that name is refused, and the next number is tried), in the
final name's directory so the rename stays on one filesystem. It starts with a dot and
ends in .tmp, so an engine that watches a directory for `*.json` or `*.toml` skips it.
A predictable name is safe with O_EXCL even in directories others can write; drawing a
random one (tempfile.mkstemp) costs more than the write itself on every allocation.

The fsync policy, `durable`:
- False (the default): no fsync. For the run dir (/run is a tmpfs; its files do not
  outlive a reboot, and vgpud makes them again at its start) and for files whose loss
  costs only work done again: an OCI bundle's config.json (a crash takes its container
  with it, and the engine makes the bundle again), written on every vGPU container's
  start, where an fsync would only add to the start.
- True: the file is fsynced before the rename and its directory after it, so that after
  a power loss the name holds the old file or the new one, whole. For what must survive
  a host crash: engine configs and CDI specs vgpu installs, the DRA checkpoint, the
  `current` link of the versioned installs.
"""
from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path

__all__ = ["open_beside", "replace_link", "temp_prefix", "write_whole"]

_seq = itertools.count()
_TRIES = 1000
_pid = os.getpid()  # asked once: a syscall per file otherwise; a fork's child asks again


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def temp_prefix(path: str | Path) -> str:
    """`<dir>/.<name>.<pid>-`: the temporary names beside path are this, a number, `.tmp`
    (arbiter.files.fileops.write_beside numbers them from 0, O_EXCL skipping any taken)."""
    head, tail = os.path.split(os.fspath(path))
    return os.path.join(head, f".{tail}.{_pid}-")


def _temp_names(path: str | Path) -> itertools.islice[str]:
    prefix = temp_prefix(path)
    return itertools.islice((f"{prefix}{next(_seq)}.tmp" for _ in itertools.count()), _TRIES)


def open_beside(path: str | Path) -> tuple[int, str]:
    """(fd, name) of a new empty file `.<name>.<pid>-<n>.tmp` in path's directory, open
    read-write, mode 0600 (fchmod it); OSError as open(2) gives it."""
    for tmp in _temp_names(path):
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                           | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def sync_dir(path: str | Path) -> None:
    """fsync the directory `path` (a rename or link in it is then durable)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_whole(path: str | Path, data: bytes, mode: int, *,
                last: tuple[int, bytes] | None = None, how: str = "replace",
                keep: bool = False, durable: bool = False) -> int | None:
    """Put a file of `mode` holding data at path, written whole before anyone can open it
    (then `last`, (offset, bytes): a magic word that says it is whole). how="replace":
    written beside and renamed over whatever is at path; "new": written beside and linked
    (FileExistsError when path exists); "fresh": written at path itself, O_EXCL, for a
    directory made just now that nothing reads until it is done (a crash leaves the file
    without its magic). durable: the fsync policy above. With keep the open fd
    (read-write) is returned, else closed."""
    if how == "fresh":
        tmp = None
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    else:
        fd, tmp = open_beside(path)
    try:
        os.fchmod(fd, mode)  # not subject to the umask, unlike open()
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], written)
        if last is not None:
            os.pwrite(fd, last[1], last[0])
        if durable:
            os.fsync(fd)
        if tmp is not None:
            if how == "new":
                os.link(tmp, path)
                os.unlink(tmp)
            else:
                os.replace(tmp, path)
        if durable:
            sync_dir(os.path.dirname(os.path.abspath(path)))
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp if tmp is not None else path)
        raise
    if keep:
        return fd
    os.close(fd)
    return None


def replace_link(path: str | Path, target: str, *, durable: bool = False) -> None:
    """Make path a symlink to target, atomically: a new link beside it renamed over
    whatever is at path. durable: the fsync policy above (the directory is fsynced)."""
    for tmp in _temp_names(path):
        try:
            os.symlink(target, tmp)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {path}")
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        sync_dir(os.path.dirname(os.path.abspath(path)))
