# SPDX-License-Identifier: Apache-2.0
"""libvgpu never breaks an application's CUDA graph capture.

PyTorch captures CUDA graphs in CU_STREAM_CAPTURE_MODE_GLOBAL: while one thread
captures, a potentially unsafe call (an event query or sync, a stream query) made by
any other thread in global mode fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
invalidates the capture. simgpu enforces that as the driver does (docs/simgpu.md).
libvgpu's holder thread queries and waits on its events all the time, so it runs in
relaxed mode, and libvgpu's own event calls on an application thread run in relaxed
mode while a capture is open. gpu_load --capture-every-us captures a graph in global
mode every 2 ms (held open 1 ms) on one thread while another launches into a throttled
slice beside a greedy neighbour; without the relaxed mode nearly every capture failed
(995 of 1000 when this was written).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from support.gpu_loads import Load, run_loads
from support.measure import TOL, WARM, burst, fixed

SECONDS = 2.5


@pytest.mark.timing   # the slice's share is measured too
def test_a_global_capture_survives_the_holder_thread(tmp_path: Path) -> None:
    capturing = Load(fixed(50), kernel="busy_200us", args=["--capture-every-us", "2000"])
    r = run_loads(tmp_path, [capturing, Load(burst(50), kernel="busy_200us")], SECONDS)
    for t in r.traces:
        assert t.summary["returncode"] == 0, t.stderr
    summary = r.traces[0].summary
    assert summary["captures"] > 500
    assert summary["captures_failed"] == 0
    # ... and the slice is still throttled to its share while it captures.
    assert r.traces[0].share(r.at(WARM), r.at(SECONDS)) <= 50 + TOL
