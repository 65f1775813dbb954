# SPDX-License-Identifier: Apache-2.0
"""vgpud's structured event log: one JSON object a line, plus the most recent in memory.

Each event is {"ts": ISO 8601 UTC, "kind": KIND, ...fields}. The file is append-only
and written with one write() per line, so a crash leaves at most a partial last
line, never an interleaving; readers skip lines that do not parse.

The file is bounded: a line that would take it past `max_bytes` first renames it to
`<name>.1` (and `.1` to `.2`, ..., the oldest of `generations` dropped), so the log takes
at most (generations + 1) x max_bytes on disk. Rotation happens between whole lines;
read_events reads the generations oldest first.
"""
from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_GENERATIONS", "DEFAULT_MAX_BYTES", "KINDS", "EventLog", "generation_paths",
           "read_events"]

log = logging.getLogger(__name__)

#: The event log's bound by default (config events.max_size, events.generations).
DEFAULT_MAX_BYTES = 10 << 20
DEFAULT_GENERATIONS = 3

#: The kinds vgpud emits; emit() accepts others too (new kinds need no change here).
KINDS = frozenset({
    "allocate", "release", "evict", "update", "attach",
    "allocate.refused", "attach.refused", "release.refused",
    "reconcile.release", "reconcile.drift", "reconcile.kill",
    "guard.over_share", "guard.over_memory", "guard.kill", "guard.throttle",
    "guard.throttle_refused", "guard.unthrottle", "guard.escalate",
    "usage.malformed", "file.leased", "rundir.remade", "user.add", "user.drop", "start", "reload",
    "broker.silent", "broker.serving",
})


#: The last second _now() formatted and its text: every allocation and release makes an
#: event, and strftime (glibc's reads the time zone each call) is most of a timestamp.
_second: tuple[int, str] = (-1, "")

#: json.dumps with arguments builds an encoder per call; one made once encodes the same.
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode


def _now() -> str:
    global _second
    t = time.time()
    whole = int(t)
    second, text = _second  # one tuple: another thread's update is seen whole or not
    if second != whole:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second = (whole, text)
    return f"{text}.{int(t * 1000) % 1000:03d}Z"


def generation_paths(path: Path, generations: int) -> list[Path]:
    """The files of a rotated log, oldest first: <path>.<generations> ... <path>.1, <path>."""
    return [path.with_name(f"{path.name}.{n}") for n in range(generations, 0, -1)] + [path]


class EventLog:
    """Append events to `path` (None: memory only) and keep the last `keep` of them.

    The file is rotated before it would pass `max_bytes` (0: never), keeping
    `generations` older files."""

    def __init__(self, path: Path | None, keep: int = 1000, *,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 generations: int = DEFAULT_GENERATIONS) -> None:
        if keep < 0:
            raise ValueError(f"keep must be >= 0, not {keep}")
        if max_bytes < 0 or generations < 0:
            raise ValueError(f"max_bytes and generations must be >= 0, not {max_bytes}, "
                             f"{generations}")
        self.path = Path(path) if path is not None else None
        self.max_bytes = max_bytes
        self.generations = generations
        self._recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._open()

    def _open(self) -> None:
        assert self.path is not None
        # O_APPEND: every write lands at the end even with another writer (a
        # second vgpud by mistake, logrotate's copytruncate).
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                           0o640)
        self._size = os.fstat(self._fd).st_size

    def _make_room(self, n: int) -> None:
        """Rotate before a line of n bytes would take the file past max_bytes."""
        if not self.max_bytes or self._fd is None or self._size + n <= self.max_bytes:
            return
        self._size = os.fstat(self._fd).st_size  # another writer may have grown or cut it
        if self._size == 0 or self._size + n <= self.max_bytes:
            return
        try:
            self._shift()
        except OSError as e:
            # Keep writing where we are; the next try is after another max_bytes.
            log.warning("failed to rotate the event log %s: %s", self.path, e.strerror or e)
            self._size = 0
            return
        os.close(self._fd)
        self._fd = None
        try:
            self._open()
        except OSError as e:
            log.warning("failed to open the event log %s: %s; events are kept in memory only",
                        self.path, e.strerror or e)

    def _shift(self) -> None:
        """<path> becomes <path>.1, .1 becomes .2, ...; the oldest generation is dropped."""
        assert self.path is not None
        files = generation_paths(self.path, self.generations)
        if self.generations == 0:
            os.unlink(self.path)
            return
        # Oldest first: each rename replaces the generation above it.
        for older, newer in itertools.pairwise(files):
            if newer.exists():
                os.replace(newer, older)

    def emit(self, kind: str, /, **fields: Any) -> dict[str, Any]:
        """Record one event of `kind` with `fields` (JSON-able; others via str()); return it."""
        event: dict[str, Any] = {"ts": _now(), "kind": kind}
        if "ts" in fields or "kind" in fields:  # the event's own keys are not a field's
            fields = {k: v for k, v in fields.items() if k not in ("ts", "kind")}
        event.update(fields)
        line = (_encode(event) + "\n").encode()
        with self._lock:
            self._make_room(len(line))
            if self._fd is not None:
                view = memoryview(line)
                while view:
                    view = view[os.write(self._fd, view):]
                self._size += len(line)
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


def read_events(path: Path, generations: int = DEFAULT_GENERATIONS) -> list[dict[str, Any]]:
    """Every complete event in an event log and its rotated generations, oldest first
    (a torn line is skipped)."""
    text = ""
    for p in generation_paths(Path(path), generations):
        with contextlib.suppress(FileNotFoundError):
            text += p.read_text(encoding="utf-8", errors="replace") + "\n"
    events: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events
