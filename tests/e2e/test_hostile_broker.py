# SPDX-License-Identifier: Apache-2.0
"""A tenant cannot keep the token broker from serving its GPU (issue 22, item 1), on real runc.

Every container of a GPU has the GPU's scheduling file mounted read-only, and a read-only
fd allows flock, a read lock and, to container root (it owns what host root made), a read
lease. The broker used to serve a GPU file while it held that file's flock: a tenant
waiting in flock took it the moment the broker restarted (a crash, an upgrade's hand-over,
a DaemonSet restart), the new broker never served, and every throttled slice of the GPU
waited for a grant forever, with vgpud saying nothing. And with no broker holding the file
open for writing, a lease made the new broker's open wait 45 s.

Here scribble (build/tests/scribble, mode `lock`) takes every such lock on its files again
and again; the broker is killed with SIGKILL and vgpud's supervisor starts another. The new
one serves at once (its lock is in the sched dir, which no container reaches), a
neighbour's throttled work runs, and vgpud never had a silent broker to report.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest
from support.hostile import SCRIBBLE, Host

from arbiter.sched import open_sched

pytestmark = pytest.mark.skipif(shutil.which("runc") is None or os.geteuid() != 0,
                                reason="needs runc and root (real containers)")

ATTACK_S = 20.0     # scribble's locks are held (and taken again) this long
SERVE_WITHIN_S = 5.0  # the supervisor restarts at once; the new broker serves in ms


def serving_pid(host: Host) -> int:
    with open_sched(host.gpu_file()) as s:
        return s.summary(time.monotonic_ns()).broker_pid


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.close()


def test_a_tenants_locks_on_its_gpu_file_cannot_keep_a_restarted_broker_from_serving(host):
    until = time.monotonic_ns() + int(ATTACK_S * 1e9)
    attacker, _ = host.start(
        f"scribble lock 0 --gap-us 1000 --until {until} > /sim/scribble.json "
        "2> /sim/scribble.err; echo scribble-exit $?",
        {"vgpu.io/memory": "64Mi", "vgpu.io/compute": "20", "vgpu.io/policy": "fixed"},
        extra_bin=SCRIBBLE)
    host.vgpud.wait_for(lambda: "scribble: found" in _read(host.sim / "scribble.err"),
                        timeout=30, what="scribble at work")
    [old] = host.broker_pids()
    host.vgpud.wait_for(lambda: serving_pid(host) == old, what="the first broker serving")
    time.sleep(1.0)  # scribble has tried every lock a few hundred times by now

    os.kill(old, signal.SIGKILL)
    host.vgpud.wait_for(lambda: serving_pid(host) not in (0, old), timeout=SERVE_WITHIN_S,
                        what="a new broker serving the GPU while the tenant holds its locks")

    # A throttled neighbour's work runs under the new broker (with none it would wait forever).
    p, _ = host.start("gpu_load --kernel busy_1000us --seconds 1; echo load-exit $?",
                      {"vgpu.io/memory": "64Mi", "vgpu.io/compute": "50",
                       "vgpu.io/policy": "fixed"})
    out, err = p.communicate(timeout=60)
    assert "load-exit 0" in out, (out, err)
    summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert summary.get("launches", 0) > 0, summary

    a_out, a_err = attacker.communicate(timeout=ATTACK_S + 30)
    assert "scribble-exit 0" in a_out, (a_out, a_err)
    report = json.loads((host.sim / "scribble.json").read_text())
    # The attack happened: the tenant held flock on its files (nobody else wants it now).
    assert report["lock"]["flocks"] > 0, report["lock"]
    assert host.vgpud.events("broker.silent") == []
    assert host.healthy()


def _read(path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
