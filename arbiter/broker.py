# SPDX-License-Identifier: Apache-2.0
"""vgpud's token broker: runs vgpu-broker over <run_dir>/sched and restarts it if it exits.

The broker (libvgpu/src/broker.c) is the one party that grants each GPU's compute
token; vgpud only keeps it running. A broker that dies loses nothing a slice needs:
the slices' requests and vgpud's settings are files, and a new broker takes them up
(holders keep the GPU meanwhile, waiters wait). The restart is immediate the first
time and backs off to at most 5 s if it keeps failing.
"""
from __future__ import annotations

import logging
import subprocess
import threading
import time
from pathlib import Path

__all__ = ["BrokerSupervisor"]

log = logging.getLogger(__name__)

_BACKOFF_MAX_S = 5.0
_STEADY_S = 10.0  # a broker that ran this long resets the back-off


class BrokerSupervisor:
    """Keeps one `vgpu-broker --dir DIR` running until stop()."""

    def __init__(self, program: Path, sched_dir: Path) -> None:
        self.program = Path(program)
        self.sched_dir = Path(sched_dir)
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.restarts = 0

    @property
    def pid(self) -> int:
        """The running broker's pid, 0 when none runs."""
        p = self._proc
        return p.pid if p is not None and p.poll() is None else 0

    def start(self) -> None:
        """Start the broker and the thread that restarts it."""
        self._spawn()
        self._thread = threading.Thread(target=self._watch, name="vgpud-broker", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self._proc = subprocess.Popen([str(self.program), "--dir", str(self.sched_dir)],
                                          stdin=subprocess.DEVNULL, close_fds=True)
            log.info("vgpu-broker started (pid %d) for %s", self._proc.pid, self.sched_dir)

    def _watch(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            p = self._proc
            if p is None:
                return
            started = time.monotonic()
            rc = p.wait()
            if self._stop.is_set():
                return
            self.restarts += 1
            backoff = 0.0 if time.monotonic() - started > _STEADY_S else min(
                _BACKOFF_MAX_S, max(0.1, backoff * 2))
            log.warning("vgpu-broker exited (status %s); restarting in %.1f s", rc, backoff)
            if self._stop.wait(backoff):
                return
            try:
                self._spawn()
            except OSError as e:
                log.error("cannot restart vgpu-broker %s: %s", self.program, e)
                backoff = _BACKOFF_MAX_S

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 2 s) and the watcher."""
        self._stop.set()
        with self._lock:
            p = self._proc
        if p is not None and p.poll() is None:
            p.terminate()
            deadline = time.monotonic() + 2
            if self._thread is not None:
                # The watcher is blocked in p.wait() and returns the moment the broker
                # exits; wait(timeout) here would poll, up to 50 ms late at every stop.
                self._thread.join(timeout=2)
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)
