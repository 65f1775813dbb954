# SPDX-License-Identifier: Apache-2.0
"""The event log is bounded: rotated by size into a few generations, read across them."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.vgpud_harness import Vgpud, pb

from arbiter.config import load_config
from arbiter.daemon.events import EventLog, generation_paths, read_events
from arbiter.errors import ConfigError

GiB = 1 << 30


def test_a_log_past_its_bound_rotates_between_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with EventLog(path, max_bytes=1000, generations=2) as log:
        for n in range(200):
            log.emit("allocate", slice=f"s{n:03d}", pad="x" * 40)
    files = generation_paths(path, 2)
    assert [p.name for p in files] == ["events.jsonl.2", "events.jsonl.1", "events.jsonl"]
    assert all(p.stat().st_size <= 1000 for p in files)
    assert not (tmp_path / "events.jsonl.3").exists()
    for p in files:  # every line of every generation is a whole event
        assert all(json.loads(line)["kind"] == "allocate" for line in p.read_text().splitlines())
    events = read_events(path, generations=2)
    # The newest events, in order, with nothing missing between the oldest kept and the last.
    slices = [e["slice"] for e in events]
    assert slices[-1] == "s199"
    assert slices == [f"s{n:03d}" for n in range(200 - len(slices), 200)]
    assert len(slices) > 20


def test_a_log_reopened_after_a_restart_keeps_counting_its_size(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    for _ in range(3):  # three vgpud lives, each writing a little
        with EventLog(path, max_bytes=1000, generations=1) as log:
            for _ in range(10):
                log.emit("start", pad="y" * 40)
    assert path.stat().st_size <= 1000
    assert (tmp_path / "events.jsonl.1").stat().st_size <= 1000


def test_a_log_whose_rotation_fails_keeps_writing(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    (tmp_path / "events.jsonl.1").mkdir()  # a directory in the way: the rename fails
    (tmp_path / "events.jsonl.1" / "x").write_text("")
    with EventLog(path, max_bytes=500, generations=1) as log:
        for n in range(40):
            log.emit("release", n=n)
    assert read_events(path, generations=0)[-1]["n"] == 39


@pytest.mark.parametrize("value, why", [
    ("1Ki", "'1Ki' is below the smallest event log, 4Ki"),
    ("0", "max_size: 0 is below the smallest event log, 4Ki"),
    ("lots", "'lots' is not 0 or a memory quantity"),
], ids=["too-small", "zero", "not-a-quantity"])
def test_a_bad_max_size_is_one_line_naming_key_and_value(tmp_path: Path, value: str,
                                                         why: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(f"events:\n  max_size: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert "events.max_size" in str(info.value) and why in str(info.value)
    assert "\n" not in str(info.value)


def test_vgpud_rotates_its_own_event_log_and_readers_see_the_newest(
        tmp_path: Path, simgpu_env: dict[str, str]) -> None:
    v = Vgpud(tmp_path, simgpu_env, {"events": {"max_size": "4Ki", "generations": 2}}).start()
    try:
        last = ""
        for n in range(60):  # ~250 bytes an allocate + release: ~7 files' worth
            s = v.stub.Allocate(pb.AllocateRequest(owner=f"c{n}", memory_bytes=GiB,
                                                   owner_pid=os.getpid()), timeout=10).slice
            v.stub.Release(pb.ReleaseRequest(id=s.id), timeout=10)
            last = s.id
        files = generation_paths(v.events_path, 2)
        sizes = [p.stat().st_size for p in files]
        assert all(0 < size <= 4096 for size in sizes), sizes
        assert not v.events_path.with_name("events.jsonl.3").exists()
        # The readers (vgpud_harness's events(), arbiter.daemon.events.read_events) see the newest.
        released = [e["slice"] for e in v.events("release")]
        assert released[-1] == last
        assert read_events(v.events_path, generations=2)[-1]["slice"] == last
        # The oldest events went with the dropped generation.
        assert not [e for e in v.events("allocate") if e["owner"] == "c0"]
    finally:
        v.close()
