# SPDX-License-Identifier: Apache-2.0
"""The threads that run vgpud's RPC handlers: what gRPC's server asks of an executor.

gRPC's threaded server hands each call to `submit` and adds one done-callback to what it
returns (its count of active calls). concurrent.futures.ThreadPoolExecutor gives each
call a Future built on a Condition, a work item, a semaphore check and set_running/
set_result under that Condition: some thirty-five Python calls a call, under the GIL
that every answer waits for. Here a call is a tuple on a SimpleQueue (C) and its
done-callbacks run on the worker that ran it."""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

__all__ = ["RpcPool"]

log = logging.getLogger(__name__)


class _Call:
    """One submitted call: its done-callbacks, run once it has returned (or raised)."""

    __slots__ = ("_callbacks", "_done", "_lock")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._done = False
        self._callbacks: list[Callable[[_Call], object]] = []

    def add_done_callback(self, fn: Callable[[_Call], object]) -> None:
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)  # already done: now, as concurrent.futures does

    def _finish(self) -> None:
        with self._lock:
            self._done = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("an RPC's done-callback failed")


class RpcPool(Executor):
    """`workers` threads named `<name>_<n>`, started at once, that run submitted calls in
    the order they came."""

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[_Call, Callable[..., Any], tuple[Any, ...],
                                             dict[str, Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{n}", daemon=True)
                         for n in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> _Call:  # type: ignore[override]
        call = _Call(self._lock)
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit an RPC after the pool was shut down")
            self._queue.put((call, fn, args, kwargs))
        return call

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._queue.put(None)
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            call, fn, args, kwargs = item
            try:
                fn(*args, **kwargs)
            except BaseException:
                log.exception("an RPC handler raised past gRPC")
            finally:
                call._finish()
            del item, call, fn, args, kwargs
