# SPDX-License-Identifier: Apache-2.0
"""vgpud's out-of-band guard: the thread that measures, decides and acts, for compute
(arbiter.compute.compute_guard) and memory (arbiter.compute.memory_guard) alike.

Every interval_s (0.5 s) it reads NVML's per-process utilisation of the last
window_s (1 s) and NVML's per-process device memory, attributes both to slices
by the pids the host knows for them (arbiter.slices.attribution.SlicePids.host: the
owner, its descendants, its container's pid namespace; never pids a tenant
wrote, so a tenant cannot point the guard at a neighbour), and acts.

Compute: on each new finding (a slice above its share), by `action`:

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

Memory: a slice whose processes hold more than its limit (plus memory_margin,
once per slice) on a GPU in CONFIRM (2) measurements in a row, by `memory_action`:

- flag: event `guard.over_memory` and vgpu_guard_findings_total, once per episode;
- kill (the default, see arbiter.compute.memory_guard): that, then SIGKILL to the fewest of
  the slice's processes on that GPU, largest first, that bring it back within
  its limit (event `guard.kill`, resource "memory"), repeated while it stays over;
- throttle: that, then the freezer holds the cgroups of its processes on that GPU
  at the least run fraction until it is back within its limit. It gives no
  memory back (a frozen process keeps its allocations): it only stops the
  slice from taking more, which is why it is not the default.

A bypass that allocates past its limit is caught within CONFIRM * interval_s
plus one NVML read: under 1.5 s.

Escalation: killing the largest holders ends one bypass, but a supervisor that
starts it again takes the memory back within a second, over and over. Each memory
finding the guard acts on (a new episode, or a round that kills someone new) is
counted per slice; memory_escalate_after of them within memory_escalate_window_s
stop the whole slice, by memory_escalate_action (event `guard.escalate`, naming
the slice and why):

- kill (the default): every process of the slice: each cgroup its processes are in
  that holds only the slice's (cgroup.kill), and the rest one by one, stopped
  first so none forks past the kill;
- freeze: those cgroups frozen for good (the supervisor cannot respawn anything; the
  finding's largest holders are still SIGKILLed, so the memory goes back); a process
  of the slice outside such a cgroup is killed. They stay frozen until the slice's
  container is removed: vgpud neither thaws them when it stops nor lists them in
  its ledger (a tenant must not get out by outliving a vgpud restart).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arbiter.compute import compute_guard, memory_guard
from arbiter.compute.freezer import DutyCycle, Freezer, cgroup_of, strangers
from arbiter.files.atomic import write_whole
from arbiter.model import Policy, Slice
from arbiter.slices.arbiter import Arbiter
from arbiter.slices.attribution import SlicePids

__all__ = ["ComputeGuard", "Findings", "Guardian"]

log = logging.getLogger("vgpud")

#: GPU index -> host pid -> a measure (SM % over the window, or bytes of device memory).
Measure = Callable[[], Mapping[int, Mapping[int, int]]]


@dataclass
class _Throttle:
    """One throttled cgroup: the slice and GPU it holds, and its duty cycle."""

    slice_id: str
    gpu: int
    allowed: int | None           # the compute allowance it steers to; None: memory only
    cycle: DutyCycle
    adjusted: float               # monotonic time of the last run-fraction change
    memory: bool = False          # held at the least run fraction: the slice is over its memory


@dataclass(frozen=True)
class Findings:
    """What one tick found: slices above their compute share, and above their memory limit."""

    compute: list[compute_guard.Finding]
    memory: list[memory_guard.MemoryFinding]


class Guardian:
    """Catches slices whose processes use more of a GPU or its memory than granted, out of band."""

    def __init__(
        self,
        arbiter: Arbiter,
        measure: Measure,
        *,
        action: str = compute_guard.DEFAULT_ACTION,
        margin: int = compute_guard.DEFAULT_MARGIN,
        memory_action: str = memory_guard.DEFAULT_ACTION,
        memory_margin: int = memory_guard.DEFAULT_MARGIN,
        memory: Measure | None = None,
        memory_escalate_after: int = memory_guard.DEFAULT_ESCALATE_AFTER,
        memory_escalate_window_s: float = memory_guard.DEFAULT_ESCALATE_WINDOW_S,
        memory_escalate_action: str = memory_guard.DEFAULT_ESCALATE_ACTION,
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
        self.memory_action = memory_action
        self.memory_margin = memory_margin
        self.memory_escalate_after = memory_escalate_after
        self.memory_escalate_window_s = memory_escalate_window_s
        self.memory_escalate_action = memory_escalate_action
        # NVML's per-process memory comes with the arbiter's sample (one NVML read).
        self.memory = memory if memory is not None else (
            lambda: memory_guard.process_memory(arbiter.sample()))
        self.interval_s = interval_s
        self.window_s = window_s
        self.freezer = freezer
        self.ledger = ledger
        self.proc = Path(proc)
        self._kill = kill
        self.metrics = metrics
        self._throttles: dict[str, _Throttle] = {}   # cgroup -> throttle
        self._over: set[tuple[str, int]] = set()     # (slice, gpu) over in the last tick
        self._mem_seen: dict[tuple[str, int], int] = {}     # (slice, gpu) -> ticks over in a row
        self._mem_flagged: set[tuple[str, int]] = set()     # episodes already reported
        self._mem_killed: dict[tuple[str, int], set[int]] = {}  # pids SIGKILLed this episode
        self._mem_acted: dict[str, list[float]] = {}  # slice -> monotonic times it was acted on
        self._escalated: dict[str, list[str]] = {}    # slice -> cgroups frozen for good
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- settings --------------------------------------------------------------

    def configure(self, *, action: str, margin: int, memory_action: str | None = None,
                  memory_margin: int | None = None, memory_escalate_after: int | None = None,
                  memory_escalate_window_s: float | None = None,
                  memory_escalate_action: str | None = None) -> None:
        """Apply reloaded settings; leaving throttle lifts the throttles it made."""
        with self._lock:
            self.action, self.margin = action, margin
            if memory_action is not None:
                self.memory_action = memory_action
            if memory_margin is not None:
                self.memory_margin = memory_margin
            if memory_escalate_after is not None:
                self.memory_escalate_after = memory_escalate_after
            if memory_escalate_window_s is not None:
                self.memory_escalate_window_s = memory_escalate_window_s
            if memory_escalate_action is not None:
                self.memory_escalate_action = memory_escalate_action
            for cg, t in list(self._throttles.items()):
                if t.memory and self.memory_action != "throttle":
                    t.memory = False
                if t.allowed is not None and action != "throttle":
                    t.allowed = None
                if not t.memory and t.allowed is None:
                    self._lift(cg, "action changed")

    # -- one tick --------------------------------------------------------------

    def tick(self) -> Findings:
        """Measure once, act on new findings, steer the throttles; return the findings."""
        with self._lock:
            slices = {s.id: s for s in self.arbiter.slices()}
            util = self.measure() if slices else {}
            memory = self.memory() if slices else {}
            owners = SlicePids(self.arbiter.regions.pids, self.proc, users=self.arbiter.users_of)
            # Attribution scans /proc: only for slices on a GPU where NVML saw a process
            # (utilisation or memory). Elsewhere there is nothing to attribute, and an idle
            # node's guard costs the allocations beside it nothing.
            busy = {i for i, procs in (*util.items(), *memory.items()) if procs}
            host = {sid: owners.host(s) if any(g.gpu_index in busy for g in s.grants) else set()
                    for sid, s in slices.items()}
            uses = [compute_guard.SliceUse(s.id, g.gpu_index, g.compute, s.policy == Policy.BURST,
                                   {p: u for p, u in util.get(g.gpu_index, {}).items()
                                    if p in host[s.id]})
                    for s in slices.values() for g in s.grants]
            found = compute_guard.findings(uses, self.margin)
            held = {(t.slice_id, t.gpu) for t in self._throttles.values()
                    if t.allowed is not None}
            over = set()
            for f in found:
                over.add((f.slice_id, f.gpu))
                if (f.slice_id, f.gpu) in self._over or (f.slice_id, f.gpu) in held:
                    continue  # one event per episode; a throttle already steers it
                self._act(slices[f.slice_id], f, host[f.slice_id])
            self._over = over
            mem_found = self._check_memory(slices, memory, host)
            self._steer(slices, {(u.slice_id, u.gpu): u.used for u in uses})
            return Findings(found, mem_found)

    def _act(self, s: Slice, f: compute_guard.Finding, pids: set[int]) -> None:
        self.arbiter.emit("guard.over_share", of=s, slice=s.id, owner=s.owner, gpu=f.gpu,
                          used=f.used, allowed=f.allowed, pids=list(f.pids), action=self.action)
        if self.metrics is not None and hasattr(self.metrics, "guard_finding"):
            self.metrics.guard_finding(self.action)
        if self.action == "kill":
            killed = self._sigkill(f.pids)
            self.arbiter.emit("guard.kill", of=s, slice=s.id, owner=s.owner, gpu=f.gpu, pids=killed,
                              resource="compute")
        elif self.action == "throttle":
            self._hold(s, f.gpu, f.pids, pids, allowed=f.allowed,
                       run=compute_guard.first_run_fraction(f.allowed, f.used))

    def _sigkill(self, pids: Iterable[int]) -> list[int]:
        killed = []
        for pid in pids:
            with contextlib.suppress(OSError):
                self._kill(pid, signal.SIGKILL)
                killed.append(pid)
        return killed

    # -- memory ----------------------------------------------------------------

    def _check_memory(self, slices: Mapping[str, Slice], memory: Mapping[int, Mapping[int, int]],
                      host: Mapping[str, set[int]]) -> list[memory_guard.MemoryFinding]:
        """Count each (slice, GPU) over its memory; act on those over CONFIRM ticks in a row."""
        uses = memory_guard.slice_uses(list(slices.values()), memory, host)
        found = []
        seen: dict[tuple[str, int], int] = {}
        for f in memory_guard.findings(uses, self.memory_margin):
            key = (f.slice_id, f.gpu)
            seen[key] = self._mem_seen.get(key, 0) + 1
            if seen[key] >= memory_guard.CONFIRM:
                found.append(f)
                s = slices[f.slice_id]
                if self._act_memory(s, f, host[s.id]) and self._due(s.id):
                    self._escalate(s, f, host[s.id])
        self._mem_seen = seen
        # A released slice's count and freeze are forgotten (its cgroups go with it).
        for sid in set(self._mem_acted) - set(slices):
            del self._mem_acted[sid]
        for sid in set(self._escalated) - set(slices):
            del self._escalated[sid]
        # An episode ends when its slice is back within its limit: report the next one anew.
        self._mem_flagged &= set(seen)
        self._mem_killed = {k: v for k, v in self._mem_killed.items() if k in seen}
        return found

    def _act_memory(self, s: Slice, f: memory_guard.MemoryFinding, pids: set[int]) -> bool:
        """Act on a confirmed finding; True when it counts towards escalation (a new
        episode, or a kill round that found someone new)."""
        key = (f.slice_id, f.gpu)
        action = self.memory_action
        first = key not in self._mem_flagged
        if first:
            self._mem_flagged.add(key)
            self.arbiter.emit("guard.over_memory", of=s, slice=s.id, owner=s.owner, gpu=f.gpu,
                              used=f.used, limit=f.limit, allowed=f.allowed, pids=list(f.pids),
                              action=action)
            if self.metrics is not None and hasattr(self.metrics, "guard_finding"):
                self.metrics.guard_finding(action, "memory")
            log.warning("guard: slice %s holds %d bytes on GPU %d, limit %d: %s",
                        s.id, f.used, f.gpu, f.limit, action)
        if action == "kill":
            # Again while it stays over (a new process may take the memory back), but
            # each pid once per episode: a killed process may linger in NVML a moment.
            done = self._mem_killed.setdefault(key, set())
            todo = [p for p in f.victims if p not in done]
            done.update(todo)
            if todo:
                self.arbiter.emit("guard.kill", of=s, slice=s.id, owner=s.owner, gpu=f.gpu,
                                  pids=self._sigkill(todo), resource="memory")
            return first or bool(todo)
        if action == "throttle":
            # Every tick (a process that joins is held too); a refusal is said once.
            self._hold(s, f.gpu, f.pids, pids, allowed=None, run=compute_guard.MIN_RUN_FRACTION,
                       say_refusal=first)
        return first

    # -- escalation: a bypass that comes back ------------------------------------

    def _due(self, slice_id: str) -> bool:
        """Count a finding just acted on; whether those lately call for stopping the slice."""
        if slice_id in self._escalated:
            return False  # frozen already: its findings are only acted on
        now = time.monotonic()
        times = memory_guard.recent([*self._mem_acted.get(slice_id, ()), now], now,
                                self.memory_escalate_window_s)
        self._mem_acted[slice_id] = times
        return memory_guard.escalates(times, now, self.memory_escalate_after,
                                  self.memory_escalate_window_s)

    def _escalate(self, s: Slice, f: memory_guard.MemoryFinding, pids: set[int]) -> None:
        """Freeze or kill the whole slice (kill where it has no cgroup to freeze); say so."""
        n = len(self._mem_acted.pop(s.id, ()))
        frozen = self._freeze_own_cgroups(s, pids)
        inside = set().union(*(self._members(cg) for cg in frozen))
        action = "freeze" if self.memory_escalate_action == "freeze" and frozen else "kill"
        if action == "freeze":
            self._escalated[s.id] = frozen
            # Frozen processes keep their memory: the largest holders still go.
            killed = self._sigkill(p for p in f.victims if p in inside)
        else:
            for cg in frozen:
                assert self.freezer is not None
                with contextlib.suppress(OSError):
                    self.freezer.kill(cg, self._kill)
                with contextlib.suppress(OSError):
                    self.freezer.set_frozen(cg, False)  # let the killed go
            killed = sorted(inside)
        killed += self._kill_rest(s, pids - inside, inside)
        why = f"{n} memory findings within {self.memory_escalate_window_s:g} s: " \
              "a bypass that comes back"
        if action != self.memory_escalate_action:
            why += "; no cgroup of its own to freeze"
        self.arbiter.emit("guard.escalate", of=s, slice=s.id, owner=s.owner, gpu=f.gpu,
                          action=action, reason=why, findings=n,
                          window_s=self.memory_escalate_window_s, used=f.used, limit=f.limit,
                          cgroups=frozen, pids=sorted(set(killed)))
        log.warning("guard: slice %s: %s: %s", s.id, why, action)

    def _members(self, cgroup: str) -> set[int]:
        assert self.freezer is not None
        return self.freezer.members(cgroup) or set()

    def _fresh_pids(self, s: Slice) -> set[int]:
        """The slice's host pids now (the tick's may miss what it forked since)."""
        return SlicePids(self.arbiter.regions.pids, self.proc,
                         users=self.arbiter.users_of).host(s)

    def _freeze_own_cgroups(self, s: Slice, pids: set[int]) -> list[str]:
        """Freeze the cgroups of the slice's processes that hold only the slice's (as the
        throttle checks them); each is checked again once frozen, when nothing in it can
        fork, and thawed if a stranger turned up."""
        if self.freezer is None:
            return []
        pids = pids | self._fresh_pids(s)
        cgroups = {cg for cg in (cgroup_of(p, self.proc) for p in pids) if cg is not None}
        out = []
        for cg in sorted(c for c in cgroups if not self._refusal(c, lambda: self._fresh_pids(s))):
            self._lift(cg, "slice escalated")  # a duty cycle would thaw it
            with contextlib.suppress(OSError):
                self.freezer.set_frozen(cg, True)
                # Frozen, nothing in it forks; a process killed before may still exit.
                if strangers(self._members(cg), lambda: self._fresh_pids(s),
                             functools.partial(self._members, cg)):
                    self.freezer.set_frozen(cg, False)
                    continue
                out.append(cg)
        return out

    def _kill_rest(self, s: Slice, pids: set[int], spare: set[int]) -> list[int]:
        """SIGKILL pids and whatever of the slice they fork meanwhile: SIGSTOP first, then
        look again (a stopped process forks no more), a few rounds, then SIGKILL them all."""
        stopped: set[int] = set()
        todo = set(pids)
        for _ in range(4):
            if not todo:
                break
            for pid in todo:
                with contextlib.suppress(OSError):
                    self._kill(pid, signal.SIGSTOP)
            stopped |= todo
            todo = self._fresh_pids(s) - stopped - spare
        return self._sigkill(sorted(stopped | todo))

    # -- throttles ---------------------------------------------------------------

    def _hold(self, s: Slice, gpu: int, offenders: Iterable[int], pids: set[int], *,
              allowed: int | None, run: float, say_refusal: bool = True) -> None:
        """Throttle the cgroups of offenders: for compute (allowed) or memory (None)."""
        memory = allowed is None
        cgroups = {cg for cg in (cgroup_of(p, self.proc) for p in offenders) if cg is not None}
        # A cgroup frozen for good (escalation) stays so: a duty cycle would thaw it.
        cgroups -= {cg for held in self._escalated.values() for cg in held}
        for cg in sorted(cgroups):
            t = self._throttles.get(cg)
            if t is not None:  # already held: add this reason to it
                if memory and not t.memory:
                    t.memory = True
                    t.cycle.run_fraction = compute_guard.MIN_RUN_FRACTION
                elif not memory and t.allowed is None:
                    t.allowed = allowed
                continue
            why = self._refusal(cg, pids)
            if why:
                if say_refusal:
                    self.arbiter.emit("guard.throttle_refused", of=s, slice=s.id, owner=s.owner,
                                      gpu=gpu, cgroup=cg, reason=why,
                                      resource="memory" if memory else "compute")
                continue
            assert self.freezer is not None
            cycle = DutyCycle(self.freezer, cg, run)
            self._throttles[cg] = _Throttle(s.id, gpu, allowed, cycle, time.monotonic(),
                                            memory=memory)
            self._write_ledger()
            cycle.start()
            self.arbiter.emit("guard.throttle", of=s, slice=s.id, owner=s.owner, gpu=gpu,
                              cgroup=cg, run_fraction=round(run, 3), allowed=allowed,
                              resource="memory" if memory else "compute")

    def _refusal(self, cgroup: str, pids: set[int] | Callable[[], set[int]]) -> str:
        """Why the cgroup must not be frozen for this slice ("" when it may be). pids may be
        a callable, asked after the members are read: a process forked in between is then
        already the slice's, not a stranger."""
        if self.freezer is None:
            return "no cgroup v2 freezer on this host"
        if not self.freezer.can_freeze(cgroup):
            return "the cgroup cannot be frozen (the root, or no cgroup.freeze)"
        freezer = self.freezer
        members = freezer.members(cgroup)
        if members is None:
            return "the cgroup is gone"
        if os.getpid() in members:
            return "vgpud runs in that cgroup"
        others = strangers(members, pids if callable(pids) else lambda: pids,
                           lambda: freezer.members(cgroup))
        if others is None:
            return "the cgroup is gone"
        if others:
            return f"{len(others)} process(es) in the cgroup are not the slice's"
        return ""

    def _steer(self, slices: Mapping[str, Slice], used: Mapping[tuple[str, int], int]) -> None:
        """Correct each throttle once per window; lift those with nothing left to hold."""
        now = time.monotonic()
        for cg, t in list(self._throttles.items()):
            assert self.freezer is not None
            if t.slice_id not in slices:
                self._lift(cg, "slice released")
                continue
            members = self.freezer.members(cg)
            if not members:
                self._lift(cg, "processes gone")
                continue
            if t.cycle.leased:
                self._kill_leased(cg, t, members)
                continue
            if t.memory:
                if (t.slice_id, t.gpu) in self._mem_seen:
                    continue  # still over its memory: held at the least run fraction
                t.memory = False
                if t.allowed is None:
                    self._lift(cg, "within its memory limit")
                    continue
                t.adjusted = now  # back to steering its compute share from here
                continue
            if t.allowed is None or now - t.adjusted < self.window_s:
                continue  # the window still holds time from before the last change
            run = compute_guard.next_run_fraction(t.cycle.run_fraction, t.allowed,
                                          used.get((t.slice_id, t.gpu), 0))
            t.adjusted = now
            if run >= 1.0:
                self._lift(cg, "under its share")
            else:
                t.cycle.run_fraction = run

    def _kill_leased(self, cgroup: str, t: _Throttle, members: set[int]) -> None:
        """A tenant that leases its cgroup.freeze to escape its throttle loses the
        cgroup's processes instead (every one of them is the slice's: _refusal)."""
        reason = "its tenant leased cgroup.freeze; the throttle cannot hold"
        self._lift(cgroup, reason)
        killed = self._sigkill(sorted(members))
        self.arbiter.emit("guard.kill", slice=t.slice_id, gpu=t.gpu, pids=killed,
                          reason=reason, resource="memory" if t.memory else "compute")

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
            text = "".join(f"{cg}\n" for cg in sorted(self._throttles))
            write_whole(self.ledger, text.encode(), 0o644)  # the run dir: no fsync
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
                log.exception("guard tick failed")

    def stop(self) -> None:
        """Stop ticking and thaw every throttled cgroup."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for cg in list(self._throttles):
                self._lift(cg, "vgpud stopping")


#: The name vgpud knows it by (it guarded compute only at first).
ComputeGuard = Guardian
