# SPDX-License-Identifier: Apache-2.0
"""Region files: the ctypes mirror matches the C layout; create, open, update, bad files."""
from __future__ import annotations

import ctypes
import mmap
import os
import stat
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.c_layout import assert_fields, assert_size_and_alignment, read_layout

from arbiter.errors import RegionError, VgpuError
from arbiter.files import region_file as rg
from arbiter.files.region_file import Policy, Priority, VgpuRegion, VgpuUsage, VgSlot
from arbiter.proc import pid_alive, proc_start_time

GI = 1 << 30


@pytest.fixture(scope="module")
def c_layout() -> dict[str, Any]:
    """The layout as the C compiler sees it."""
    return read_layout(["vgpu_region.h", "vg_slots.h"], list(MIRRORS))


MIRRORS = {"vgpu_region": VgpuRegion, "vgpu_usage": VgpuUsage, "vg_slot": VgSlot}


@pytest.mark.parametrize("struct_name", MIRRORS)
def test_mirror_size_and_alignment(c_layout: dict[str, Any], struct_name: str) -> None:
    assert_size_and_alignment(c_layout, struct_name, MIRRORS[struct_name])


@pytest.mark.parametrize("struct_name", MIRRORS)
def test_mirror_fields(c_layout: dict[str, Any], struct_name: str) -> None:
    assert_fields(c_layout, struct_name, MIRRORS[struct_name])


def test_constants(c_layout: dict[str, Any]) -> None:
    """Every integer constant of the headers, with its Python twin."""
    assert c_layout["constants"] == {
        "VGPU_REGION_MAGIC": rg.REGION_MAGIC,
        "VGPU_USAGE_MAGIC": rg.USAGE_MAGIC,
        "VGPU_REGION_VERSION": rg.REGION_VERSION,
        "VGPU_REGION_SLOTS": rg.REGION_SLOTS,
        "VGPU_REGION_UUID_LEN": rg.REGION_UUID_LEN,
        "VGPU_REGION_FLAG_ARBITER": rg.FLAG_ARBITER,
        "VG_SLOT_REAPING": rg.SLOT_REAPING,
        # The bound on a tenant-written slot high water: libvgpu (vg_slots.c) and vgpud
        # (arbiter.files.region_file) must read the same slots of a usage file.
        "VG_SLOTS_MAX": rg.REGION_SLOTS,
        "VGPU_PRIORITY_LOW": Priority.LOW,
        "VGPU_PRIORITY_NORMAL": Priority.NORMAL,
        "VGPU_PRIORITY_HIGH": Priority.HIGH,
        "VGPU_POLICY_FIXED": Policy.FIXED,
        "VGPU_POLICY_BURST": Policy.BURST,
    }
    assert len(Priority) == 3 and len(Policy) == 2


# -- create / open / update ------------------------------------------------------


def make(path: Path, **kw: Any) -> Path:
    args: dict[str, Any] = {"uuid": "GPU-0f1e2d3c", "device_index": 3, "memory_limit": 2 * GI}
    args.update(kw)
    return rg.create_region(path, **args)


def test_create_then_open_reads_every_field(tmp_path: Path) -> None:
    path = make(tmp_path / "vgpu0", compute_share=30, priority=Priority.HIGH,
                policy=Policy.BURST, priority_floor=5, context_reserve=300 << 20)
    with rg.open_region(path) as region:
        assert region.uuid == "GPU-0f1e2d3c"
        assert region.device_index == 3
        assert region.memory_limit == 2 * GI
        assert region.compute_share == 30
        assert region.priority == Priority.HIGH
        assert region.policy == Policy.BURST
        assert region.priority_floor == 5
        assert region.context_reserve == 300 << 20
        assert region.generation == 0
        assert region.slot_high_water == 0
        assert region.arbiter is True
    raw = VgpuRegion.from_buffer_copy(path.read_bytes())
    assert (raw.magic, raw.version, raw.size, raw.slot_capacity) == (
        rg.REGION_MAGIC, rg.REGION_VERSION, ctypes.sizeof(VgpuRegion), rg.REGION_SLOTS)
    assert path.stat().st_size == ctypes.sizeof(VgpuRegion)


def test_create_defaults_and_standalone_flag(tmp_path: Path) -> None:
    path = make(tmp_path / "vgpu0", uuid="", arbiter=False)
    with rg.open_region(path) as region:
        assert (region.compute_share, region.priority, region.policy) == (
            100, Priority.NORMAL, Policy.FIXED)
        assert (region.uuid, region.flags, region.arbiter) == ("", 0, False)


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o666], ids=oct)
def test_create_mode_ignores_umask(tmp_path: Path, mode: int) -> None:
    old = os.umask(0o077)
    try:
        path = make(tmp_path / "vgpu0", mode=mode)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert sorted(os.listdir(tmp_path)) == ["vgpu0", "vgpu0.usage"]  # no temporary file left


def test_create_refuses_existing_file(tmp_path: Path) -> None:
    path = make(tmp_path / "vgpu0")
    with pytest.raises(RegionError, match=r"failed to create .*vgpu0: it already exists"):
        make(path, memory_limit=GI)
    assert rg.open_region(path).memory_limit == 2 * GI
    usage = rg.usage_path_of(path).stat().st_ino
    make(path, memory_limit=GI, replace=True)
    assert rg.open_region(path).memory_limit == GI
    assert sorted(os.listdir(tmp_path)) == ["vgpu0", "vgpu0.usage"]
    assert rg.usage_path_of(path).stat().st_ino == usage  # a container may have it mounted


def test_create_in_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(RegionError, match=r"failed to create region file .*nowhere/vgpu0"):
        make(tmp_path / "nowhere" / "vgpu0")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"memory_limit": 0}, "memory_limit 0"),
        ({"memory_limit": 1 << 64}, "memory_limit"),
        ({"compute_share": 1}, "compute_share 1 is outside 2..100"),
        ({"compute_share": 101}, "compute_share 101"),
        ({"priority": 7}, "priority 7"),
        ({"policy": 2}, "policy 2"),
        ({"priority_floor": 101}, "priority_floor 101"),
        ({"context_reserve": -1}, "context_reserve -1"),
        ({"uuid": "G" * 96}, "uuid"),
        ({"device_index": -1}, "device_index -1"),
    ],
    ids=lambda v: v if isinstance(v, str) else next(iter(v)),
)
def test_create_rejects_bad_limits(tmp_path: Path, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(tmp_path / "vgpu0", **kw)
    assert os.listdir(tmp_path) == []


def test_set_limits_is_seen_live_by_another_mapping(tmp_path: Path) -> None:
    path = make(tmp_path / "vgpu0")
    with rg.open_region(path) as writer, rg.open_region(path, writable=False) as reader:
        assert writer.set_limits(memory_limit=GI, compute_share=50) == 1
        assert (reader.memory_limit, reader.compute_share, reader.generation) == (GI, 50, 1)
        assert writer.set_limits(priority=Priority.LOW, policy=Policy.BURST,
                                 priority_floor=10, context_reserve=1 << 20) == 2
        assert (reader.priority, reader.policy, reader.priority_floor,
                reader.context_reserve, reader.memory_limit) == (
            Priority.LOW, Policy.BURST, 10, 1 << 20, GI)
        with pytest.raises(ValueError, match="compute_share 0"):
            writer.set_limits(compute_share=0)
        assert reader.generation == 2  # a rejected update changes nothing
        with pytest.raises(RegionError, match=r"failed to update .*opened read-only"):
            reader.set_limits(memory_limit=GI)
    assert rg.open_region(path).memory_limit == GI  # it is in the file, not only the mapping


def test_create_sets_a_random_nonzero_slice_key(tmp_path: Path) -> None:
    keys = set()
    for i in range(8):
        with rg.open_region(make(tmp_path / f"vgpu{i}")) as region:
            keys.add(region.slice_key)
    assert 0 not in keys and len(keys) == 8
    raw = VgpuRegion.from_buffer_copy((tmp_path / "vgpu0").read_bytes())
    assert raw.slice_key in keys and list(raw.reserved) == [0] * 23
    with rg.open_region(make(tmp_path / "given", slice_key=0x1234)) as region:
        assert region.slice_key == 0x1234
    with pytest.raises(ValueError, match="slice_key -1"):
        make(tmp_path / "bad", slice_key=-1)


def test_slice_key_survives_updates(tmp_path: Path) -> None:
    path = make(tmp_path / "vgpu0")
    with rg.open_region(path) as region:
        key = region.slice_key
        region.set_limits(compute_share=40, priority_floor=7, memory_limit=GI)
        assert region.slice_key == key
    with pytest.raises(ValueError, match="slice_key 0 is not a non-zero 64-bit value"):
        make(tmp_path / "nokey", slice_key=0)  # the slice's name is set once, by its maker


# -- bad files -----------------------------------------------------------------


def _patch(path: Path, field: str, value: int) -> None:
    descr = getattr(VgpuRegion, field)
    with path.open("r+b") as f:
        f.seek(descr.offset)
        f.write(struct.pack("I", value))


SIZE = ctypes.sizeof(VgpuRegion)
BAD_FILES = [
    ("empty", lambda p: p.write_bytes(b""), f"truncated: 0 bytes, expected {SIZE}"),
    ("truncated", lambda p: os.truncate(p, SIZE // 2), f"truncated: {SIZE // 2} bytes"),
    ("half-header", lambda p: os.truncate(p, 200), "truncated: 200 bytes"),
    ("zero-magic", lambda p: _patch(p, "magic", 0),
     "bad magic 0x00000000, expected 0x55504756 .not a vgpu region, or one still being made"),
    ("wrong-magic", lambda p: _patch(p, "magic", 0x12345678), "bad magic 0x12345678"),
    ("not-a-region", lambda p: p.write_bytes(b"hello" * SIZE), "bad magic"),
    ("newer-version", lambda p: _patch(p, "version", 3),
     "layout version 3, this vgpu reads version 2"),
    ("wrong-size", lambda p: _patch(p, "size", SIZE - 64),
     f"header size {SIZE - 64}, expected {SIZE}"),
    ("wrong-capacity", lambda p: _patch(p, "slot_capacity", 16), "slot capacity 16, expected 1024"),
    ("missing", lambda p: p.unlink(), "No such file or directory"),
    ("directory", lambda p: (p.unlink(), p.mkdir()), "Is a directory"),
]


@pytest.mark.parametrize(("damage", "reason"), [(d, r) for _, d, r in BAD_FILES],
                         ids=[i for i, _, _ in BAD_FILES])
def test_open_rejects_bad_file(tmp_path: Path, damage: Any, reason: str) -> None:
    path = make(tmp_path / "vgpu0")
    damage(path)
    with pytest.raises(RegionError, match=f"failed to open region file {path}: {reason}") as info:
        rg.open_region(path)
    assert info.value.path == path
    assert isinstance(info.value, VgpuError)


def test_open_tolerates_a_longer_file(tmp_path: Path) -> None:
    path = make(tmp_path / "vgpu0")
    os.truncate(path, SIZE + 4096)  # e.g. a writer that rounds up to pages
    with rg.open_region(path) as region:
        assert region.memory_limit == 2 * GI


# -- usage ---------------------------------------------------------------------


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_used_bytes_and_processes(tmp_path: Path) -> None:
    path = make(tmp_path / "vgpu0")
    me = os.getpid()
    start = proc_start_time(me)
    assert start > 0
    slots = [
        (me, start, 100),                   # live
        (me, start + 1, 200),               # pid recycled: another process's slot
        (_dead_pid(), 0, 400),              # gone
        (rg.SLOT_REAPING | me, 0, 800),      # being reaped
        (0, 0, 0),                          # free
        (1, 0, 1600),                       # init: alive, not ours (kill gives EPERM if not root)
    ]
    write_slots(rg.usage_path_of(path), slots)
    with rg.open_region(path, writable=False) as r:
        assert r.used_bytes() == 100 + 1600
        assert r.used_bytes(live_only=False) == 100 + 200 + 400 + 800 + 1600
        assert r.processes() == [(me, 100), (1, 1600)]
        assert r.processes()[0].pid == me


def write_slots(usage: Path, slots: list[tuple[int, int, int]]) -> None:
    """Fill a usage file's slots as libvgpu processes would."""
    with usage.open("r+b") as f, mmap.mmap(f.fileno(), USAGE_SIZE) as mm:
        u = VgpuUsage.from_buffer(mm)
        for i, (pid, st, used) in enumerate(slots):
            u.slots[i].pid, u.slots[i].start_time, u.slots[i].used = pid, st, used
        u.slot_high_water = len(slots)
        del u  # release the buffer export before the mmap closes


USAGE_SIZE = ctypes.sizeof(VgpuUsage)


def _patch_usage(path: Path, field: str, value: int) -> None:
    with path.open("r+b") as f:
        f.seek(getattr(VgpuUsage, field).offset)
        f.write(struct.pack("I", value))


BAD_USAGE = [
    ("empty", lambda p: p.write_bytes(b""), "truncated: 0 bytes"),
    ("short", lambda p: os.truncate(p, 64 + 3 * 64 + 10), "truncated: 266 bytes"),
    ("zero-magic", lambda p: _patch_usage(p, "magic", 0), "bad magic 0x00000000"),
    ("wrong-version", lambda p: _patch_usage(p, "version", 9),
     "layout version 9, this vgpu reads version 2"),
    ("wrong-capacity", lambda p: _patch_usage(p, "slot_capacity", 1 << 31),
     "slot capacity 2147483648, expected 1024"),
    ("missing", lambda p: p.unlink(), "No such file or directory"),
    ("fifo", lambda p: (p.unlink(), os.mkfifo(p)), "not a regular file"),
]


@pytest.mark.parametrize(("damage", "reason"), [(d, r) for _, d, r in BAD_USAGE],
                         ids=[i for i, _, _ in BAD_USAGE])
def test_a_damaged_usage_file_reads_as_an_error_never_a_fault(
        tmp_path: Path, damage: Any, reason: str) -> None:
    """The usage file is the tenant's to write: vgpud reads it by pread and checks it."""
    path = make(tmp_path / "vgpu0")
    usage = rg.usage_path_of(path)
    write_slots(usage, [(os.getpid(), 0, 100)] * 8)
    damage(usage)
    with rg.open_region(path, writable=False) as r:
        with pytest.raises(RegionError, match=f"failed to read region file {usage}: {reason}"):
            r.used_bytes()
        assert r.memory_limit == 2 * GI  # the limits are another file


def test_a_high_water_past_the_table_is_bounded(tmp_path: Path) -> None:
    path = make(tmp_path / "vgpu0")
    usage = rg.usage_path_of(path)
    write_slots(usage, [(os.getpid(), 0, 100)])
    _patch_usage(usage, "slot_high_water", 0xFFFFFFFF)
    with rg.open_region(path, writable=False) as r:
        assert r.slot_high_water == rg.REGION_SLOTS
        assert r.used_bytes() == 100  # every other slot is free


@pytest.mark.parametrize(
    ("stat_text", "expected"),
    [
        ("42 (sleep) S 1 42 42 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 98765 1000 10", 98765),
        ("42 (a) b) c) S 1 42 42 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 555 1000 10", 555),
        ("42 (x) S 1 2", 0),
        ("garbage", 0),
    ],
    ids=["plain", "parens-in-comm", "short", "garbage"],
)
def test_proc_start_time(tmp_path: Path, stat_text: str, expected: int) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text(stat_text)
    assert proc_start_time(42, proc=tmp_path) == expected


def test_pid_alive_trusts_kill_when_proc_is_hidden(tmp_path: Path) -> None:
    me = os.getpid()
    assert pid_alive(me, 12345, proc=tmp_path)  # hidepid: no /proc/<pid>/stat
    assert not pid_alive(me, proc_start_time(me) + 1)
    assert pid_alive(me, proc_start_time(me))
    assert pid_alive(me, 0)
    assert not pid_alive(0, 0)
    assert not pid_alive(_dead_pid(), 0)
