# SPDX-License-Identifier: Apache-2.0
"""Run gpu_load processes side by side on one simgpu and measure their GPU time.

Shared by the compute tests and bench/compute.py. Each load is a greedy process
(build/tests/gpu_load) under libvgpu with its own environment (VGPU_COMPUTE_LIMIT,
VGPU_POLICY, VGPU_PRIORITY, ...); all name one VGPU_SCHED_DIR, so they coordinate
as slices on one GPU do. Every process traces its launches; a launch of a
busy_<N>us kernel is N us of GPU time, so a process's share of a window is the
GPU time of the launches it made in that window divided by the window (the
scheduler keeps a few ms of work queued at most, so launch time and run time
differ by less than that).
"""
from __future__ import annotations

import array
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conftest import LIBVGPU, SIMGPU_DIR, TEST_BIN, clean_env

GPU_LOAD = TEST_BIN / "gpu_load"


@dataclass
class Load:
    """One greedy process: its env, when it runs (seconds from t0) and gpu_load args."""

    env: Mapping[str, str] = field(default_factory=dict)
    start: float = 0.0
    end: float | None = None          # None: until the run ends
    kernel: str = "busy_1000us"
    args: Sequence[str] = ()


@dataclass
class Trace:
    """The launches of one process: times (ns), GPU ns each, device each."""

    t: list[int]
    gpu_ns: list[int]
    dev: list[int]
    summary: dict
    stderr: str

    def share(self, a: int, b: int, dev: int | None = None) -> float:
        """Percent of [a, b) that this process's launches (on dev) occupied the GPU."""
        busy = sum(g for t, g, d in zip(self.t, self.gpu_ns, self.dev, strict=False)
                   if a <= t < b and (dev is None or d == dev))
        return busy / (b - a) * 100

    def launches_between(self, a: int, b: int) -> list[int]:
        return [t for t in self.t if a <= t < b]


@dataclass
class Run:
    t0: int                            # CLOCK_MONOTONIC ns of "start 0"
    traces: list[Trace]

    def at(self, seconds: float) -> int:
        return self.t0 + int(seconds * 1e9)


def load_env(tmp: Path, devices: str) -> dict[str, str]:
    env = clean_env()
    env.update(LD_LIBRARY_PATH=str(SIMGPU_DIR), SIMGPU_STATE=str(tmp / "simgpu.state"),
               SIMGPU_DEVICES=devices, LD_PRELOAD=str(LIBVGPU),
               VGPU_SCHED_DIR=str(tmp / "sched"))
    return env


def run_loads(tmp: Path, loads: Sequence[Load], seconds: float, devices: str = "16Gi",
              lead_s: float = 0.3, on_started: object = None) -> Run:
    """Start every load, wait for all, return their traces.

    on_started(procs, run) is called once all processes are started (e.g. to kill one).
    """
    (tmp / "sched").mkdir(exist_ok=True)
    base = load_env(tmp, devices)
    t0 = time.monotonic_ns() + int(lead_s * 1e9)   # after every process has booted
    procs = []
    for i, load in enumerate(loads):
        env = {**base, **load.env}
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
        raw = array.array("Q")
        path = tmp / f"trace{i}"
        if path.exists():
            raw.frombytes(path.read_bytes())
        traces.append(Trace(list(raw[0::3]), list(raw[1::3]), list(raw[2::3]),
                            {"returncode": p.returncode, **summary}, err))
    run.traces = traces
    return run


def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    os.kill(proc.pid, sig)
