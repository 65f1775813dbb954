# SPDX-License-Identifier: Apache-2.0
"""Scheduling region files: the ctypes mirror matches the C layout; create, keep, replace, read."""
from __future__ import annotations

import ctypes
import logging
import mmap
import os
import re
import stat
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.c_layout import assert_fields, assert_size_and_alignment, read_layout

from arbiter.errors import RegionError, SchedError, VgpuError
from arbiter.files import sched_files as sc
from arbiter.files.sched_files import VgpuSched, VgpuSchedEntry, VgpuSchedReq

UUID = "GPU-5d1f0c2e-0000-4000-8000-000000000001"
SIZE = ctypes.sizeof(VgpuSched)


@pytest.fixture(scope="module")
def c_layout() -> dict[str, Any]:
    """The layout as the C compiler sees it."""
    return read_layout(["vgpu_sched.h"], list(MIRRORS))


MIRRORS = {"vgpu_sched": VgpuSched, "vgpu_sched_entry": VgpuSchedEntry,
           "vgpu_sched_req": VgpuSchedReq}


@pytest.mark.parametrize("struct_name", MIRRORS)
def test_mirror_size_and_alignment(c_layout: dict[str, Any], struct_name: str) -> None:
    assert_size_and_alignment(c_layout, struct_name, MIRRORS[struct_name])


@pytest.mark.parametrize("struct_name", MIRRORS)
def test_mirror_fields(c_layout: dict[str, Any], struct_name: str) -> None:
    assert_fields(c_layout, struct_name, MIRRORS[struct_name])


def test_constants(c_layout: dict[str, Any]) -> None:
    """Every integer constant of the header, with its Python twin."""
    assert c_layout["constants"] == {
        "VGPU_SCHED_MAGIC": sc.SCHED_MAGIC,
        "VGPU_SCHED_REQ_MAGIC": sc.SCHED_REQ_MAGIC,
        "VGPU_SCHED_VERSION": sc.SCHED_VERSION,
        "VGPU_SCHED_ENTRIES": sc.SCHED_ENTRIES,
        "VGPU_SCHED_UUID_LEN": sc.SCHED_UUID_LEN,
    }
    assert sc.SCHED_MAGIC.to_bytes(4, "little") == b"SHED"
    assert sc.SCHED_REQ_MAGIC.to_bytes(4, "little") == b"SREQ"


# -- create / keep / replace ------------------------------------------------------------


def writable(path: Path) -> VgpuSched:
    """The file's live struct, as libvgpu maps it (read-write, shared).

    The struct keeps the mapping alive; it goes with the last reference."""
    with path.open("r+b") as f:
        mm = mmap.mmap(f.fileno(), SIZE)
    return VgpuSched.from_buffer(mm)


def test_create_writes_a_whole_region(tmp_path: Path) -> None:
    path = tmp_path / UUID
    assert sc.create_sched(path, UUID) is True
    raw = VgpuSched.from_buffer_copy(path.read_bytes())
    assert (raw.magic, raw.version, raw.size, raw.entry_capacity, raw.uuid.decode()) == (
        sc.SCHED_MAGIC, sc.SCHED_VERSION, SIZE, sc.SCHED_ENTRIES, UUID)
    assert (raw.grant, raw.handoffs) == (0, 0)
    assert all(e.key == 0 for e in raw.entries)
    assert path.stat().st_size == SIZE
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # the broker writes it, slices only read
    assert os.listdir(tmp_path) == [UUID]  # no temporary left behind


def test_create_mode_ignores_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        sc.create_sched(tmp_path / UUID, UUID)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / UUID).stat().st_mode) == 0o644


def test_a_valid_file_is_kept_with_its_inode_and_content(tmp_path: Path) -> None:
    """Running containers have the file bind-mounted: a vgpud restart must not swap it."""
    path = tmp_path / UUID
    sc.create_sched(path, UUID)
    inode = path.stat().st_ino
    live = writable(path)
    live.entries[3].key, live.entries[3].used_ns, live.handoffs = 77, 123, 9
    assert sc.create_sched(path, UUID) is False
    assert live.entries[3].used_ns == 123  # the mapping a container holds is the file
    assert path.stat().st_ino == inode
    with sc.open_sched(path) as s:
        assert s.handoffs == 9 and s.summary(0).used_ns(77) == 123


def test_a_kept_file_gets_its_mode_back_in_place(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / UUID
    sc.create_sched(path, UUID)
    os.chmod(path, 0o600)
    inode = path.stat().st_ino
    with caplog.at_level(logging.WARNING, logger="arbiter.files.sched_files"):
        assert sc.create_sched(path, UUID) is False
    assert (path.stat().st_ino, stat.S_IMODE(path.stat().st_mode)) == (inode, 0o644)
    assert "setting mode 644" in caplog.text


def _patch(field: str, value: int) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        with path.open("r+b") as f:
            f.seek(getattr(VgpuSched, field).offset)
            f.write(struct.pack("I", value))
    return damage


def _other_gpu(path: Path) -> None:
    with path.open("r+b") as f:
        f.seek(VgpuSched.uuid.offset)
        f.write(b"GPU-other\0")


def _symlink(path: Path) -> None:
    target = path.with_name("elsewhere")
    path.rename(target)
    path.symlink_to(target)


BAD_FILES = [
    ("empty", lambda p: p.write_bytes(b""), f"truncated: 0 bytes, expected {SIZE}"),
    ("truncated", lambda p: os.truncate(p, SIZE - 8), f"truncated: {SIZE - 8} bytes"),
    ("zero-magic", _patch("magic", 0), "bad magic 0x00000000, expected 0x44454853 "
     r"\(not a scheduling region, or one still being made\)"),
    ("other-version", _patch("version", 1), "layout version 1, this vgpu reads version 2"),
    ("wrong-size", _patch("size", SIZE - 128), f"header size {SIZE - 128}, expected {SIZE}"),
    ("wrong-capacity", _patch("entry_capacity", 64), "entry capacity 64, expected 128"),
    ("other-gpu", _other_gpu, f"made for GPU 'GPU-other', not '{UUID}'"),
    ("symlink", _symlink, "Too many levels of symbolic links"),
]


@pytest.mark.parametrize(("damage", "reason"), [(d, r) for _, d, r in BAD_FILES],
                         ids=[i for i, _, _ in BAD_FILES])
def test_a_bad_file_is_replaced_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                           damage: Callable[[Path], None], reason: str) -> None:
    path = tmp_path / UUID
    sc.create_sched(path, UUID)
    damage(path)
    with caplog.at_level(logging.WARNING, logger="arbiter.files.sched_files"):
        assert sc.create_sched(path, UUID) is True
    assert caplog.records[-1].getMessage().startswith(f"replacing scheduling region {path}: ")
    assert re.search(reason, caplog.text)
    assert not path.is_symlink()
    with sc.open_sched(path) as s:
        assert s.uuid == UUID
    assert sorted(os.listdir(tmp_path)) in ([UUID], sorted([UUID, "elsewhere"]))


def test_create_refuses_a_bad_uuid(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="uuid"):
        sc.create_sched(tmp_path / "x", "G" * 96)
    assert os.listdir(tmp_path) == []


def test_create_in_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(SchedError, match=r"failed to create scheduling region .*nowhere/GPU-"):
        sc.create_sched(tmp_path / "nowhere" / UUID, UUID)


def test_a_directory_in_the_way_is_an_error(tmp_path: Path) -> None:
    (tmp_path / UUID).mkdir()
    with pytest.raises(SchedError, match="failed to create scheduling region") as info:
        sc.create_sched(tmp_path / UUID, UUID)
    assert isinstance(info.value, RegionError) and isinstance(info.value, VgpuError)
    assert os.listdir(tmp_path) == [UUID]


def test_prepare_sched_dir(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "run" / "sched"
    with caplog.at_level(logging.WARNING, logger="arbiter.files.sched_files"):
        files = sc.prepare_sched_dir(root, [UUID, "GPU-b", "", "../x", ".hidden"])
    assert files == {UUID: root / UUID, "GPU-b": root / "GPU-b"}
    assert stat.S_IMODE(root.stat().st_mode) == 0o700  # root's alone (containers: bind mounts)
    assert sorted(os.listdir(root)) == sorted(["GPU-b", UUID])
    assert caplog.text.count("cannot name a file") == 3
    inodes = {p.stat().st_ino for p in files.values()}
    os.chmod(root, 0o700)  # the operator's choice stays
    assert sc.prepare_sched_dir(root, [UUID, "GPU-b"]) == files
    assert {p.stat().st_ino for p in files.values()} == inodes
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


# -- open / read ------------------------------------------------------------------------


def test_open_rejects_bad_files(tmp_path: Path) -> None:
    path = tmp_path / UUID
    sc.create_sched(path, UUID)
    _patch("version", 3)(path)
    with pytest.raises(SchedError, match=f"failed to open scheduling region {path}: "
                       "layout version 3"):
        sc.open_sched(path)
    os.truncate(path, 100)
    with pytest.raises(SchedError, match="truncated: 100 bytes"):
        sc.open_sched(path)
    with pytest.raises(SchedError, match="No such file"):
        sc.open_sched(tmp_path / "missing")


def test_snapshot_reads_the_live_file(tmp_path: Path) -> None:
    path = tmp_path / UUID
    sc.create_sched(path, UUID)
    now = time.monotonic_ns()
    live = writable(path)
    with sc.open_sched(path) as s:
        e = live.entries[5]
        e.key, e.share, e.priority, e.policy, e.floor = 0xDEADBEEF00000001, 30, 2, 1, 5
        e.credit_ns, e.used_ns, e.last_active_ns, e.waiting, e.holds = -42, 7 << 33, now, 1, 11
        live.entries[6].used_ns = 99  # a free entry (key 0): not read, not reported
        live.grant, live.broker_pid, live.broker_beat_ns = (3 << 8) | 6, 4242, now
        live.handoffs, live.revocations, live.present[2] = 17, 4, 1
        snap = s.snapshot()
        assert (snap.uuid.decode(), snap.handoffs, snap.broker_pid, snap.present[2]) == (
            UUID, 17, 4242, 1)
        assert snap.entries[6].used_ns == 0
        summary = s.summary(now)
    assert (summary.handoffs, summary.revocations, summary.uuid) == (17, 4, UUID)
    assert (summary.holder, summary.broker_pid) == (0xDEADBEEF00000001, 4242)
    assert summary.entries == (sc.EntrySummary(
        index=5, key=0xDEADBEEF00000001, share=30, priority=2, policy=1, floor=5,
        used_ns=7 << 33, last_active_ns=now, credit_ns=-42, waiting=1, holds=11),)
    assert summary.used_ns(0xDEADBEEF00000001) == 7 << 33
    assert summary.used_ns(0) is None and summary.used_ns(1) is None


# -- summarize (pure) ---------------------------------------------------------------------


def _region(entries: dict[int, tuple[int, int]], grant: int = 0, beat: int = 0,
            pid: int = 0) -> VgpuSched:
    raw = VgpuSched()
    for i, (key, used) in entries.items():
        raw.entries[i].key, raw.entries[i].used_ns = key, used
    raw.grant, raw.broker_beat_ns, raw.broker_pid = grant, beat, pid
    return raw


DEAD = sc.BROKER_DEAD_NS


@pytest.mark.parametrize(
    ("grant", "beat", "now", "holder"),
    [
        (0, 100, 100, None),                     # free
        ((9 << 8) | 2, 100, 100, 20),            # held, broker alive
        ((9 << 8) | 2, 100, 100 + DEAD - 1, 20),  # the heartbeat's last nanosecond
        ((9 << 8) | 2, 100, 100 + DEAD, None),   # the broker is gone: nobody holds it
        ((9 << 8) | 2, 0, 10**18, None),         # no broker ever served it
        ((9 << 8) | 3, 100, 100, None),          # granted to a free entry: nonsense, nobody
        ((9 << 8) | 0xFF, 100, 100, None),       # beyond the table
    ],
    ids=["free", "held", "beat-edge", "broker-gone", "no-broker", "free-entry", "out-of-range"],
)
def test_summarize_holder(grant: int, beat: int, now: int, holder: int | None) -> None:
    raw = _region({0: (10, 1), 1: (20, 2)}, grant=grant, beat=beat, pid=77)
    s = sc.summarize(raw, now)
    assert s.holder == holder
    assert s.broker_pid == (77 if beat and now - beat < DEAD else 0)


U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)


@given(st.dictionaries(st.integers(min_value=0, max_value=sc.SCHED_ENTRIES - 1),
                       st.tuples(U64, U64), max_size=20),
       st.integers(min_value=0, max_value=(1 << 32) - 1), U64, U64)
def test_summarize_reports_exactly_the_used_entries(entries: dict[int, tuple[int, int]],
                                                    grant: int, beat: int, now: int) -> None:
    s = sc.summarize(_region(entries, grant=grant, beat=beat), now)
    live = {i: v for i, v in sorted(entries.items()) if v[0]}
    assert [(e.index, e.key, e.used_ns) for e in s.entries] == [
        (i, k, u) for i, (k, u) in live.items()]
    for key, _ in live.values():
        # Keys are unique in a real region; with duplicates the first entry answers.
        assert s.used_ns(key) == next(u for k, u in live.values() if k == key)
    assert s.holder is None or s.holder in {k for k, _ in live.values()}


def test_slice_gpu_ns() -> None:
    a = sc.summarize(_region({0: (10, 5_000), 4: (11, 7)}), 0)
    b = sc.summarize(_region({}), 0)
    summaries = {"GPU-a": a, "GPU-b": b}
    assert sc.slice_gpu_ns([("GPU-a", 10), ("GPU-b", 10), ("GPU-c", 10), ("GPU-a", 0),
                            ("GPU-a", 11)], summaries) == [5_000, None, None, None, 7]
    assert sc.slice_gpu_ns([], summaries) == []


# -- a slice's own files (vgpud's side) -----------------------------------------------


def test_slice_keys_are_derived_from_the_slice_id() -> None:
    keys = {sc.slice_key_of(f"s{n}", i) for n in range(50) for i in range(4)}
    assert len(keys) == 200 and 0 not in keys
    assert sc.slice_key_of("s1", 0) == sc.slice_key_of("s1", 0)


def test_slice_files_are_made_kept_and_removed(tmp_path: Path) -> None:
    key = sc.slice_key_of("abc", 0)
    req = tmp_path / f"{UUID}.{key:016x}.req"
    conf = tmp_path / f"{UUID}.{key:016x}.conf"
    sc.write_slice_files(tmp_path, UUID, key, share=30, priority=1, policy=0, floor=5)
    raw = VgpuSchedReq.from_buffer_copy(req.read_bytes())
    assert (raw.magic, raw.version, raw.size, raw.key) == (
        sc.SCHED_REQ_MAGIC, sc.SCHED_VERSION, sc.REQ_SIZE, key)
    assert conf.read_text() == "share=30 priority=1 policy=0 floor=5\n"
    assert stat.S_IMODE(req.stat().st_mode) == sc.REQ_FILE_MODE
    assert stat.S_IMODE(conf.stat().st_mode) == sc.CONF_FILE_MODE
    # New settings: the .conf changes; the .req (mounted in a running container) stays.
    inode = req.stat().st_ino
    with req.open("r+b") as f:  # what the slice's processes write
        f.seek(VgpuSchedReq.want.offset)
        f.write(struct.pack("I", 3))
    sc.write_slice_files(tmp_path, UUID, key, share=55, priority=2, policy=1, floor=0)
    assert req.stat().st_ino == inode
    assert VgpuSchedReq.from_buffer_copy(req.read_bytes()).want == 3
    assert conf.read_text() == "share=55 priority=2 policy=1 floor=0\n"
    # A .req that is not this slice's (truncated, zeroed) is made again.
    os.truncate(req, 10)
    sc.write_slice_files(tmp_path, UUID, key, share=55, priority=2, policy=1, floor=0)
    assert VgpuSchedReq.from_buffer_copy(req.read_bytes()).key == key
    other = sc.slice_key_of("other", 0)
    sc.write_slice_files(tmp_path, UUID, other, share=10, priority=1, policy=0, floor=0)
    assert sc.slice_file_keys(tmp_path) == {key, other}
    sc.remove_slice_files(tmp_path, [key])
    assert sc.slice_file_keys(tmp_path) == {other}
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_slice_files_refuse_a_uuid_that_cannot_name_a_file(tmp_path: Path) -> None:
    with pytest.raises(SchedError, match="not a usable GPU UUID"):
        sc.write_slice_files(tmp_path, "../x", 1, share=30, priority=1, policy=0, floor=0)
    assert os.listdir(tmp_path) == []
