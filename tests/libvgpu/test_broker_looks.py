# SPDX-License-Identifier: Apache-2.0
"""What vgpud's broker does while nothing changes (libvgpu/src/broker.c `look`, `read_all`).

It learns of slices that come, change or go from inotify on its scheduling directory: it
lists the directory and stats each slice's .conf only when one of its GPU's slice files
was made, renamed or deleted there, and once a second in any case (RESCAN_FULL_NS). It
polled every 20 ms before: with 50 idle slices on one of 4 GPUs that was 56 ms of CPU a
second, listings and stats most of it. And a wait reads every slice's .req twice (as
its doorbell is set, as it ends), the step that follows no third time: it uses what the
end of the wait read.

The counts come from the kernel's side (strace on the real broker), so they hold on any
machine however fast; the timed test allows 10x the look period (20 ms) against a full
rescan's 1 s, five times over."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

from support.hand_broker import NORMAL, UUID, Gpu, HandSlice, poll, serving
from support.measure import timing
from support.prereq import require

from arbiter.files.sched_files import remove_slice_files, write_slice_files

SLICES = 20
WINDOW_S = 1.5
FULL_RESCAN_S = 1.0  # broker.c RESCAN_FULL_NS


def _strace(pid: int, seconds: float, log: Path) -> list[tuple[int, str]]:
    """The system calls of the broker's threads for `seconds`: (thread id, line)."""
    require(shutil.which("strace") is not None, "needs strace (scripts/install-deps.sh)")
    subprocess.run(["timeout", "-s", "INT", str(seconds), "strace", "-f", "-qq", "-p", str(pid),
                    "-e", "trace=openat,getdents64,newfstatat,statx,stat,pread64,futex,"
                    "nanosleep,clock_nanosleep", "-o", str(log)], capture_output=True)
    calls = []
    for line in log.read_text().splitlines():
        tid, _, call = line.partition(" ")
        if tid.isdigit() and "resumed>" not in call:
            calls.append((int(tid), call.lstrip()))
    return calls


def _gpu_thread(calls: list[tuple[int, str]], pid: int) -> list[str]:
    """The calls of the thread that serves the GPU file (the main thread only looks for new
    GPU files, every 100 ms)."""
    return [call for tid, call in calls if tid != pid]


def _all_listed(gpu: Gpu, keys: list[int]) -> bool:
    listed = {e.key for e in gpu.snapshot().entries}
    return all(k in listed for k in keys)


def test_an_idle_broker_lists_nothing_and_reads_each_req_twice_a_wait(tmp_path: Path) -> None:
    root = tmp_path / "gpu"
    with serving(root) as gpu:
        slices = [HandSlice(root, 0x100 + n, 5) for n in range(SLICES)]
        keys = [s.key for s in slices]
        poll("every slice to be listed", lambda: _all_listed(gpu, keys), timeout=5)
        calls = _gpu_thread(_strace(gpu.broker_pid, WINDOW_S, tmp_path / "strace.log"),
                            gpu.broker_pid)
        assert calls, "strace saw no call of the broker's GPU thread"
        scans = [c for c in calls if c.startswith("openat(") and "O_DIRECTORY" in c]
        conf_stats = [c for c in calls if ".conf\"" in c and c.startswith(
            ("newfstatat(", "statx(", "stat("))]
        preads = [c for c in calls if c.startswith("pread64(")]
        waits = [c for c in calls if (c.startswith("futex(") and "FUTEX_WAIT" in c)
                 or c.startswith(("nanosleep(", "clock_nanosleep("))]
        # Polling every 20 ms listed it ~75 times in this window, and stat'ed 20 .conf each.
        assert len(scans) <= WINDOW_S / FULL_RESCAN_S + 1, scans
        assert len(conf_stats) <= SLICES * len(scans), conf_stats[:5]
        # Two reads of each .req a wait (as the bell is set, as the wait ends), and at the
        # window's edges the reads of a wait whose call falls outside it: 2 a wait, one wait
        # more. The step read them all once more before: 3 a wait.
        assert waits, calls[:20]
        assert len(preads) <= SLICES * 2 * (len(waits) + 1), (len(preads), len(waits))
        assert _all_listed(gpu, keys)  # still served: nothing was dropped for want of a look
        for s in slices:
            s.close()


def test_a_tenant_rewriting_its_req_through_file_calls_makes_no_scan(tmp_path: Path) -> None:
    """A tenant's writes to its own .req (open, pwrite, close, chmod: the events a
    directory watch could be told of) are not a slice coming or going: the watch's mask
    leaves them out, so they cost the broker no listing of the directory."""
    root = tmp_path / "gpu"
    with serving(root) as gpu:
        s = HandSlice(root, 0x400, 10)
        poll("the slice to be listed", lambda: gpu.entry_of(0x400) >= 0, timeout=5)
        req = root / f"{UUID}.{0x400:016x}.req"
        head = req.read_bytes()[:8]
        stop = threading.Event()

        def scribble() -> None:
            while not stop.is_set():
                fd = os.open(req, os.O_RDWR)
                try:
                    os.pwrite(fd, head, 0)  # its own bytes again: no request changes
                finally:
                    os.close(fd)
                os.chmod(req, 0o600)

        writer = threading.Thread(target=scribble)
        writer.start()
        try:
            calls = _gpu_thread(_strace(gpu.broker_pid, WINDOW_S, tmp_path / "strace.log"),
                                gpu.broker_pid)
        finally:
            stop.set()
            writer.join()
        scans = [c for c in calls if c.startswith("openat(") and "O_DIRECTORY" in c]
        assert calls, "strace saw no call of the broker's GPU thread"
        assert len(scans) <= WINDOW_S / FULL_RESCAN_S + 1, scans
        assert gpu.entry_of(0x400) >= 0
        s.close()


def test_the_broker_reads_each_req_without_touching_its_access_time(tmp_path: Path) -> None:
    """A hundred reads a second of each .req asked the filesystem each time whether its
    access time was due (relatime: when older than its change or than a day). Opened
    O_NOATIME, a read asks nothing: an access time set a day back stays there."""
    root = tmp_path / "gpu"
    with serving(root) as gpu:
        s = HandSlice(root, 0x500, 10)
        poll("the slice to be listed", lambda: gpu.entry_of(0x500) >= 0, timeout=5)
        req = root / f"{UUID}.{0x500:016x}.req"
        old = time.time_ns() - 2 * 86400 * 10**9
        os.utime(req, ns=(old, req.stat().st_mtime_ns))
        calls = _gpu_thread(_strace(gpu.broker_pid, 0.5, tmp_path / "strace.log"),
                            gpu.broker_pid)
        assert any(c.startswith("pread64(") for c in calls), "the broker read no .req"
        assert req.stat().st_atime_ns == old
        assert gpu.entry_of(0x500) >= 0
        s.close()


@timing
def test_a_slice_made_changed_or_removed_is_seen_at_the_next_look(tmp_path: Path) -> None:
    """Without the events only the full rescan (1 s) would see them: five rounds at random
    phases, each well within 200 ms, are not that (chance below 0.2^15)."""
    root = tmp_path / "gpu"
    rng = random.Random(7)
    with serving(root) as gpu:
        for n in range(5):
            time.sleep(rng.uniform(0, FULL_RESCAN_S / 3))
            key = 0x200 + n
            made = time.monotonic()
            s = HandSlice(root, key, 10)
            poll("the new slice to be listed", lambda k=key: gpu.entry_of(k) >= 0, timeout=5)
            assert time.monotonic() - made < 0.2

            changed = time.monotonic()
            write_slice_files(root, UUID, key, share=40, priority=NORMAL, policy=0, floor=0)
            poll("the new share", lambda k=key: any(
                e.key == k and e.share == 40 for e in gpu.snapshot().entries), timeout=5)
            assert time.monotonic() - changed < 0.2

            s.close()
            removed = time.monotonic()
            remove_slice_files(root, [key])
            poll("the slice to be dropped", lambda k=key: gpu.entry_of(k) < 0, timeout=5)
            assert time.monotonic() - removed < 0.2


def test_a_broker_whose_directory_was_moved_polls_it_and_still_takes_slices_on(
        tmp_path: Path) -> None:
    """Moved away and back, the directory is not the one the watch was for: the broker
    gives the watch up and looks by listing (every 20 ms), as a standalone one does."""
    root = tmp_path / "gpu"
    with serving(root) as gpu:
        first = HandSlice(root, 0x300, 10)
        poll("the first slice to be listed", lambda: gpu.entry_of(0x300) >= 0, timeout=5)
        root.rename(tmp_path / "away")
        (tmp_path / "away").rename(root)
        second = HandSlice(root, 0x301, 10)
        poll("a slice made after the move to be listed", lambda: gpu.entry_of(0x301) >= 0,
             timeout=5)
        calls = _gpu_thread(_strace(gpu.broker_pid, 1.0, tmp_path / "strace.log"),
                            gpu.broker_pid)
        scans = [c for c in calls if c.startswith("openat(") and "O_DIRECTORY" in c]
        assert len(scans) >= 5, scans  # ~50 a second; watched, it would be 1 or 2
        assert gpu.entry_of(0x300) >= 0
        first.close()
        second.close()
