# SPDX-License-Identifier: Apache-2.0
"""A broker's record plays back to the decisions it made (libvgpu/src/broker_record.h).

With VGPU_BROKER_RECORD=DIR the broker writes down every input of its pure policy;
build/tests/policy_replay plays the record through the same policy again. That is how a
run that charges wrongly becomes a trace test, so the replay must give exactly what the
broker published: the same charges to the nanosecond and as many grants.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from support.gpu_loads import Load, run_loads
from support.measure import burst, fixed
from support.paths import TEST_BIN

from arbiter.files.sched_files import open_sched

REPLAY = TEST_BIN / "policy_replay"


def test_a_record_replays_to_the_charges_and_grants_the_broker_published(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    record_to = {"VGPU_BROKER_RECORD": str(rec)}
    loads = [Load(fixed(30, **record_to), kernel="busy_200us"),
             Load(burst(70, **record_to), kernel="busy_200us")]
    run_loads(tmp_path, loads, 1.0)
    [gpu_file] = [p for p in (tmp_path / "sched").iterdir() if "." not in p.name]
    with open_sched(gpu_file) as sched:
        raw = sched.snapshot()
    [record] = list(rec.iterdir())
    assert record.name == f"{gpu_file.name}.rec"
    out = subprocess.run([str(REPLAY)], stdin=record.open(), capture_output=True, text=True,
                         check=True, timeout=60).stdout
    used = {int(i): float(ms) for i, ms in re.findall(r"account (\d+) used=([\d.]+)", out)}
    assert len(used) == 2
    # The record holds the run: two greedy loads kept the GPU busy for about 1 s.
    charged = sum(float(ms) for ms in re.findall(r" charge \d+ ([\d.]+)", out))
    charged -= sum(float(ms) for ms in re.findall(r" refund \d+ ([\d.]+)", out))
    assert charged > 500, out[-2000:]
    # The GPU file shows the last broker's accounting (a standalone GPU elects another
    # when the first one's process ends; the record starts over there, as that broker did).
    published = {i: raw.entries[i].used_ns / 1e6 for i in used}
    for i, ms in used.items():
        assert abs(ms - published[i]) < 0.001, (i, ms, published[i])
    assert out.count(" grant ") == raw.handoffs


def test_a_broken_record_line_is_named(tmp_path: Path) -> None:
    got = subprocess.run([str(REPLAY)], input="broker 1\nstep 5\nreq 0 1 2\n", capture_output=True,
                         text=True, timeout=10)
    assert got.returncode == 2
    assert got.stderr == "policy_replay: a req line has an index and 17 claims: req 0 1 2\n"
