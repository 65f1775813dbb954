# SPDX-License-Identifier: Apache-2.0
"""Compute accuracy beyond greedy loads in a fresh scheduling file (issue 9).

A slice of share S whose load could use U of the GPU alone gets min(S, U): for
step loops with CPU gaps, 50 us kernels synced every few launches, mixed kernel
lengths across slices; and a fixed slice started after others used the same
scheduling file never exceeds its share. U is measured in the same test, with
the load alone and no libvgpu. Tolerances are tests/support/measure.py's
(a loaded 2-core CI machine); bench/compute.py measures the accuracy itself.
"""
from __future__ import annotations

import itertools
import statistics
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.gpu_loads import (
    Load,
    Run,
    engine_timeline,
    run_loads,
    step_loop,
    use_alone,
    wear_sched_file,
)
from support.measure import TOL, WARM, burst, fixed, timing

from arbiter.files.sched_files import open_sched

SECONDS = 3.0

# 8 kernels of 500 us, then 2 ms of CPU: ~65% of the GPU alone.
STEP_LOOP = step_loop("busy_500us", 8, 2000)
# 50 us kernels synced every 8: ~99% alone (a sync returns within a few us, as the
# driver's does: a slice that claimed busy time as idle passed its share here).
SHORT_SYNCED = step_loop("busy_50us", 8)
# ... with 100 us of CPU after each sync: ~80% alone, gaps the slice keeps its hold through.
SHORT_GAPS = step_loop("busy_50us", 8, 100)
# 10 us kernels polled with cuStreamQuery every 8, then 20 us of CPU: ~80% alone. Its gaps
# are shorter than the holder thread's look: only the query that found the step done
# dates them (unclaimed, the slice got 44% of a fixed 50%; claimed from a count that took
# launches done twice, 55%).
POLLED_GAPS = step_loop("busy_10us", 8, 20, wait="poll")


# simgpu's syncs return 20-200 us after the work ends, as a loaded host's wake-ups do
# (docs/simgpu.md): the charge is by the GPU's clock, so the shares must not move.
WAKE = {"SIMGPU_WAKE_US": "20-200"}


def shares(tmp: Path, loads: list[Load], seconds: float = SECONDS,
           simgpu: dict[str, str] | None = None) -> list[float]:
    r = run_loads(tmp, loads, seconds, simgpu=simgpu)
    for i, t in enumerate(r.traces):
        assert t.summary["returncode"] == 0, f"load {i}: {t.stderr}"
    return [t.share(r.at(WARM), r.at(seconds)) for t in r.traces]


def slice_of(load: Load, env: dict[str, str]) -> Load:
    return Load(env, kernel=load.kernel, args=load.args)


# Acceptance rows, not the rules (the trace tests carry those: tests/libvgpu/test_*_traces.py).
# A load alone runs with late wake-ups only: the same rows in simgpu's default mode add no
# rule (the charge is by the GPU's clock either way) and bench/compute.py measures both.
@pytest.mark.parametrize(("load", "share", "neighbour", "mode"), [
    pytest.param(STEP_LOOP, 50, None, WAKE, id="step-loop-fixed50-alone-wake20-200"),
    pytest.param(STEP_LOOP, 50, 50, None, id="step-loop-fixed50-beside-burst50"),
    pytest.param(STEP_LOOP, 80, None, None, id="step-loop-fixed80-alone-gets-its-use"),
    pytest.param(SHORT_SYNCED, 70, None, WAKE, id="50us-sync8-fixed70-alone-wake20-200"),
    # Beside it a burst 10: the slice keeps the token through its sync gaps (~15% of its
    # time) and is not charged for them, so 70 + its gaps + 30 would not fit in the GPU.
    pytest.param(SHORT_SYNCED, 70, 10, None, id="50us-sync8-fixed70-beside-burst10"),
    pytest.param(SHORT_GAPS, 70, None, None, id="50us-sync8-cpu100us-fixed70-alone"),
    pytest.param(POLLED_GAPS, 50, None, WAKE, id="10us-poll8-cpu20us-fixed50-alone-wake20-200"),
])
@timing
def test_a_slice_gets_the_lesser_of_its_share_and_its_use(
        tmp_path: Path, load: Load, share: int, neighbour: int | None,
        mode: dict[str, str] | None) -> None:
    use = use_alone(tmp_path, load, 2.0, WARM, simgpu=mode)
    want = min(share, use)
    loads = [slice_of(load, fixed(share))]
    if neighbour is not None:
        loads.append(Load(burst(neighbour)))
    got = shares(tmp_path, loads, simgpu=mode)
    assert got[0] == pytest.approx(want, abs=TOL), f"U alone {use:.1f}%, got {got}"
    if neighbour is not None:
        # The greedy neighbour keeps its guarantee (and may take what the slice leaves).
        assert got[1] >= neighbour - TOL, f"U alone {use:.1f}%, got {got}"


@pytest.mark.parametrize(("small", "large", "small_pct"), [
    pytest.param(Load(kernel="busy_50us", args=["--queue", "80"]),
                 Load(kernel="busy_5000us"), 30, id="50us-fixed30-vs-5ms-burst70"),
    pytest.param(Load(kernel="busy_5000us"),
                 Load(kernel="busy_50us", args=["--queue", "80"]), 30,
                 id="5ms-fixed30-vs-50us-burst70"),
    pytest.param(Load(kernel="busy_50us,busy_2000us", args=["--queue", "8"]),
                 Load(kernel="busy_500us", args=["--queue", "8"]), 40,
                 id="50us+2ms-mixed-fixed40-vs-500us-burst60"),
])
@timing
def test_mixed_kernel_lengths_across_slices(tmp_path: Path, small: Load, large: Load,
                                            small_pct: int) -> None:
    got = shares(tmp_path, [slice_of(small, fixed(small_pct)),
                            slice_of(large, burst(100 - small_pct))])
    assert got[0] == pytest.approx(small_pct, abs=TOL), got
    assert got[1] == pytest.approx(100 - small_pct, abs=TOL), got


@timing
def test_waking_up_to_a_sync_is_not_a_gap_in_the_apps_work(tmp_path: Path) -> None:
    """50 us kernels synced every 8, 100 us of CPU after each sync, syncs that return
    20-200 us after the work ends, beside a greedy burst 10 %: the app's gap begins when its
    sync returns, so a contended holder keeps the token through the wake-up (before, a gap
    counted from the work's end outlasted the 250 us hold in a third of the steps, the token
    went to the neighbour and the slice waited behind its queue: 38 % of its 64.7 % alone,
    the neighbour 44.8 %). It can reach its use alone less the neighbour's guaranteed 10 %
    (each of the neighbour's holds takes the GPU for its whole length, while the slice's
    own gaps inside its holds stay idle): 58 % measured."""
    use = use_alone(tmp_path, SHORT_GAPS, 2.0, WARM, simgpu=WAKE)
    loads = [slice_of(SHORT_GAPS, fixed(70)), Load(burst(10))]
    got = shares(tmp_path, loads, simgpu=WAKE)
    assert got[0] >= min(70, use * 0.9) - TOL, f"U alone {use:.1f}%, got {got}"
    assert got[1] >= 10 - TOL, f"U alone {use:.1f}%, got {got}"


@timing
def test_a_late_drain_report_is_not_a_gap_in_the_apps_work(tmp_path: Path) -> None:
    """A revoked hold's drain is reported when the holder thread wakes to its last event,
    here always 500 us after the work's end (a loaded host, or a time-sliced GPU's next
    turn for an event on an idle stream). The app, waiting to launch all along, asks again
    only then: that wait is not a gap it left, so its syncs must not offer the token back
    as a step loop's do (counted as one, the greedy fixed 70 % got 60-61 %)."""
    late = {"SIMGPU_WAKE_US": "500-500"}
    loads = [Load(fixed(70), args=["--queue", "4"]), Load(burst(30), args=["--queue", "4"])]
    got = shares(tmp_path, loads, simgpu=late)
    assert got[0] == pytest.approx(70, abs=TOL), got


@timing
def test_a_slice_is_charged_what_its_kernels_ran(tmp_path: Path) -> None:
    """Charged by the GPU's clock: what the broker charged a fixed 10 % beside a fixed 90 %
    between two of its holds (its entry's used_ns, read while the 90 % held the token) is
    what its kernels ran on simgpu's engine in between, within 1 %, plus at most the time
    the engine sat idle next to them. (When a hold's first gap was claimed from the grant,
    the part of the previous holder's tail that ran past the grant was deducted from the new
    holder as well: each hold was charged about its wake-up to the grant less than it ran,
    2-3 % of the 10 %: rule *Launch claim*.)

    The idle allowance is the engine's own record, not a margin: with the CPUs to spare the
    two loads keep it busy and it is 0. A host that keeps the 10 %'s process off its CPU
    while it holds the token leaves the GPU idle in that hold, and the rules charge the
    slice for what it held and did not use (*Idle claims*: at most a quarter of a contended
    hold's idle is not charged; *Untaken grant*; *Release*): once in the CI (77.0 ms for
    73.6 ms run), and in every run with three busy loops on this machine's two CPUs
    (x1.00-1.20, within the allowance in each)."""
    kernel, args = "busy_200us", ["--queue", "20"]
    seconds, lo_s, hi_s = 2.6, 1.7, 2.5
    samples: list[tuple[int, int]] = []

    def sample(procs: list[subprocess.Popen], run: Run) -> None:
        def loop() -> None:
            time.sleep(max(0.0, (run.at(lo_s - 0.1) - time.monotonic_ns()) / 1e9))
            gpu = next(p for p in (tmp_path / "sched").iterdir() if "." not in p.name)
            with open_sched(gpu) as sched:
                while (now := time.monotonic_ns()) < run.at(hi_s):
                    used = [e.used_ns for e in sched.snapshot().entries if e.key and e.share == 10]
                    if used:
                        samples.append((now, used[0]))
                    time.sleep(0.0002)
        threading.Thread(target=loop, daemon=True).start()

    r = run_loads(tmp_path, [Load(fixed(10), kernel=kernel, args=args),
                             Load(fixed(90), kernel=kernel, args=args)], seconds, on_started=sample)
    for i, t in enumerate(r.traces):
        assert t.summary["returncode"] == 0, f"load {i}: {t.stderr}"
    kernels = sorted(engine_timeline(tmp_path))
    pid = r.traces[0].summary["pid"]
    mine = [(a, b) for a, b, p in kernels if p == pid]
    # Between two of its holds on the engine (the 90 % ran > 1 ms): read from 0.5 ms after the
    # last kernel of one (its drain reported by then, so it is settled) to just before the
    # next one's first, when nothing of the 10 % runs.
    lo = max(kernels[0][0], r.at(lo_s))
    marks = []
    for (_, end), (begin, _) in itertools.pairwise(mine):
        between = [x for x in samples if end + 500_000 < x[0] < begin - 100_000]
        if begin - end > 1_000_000 and between and between[-1][0] > lo:
            marks.append(between[-1])
    assert len(marks) >= 10, f"too few holds of the 10 % in the window: {len(marks)}"
    (t1, used1), (t2, used2) = marks[0], marks[-1]
    ran = sum(max(0, min(b, t2) - max(a, t1)) for a, b in mine)
    idle_beside = sum(max(0, min(b1, t2) - max(e0, t1))
                      for (_, e0, p0), (b1, _, p1) in itertools.pairwise(kernels)
                      if pid in (p0, p1))
    charged = used2 - used1
    assert ran * 0.99 <= charged <= (ran + idle_beside) * 1.01, \
        (f"charged {charged / 1e6:.3f} ms for {ran / 1e6:.3f} ms run over {len(marks) - 1} "
         f"holds, the engine idle {idle_beside / 1e6:.3f} ms beside them")


# simgpu's time-sliced engine: contexts take 1 ms turns, 20 us lost at each switch.
TIME_SLICED = {"SIMGPU_TIMESLICE_US": "1000", "SIMGPU_SWITCH_US": "20"}


@timing
def test_a_fixed_slice_beside_a_greedy_burst_is_charged_what_it_ran_time_sliced(
        tmp_path: Path) -> None:
    """Charged by the GPU's clock on a GPU that time-slices contexts: every hold of a fixed
    30 % begins beside the greedy burst's revoked tail, and the two share those overlaps in
    turns. What the broker charged the fixed slice over 1.5 s (its entry's used_ns) is what
    its kernels ran on simgpu's engine then, within 2 % (rules *Shared tail*, *First turn*;
    split half and half, it paid 1.07 times what it ran at ~135 hand-overs a second)."""
    kernel, args = "busy_100us", ["--queue", "20"]
    seconds, lo_s, hi_s = 2.8, 1.1, 2.6
    samples: list[tuple[int, int]] = []

    def sample(procs: list[subprocess.Popen], run: Run) -> None:
        def loop() -> None:
            time.sleep(max(0.0, (run.at(lo_s) - time.monotonic_ns()) / 1e9))
            gpu = next(p for p in (tmp_path / "sched").iterdir() if "." not in p.name)
            with open_sched(gpu) as sched:
                for at in (lo_s, hi_s):
                    time.sleep(max(0.0, (run.at(at) - time.monotonic_ns()) / 1e9))
                    used = [e.used_ns for e in sched.snapshot().entries if e.key and e.share == 30]
                    samples.append((time.monotonic_ns(), used[0]))
        threading.Thread(target=loop, daemon=True).start()

    r = run_loads(tmp_path, [Load(fixed(30), kernel=kernel, args=args),
                             Load(burst(70), kernel=kernel, args=args)], seconds,
                  on_started=sample, simgpu=TIME_SLICED)
    for i, t in enumerate(r.traces):
        assert t.summary["returncode"] == 0, f"load {i}: {t.stderr}"
    assert len(samples) == 2
    (t1, used1), (t2, used2) = samples
    pid = r.traces[0].summary["pid"]
    ran = sum(max(0, min(b, t2) - max(a, t1)) for a, b, p in engine_timeline(tmp_path) if p == pid)
    assert ran > 0.25 * (t2 - t1)
    assert used2 - used1 == pytest.approx(ran, rel=0.02), \
        f"charged {(used2 - used1) / 1e6:.3f} ms for {ran / 1e6:.3f} ms run"


# A new slice's load in the 20 runs: greedy, a step loop, a graph of 8 ms.
NEW_SLICES = [
    ("greedy", Load(fixed(10))),
    ("step-loop", slice_of(STEP_LOOP, fixed(20))),
    ("graph", Load(fixed(20), args=["--path", "graph", "--graph-kernels", "8", "--queue", "2"])),
    ("50us-sync8", slice_of(SHORT_SYNCED, fixed(10))),
]


def test_fixed_slices_started_one_after_another_in_a_used_file_stay_under_the_cap(
        tmp_path: Path) -> None:
    """20 new fixed slices in a row, each alone on the GPU, in one used scheduling file.

    No retry: a stalled machine lowers a share, it never raises one above the cap.
    Measured as run (Trace.ran_alone), so a graph's deep queue does not count early,
    over 0.6 s after the first 0.1 s: a new slice's first launches run before their
    length is known (8 ms graphs overshoot by a few launches in a fresh file too).
    """
    wear_sched_file(tmp_path)
    warm, seconds, cap_tol = 0.1, 0.7, 1.5
    got = []
    for i in range(20):
        name, load = NEW_SLICES[i % len(NEW_SLICES)]
        r = run_loads(tmp_path, [load], seconds)
        (t,) = r.traces
        assert t.summary["returncode"] == 0, f"run {i}: {t.stderr}"
        share = int(load.env["VGPU_COMPUTE_LIMIT"])
        got.append((name, share, round(t.ran_alone(r.at(warm), r.at(seconds)), 1)))
    over = [(i, *g) for i, g in enumerate(got) if g[2] > g[1] + cap_tol]
    assert not over, f"above the cap (run, load, share, got): {over}; all runs: {got}"


@timing
def test_a_step_loop_hands_the_token_over_with_no_idle_gpu(tmp_path: Path) -> None:
    """Its sync offers the hold back (the CPU work that follows outlasted GAP_HOLD before):
    the neighbour's work is queued behind the step's tail, so the GPU does not sit idle
    through the holder's look, its hold of a sync gap and the neighbour's wake-up (which
    measured 210-250 us at every switch before)."""
    step = slice_of(STEP_LOOP, fixed(50))
    r = run_loads(tmp_path, [step, Load(burst(50))], 2.5)
    for i, t in enumerate(r.traces):
        assert t.summary["returncode"] == 0, f"load {i}: {t.stderr}"
    kernels = engine_timeline(tmp_path)
    step_pid = next(pid for start, end, pid in kernels if end - start == 500_000)
    gaps = [max(0, b[0] - a[1]) for a, b in itertools.pairwise(kernels)
            if a[2] == step_pid and b[2] != step_pid]
    assert len(gaps) >= 50, f"too few hand-overs: {len(gaps)}"
    assert statistics.median(gaps) <= 50_000, sorted(gaps)
