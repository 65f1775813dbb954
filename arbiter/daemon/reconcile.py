# SPDX-License-Identifier: Apache-2.0
"""Reconciliation: release slices whose owner is gone, report (and optionally kill) drift.

One pass (`Reconciler.run_once`) runs at start and every reconcile_interval_s in
a thread. An owner is gone by arbiter.slices.identity's rule:
- kind "process": its pid is not alive (pid and /proc start time, like the
  region slots' liveness check);
- kind "container", started (prestart recorded its init): the init is not alive
  (pid and start time) AND no process is left in its recorded cgroup, whatever
  runtime or state root runs it;
- kind "claim" (a DRA ResourceClaim): never; only an explicit Release frees it. Its
  users (the containers recorded by add_user) whose init and cgroup are gone are
  forgotten (event `user.drop`), the slice stays;
- kind "container", allocated at create and not started yet: no OCI runtime keeps
  state for the container id under any of the runtime state roots (runc:
  /run/runc/<id>; containerd's runc shim: /run/containerd/runc/<namespace>/<id>;
  docker: /run/docker/runtime-runc/moby/<id>) AND either such state was seen and is
  gone, or the grace period since its allocation has passed (another runtime or root).

Drift is a slice whose NVML-measured memory on a GPU (its owner pid, the
owner's descendants, and for containers every host process in the owner's pid
namespace: never pids written in its region) exceeds its limit there: libvgpu
is cooperative and a process can bypass it. Drift is reported as an event
(`reconcile.drift`); with drift_action "kill" the fewest of those processes,
largest first, that bring it back within its limit get SIGKILL
(`reconcile.kill`). The guard (arbiter.compute.guardian) makes the same decisions
(arbiter.compute.memory_guard) every 0.5 s; this pass is its slower backstop.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbiter.compute import memory_guard
from arbiter.model import OwnerKind, Slice
from arbiter.slices.arbiter import Arbiter
from arbiter.slices.attribution import SlicePids
from arbiter.slices.identity import PENDING_GRACE_S, Liveness, runtime_state_exists

__all__ = ["DRIFT_ACTIONS", "PassReport", "Reconciler", "runtime_state_exists"]

log = logging.getLogger("vgpud")

DRIFT_ACTIONS = ("flag", "kill")


@dataclass
class PassReport:
    """What one reconciliation pass did."""

    released: list[str] = field(default_factory=list)
    drift: list[tuple[str, int, int, int]] = field(default_factory=list)  # slice, gpu, used, limit
    killed: list[int] = field(default_factory=list)
    users_dropped: list[tuple[str, int]] = field(default_factory=list)  # slice, user pid


class Reconciler:
    """Periodic reconciliation of one Arbiter's slices against the host."""

    def __init__(
        self,
        arbiter: Arbiter,
        *,
        runtime_state_roots: Sequence[Path] = (),
        drift_action: str = "flag",
        interval_s: float = 10.0,
        proc: Path = Path("/proc"),
        sample: Callable[[], Mapping[int, Any]] | None = None,
        kill: Callable[[int, int], None] = os.kill,
        metrics: Any = None,
        pending_grace_s: float = PENDING_GRACE_S,
    ) -> None:
        self.arbiter = arbiter
        self.runtime_state_roots = tuple(Path(r) for r in runtime_state_roots)
        # The arbiter judges holders (Allocate, Release) by the same rule as the passes.
        self.liveness = Liveness(proc, runtime_state_roots=self.runtime_state_roots,
                                 pending_grace_s=pending_grace_s)
        arbiter.use_liveness(self.liveness)
        self.drift_action = drift_action
        self.interval_s = interval_s
        self.proc = Path(proc)
        self._sample = sample if sample is not None else arbiter.sample
        self._kill = kill
        self.metrics = metrics
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pass_lock = threading.Lock()

    # -- settings --------------------------------------------------------------

    def configure(self, *, drift_action: str, interval_s: float) -> None:
        """Apply reloaded settings; the next pass uses them."""
        self.drift_action = drift_action
        self.interval_s = interval_s
        self._wake.set()

    # -- the pass --------------------------------------------------------------

    def owner_alive(self, s: Slice) -> bool:
        """True while the slice's owner (process or container) exists."""
        return self.liveness.alive(s)

    def run_once(self) -> PassReport:
        """One pass: release slices of gone owners, then check drift."""
        with self._pass_lock:
            report = PassReport()
            for s in self.arbiter.slices():
                if s.owner_kind == OwnerKind.CLAIM:
                    self._drop_gone_users(s, report)
                    continue
                if self.owner_alive(s):
                    continue
                why = "process gone" if s.owner_kind == OwnerKind.PROCESS else "container gone"
                if self.arbiter.release(s.id, reason="owner_gone",
                                        event="reconcile.release") is not None:
                    report.released.append(s.id)
                    log.info("released slice %s of %s %s: %s", s.id, s.owner_kind, s.owner, why)
            # A deleted scheduling file is made again (a kept one keeps its inode).
            self.arbiter.repair_sched()
            # Files a tenant's lease kept from vgpud: written and held now if it has ended.
            self.arbiter.retry_pending()
            self._check_drift(report)
            return report

    def _drop_gone_users(self, s: Slice, report: PassReport) -> None:
        """Forget the users of a claim's slice whose container is gone (the slice stays)."""
        for u in self.arbiter.users_of(s.id):
            if not self.liveness.user_alive(u) and self.arbiter.drop_user(u):
                report.users_dropped.append((s.id, u.pid))
                log.info("slice %s of claim %s: user pid %d gone", s.id, s.owner, u.pid)

    def _check_drift(self, report: PassReport) -> None:
        """Memory above the limit per NVML, on the pids the host attributes to each slice.

        The decisions are arbiter.compute.memory_guard's (the guard's, at its faster pace); the
        processes are SlicePids.host, never region slots: a tenant that writes a
        neighbour's pid into its slot must not get that neighbour killed.
        """
        slices = self.arbiter.slices()
        if not slices:
            return
        samples = self._sample()
        if not samples:
            return
        owners = SlicePids(self.arbiter.regions.pids, self.proc, users=self.arbiter.users_of)
        host = {s.id: owners.host(s) for s in slices}
        by_id = {s.id: s for s in slices}
        uses = memory_guard.slice_uses(slices, memory_guard.process_memory(samples), host)
        for f in memory_guard.findings(uses):
            s = by_id[f.slice_id]
            report.drift.append((s.id, f.gpu, f.used, f.limit))
            self.arbiter.emit("reconcile.drift", of=s, slice=s.id, owner=s.owner, gpu=f.gpu,
                              used=f.used, limit=f.limit, pids=list(f.pids))
            if self.metrics is not None and hasattr(self.metrics, "drift"):
                self.metrics.drift()
            if self.drift_action == "kill":
                for pid in f.victims:
                    with contextlib.suppress(OSError):
                        self._kill(pid, signal.SIGKILL)
                        report.killed.append(pid)
                self.arbiter.emit("reconcile.kill", of=s, slice=s.id, owner=s.owner,
                                  gpu=f.gpu, pids=sorted(f.victims))

    # -- the thread ------------------------------------------------------------

    def start(self) -> None:
        """Run passes every interval_s in a daemon thread until stop()."""
        self._thread = threading.Thread(target=self._loop, name="vgpud-reconcile", daemon=True)
        self._thread.start()

    def trigger(self) -> None:
        """Run a pass now (the thread wakes up)."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.run_once()
            except Exception:
                log.exception("reconciliation pass failed")

    def stop(self) -> None:
        """Stop the thread (waits for a running pass)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
