# SPDX-License-Identifier: Apache-2.0
"""A slice's own small tmpfs: the bound on the files its container can write.

A container writes its usage file and its .req through read-write bind mounts. On the
run dir's filesystem (/run, a tmpfs the whole node shares) a write past their end would
grow them until /run is full. Nothing a container's root can lift bounds a file there:
RLIMIT_FSIZE is the writer's own (and would bound all its files), seals are for memfds
only (which cannot be bind-mounted), and tmpfs has no per-file or project quota. So each
slice's directory is a tmpfs of its own, `size=` just what its files take
(slice_fs_bytes): a write past that fails with ENOSPC and costs the node nothing more.
No container can remount it (that needs CAP_SYS_ADMIN in the host's user namespace, and
the container has the files, not the mount). The .req the broker reads in the
scheduling directory is bind-mounted there from the slice's tmpfs.

Containers see mounts made after their mount namespace was copied because vgpu-hook
takes its sources with open_tree in the host's namespace (oci_hook/native/vg_mount.c). The
previous release's hook opens them by path inside the container's namespace: for it the
run dir is made a mount point with shared propagation (share), so a slice's tmpfs made
later reaches the namespaces of containers (runc's default rootfs propagation is rslave).
"""
from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
from pathlib import Path

__all__ = ["bind_file", "detach", "share", "slice_fs_bytes", "slice_fs_options"]

log = logging.getLogger(__name__)

_MS_BIND, _MS_SHARED = 0x1000, 1 << 20
_MNT_DETACH = 0x2
_libc = ctypes.CDLL(None, use_errno=True)


def _pages(n: int, page: int) -> int:
    return -(-n // page)


@functools.cache  # the same few (vgpus, sizes) for every slice: once each
def slice_fs_bytes(vgpus: int, file_sizes: tuple[int, ...], page: int | None = None) -> int:
    """The size of a slice's tmpfs: per vGPU each of its files (region, usage, .req) twice
    (one deleted from the run dir but still mounted in its container, or held by vgpud,
    and the one made again), one file being written beside them (a remade file goes in
    by rename), and a spare page.

    Every file is written whole (no holes), so a full tmpfs fails vgpud's own write of a
    new file, never a store into one that exists: a tenant that fills it harms its own
    slice's repairs alone."""
    page = page or os.sysconf("SC_PAGE_SIZE")
    per_vgpu = sum(_pages(n, page) for n in file_sizes)
    largest = max(_pages(n, page) for n in file_sizes)
    return (2 * vgpus * per_vgpu + largest + 1) * page


def _mount(source: str, target: Path, fstype: str | None, flags: int, data: str | None) -> None:
    rc = _libc.mount(source.encode(), os.fsencode(target),
                     fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                     data.encode() if data else None)
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(target))


def slice_fs_options(size: int, files: int, mode: int) -> str:
    """The options of a slice's tmpfs: `size` bytes, room for `files` inodes (and its root),
    its root directory of `mode` (mounted nosuid, nodev, noexec: fileops.mount_tmpfs)."""
    return f"size={size},nr_inodes={files + 1},mode={mode:o}"


def share(path: Path) -> bool:
    """Give the directory path shared propagation (bound onto itself first when it is not
    a mount point: then mounts below it propagate to the copies runtimes make of it).
    True when it made that bind mount (detach(path) undoes it)."""
    try:
        _mount("none", path, None, _MS_SHARED, None)
        return False
    except OSError as e:
        if e.errno != errno.EINVAL:  # EINVAL: not a mount point
            raise
    _mount(str(path), path, None, _MS_BIND, None)
    _mount("none", path, None, _MS_SHARED, None)
    return True


def bind_file(source: Path, target: Path) -> None:
    """Bind-mount the file source onto the existing file target."""
    _mount(str(source), target, None, _MS_BIND, None)


def detach(path: Path) -> bool:
    """Lazily unmount whatever is mounted at path; False when nothing was."""
    if _libc.umount2(os.fsencode(path), _MNT_DETACH) == 0:
        return True
    e = ctypes.get_errno()
    if e in (errno.EINVAL, errno.ENOENT):  # not a mount point, or gone
        return False
    raise OSError(e, os.strerror(e), str(path))
