# SPDX-License-Identifier: Apache-2.0
"""vgpud's structured event log: one JSON object a line, plus the most recent in memory.

Each event is {"ts": ISO 8601 UTC, "kind": KIND, ...fields}. The file is append-only
and written with one write() per line, so a crash leaves at most a partial last
line, never an interleaving; readers skip lines that do not parse.
"""
from __future__ import annotations

import collections
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["KINDS", "EventLog", "read_events"]

#: The kinds vgpud emits; emit() accepts others too (new kinds need no change here).
KINDS = frozenset({
    "allocate", "release", "evict", "update", "attach",
    "allocate.refused", "attach.refused", "release.refused",
    "reconcile.release", "reconcile.drift", "reconcile.kill",
    "guard.over_share", "guard.over_memory", "guard.kill", "guard.throttle",
    "guard.throttle_refused", "guard.unthrottle",
    "usage.malformed", "rundir.remade", "user.add", "user.drop", "start", "reload",
})


def _now() -> str:
    # strftime on a struct_time is several times cheaper than datetime.isoformat,
    # and this runs for every allocation and release.
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


class EventLog:
    """Append events to `path` (None: memory only) and keep the last `keep` of them."""

    def __init__(self, path: Path | None, keep: int = 1000) -> None:
        if keep < 0:
            raise ValueError(f"keep must be >= 0, not {keep}")
        self.path = Path(path) if path is not None else None
        self._recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()
        self._fd: int | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # O_APPEND: every write lands at the end even with another writer (a
            # second vgpud by mistake, logrotate's copytruncate).
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                               0o640)

    def emit(self, kind: str, /, **fields: Any) -> dict[str, Any]:
        """Record one event of `kind` with `fields` (JSON-able; others via str()); return it."""
        event: dict[str, Any] = {"ts": _now(), "kind": kind}
        event.update((k, v) for k, v in fields.items() if k not in ("ts", "kind"))
        line = (json.dumps(event, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            if self._fd is not None:
                view = memoryview(line)
                while view:
                    view = view[os.write(self._fd, view):]
            self._recent.append(event)
        return event

    def recent(self, n: int | None = None) -> list[dict[str, Any]]:
        """The last `n` events (all kept ones when None), oldest first."""
        with self._lock:
            events = list(self._recent)
        if n is None:
            return events
        return events[-n:] if n > 0 else []

    def close(self) -> None:
        """Close the file; later events are kept in memory only."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every complete event in an event log file, oldest first (a torn last line is skipped)."""
    events: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return events
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events
