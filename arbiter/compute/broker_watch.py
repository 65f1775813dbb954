# SPDX-License-Identifier: Apache-2.0
"""Whether each GPU's token broker serves, from its heartbeat; and no lease on its file.

The broker writes `broker_beat_ns` into a GPU's scheduling file at every step (at
least every VGPU_BEAT_NS). A GPU whose beat has stopped has no broker: its throttled
slices wait for a grant that never comes. The supervisor
(arbiter.compute.broker_supervisor) restarts a
broker that exits, but a broker can also be alive and not serve (stopped, stuck, or
kept from its lock), which only the beat shows. vgpud says so: an event
`broker.silent` once a GPU has gone SILENT_REPORT_NS without one, `broker.serving`
when it beats again, the gauge `vgpu_gpu_broker_serving` and the GPU's line in
`vgpu smi` (Device.broker).

It also keeps every GPU file open for writing while vgpud runs. Every container of
a GPU has that file mounted read-only, and its root owns it as root does; the kernel
grants an owner a read lease (F_SETLEASE) on a file nobody has open for writing,
and a lease makes the next writer's open wait for the lease-break time (45 s by
default). The broker holds the file open for writing too, but not across its own
restart; with vgpud's fd no lease can be taken at all.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arbiter.errors import VgpuError
from arbiter.files.sched_files import BROKER_DEAD_NS, open_sched

__all__ = ["SILENT_REPORT_NS", "BrokerWatch", "Heard", "hear"]

log = logging.getLogger(__name__)

#: A GPU silent this long is reported. A broker's restart, or an upgrade's hand-over,
#: takes milliseconds; the supervisor's back-off after failed starts is up to 5 s,
#: which is reported.
SILENT_REPORT_NS = 1_000_000_000
#: How often the watch looks (and retries a GPU file it could not hold open).
LOOK_EVERY_S = 0.5


@dataclass(frozen=True)
class Heard:
    """What the watch knows of one GPU's broker after a look (pure state).

    silent_since: CLOCK_MONOTONIC ns of the last beat heard (or of the first look that
    heard none), None while the broker serves. reported: a `broker.silent` event was sent
    for this silence.
    """

    silent_since: int | None = None
    reported: bool = False
    pid: int = 0


def hear(prev: Heard, beat_ns: int, pid: int, now_ns: int, watched_ns: int) -> tuple[Heard, str]:
    """The next state of a GPU's watch, and the event to send ('' for none).

    beat_ns is the file's `broker_beat_ns` (0: no broker ever served it), pid its
    `broker_pid`; watched_ns when the watch began. The rule (the libvgpu side's too): a
    beat older than BROKER_DEAD_NS means no broker serves. The silence is dated from that
    beat, but not before the watch began: a beat a broker left before vgpud started (the
    host's last boot, a restart) is no news while this vgpud's broker is starting.
    """
    if beat_ns and now_ns - beat_ns < BROKER_DEAD_NS:
        event = "broker.serving" if prev.reported else ""
        return Heard(pid=pid), event
    since = prev.silent_since
    if since is None:
        since = max(watched_ns, min(beat_ns or now_ns, now_ns))
    if not prev.reported and now_ns - since >= SILENT_REPORT_NS:
        return Heard(since, True, prev.pid or pid), "broker.silent"
    return Heard(since, prev.reported, prev.pid or pid), ""


def describe(h: Heard, now_ns: int) -> str:
    """Device.broker: '' while the broker serves, else what a person should know."""
    if not h.reported or h.silent_since is None:
        return ""
    return (f"not serving: no heartbeat for {(now_ns - h.silent_since) / 1e9:.1f} s; "
            "throttled slices on this GPU cannot launch work")


class BrokerWatch:
    """Looks at each GPU's heartbeat every LOOK_EVERY_S; holds each GPU file open for writing."""

    def __init__(self, files: Mapping[str, Path], index_of: Mapping[str, int],
                 emit: Callable[..., Any], *, clock: Callable[[], int] = time.monotonic_ns,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.files = dict(files)
        self.index_of = dict(index_of)
        self.emit = emit
        self.clock = clock
        self.on_change = on_change
        self._heard: dict[str, Heard] = {uuid: Heard() for uuid in self.files}
        self._watched = clock()
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the GPU files, held open -------------------------------------------------

    def hold(self) -> None:
        """Open each GPU file not yet held for writing (O_NONBLOCK: a lease taken while
        nothing held it fails this at once and starts its break; tried again next look)."""
        for uuid, path in self.files.items():
            if uuid in self._held:
                if self._still_there(uuid, path):
                    continue
                # made again (arbiter.files.sched_files): hold the new one
                os.close(self._held.pop(uuid))
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError as e:
                if e.errno == errno.EWOULDBLOCK:
                    log.warning("%s is leased by another process: opened once the kernel "
                                "breaks the lease", path)
                else:
                    log.warning("cannot hold %s open: %s", path, e.strerror or e)
                continue
            self._held[uuid] = fd

    def _still_there(self, uuid: str, path: Path) -> bool:
        """Whether the file held for this GPU is still the one at its path."""
        try:
            here = os.stat(path, follow_symlinks=False)
        except OSError:
            return True  # gone: kept until one is made again
        held = os.fstat(self._held[uuid])
        return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        for fd in self._held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._held.clear()

    # -- the heartbeats -------------------------------------------------------------

    def look(self) -> None:
        """Read every GPU's heartbeat once; send the events its change calls for."""
        self.hold()
        for uuid, path in self.files.items():
            try:
                with open_sched(path) as s:
                    snap = s.snapshot()
                beat, pid = snap.broker_beat_ns, snap.broker_pid
            except VgpuError as e:
                log.debug("broker watch: %s", e)
                beat, pid = 0, 0
            now = self.clock()
            with self._lock:
                heard, event = hear(self._heard[uuid], beat, pid, now, self._watched)
                self._heard[uuid] = heard
            if event:
                self._send(event, uuid, heard, now)

    def _send(self, event: str, uuid: str, heard: Heard, now: int) -> None:
        gpu = self.index_of.get(uuid, -1)
        if event == "broker.silent":
            silent_s = round((now - (heard.silent_since or now)) / 1e9, 3)
            log.warning("GPU %d (%s): no broker serves it (no heartbeat for %.1f s)", gpu,
                        uuid, silent_s)
            self.emit(event, gpu=gpu, uuid=uuid, silent_s=silent_s, pid=heard.pid)
        else:
            log.info("GPU %d (%s): broker %d serves it again", gpu, uuid, heard.pid)
            self.emit(event, gpu=gpu, uuid=uuid, pid=heard.pid)
        self.on_change()

    def states(self) -> dict[int, str]:
        """Device.broker of each GPU index ('' while its broker serves)."""
        now = self.clock()
        with self._lock:
            return {self.index_of[u]: describe(h, now) for u, h in self._heard.items()
                    if u in self.index_of}

    # -- the thread ---------------------------------------------------------------

    def start(self) -> None:
        self.look()
        self._thread = threading.Thread(target=self._run, name="vgpud-broker-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(LOOK_EVERY_S):
            try:
                self.look()
            except Exception:  # the watch must outlive a bad look; it says so
                log.exception("broker watch")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.release()
