# SPDX-License-Identifier: Apache-2.0
"""A new file beside its final name, written whole and then renamed (or linked) into place.

Used in vgpud's own directories only (a slice's directory, 0700, and the scheduling
directory, 0755, both root's): no one else can make a name there, so a predictable name
is safe, and O_EXCL still refuses whatever is there (a leftover of a crashed vgpud whose
pid was the same: the next number is tried). tempfile.mkstemp draws a random name for
directories others can write; here that costs more than the write itself on every
allocation.
"""
from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path

__all__ = ["open_beside", "write_whole"]

_seq = itertools.count()
_TRIES = 1000
_pid = os.getpid()  # asked once: a syscall per file otherwise; a fork's child asks again


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def open_beside(path: str | Path) -> tuple[int, str]:
    """(fd, name) of a new empty file `.<name>.<pid>-<n>.tmp` in path's directory, open
    read-write, mode 0600 (fchmod it); OSError as open(2) gives it."""
    head, tail = os.path.split(os.fspath(path))
    prefix = os.path.join(head, f".{tail}.{_pid}-")
    for _ in range(_TRIES):
        tmp = f"{prefix}{next(_seq)}.tmp"
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                           | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def write_whole(path: str | Path, data: bytes, mode: int, *,
                last: tuple[int, bytes] | None = None, how: str = "replace",
                keep: bool = False) -> int | None:
    """Put a file of `mode` holding data at path, written whole before anyone can open it
    (then `last`, (offset, bytes): a magic word that says it is whole). how="replace":
    written beside and renamed over whatever is at path; "new": written beside and linked
    (FileExistsError when path exists); "fresh": written at path itself, O_EXCL, for a
    directory made just now that nothing reads until it is done (a crash leaves the file
    without its magic). With keep the open fd (read-write) is returned, else closed."""
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
        if tmp is not None:
            if how == "new":
                os.link(tmp, path)
                os.unlink(tmp)
            else:
                os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp if tmp is not None else path)
        raise
    if keep:
        return fd
    os.close(fd)
    return None
