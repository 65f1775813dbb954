# SPDX-License-Identifier: Apache-2.0
"""arbiter.daemon.events: JSON-lines event log with a bounded in-memory tail."""
from __future__ import annotations

import json
import re
import threading
from datetime import datetime
from pathlib import Path

import pytest
from support.paths import ROOT

from arbiter.daemon.events import KINDS, EventLog, read_events


def test_emit_writes_one_json_line(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "events.jsonl"          # parent made on demand
    with EventLog(path) as log:
        event = log.emit("allocate", slice="s1", owner="c1", gpus=[0, 1], memory=1 << 30)
    assert event["kind"] == "allocate"
    assert event["slice"] == "s1" and event["gpus"] == [0, 1]
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0]) == event
    offset = datetime.fromisoformat(event["ts"]).utcoffset()
    assert offset is not None and offset.total_seconds() == 0
    assert event["ts"].endswith("Z")


def test_order_and_recent(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "e.jsonl", keep=3)
    for i in range(5):
        log.emit("release", n=i)
    assert [e["n"] for e in log.recent()] == [2, 3, 4]          # keep bounds memory
    assert [e["n"] for e in log.recent(2)] == [3, 4]
    assert log.recent(0) == []
    assert [e["n"] for e in log.recent(10)] == [2, 3, 4]
    assert [e["n"] for e in read_events(tmp_path / "e.jsonl")] == [0, 1, 2, 3, 4]  # file: all
    log.close()


def test_appends_to_an_existing_log(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    with EventLog(path) as log:
        log.emit("start", version="0.1.0")
    with EventLog(path) as log:
        log.emit("reload", changed=["placement_policy"])
        assert [e["kind"] for e in log.recent()] == ["reload"]   # memory starts empty
    assert [e["kind"] for e in read_events(path)] == ["start", "reload"]


def test_memory_only() -> None:
    log = EventLog(None)
    log.emit("evict", slice="s")
    assert log.path is None
    assert [e["kind"] for e in log.recent()] == ["evict"]


def test_non_json_values_are_stringified(tmp_path: Path) -> None:
    with EventLog(tmp_path / "e.jsonl") as log:
        event = log.emit("update", path=Path("/run/vgpu/slices/x"))
    assert read_events(tmp_path / "e.jsonl")[0]["path"] == "/run/vgpu/slices/x"
    assert event["path"] == Path("/run/vgpu/slices/x")


def test_fields_cannot_shadow_ts_or_kind(tmp_path: Path) -> None:
    log = EventLog(None)
    event = log.emit("allocate", **{"ts": "bogus", "kind": "bogus", "x": 1})
    assert event["kind"] == "allocate" and event["ts"] != "bogus" and event["x"] == 1


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    with EventLog(path) as log:
        log.emit("allocate", slice="a")
    with path.open("a") as f:
        f.write('{"ts": "2024-01-01T00:00:00Z", "kind": "rel')     # crash mid-write
    assert [e["slice"] for e in read_events(path)] == ["a"]
    assert read_events(tmp_path / "missing.jsonl") == []


def test_after_close_memory_still_works(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "e.jsonl")
    log.close()
    log.close()                                        # idempotent
    log.emit("release", slice="x")
    assert log.recent(1)[0]["slice"] == "x"
    assert read_events(tmp_path / "e.jsonl") == []


def test_negative_keep_is_refused() -> None:
    with pytest.raises(ValueError, match="keep"):
        EventLog(None, keep=-1)


def test_threads_never_interleave_lines(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    log = EventLog(path, keep=100_000)
    threads_n, per_thread = 8, 250
    padding = "x" * 2000                               # lines longer than a pipe buffer chunk

    def worker(t: int) -> None:
        for i in range(per_thread):
            log.emit("allocate", thread=t, i=i, pad=padding)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()
    lines = path.read_text().splitlines()
    assert len(lines) == threads_n * per_thread
    events = [json.loads(line) for line in lines]      # every line is whole JSON
    for t in range(threads_n):
        assert [e["i"] for e in events if e["thread"] == t] == list(range(per_thread))
    # The file and memory agree on the order.
    assert [(e["thread"], e["i"]) for e in log.recent()] == [(e["thread"], e["i"]) for e in events]


def test_kinds_are_the_documented_ones() -> None:
    """KINDS is the list in docs/vgpud.md, and every kind vgpud's code emits is in it."""
    page = (ROOT / "docs" / "vgpud.md").read_text()
    listed = page.split("- **Events**:", 1)[1].split("\n\n", 1)[0]
    documented = {k.strip(" .\n") for k in listed.replace("\n", " ").split(",")}
    assert documented == KINDS
    emitted = set()
    for src in (ROOT / "arbiter").rglob("*.py"):
        emitted |= set(re.findall(r'emit\(\s*"([a-z_.]+)"', src.read_text()))
    emitted |= {f"{verb}.refused" for verb in ("allocate", "attach", "release")}
    assert emitted <= KINDS, emitted - KINDS
