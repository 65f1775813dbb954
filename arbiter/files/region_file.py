# SPDX-License-Identifier: Apache-2.0
"""Slice region files: a ctypes mirror of struct vgpu_region and struct vgpu_usage
(libvgpu/include/vgpu_region.h).

The C header is the one definition of the layout; tests/arbiter/files/test_region_file.py
proves that this mirror agrees with it field by field.

Per vGPU, `vgpu<i>` holds the limits and the slice's identity: the arbiter is its
only writer (containers mount it read-only). Live fields are read and written with
single aligned native loads and stores through the mmap (struct's native formats
copy 4 or 8 bytes at once; the "=" / "<" formats would copy byte by byte and tear),
so a running libvgpu never sees half a value. `vgpu<i>.usage` holds one slot per
process and is written by the slice's own processes, so it is tenant data: read
with pread (a file its tenant shrinks reads short, it cannot fault us) and every
field bounded.
"""
from __future__ import annotations

import ctypes
import enum
import errno
import mmap
import os
import secrets
import stat
import struct
from pathlib import Path
from typing import NamedTuple

from arbiter.errors import RegionError
from arbiter.files.atomic import write_whole
from arbiter.files.header_checks import Checks, field_reader, fill, first_problem
from arbiter.files.leases import open_tenant_file
from arbiter.proc import ProcessView
from arbiter.quantity import COMPUTE_MAX, COMPUTE_MIN

__all__ = [
    "FLAG_ARBITER",
    "REGION_CHECKS",
    "REGION_MAGIC",
    "REGION_SLOTS",
    "REGION_UUID_LEN",
    "REGION_VERSION",
    "SLOT_REAPING",
    "USAGE_CHECKS",
    "USAGE_MAGIC",
    "Policy",
    "Priority",
    "ProcessUsage",
    "Region",
    "VgSlot",
    "VgpuRegion",
    "VgpuUsage",
    "create_region",
    "create_usage",
    "new_slice_key",
    "open_region",
    "read_slots",
    "region_bytes",
    "usage_bytes",
    "usage_path_of",
]

REGION_MAGIC = 0x55504756  # "VGPU" little-endian
USAGE_MAGIC = 0x53554756  # "VGUS" little-endian
REGION_VERSION = 2
USAGE_SUFFIX = ".usage"
REGION_SLOTS = 1024
REGION_UUID_LEN = 96
FLAG_ARBITER = 0x1  # made by vgpud: env vars never override it
SLOT_REAPING = 0x80000000  # slot pid field while a reaper clears the slot

_U32_MAX = (1 << 32) - 1
_U64_MAX = (1 << 64) - 1


class Priority(enum.IntEnum):
    """enum vgpu_priority."""

    LOW = 0
    NORMAL = 1
    HIGH = 2


class Policy(enum.IntEnum):
    """enum vgpu_policy."""

    FIXED = 0
    BURST = 1


class VgSlot(ctypes.Structure):
    """struct vg_slot (libvgpu/common/vg_slots.h): one process's usage, 64 bytes."""

    _fields_ = [
        ("pid", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("start_time", ctypes.c_uint64),
        ("used", ctypes.c_uint64),
        ("busy_ns", ctypes.c_uint64),
        ("last_active_ns", ctypes.c_uint64),
        ("pid_ns", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 2),
    ]


class VgpuRegion(ctypes.Structure):
    """struct vgpu_region (libvgpu/include/vgpu_region.h): one vGPU of a slice."""

    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("uuid", ctypes.c_char * REGION_UUID_LEN),
        ("device_index", ctypes.c_uint32),
        ("slot_capacity", ctypes.c_uint32),
        ("memory_limit", ctypes.c_uint64),
        ("context_reserve", ctypes.c_uint64),
        ("compute_share", ctypes.c_uint32),
        ("priority", ctypes.c_uint32),
        ("policy", ctypes.c_uint32),
        ("priority_floor", ctypes.c_uint32),
        ("generation", ctypes.c_uint64),
        ("reserved_hw", ctypes.c_uint32),
        ("reserved32", ctypes.c_uint32),
        ("slice_key", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 23),
    ]


class VgpuUsage(ctypes.Structure):
    """struct vgpu_usage (libvgpu/include/vgpu_region.h): the slots of a vGPU's processes."""

    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("slot_capacity", ctypes.c_uint32),
        ("slot_high_water", ctypes.c_uint32),
        ("reserved32", ctypes.c_uint32),
        ("reserved", ctypes.c_uint64 * 5),
        ("slots", VgSlot * REGION_SLOTS),
    ]


REGION_SIZE = ctypes.sizeof(VgpuRegion)
USAGE_SIZE = ctypes.sizeof(VgpuUsage)

#: What a reader checks before it trusts each file: VGPU_REGION_CHECKS and
#: VGPU_USAGE_CHECKS of vgpu_region.h, as data (arbiter.files.header_checks).
REGION_CHECKS: Checks = (("magic", REGION_MAGIC), ("version", REGION_VERSION),
                         ("size", REGION_SIZE), ("slot_capacity", REGION_SLOTS))
USAGE_CHECKS: Checks = (("magic", USAGE_MAGIC), ("version", REGION_VERSION),
                        ("size", USAGE_SIZE), ("slot_capacity", REGION_SLOTS))
SLOT_SIZE = ctypes.sizeof(VgSlot)
_SLOTS_OFFSET: int = VgpuUsage.slots.offset


def usage_path_of(region_path: str | Path) -> Path:
    """The usage file beside a region file (`vgpu<i>` -> `vgpu<i>.usage`)."""
    region_path = Path(region_path)
    return region_path.with_name(region_path.name + USAGE_SUFFIX)


def _field(cls: type[ctypes.Structure], name: str) -> tuple[int, str]:
    """Offset and native struct format of a scalar field of a mirror class."""
    descr = getattr(cls, name)
    fmt = {4: "I", 8: "Q"}[descr.size]
    return descr.offset, fmt


class ProcessUsage(NamedTuple):
    """A live process of the slice and the device memory charged to it."""

    pid: int
    used: int


def _owned(slot_pid: int) -> bool:
    """A slot's pid field names its owner: not free (0), not a reaper's mark."""
    return slot_pid != 0 and not slot_pid & SLOT_REAPING


def _check_limits(
    memory_limit: int | None = None,
    compute_share: int | None = None,
    priority: int | None = None,
    policy: int | None = None,
    priority_floor: int | None = None,
    context_reserve: int | None = None,
) -> None:
    """Raise ValueError naming the first limit that the region cannot hold."""
    if memory_limit is not None and not 0 < memory_limit <= _U64_MAX:
        raise ValueError(f"memory_limit {memory_limit} is not a positive 64-bit byte count")
    if compute_share is not None and not COMPUTE_MIN <= compute_share <= COMPUTE_MAX:
        raise ValueError(f"compute_share {compute_share} is outside {COMPUTE_MIN}..{COMPUTE_MAX}")
    if priority is not None and priority not in Priority.__members__.values():
        raise ValueError(f"priority {priority} is not one of {[int(p) for p in Priority]}")
    if policy is not None and policy not in Policy.__members__.values():
        raise ValueError(f"policy {policy} is not one of {[int(p) for p in Policy]}")
    if priority_floor is not None and not 0 <= priority_floor <= 100:
        raise ValueError(f"priority_floor {priority_floor} is outside 0..100")
    if context_reserve is not None and not 0 <= context_reserve <= _U64_MAX:
        raise ValueError(f"context_reserve {context_reserve} is not a 64-bit byte count")


def new_slice_key() -> int:
    """A random non-zero slice key (0 means "no key" to libvgpu)."""
    return secrets.randbits(64) | 1


def create_region(
    path: str | Path,
    *,
    uuid: str,
    device_index: int,
    memory_limit: int,
    compute_share: int = 100,
    priority: Priority = Priority.NORMAL,
    policy: Policy = Policy.FIXED,
    priority_floor: int = 0,
    context_reserve: int = 0,
    arbiter: bool = True,
    mode: int = 0o644,
    usage_mode: int = 0o666,
    replace: bool = False,
    slice_key: int | None = None,
) -> Path:
    """Make a region file atomically (nobody ever sees it half made), and its usage file
    beside it unless that exists (a container may have it mounted: it keeps its inode).

    Each file is written under a temporary name in the same directory, magic
    last, then linked into place; an existing region is an error unless replace.
    slice_key names the slice in the GPU's scheduling region (arbiter.files.sched_files);
    None draws a random non-zero one. (A new slice's files are made in one call instead:
    arbiter.files.slice_dirs, with region_bytes and usage_bytes.)
    """
    path = Path(path)
    data, magic = region_bytes(
        uuid=uuid, device_index=device_index, memory_limit=memory_limit,
        compute_share=compute_share, priority=priority, policy=policy,
        priority_floor=priority_floor, context_reserve=context_reserve, arbiter=arbiter,
        slice_key=new_slice_key() if slice_key is None else slice_key)
    _write_whole(path, data, magic, mode, replace)
    create_usage(usage_path_of(path), mode=usage_mode)
    return path


def region_bytes(*, uuid: str, device_index: int, memory_limit: int, compute_share: int,
                 priority: Priority, policy: Policy, priority_floor: int,
                 context_reserve: int, arbiter: bool, slice_key: int,
                 ) -> tuple[bytes, tuple[int, int]]:
    """A region file's bytes, all but its magic, and (offset, magic): written last, it says
    the file is whole. ValueError names a limit or identity field out of range."""
    _check_limits(memory_limit, compute_share, priority, policy, priority_floor, context_reserve)
    if not 0 < slice_key <= _U64_MAX:
        raise ValueError(f"slice_key {slice_key} is not a non-zero 64-bit value")
    uuid_bytes = uuid.encode()
    if len(uuid_bytes) >= REGION_UUID_LEN or b"\0" in uuid_bytes:
        raise ValueError(f"uuid {uuid!r} is not a string of under {REGION_UUID_LEN} bytes")
    if not 0 <= device_index <= _U32_MAX:
        raise ValueError(f"device_index {device_index} is outside 0..{_U32_MAX}")

    header = VgpuRegion()
    magic = fill(header, REGION_CHECKS)  # all but magic, which is written last
    header.flags = FLAG_ARBITER if arbiter else 0
    header.uuid = uuid_bytes
    header.device_index = device_index
    header.memory_limit = memory_limit
    header.context_reserve = context_reserve
    header.compute_share = compute_share
    header.priority = int(priority)
    header.policy = int(policy)
    header.priority_floor = priority_floor
    header.slice_key = slice_key
    return bytes(header), (VgpuRegion.magic.offset, magic)


def usage_bytes() -> tuple[bytes, tuple[int, int]]:
    """An empty usage file's bytes, all but its magic, and (offset, magic)."""
    return _EMPTY_USAGE


def _empty_usage() -> tuple[bytes, tuple[int, int]]:
    usage = VgpuUsage()
    magic = fill(usage, USAGE_CHECKS)  # all but magic, which is written last
    return bytes(usage), (VgpuUsage.magic.offset, magic)


_EMPTY_USAGE = _empty_usage()  # the same for every vGPU: made once


def create_usage(path: str | Path, *, mode: int = 0o666) -> bool:
    """Make an empty usage file unless one is there (it keeps its inode); True if made."""
    path = Path(path)
    if path.exists():
        return False
    data, magic = usage_bytes()
    try:
        _write_whole(path, data, magic, mode, replace=False)
    except RegionError as e:
        if e.reason == "it already exists":
            return False
        raise
    return True


def _write_whole(path: Path, data: bytes, magic: tuple[int, int], mode: int,
                 replace: bool) -> None:
    """Write data under a temporary name, magic last, then link it into place."""
    offset, word = magic
    try:
        # No fsync: region files live on tmpfs (/run) and vgpud remakes them from its
        # store at start; the store is what must survive a crash.
        write_whole(path, data, mode, last=(offset, struct.pack("I", word)),
                    how="replace" if replace else "new")
    except OSError as e:
        reason = "it already exists" if e.errno == errno.EEXIST else (e.strerror or str(e))
        raise RegionError(path, "create", reason) from e


class Region:
    """An open region file; properties read the live values on every access."""

    def __init__(self, path: Path, mm: mmap.mmap, writable: bool, proc: Path) -> None:
        self.path = path
        self.writable = writable
        self._mm = mm
        self._proc = proc

    # -- raw access ------------------------------------------------------------

    def _load(self, name: str) -> int:
        off, fmt = _field(VgpuRegion, name)
        value: int = struct.unpack_from(fmt, self._mm, off)[0]
        return value

    def _store(self, name: str, value: int) -> None:
        off, fmt = _field(VgpuRegion, name)
        struct.pack_into(fmt, self._mm, off, value)

    @property
    def usage_path(self) -> Path:
        """The vGPU's usage file (written by the slice's processes)."""
        return usage_path_of(self.path)

    def slots(self) -> list[tuple[int, int, int, int]]:
        """(pid, start_time, used, pid_ns) of each used slot of the usage file.

        Tenant data: read with pread, the header checked, the high water bounded, a
        file that shrank reads short. Raises RegionError naming what is wrong."""
        return read_slots(self.usage_path)

    # -- header ----------------------------------------------------------------

    @property
    def flags(self) -> int:
        """VGPU_REGION_FLAG_* bits."""
        return self._load("flags")

    @property
    def arbiter(self) -> bool:
        """True when vgpud made the region (env vars never override it)."""
        return bool(self.flags & FLAG_ARBITER)

    @property
    def uuid(self) -> str:
        """Physical GPU UUID, "" when the GPU is named by ordinal."""
        off = VgpuRegion.uuid.offset
        raw = self._mm[off : off + REGION_UUID_LEN]
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    @property
    def device_index(self) -> int:
        """Physical GPU index (informational)."""
        return self._load("device_index")

    @property
    def memory_limit(self) -> int:
        """Bytes the slice may hold on this GPU."""
        return self._load("memory_limit")

    @property
    def context_reserve(self) -> int:
        """Bytes charged per CUDA context a process creates."""
        return self._load("context_reserve")

    @property
    def compute_share(self) -> int:
        """Guaranteed compute share, percent."""
        return self._load("compute_share")

    @property
    def priority(self) -> int:
        """Priority class (a Priority value)."""
        return self._load("priority")

    @property
    def policy(self) -> int:
        """Compute policy (a Policy value)."""
        return self._load("policy")

    @property
    def priority_floor(self) -> int:
        """Percent a lower priority keeps while preempted."""
        return self._load("priority_floor")

    @property
    def generation(self) -> int:
        """Bumped on every limit change."""
        return self._load("generation")

    @property
    def slice_key(self) -> int:
        """The slice's name in the GPU's scheduling region (arbiter.files.sched_files), never 0.

        Set once, by whoever makes the file; read-only to the slice's processes."""
        return self._load("slice_key")

    @property
    def slot_high_water(self) -> int:
        """Slots [0, high water) of the usage file have been used (bounded)."""
        return len(self.slots())

    def set_limits(
        self,
        *,
        memory_limit: int | None = None,
        compute_share: int | None = None,
        priority: Priority | None = None,
        policy: Policy | None = None,
        priority_floor: int | None = None,
        context_reserve: int | None = None,
    ) -> int:
        """Change the given limits in place for running processes; return the new generation."""
        if not self.writable:
            raise RegionError(self.path, "update", "it was opened read-only")
        _check_limits(memory_limit, compute_share, priority, policy, priority_floor,
                      context_reserve)
        changes = {
            "memory_limit": memory_limit,
            "compute_share": compute_share,
            "priority": priority,
            "policy": policy,
            "priority_floor": priority_floor,
            "context_reserve": context_reserve,
        }
        for name, value in changes.items():
            if value is not None:
                self._store(name, int(value))
        # Single writer (the arbiter): a plain read-increment-store is enough.
        generation = (self.generation + 1) & _U64_MAX
        self._store("generation", generation)
        return generation

    # -- usage -----------------------------------------------------------------

    def used_bytes(self, live_only: bool = True) -> int:
        """Device memory charged to the slice; live_only skips slots of dead processes."""
        total = 0
        view = ProcessView(self._proc)
        for pid, start, used, pid_ns in self.slots():
            if not live_only or (_owned(pid) and view.alive(pid, start, pid_ns)):
                total += used
        return min(total, _U64_MAX)

    def processes(self) -> list[ProcessUsage]:
        """The live processes that hold a slot, with their charged memory.

        pids are as this process's namespace numbers them: a container's processes
        seen from the host have their host pids. What a slot names is the tenant's
        word: attribution that acts on processes must not rest on it."""
        out = []
        view = ProcessView(self._proc)
        for pid, start, used, pid_ns in self.slots():
            visible = view.visible(pid, start, pid_ns) if _owned(pid) else 0
            if visible:
                out.append(ProcessUsage(visible, used))
        return out

    # -- lifetime --------------------------------------------------------------

    def close(self) -> None:
        """Unmap the region."""
        self._mm.close()

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Region({str(self.path)!r})"


_SLOT = struct.Struct("IIQQQQQ16x")  # pid, flags, start_time, used, busy_ns, last_active, pid_ns


def read_slots(path: str | Path) -> list[tuple[int, int, int, int]]:
    """(pid, start_time, used, pid_ns) of the used slots of a usage file, read by pread.

    Raises RegionError naming the first thing wrong: missing, short, bad header."""
    path = Path(path)
    fd = open_tenant_file(path, os.O_RDONLY | os.O_NOFOLLOW, verb="read")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RegionError(path, "read", "not a regular file")
        data = os.pread(fd, USAGE_SIZE, 0)
    except OSError as e:
        raise RegionError(path, "read", e.strerror or str(e)) from e
    finally:
        os.close(fd)
    if len(data) < _SLOTS_OFFSET:
        raise RegionError(path, "read", f"truncated: {len(data)} bytes, expected {USAGE_SIZE}")
    read = field_reader(VgpuUsage, data)
    problem = first_problem(read, USAGE_CHECKS, "vgpu usage file")
    if problem is not None:
        raise RegionError(path, "read", problem)
    high_water = read("slot_high_water")
    used = min(high_water, REGION_SLOTS, (len(data) - _SLOTS_OFFSET) // SLOT_SIZE)
    if used < min(high_water, REGION_SLOTS):
        raise RegionError(path, "read", f"truncated: {len(data)} bytes, expected {USAGE_SIZE}")
    out = []
    for i in range(used):
        pid, _flags, start, nbytes, _busy, _last, pid_ns = _SLOT.unpack_from(
            data, _SLOTS_OFFSET + i * SLOT_SIZE)
        out.append((pid, start, nbytes, pid_ns))
    return out


def open_region(path: str | Path, *, writable: bool = True, proc: str | Path = "/proc") -> Region:
    """Map a region file after checking that it is a whole, current vgpu region."""
    path = Path(path)
    # Its container can lease it (read-only mount or not): never wait on that.
    fd = open_tenant_file(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < REGION_SIZE:
            raise RegionError(path, "open", f"truncated: {size} bytes, expected {REGION_SIZE}")
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        mm = mmap.mmap(fd, REGION_SIZE, mmap.MAP_SHARED, access=access)
    except OSError as e:
        raise RegionError(path, "open", e.strerror or str(e)) from e
    finally:
        os.close(fd)
    try:
        _validate(path, mm)
    except BaseException:
        mm.close()
        raise
    return Region(path, mm, writable, Path(proc))


def _validate(path: Path, mm: mmap.mmap) -> None:
    """Raise RegionError naming what makes the mapped header unusable."""
    problem = first_problem(field_reader(VgpuRegion, mm), REGION_CHECKS, "vgpu region")
    if problem is not None:
        raise RegionError(path, "open", problem)
