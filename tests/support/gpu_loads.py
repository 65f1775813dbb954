# SPDX-License-Identifier: Apache-2.0
"""Run gpu_load processes side by side on one simgpu and measure their GPU time.

Shared by the compute tests and bench/compute.py. Each load is a process
(build/tests/gpu_load: greedy, or a step loop with --sync-every/--cpu-gap-us) under
libvgpu with its own environment (VGPU_COMPUTE_LIMIT, VGPU_POLICY, VGPU_PRIORITY,
...); all name one VGPU_SCHED_DIR, so they coordinate as slices on one GPU do.
Every process traces its launches; a launch of a busy_<N>us kernel is N us of GPU
time, so a process's share of a window is the GPU time of the launches it made in
that window divided by the window (the scheduler keeps a few ms of work queued at
most, and a step loop syncs every few ms, so launch time and run time differ by
less than that).
"""
from __future__ import annotations

import array
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from support.paths import LIBVGPU, SIMGPU_DIR, TEST_BIN
from support.process import clean_env

GPU_LOAD = TEST_BIN / "gpu_load"


@dataclass
class Load:
    """One process: its env, when it runs (seconds from t0) and gpu_load args."""

    env: Mapping[str, str] = field(default_factory=dict)
    start: float = 0.0
    end: float | None = None          # None: until the run ends
    kernel: str = "busy_1000us"       # or a list cycled per launch: "busy_50us,busy_5000us"
    args: Sequence[str] = ()
    vgpu: bool = True                 # False: no libvgpu (the load's own use of the GPU)

    def unlimited(self) -> Load:
        """The same load without libvgpu: what it does with the GPU to itself."""
        return replace(self, env={}, vgpu=False, start=0.0, end=None)


def step_loop(kernel: str, sync_every: int, cpu_gap_us: int = 0,
              env: Mapping[str, str] | None = None, wait: str = "sync") -> Load:
    """A loop of steps: sync_every launches, a stream sync (wait="poll": cuStreamQuery
    until done), then cpu_gap_us of CPU work."""
    args = ["--sync-every", str(sync_every), "--cpu-gap-us", str(cpu_gap_us), "--wait", wait]
    return Load(dict(env or {}), kernel=kernel, args=args)


@dataclass
class Trace:
    """The launches of one process: times (ns), GPU ns each, device each."""

    t: list[int]
    gpu_ns: list[int]
    dev: list[int]
    summary: dict
    stderr: str

    def share(self, a: int, b: int, dev: int | None = None) -> float:
        """Percent of [a, b) that this process's launches (on dev) occupied the GPU.

        A launch counts at its launch time; over windows of seconds that is right
        for step loops too (a step's work runs within a few ms of its launches).
        """
        busy = sum(g for t, g, d in zip(self.t, self.gpu_ns, self.dev, strict=False)
                   if a <= t < b and (dev is None or d == dev))
        return busy / (b - a) * 100

    def ran_alone(self, a: int, b: int) -> float:
        """Percent of [a, b) the GPU ran this process's work, had it the GPU to itself.

        Exact for a process alone on a GPU (simgpu runs launches in order, each
        from its launch or its predecessor's end): unlike share(), a deep queue
        of long launches (graphs) at the window's edges does not count early.
        """
        busy, tail = 0, 0
        for t, g in sorted(zip(self.t, self.gpu_ns, strict=False)):
            start = max(t, tail)
            tail = start + g
            busy += max(0, min(tail, b) - max(start, a))
        return busy / (b - a) * 100

    def launches_between(self, a: int, b: int) -> list[int]:
        return [t for t in self.t if a <= t < b]


@dataclass
class Run:
    t0: int                            # CLOCK_MONOTONIC ns of "start 0"
    traces: list[Trace]

    def at(self, seconds: float) -> int:
        return self.t0 + int(seconds * 1e9)


def read_trace(path: Path, summary: dict | None = None, stderr: str = "") -> Trace:
    """The launches gpu_load --trace wrote to path (none when it wrote no file)."""
    raw = array.array("Q")
    if path.exists():
        raw.frombytes(path.read_bytes())
    return Trace(list(raw[0::3]), list(raw[1::3]), list(raw[2::3]), summary or {}, stderr)


def load_env(tmp: Path, devices: str, simgpu: Mapping[str, str] | None = None) -> dict[str, str]:
    """The env of a load: simgpu on tmp's state, libvgpu preloaded, one scheduling dir;
    simgpu: more SIMGPU_* settings (a mode of docs/simgpu.md, e.g. SIMGPU_WAKE_US)."""
    env = clean_env()
    env.update(LD_LIBRARY_PATH=str(SIMGPU_DIR), SIMGPU_STATE=str(tmp / "simgpu.state"),
               SIMGPU_DEVICES=devices, LD_PRELOAD=str(LIBVGPU),
               VGPU_SCHED_DIR=str(tmp / "sched"))
    env.update(simgpu or {})
    return env


def run_loads(tmp: Path, loads: Sequence[Load], seconds: float, devices: str = "16Gi",
              lead_s: float = 0.3, on_started: object = None,
              simgpu: Mapping[str, str] | None = None) -> Run:
    """Start every load, wait for all, return their traces.

    on_started(procs, run) is called once all processes are started (e.g. to kill one).
    """
    (tmp / "sched").mkdir(exist_ok=True)
    base = load_env(tmp, devices, simgpu)
    t0 = time.monotonic_ns() + int(lead_s * 1e9)   # after every process has booted
    procs = []
    for i, load in enumerate(loads):
        env = {**base, **load.env}
        if not load.vgpu:
            env = {k: v for k, v in env.items() if k != "LD_PRELOAD" and not k.startswith("VGPU_")}
        end = seconds if load.end is None else load.end
        cmd = [str(GPU_LOAD), "--kernel", load.kernel,
               "--start-at", str(t0 + int(load.start * 1e9)),
               "--until", str(t0 + int(end * 1e9)),
               "--trace", str(tmp / f"trace{i}"), *load.args]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    run = Run(t0, [])
    if callable(on_started):
        on_started(procs, run)
    traces = []
    for i, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=seconds + 60)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"gpu_load {i} did not finish: a scheduler deadlock?") from None
        summary = json.loads(out) if p.returncode == 0 and out.strip() else {}
        traces.append(read_trace(tmp / f"trace{i}", {"returncode": p.returncode, **summary}, err))
    run.traces = traces
    return run


class Timeline(list):
    """simgpu's engine timeline: (start ns, end ns, pid) each, oldest first; `partial` when
    the device's ring (its last SIMGPU_RING runs) had overwritten older ones, so it covers
    nothing before its first start."""

    partial: bool = False  # only ever with a full ring: never empty then

    def covers(self, a: int) -> bool:
        return not self.partial or self[0][0] <= a


def engine_timeline(tmp: Path) -> Timeline:
    """simgpu's engine timeline of the run in tmp (build/tests/simgpu_timeline: its last
    32768 pieces of kernels, one per time slice in the time-sliced engine): (start ns,
    end ns, pid) each, CLOCK_MONOTONIC."""
    done = subprocess.run([str(TEST_BIN / "simgpu_timeline"), str(tmp / "simgpu.state")],
                          check=True, capture_output=True, text=True)
    timeline = Timeline((int(a), int(b), int(c))
                        for a, b, c in (line.split() for line in done.stdout.splitlines()))
    timeline.partial = "overwritten" in done.stderr
    return timeline


def timeline_shares(tmp: Path, run: Run, a: int, b: int,
                    timeline: Timeline | None = None) -> list[float]:
    """Percent of [a, b) each load's kernels ran on simgpu's engine, from the engine's own
    timeline (read from tmp unless given), not from launch times: a 1 s kernel launched
    before the window runs in it. ValueError when the timeline no longer reaches back to a
    (its ring overwrote the window's start): a share read from it would be short."""
    timeline = engine_timeline(tmp) if timeline is None else timeline
    if not timeline.covers(a):
        raise ValueError(f"simgpu's engine timeline starts {(timeline[0][0] - a) / 1e6:.1f} ms "
                         f"after the window: its ring overwrote the window's start (read a "
                         f"shorter or later window)")
    busy: dict[int, int] = {}
    for start, end, pid in timeline:
        busy[pid] = busy.get(pid, 0) + max(0, min(end, b) - max(start, a))
    return [busy.get(int(t.summary.get("pid", -1)), 0) / (b - a) * 100 for t in run.traces]


def use_alone(tmp: Path, load: Load, seconds: float, warm: float,
              devices: str = "16Gi", simgpu: Mapping[str, str] | None = None) -> float:
    """U: the percent of the GPU the load uses alone, without libvgpu, over [warm, seconds)."""
    run = run_loads(tmp, [load.unlimited()], seconds, devices=devices, simgpu=simgpu)
    (t,) = run.traces
    assert t.summary["returncode"] == 0, f"load alone: {t.stderr}"
    return t.share(run.at(warm), run.at(seconds))


def wear_sched_file(tmp: Path, rounds: int = 3, seed: int = 9,
                    simgpu: Mapping[str, str] | None = None) -> None:
    """Use tmp's scheduling file as a busy GPU's is: slices come, go and die by SIGKILL.

    A first round with every priority and policy, two of them killed mid-run; then
    short rounds of two slices handing the token back and forth, one killed at a
    random moment (often while its queued work still runs after a hand-over).
    """
    def killer(victims: list[tuple[int, float]]) -> Callable[[list[subprocess.Popen], Run], None]:
        def kill_them(procs: list[subprocess.Popen], r: Run) -> None:
            for i, at in victims:
                time.sleep(max(0.0, (r.at(at) - time.monotonic_ns()) / 1e9))
                kill(procs[i])
        return kill_them

    def env(pct: int, policy: str, priority: str = "normal") -> dict[str, str]:
        return {"VGPU_COMPUTE_LIMIT": str(pct), "VGPU_POLICY": policy, "VGPU_PRIORITY": priority}

    run_loads(tmp, [Load(env(60, "burst")), Load(env(30, "fixed"), kernel="busy_200us"),
                    Load(env(40, "burst", "high"), kernel="busy_2000us"),
                    step_loop("busy_500us", 8, 2000, env(20, "fixed"))],
              1.0, on_started=killer([(2, 0.5), (3, 0.7)]), simgpu=simgpu)
    rng = random.Random(seed)
    for _ in range(rounds):
        run_loads(tmp, [Load(env(30, "fixed"), kernel="busy_2000us"),
                        Load(env(70, "burst"), kernel="busy_500us")],
                  0.4, on_started=killer([(0, rng.uniform(0.1, 0.35))]), simgpu=simgpu)


def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    os.kill(proc.pid, sig)


def steal_ticks() -> int:
    """CPU time the hypervisor took from this VM so far (/proc/stat, USER_HZ ticks)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) if len(fields) > 8 else 0


class StealClock:
    """Whether the VM's host took a noticeable part of its CPU time since this was made.

    A timing test that fails then is measured again: the measurement, not the
    scheduler, failed (tests/support/measure.py's `timing`)."""

    #: The part of the VM's CPU time taken that makes a measurement unfit.
    STOLEN = 0.01

    def __init__(self) -> None:
        self.t0, self.s0 = time.monotonic(), steal_ticks()

    def stolen(self) -> float:
        seconds = max(1e-9, (time.monotonic() - self.t0) * (os.cpu_count() or 1))
        return (steal_ticks() - self.s0) / os.sysconf("SC_CLK_TCK") / seconds
