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

import itertools
import os
from pathlib import Path

__all__ = ["open_beside"]

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
