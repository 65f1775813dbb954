# SPDX-License-Identifier: Apache-2.0
"""simgpu behaving like hardware (docs/simgpu.md): events dated on the engine's timeline.

Real processes (build/tests/simgpu_probe, cuda_client) on a private simulated GPU; what
they report is checked against the engine's own record of what ran when
(build/tests/simgpu_timeline), so the assertions are exact where the timeline is and
never rest on how fast this machine is.
"""
from __future__ import annotations

import json
import subprocess

import pytest
from support.paths import TEST_BIN
from support.process import run

PROBE = str(TEST_BIN / "simgpu_probe")
CLIENT = str(TEST_BIN / "cuda_client")
NS_PER_MS = 1_000_000
FLOAT_NS = 1_000  # cuEventElapsedTime is a float of ms: far finer than this at these lengths

# The engine modes every timeline test runs in (the env of every process on the GPU).
MODES = {
    "fifo": {},
}


@pytest.fixture(params=sorted(MODES))
def mode_env(request: pytest.FixtureRequest, simgpu_env: dict[str, str]) -> dict[str, str]:
    simgpu_env.update(MODES[request.param])
    return simgpu_env


def probe(env: dict[str, str], *args: str) -> dict:
    p = run([PROBE, *args], env, timeout=60)
    return json.loads(p.stdout)


def timeline(env: dict[str, str]) -> list[tuple[int, int, int]]:
    """(start, end, pid) of every run of a kernel, oldest first."""
    out = run([str(TEST_BIN / "simgpu_timeline"), env["SIMGPU_STATE"]], env).stdout
    return [tuple(int(x) for x in line.split()) for line in out.splitlines()]  # type: ignore[misc]


def kernels_of(tl: list[tuple[int, int, int]], pid: int, us: int) -> list[tuple[int, int]]:
    """(start, end) of each of pid's kernels of us us, in order (one stream), from the
    runs of its work on the timeline: a kernel may run in several pieces."""
    out, begin, ran = [], None, 0
    for s, e, p in tl:
        if p != pid:
            continue
        begin = s if begin is None else begin
        ran += e - s
        if ran >= us * 1000:
            assert ran == us * 1000, f"runs of {pid} do not add up to kernels of {us} us"
            out.append((begin, e))
            begin, ran = None, 0
    return out


# ---- events carry the engine's times ----

def test_events_are_dated_by_the_engine(mode_env: dict[str, str]) -> None:
    run([CLIENT, "info"], mode_env)  # the state exists before the two start
    neighbour = subprocess.Popen([CLIENT, "launch", "4", "1500"], env=mode_env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    r = probe(mode_env, "events", "2000")
    assert neighbour.wait(timeout=30) == 0
    ks = kernels_of(timeline(mode_env), r["pid"], 2000)
    assert len(ks) == 3
    ends = [e for _, e in ks]
    # An event after a kernel completes when the kernel ends on the engine, one on an
    # idle stream when it is recorded.
    for i, ms in enumerate(r["idle_to"]):
        recorded = ends[i] - ms * NS_PER_MS
        assert r["record_idle"][0] - FLOAT_NS <= recorded <= r["record_idle"][1] + FLOAT_NS
    for i, ms in enumerate(r["between"]):
        assert abs(ms * NS_PER_MS - (ends[i + 1] - ends[i])) <= FLOAT_NS
    assert abs(r["back"] * NS_PER_MS + (ends[2] - ends[0])) <= FLOAT_NS
    # cuEventQuery turned to CUDA_SUCCESS at the kernel's end, not before.
    assert r["first_last_not_ready"] < ends[0] <= r["first_ready"]
    assert r["query_pending"] == r["pending"] == "CUDA_ERROR_NOT_READY"
    # As the driver: no timing from an event made without it, nor from one never recorded.
    assert r["untimed"] == r["untimed_done"] == r["unrecorded"] == "CUDA_ERROR_INVALID_HANDLE"
