# SPDX-License-Identifier: Apache-2.0
"""Compute shares, burst, priority and robustness of the scheduler (libvgpu/src/sched.c).

Real processes (build/tests/gpu_load) share one simulated GPU through libvgpu;
their GPU time comes from their launch traces (tests/support/gpu_loads.py). Tolerances
are wide enough for a loaded 2-core CI machine; bench/compute.py measures the
accuracy itself.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.gpu_loads import GPU_LOAD, Load, engine_timeline, load_env, run_loads
from support.measure import TOL, WARM, burst, fixed, shares, timing
from support.process import run

from arbiter.files.sched_files import open_sched
from arbiter.proc import stat_fields


@timing
def test_two_processes_get_their_shares(tmp_path: Path) -> None:
    got = shares(tmp_path, [Load(fixed(30)), Load(fixed(70))])
    assert got[0] == pytest.approx(30, abs=TOL)
    assert got[1] == pytest.approx(70, abs=TOL)


@timing
def test_four_processes_get_their_shares(tmp_path: Path) -> None:
    want = [10, 20, 30, 40]
    got = shares(tmp_path, [Load(fixed(p)) for p in want])
    for w, g in zip(want, got, strict=False):
        assert g == pytest.approx(w, abs=TOL), (want, got)


@timing
def test_fixed_never_exceeds_its_share_on_an_idle_gpu(tmp_path: Path) -> None:
    (got,) = shares(tmp_path, [Load(fixed(30))])
    assert 30 - TOL <= got <= 30 + 1.0


@timing
def test_a_small_share_holds_against_a_greedy_neighbour(tmp_path: Path) -> None:
    got = shares(tmp_path, [Load(fixed(5)), Load(burst(95))])
    assert got[0] == pytest.approx(5, abs=1.5)
    assert got[1] >= 95 - TOL


@timing
def test_burst_takes_idle_time(tmp_path: Path) -> None:
    (alone,) = shares(tmp_path, [Load(burst(30))])
    assert alone >= 90
    got = shares(tmp_path, [Load(burst(30)), Load(fixed(20))])
    assert got[1] == pytest.approx(20, abs=TOL)
    assert got[0] >= 80 - 2 * TOL      # all the time the fixed slice may not use


@timing
def test_burst_keeps_its_guarantee_against_another_burst(tmp_path: Path) -> None:
    got = shares(tmp_path, [Load(burst(30)), Load(burst(70))])
    assert got[0] == pytest.approx(30, abs=TOL)
    assert got[1] == pytest.approx(70, abs=TOL)


@pytest.mark.parametrize("path", ["ex", "coop", "graph"])
@timing
def test_every_launch_path_is_throttled(tmp_path: Path, path: str) -> None:
    args = ["--path", path, "--graph-kernels", "2"]
    got = shares(tmp_path, [Load(fixed(30), args=args), Load(burst(70), args=args)])
    assert got[0] == pytest.approx(30, abs=TOL)
    assert got[1] == pytest.approx(70, abs=TOL)


@timing
def test_two_devices_are_throttled_independently(tmp_path: Path) -> None:
    env = {"VGPU_COMPUTE_LIMIT_0": "20", "VGPU_COMPUTE_LIMIT_1": "60"}
    seconds = 3.0
    r = run_loads(tmp_path, [Load(env, args=["--device", "0,1", "--threads", "2"])], seconds,
                  devices="4Gi,4Gi")
    (t,) = r.traces
    assert t.summary["returncode"] == 0, t.stderr
    a, b = r.at(WARM), r.at(seconds)
    assert t.share(a, b, dev=0) == pytest.approx(20, abs=TOL)
    assert t.share(a, b, dev=1) == pytest.approx(60, abs=TOL)


@timing
def test_many_threads_and_streams_neither_deadlock_nor_escape(tmp_path: Path) -> None:
    args = ["--threads", "8", "--queue", "3"]
    got = shares(tmp_path, [Load(fixed(30), args=args, kernel="busy_200us"),
                            Load(burst(60), args=args, kernel="busy_500us")])
    assert got[0] == pytest.approx(30, abs=TOL)
    assert got[1] >= 60 - TOL


@timing
def test_high_priority_preempts_low_and_low_resumes(tmp_path: Path) -> None:
    seconds, hs, he = 4.0, 1.5, 3.0
    r = run_loads(tmp_path, [
        Load(burst(50, VGPU_PRIORITY="low")),
        Load(burst(50, VGPU_PRIORITY="high"), start=hs, end=he),
    ], seconds)
    low, high = r.traces
    for t in r.traces:
        assert t.summary["returncode"] == 0, t.stderr
    first_high = min(high.t)
    # High gets (nearly) the whole GPU, as if alone; low stops within a bound.
    assert high.share(r.at(hs + 0.1), r.at(he)) >= 90
    assert low.share(r.at(hs + 0.1), r.at(he)) <= 3
    # Low has stopped once high runs (its queued tail is launched before): nothing from 5 ms
    # after high's first launch on. A few launches may slip in where high's process did not
    # run for more than the activity window (5 ms) on a loaded machine; low never keeps
    # running. (How soon low stops after high asks is test_broker_rings.py's: launch times
    # cannot show it, high's first launch comes after low's revocation either way.)
    late = low.launches_between(first_high + 5_000_000, r.at(he))
    assert len(late) <= 40, f"low kept submitting: {len(late)} launches while high ran"
    # Low uses the GPU before and resumes after.
    assert low.share(r.at(WARM), r.at(hs)) >= 90
    resumed = [t for t in low.t if t > max(high.t)]
    assert resumed and (min(resumed) - max(high.t)) < 200_000_000
    assert low.share(r.at(he + 0.2), r.at(seconds)) >= 85


@timing
def test_priority_floor_keeps_low_running(tmp_path: Path) -> None:
    got = shares(tmp_path, [Load(burst(50, VGPU_PRIORITY="low", VGPU_PRIORITY_FLOOR="10")),
                            Load(burst(50, VGPU_PRIORITY="high"))])
    assert got[0] == pytest.approx(10, abs=TOL)
    assert got[1] >= 85


@timing
def test_a_share_changed_in_the_region_applies_to_running_processes(tmp_path: Path) -> None:
    """The arbiter's Update rewrites compute_share in place; running processes follow."""
    from arbiter.files.region_file import open_region

    region_dir = tmp_path / "slice"
    seconds, change = 4.0, 2.0
    env = {"VGPU_REGION_DIR": str(region_dir), **fixed(20)}

    def update_later(procs: list[subprocess.Popen], r) -> None:
        deadline = time.monotonic() + 10
        while not (region_dir / "vgpu0").exists():
            assert time.monotonic() < deadline, "the region was never created"
            time.sleep(0.01)
        delay = (r.at(change) - time.monotonic_ns()) / 1e9
        time.sleep(max(0.0, delay))
        with open_region(region_dir / "vgpu0") as region:
            region.set_limits(compute_share=60)

    r = run_loads(tmp_path, [Load(env), Load(burst(40))], seconds, on_started=update_later)
    slice_, other = r.traces
    assert slice_.share(r.at(WARM), r.at(change)) == pytest.approx(20, abs=TOL)
    # In effect within 100 ms of the change (a shorter window: a little more slack).
    assert slice_.share(r.at(change + 0.1), r.at(seconds)) == pytest.approx(60, abs=TOL + 1)
    assert other.share(r.at(change + 0.1), r.at(seconds)) == pytest.approx(40, abs=TOL + 1)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
@timing
def test_a_dead_or_stopped_holder_does_not_stall_the_gpu(tmp_path: Path, sig: int) -> None:
    seconds, at = 3.0, 1.0

    def stop_one(procs: list[subprocess.Popen], r) -> None:
        time.sleep(max(0.0, (r.at(at) - time.monotonic_ns()) / 1e9))
        os.kill(procs[0].pid, sig)
        # A stopped process never ends by itself: kill it once the survivor is done.
        threading.Timer(seconds + 1.0, procs[0].kill).start()

    r = run_loads(tmp_path, [Load(burst(50)), Load(burst(50))], seconds, on_started=stop_one)
    survivor = r.traces[1]
    assert survivor.summary["returncode"] == 0, survivor.stderr
    # The survivor has the GPU to itself once the token's lease (200 ms) lapses.
    assert survivor.share(r.at(at + 0.5), r.at(seconds)) >= 85


def test_a_holder_in_a_long_kernel_keeps_its_lease(tmp_path: Path) -> None:
    """A kernel longer than the lease (VGPU_LEASE_NS, 50 ms) blocks the holder thread in one
    event sync that long; the lease thread renews the lease meanwhile, so the broker never
    takes the token from a live holder as if its process had died. (Before it, this slice
    alone lost the token to its lapsed lease in every kernel: 13 revocations in 1.2 s.)
    A slice alone and burst is revoked for nothing else: no one waits, no credit runs out."""
    r = run_loads(tmp_path, [Load(burst(50), kernel="busy_80000us")], 1.2)
    assert r.traces[0].summary["returncode"] == 0, r.traces[0].stderr
    gpu = next(p for p in (tmp_path / "sched").iterdir() if "." not in p.name)
    with open_sched(gpu) as sched:
        snap = sched.snapshot()
    assert [e.holds for e in snap.entries if e.key] != [0], "the slice never held the token"
    assert snap.revocations == 0, f"a live holder lost the token {snap.revocations} times"


def test_a_launch_of_unknown_length_is_queued_alone(tmp_path: Path) -> None:
    """Until the ledger has learnt a kernel length, a throttled process queues one launch at
    a time: the first may be as long as any. (Before, it queued 4 launches of unknown length:
    a fixed 30 % slice of 1 s kernels queued 2 s in its first hold, a tail it paid for with
    the next 7 s of its share.) The second launch returns only after the first kernel ended
    on simgpu's engine (gpu_load notes a launch when its call returns; the first kernel
    starts inside its call, so launch to launch may be a little under 200 ms on a loaded
    host)."""
    r = run_loads(tmp_path, [Load(burst(50), kernel="busy_200000us", args=["--queue", "4"])],
                  0.6)
    (t,) = r.traces
    assert t.summary["returncode"] == 0, t.stderr
    second = sorted(t.t)[1]
    first_end = min(end for _, end, pid in engine_timeline(tmp_path) if pid == t.summary["pid"])
    assert second >= first_end, (
        f"the second launch returned {(first_end - second) / 1e6:.3f} ms before the first "
        "200 ms kernel ended")


def _thread_cpu_s(pid: int, name: str) -> float:
    """CPU seconds (user + system) the threads of pid called `name` have used."""
    tasks = Path(f"/proc/{pid}/task")
    total = 0
    for task in tasks.iterdir():
        if (task / "comm").read_text().strip() == name:
            fields = stat_fields(task.name, tasks)      # from field 3: utime, stime are 14, 15
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def test_the_holder_thread_sleeps_while_its_work_runs(tmp_path: Path) -> None:
    """libvgpu's holder thread waits for its queued work with blocking events: without
    CU_EVENT_BLOCKING_SYNC the driver busy-waits (simgpu too), which would cost every
    throttled process a CPU core for as long as it has work on the GPU."""
    seconds = 2.0

    cpu: list[float] = []

    def sample(procs: list[subprocess.Popen], r) -> None:
        time.sleep(max(0.0, (r.at(seconds - 0.3) - time.monotonic_ns()) / 1e9))
        cpu.append(_thread_cpu_s(procs[0].pid, "vgpu-holder"))

    r = run_loads(tmp_path, [Load(fixed(50), kernel="busy_2000us")], seconds, on_started=sample)
    assert r.traces[0].summary["returncode"] == 0, r.traces[0].stderr
    assert r.traces[0].share(r.at(WARM), r.at(seconds)) >= 25  # it did hold, with work queued
    [used] = cpu
    assert used < 0.1 * seconds, f"the holder thread used {used:.2f} s of CPU in {seconds} s"


def test_slices_started_together_both_run(tmp_path: Path) -> None:
    """Two processes that start at the same instant on a fresh file both elect a broker
    at times; the loser must wait for the winner, and grants of two overlapping brokers
    must never look alike (one slice once took the other's grant for its own: 0 %)."""
    seconds, rounds = 1.2, 15
    for i in range(rounds):
        tmp = tmp_path / f"round{i}"
        tmp.mkdir()
        loads = [Load(fixed(50), kernel="busy_100us", args=["--queue", "40"]),
                 Load(burst(50), kernel="busy_100us", args=["--queue", "40"])]
        got = shares(tmp, loads, seconds)
        assert min(got) >= 20, f"round {i}: shares {got}: a slice starved"


@pytest.mark.parametrize("path", ["graph", "graph-procaddr"])
@timing
def test_capture_is_not_throttled_but_the_graph_is(tmp_path: Path, path: str) -> None:
    """Kernels launched into a capturing stream do not run, so they are not charged; a
    capture begun through cuGetProcAddress's pointers (the CUDA runtime's way) is seen too
    (libvgpu counts open captures and asks the driver about a launch's stream only then).
    Each graph is 80 ms of work, longer than the broker waits for a drain report: without
    one launch at a time and the late tail's charge this slice took 78.5 % (6 s: a launch
    is 1.3 % of the window, so the GPU time is measured as it ran, not at launch)."""
    r = run_loads(tmp_path, [Load(fixed(25), args=["--path", path, "--graph-kernels", "80"])], 6.0)
    (t,) = r.traces
    assert t.summary["returncode"] == 0, t.stderr
    assert t.ran_alone(r.at(WARM), r.at(6.0)) == pytest.approx(25, abs=TOL)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("VGPU_COMPUTE_LIMIT", "1",
     'VGPU_COMPUTE_LIMIT="1": not a compute share: use an integer percent 2..100'),
    ("VGPU_COMPUTE_LIMIT", "half", 'VGPU_COMPUTE_LIMIT="half": not a compute share'),
    ("VGPU_COMPUTE_LIMIT_X", "20", 'VGPU_COMPUTE_LIMIT_X="20": unknown variable'),
    ("VGPU_PRIORITY", "urgent", 'VGPU_PRIORITY="urgent": unknown value: use high, normal or low'),
    ("VGPU_POLICY", "greedy", 'VGPU_POLICY="greedy": unknown value: use fixed or burst'),
    ("VGPU_PRIORITY_FLOOR", "101", 'VGPU_PRIORITY_FLOOR="101": not a floor'),
])
def test_bad_compute_settings_fail_closed_with_one_line(tmp_path: Path, key: str, value: str,
                                                        message: str) -> None:
    env = load_env(tmp_path, "1Gi")
    env[key] = value
    p = run([str(GPU_LOAD), "--seconds", "0.1"], env, check=False)
    assert p.returncode != 0
    lines = [line for line in p.stderr.splitlines() if line.startswith("vgpu:")]
    assert len(lines) == 1 and message in lines[0], p.stderr


@timing
def test_full_share_alone_takes_no_token(tmp_path: Path) -> None:
    """A 100% slice with nobody of higher priority skips the scheduler entirely."""
    from arbiter.files.sched_files import open_sched

    (got,) = shares(tmp_path, [Load({"VGPU_COMPUTE_LIMIT": "100"})])
    assert got >= 95
    (path,) = (p for p in (tmp_path / "sched").iterdir() if "." not in p.name)  # the GPU's file
    with open_sched(path) as s:
        assert s.handoffs == 0


@pytest.mark.parametrize("damage", ["zero-magic", "truncated", "other-version"])
def test_a_damaged_scheduling_file_fails_closed_with_one_line(tmp_path: Path,
                                                              damage: str) -> None:
    """Never open: a GPU whose scheduling file cannot be trusted gets no kernels from us."""
    from arbiter.files.sched_files import VgpuSched

    env = {**load_env(tmp_path, "1Gi"), **fixed(30)}
    (tmp_path / "sched").mkdir()
    run([str(GPU_LOAD), "--seconds", "0.1"], env)
    (gpu,) = (p for p in (tmp_path / "sched").iterdir() if "." not in p.name)
    with gpu.open("r+b") as f:
        if damage == "truncated":
            f.truncate(100)
        else:
            f.seek(VgpuSched.magic.offset if damage == "zero-magic" else VgpuSched.version.offset)
            f.write((0 if damage == "zero-magic" else 9).to_bytes(4, "little"))
    p = run([str(GPU_LOAD), "--seconds", "0.1"], env, check=False)
    assert p.returncode != 0
    lines = [line for line in p.stderr.splitlines() if line.startswith("vgpu:")]
    assert len(lines) == 1, p.stderr
    assert str(gpu) in lines[0] and "launches on this GPU are refused" in lines[0]
    assert "cuLaunchKernel failed: 800" in p.stderr  # CUDA_ERROR_NOT_PERMITTED
