# SPDX-License-Identifier: Apache-2.0
"""The current device list of one resource, and a wait for the next change of it.

The poller publishes; every ListAndWatch stream waits here and sends each new list.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

__all__ = ["Board"]

Devices = tuple[tuple[str, str], ...]   # (ID, health), in advertised order


class Board:
    """A versioned device list; publish() wakes every waiter when the list changed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._devices: Devices = ()
        self._version = 0
        self._closed = False

    def publish(self, devices: Sequence[tuple[str, str]]) -> bool:
        """Set the list; True when it differs from the last one."""
        new = tuple(devices)
        with self._cond:
            if new == self._devices and self._version:
                return False
            self._devices = new
            self._version += 1
            self._cond.notify_all()
            return True

    def current(self) -> tuple[int, Devices]:
        """(version, list) now; version 0: nothing published yet."""
        with self._cond:
            return self._version, self._devices

    def wait(self, after: int, timeout_s: float) -> tuple[int, Devices] | None:
        """The list once its version passes `after` (None on timeout or when closed)."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._version > after, timeout_s)
            if self._closed or self._version <= after:
                return None
            return self._version, self._devices

    def close(self) -> None:
        """Wake and end every waiter for good (the plugin is stopping)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        with self._cond:
            return self._closed
