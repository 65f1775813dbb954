# SPDX-License-Identifier: Apache-2.0
"""A queued write's outcome: set once by the store's writer, waited for by its caller."""
from __future__ import annotations

import _thread
from typing import Generic, TypeVar

__all__ = ["Pending"]

_T = TypeVar("_T")


class Pending(Generic[_T]):
    """What concurrent.futures.Future gives a write, at a fraction of its cost.

    The answer to every Allocate and Release waits on one; Future's Condition makes
    result() and set_result() each a dozen Python calls under the GIL. Here `done` is a
    lock held until the outcome is set: result() takes it and gives it back at once,
    so any number of waiters pass once it is released."""

    __slots__ = ("_done", "_error", "_set", "_value")

    def __init__(self) -> None:
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._value: _T | None = None
        self._error: BaseException | None = None
        self._set = False  # not _done.locked(): a waiter holds it for an instant too

    def set_result(self, value: _T) -> None:
        self._value = value
        self._set = True
        self._done.release()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._set = True
        self._done.release()

    def done(self) -> bool:
        return self._set

    def result(self, timeout: float | None = None) -> _T:
        """The write's result (its error raised); TimeoutError after `timeout` seconds."""
        if not self._done.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError(f"the write was not done within {timeout} s")
        self._done.release()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
