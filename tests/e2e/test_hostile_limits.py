# SPDX-License-Identifier: Apache-2.0
"""A hostile tenant against its own limits and against vgpud, end to end on real runc
(issue 10: read-only limits, vgpud reads tenant data defensively).

The slice's limits and identity (`/dev/vgpu<i>`) are mounted read-only; its usage
(`/dev/vgpu<i>.usage`) is the only slice file a container can write, and neither
libvgpu nor vgpud trusts it for anything but a count: a process that zeroes it
still cannot allocate past the stored limit, and a file its tenant shrinks and
grows under vgpud never stops a metrics scrape or a `vgpu ls`.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from support.hostile import REFUSED, SCRIBBLE, Host
from support.prereq import require
from support.vgpud_harness import pb

from arbiter.files.region_file import open_region, usage_path_of

require(SCRIBBLE.exists(), "make builds build/tests/scribble")

MiB = 1 << 20
LIMIT = 256 * MiB


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.close()


def probe_results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def test_a_tenant_cannot_raise_its_limits_or_hide_its_usage(host):
    """scribble rewrites the limits (refused: read-only) and zeroes the usage table over and
    over while one process allocates 150 MiB, waits, and asks for 150 MiB more."""
    script = (
        "scribble limits 1.5 > /sim/scribble.json 2> /sim/scribble.err & "
        f"vgpu_probe alloc:mem:{150 * MiB} sleep:1200 alloc:mem:{150 * MiB} "
        f"alloc:mem:{100 * MiB} > /sim/probe.out 2> /sim/probe.err; wait; echo done")
    p, _ = host.start(script, {"vgpu.io/memory": "256Mi"}, extra_bin=SCRIBBLE)
    host.vgpud.wait_for(lambda: len(host.slices()) == 1, timeout=20, what="the slice")
    [s] = host.slices()
    region = Path(s.vgpus[0].region_path)
    with open_region(region, writable=False) as r:
        key, limit = r.slice_key, r.memory_limit
        time.sleep(1.0)  # mid-attack: the host's file is as vgpud made it
        assert p.poll() is None, "the container ended before the attack did"
        assert (r.slice_key, r.memory_limit) == (key, limit) == (key, LIMIT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and "done" in out, (out, err)

    got = [r["result"] for r in probe_results(host.sim / "probe.out") if r.get("op") == "alloc"]
    # The first fits; the second would pass the limit once the first's 150 MiB is counted
    # again (its own slot, zeroed, is rewritten from the process's own tally); 100 fits.
    assert got == ["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY", "CUDA_SUCCESS"], got

    report = json.loads((host.sim / "scribble.json").read_text())
    files = {f["kind"]: f for f in report["files"]}
    limits, usage = files["region"], files["usage"]
    assert limits["mount_ro"] and limits["open_rw"] in REFUSED and limits["open_wo"] in REFUSED
    assert limits["map_rw"] == "EACCES" and limits["writes"] > 0 and limits["writes_ok"] == 0
    assert not usage["mount_ro"] and usage["writes_ok"] > 0  # its own: it did write there


def test_zeroing_the_usage_as_fast_as_it_can_never_lets_an_allocation_through(host):
    """The race the test above can only hit now and then, tried 20000 times: scribble
    zeroes every slot with no pause while a process that holds 150 MiB asks for 150 MiB
    more. libvgpu publishes its own slot for the others but counts its own part from its
    private tally, so a zero written between its write and its sum changes nothing."""
    script = (
        "scribble limits 2 --gap-us 0 > /sim/scribble.json 2> /sim/scribble.err & "
        f"vgpu_probe alloc:mem:{150 * MiB} sleep:300 over_alloc:{150 * MiB}:20000 "
        "> /sim/probe.out 2> /sim/probe.err; wait; echo done")
    p, _ = host.start(script, {"vgpu.io/memory": "256Mi"}, extra_bin=SCRIBBLE)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and "done" in out, (out, err)
    results = probe_results(host.sim / "probe.out")
    assert [r["result"] for r in results if r.get("op") == "alloc"] == ["CUDA_SUCCESS"]
    [over] = [r for r in results if r.get("op") == "over_alloc"]
    assert over == {"op": "over_alloc", "n": 20000, "fit": 0}, over
    report = json.loads((host.sim / "scribble.json").read_text())
    usage = {f["kind"]: f for f in report["files"]}["usage"]
    assert usage["writes_ok"] > 0, usage  # the attack ran meanwhile


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def test_a_usage_file_that_changes_size_never_stops_vgpud(host):
    """scribble truncates its usage file to odd sizes and back for 8 s while vgpud answers
    300 metric scrapes, 300 List calls (what `vgpu ls` asks) and real `vgpu ls` runs."""
    script = ("vgpu_probe alloc:mem:1048576 hold > /dev/null & "
              "scribble truncate 8 --gap-us 200 > /sim/scribble.json 2> /sim/scribble.err; "
              "echo scribble-exit $?")
    p, _ = host.start(script, {"vgpu.io/memory": "256Mi"}, extra_bin=SCRIBBLE)
    host.vgpud.wait_for(lambda: len(host.slices()) == 1, timeout=20, what="the slice")
    [s] = host.slices()
    port = host.vgpud.metrics_port
    assert port, host.vgpud.log()
    cli = [sys.executable, "-m", "vgpu_cli", "--socket", str(host.vgpud.socket), "ls"]
    failures: list[str] = []

    def cli_calls() -> None:
        while p.poll() is None:
            r = subprocess.run(cli, capture_output=True, text=True, env=host.env, timeout=60)
            if r.returncode != 0:
                failures.append(r.stderr)
            time.sleep(0.2)

    t = threading.Thread(target=cli_calls)
    t.start()
    for _ in range(300):
        assert "vgpu_slice_memory" in _scrape(port)
        host.vgpud.stub.List(pb.ListRequest(), timeout=10)
    out, err = p.communicate(timeout=60)
    t.join(timeout=60)
    assert "scribble-exit 0" in out, (out, err)
    assert not failures, failures[:3]
    report = json.loads((host.sim / "scribble.json").read_text())
    usage = {f["kind"]: f for f in report["files"]}["usage"]
    assert usage["truncates_ok"] > 0, usage  # it did flip the size under vgpud
    assert host.healthy() and host.vgpud.proc.poll() is None
    # Said, not fatal: an event and a metric.
    assert host.vgpud.events("usage.malformed"), host.vgpud.log()
    text = _scrape(port)
    line = next(ln for ln in text.splitlines() if ln.startswith("vgpu_usage_file_errors_total"))
    assert float(line.split()[-1]) >= 1
    assert not usage_path_of(Path(s.vgpus[0].region_path)).exists()  # released at exit
