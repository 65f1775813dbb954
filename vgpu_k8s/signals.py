# SPDX-License-Identifier: Apache-2.0
"""SIGTERM and SIGINT as a threading.Event, set by a thread, never by a signal handler.

Python runs a handler in the main thread between any two bytecodes, even inside a
`with lock:` of that thread's own, and again inside a handler that is still running when
the next signal comes. A handler that sets an Event the main thread waits on takes the
Event's lock: a signal that comes while the main thread holds it (waiting, or inside the
first handler's set()) waits for it forever. So the handlers here do nothing; the
interpreter writes a byte for each signal to a wake-up pipe, and a thread of this module
reads it and sets the Event (vgpud's own loop does the same in arbiter.daemon.server)."""
from __future__ import annotations

import os
import select
import signal
import threading
from types import FrameType

__all__ = ["stop_on_signals"]


def _noted(signum: int, frame: FrameType | None) -> None:
    """The handler: the wake-up fd has the signal already."""


def stop_on_signals(signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
                    ) -> threading.Event:
    """An Event set once one of `signals` comes (call from the main thread, once)."""
    stop = threading.Event()
    read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    for sig in signals:
        signal.signal(sig, _noted)

    def watch() -> None:
        # Only these signals have Python handlers: any byte is one of them.
        while True:
            select.select([read], [], [])
            try:
                if os.read(read, 4096):
                    stop.set()
                    return
            except BlockingIOError:
                continue

    threading.Thread(target=watch, name="signals", daemon=True).start()
    return stop
