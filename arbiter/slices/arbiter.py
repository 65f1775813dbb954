# SPDX-License-Identifier: Apache-2.0
"""The Arbiter: allocate, release, get, list, devices, update and health of slices.

One lock serialises every change. The store (SQLite) is the truth and the
in-memory table mirrors it (the Arbiter is the store's only writer). Order
of an allocation: validate, reuse the owner's slice if it has one, place,
make the region directory (atomically), commit to the store (evictions and
the new slice in one transaction), then remove the evicted slices' regions.
Allocations without evictions and releases leave the lock before their
commit and share it with whatever else is queued (Store group commit: one
fsync per batch); each caller is answered only once its write is durable.
A crash anywhere leaves either no committed slice (its directory, if any,
is removed at the next start) or a committed slice whose directory exists
or is remade at the next start (`start`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from arbiter.convert import DeviceView, policy_from_name, priority_from_name
from arbiter.errors import NoCapacityError, NotFoundError, RequestError, StateError, VgpuError
from arbiter.files.slice_dirs import Regions, Retired
from arbiter.model import Gpu, OwnerKind, Request, Slice, User
from arbiter.proc import proc_start_time
from arbiter.quantity import COMPUTE_MAX, COMPUTE_MIN
from arbiter.slices import placement
from arbiter.slices.attribution import SlicePids
from arbiter.slices.identity import Holder, Liveness
from arbiter.slices.pending import Pending

__all__ = ["Allocation", "Arbiter", "Health", "HeldError", "Settings"]

T = TypeVar("T")
log = logging.getLogger("vgpud")

_U64_MAX = (1 << 64) - 1
_OWNER_MAX = 256
_OWNER_RE = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces
_ID_BYTES = 6  # 12 hex digits
#: How long repair_sched lets the lock go between two slices: time for a thread already
#: waiting for it to be woken and take it (microseconds on an idle CPU; on a busy one it
#: may take the next window). The pass's wall time grows by this a slice, its CPU not.
REPAIR_PAUSE_S = 0.001


class _EventSink(Protocol):
    def emit(self, kind: str, /, **fields: Any) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Settings:
    """The config keys the Arbiter uses; all reloadable with SIGHUP."""

    placement_policy: str = "binpack"
    allow_preemption: bool = False
    default_compute: int = 10
    default_priority: str = "normal"
    default_policy: str = "fixed"
    #: % of the GPU a lower-priority slice keeps while a higher one runs; every slice's regions.
    priority_floor: int = 0

    @classmethod
    def from_config(cls, config: Any) -> Settings:
        """The Arbiter's settings out of an arbiter.config.Config."""
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


class HeldError(StateError):
    """A slice is held by another container than the one asking (same id, other engine)."""

    def __init__(self, verb: str, s: Slice, reason: str) -> None:
        super().__init__(verb, f"slice {s.id} of owner {s.owner!r}", reason,
                         code=StateError.CONFLICT)
        self.slice = s
        # The line the engine shows, after the hook's "failed to allocate a vGPU: ".
        what = "claim" if s.owner_kind == OwnerKind.CLAIM else "container id"
        self.args = (f"{what} {s.owner!r} is in use: slice {s.id}: {reason}",)


@dataclass(frozen=True)
class Allocation:
    """Result of Allocate: the slice, whether the owner had it already, who was evicted."""

    slice: Slice
    existing: bool = False
    evicted: tuple[str, ...] = ()


@dataclass(frozen=True)
class Health:
    """What Health reports."""

    status: str
    devices: int
    slices: int
    uptime_seconds: float


class Arbiter:
    """Owns the slices of one host's GPUs."""

    def __init__(
        self,
        *,
        gpus: list[Gpu],
        store: Any,
        regions: Regions,
        events: _EventSink,
        settings: Settings | None = None,
        metrics: Any = None,
        sample: Callable[[list[Gpu]], Mapping[int, Any]] | None = None,
        check: Callable[[list[Gpu]], Mapping[int, str]] | None = None,
        versions: Callable[[], Any] | None = None,
        proc: Path = Path("/proc"),
        kill: Callable[[int, int], None] = os.kill,
    ) -> None:
        self.gpus = list(gpus)
        self.store = store
        self.regions = regions
        self.events = events
        self.settings = settings or Settings()
        self.metrics = metrics
        self._sample = sample
        self._check = check
        self._versions = versions
        self._versions_seen: Any = None  # the driver's versions, once NVML told them
        #: Per GPU index, why its token broker does not serve it (arbiter.compute.broker_watch;
        #: vgpud sets it once its watch runs): Device.broker.
        self.brokers: Callable[[], Mapping[int, str]] = dict
        self._proc = Path(proc)
        self._kill = kill
        self._lock = threading.RLock()
        self._slices: dict[str, Slice] = {}
        #: The containers that use each claim's slice (attribution), by slice id.
        self._users: dict[str, tuple[User, ...]] = {}
        #: Whether a slice's holder lives; the reconciler installs its own (use_liveness),
        #: which also knows where runtimes keep state.
        self.liveness = Liveness(self._proc)
        # Slices whose insert is queued for the store's next group commit.
        self._pending: dict[str, Pending[None]] = {}
        self._started = time.monotonic()

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Load the store and make the region directories agree with it (crash repair)."""
        with self._lock:
            self._slices = {s.id: s for s in self.store.slices()}
            self._users = {}
            for u in self.store.users():
                self._users[u.slice_id] = (*self._users.get(u.slice_id, ()), u)
            # reconcile_dirs then rewrites regions whose floor the config changed meanwhile.
            self.regions.priority_floor = self.settings.priority_floor
            report = self.regions.reconcile_dirs(self._slices.values())
            for s in list(self._slices.values()):
                if s.owner_pid and not s.owner_start:  # recorded before start times were
                    self._slices[s.id] = dataclasses.replace(
                        s, owner_start=proc_start_time(s.owner_pid, self._proc))
            if report.created or report.fixed or report.removed:
                log.warning("repaired region directories: made %s, fixed %s, removed %s",
                            list(report.created), list(report.fixed), list(report.removed))
            self.emit("start", slices=len(self._slices), devices=len(self.gpus),
                       regions_made=list(report.created), regions_fixed=list(report.fixed),
                       regions_removed=list(report.removed))

    def repair_sched(self) -> None:
        """Remake deleted or damaged scheduling files and drop strays.

        Each slice's files are checked under the lock (Allocate makes them and Update
        rewrites them under it) on their own, and the lock is let go for REPAIR_PAUSE_S
        after each: an Allocate or Release that comes during the pass waits for one
        slice's check (~0.1 ms), not for all of them (6.4 ms with 50 slices, every
        reconcile pass: docs/performance.md). Let go and taken again at once, the lock
        would go back to this thread before a waiter woke. The strays are found under
        the lock at the end, against the slices of that moment: a slice allocated
        meanwhile has its files made under it too, so a snapshot taken before would call
        that slice's new files strays and delete them."""
        with self._lock:
            self.regions.repair_gpus_sched()
            ids = list(self._slices)
        for n, slice_id in enumerate(ids):
            if n:
                time.sleep(REPAIR_PAUSE_S)
            with self._lock:
                s = self._slices.get(slice_id)
                if s is not None:  # released meanwhile: its files go with it
                    self.regions.repair_slice_sched(s)
        with self._lock:
            self.regions.drop_stray_sched(list(self._slices.values()))

    def retry_pending(self) -> None:
        """Write and hold the slice files a tenant's lease kept from vgpud, if it has ended
        (under the lock: an Update meanwhile must not be overwritten with older limits)."""
        with self._lock:
            self.regions.retry_pending(list(self._slices.values()))

    def use_liveness(self, liveness: Liveness) -> None:
        """Judge holders by `liveness` (the reconciler's: it knows the runtime state roots)."""
        self.liveness = liveness

    def reload(self, settings: Settings) -> None:
        """Apply new reloadable settings; a new priority floor reaches running slices in place."""
        with self._lock:
            self.settings = settings
            if settings.priority_floor != self.regions.priority_floor:
                self.regions.set_priority_floor(settings.priority_floor, self._slices.values())

    # -- queries ---------------------------------------------------------------

    def slices(self) -> list[Slice]:
        """Every slice, oldest first."""
        with self._lock:
            return sorted(self._slices.values(), key=lambda s: (s.created_ms, s.id))

    def get(self, slice_id: str = "", owner: str = "") -> Slice:
        """The slice with that id (or owner); NotFoundError otherwise."""
        with self._lock:
            s = self._find(slice_id, owner, "get slice")
            if s is None:
                raise NotFoundError("get slice", _what(slice_id, owner))
            return s

    def users_of(self, slice_id: str) -> tuple[User, ...]:
        """The containers recorded as users of a claim's slice."""
        with self._lock:
            return self._users.get(slice_id, ())

    def add_user(self, slice_id: str, pid: int, bundle: str = "") -> Slice:
        """Record a container that uses a claim's slice (its init `pid`, whose start time
        and cgroup vgpud reads from /proc, and its bundle), so the guards attribute its
        processes to the slice; idempotent. Returns the slice once the record is durable.

        NotFoundError when there is no such slice; RequestError when it is not a claim's
        (a container's slice is bound by Attach)."""
        verb = "add a user to slice"
        if pid <= 0:
            raise RequestError(verb, "pid", pid, "must be the container's init pid")
        who = self._observe(pid, OwnerKind.CONTAINER, bundle)
        with self._lock:
            s = self._find(slice_id, "", verb)
            if s is None:
                raise NotFoundError(verb, _what(slice_id, ""))
            if s.owner_kind != OwnerKind.CLAIM:
                raise RequestError(verb, "id", slice_id,
                                   f"is the slice of {s.owner_kind} {s.owner!r}, not a "
                                   "claim's: only a claim's slice has users")
            user = User(s.id, who.pid, who.start, who.cgroup, who.bundle)
            known = self._users.get(s.id, ())
            if user in known:
                return s
            first_answer = self._pending.get(s.id)
            pending = self.store.add_user_async(user)
            self._users[s.id] = (*(u for u in known if (u.pid, u.start) != (
                user.pid, user.start)), user)
        if first_answer is not None:
            first_answer.result()
        try:
            if not pending.result():
                raise NotFoundError(verb, _what(slice_id, ""))
        except BaseException:
            with self._lock:
                self._users[s.id] = tuple(u for u in self._users.get(s.id, ()) if u != user)
            raise
        self.emit("user.add", of=s, slice=s.id, owner=s.owner, pid=user.pid, cgroup=user.cgroup,
                  bundle=user.bundle)
        return s

    def drop_user(self, user: User, *, reason: str = "gone") -> bool:
        """Forget a claim slice's user (the reconciler: its container is gone); the slice
        stays. False when it was not recorded."""
        with self._lock:
            known = self._users.get(user.slice_id, ())
            if user not in known:
                return False
            rest = tuple(u for u in known if u != user)
            if rest:
                self._users[user.slice_id] = rest
            else:
                self._users.pop(user.slice_id, None)
            pending = self.store.delete_user_async(user)
        pending.result()
        self.emit("user.drop", slice=user.slice_id, pid=user.pid, cgroup=user.cgroup,
                  bundle=user.bundle, reason=reason)
        return True

    def note_libvgpu(self, slice_id: str, libvgpu_version: str) -> None:
        """Record which installed libvgpu (arbiter.install.versions) the slice's container mapped:
        `vgpu ls` shows it, and that install is kept while the slice lives."""
        with self._lock:
            s = self._slices.get(slice_id)
            if s is None or s.libvgpu_version == libvgpu_version:
                return
            self._slices[slice_id] = dataclasses.replace(s, libvgpu_version=libvgpu_version)
            pending = self.store.set_libvgpu_async(slice_id, libvgpu_version)
        pending.result()

    def owner_start_time(self, slice_id: str) -> int:
        """/proc start time of the owner pid when it was recorded, 0 if unknown."""
        with self._lock:
            s = self._slices.get(slice_id)
            return s.owner_start if s is not None else 0

    def usage(self, s: Slice) -> list[int]:
        """Memory libvgpu charges to each vGPU of the slice."""
        return self.regions.usage(s)

    def region_dir(self, s: Slice) -> str:
        """Host directory of the slice's region files."""
        return self.regions.slice_path(s.id)

    def device_nodes(self) -> dict[int, tuple[str, ...]]:
        """Device node paths of each GPU, by index."""
        return {g.index: g.device_nodes for g in self.gpus}

    def sample(self) -> Mapping[int, Any]:
        """NVML's measurements per GPU index; empty when NVML cannot be read."""
        return self._ask_nvml(self._sample, "sample")

    def unhealthy(self) -> Mapping[int, str]:
        """GPU index -> why NVML cannot use it now, for the GPUs it cannot (empty: all fine)."""
        return self._ask_nvml(self._check, "check")

    def _ask_nvml(self, query: Callable[[list[Gpu]], Mapping[int, T]] | None,
                  verb: str) -> Mapping[int, T]:
        """query(gpus), or {} when there is none or it fails: NVML failing must not fail
        a query of vgpud's."""
        if query is None:
            return {}
        try:
            return query(self.gpus)
        except Exception as e:
            log.warning("failed to %s GPUs: %s", verb, e)
            return {}

    def driver_versions(self) -> tuple[str, str]:
        """(driver version, CUDA version) as NVML tells them; ("", "") when it cannot.
        Read once: a driver cannot change under a running vgpud."""
        if self._versions_seen is None and self._versions is not None:
            try:
                self._versions_seen = self._versions()
            except Exception as e:
                log.warning("failed to read the driver version: %s", e)
        v = self._versions_seen
        return (str(getattr(v, "driver", "") or ""), str(getattr(v, "cuda", "") or ""))

    def devices(self) -> list[DeviceView]:
        """Each GPU with its allocated and measured memory and compute, and its health."""
        samples = self.sample()
        unhealthy = self.unhealthy()
        driver, cuda = self.driver_versions()
        brokers = self.brokers()
        with self._lock:
            slices = list(self._slices.values())
        out = []
        for g in self.gpus:
            grants = [gr for s in slices for gr in s.grants if gr.gpu_index == g.index]
            smp = samples.get(g.index)
            out.append(DeviceView(
                gpu=g,
                memory_allocated=sum(gr.memory for gr in grants),
                compute_allocated=sum(gr.compute for gr in grants),
                slices=len(grants),
                memory_used=int(getattr(smp, "used", 0) or 0),
                utilization=int(getattr(smp, "utilization", 0) or 0),
                unhealthy=unhealthy.get(g.index, ""),
                driver_version=driver, cuda_version=cuda, broker=brokers.get(g.index, ""),
            ))
        return out

    def health(self) -> Health:
        """Liveness: counts and uptime."""
        with self._lock:
            return Health("ok", len(self.gpus), len(self._slices),
                          time.monotonic() - self._started)

    # -- changes ---------------------------------------------------------------

    def validate(self, req: Request) -> None:
        """Raise RequestError naming the first field of req the arbiter cannot accept."""
        verb = "allocate slice"
        if not req.owner:
            raise RequestError(verb, "owner", req.owner, "is empty: name the container id")
        if len(req.owner) > _OWNER_MAX or not _OWNER_RE.fullmatch(req.owner):
            raise RequestError(verb, "owner", req.owner,
                               f"must be 1..{_OWNER_MAX} printable characters without spaces")
        if req.owner_kind not in OwnerKind.ALL:
            raise RequestError(verb, "owner_kind", req.owner_kind,
                               f"is not one of {', '.join(OwnerKind.ALL)}")
        if req.vgpus:
            self._validate_vgpus(req)
        else:
            if not 0 < req.memory <= _U64_MAX:
                raise RequestError(verb, "memory", req.memory,
                                   "must be a positive number of bytes")
            if not COMPUTE_MIN <= req.compute <= COMPUTE_MAX:
                raise RequestError(verb, "compute", req.compute,
                                   f"must be a percent from {COMPUTE_MIN} to {COMPUTE_MAX}")
            if req.count < 1:
                raise RequestError(verb, "count", req.count, "must be at least 1")
        if req.owner_pid < 0:
            raise RequestError(verb, "owner_pid", req.owner_pid, "must not be negative")
        for d in req.devices:
            if not d.strip():
                raise RequestError(verb, "devices", list(req.devices),
                                   "holds an empty entry")

    def _validate_vgpus(self, req: Request) -> None:
        """Each per-vGPU ask (memory, compute; a pin is placement's to resolve), and no
        more vGPUs than GPUs (each needs its own)."""
        verb = "allocate slice"
        if req.memory or req.devices or req.count != len(req.vgpus):
            raise RequestError(verb, "vgpus", len(req.vgpus),
                               "replaces memory, count and devices, which must be unset")
        for n, a in enumerate(req.vgpus):
            if not 0 < a.memory <= _U64_MAX:
                raise RequestError(verb, f"vgpus[{n}].memory_bytes", a.memory,
                                   "must be a positive number of bytes")
            if not COMPUTE_MIN <= a.compute <= COMPUTE_MAX:
                raise RequestError(verb, f"vgpus[{n}].compute_percent", a.compute,
                                   f"must be a percent from {COMPUTE_MIN} to {COMPUTE_MAX}")
        if len(req.vgpus) > len(self.gpus):
            raise RequestError(verb, "vgpus", len(req.vgpus),
                               f"vGPUs need as many distinct GPUs but this host has "
                               f"{len(self.gpus)}")

    def defaults(self) -> tuple[int, Any, Any]:
        """(compute, priority, policy) that fill a request's unset fields."""
        st = self.settings
        return (st.default_compute, priority_from_name(st.default_priority),
                policy_from_name(st.default_policy))

    def allocate(self, req: Request) -> Allocation:
        """Give req.owner a slice (its existing one, if any); returns once it is durable.

        The owner's existing slice is given back only to the container that holds it
        (or, before its prestart, to the same bundle); one whose holder is gone is
        released first; one that another live container holds is refused (HeldError)."""
        t0 = time.perf_counter()
        outcome = "error"
        try:
            # A claim's slice has no holder: its plugin (any pid) asks for it.
            who = (Holder() if req.owner_kind == OwnerKind.CLAIM
                   else self._observe(req.owner_pid, req.owner_kind, req.bundle))
            while True:
                stale: Slice | None = None
                bind: Pending[bool] | None = None
                with self._lock:
                    self.validate(req)
                    existing = self._by_owner(req.owner)
                    if existing is not None:
                        claim = self._claim(existing, who, "allocate")
                        if claim == "stale":
                            stale = existing
                        else:
                            if not self.regions.exists(existing.id):
                                self.regions.create(existing)
                            first_answer = self._pending.get(existing.id)
                            if claim == "bind":
                                bound, bind = self._bind(existing, who)
                    else:
                        plan = placement.place(req, self.gpus, list(self._slices.values()),
                                               policy=self.settings.placement_policy,
                                               allow_preemption=self.settings.allow_preemption)
                        if plan.evict:
                            result = self._allocate_evicting(req, plan, who)
                            outcome = "evicted"
                            return result
                        new, pending = self._allocate_queued(req, plan, who)
                if stale is None:
                    break
                # Its holder is gone (a missed poststop): free it, then allocate afresh.
                self.release(stale.id, reason="owner_gone", event="release")
            if existing is not None:
                # A retry must not be acknowledged before the first answer could be.
                if first_answer is not None:
                    first_answer.result()
                if bind is not None:
                    existing = self._await_bind(existing, bound, bind)
                outcome = "existing"
                return Allocation(existing, existing=True)
            self._await_durable(new, pending, undo=self._undo_allocation)
            self._emit_allocate(new, ())
            outcome = "ok"
            return Allocation(new, existing=False)
        except NoCapacityError:
            outcome = "no_capacity"
            raise
        except (RequestError, ValueError):
            outcome = "invalid"
            raise
        finally:
            if self.metrics is not None:
                self.metrics.allocation(time.perf_counter() - t0, outcome)

    def attach(self, slice_id: str, owner: str, pid: int, bundle: str = "") -> Slice:
        """Bind the owner's slice (made at `create`) to its container's init (prestart).

        NotFoundError when the owner holds no slice with that id; HeldError when another
        live container holds it. Returns once the binding is durable."""
        verb = "attach slice"
        if pid <= 0:
            raise RequestError(verb, "owner_pid", pid, "must be the container's init pid")
        who = self._observe(pid, OwnerKind.CONTAINER, bundle)
        with self._lock:
            s = self._find(slice_id, owner, verb)
            if s is None or not owner or s.owner != owner:
                raise NotFoundError(verb, _what(slice_id, owner))
            if s.owner_kind == OwnerKind.CLAIM:
                raise RequestError(verb, "id", s.id,
                                   f"is the slice of claim {s.owner!r}: a container uses a "
                                   "claim's slice through its CDI spec, never holds it")
            claim = self._claim(s, who, "attach")
            if claim == "stale":  # another bundle's, whose holder is gone: not this one's
                raise NotFoundError(verb, _what(slice_id, owner))
            first_answer = self._pending.get(s.id)
            bind = None
            if claim == "bind":
                bound, bind = self._bind(s, who)
        if first_answer is not None:
            first_answer.result()
        return self._await_bind(s, bound, bind) if bind is not None else s

    def _observe(self, pid: int, kind: str, bundle: str) -> Holder:
        """The asker as the host sees it (pid's start time and cgroup read from /proc)."""
        return self.liveness.observe(pid, kind=kind,
                                     bundle=os.path.normpath(bundle) if bundle else "")

    def _claim(self, s: Slice, who: Holder, verb: str) -> str:
        """What an Allocate or Attach by `who` does with the owner's slice `s`.

        "same": it is who's already; "bind": made at create, who is its container
        starting; "stale": its holder is gone; HeldError: another live container's.
        Before its start a slice is told from another container's by its bundle; an
        Attach names the slice id from the container's own spec, which says it all."""
        if s.owner_kind == OwnerKind.CLAIM:
            if who.pid or who.bundle:  # a container (by its id) asks for a claim's slice
                raise self._held(verb, s, who)
            return "same"  # the claim's plugin, again (idempotent by claim)
        held = Holder.of(s)
        if s.owner_pid:
            if who.is_process(held):
                return "same"
            if not self.liveness.alive(s):
                return "stale"
            if (who.pid and who.cgroup and who.cgroup == s.owner_cgroup
                    and not self.liveness.init_alive(s)):
                return "stale"  # the same container (its cgroup), started again
            raise self._held(verb, s, who)
        if (verb != "attach" and who.bundle and s.owner_bundle
                and who.bundle != s.owner_bundle):
            if self.liveness.alive(s):
                raise self._held(verb, s, who)
            return "stale"
        return "bind" if who.pid else "same"

    def _held(self, verb: str, s: Slice, who: Holder) -> HeldError:
        if s.owner_kind == OwnerKind.CLAIM:
            e = HeldError(verb, s, "a DRA claim holds it (no container does)")
            self.emit(f"{verb}.refused", of=s, slice=s.id, owner=s.owner, pid=who.pid,
                      bundle=who.bundle)
            return e
        if s.owner_pid:
            holder = f"a running container (init pid {s.owner_pid}"
        else:
            holder = "a container that is being created (not started yet"
        if s.owner_bundle:
            holder += f", bundle {s.owner_bundle}"
        e = HeldError(verb, s, f"{holder}) holds it; a second container with the same id "
                               "cannot share its slice")
        self.emit(f"{verb}.refused", of=s, slice=s.id, owner=s.owner, holder_pid=s.owner_pid,
                   holder_bundle=s.owner_bundle, pid=who.pid, bundle=who.bundle)
        return e

    def _bind(self, s: Slice, who: Holder) -> tuple[Slice, Pending[bool]]:
        """Record who holds s (under the lock); the write joins the next group commit."""
        bound = dataclasses.replace(s, owner_pid=who.pid, owner_start=who.start,
                                    owner_cgroup=who.cgroup,
                                    owner_bundle=who.bundle or s.owner_bundle)
        pending = self.store.bind_async(s.id, bound.owner_pid, bound.owner_start,
                                        bound.owner_cgroup, bound.owner_bundle)
        self._slices[s.id] = bound
        return bound, pending

    def _await_bind(self, old: Slice, bound: Slice, pending: Pending[bool]) -> Slice:
        try:
            if not pending.result():
                raise NotFoundError("attach slice", _what(old.id, ""))
        except BaseException:
            with self._lock:
                if self._slices.get(old.id) is bound:
                    self._slices[old.id] = old
            raise
        self.emit("attach", of=bound, slice=bound.id, owner=bound.owner, pid=bound.owner_pid,
                   cgroup=bound.owner_cgroup, bundle=bound.owner_bundle)
        return bound

    def _new_slice(self, req: Request, plan: placement.Placement, who: Holder) -> Slice:
        return Slice(
            id=self._new_id(), owner=req.owner, grants=tuple(plan.grants),
            priority=req.priority, policy=req.policy, owner_kind=req.owner_kind,
            owner_pid=who.pid if req.owner_kind == OwnerKind.CLAIM else req.owner_pid,
            created_ms=int(time.time() * 1000), labels=req.labels,
            owner_start=who.start, owner_cgroup=who.cgroup, owner_bundle=who.bundle,
        )

    def _allocate_queued(self, req: Request, plan: placement.Placement,
                         who: Holder) -> tuple[Slice, Pending[None]]:
        """The common case (no eviction): hold the room now, commit with the next batch.

        The insert is queued first, so that the writer commits it while the files are made
        (the answer waits for both)."""
        new = self._new_slice(req, plan, who)
        pending = self.store.commit_allocation_async(new)
        try:
            self.regions.create(new)
        except BaseException:
            # Queued after the insert, so committed after it: the store never keeps it.
            with contextlib.suppress(Exception):
                self.store.delete_async(new.id)
            raise
        self._slices[new.id] = new
        self._pending[new.id] = pending
        return new, pending

    def _await_durable(self, s: Slice, pending: Pending[Any],
                       undo: Callable[[Slice], None]) -> Any:
        try:
            return pending.result()
        except BaseException:
            with self._lock:
                undo(s)
            raise
        finally:
            with self._lock:
                if self._pending.get(s.id) is pending:
                    del self._pending[s.id]

    def _undo_allocation(self, s: Slice) -> None:
        if self._slices.get(s.id) is s:
            self._forget(s)

    def _undo_release(self, s: Slice) -> None:
        if s.id not in self._slices:
            self._slices[s.id] = s
            with contextlib.suppress(VgpuError):
                self.regions.create(s)

    def _allocate_evicting(self, req: Request, plan: placement.Placement,
                           who: Holder) -> Allocation:
        """Preemption (rare): synchronously, after every queued write, under the lock."""
        self.store.flush()
        evicted = [self._slices[e] for e in plan.evict if e in self._slices]
        new = self._new_slice(req, plan, who)
        self.regions.create(new)
        try:
            self.store.commit_allocation(new, [s.id for s in evicted])
        except BaseException:
            with contextlib.suppress(Exception):
                self.regions.remove(new.id)
            raise
        for s in evicted:
            pids = self._kill_slice(s)
            self._forget(s)
            self.emit("evict", of=s, slice=s.id, owner=s.owner, by=new.id, by_owner=new.owner,
                       killed=sorted(pids))
            if self.metrics is not None:
                self.metrics.eviction()
                self.metrics.release("evict")
        self._slices[new.id] = new
        evicted_ids = tuple(s.id for s in evicted)
        self._emit_allocate(new, evicted_ids)
        return Allocation(new, existing=False, evicted=evicted_ids)

    def _emit_allocate(self, new: Slice, evicted: tuple[str, ...]) -> None:
        self.emit("allocate", of=new, slice=new.id, owner=new.owner, owner_kind=new.owner_kind,
                   owner_pid=new.owner_pid, priority=new.priority.name.lower(),
                   policy=new.policy.name.lower(),
                   grants=[{"gpu": g.gpu_index, "memory": g.memory, "compute": g.compute}
                           for g in new.grants],
                   evicted=list(evicted))

    def release(self, slice_id: str = "", owner: str = "", *,
                reason: str = "release", event: str = "release",
                pid: int = 0, bundle: str = "", asker: bool = False) -> Slice | None:
        """Release a slice by id or owner; None when there was none (release is idempotent).

        With `asker` (a container's poststop or rollback, naming its init `pid` and its
        `bundle`, either may be unknown) the slice is released only when that container
        holds it or its holder is gone: a container that still has a live process keeps
        its slice, whoever else asks (HeldError). Returns once the release is durable."""
        who = self._observe(pid, OwnerKind.CONTAINER, bundle) if asker else None
        with self._lock:
            s = self._find(slice_id, owner, "release slice")
            if s is None:
                return None
            if who is not None:
                why = self._kept_from(s, who)
                if why:
                    self.emit("release.refused", of=s, slice=s.id, owner=s.owner, pid=pid,
                               bundle=bundle, reason=why)
                    raise HeldError("release", s, why)
            pending = self.store.delete_async(s.id)
            retired = self._forget(s, later=True)
        if retired is not None:
            # Unmounting its files waits on the kernel's mount locks and an RCU grace
            # period: done here, outside the lock, while its delete is being committed.
            self._finish(retired)
        self._await_durable(s, pending, undo=self._undo_release)
        self.emit(event, of=s, slice=s.id, owner=s.owner, reason=reason)
        if self.metrics is not None:
            self.metrics.release(reason)
        return s

    def update(self, slice_id: str, memory: int = 0, compute: int = 0) -> Slice:
        """Change a slice's memory limit and/or compute share in place; 0 = unchanged."""
        verb = "update slice"
        if memory < 0 or memory > _U64_MAX:
            raise RequestError(verb, "memory", memory, "must be a positive number of bytes")
        if compute and not COMPUTE_MIN <= compute <= COMPUTE_MAX:
            raise RequestError(verb, "compute", compute,
                               f"must be a percent from {COMPUTE_MIN} to {COMPUTE_MAX}")
        with self._lock:
            s = self._find(slice_id, "", verb)
            if s is None:
                raise NotFoundError(verb, _what(slice_id, ""))
            if not memory and not compute:
                return s
            # 0 keeps each vGPU's own amount (a claim's vGPUs may differ).
            grants = placement.validate_grants(
                s, self.gpus, list(self._slices.values()),
                [dataclasses.replace(g, memory=memory or g.memory, compute=compute or g.compute)
                 for g in s.grants])
            self.store.flush()  # the slice's own insert may still be queued
            self.store.update_grants(s.id, grants)
            new = dataclasses.replace(s, grants=tuple(grants))
            self._slices[s.id] = new
            self.regions.update(new)
            self.emit("update", of=s, slice=s.id, owner=s.owner, memory=grants[0].memory,
                       compute=grants[0].compute)
            return new

    # -- helpers ---------------------------------------------------------------

    def _find(self, slice_id: str, owner: str, verb: str) -> Slice | None:
        if slice_id:
            s = self._slices.get(slice_id)
            if s is not None and owner and s.owner != owner:
                return None
            return s
        if owner:
            return self._by_owner(owner)
        raise RequestError(verb, "id", slice_id, "is empty: give a slice id or an owner")

    def _by_owner(self, owner: str) -> Slice | None:
        for s in self._slices.values():
            if s.owner == owner:
                return s
        return None

    def _kept_from(self, s: Slice, who: Holder) -> str:
        """Why `who` may not release s ("" when it may)."""
        if s.owner_kind == OwnerKind.CLAIM:
            return ("it is the slice of DRA claim " + repr(s.owner) + ": only its plugin or "
                    "an operator releases it, never a container's poststop")
        if who.is_process(Holder.of(s)):
            return ""  # its own prestart, rolling back
        if s.owner_pid:
            if self.liveness.alive(s):
                return (f"its container still runs (init pid {s.owner_pid}"
                        + (f", bundle {s.owner_bundle})" if s.owner_bundle else ")"))
            return ""
        if who.bundle and s.owner_bundle and who.bundle != s.owner_bundle \
                and self.liveness.alive(s):
            return f"it was allocated for bundle {s.owner_bundle}, not {who.bundle}"
        return ""

    def _forget(self, s: Slice, later: bool = False) -> Retired | None:
        """Drop s and remove its files; with `later`, only retire them (Regions.retire)
        and return what _finish removes once the lock is let go."""
        self._slices.pop(s.id, None)
        self._users.pop(s.id, None)  # the store's rows go with the slice (cascade)
        self.liveness.forget(s.id)
        try:
            if later:
                return self.regions.retire(s.id)
            self.regions.remove(s.id)
        except VgpuError as e:  # the store is the truth; the next start removes it
            log.warning("%s", e)
        return None

    def _finish(self, retired: Retired) -> None:
        try:
            self.regions.finish(retired)
        except VgpuError as e:  # the store is the truth; the next start removes it
            log.warning("%s", e)

    def _kill_slice(self, s: Slice) -> set[int]:
        """SIGKILL an evicted slice's processes: those the host attributes to it (owner,
        descendants, its container's pid namespace and cgroup), never pids its tenant
        wrote into its usage file (they could name a neighbour)."""
        pids = SlicePids(self.regions.pids, self._proc, users=self.users_of).host(s)
        pids.discard(os.getpid())
        for pid in pids:
            with contextlib.suppress(OSError):
                self._kill(pid, signal.SIGKILL)
        return pids

    def _new_id(self) -> str:
        while True:
            sid = secrets.token_hex(_ID_BYTES)
            if sid not in self._slices:
                return sid

    def emit(self, kind: str, *, of: Slice | None = None, **fields: Any) -> None:
        """Record an event; `of`, the slice it is about, adds the Kubernetes workload that
        slice serves (namespace, pod, container) where it has one."""
        if of is not None:
            fields.update((k, v) for k, v in of.workload().items() if v)
        try:
            self.events.emit(kind, **fields)
        except Exception as e:  # an event log that cannot be written must not stop the arbiter
            log.warning("failed to write event %s: %s", kind, e)
        if log.isEnabledFor(logging.INFO):  # json.dumps is not free on the allocation path
            log.info("%s %s", kind, json.dumps(fields, sort_keys=True, default=str))


def _what(slice_id: str, owner: str) -> str:
    if slice_id:
        return f"with id {slice_id!r}"
    return f"for owner {owner!r}"
