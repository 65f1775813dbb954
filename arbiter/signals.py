# SPDX-License-Identifier: Apache-2.0
"""Signals for long-running processes (vgpud, the Kubernetes plugins), with handlers that
take no lock.

Python runs a handler in the main thread between any two bytecodes, even inside a
`with lock:` of that thread's own, and again inside a handler still running when the next
signal comes. A handler that sets a threading.Event the main thread waits on or clears
takes the Event's lock: a signal that came while that thread held it waited for it
forever (vgpud did not stop; a burst of SIGTERMs wedged the device plugin), and handlers
with work in them nested until a RecursionError (a storm of SIGHUPs ended vgpud). Here a
handler only adds the signal's number to a set; the interpreter writes a byte for each
signal to a wake-up pipe, which `wait` sleeps on."""
from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from types import FrameType

__all__ = ["SignalWaiter", "stop_on_signals"]


class SignalWaiter:
    """The signals `signals` as they come, for one waiting thread (made in the main thread,
    once: the interpreter has one wake-up fd)."""

    def __init__(self, signals: tuple[int, ...]) -> None:
        self._seen: set[int] = set()
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for sig in signals:
            signal.signal(sig, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._seen.add(signum)  # one C call: nothing to wait on, next to nothing to nest

    def wait(self) -> set[int]:
        """Sleep until one of the signals has come; the numbers of those that came since
        the last wait. (A full pipe reads at once: a signal noted while it was full is
        returned all the same.)"""
        while not self._seen:
            select.select([self._read], [], [])
            with contextlib.suppress(BlockingIOError):
                while os.read(self._read, 4096):
                    pass
        got, self._seen = self._seen, set()
        return got

    def close(self) -> None:
        """Stop writing to the pipe (from the main thread) and close it."""
        with contextlib.suppress(ValueError):  # only the main thread may
            signal.set_wakeup_fd(-1)
        os.close(self._read)
        os.close(self._write)


def stop_on_signals(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
                    ) -> threading.Event:
    """An Event set, by a thread of its own, once one of `signals` comes (call from the main
    thread, once)."""
    stop = threading.Event()
    waiter = SignalWaiter(signals)

    def watch() -> None:
        waiter.wait()
        stop.set()

    threading.Thread(target=watch, name="signals", daemon=True).start()
    return stop
