# SPDX-License-Identifier: Apache-2.0
"""A list of file operations run in one call to libvgpu-fileops.so (arbiter/files/native/
fileops.c), which lets go of the GIL once for all of them.

Why: made from Python, each system call of a slice's files (some twenty for an
allocation and its release) lets go of the GIL and waits to get it back behind vgpud's
other threads. Under load on a 2-CPU node those hand-offs cost more than the calls, and
they lengthen the arbiter's lock and the store writer's turns with them
(docs/performance.md). What to make, with which bytes and modes, is decided here and in
the callers, in Python; the library only runs the list in order and stops at the first
operation that fails.

    ops = [mkdir(d, 0o700), write_at(f"{d}/a", data, 0o644, keep=True)]
    done = run(ops)           # FileOpError at the first failure
    done[1].fd, done[1].ino   # a kept file, open read-write
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from arbiter.errors import LibraryMismatchError
from arbiter.native import fileops_path

__all__ = ["FileOpError", "Kept", "Op", "close", "detach", "is_file", "link", "load", "mkdir",
           "mknod_bind", "mount_tmpfs", "rmdir", "run", "run_all", "unlink", "write_at",
           "write_beside"]

#: The operations, numbered as fileops.c's enum vg_fileop_kind.
(MKDIR, MOUNT_TMPFS, WRITE_AT, WRITE_BESIDE, MKNOD_BIND, LINK, DETACH, UNLINK, RMDIR, CLOSE,
 IS_FILE) = range(1, 12)
#: fileops.c's VG_FILEOPS_VERSION and VG_FILEOP_KEEP.
_VERSION = 2
_KEEP = 0x1


class _COp(ctypes.Structure):
    """struct vg_fileop."""

    _fields_ = [
        ("op", ctypes.c_int32),
        ("fd", ctypes.c_int32),
        ("path", ctypes.c_char_p),
        ("aux", ctypes.c_char_p),
        ("data", ctypes.c_char_p),
        ("len", ctypes.c_uint64),
        ("ino", ctypes.c_uint64),
        ("last_off", ctypes.c_int64),
        ("last", ctypes.c_uint32),
        ("mode", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("err", ctypes.c_int32),
    ]


class Op(NamedTuple):
    """One operation (built by the functions below; a tuple: made on every allocation)."""

    kind: int
    path: str
    aux: str = ""
    data: bytes = b""
    mode: int = 0
    keep: bool = False
    last: tuple[int, int] | None = None  # (offset, a 32-bit word written after data)
    fd: int = -1


@dataclass(frozen=True)
class Kept:
    """A file a WRITE op made and left open (read-write): its fd and inode."""

    fd: int
    ino: int


class FileOpError(OSError):
    """The operation at `index` failed (errno, strerror, its path); what it made is undone,
    what the operations before it made stays, and their kept files are closed."""

    strerror: str  # always os.strerror(errno): OSError's own may be None, this one never is

    def __init__(self, index: int, op: Op, err: int) -> None:
        super().__init__(err, os.strerror(err), op.path)
        self.index = index
        self.op = op


def mkdir(path: str, mode: int) -> Op:
    """A directory of exactly `mode` (chmod after mkdir: no umask)."""
    return Op(MKDIR, path, mode=mode)


def mount_tmpfs(path: str, options: str) -> Op:
    """A tmpfs (nosuid, nodev, noexec) with `options` (size=, nr_inodes=, mode=) at path."""
    return Op(MOUNT_TMPFS, path, aux=options)


def write_at(path: str, data: bytes, mode: int, *, last: tuple[int, int] | None = None,
             keep: bool = False) -> Op:
    """A new file at path itself (O_EXCL | O_NOFOLLOW), for a directory made just now that
    nothing reads yet: data, then `last` (offset, 32-bit magic), in `mode`."""
    return Op(WRITE_AT, path, data=data, mode=mode, last=last, keep=keep)


def write_beside(path: str, temp_prefix: str, data: bytes, mode: int) -> Op:
    """A new file written whole under `<temp_prefix><n>.tmp` (the first n free), then
    renamed over path: readers see the old file or the new one (arbiter.files.atomic's
    names: temp_prefix is `<dir>/.<name>.<pid>-`)."""
    return Op(WRITE_BESIDE, path, aux=temp_prefix, data=data, mode=mode)


def mknod_bind(path: str, source: str, mode: int) -> Op:
    """An empty file of `mode` at path with the file source bind-mounted onto it (the
    empty file is removed again when the mount fails). Whatever is at path already is
    unmounted and deleted first: path must be a name the caller owns."""
    return Op(MKNOD_BIND, path, aux=source, mode=mode)


def link(path: str, source: str) -> Op:
    """path, a hard link to source; whatever is at path already is unmounted and deleted
    first (as for mknod_bind)."""
    return Op(LINK, path, aux=source)


def detach(path: str) -> Op:
    """Lazily unmount path; nothing mounted there (or no path) is fine."""
    return Op(DETACH, path)


def unlink(path: str) -> Op:
    """Delete the file path; already gone is fine."""
    return Op(UNLINK, path)


def rmdir(path: str) -> Op:
    """Remove the empty directory path."""
    return Op(RMDIR, path)


def close(fd: int) -> Op:
    """Close fd (a file held open)."""
    return Op(CLOSE, "", fd=fd)


def is_file(path: str) -> Op:
    """Check that path is a regular file (it fails with ENOENT when there is none, EINVAL
    when something else is there): a list that needs a file made elsewhere stops there."""
    return Op(IS_FILE, path)


_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()

_lib: ctypes.CDLL | None = None
_load_lock = threading.Lock()


def load() -> None:
    """Load libvgpu-fileops.so now (vgpud's start: a missing or stale library is said
    there, not at the first allocation): LibraryNotFoundError, LibraryMismatchError."""
    _library()


def _library() -> ctypes.CDLL:
    """libvgpu-fileops.so, loaded once and checked against this module's struct."""
    global _lib
    with _load_lock:
        if _lib is None:
            path = fileops_path()
            lib = ctypes.CDLL(str(path))
            lib.vg_fileops_abi.restype = ctypes.c_uint32
            lib.vg_fileops_abi.argtypes = []
            abi = lib.vg_fileops_abi()
            want = ctypes.sizeof(_COp) << 16 | _VERSION
            if abi != want:
                raise LibraryMismatchError(
                    path, f"struct size {abi >> 16}, version {abi & 0xFFFF}",
                    f"{want >> 16}, {_VERSION}")
            lib.vg_fileops_run.restype = ctypes.c_int
            lib.vg_fileops_run.argtypes = [ctypes.POINTER(_COp), ctypes.c_int]
            _lib = lib
        return _lib


def run(ops: Sequence[Op]) -> list[Kept | None]:
    """Run ops in order in one call; per op, the file it kept open (else None).

    FileOpError at the first that fails (earlier kept files are closed then)."""
    lib = _library()
    n = len(ops)
    arr = (_COp * n)()
    for c, op in zip(arr, ops, strict=True):
        c.op = op.kind
        c.fd = op.fd
        c.path = op.path.encode(_FS_ENCODING, _FS_ERRORS)  # os.fsencode, less its checks
        c.aux = op.aux.encode(_FS_ENCODING, _FS_ERRORS) if op.aux else None
        if op.data:
            c.data = op.data
            c.len = len(op.data)
        if op.last is not None:
            c.last_off, c.last = op.last
        else:
            c.last_off = -1
        c.mode = op.mode
        c.flags = _KEEP if op.keep else 0
    done = lib.vg_fileops_run(arr, n)
    kept = [Kept(c.fd, c.ino) if op.keep and i < done else None
            for i, (c, op) in enumerate(zip(arr, ops, strict=True))]
    if done == n:
        return kept
    for k in kept:
        if k is not None:
            os.close(k.fd)
    raise FileOpError(done, ops[done], arr[done].err)


def run_all(ops: Sequence[Op]) -> list[FileOpError]:
    """Run every op, going on past any that fails (removals: each stands alone); the
    failures, in order (index: the op's in ops). Kept files are closed."""
    errors: list[FileOpError] = []
    start = 0
    while start < len(ops):
        try:
            for k in run(ops[start:]):
                if k is not None:
                    os.close(k.fd)
            break
        except FileOpError as e:
            e.index += start
            errors.append(e)
            start = e.index + 1
    return errors
