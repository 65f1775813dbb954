# SPDX-License-Identifier: Apache-2.0
"""Scheduling files: a ctypes mirror of libvgpu/include/vgpu_sched.h, and vgpud's side of them.

The slices on one GPU take turns through a token that vgpu-broker grants
(libvgpu/src/broker.c). In <run_dir>/sched, per GPU, `<uuid>` is the broker's
file (read-only to every slice: the grant word and its accounting) and, per
slice on that GPU, `<uuid>.<key>.req` is the slice's own requests (mounted into
its container alone) and `<uuid>.<key>.conf` its settings as vgpud decided them
(never mounted: the broker trusts nothing a slice can write). vgpud makes the
GPU files at start (`prepare_sched_dir`) and the slice files with each slice
(`write_slice_files`, `remove_slice_files`); the metrics read the GPU files
(`open_sched`, `summarize`).

The C header is the one definition of the layout; tests/arbiter/files/test_sched_files.py
proves that this mirror agrees with it field by field. Live fields are read
with single aligned native loads (see arbiter.files.region_file), never torn.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import logging
import mmap
import os
import stat
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arbiter.errors import SchedError
from arbiter.files import fileops
from arbiter.files.atomic import open_beside, temp_prefix, write_whole
from arbiter.files.header_checks import Checks, field_reader, fill, first_problem
from arbiter.files.leases import LEASED, open_tenant_file
from arbiter.files.slicefs import bind_file, detach

__all__ = [
    "CONF_FILE_MODE",
    "REQ_CHECKS",
    "REQ_FILE_MODE",
    "SCHED_CHECKS",
    "SCHED_DIR_MODE",
    "SCHED_DIR_NAME",
    "SCHED_ENTRIES",
    "SCHED_FILE_MODE",
    "SCHED_MAGIC",
    "SCHED_SIZE",
    "SCHED_UUID_LEN",
    "SCHED_VERSION",
    "EntrySummary",
    "Sched",
    "SchedSummary",
    "VgpuSched",
    "VgpuSchedEntry",
    "VgpuSchedReq",
    "conf_text",
    "create_sched",
    "new_slice_file_ops",
    "open_sched",
    "prepare_sched_dir",
    "remove_slice_files",
    "req_bytes",
    "req_path",
    "slice_file_keys",
    "slice_file_name",
    "slice_gpu_ns",
    "slice_key_of",
    "summarize",
    "usable_name",
    "write_slice_files",
]

log = logging.getLogger(__name__)

SCHED_MAGIC = 0x44454853  # "SHED" little-endian
SCHED_REQ_MAGIC = 0x51455253  # "SREQ"
SCHED_VERSION = 2
SCHED_ENTRIES = 128
SCHED_UUID_LEN = 96

#: <run_dir>/<this> holds one scheduling region per GPU, named by the GPU's UUID.
SCHED_DIR_NAME = "sched"
#: Beside the GPU files, never mounted into a container: the brokers' lock, one byte per GPU
#: file at its inode number (libvgpu vg_broker_lock; VGPU_BROKER_LOCK_NAME of vgpu_sched.h).
#: Not the GPU file itself: every container of a GPU has that one, and flock works read-only.
BROKER_LOCK_NAME = ".broker.lock"
#: Root's alone: it holds per-slice files containers write (their .req), which they
#: reach through bind mounts; no host user but root needs a way in.
SCHED_DIR_MODE = 0o700
#: The broker (root) alone writes a GPU's file; every slice reads it (a futex wait only reads).
SCHED_FILE_MODE = 0o644
#: A slice's processes run as any uid and each of them posts its requests in the .req.
REQ_FILE_MODE = 0o666
CONF_FILE_MODE = 0o644

_GRANT_ENTRY_MASK = 0xFF  # grant = (seq << 8) | (holder entry + 1)
#: A broker whose heartbeat (every 10 ms at most) is older than this is gone (libvgpu's rule too;
#: VGPU_BROKER_DEAD_NS of libvgpu/include/vgpu_timing.h, tests/project/test_timing_constants.py).
BROKER_DEAD_NS = 50_000_000


class VgpuSchedEntry(ctypes.Structure):
    """struct vgpu_sched_entry: the broker's accounting of one slice on this GPU."""

    _fields_ = [
        ("key", ctypes.c_uint64),
        ("share", ctypes.c_uint32),
        ("priority", ctypes.c_uint32),
        ("policy", ctypes.c_uint32),
        ("floor", ctypes.c_uint32),
        ("credit_ns", ctypes.c_int64),
        ("used_ns", ctypes.c_uint64),
        ("last_active_ns", ctypes.c_uint64),
        ("waiting", ctypes.c_uint32),
        ("holds", ctypes.c_uint32),
        ("registered_ns", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 8),
    ]


class VgpuSched(ctypes.Structure):
    """struct vgpu_sched: the scheduling region of one physical GPU (the broker writes it)."""

    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("entry_capacity", ctypes.c_uint32),
        ("uuid", ctypes.c_char * SCHED_UUID_LEN),
        ("grant", ctypes.c_uint32),
        ("doorbell", ctypes.c_uint32),
        ("grant_ns", ctypes.c_uint64),
        ("broker_beat_ns", ctypes.c_uint64),
        ("broker_pid", ctypes.c_uint32),
        ("contended", ctypes.c_uint32),
        ("present", ctypes.c_uint32 * 3),
        ("active_mask", ctypes.c_uint32),
        ("handoffs", ctypes.c_uint64),
        ("revocations", ctypes.c_uint64),
        ("active", ctypes.c_uint32),
        ("broker_epoch", ctypes.c_uint32),
        ("wake_epoch", ctypes.c_uint32),
        ("pad3", ctypes.c_uint32),
        ("reserved", ctypes.c_uint64 * 10),
        ("entries", VgpuSchedEntry * SCHED_ENTRIES),
    ]


class VgpuSchedReq(ctypes.Structure):
    """struct vgpu_sched_req: one slice's requests and reports on one GPU (its own file)."""

    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("share", ctypes.c_uint32),
        ("priority", ctypes.c_uint32),
        ("policy", ctypes.c_uint32),
        ("floor", ctypes.c_uint32),
        ("want", ctypes.c_uint32),
        ("owner", ctypes.c_uint32),
        ("want_ns", ctypes.c_uint64),
        ("owner_seq", ctypes.c_uint32),
        ("release_seq", ctypes.c_uint32),
        ("release_ns", ctypes.c_uint64),
        ("drain_seq", ctypes.c_uint32),
        ("yield_seq", ctypes.c_uint32),
        ("drain_ns", ctypes.c_uint64),
        ("idle_ns", ctypes.c_uint64),
        ("active_ns", ctypes.c_uint64),
        ("idle_since", ctypes.c_uint64),
        ("start_ns", ctypes.c_uint64),
        ("start_seq", ctypes.c_uint32),
        ("pad2", ctypes.c_uint32),
        ("wake", ctypes.c_uint32),
        ("pad3", ctypes.c_uint32),
        ("launch_ns", ctypes.c_uint64),
        ("launch_seq", ctypes.c_uint32),
        ("pad4", ctypes.c_uint32),
        ("turn_ns", ctypes.c_uint64),
        ("turn_seq", ctypes.c_uint32),
        ("pad5", ctypes.c_uint32),
        ("reserved", ctypes.c_uint64 * 11),
    ]


SCHED_SIZE = ctypes.sizeof(VgpuSched)
REQ_SIZE = ctypes.sizeof(VgpuSchedReq)

#: What a reader checks before it trusts each file: VGPU_SCHED_CHECKS and
#: VGPU_SCHED_REQ_CHECKS of vgpu_sched.h, as data (arbiter.files.header_checks).
SCHED_CHECKS: Checks = (("magic", SCHED_MAGIC), ("version", SCHED_VERSION),
                        ("size", SCHED_SIZE), ("entry_capacity", SCHED_ENTRIES))
REQ_CHECKS: Checks = (("magic", SCHED_REQ_MAGIC), ("version", SCHED_VERSION),
                      ("size", REQ_SIZE))
ENTRY_SIZE = ctypes.sizeof(VgpuSchedEntry)
_ENTRIES_OFFSET: int = VgpuSched.entries.offset
_NATIVE: dict[Any, str] = {ctypes.c_uint32: "I", ctypes.c_uint64: "Q", ctypes.c_int64: "q"}


# -- summaries (pure) -----------------------------------------------------------


@dataclass(frozen=True)
class EntrySummary:
    """One slice's entry as the metrics see it (times in ns, CLOCK_MONOTONIC)."""

    index: int
    key: int
    share: int
    priority: int
    policy: int
    floor: int
    used_ns: int
    last_active_ns: int
    credit_ns: int
    waiting: int
    holds: int


@dataclass(frozen=True)
class SchedSummary:
    """A GPU's scheduling region at one moment: its slices and who holds the token.

    holder is the key of the slice the broker granted the token to, None when
    nobody holds it or no broker serves the GPU (its heartbeat is older than
    BROKER_DEAD_NS); broker_pid is the broker's pid, 0 when none serves it.
    """

    uuid: str
    handoffs: int
    revocations: int
    holder: int | None
    broker_pid: int
    entries: tuple[EntrySummary, ...]

    def used_ns(self, key: int) -> int | None:
        """GPU time charged to the slice with this key, None when it has no entry."""
        if key:
            for e in self.entries:
                if e.key == key:
                    return e.used_ns
        return None


def summarize(raw: VgpuSched, now_ns: int) -> SchedSummary:
    """What the metrics need from a snapshot of a scheduling region (pure: state in).

    now_ns is CLOCK_MONOTONIC (time.monotonic_ns()), the clock libvgpu writes:
    it decides whether the token's lease has lapsed.
    """
    entries = tuple(
        EntrySummary(index=i, key=e.key, share=e.share, priority=e.priority, policy=e.policy,
                     floor=e.floor, used_ns=e.used_ns, last_active_ns=e.last_active_ns,
                     credit_ns=e.credit_ns, waiting=e.waiting, holds=e.holds)
        for i, e in enumerate(raw.entries) if e.key)
    alive = raw.broker_beat_ns != 0 and now_ns - raw.broker_beat_ns < BROKER_DEAD_NS
    holder: int | None = None
    slot = (raw.grant & _GRANT_ENTRY_MASK) - 1
    if alive and raw.grant and 0 <= slot < SCHED_ENTRIES and raw.entries[slot].key:
        holder = raw.entries[slot].key
    return SchedSummary(uuid=raw.uuid.decode(errors="replace"), handoffs=raw.handoffs,
                        revocations=raw.revocations, holder=holder,
                        broker_pid=raw.broker_pid if alive else 0, entries=entries)


def slice_gpu_ns(vgpus: Iterable[tuple[str, int]],
                 summaries: Mapping[str, SchedSummary]) -> list[int | None]:
    """GPU time charged to each vGPU of a slice, given as (GPU uuid, slice key) pairs.

    None where the GPU has no readable region or the slice no entry in it (no
    process of the slice has launched work there yet, or the key is 0).
    """
    out: list[int | None] = []
    for uuid, key in vgpus:
        summary = summaries.get(uuid)
        out.append(summary.used_ns(key) if summary is not None else None)
    return out


# -- files -----------------------------------------------------------------------


def _header_problem(data: bytes, file_size: int, uuid: bytes) -> str | None:
    """Why the first bytes of a file are not a whole scheduling region of GPU uuid, or None."""
    if file_size < SCHED_SIZE:
        return f"truncated: {file_size} bytes, expected {SCHED_SIZE}"
    problem = first_problem(field_reader(VgpuSched, data), SCHED_CHECKS, "scheduling region")
    if problem is not None:
        return problem
    off = VgpuSched.uuid.offset
    found = data[off : off + SCHED_UUID_LEN].split(b"\0", 1)[0]
    if uuid and found != uuid:
        return f"made for GPU {found.decode(errors='replace')!r}, not {uuid.decode()!r}"
    return None


def _file_problem(path: Path, uuid: bytes) -> str | None:
    """Why path is not a whole scheduling region of GPU uuid (None: it is one)."""
    try:
        # Every container of the GPU has it: never wait on a lease one of them took.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return "missing"
    except BlockingIOError:
        return LEASED
    except OSError as e:
        return e.strerror or str(e)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        return _header_problem(os.pread(fd, _ENTRIES_OFFSET, 0), st.st_size, uuid)
    except OSError as e:
        return e.strerror or str(e)
    finally:
        os.close(fd)


def _write_temp(path: Path, uuid: bytes, mode: int) -> str:
    """A whole new region under a temporary name next to path: zeros, header, magic last."""
    header = VgpuSched()
    magic = fill(header, SCHED_CHECKS)  # all but magic, which is written last, below
    header.uuid = uuid
    try:
        fd, tmp = open_beside(path)
    except OSError as e:
        raise SchedError(path, "create", e.strerror or str(e)) from e
    try:
        try:
            os.fchmod(fd, mode)  # not subject to the umask, unlike open()
            # Every byte is written (no sparse holes): a full tmpfs fails here, not with
            # a SIGBUS in a container process that touches an entry later.
            data = bytes(header)
            written = 0
            while written < len(data):
                written += os.pwrite(fd, data[written:], written)
            os.pwrite(fd, struct.pack("I", magic), VgpuSched.magic.offset)
        finally:
            os.close(fd)
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise SchedError(path, "create", e.strerror or str(e)) from e
    return tmp


def create_sched(path: str | Path, uuid: str, *, mode: int = SCHED_FILE_MODE) -> bool:
    """Make GPU uuid's scheduling region at path, atomically; True when made, False when kept.

    A whole region of this version for this GPU is kept as it is: running
    containers have it bind-mounted, so its inode must outlive a restart of
    vgpud (only a mode that differs is corrected, in place). Anything else at
    path (truncated, another version, another GPU's, half made) is replaced,
    with a warning. A new file is written under a temporary name, magic last,
    then linked into place: nobody ever maps it half made.
    """
    path = Path(path)
    uuid_bytes = uuid.encode()
    if len(uuid_bytes) >= SCHED_UUID_LEN or b"\0" in uuid_bytes:
        raise ValueError(f"uuid {uuid!r} is not a string of under {SCHED_UUID_LEN} bytes")
    problem = _file_problem(path, uuid_bytes)
    if problem == LEASED:
        # Leased, so in use by a container: kept (its next check reads it).
        log.warning("keeping scheduling region %s unread: %s", path, problem)
    if problem is None or problem == LEASED:
        _keep_mode(path, mode)
        return False
    tmp = _write_temp(path, uuid_bytes, mode)
    try:
        if problem == "missing":
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                # Made meanwhile (a standalone libvgpu naming this directory): keep a good one.
                problem = _file_problem(path, uuid_bytes)
                if problem is None:
                    _keep_mode(path, mode)
                    return False
        log.warning("replacing scheduling region %s: %s", path, problem)
        os.replace(tmp, path)
        return True
    except OSError as e:
        raise SchedError(path, "create", e.strerror or str(e)) from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _keep_mode(path: Path, mode: int) -> None:
    """Give a kept file the mode it must have (same inode); processes' mappings stay."""
    try:
        if stat.S_IMODE(path.stat().st_mode) != mode:
            log.warning("setting mode %o on scheduling region %s", mode, path)
            os.chmod(path, mode)
    except OSError as e:
        raise SchedError(path, "set the mode of", e.strerror or str(e)) from e


def usable_name(uuid: str) -> bool:
    """Whether uuid can name files in the scheduling directory (no path, no dot file)."""
    return bool(uuid) and "/" not in uuid and not uuid.startswith(".") and "\0" not in uuid


def prepare_sched_dir(root: str | Path, uuids: Iterable[str], *,
                      mode: int = SCHED_FILE_MODE) -> dict[str, Path]:
    """Make root (mode 0755 when new) and a scheduling region root/<uuid> for every GPU.

    Returns the file of each GPU by UUID. A GPU without a UUID that can name a
    file gets none (its slices then schedule alone), with a warning. Files of
    GPUs no longer in the inventory are left alone: they cost nothing and a
    container may still have one mounted.
    """
    root = Path(root)
    if not root.is_dir():
        try:
            root.mkdir(parents=True, exist_ok=True)
            os.chmod(root, SCHED_DIR_MODE)
        except OSError as e:
            raise SchedError(root, "prepare directory for", e.strerror or str(e)) from e
    out: dict[str, Path] = {}
    for uuid in uuids:
        if not usable_name(uuid):
            log.warning("GPU UUID %r cannot name a file: no scheduling region for it", uuid)
            continue
        path = root / uuid
        if create_sched(path, uuid, mode=mode):
            log.info("made scheduling region %s", path)
        out[uuid] = path
    return out


class Sched:
    """An open scheduling region, read-only: header values and snapshots of its entries."""

    def __init__(self, path: Path, mm: mmap.mmap) -> None:
        self.path = path
        self._mm = mm

    def _load(self, fmt: str, off: int) -> int:
        value: int = struct.unpack_from(fmt, self._mm, off)[0]
        return value

    @property
    def uuid(self) -> str:
        """The GPU's UUID, "" when the file names the GPU by ordinal."""
        off = VgpuSched.uuid.offset
        return self._mm[off : off + SCHED_UUID_LEN].split(b"\0", 1)[0].decode(errors="replace")

    @property
    def handoffs(self) -> int:
        """Times the token changed holder."""
        return self._load("Q", VgpuSched.handoffs.offset)

    def snapshot(self) -> VgpuSched:
        """A copy of the live region, every field loaded whole (never torn); free entries zero."""
        mm = self._mm
        out = VgpuSched()
        for name, off, fmt in _HEADER_SCALARS:
            setattr(out, name, struct.unpack_from(fmt, mm, off)[0])
        off = VgpuSched.uuid.offset
        out.uuid = bytes(mm[off : off + SCHED_UUID_LEN]).split(b"\0", 1)[0]
        off = VgpuSched.present.offset
        for j in range(len(out.present)):
            out.present[j] = struct.unpack_from("I", mm, off + 4 * j)[0]
        for i in range(SCHED_ENTRIES):
            base = _ENTRIES_OFFSET + i * ENTRY_SIZE
            if not self._load("Q", base + VgpuSchedEntry.key.offset):
                continue  # free: nothing to read
            entry = out.entries[i]
            for name, off, fmt in _ENTRY_SCALARS:
                setattr(entry, name, struct.unpack_from(fmt, mm, base + off)[0])
        return out

    def summary(self, now_ns: int) -> SchedSummary:
        """summarize() of a snapshot taken now."""
        return summarize(self.snapshot(), now_ns)

    def close(self) -> None:
        """Unmap the region."""
        self._mm.close()

    def __enter__(self) -> Sched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Sched({str(self.path)!r})"


def _scalars(cls: type[ctypes.Structure]) -> tuple[tuple[str, int, str], ...]:
    """(name, offset, native struct format) of each 32/64-bit integer field of cls."""
    out = []
    for f in cls._fields_:
        fmt = _NATIVE.get(f[1])
        if fmt is not None:
            out.append((f[0], getattr(cls, f[0]).offset, fmt))
    return tuple(out)


_HEADER_SCALARS = _scalars(VgpuSched)
_ENTRY_SCALARS = _scalars(VgpuSchedEntry)


def open_sched(path: str | Path) -> Sched:
    """Map a scheduling region read-only after checking that it is a whole, current one."""
    path = Path(path)
    fd = open_tenant_file(path, os.O_RDONLY, error=SchedError)
    try:
        size = os.fstat(fd).st_size
        if size < SCHED_SIZE:
            raise SchedError(path, "open", f"truncated: {size} bytes, expected {SCHED_SIZE}")
        mm = mmap.mmap(fd, SCHED_SIZE, mmap.MAP_SHARED, access=mmap.ACCESS_READ)
    except OSError as e:
        raise SchedError(path, "open", e.strerror or str(e)) from e
    finally:
        os.close(fd)
    problem = _header_problem(bytes(mm[:_ENTRIES_OFFSET]), SCHED_SIZE, b"")
    if problem is not None:
        mm.close()
        raise SchedError(path, "open", problem)
    return Sched(path, mm)


# -- the files of one slice on one GPU (vgpud's side) -------------------------------


@functools.lru_cache(maxsize=4096)  # pure; asked on every allocation, release and scrape
def slice_key_of(slice_id: str, ordinal: int) -> int:
    """The key that names vGPU `ordinal` of slice `slice_id` in its GPU's scheduling files.

    Derived, not stored: vgpud never needs to read it back from a file a tenant can
    write (the region holds a copy for libvgpu, which only finds its own files with it).
    """
    digest = hashlib.sha256(f"{slice_id}/{ordinal}".encode()).digest()
    return int.from_bytes(digest[:8], "little") | 1


def conf_text(share: int, priority: int, policy: int, floor: int) -> str:
    """A slice's settings as the broker reads them (vgpu_sched.h)."""
    return f"share={share} priority={priority} policy={policy} floor={floor}\n"


def slice_file_name(uuid: str, key: int, suffix: str) -> str:
    """The name of a slice's .req or .conf (`suffix`) in the scheduling directory."""
    return f"{uuid}.{key:016x}.{suffix}"


def req_path(root: str | Path, uuid: str, key: int) -> Path:
    """The .req of slice key on GPU uuid: the slice's own, mounted read-write in its container."""
    return Path(root) / slice_file_name(uuid, key, "req")


def _whole_req(path: Path, key: int) -> bool:
    """Whether path is a whole .req of slice key; SchedError (busy) when its container's
    lease holds it: then it is in use, and kept."""
    try:
        fd = open_tenant_file(path, os.O_RDONLY | os.O_NOFOLLOW, error=SchedError)
    except SchedError as e:
        if e.busy:
            raise
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        data = os.pread(fd, REQ_SIZE, 0)
    finally:
        os.close(fd)
    if len(data) < REQ_SIZE:
        return False
    read = field_reader(VgpuSchedReq, data)
    return first_problem(read, REQ_CHECKS, "request file") is None and read("key") == key


def _replace(path: Path, data: bytes, mode: int) -> None:
    """Write data to path under a temporary name and rename it into place."""
    write_whole(path, data, mode, how="replace")


def req_bytes(key: int, *, share: int, priority: int, policy: int, floor: int) -> bytes:
    """A slice's .req, whole (magic included: it is written beside and then linked, or into
    a directory nothing reads yet)."""
    raw = VgpuSchedReq()
    magic = fill(raw, REQ_CHECKS)
    raw.key = key
    raw.share, raw.priority, raw.policy, raw.floor = share, priority, policy, floor
    raw.magic = magic
    return bytes(raw)


def new_slice_file_ops(root: str, home: str, uuid: str, key: int, *,
                       share: int, priority: int, policy: int, floor: int,
                       bind: bool) -> list[fileops.Op]:
    """The operations that make a new slice's .req in `home` (its directory, made just now
    and empty: written at its name, kept open), name it in root (a bind mount where home
    is a filesystem of its own, `bind`, else a hard link) and write its .conf beside
    (renamed into place: the broker may read it at once). SchedError for an unusable
    GPU UUID. The paths are str, joined as such: this runs on every Allocate."""
    if not usable_name(uuid):
        raise SchedError(Path(root) / uuid, "write the slice files of", "not a usable GPU UUID")
    name = slice_file_name(uuid, key, "req")
    own, at = f"{home}/{name}", f"{root}/{name}"
    conf = f"{root}/{slice_file_name(uuid, key, 'conf')}"
    return [
        fileops.write_at(own, req_bytes(key, share=share, priority=priority, policy=policy,
                                        floor=floor), REQ_FILE_MODE, keep=True),
        fileops.mknod_bind(at, own, REQ_FILE_MODE) if bind else fileops.link(at, own),
        fileops.write_beside(conf, temp_prefix(conf),
                             conf_text(share, priority, policy, floor).encode(), CONF_FILE_MODE),
    ]


def write_slice_files(root: str | Path, uuid: str, key: int, *, share: int, priority: int,
                      policy: int, floor: int, home: Path | None = None) -> None:
    """Make (or keep) a slice's .req on GPU uuid and write its .conf, atomically.

    A whole .req of this slice is kept (same inode: a running container has it
    mounted); anything else at its name is replaced. With `home` (the slice's own
    directory, its size-bounded tmpfs: arbiter.files.slicefs) the .req is made there and is
    at its name in root by a bind mount (a hard link where both are one filesystem);
    a whole .req already in root with none in home (an older vgpud's) is kept as it is.
    The .conf is rewritten: the broker sees new settings within its rescan period (20 ms).
    (A new slice's files are made in one call instead: arbiter.files.slice_dirs.)
    """
    root = Path(root)
    if not usable_name(uuid):
        raise SchedError(root / uuid, "write the slice files of", "not a usable GPU UUID")
    req = req_path(root, uuid, key)
    busy: SchedError | None = None
    try:
        own = home / req.name if home is not None else None
        if own is not None and (own.exists() or not req.exists()):
            req, at = own, req
        else:
            at = None
        try:
            whole = _whole_req(req, key)
        except SchedError as e:
            busy, whole = e, True  # leased by its container: in use, kept; said below
        if not whole:
            _replace(req, req_bytes(key, share=share, priority=priority, policy=policy,
                                    floor=floor), REQ_FILE_MODE)
        if at is not None:
            _link_req(req, at)
        conf = root / slice_file_name(uuid, key, "conf")
        text = conf_text(share, priority, policy, floor).encode()
        try:
            same = conf.read_bytes() == text
        except OSError:
            same = False
        if not same:
            _replace(conf, text, CONF_FILE_MODE)
    except OSError as e:
        raise SchedError(req, "write", e.strerror or str(e)) from e
    if busy is not None:
        raise busy


def _link_req(own: Path, at: Path) -> None:
    """Make `at` name the file `own`: kept when it does; else a hard link, or a bind mount
    where they are on two filesystems (own on its slice's tmpfs)."""
    if _clear_for(own, at):
        return
    try:
        os.link(own, at)
        return
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
    # The mount point: an empty regular file (one mknod, not an open and a close).
    os.mknod(at, stat.S_IFREG | REQ_FILE_MODE)
    try:
        bind_file(own, at)
    except OSError:
        os.unlink(at)
        raise


def _clear_for(own: Path, at: Path) -> bool:
    """Unmount and delete whatever is at `at`; True (and nothing done) when it is the file
    `own` already."""
    try:
        a, b = os.stat(own), os.stat(at)
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            return True
        detach(at)
        os.unlink(at)
    except FileNotFoundError:
        pass
    return False


def slice_file_keys(root: str | Path) -> set[int]:
    """Keys of every slice that has files in root."""
    out: set[int] = set()
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for name in names:
        parts = name.rsplit(".", 2)
        if len(parts) == 3 and parts[2] in ("req", "conf") and len(parts[1]) == 16:
            with contextlib.suppress(ValueError):
                out.add(int(parts[1], 16))
    return out


def remove_slice_files(root: str | Path, keys: Iterable[int]) -> None:
    """Delete the .conf and .req of these keys on whichever GPUs they are (a listing)."""
    wanted = {f"{k:016x}" for k in keys}
    try:
        names = os.listdir(root)
    except OSError:
        return
    doomed = []
    for name in names:
        parts = name.rsplit(".", 2)
        if len(parts) == 3 and parts[1] in wanted and parts[2] in ("req", "conf"):
            doomed.append(name)
    _remove_names(root, doomed)


def _remove_names(root: str | Path, names: list[str]) -> None:
    """Unlink these slice files of root, every .conf first (the broker stops serving the
    slice), each .req unmounted first (bind-mounted from its slice's tmpfs)."""
    for name in sorted(names, key=lambda n: not n.endswith(".conf")):
        path = os.path.join(root, name)
        with contextlib.suppress(FileNotFoundError):
            if name.endswith(".req"):
                detach(Path(path))
            os.unlink(path)
