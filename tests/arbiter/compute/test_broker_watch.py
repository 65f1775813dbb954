# SPDX-License-Identifier: Apache-2.0
"""vgpud notices a GPU whose token broker does not serve (issue 22, item 1).

The rule (arbiter.compute.broker_watch.hear) as traces of heartbeats, then a real vgpud whose real
vgpu-broker is stopped with SIGSTOP (alive, silent: what a broker kept from its lock
looks like) and let go again: the events, the gauge and `vgpu smi` say so.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from support.paths import ROOT
from support.vgpud_harness import Vgpud, pb

from arbiter.compute.broker_watch import SILENT_REPORT_NS, Heard, hear
from arbiter.files.sched_files import BROKER_DEAD_NS

MS = 1_000_000


def trace(beats: list[tuple[int, int]], watched_ms: int = 0) -> list[tuple[int, str]]:
    """(look time ms, beat ms or -1 for none) in; (look time ms, event) out."""
    h, out = Heard(), []
    for now, beat in beats:
        h, event = hear(h, beat * MS if beat >= 0 else 0, 7, now * MS, watched_ms * MS)
        if event:
            out.append((now, event))
    return out


def test_a_broker_that_beats_is_never_reported():
    assert trace([(t, t - 5) for t in range(0, 5000, 500)]) == []


def test_a_silence_is_reported_once_a_second_after_the_last_beat_and_its_end_once():
    beats = [(0, 0), (500, 490), (1000, 490), (1400, 490), (1500, 490), (2000, 490),
             (2500, 2495), (3000, 2995)]
    assert trace(beats) == [(1500, "broker.silent"), (2500, "broker.serving")]


def test_a_short_silence_a_restart_takes_is_not_reported():
    beats = [(0, 0), (500, 400), (1000, 995)]  # 600 ms without a beat, then beating again
    assert trace(beats) == []


def test_a_beat_older_than_the_watch_dates_the_silence_from_the_watchs_start():
    """A stale beat a broker left before this vgpud started is no news at once."""
    assert trace([(10_000, 3), (10_500, 3)], watched_ms=10_000) == []
    assert trace([(10_000, 3), (11_000, 3)], watched_ms=10_000) == [(11_000, "broker.silent")]


def test_a_file_no_broker_ever_served_is_reported_after_the_grace():
    assert trace([(0, -1), (999, -1), (1000, -1), (3000, -1)]) == [(1000, "broker.silent")]


def test_the_rule_is_the_brokers_own_dead_time():
    """Just inside BROKER_DEAD_NS is serving; at it, silent (libvgpu's rule too)."""
    alive, _ = hear(Heard(), 1, 7, 1 + BROKER_DEAD_NS - 1, 0)
    dead, _ = hear(Heard(), 1, 7, 1 + BROKER_DEAD_NS, 0)
    assert alive.silent_since is None and dead.silent_since == 1
    assert SILENT_REPORT_NS > BROKER_DEAD_NS


def _smi(v) -> str:
    return subprocess.run([sys.executable, "-m", "vgpu_cli", "--socket", str(v.socket), "smi"],
                          cwd=ROOT, env=v.env, capture_output=True, text=True, timeout=60,
                          check=True).stdout


def _serving_gauge(v) -> str:
    body = urllib.request.urlopen(f"http://127.0.0.1:{v.metrics_port}/metrics",
                                  timeout=5).read().decode()
    return "\n".join(line for line in body.splitlines()
                     if line.startswith("vgpu_gpu_broker_serving{"))


@pytest.fixture
def daemons(tmp_path, simgpu_env):
    made: list[Vgpud] = []

    def make() -> Vgpud:
        v = Vgpud(tmp_path, simgpu_env, None, "16Gi")
        made.append(v)
        return v

    yield make
    for v in made:
        v.close()


def test_vgpud_says_when_its_broker_stops_serving_and_when_it_serves_again(daemons):
    v = daemons().start()
    [broker] = [int(p) for p in (v.run_dir / "vgpu-broker.pid").read_text().split()]
    v.wait_for(lambda: _serving_gauge(v).endswith(" 1.0"), what="the gauge at 1")
    os.kill(broker, signal.SIGSTOP)
    try:
        v.wait_for(lambda: v.events("broker.silent"), timeout=10, what="broker.silent")
        [silent] = v.events("broker.silent")
        assert silent["gpu"] == 0 and silent["pid"] == broker and silent["silent_s"] >= 1.0
        # (a scrape may reuse a snapshot up to SNAPSHOT_REUSE_S old)
        v.wait_for(lambda: _serving_gauge(v).endswith(" 0.0"), timeout=3, what="the gauge at 0")
        [dev] = v.stub.Devices(pb.DevicesRequest(), timeout=5).devices
        assert dev.broker.startswith("not serving: no heartbeat for "), dev.broker
        smi = _smi(v)
        assert "BROKER not serving: no heartbeat for" in smi, smi
    finally:
        os.kill(broker, signal.SIGCONT)
    v.wait_for(lambda: v.events("broker.serving"), timeout=10, what="broker.serving")
    [back] = v.events("broker.serving")
    assert back["pid"] == broker
    v.wait_for(lambda: _serving_gauge(v).endswith(" 1.0"), timeout=3, what="the gauge at 1")
    assert v.stub.Devices(pb.DevicesRequest(), timeout=5).devices[0].broker == ""
    time.sleep(0.6)
    assert len(v.events("broker.silent")) == 1  # once per silence
