# SPDX-License-Identifier: Apache-2.0
"""Pending: a queued write's outcome, set once by the store's writer, waited for by any
number of threads."""
from __future__ import annotations

import threading

import pytest

from arbiter.slices.pending import Pending


def _waiters(p: Pending[object], n: int) -> tuple[list[threading.Thread], list[object]]:
    got: list[object] = []

    def wait() -> None:
        try:
            got.append(p.result(timeout=10))
        except BaseException as e:  # what the waiter saw is its result
            got.append(e)

    threads = [threading.Thread(target=wait) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, got


def test_every_waiter_gets_the_result_once_it_is_set() -> None:
    p: Pending[object] = Pending()
    threads, got = _waiters(p, 5)
    assert not p.done()
    assert got == []  # none passed before the writer set it
    p.set_result({"durable": True})
    for t in threads:
        t.join(10)
    assert got == [{"durable": True}] * 5
    assert p.done()
    assert p.result() == {"durable": True}  # and again, later, at once


def test_every_waiter_raises_the_error() -> None:
    p: Pending[object] = Pending()
    threads, got = _waiters(p, 3)
    error = RuntimeError("the commit failed")
    p.set_exception(error)
    for t in threads:
        t.join(10)
    assert got == [error] * 3
    with pytest.raises(RuntimeError, match="the commit failed"):
        p.result()


def test_result_gives_up_after_its_timeout() -> None:
    p: Pending[int] = Pending()
    with pytest.raises(TimeoutError, match=r"within 0\.05 s"):
        p.result(timeout=0.05)
    p.set_result(0)
    assert p.result(timeout=0.05) == 0
