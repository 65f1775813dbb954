# SPDX-License-Identifier: Apache-2.0
"""What vgpud made at its start is frozen for the garbage collector (server.main).

A real vgpud on simgpu, with a sitecustomize first on its PYTHONPATH that answers, when
asked through a file, what the collector holds: the objects frozen and those it tracks
in its generations, the ones a full collection walks. Unfrozen, the start's tens of
thousands of objects were walked by every full pass, which under load held the GIL for
18-31 ms (docs/performance.md)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from support.vgpud_harness import Vgpud, pb

_ASK = '''
import gc, json, os, threading, time
_out = os.environ["VGPU_TEST_GC"]

def _answer():
    while True:
        time.sleep(0.02)
        if os.path.exists(_out + ".ask"):
            # get_objects(): every generation's objects but the frozen ones, what a full
            # pass walks.
            got = {"frozen": gc.get_freeze_count(), "walked": len(gc.get_objects())}
            with open(_out + ".tmp", "w") as f:
                json.dump(got, f)
            os.rename(_out + ".tmp", _out)
            os.unlink(_out + ".ask")

threading.Thread(target=_answer, name="test-gc", daemon=True).start()
'''


def ask(out: Path) -> dict[str, int]:
    out.unlink(missing_ok=True)
    Path(f"{out}.ask").touch()
    deadline = time.monotonic() + 10
    while not out.exists():
        assert time.monotonic() < deadline, "vgpud's test hook never answered"
        time.sleep(0.02)
    return json.loads(out.read_text())


def test_what_start_made_is_frozen_and_full_passes_walk_little(tmp_path, simgpu_env):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_ASK)
    d = tmp_path / "d"
    d.mkdir()
    v = Vgpud(d, simgpu_env)
    v.env["PYTHONPATH"] = f"{hook}{os.pathsep}{v.env['PYTHONPATH']}"
    v.env["VGPU_TEST_GC"] = str(tmp_path / "gc.json")
    v.start()
    try:
        at_start = ask(tmp_path / "gc.json")
        # gRPC, protobuf, jsonschema, the domain: far more than any count of a pair's objects.
        assert at_start["frozen"] > 20_000, at_start
        for i in range(50):
            r = v.stub.Allocate(pb.AllocateRequest(owner=f"gc-{i}", memory_bytes=1 << 30,
                                                   owner_pid=os.getpid()), timeout=10)
            v.stub.Release(pb.ReleaseRequest(id=r.slice.id), timeout=10)
        later = ask(tmp_path / "gc.json")
        # Frozen once, at the start (what of it is let go is still freed, by its count).
        assert later["frozen"] <= at_start["frozen"]
        # What a full collection walks: what came after the start, a small part of it.
        assert later["walked"] < later["frozen"] // 4, later
    finally:
        v.close()
