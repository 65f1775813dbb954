# SPDX-License-Identifier: Apache-2.0
"""simgpu behaving like hardware (docs/simgpu.md): events dated on the engine's timeline,
syncs that wake up as a host does (SIMGPU_WAKE_US), stream capture's rules, the timed
engine (concurrent streams, time slices, a process dying inside it).

Real processes (build/tests/simgpu_probe, cuda_client) on a private simulated GPU; what
they report is checked against the engine's own record of what ran when
(build/tests/simgpu_timeline), so the assertions are exact where the timeline is and
never rest on how fast this machine is.
"""
from __future__ import annotations

import itertools
import json
import struct
import subprocess
import time
from pathlib import Path

import pytest
from support.gpu_loads import Load, engine_timeline, run_loads, timeline_shares
from support.paths import SIMGPU_DIR, TEST_BIN
from support.process import clean_env, run

PROBE = str(TEST_BIN / "simgpu_probe")
CLIENT = str(TEST_BIN / "cuda_client")
NS_PER_MS = 1_000_000
FLOAT_NS = 1_000  # cuEventElapsedTime is a float of ms: far finer than this at these lengths

# The engine modes every timeline test runs in (the env of every process on the GPU).
SLICE = {"SIMGPU_TIMESLICE_US": "1000", "SIMGPU_SWITCH_US": "20"}
STREAMS = {"SIMGPU_CONCURRENT_STREAMS": "1"}
MODES = {
    "fifo": {},
    "streams": STREAMS,
    "slice": SLICE,
    "slice-streams": {**SLICE, **STREAMS},
}


@pytest.fixture(params=sorted(MODES))
def mode_env(request: pytest.FixtureRequest, simgpu_env: dict[str, str]) -> dict[str, str]:
    simgpu_env.update(MODES[request.param])
    return simgpu_env


def probe(env: dict[str, str], *args: str) -> dict:
    p = run([PROBE, *args], env, timeout=60)
    return json.loads(p.stdout)


def client(env: dict[str, str], *args: str) -> dict:
    return json.loads(run([CLIENT, *args], env, timeout=60).stdout)


def nvml_info(env: dict[str, str]) -> dict:
    return json.loads(run([str(TEST_BIN / "nvml_client"), "info"], env, timeout=60).stdout)


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
    # An event after a kernel completes when the kernel ends on the engine; one recorded
    # when the stream is idle (the idle one; one after a kernel that ended before its
    # record, the probe descheduled that long) completes when the engine gets to the
    # probe's context: as it is recorded on the FIFO engine or with nothing else queued,
    # else at the probe's turn (the neighbour's slice time-sliced, its older kernels first
    # come first served), where the probe's first kernel starts, or before. The idle
    # event's time T lies between the probe's clock reads around its record or up to that
    # start; every other is T + its elapsed time.
    t0, t1 = r["record_idle"]
    t1 = max(t1, ks[0][0])
    for i, ms in enumerate(r["idle_to"]):
        lo, hi = t0 + ms * NS_PER_MS - FLOAT_NS, t1 + ms * NS_PER_MS + FLOAT_NS
        rec0, rec1 = r["recorded"][i]
        if rec1 < ends[i]:      # recorded while the kernel ran: at its end
            assert lo <= ends[i] <= hi
        else:                   # recorded after it: as recorded
            assert lo <= rec1 and max(ends[i], rec0) <= hi
    for i, ms in enumerate(r["between"]):
        if r["recorded"][i][1] < ends[i] and r["recorded"][i + 1][1] < ends[i + 1]:
            assert abs(ms * NS_PER_MS - (ends[i + 1] - ends[i])) <= FLOAT_NS
    # cuEventQuery turned to CUDA_SUCCESS at the first kernel's end (or its event's
    # record), not before.
    done0 = max(ends[0], r["recorded"][0][0])
    assert r["first_last_not_ready"] < done0 <= r["first_ready"]
    # The last event is pending while its kernel runs: asked before that kernel's end, a
    # query and an elapsed time answer NOT_READY. (Asked after it, the probe was kept off
    # its CPU for the three kernels' length by a loaded host: nothing was pending.)
    if r["pending_asked"] < ends[2]:
        assert r["query_pending"] == r["pending"] == "CUDA_ERROR_NOT_READY"
    # As the driver: no timing from an event made without it, nor from one never recorded.
    assert r["untimed"] == r["untimed_done"] == r["unrecorded"] == "CUDA_ERROR_INVALID_HANDLE"


@pytest.mark.parametrize("mode", ["slice", "slice-streams"])
def test_an_idle_streams_event_completes_at_its_contexts_turn(simgpu_env: dict[str, str],
                                                                mode: str) -> None:
    """Time-sliced, a record on an idle stream while another context runs is work of the
    recording context: it completes when that context next gets the engine, where its
    first kernel starts, not as it is recorded (libvgpu's start event says by it when a
    hold's work first ran, docs/compute.md, "Shared tail")."""
    env = {**simgpu_env, **MODES[mode]}
    run([CLIENT, "info"], env)
    neighbour = subprocess.Popen([CLIENT, "launch", "4", "1500"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.002)  # (its kernels are queued long before the probe has started)
    r = probe(env, "events", "2000")
    assert neighbour.wait(timeout=30) == 0
    tl = timeline(env)
    t1 = r["record_idle"][1]
    if not any(p == neighbour.pid and s <= t1 < e for s, e, p in tl):
        pytest.skip("the neighbour's kernels had ended before the probe's record")
    first, ended0 = kernels_of(tl, r["pid"], 2000)[0]
    at = ended0 - r["idle_to"][0] * NS_PER_MS  # the idle event's time on the engine
    assert at > t1 + FLOAT_NS
    assert abs(at - first) <= FLOAT_NS


# ---- SIMGPU_WAKE_US: a host's wake-up latency after the work's end ----

SYNCS = ["stream", "ctx", "event-blocking", "event-spin"]


M64 = (1 << 64) - 1


def wake_draws(seed: int, n: int, lo_ns: int, hi_ns: int, thread: int = 0) -> list[int]:
    """The latencies simgpu draws with SIMGPU_WAKE_SEED (state.c): a thread's n-th sync
    has the n-th of a xorshift64* seeded by splitmix64 from seed and the thread's number."""
    z = (seed + (thread + 1) * 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    x, out = (z ^ (z >> 31)) | 1, []
    for _ in range(n):
        x ^= x >> 12
        x ^= (x << 25) & M64
        x ^= x >> 27
        out.append(lo_ns + ((x * 0x2545F4914F6CDD1D) & M64) % (hi_ns - lo_ns + 1))
    return out


def wake_run(env: dict[str, str], sync: str, n: int = 30,
             us: int = 1000) -> list[tuple[int, int]]:
    """(i, ns from kernel i's end on the engine to its sync's return) for the syncs that
    had to wait: one called after the end (the probe descheduled that long on a busy
    machine) returns at once, by design, and is left out."""
    r = probe(env, "wake", sync, str(n), str(us))
    ends = [e for _, e in kernels_of(timeline(env), r["pid"], us)]
    assert len(ends) == n
    waited = [(i, r["returned"][i] - ends[i]) for i in range(n)
              if r["called"][i] < ends[i] - 200_000]  # 200 us: the sync's own way in
    assert len(waited) >= n // 2, "the probe was too slow to catch its kernels running"
    return waited


def host_lateness(env: dict[str, str]) -> int:
    """This host's own median lateness (ns) after a sleep to an absolute time, measured
    now: what any sleeper here pays, simgpu or not."""
    late = sorted(probe(env, "sleep", "30", "1000")["late"])
    return late[len(late) // 2]


@pytest.mark.timing   # how late a sync returns: a busy machine adds its own lateness
@pytest.mark.parametrize("sync", SYNCS)
def test_syncs_return_at_the_work_end_by_default(mode_env: dict[str, str], sync: str) -> None:
    """Without SIMGPU_WAKE_US a sync adds no wake-up of its own: it returns within this
    host's own sleep lateness (measured beside it: 76-91 us p50 on this project's VMs, a
    few us on a quiet bare-metal host) and 50 us more for its yields on a busy machine.
    A blocking event's sleep wakes up as late as the host makes it, twice over at most."""
    host = host_lateness(mode_env)
    lat = sorted(x for _, x in wake_run(mode_env, sync))
    assert lat[0] >= 0
    bound = max(500_000, 2 * host) if sync == "event-blocking" else host + 50_000
    assert lat[len(lat) // 2] < bound, (lat, host)


@pytest.mark.timing
@pytest.mark.parametrize("sync", SYNCS)
def test_syncs_wake_up_min_to_max_after_the_work_end(mode_env: dict[str, str],
                                                      sync: str) -> None:
    mode_env.update(SIMGPU_WAKE_US="300-600", SIMGPU_WAKE_SEED="21")
    drawn = wake_draws(21, 30, 300_000, 600_000)
    waited = wake_run(mode_env, sync)
    # Each sync returns no earlier than its own draw after the work's end (exact: the wait
    # is to a time); a busy machine only adds to it, loosely bounded here.
    assert all(lat >= drawn[i] for i, lat in waited), [(lat, drawn[i]) for i, lat in waited]
    extra = sorted(lat - drawn[i] for i, lat in waited)
    assert extra[len(extra) // 2] < 1_000_000, extra


def test_unseeded_wake_ups_spread_over_the_range(simgpu_env: dict[str, str]) -> None:
    # A range wide enough that a busy machine's own lateness (a few hundred us under
    # make test's parallel phase) cannot push the early half of the draws past its middle.
    simgpu_env["SIMGPU_WAKE_US"] = "300-8300"
    lat = sorted(x for _, x in wake_run(simgpu_env, "stream", n=40))
    assert lat[0] >= 300_000, lat
    assert sum(x <= 4_300_000 for x in lat) >= 0.1 * len(lat), lat  # not all late in the range
    assert lat[-1] - lat[0] >= 1_000_000, lat                     # and not all the same


def test_a_sync_of_finished_work_returns_at_once(simgpu_env: dict[str, str]) -> None:
    simgpu_env["SIMGPU_WAKE_US"] = "50000"   # a fixed 50 ms, were it applied
    r = client(simgpu_env, "exercise")
    # exercise syncs a finished stream, queries and times events: all would take 50 ms
    # more each if a sync of done work waited for a wake-up.
    assert 19.5 <= r["sync_ms"] <= 20 + 50 + 30       # one real wait: 20 ms + one wake-up
    assert 0.95 <= r["kernel_ms"] <= 1.5              # event times are the engine's, unmoved


@pytest.mark.parametrize("value, why", [
    ("fast", "not MIN-MAX in whole microseconds (e.g. 20-200)"),
    ("20-", "not MIN-MAX in whole microseconds (e.g. 20-200)"),
    ("-20", "not MIN-MAX in whole microseconds (e.g. 20-200)"),
    ("20-200-300", "not MIN-MAX in whole microseconds (e.g. 20-200)"),
    ("20 - 200", "not MIN-MAX in whole microseconds (e.g. 20-200)"),
    ("300-200", "MIN is above MAX"),
    ("0-2000000", "MAX is above 1000000 (1 s)"),
])
def test_a_bad_wake_value_is_refused_with_one_line(simgpu_env: dict[str, str], value: str,
                                                   why: str) -> None:
    simgpu_env["SIMGPU_WAKE_US"] = value
    p = run([CLIENT, "info"], simgpu_env, check=False)
    assert p.returncode == 1 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert lines[0] == f'simgpu: SIMGPU_WAKE_US="{value}": {why}'
    assert "CUDA_ERROR_NO_DEVICE" in lines[-1] and len(lines) == 2


# ---- stream capture: the driver's rules on unsafe calls beside a capture ----

# What an H200's driver answered to build/tests/simgpu_probe capture, scenario by scenario
# (run on a GPU, the probe's kernel is PTX); simgpu must answer the same.
UNSUPPORTED = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
INVALIDATED = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
BROKEN = {"rc": UNSUPPORTED, "launch_after": INVALIDATED, "status": 2,  # ..._STATUS_INVALIDATED
          "end": INVALIDATED, "graph": False}
ALLOWED = {"rc": "CUDA_SUCCESS", "launch_after": "CUDA_SUCCESS", "status": 1,  # ..._ACTIVE
           "end": "CUDA_SUCCESS", "graph": True}
CAPTURE = {
    # Another thread's sync or query (its own stream and event) while a thread captures in
    # global mode: refused, and the capture is invalidated.
    "global/query_event": BROKEN,
    "global/sync_event": BROKEN,
    "global/query_stream": BROKEN,
    "global/sync_stream": BROKEN,
    "global/sync_ctx": BROKEN,
    # ... unless that thread is not in global mode itself.
    "global/thread_local_query": ALLOWED,
    "global/relaxed_query": ALLOWED,
    "global/relaxed_sync_stream": ALLOWED,
    # Thread-local and relaxed captures leave other threads alone.
    "thread_local/query_event": ALLOWED,
    "relaxed/query_event": ALLOWED,
    # The capturing thread itself: refused in its own capture unless either is relaxed.
    "self/global": BROKEN,
    "self/thread_local": BROKEN,
    "self/relaxed_capture": ALLOWED,
    "self/relaxed_thread": ALLOWED,
    # Whatever the modes: the capturing stream, an event recorded into the capture, the
    # context that holds it.
    "conflict/query_capturing_stream": BROKEN,
    "conflict/query_captured_event": dict(BROKEN, rc="CUDA_ERROR_CAPTURED_EVENT"),
    "conflict/sync_ctx": BROKEN,
    "conflict/sync_capturing_stream": BROKEN,
    # A capture that is not relaxed, ended on another thread, is over with no graph.
    "end/other_thread": {"rc": "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
                         "launch_after": "CUDA_SUCCESS", "status": 0,  # ..._STATUS_NONE
                         "end": "CUDA_ERROR_ILLEGAL_STATE", "graph": False},
    "end/other_thread_relaxed": {"rc": "CUDA_SUCCESS", "launch_after": "CUDA_SUCCESS",
                                 "status": 0, "end": "CUDA_ERROR_ILLEGAL_STATE", "graph": False},
}


@pytest.fixture(scope="module")
def capture_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    env = clean_env()
    env["SIMGPU_STATE"] = str(tmp_path_factory.mktemp("capture") / "simgpu.state")
    env["LD_LIBRARY_PATH"] = str(SIMGPU_DIR)
    return probe(env, "capture")


@pytest.mark.parametrize("case", list(CAPTURE))
def test_capture_rules(capture_report: dict, case: str) -> None:
    got = {k: capture_report[case][k] for k in CAPTURE[case]}
    assert got == CAPTURE[case], capture_report[case]


def test_exchange_capture_mode_swaps_and_checks(capture_report: dict) -> None:
    # THREAD_LOCAL in, GLOBAL (the default) out; GLOBAL in, THREAD_LOCAL out.
    assert capture_report["exchange"] == ["CUDA_SUCCESS", 0, "CUDA_SUCCESS", 1]
    assert capture_report["exchange_bad"] == capture_report["exchange_null"] == \
        "CUDA_ERROR_INVALID_VALUE"


# ---- the timed engine: concurrent streams ----

def union_ns(spans: list[tuple[int, int]]) -> int:
    total, end = 0, 0
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def runs_of(tl: list[tuple[int, int, int]], pid: int) -> list[tuple[int, int]]:
    return [(s, e) for s, e, p in tl if p == pid]


@pytest.mark.parametrize("mode", ["streams", "slice-streams"])
def test_streams_of_one_process_run_concurrently(simgpu_env: dict[str, str], mode: str) -> None:
    simgpu_env.update(MODES[mode])
    r = probe(simgpu_env, "streams", "10", "2000")
    runs = runs_of(timeline(simgpu_env), r["pid"])
    assert sum(e - s for s, e in runs) == 2 * 10 * 2000_000      # all of it ran ...
    assert union_ns(runs) <= 10 * 2000_000 + 1000_000             # ... two streams at a time
    assert r["synced"] >= max(e for _, e in runs)                 # the context sync waited for both


@pytest.mark.parametrize("mode", ["fifo", "slice"])
def test_streams_of_one_process_take_turns_without_the_switch(simgpu_env: dict[str, str],
                                                              mode: str) -> None:
    simgpu_env.update(MODES[mode])
    r = probe(simgpu_env, "streams", "5", "2000")
    runs = runs_of(timeline(simgpu_env), r["pid"])
    assert union_ns(runs) == sum(e - s for s, e in runs) == 2 * 5 * 2000_000


@pytest.mark.parametrize("wait", [True, False], ids=["wait", "nowait"])
def test_a_stream_waits_for_another_streams_event(simgpu_env: dict[str, str], wait: bool) -> None:
    simgpu_env.update(STREAMS)
    r = probe(simgpu_env, "stream-wait", "3000", "1000", *([] if wait else ["nowait"]))
    runs = runs_of(timeline(simgpu_env), r["pid"])
    (first,) = [x for x in runs if x[1] - x[0] == 3000_000]
    (second,) = [x for x in runs if x[1] - x[0] == 1000_000]
    if wait:
        assert second[0] == first[1]     # it starts as the event's work ends, not before
        assert r["s2_synced"] >= second[1]
    else:
        assert second[0] < first[1]      # without the wait the two overlap


@pytest.mark.parametrize("mode", sorted(MODES))
def test_two_processes_never_share_the_engine(simgpu_env: dict[str, str], mode: str) -> None:
    """Contexts take the engine in turns in every mode (only one context's streams overlap)."""
    simgpu_env.update(MODES[mode])
    run([CLIENT, "info"], simgpu_env)
    procs = [subprocess.Popen([PROBE, "streams", "8", "1500"], env=simgpu_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    pids = [json.loads(p.communicate(timeout=30)[0])["pid"] for p in procs]
    tl = timeline(simgpu_env)
    a, b = (runs_of(tl, pid) for pid in pids)
    assert sum(e - s for s, e in a) == sum(e - s for s, e in b) == 2 * 8 * 1500_000
    overlap = sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)
    assert overlap == 0


def test_nvml_counts_overlapping_streams_once(simgpu_env: dict[str, str]) -> None:
    simgpu_env.update(STREAMS)
    p = subprocess.Popen([PROBE, "streams", "300", "5000"], env=simgpu_env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.2)  # NVML's window is the last second: all of it under two streams
        dev = nvml_info(simgpu_env)["devices"][0]
    finally:
        p.kill()
        p.wait()
    assert 95 <= dev["utilization"]["gpu"] <= 100
    (sample,) = [u for u in dev["process_utilization"] if u["pid"] == p.pid]
    assert 95 <= sample["sm_util"] <= 100


# ---- the timed engine: time slices ----

def launch_together(env: dict[str, str], *loads: tuple[int, int, float]) -> list[dict]:
    """cuda_client launch N US, each load (n, us, delay s) from a common start."""
    run([CLIENT, "info"], env)  # the state exists before the clock starts
    start = time.monotonic_ns() + 300_000_000
    procs = [subprocess.Popen([CLIENT, "launch", str(n), str(us), str(start + int(d * 1e9))],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n, us, d in loads]
    out = []
    for p in procs:
        o, e = p.communicate(timeout=30)
        assert p.returncode == 0, e
        out.append(dict(json.loads(o), pid=p.pid))
    return out


def test_greedy_processes_take_turns_in_slices(simgpu_env: dict[str, str]) -> None:
    simgpu_env.update(SLICE)
    a, b = launch_together(simgpu_env, (20, 3000, 0), (20, 3000, 0))
    tl = timeline(simgpu_env)
    # While both have work: from the first run of the one that came second (a process may
    # start late on a busy machine; until the other comes, the first runs unbroken).
    both_from = max(min(s for s, _, p in tl if p == r["pid"]) for r in (a, b))
    both_until = min(max(e for _, e, p in tl if p == r["pid"]) for r in (a, b))
    runs = [(s, e, p) for s, e, p in tl
            if p in (a["pid"], b["pid"]) and both_from <= s < both_until]
    assert len(runs) >= 20
    for (_, e0, p0), (s1, _, p1) in itertools.pairwise(runs):
        assert p1 != p0                 # the other's turn, every time
        assert s1 - e0 == 20_000        # each switch costs SIMGPU_SWITCH_US, idle
    # A slice each: a 3 ms kernel never runs 3 ms unbroken while the other waits.
    assert all(e - s == 1000_000 for s, e, _ in runs[:-1])
    share = [sum(e - s for s, e, p in runs if p == r["pid"]) for r in (a, b)]
    assert abs(share[0] - share[1]) <= 1000_000


@pytest.mark.parametrize("mode", ["fifo", "slice"])
def test_a_queued_tail_waits_or_interleaves(simgpu_env: dict[str, str], mode: str) -> None:
    """A process with 30 ms queued, another that comes 5 ms later: FIFO runs the first's
    tail first; time slices give the newcomer the engine within a slice and a switch."""
    simgpu_env.update(MODES[mode])
    # The case needs the first's 30 ms queued before the second launches, and all of the
    # second's 5 ms queued while the first still had at least 15 ms to run (then, sliced,
    # the second's work ends within five turns of each, before the first's does). A busy
    # machine can start either late or slow its launches, so the setup (not the check) is
    # tried again until it held; the launch times and the timeline share CLOCK_MONOTONIC.
    for _ in range(5):
        a, b = launch_together(simgpu_env, (10, 3000, 0), (5, 1000, 0.005))
        runs = [r for r in timeline(simgpu_env) if r[2] in (a["pid"], b["pid"])]
        a_start = min(s for s, _, p in runs if p == a["pid"])
        a_queued = a["start_ns"] + a["launch_s"] * 1e9
        b_queued = b["start_ns"] + b["launch_s"] * 1e9
        if a_queued < b["start_ns"] and b_queued < a_start + 15 * NS_PER_MS:
            break
    else:
        pytest.fail(f"the two never had their work queued in time: {a} {b}")
    a_end = max(e for _, e, p in runs if p == a["pid"])
    first = next(i for i, r in enumerate(runs) if r[2] == b["pid"])
    if mode == "fifo":
        assert runs[first][0] >= a_end
    else:
        # The newcomer's first run comes after a switch from the first process's slice, and
        # all of its work ends before the first's tail does.
        assert first > 0 and runs[first][0] - runs[first - 1][1] == 20_000
        assert max(e for _, e, p in runs if p == b["pid"]) < a_end


def test_a_kernel_longer_than_the_slice_runs_unbroken_alone(simgpu_env: dict[str, str]) -> None:
    simgpu_env.update(SLICE)
    (r,) = launch_together(simgpu_env, (1, 5000, 0))
    assert [e - s for s, e, p in timeline(simgpu_env) if p == r["pid"]] == [5000_000]


def test_nvml_sees_sliced_processes_share_the_engine(simgpu_env: dict[str, str]) -> None:
    simgpu_env.update(SLICE)
    run([CLIENT, "info"], simgpu_env)
    procs = [subprocess.Popen([CLIENT, "launch", "400", "5000"], env=simgpu_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    try:
        time.sleep(1.5)  # NVML's window is the last second: all of it shared
        dev = nvml_info(simgpu_env)["devices"][0]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert dev["utilization"]["gpu"] >= 95   # 1000 of each 1020 us: the switches are idle
    sm = sorted(u["sm_util"] for u in dev["process_utilization"]
                if u["pid"] in {p.pid for p in procs})
    assert len(sm) == 2 and 45 <= sm[0] <= sm[1] <= 52, dev


# ---- the timed engine survives a process that dies holding its lock ----

def engine_report(env: dict[str, str]) -> dict:
    return probe(env, "engine", env["SIMGPU_STATE"], "0")


@pytest.mark.parametrize("mode", ["streams", "slice"])
@pytest.mark.parametrize("where", ["submit:40", "advance:40"])
def test_a_process_dead_inside_the_engine_wedges_nobody(simgpu_env: dict[str, str],
                                                        where: str, mode: str) -> None:
    simgpu_env.update(MODES[mode])
    # SIMGPU_TEST_CRASH: the process exits at that step with the lock held, its changes
    # to the entries made and the cursor not committed.
    p = run([PROBE, "hammer"], dict(simgpu_env, SIMGPU_TEST_CRASH=where), check=False)
    assert p.returncode == 3
    assert engine_report(simgpu_env)["repairs"] == 0
    r = probe(simgpu_env, "events", "2000")  # takes the lock over, exactly timed
    ends = [e for _, e in kernels_of(timeline(simgpu_env), r["pid"], 2000)]
    assert all(abs(ms * NS_PER_MS - (ends[i + 1] - ends[i])) <= FLOAT_NS
               for i, ms in enumerate(r["between"]))
    time.sleep(0.05)
    nvml_info(simgpu_env)  # looks at the engine now: the dead process's work has run
    rep = engine_report(simgpu_env)
    assert rep["repairs"] == 1
    assert rep["queued"] == 0 and rep["queues_with_work"] == 0
    assert rep["free"] + rep["done"] == 4096 and rep["done"] <= 8  # kept for its events


# ---- the engine settings belong to the state file ----

@pytest.mark.parametrize("name, value, why", [
    ("SIMGPU_TIMESLICE_US", "0", "not whole microseconds from 1 to 1000000"),
    ("SIMGPU_TIMESLICE_US", "1ms", "not whole microseconds from 1 to 1000000"),
    ("SIMGPU_SWITCH_US", "200000", "not whole microseconds from 0 to 100000"),
    ("SIMGPU_SWITCH_US", "-1", "not whole microseconds from 0 to 100000"),
    ("SIMGPU_CONCURRENT_STREAMS", "yes", "not 0 or 1"),
])
def test_a_bad_engine_setting_is_refused_with_one_line(simgpu_env: dict[str, str], name: str,
                                                       value: str, why: str) -> None:
    simgpu_env[name] = value
    p = run([CLIENT, "info"], simgpu_env, check=False)
    assert p.returncode == 1 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert lines[0] == f'simgpu: {name}="{value}": {why}' and len(lines) == 2
    assert "CUDA_ERROR_NO_DEVICE" in lines[1]


def test_every_process_runs_the_engine_the_state_file_was_made_with(
        simgpu_env: dict[str, str]) -> None:
    run([CLIENT, "info"], dict(simgpu_env, **SLICE))
    assert engine_report(simgpu_env)["timed"] == 1           # unset: the file's settings
    p = run([CLIENT, "info"], dict(simgpu_env, SIMGPU_TIMESLICE_US="500"), check=False)
    assert p.returncode == 1
    line = p.stderr.splitlines()[0]
    assert line == (f'simgpu: SIMGPU_TIMESLICE_US="500": the simulated GPU of SIMGPU_STATE='
                    f'{simgpu_env["SIMGPU_STATE"]} runs with 1000 (set when it was created; '
                    'every process on it shares its engine)')
    run([CLIENT, "info"], dict(simgpu_env, **SLICE))          # the same settings: fine


def test_a_state_file_of_an_older_layout_is_named(simgpu_env: dict[str, str],
                                                  tmp_path: Path) -> None:
    old = tmp_path / "old.state"
    old.write_bytes(struct.pack("<II", 0x47504D53, 1) + bytes(4096))  # magic, layout 1
    p = run([CLIENT, "info"], dict(simgpu_env, SIMGPU_STATE=str(old)), check=False)
    assert p.returncode == 1
    assert p.stderr.splitlines()[0] == (
        f"simgpu: SIMGPU_STATE={old}: made by another simgpu build (layout 1, this one 2): "
        "remove it once no process uses it, or name another file")


@pytest.mark.timing   # the shares it reads need the load to keep the GPU fed: not three at once
def test_a_timeline_whose_ring_overwrote_the_window_refuses_to_read_it(tmp_path: Path) -> None:
    """The engine keeps its last SIMGPU_RING (32768) runs of kernels: 10 us kernels
    back to back overwrite the start of a 1.5 s run, and a share read from there would
    be short. simgpu_timeline says so; timeline_shares refuses that window and reads a
    late one; a run that fits is whole."""
    (tmp_path / "long").mkdir()
    (tmp_path / "short").mkdir()
    busy = Load(kernel="busy_10us", args=["--queue", "400"], vgpu=False)
    r = run_loads(tmp_path / "long", [busy], 1.5)
    tl = engine_timeline(tmp_path / "long")
    assert tl.partial and len(tl) == 32768
    with pytest.raises(ValueError, match="overwrote the window's start"):
        timeline_shares(tmp_path / "long", r, r.at(0.1), r.at(1.0), tl)
    late = timeline_shares(tmp_path / "long", r, tl[0][0], tl[-1][1], tl)
    assert late[0] > 90  # back to back: the GPU busy all the time the timeline covers
    # Batches of 100 ms: the GPU idles only while the load wakes between batches, which a
    # loaded machine stretches (one launch a batch of 1 left it idle a third of the time).
    short = Load(kernel="busy_1000us", args=["--queue", "100"], vgpu=False)
    r = run_loads(tmp_path / "short", [short], 0.3)
    tl = engine_timeline(tmp_path / "short")
    assert not tl.partial and 100 < len(tl) < 32768
    assert timeline_shares(tmp_path / "short", r, r.at(0.15), r.at(0.25), tl)[0] > 80
