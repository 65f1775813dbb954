# SPDX-License-Identifier: Apache-2.0
"""Bind-mount a slice into a container's rootfs, from inside its mount namespace, safely.

What to mount is a Plan (pure: plan_mounts); how is MountHelper, a child forked
before the hook makes any gRPC call (setns(CLONE_NEWNS) needs a single-threaded
caller, and forking after gRPC has started its threads could leave a lock held in
the child), which enters /proc/<pid>/ns/mnt at once and waits for the plan on a pipe.

Every target is resolved inside the rootfs with openat2(RESOLVE_IN_ROOT |
RESOLVE_NO_MAGICLINKS): a symlink planted by the image (/etc -> /host/etc,
/dev/vgpu0 -> /var/lib/x, ../../..) resolves as if the rootfs were /, so it can
never lead out of it. Missing directories and files are made with mkdirat/openat
(O_EXCL|O_NOFOLLOW) relative to a directory fd resolved that way, and the mount
goes onto /proc/self/fd/<fd> of the resolved target, as runc does. The hook runs
before pivot_root, while the container's init waits: nothing in the container
runs during these steps.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import posixpath
import select
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arbiter.region import USAGE_SUFFIX, usage_path_of
from arbiter.sched import SCHED_DIR_NAME, slice_key_of
from oci_hook.errors import MountError

if TYPE_CHECKING:
    from oci_hook.client import SliceView, VGpuView

__all__ = [
    "CONTAINER_LIBVGPU",
    "CONTAINER_PRELOAD",
    "CONTAINER_SCHED_DIR",
    "PRELOAD_HOST_NAME",
    "Mount",
    "MountHelper",
    "Plan",
    "apply_plan",
    "plan_mounts",
    "sched_files",
]

#: Where libvgpu.so appears in the container, and the line ld.so.preload gets.
CONTAINER_LIBVGPU = "/usr/lib/vgpu/libvgpu.so"
#: Where libvgpu in a container looks for its GPUs' scheduling regions (vgpu_sched.h).
CONTAINER_SCHED_DIR = "/run/vgpu/sched"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
#: The generated ld.so.preload, in the bundle (the engine removes it with the bundle;
#: the slice's region dir is vgpud's, whose reconciler removes files it did not make).
PRELOAD_HOST_NAME = "vgpu-ld.so.preload"
_PRELOAD_MAX = 64 << 10  # bytes read of the image's own ld.so.preload
_MAX_LINK_HOPS = 40      # like the kernel's MAXSYMLINKS

# <sched.h>, <sys/mount.h>, <linux/openat2.h>; syscall numbers from 424 on are the
# same on every architecture.
_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REMOUNT, _MS_BIND = 0x20, 0x1000
_MNT_DETACH = 0x2
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_IN_ROOT = _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS


@dataclass(frozen=True)
class Mount:
    """One bind mount: a host path onto a path inside the container."""

    source: str
    target: str
    read_only: bool = True
    device: bool = False      # a device node: keep it usable (no nodev)
    executable: bool = False  # a library the loader maps (no noexec)

    @property
    def flags(self) -> int:
        """Flags of the read-only/nosuid/nodev/noexec remount after the bind."""
        flags = _MS_REMOUNT | _MS_BIND | _MS_NOSUID
        flags |= _MS_RDONLY if self.read_only else 0
        flags |= 0 if self.device else _MS_NODEV
        flags |= 0 if self.executable or self.device else _MS_NOEXEC
        return flags


@dataclass(frozen=True)
class Plan:
    """Everything the child does in the container's mount namespace, in order."""

    rootfs: str
    mounts: tuple[Mount, ...]
    preload_host: str = ""      # host file to write the generated ld.so.preload to
    preload_line: str = CONTAINER_LIBVGPU

    def to_json(self) -> bytes:
        """The plan as the child reads it from the pipe."""
        return json.dumps(asdict(self)).encode()

    def to_fields(self) -> list[tuple[str, str]]:
        """The plan as vgpud's lifecycle socket answers it to the compiled vgpu-hook.

        Data-driven like the plan itself: each `mount=` field starts one mount, its value
        the comma-separated exceptions to read-only/nodev/noexec (`rw`, `dev`, `exec`),
        followed by its `source=` and `target=`. vgpu-hook applies them in order.
        """
        fields = [("rootfs", self.rootfs), ("preload_host", self.preload_host),
                  ("preload_line", self.preload_line)]
        for m in self.mounts:
            opts = [o for o, on in (("rw", not m.read_only), ("dev", m.device),
                                    ("exec", m.executable)) if on]
            fields += [("mount", ",".join(opts)), ("source", m.source), ("target", m.target)]
        return fields

    @classmethod
    def from_json(cls, data: bytes) -> Plan:
        """The plan the parent wrote."""
        doc = json.loads(data)
        return cls(rootfs=doc["rootfs"], mounts=tuple(Mount(**m) for m in doc["mounts"]),
                   preload_host=doc["preload_host"], preload_line=doc["preload_line"])


def sched_files(s: SliceView, v: VGpuView) -> tuple[str, str]:
    """The scheduling files of a slice's vGPU: its GPU's (the broker's) and the slice's own
    requests there. vgpud keeps them in <run_dir>/sched, beside <run_dir>/slices/<id>/vgpu<i>.

    Both must be there: a container is refused rather than started unenforced."""
    if not v.gpu_uuid or "/" in v.gpu_uuid or v.gpu_uuid.startswith("."):
        raise MountError("find", f"the scheduling file of vGPU {v.index}",
                         f"GPU UUID {v.gpu_uuid!r} cannot name a file")
    root = Path(v.region_path).parent.parent.parent / SCHED_DIR_NAME
    gpu = root / v.gpu_uuid
    req = root / f"{v.gpu_uuid}.{slice_key_of(s.id, v.index):016x}.req"
    for path in (gpu, req):
        if not path.is_file():
            raise MountError("find", str(path), "missing (vgpud makes it with the slice)")
    return str(gpu), str(req)


def plan_mounts(s: SliceView, *, rootfs: Path, libvgpu: Path, preload_host: Path) -> Plan:
    """The mounts that give a container slice `s`: libvgpu, /dev/vgpu<i>, the GPUs' device
    nodes, then /etc/ld.so.preload (last: it names the library mounted first)."""
    mounts = [Mount(str(libvgpu), CONTAINER_LIBVGPU, executable=True)]
    for v in s.vgpus:
        # The limits and the slice's identity: read-only. Its usage is the slice's own:
        # libvgpu in the container writes it (and nobody trusts it for anything).
        mounts.append(Mount(v.region_path, f"/dev/vgpu{v.index}"))
        mounts.append(Mount(str(usage_path_of(v.region_path)), f"/dev/vgpu{v.index}{USAGE_SUFFIX}",
                            read_only=False))
    for v in s.vgpus:
        # The GPU's scheduling file is the broker's: read-only here (a futex wait on its
        # grant word only reads). The slice's .req is its own: nobody else mounts it.
        gpu, req = sched_files(s, v)
        mounts.append(Mount(gpu, f"{CONTAINER_SCHED_DIR}/{v.gpu_uuid}"))
        mounts.append(Mount(req, f"{CONTAINER_SCHED_DIR}/{Path(req).name}", read_only=False))
    seen: set[str] = set()
    for v in s.vgpus:
        for node in v.device_nodes:
            if node not in seen:
                seen.add(node)
                mounts.append(Mount(node, node, read_only=False, device=True))
    mounts.append(Mount(str(preload_host), CONTAINER_PRELOAD))
    return Plan(rootfs=str(rootfs), mounts=tuple(mounts), preload_host=str(preload_host))


# --- system calls (ctypes: Python 3.11 has no os.setns, os.mount or openat2) ----------------

class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64))


class _Libc:
    """The few libc functions the child calls; loaded once, in the parent, before fork."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.setns = libc.setns
        self.setns.argtypes = (ctypes.c_int, ctypes.c_int)
        self.mount = libc.mount
        self.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                               ctypes.c_ulong, ctypes.c_void_p)
        self.umount2 = libc.umount2
        self.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
        self.syscall = libc.syscall
        self.syscall.restype = ctypes.c_long
        self.syscall.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_char_p,
                                 ctypes.POINTER(_OpenHow), ctypes.c_size_t)


def _oserror(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, os.strerror(e), what)


class _Root:
    """A rootfs directory fd and the *at() operations on paths inside it."""

    def __init__(self, libc: _Libc, rootfs: str) -> None:
        self.libc = libc
        self.rootfs = rootfs
        try:
            self.fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            # After pivot_root the host path is gone: the hook ran in a later phase.
            raise MountError("open", f"the container's rootfs {rootfs}",
                             f"{e.strerror or e} (run vgpu-hook as a prestart or "
                             "createRuntime hook)") from e

    def close(self) -> None:
        os.close(self.fd)

    def open(self, rel: str, flags: int, mode: int = 0) -> int:
        """openat2(rootfs, rel, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)."""
        how = _OpenHow(flags | os.O_CLOEXEC, mode, _IN_ROOT)
        fd = self.libc.syscall(_SYS_OPENAT2, self.fd, rel.encode(), ctypes.byref(how),
                               ctypes.sizeof(how))
        if fd < 0:
            raise _oserror("/" + rel)
        return int(fd)

    def _follow(self, parent: str, pfd: int, name: str, hops: int) -> str:
        """The path a dangling symlink `parent/name` points to, relative to the root."""
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        if not stat.S_ISLNK(st.st_mode):
            raise OSError(20, "not a directory", f"/{parent}/{name}")  # ENOTDIR
        if hops >= _MAX_LINK_HOPS:
            raise OSError(40, "too many levels of symbolic links", f"/{parent}/{name}")
        link = os.readlink(name, dir_fd=pfd)
        # Relative to the link's directory; ".." is resolved by openat2 on the real
        # directory, and IN_ROOT keeps both ".." and absolute links inside the root.
        return link.lstrip("/") if link.startswith("/") else posixpath.join(parent, link)

    def ensure_dir(self, rel: str, hops: int = 0) -> int:
        """O_PATH fd of directory `rel`, making it (and its parents) where missing."""
        if rel in ("", "."):
            return os.dup(self.fd)
        try:
            return self.open(rel, os.O_PATH | os.O_DIRECTORY)
        except FileNotFoundError:
            pass
        parent, name = posixpath.split(rel.rstrip("/"))
        if name in ("", ".", ".."):
            raise OSError(2, "no such directory", "/" + rel)
        pfd = self.ensure_dir(parent, hops)
        try:
            os.mkdir(name, 0o755, dir_fd=pfd)
        except FileExistsError:
            target = self._follow(parent, pfd, name, hops)
            os.close(pfd)
            return self.ensure_dir(target, hops + 1)
        os.close(pfd)
        return self.open(rel, os.O_PATH | os.O_DIRECTORY)

    def ensure_file(self, rel: str, hops: int = 0) -> int:
        """O_PATH fd of the non-directory `rel`, made as an empty file where missing."""
        parent, name = posixpath.split(rel)
        try:
            return self.open(rel, os.O_PATH)
        except FileNotFoundError:
            pass
        pfd = self.ensure_dir(parent)
        try:
            fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644, dir_fd=pfd)
            os.close(fd)
        except FileExistsError:
            target = self._follow(parent, pfd, name, hops)
            os.close(pfd)
            return self.ensure_file(target, hops + 1)
        os.close(pfd)
        return self.open(rel, os.O_PATH)

    def read_small(self, rel: str, limit: int) -> bytes:
        """Contents of the regular file `rel` (b'' if missing or not a regular file)."""
        try:
            fd = self.open(rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except (FileNotFoundError, NotADirectoryError):
            return b""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return b""
            return os.read(fd, limit)
        finally:
            os.close(fd)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _preload(root: _Root, line: str) -> bytes:
    """ld.so.preload: our library first (it must interpose CUDA before anything else),
    then the image's own entries, ours dropped where the image already had it."""
    own = root.read_small(CONTAINER_PRELOAD.lstrip("/"), _PRELOAD_MAX).decode(
        "utf-8", "replace")
    kept = [x for x in own.splitlines() if x.strip() and x.strip() != line]
    return ("\n".join([line, *kept]) + "\n").encode()


def _bind(libc: _Libc, root: _Root, m: Mount) -> int | None:
    """Bind m.source onto m.target inside the root; the fd of the new mount (None: skipped)."""
    rel = m.target.lstrip("/")
    try:
        src = os.open(m.source, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        raise MountError("open", m.source, e.strerror or str(e)) from e
    try:
        src_st = os.fstat(src)
        if stat.S_ISDIR(src_st.st_mode):
            raise MountError("mount", m.source, "is a directory (expected a file or device)")
        try:
            tgt = root.ensure_file(rel)
        except OSError as e:
            raise MountError("make", f"{m.target} in the container",
                             f"{e.strerror or e}: {e.filename}") from e
        try:
            tgt_st = os.fstat(tgt)
            if _same(tgt_st, src_st):
                return None  # mounted already (the hook ran in another phase too)
            if m.device and stat.S_ISCHR(tgt_st.st_mode) and tgt_st.st_rdev == src_st.st_rdev:
                return None  # the runtime made this node from linux.devices
            if stat.S_ISDIR(tgt_st.st_mode):
                raise MountError("mount onto", f"{m.target} in the container",
                                 "it is a directory in the image")
            if libc.mount(f"/proc/self/fd/{src}".encode(), f"/proc/self/fd/{tgt}".encode(),
                          None, _MS_BIND, None) != 0:
                err = _oserror(m.target)
                raise MountError("bind-mount", f"{m.source} onto {m.target}",
                                 err.strerror or str(err))
        finally:
            os.close(tgt)
        # Re-resolve: the fd opened before the bind names the covered file, and a
        # remount through it would remount the rootfs itself.
        new = root.open(rel, os.O_PATH)
        if not _same(os.fstat(new), src_st):
            libc.umount2(f"/proc/self/fd/{new}".encode(), _MNT_DETACH)
            os.close(new)
            raise MountError("bind-mount", f"{m.source} onto {m.target}",
                             "the target moved during the mount")
        if libc.mount(None, f"/proc/self/fd/{new}".encode(), None, m.flags, None) != 0:
            err = _oserror(m.target)
            libc.umount2(f"/proc/self/fd/{new}".encode(), _MNT_DETACH)
            os.close(new)
            raise MountError("remount", f"{m.target} read-only", err.strerror or str(err))
        return new
    finally:
        os.close(src)


def apply_plan(libc: _Libc, plan: Plan) -> None:
    """Do the plan in the current mount namespace; undo every mount made if a step fails."""
    root = _Root(libc, plan.rootfs)
    done: list[int] = []
    try:
        if plan.preload_host:
            data = _preload(root, plan.preload_line)
            fd = os.open(plan.preload_host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                         | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        for m in plan.mounts:
            mounted = _bind(libc, root, m)
            if mounted is not None:
                done.append(mounted)
    except BaseException:
        for fd in reversed(done):
            libc.umount2(f"/proc/self/fd/{fd}".encode(), _MNT_DETACH)
        raise
    finally:
        for fd in done:
            os.close(fd)
        root.close()


class MountHelper:
    """A child process in the container's mount namespace that applies one plan."""

    def __init__(self, pid: int, plan_w: int, status_r: int) -> None:
        self.pid = pid
        self._plan_w: int | None = plan_w
        self._status_r = status_r

    @classmethod
    def start(cls, container_pid: int, proc: str = "/proc") -> MountHelper:
        """Fork a child that enters the mount namespace of `container_pid` and waits."""
        ns_path = f"{proc}/{container_pid}/ns/mnt"
        try:
            ns = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise MountError("open", ns_path, e.strerror or str(e)) from e
        libc = _Libc()
        plan_r, plan_w = os.pipe2(os.O_CLOEXEC)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.close(plan_w)
                os.close(status_r)
                code = _child(libc, ns, plan_r, status_w)
            finally:
                os._exit(code)
        os.close(ns)
        os.close(plan_r)
        os.close(status_w)
        return cls(pid, plan_w, status_r)

    def apply(self, plan: Plan, timeout: float) -> None:
        """Send the plan and wait (at most `timeout` s) for the child's answer."""
        assert self._plan_w is not None
        # Small: fits the pipe buffer. A broken pipe: the child failed early, its status
        # says why.
        with contextlib.suppress(BrokenPipeError):
            os.write(self._plan_w, plan.to_json())
        os.close(self._plan_w)
        self._plan_w = None
        message = self._status(timeout)
        _, status = os.waitpid(self.pid, 0)
        if message or status != 0:
            raise MountError("set up", "the vGPU mounts",
                             message or f"the mount helper exited with status {status}")

    def _status(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        chunks: list[bytes] = []
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._status_r], [], [], left)[0]:
                    os.kill(self.pid, 9)
                    return f"the mount helper did not finish within {timeout:g}s"
                chunk = os.read(self._status_r, 4096)
                if not chunk:
                    return b"".join(chunks).decode("utf-8", "replace").strip()
                chunks.append(chunk)
        finally:
            os.close(self._status_r)

    def abort(self) -> None:
        """Tell the child there is nothing to do and reap it."""
        if self._plan_w is not None:
            os.close(self._plan_w)
            self._plan_w = None
            os.close(self._status_r)
            os.waitpid(self.pid, 0)


def _child(libc: _Libc, ns: int, plan_r: int, status_w: int) -> int:
    """In the forked child: enter the namespace, read the plan, apply it, report."""
    try:
        if libc.setns(ns, _CLONE_NEWNS) != 0:
            e = _oserror("setns")
            raise MountError("enter", "the container's mount namespace", e.strerror or str(e))
        chunks: list[bytes] = []
        while chunk := os.read(plan_r, 65536):
            chunks.append(chunk)
        if not chunks:
            return 0  # aborted by the parent
        apply_plan(libc, Plan.from_json(b"".join(chunks)))
        return 0
    except BaseException as e:  # the child must report and _exit, whatever happened
        msg: Any = str(e) if isinstance(e, MountError) else f"{type(e).__name__}: {e}"
        with contextlib.suppress(OSError):
            os.write(status_w, " ".join(msg.split()).encode())
        return 1
