# SPDX-License-Identifier: Apache-2.0
"""Signals for long-running processes (vgpud, the Kubernetes plugins), seen by a waiting
thread, never acted on in a handler.

Python runs a handler in the main thread between any two bytecodes, even inside a
`with lock:` of that thread's own, and again inside a handler still running when the next
signal comes. A handler that set a threading.Event the main thread waited on took the
Event's lock: a signal that came while that thread held it waited for it forever (vgpud
did not stop; a burst of SIGTERMs wedged the device plugin), and handlers with work in
them nested until a RecursionError (a storm of SIGHUPs ended vgpud).

So the record is the interpreter's wake-up fd: for each signal its C-level handler writes
the signal's number, one byte, to a pipe, at once and from whatever thread it interrupts.
`SignalWaiter.wait` sleeps on that pipe and reads the numbers, in any thread. The Python
handlers only count (no lock, nothing to nest); the counts matter only for the bytes a full
pipe dropped, and they cannot stand alone: a handler runs later, in the main thread, when
it next runs bytecode (a waiter in another thread that trusted them slept through a
SIGTERM while the main thread sat in a wait)."""
from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import threading
from collections import Counter
from collections.abc import Iterable
from types import FrameType

__all__ = ["SignalWaiter", "stop_on_signals"]

# fcntl.F_GETPIPE_SZ from Python 3.10 on Linux; the number, should a build lack the name.
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
# How long a waiter that found its pipe full gives the main thread to run the handlers of
# signals whose bytes were dropped (it runs them within microseconds unless it is in C code).
_DROPPED_GRACE_S = 0.05


class SignalWaiter:
    """The signals `signals` as they come, for one waiting thread. Make it in the main thread,
    once: the interpreter has one wake-up fd, and only the main thread may set handlers."""

    def __init__(self, signals: Iterable[int]) -> None:
        self._signals = frozenset(int(s) for s in signals)
        # Written by the handlers only (the main thread), read by the waiter.
        self._handled: dict[int, int] = dict.fromkeys(self._signals, 0)
        self._bytes: Counter[int] = Counter()  # each signal's bytes read so far
        self._reported: Counter[int] = Counter()  # deliveries wait() has accounted for
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._capacity = fcntl.fcntl(self._read, _F_GETPIPE_SZ)
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for sig in self._signals:
            signal.signal(sig, self._count)

    def _count(self, signum: int, frame: FrameType | None) -> None:
        # A nested handler can make this miss one, never go back: a count only undercounts,
        # and the bytes cover what it misses unless the pipe was full as well.
        self._handled[signum] += 1

    def wait(self) -> set[int]:
        """Sleep until one of the signals comes; the numbers of those that came since the
        last wait (a signal that came twice is there once)."""
        while True:
            select.select([self._read], [], [])
            came, full = self._drain()
            if full:
                # The pipe was full: bytes may have been dropped. Their handlers still run;
                # give the main thread the time to, then take their counts as well.
                select.select([self._read], [], [], _DROPPED_GRACE_S)
                more, _ = self._drain()
                came += more
            self._bytes.update(b for b in came if b in self._signals)
            got = set()
            for sig in self._signals:
                # Each delivery writes at most one byte and runs one handler: whichever
                # says more is how many came (neither is ever more than that).
                delivered = max(self._bytes[sig], self._handled[sig])
                if delivered > self._reported[sig]:
                    self._reported[sig] = delivered
                    got.add(sig)
            if got:
                return got

    def _drain(self) -> tuple[bytes, bool]:
        """What the pipe holds, and whether it was full (only this reads it: full now if it
        was full at any time since the last drain)."""
        chunks: list[bytes] = []
        full = False
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self._read, self._capacity):
                full = full or (not chunks and len(chunk) >= self._capacity)
                chunks.append(chunk)
        return b"".join(chunks), full

    def close(self) -> None:
        """Stop the interpreter writing to the pipe (in the main thread) and close it."""
        with contextlib.suppress(ValueError):  # only the main thread may
            signal.set_wakeup_fd(-1)
        os.close(self._read)
        os.close(self._write)


def stop_on_signals(signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
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
