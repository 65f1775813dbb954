# SPDX-License-Identifier: Apache-2.0
"""vgpud's compute guard: the thread that measures, decides (arbiter.guard) and acts.

Every interval_s (0.5 s) it reads NVML's per-process utilisation of the last
window_s (1 s), attributes it to slices by the pids the host knows for them
(arbiter.attribution.SlicePids.host: never pids a tenant wrote), and acts on
each new finding by `action`:

- flag: event `guard.over_share` and vgpu_guard_findings_total;
- kill: that, then SIGKILL to the slice's processes that used the GPU
  (event `guard.kill`);
- throttle: that, then the cgroup v2 freezer in a duty cycle on the cgroup of
  each such process (event `guard.throttle`), corrected every window until the
  slice holds its allowance. A cgroup is only frozen when every process in it
  (and below it) belongs to the slice, it is not the root and not vgpud's own;
  otherwise `guard.throttle_refused` says why and the finding stays flagged.
  A throttle is lifted (`guard.unthrottle`) when its slice is released, its
  processes are gone, it no longer holds anything back, or the action changes;
  stop() thaws every cgroup. The cgroups being throttled are listed in a file
  (`ledger`), so a vgpud killed with SIGKILL thaws them when it starts again.

A greedy bypass is caught within about window * allowance + interval: under 1.5 s.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arbiter import guard
from arbiter.attribution import SlicePids
from arbiter.core import Arbiter
from arbiter.freezer import DutyCycle, Freezer, cgroup_of
from arbiter.model import Policy, Slice

__all__ = ["ComputeGuard"]

log = logging.getLogger("vgpud")

Measure = Callable[[], Mapping[int, Mapping[int, int]]]


@dataclass
class _Throttle:
    """One throttled cgroup: the slice and GPU it holds, and its duty cycle."""

    slice_id: str
    gpu: int
    allowed: int
    cycle: DutyCycle
    adjusted: float               # monotonic time of the last run-fraction change


class ComputeGuard:
    """Catches slices whose processes use more of a GPU than their share, out of band."""

    def __init__(
        self,
        arbiter: Arbiter,
        measure: Measure,
        *,
        action: str = guard.DEFAULT_ACTION,
        margin: int = guard.DEFAULT_MARGIN,
        interval_s: float = 0.5,
        window_s: float = 1.0,
        freezer: Freezer | None = None,
        ledger: Path | None = None,
        proc: Path = Path("/proc"),
        kill: Callable[[int, int], None] = os.kill,
        metrics: Any = None,
    ) -> None:
        self.arbiter = arbiter
        self.measure = measure
        self.action = action
        self.margin = margin
        self.interval_s = interval_s
        self.window_s = window_s
        self.freezer = freezer
        self.ledger = ledger
        self.proc = Path(proc)
        self._kill = kill
        self.metrics = metrics
        self._throttles: dict[str, _Throttle] = {}   # cgroup -> throttle
        self._over: set[tuple[str, int]] = set()     # (slice, gpu) over in the last tick
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- settings --------------------------------------------------------------

    def configure(self, *, action: str, margin: int) -> None:
        """Apply reloaded settings; leaving throttle lifts every throttle."""
        with self._lock:
            self.action, self.margin = action, margin
            if action != "throttle":
                for cg in list(self._throttles):
                    self._lift(cg, "action changed")

    # -- one tick --------------------------------------------------------------

    def tick(self) -> list[guard.Finding]:
        """Measure once, act on new findings, steer the throttles; return the findings."""
        with self._lock:
            slices = {s.id: s for s in self.arbiter.slices()}
            util = self.measure() if slices else {}
            owners = SlicePids(self.arbiter.regions.pids, self.proc)
            host = {sid: owners.host(s) for sid, s in slices.items()}
            uses = [guard.SliceUse(s.id, g.gpu_index, g.compute, s.policy == Policy.BURST,
                                   {p: u for p, u in util.get(g.gpu_index, {}).items()
                                    if p in host[s.id]})
                    for s in slices.values() for g in s.grants]
            found = guard.findings(uses, self.margin)
            held = {(t.slice_id, t.gpu) for t in self._throttles.values()}
            over = set()
            for f in found:
                over.add((f.slice_id, f.gpu))
                if (f.slice_id, f.gpu) in self._over or (f.slice_id, f.gpu) in held:
                    continue  # one event per episode; a throttle already steers it
                self._act(slices[f.slice_id], f, host[f.slice_id])
            self._over = over
            self._steer(slices, {(u.slice_id, u.gpu): u.used for u in uses})
            return found

    def _act(self, s: Slice, f: guard.Finding, pids: set[int]) -> None:
        self.arbiter.emit("guard.over_share", slice=s.id, owner=s.owner, gpu=f.gpu,
                          used=f.used, allowed=f.allowed, pids=list(f.pids), action=self.action)
        if self.metrics is not None and hasattr(self.metrics, "guard_finding"):
            self.metrics.guard_finding(self.action)
        if self.action == "kill":
            killed = []
            for pid in f.pids:
                with contextlib.suppress(OSError):
                    self._kill(pid, signal.SIGKILL)
                    killed.append(pid)
            self.arbiter.emit("guard.kill", slice=s.id, owner=s.owner, gpu=f.gpu, pids=killed)
        elif self.action == "throttle":
            self._throttle(s, f, pids)

    def _throttle(self, s: Slice, f: guard.Finding, pids: set[int]) -> None:
        cgroups = {cg for cg in (cgroup_of(p, self.proc) for p in f.pids) if cg is not None}
        for cg in sorted(cgroups):
            if cg in self._throttles:
                continue
            why = self._refusal(cg, pids)
            if why:
                self.arbiter.emit("guard.throttle_refused", slice=s.id, owner=s.owner,
                                  gpu=f.gpu, cgroup=cg, reason=why)
                continue
            assert self.freezer is not None
            run = guard.first_run_fraction(f.allowed, f.used)
            cycle = DutyCycle(self.freezer, cg, run)
            self._throttles[cg] = _Throttle(s.id, f.gpu, f.allowed, cycle, time.monotonic())
            self._write_ledger()
            cycle.start()
            self.arbiter.emit("guard.throttle", slice=s.id, owner=s.owner, gpu=f.gpu,
                              cgroup=cg, run_fraction=round(run, 3), allowed=f.allowed)

    def _refusal(self, cgroup: str, pids: set[int]) -> str:
        """Why the cgroup must not be frozen for this slice ("" when it may be)."""
        if self.freezer is None:
            return "no cgroup v2 freezer on this host"
        if not self.freezer.can_freeze(cgroup):
            return "the cgroup cannot be frozen (the root, or no cgroup.freeze)"
        members = self.freezer.members(cgroup)
        if members is None:
            return "the cgroup is gone"
        if os.getpid() in members:
            return "vgpud runs in that cgroup"
        strangers = members - pids
        if strangers:
            return f"{len(strangers)} process(es) in the cgroup are not the slice's"
        return ""

    def _steer(self, slices: Mapping[str, Slice], used: Mapping[tuple[str, int], int]) -> None:
        """Correct each throttle once per window; lift those with nothing left to hold."""
        now = time.monotonic()
        for cg, t in list(self._throttles.items()):
            assert self.freezer is not None
            if t.slice_id not in slices:
                self._lift(cg, "slice released")
                continue
            if not self.freezer.members(cg):
                self._lift(cg, "processes gone")
                continue
            if now - t.adjusted < self.window_s:
                continue  # the window still holds time from before the last change
            run = guard.next_run_fraction(t.cycle.run_fraction, t.allowed,
                                          used.get((t.slice_id, t.gpu), 0))
            t.adjusted = now
            if run >= 1.0:
                self._lift(cg, "under its share")
            else:
                t.cycle.run_fraction = run

    def _lift(self, cgroup: str, reason: str) -> None:
        t = self._throttles.pop(cgroup, None)
        if t is None:
            return
        t.cycle.stop()
        self._write_ledger()
        self.arbiter.emit("guard.unthrottle", slice=t.slice_id, gpu=t.gpu, cgroup=cgroup,
                          reason=reason)

    # -- the ledger of frozen cgroups ------------------------------------------

    def _write_ledger(self) -> None:
        if self.ledger is None:
            return
        try:
            tmp = self.ledger.with_name(self.ledger.name + ".tmp")
            tmp.write_text("".join(f"{cg}\n" for cg in sorted(self._throttles)))
            os.replace(tmp, self.ledger)
        except OSError as e:
            log.warning("guard: cannot write %s: %s", self.ledger, e.strerror or e)

    def thaw_leftovers(self) -> list[str]:
        """Thaw the cgroups a previous vgpud left in its ledger (it died while throttling)."""
        if self.ledger is None or self.freezer is None:
            return []
        try:
            listed = [line for line in self.ledger.read_text().splitlines() if line]
        except OSError:
            return []
        thawed = []
        for cg in listed:
            with contextlib.suppress(OSError):
                self.freezer.set_frozen(cg, False)
                thawed.append(cg)
        with contextlib.suppress(OSError):
            self.ledger.unlink()
        if thawed:
            log.warning("guard: thawed %s, left frozen by a vgpud that stopped", thawed)
        return thawed

    # -- the thread ------------------------------------------------------------

    def start(self) -> None:
        """Thaw leftovers, then tick every interval_s in a daemon thread until stop()."""
        self.thaw_leftovers()
        self._thread = threading.Thread(target=self._loop, name="vgpud-guard", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:
                log.exception("compute guard tick failed")

    def stop(self) -> None:
        """Stop ticking and thaw every throttled cgroup."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for cg in list(self._throttles):
                self._lift(cg, "vgpud stopping")
