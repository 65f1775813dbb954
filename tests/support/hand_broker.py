# SPDX-License-Identifier: Apache-2.0
"""A real vgpu-broker serving a scheduling directory, and slices played by hand through
their .req files (the layout arbiter.files.sched_files mirrors), as their processes would write them
(sched.c): for tests that must be the tenant libvgpu would never be."""
from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from arbiter.files.sched_files import (
    VgpuSched,
    VgpuSchedReq,
    create_sched,
    open_sched,
    write_slice_files,
)
from support.paths import BUILD

BROKER = BUILD / "bin" / "vgpu-broker"
UUID = "GPU-5eed0000-0000-0000-0000-00000000b0b0"
MS = 1_000_000
TAIL_MAX_NS = 50 * MS   # an unreported tail costs this (VGPU_TAIL_MAX_NS, test_timing_constants)
BEAT_NS = 10 * MS       # the broker looks at least this often (VGPU_BEAT_NS, test_timing_constants)
FIXED, BURST, NORMAL = 0, 1, 1
SYS_FUTEX = {"x86_64": 202, "aarch64": 98}[os.uname().machine]
FUTEX_WAKE = 1
LIBC = ctypes.CDLL(None, use_errno=True)


def now_ns() -> int:
    return time.monotonic_ns()


class HandSlice:
    """One slice's .req, written by hand as its processes would (sched.c)."""

    def __init__(self, root: Path, key: int, share: int, policy: int = FIXED) -> None:
        write_slice_files(root, UUID, key, share=share, priority=NORMAL, policy=policy, floor=0)
        self.key = key
        fd = os.open(root / f"{UUID}.{key:016x}.req", os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, ctypes.sizeof(VgpuSchedReq))
        finally:
            os.close(fd)
        self.req = VgpuSchedReq.from_buffer(self._mm)

    def want(self) -> None:
        self.req.want_ns = now_ns()
        self.req.want = 1

    def take(self, seq: int) -> None:
        self.req.owner_seq = seq
        self.req.want = 0
        self.req.active_ns = now_ns()

    def drained(self, seq: int) -> None:
        self.req.drain_ns = now_ns()
        self.req.drain_seq = seq

    def released(self, seq: int) -> None:
        self.req.release_ns = now_ns()
        self.req.release_seq = seq

    def close(self) -> None:
        del self.req
        self._mm.close()


class Gpu:
    """The broker's side, read as a slice reads it (the GPU file)."""

    def __init__(self, root: Path) -> None:
        self.path = root / UUID
        self.broker_pid = 0  # the vgpu-broker serving it (serving)
        assert create_sched(self.path, UUID)
        fd = os.open(self.path, os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, ctypes.sizeof(VgpuSched))
        finally:
            os.close(fd)
        self._bell = ctypes.c_uint32.from_buffer(self._mm, VgpuSched.doorbell.offset)

    def ring(self) -> None:
        """Wake the broker as a slice does after it writes a request (vg_broker_ring)."""
        LIBC.syscall(SYS_FUTEX, ctypes.byref(self._bell), FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)

    def snapshot(self):  # type: ignore[no-untyped-def]
        with open_sched(self.path) as s:
            return s.snapshot()

    def entry_of(self, key: int) -> int:
        for i, e in enumerate(self.snapshot().entries):
            if e.key == key:
                return i
        return -1

    def used_ns(self, key: int) -> int:
        return next(e.used_ns for e in self.snapshot().entries if e.key == key)


def poll(what: str, cond: Callable[[], object], timeout: float = 2.0,
         between: Callable[[], None] | None = None) -> object:
    """Poll cond every 0.2 ms (renewing requests with `between`) until it is true."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        if between:
            between()
        time.sleep(0.0002)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def serving(root: Path) -> Iterator[Gpu]:
    """A GPU file in root and a real vgpu-broker serving it."""
    root.mkdir()
    gpu = Gpu(root)
    broker = subprocess.Popen([str(BROKER), "--dir", str(root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gpu.broker_pid = broker.pid
    try:
        yield gpu
    finally:
        broker.terminate()
        broker.wait(timeout=10)


def hold(gpu: Gpu, s: HandSlice) -> tuple[int, int]:
    """Ask until the broker grants s the token, take it: the grant's seq, and when the
    broker made it (0 when we took it so late that the broker may have taken it back as
    a grant nobody took: 5 ms)."""
    entry = poll("the broker to list the slice", lambda: gpu.entry_of(s.key) + 1) - 1  # type: ignore[operator]
    s.want()
    gpu.ring()
    word = poll(f"a grant to entry {entry}",
                lambda: (w := gpu.snapshot().grant) & 0xFF == entry + 1 and w, between=s.want)
    granted = gpu.snapshot().grant_ns
    seq = int(word) >> 8  # type: ignore[call-overload]
    s.take(seq)
    return seq, granted if now_ns() - granted < 2 * MS else 0


def revoked(gpu: Gpu, word_seq: int, s: HandSlice) -> None:
    """Keep the lease of hold `word_seq` until the broker takes it back (credit runs out)."""
    def renew() -> None:
        s.req.active_ns = now_ns()
    poll("the revocation", lambda: gpu.snapshot().grant >> 8 != word_seq, between=renew)
