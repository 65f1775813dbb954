# SPDX-License-Identifier: Apache-2.0
"""The slice's GPU-time ledger, rule by rule, on traces (libvgpu/src/ledger.h).

libvgpu dates its work by the GPU's clock: timing events recorded in the app's streams,
reaped by the holder thread in the order they were recorded. build/tests/ledger_trace
feeds the pure ledger a trace of such events and prints what it concludes. A trace holds
no reap time at all: when a CPU thread wakes up to an event cannot change what the
ledger says, which is what makes a compute share the same on every host. Times in us.
"""
from __future__ import annotations

import subprocess

import pytest
from support.paths import TEST_BIN

LEDGER_TRACE = TEST_BIN / "ledger_trace"


def run(trace: str) -> list[dict[str, float]]:
    """Feed the trace; one dict per output line (end, busy, per, endcpu or cpu)."""
    out = subprocess.run([str(LEDGER_TRACE)], input=trace, capture_output=True, text=True,
                         check=True, timeout=10).stdout
    return [{k: float(v) for k, v in (f.split("=") for f in line.split())}
            for line in out.splitlines()]


def step(t0: float, kernels: int, us: float, every: int = 1,
         close_late: float | None = None) -> str:
    """One step of a step loop launched at CPU time t0 on an idle GPU (CPU and GPU clocks
    share an origin): the gap, its start event, a mark every `every` launches, and the
    launches after the last mark closed by an event recorded when the app syncs (at t0,
    while the work runs) or, with close_late, that long after the work ended."""
    lines = [f"gap {t0}", f"ev {t0} {t0} 0"]
    done = 0
    for k in range(1, kernels + 1):
        if k % every == 0:
            lines.append(f"ev {t0 + k * us} {t0 + 1} {k - done}")
            done = k
    if done < kernels:
        end = t0 + kernels * us
        rec = end + close_late if close_late is not None else t0 + 2
        lines.append(f"ev {max(end, rec)} {rec} {kernels - done}")
    return "\n".join(lines) + "\n"


def test_a_step_loop_is_charged_its_kernels_not_its_gaps() -> None:
    """busy: two steps of 8 x 500 us with 2 ms of CPU between: 8 ms of GPU time, and the
    work's end (the CPU time the next gap is claimed from) is the last kernel's end."""
    out = run(step(1000, 8, 500) + step(7000, 8, 500))
    assert out[-1]["busy"] == 8000
    assert out[-1]["end"] == 11000 and out[-1]["endcpu"] == 11000
    assert out[-1]["per"] == 500


@pytest.mark.parametrize("late", [0, 30, 120, 900], ids=lambda v: f"close-{v}us-late")
def test_a_close_recorded_after_the_work_ended_is_dated_by_the_kernel_length(late: float) -> None:
    """at record: a holder that wakes late records the event that closes the last launches
    after they ended; it completes as it is recorded, so their end is the last known end
    plus their learnt length, whatever the lateness."""
    out = run(step(1000, 8, 500, every=3, close_late=late)
              + step(7000, 8, 500, every=3, close_late=late))
    assert out[-1]["busy"] == 8000
    assert out[-1]["end"] == 11000


def test_a_record_call_held_up_is_not_lateness() -> None:
    """at record, by the call's return: the close of a step's last 2 launches is recorded
    900 us after they ended, by a call that took 60 us (a lock held by another process, a
    preempted thread) and completed 50 us into it. The event completed as it was recorded,
    so the launches are dated by their length; counted from the call's start it looked 50
    us late, and the 900 us in between were charged as their run. (A start event misread
    so became a start claim: a fixed 10 % beside a fixed 90 % was charged about 300 us of
    a 4 ms hold too much or too little, about 1 hold in 10 on a 2-CPU VM.)"""
    trace = step(1000, 8, 500, every=3)
    held_up = trace.replace("ev 5000 1002 2\n", "ev 5950 5900 2 5960\n")
    assert held_up != trace
    out = run(held_up)
    assert out[-1]["end"] == 5000 and out[-1]["busy"] == 4000
    out = run(trace.replace("ev 5000 1002 2\n", "ev 5950 5900 2\n"))  # no return time known
    assert out[-1]["end"] == 5950 and out[-1]["busy"] == 4950


def test_a_late_close_after_a_gap_counts_from_the_launch_that_ended_it() -> None:
    """at record, after a gap: launches that came after an empty queue ran from that
    launch's start event, not back to back with the work before the gap."""
    trace = step(1000, 4, 500) + "gap 9000\nev 9000 9000 0\nev 9800 9800 1\n"
    out = run(trace)
    assert out[-1]["end"] == 9500
    assert out[-1]["busy"] == 2000 + 500


def test_a_late_close_never_ends_after_its_own_event() -> None:
    """at record: the estimate is capped by the event's own GPU time."""
    out = run(step(1000, 4, 500) + "ev 3300 3300 3\n")
    assert out[-1]["end"] == 3300
    assert out[-1]["busy"] == 2300


def test_with_no_length_learnt_a_late_close_is_dated_at_its_event() -> None:
    """at record: before any sample the length is unknown; the event's time stands, and its
    bound (its launches ran within 800 us) becomes the first sample."""
    out = run("gap 100\nev 100 100 0\nev 900 900 2\n")
    assert out[-1]["end"] == 900 and out[-1]["busy"] == 800
    assert out[-1]["per"] == 400


def test_kernels_shorter_than_a_launch_are_learnt_from_bounds() -> None:
    """length: launches that complete before the next is made never give an exact sample;
    each event then bounds their length, and a shorter bound is a sample (else an event
    would be recorded at every launch)."""
    trace = "gap 0\nev 0 0 0\n" + "".join(f"ev {k}.5 {k}.5 1\n" for k in range(1, 30))
    assert run(trace)[-1]["per"] == 1


def test_the_clock_map_is_the_tightest_bound_events_give() -> None:
    """clock map: GPU times on their own origin (here 5000 us behind the CPU's). An event
    cannot complete before it was recorded; the largest rec - gpu is the map, and an event
    recorded on an idle stream (a start) makes it exact."""
    out = run("gap 5000\nev 0 5000 0\nev 500 5001 1\ncpu 500\n"
              "ev 900 5300 1\ncpu 900\n"            # recorded at 5300 on a busy stream: no change
              "gap 7000\nev 1990 7000 0\ncpu 1990\n")  # a start that shows the map 10 us off
    cpus = [o["cpu"] for o in out if "cpu" in o]
    assert cpus == [5500, 5900, 7000]


def test_the_clock_map_follows_drift_within_two_windows() -> None:
    """clock map: the bound is kept for two windows of 1 s, so a GPU clock that drifts
    against the CPU's is followed, not pinned to an old maximum."""
    trace = "ev 0 1000 0\n"                          # base 1000
    trace += "ev 1500000 1500900 0\n"                # 1.5 s later the clocks drifted 100 us
    trace += "ev 3100000 3100800 0\n"                # and 100 more: the 1000 is 3.1 s old
    trace += "cpu 3100000\n"
    # the 1.6 s old bound holds, the 3.1 s old one is gone
    assert run(trace)[-1]["cpu"] == 3100900


def test_the_kernel_length_is_the_median_of_exact_samples() -> None:
    """length: one long sample (a kernel that waited behind another's) moves nothing."""
    trace = "gap 0\nev 0 0 0\n" + "".join(f"ev {100 * k} 1 1\n" for k in range(1, 10))
    trace += "ev 5000 2 1\n"
    assert run(trace)[-1]["per"] == 100


def test_samples_skip_events_that_completed_as_they_were_recorded() -> None:
    """length: an event recorded after its launches ended says nothing of their length."""
    trace = step(0, 6, 100) + "ev 5000 5000 4\n"
    assert run(trace)[-1]["per"] == 100


def test_events_of_two_streams_never_move_the_end_back() -> None:
    """end: an event of another stream that completed earlier than the last one reaped
    (reaped in record order) leaves the later end standing."""
    out = run("gap 0\nev 0 0 0\nev 900 1 3\nev 600 2 1\n")
    assert out[-1]["end"] == 900
    assert out[-1]["busy"] == 900


def test_a_start_that_waited_for_the_engine_is_late_whatever_the_map_says() -> None:
    """start claim: while another context keeps a time-sliced GPU busy, an event recorded
    on an idle stream completes only at its context's next turn, so no event completes at
    its record and the map stays early by up to a time slice. Here the first start waited
    700 us (the map takes it as exact) and the next one 400 us: by the map it completed
    300 us before its record returned. It was not done when asked right after the record,
    so it is a start claim (a launch claim shares no revoked tail: the slice beside a 1 s
    kernel paid none of that overlap, its neighbour all of it); one done at that question
    and on time by the map is a launch claim."""
    out = run("gap 1000\nev 1700 1000 0\n"         # the first start: the map, 700 us early
              "ev 1001700 1200 1\n"                # its 1 s launch, closed at 1200
              "gap 2001000\n"
              "start 2001400 2001000 1\n"          # waited 400 us for its turn
              "start 2001400 2001000 0\n"          # (not seen waiting: by the map, at once)
              "start 2002500 2001000 0\n")         # 800 us late even by the early map
    assert [o["late"] for o in out if "late" in o] == [1, 0, 1]


def test_work_held_back_for_another_contexts_turn_is_found_by_the_shortest_kernel() -> None:
    """first turn: after a start claim, the first event whose launches took longer than they
    run shows where the work was held back (another context's turn on a GPU that
    time-slices contexts). Kernels of 2 ms, sampled 2.0, 3.05 and 3.05 ms (two of them held
    back): by the median, 3.05, nothing would look held back; by the shortest, the launch
    from 10000 to 13050 was, after the work before it ended at 10000 (no later guess: that
    would make the claim cost its maker more than it ran); one that took 2.2 ms (within an
    eighth) was not; nor one launched after the work before it ended (the app's own gap:
    a poller's CPU work between steps); nor is anything without a length."""
    assert run("gap 0\nev 0 0 0\nheld 0 2000 0 1\n")[-1] == {"held": 0, "at": -1}  # no length
    trace = "gap 0\nev 0 0 0\nev 2000 1 1\nev 5050 2 1\nev 8100 3 1\n"  # (the map: exact)
    out = run(trace + "held 10000 13050 9000 1\nheld 10000 12200 9000 1\n"
              "held 10000 13050 10100 1\n")
    assert out[-4]["per"] == 3050
    assert out[-3:] == [{"held": 1, "at": 10000}, {"held": 0, "at": -1}, {"held": 0, "at": -1}]
