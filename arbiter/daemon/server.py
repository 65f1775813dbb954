# SPDX-License-Identifier: Apache-2.0
"""vgpud: the host-wide arbiter daemon (gRPC on a unix socket).

    vgpud [--config FILE] [--socket PATH] [--state-dir DIR] [--run-dir DIR]
          [--log-level LEVEL] [--wait-lock SECONDS]

Flags override the config file (--config, else $VGPU_CONFIG, else
/etc/vgpu/config.yaml; only that default path may be missing, meaning the
built-in defaults). A config error prints one line and exits 2; any other
failure to start prints one line, leaves no socket behind and exits 1 (another
vgpud on the same state dir: it names the state dir and that vgpud's pid, and
touches nothing). A metrics address that cannot be bound is one warning line:
vgpud serves containers meanwhile and retries. SIGHUP reloads the reloadable
config keys; SIGTERM/SIGINT drain the gRPC server and stop. One log line per
event goes to stderr.

Restarts (docs/vgpud.md "Restarts"): sockets passed by a service manager (LISTEN_FDS,
arbiter.daemon.activation) are served as they are and never unlinked or bound again, so
connections made while vgpud restarts wait in their backlog. `--wait-lock SECONDS`
makes a vgpud started beside a running one (a DaemonSet update) get ready and then wait
for the state dir instead of refusing to start.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import gc
import logging
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn, Protocol

import grpc
from prometheus_client import CollectorRegistry

from arbiter.compute.broker_supervisor import BrokerSupervisor
from arbiter.compute.broker_watch import BrokerWatch
from arbiter.compute.freezer import Freezer, find_root
from arbiter.compute.guardian import ComputeGuard
from arbiter.config import Config, config_path, load_config
from arbiter.daemon import activation
from arbiter.daemon.activation import Listeners
from arbiter.daemon.configmemo import AcceptedConfigs
from arbiter.daemon.events import EventLog
from arbiter.daemon.metrics import Metrics, Snapshot
from arbiter.daemon.reconcile import Reconciler
from arbiter.daemon.relay import Relay
from arbiter.daemon.rpc_pool import RpcPool
from arbiter.daemon.service import ArbiterService
from arbiter.defaults import DEFAULT_RUN_DIR
from arbiter.errors import ConfigError, VgpuError
from arbiter.files.sched_files import (
    SCHED_DIR_MODE,
    SCHED_DIR_NAME,
    SchedSummary,
    open_sched,
    prepare_sched_dir,
    slice_gpu_ns,
    slice_key_of,
)
from arbiter.files.slice_dirs import Regions
from arbiter.model import Gpu
from arbiter.native import program_path
from arbiter.proto import vgpu_pb2_grpc
from arbiter.signals import SignalWaiter
from arbiter.slices import inventory
from arbiter.slices.arbiter import Arbiter, Settings
from arbiter.slices.attribution import SlicePids
from arbiter.slices.statelock import StateDirInUseError, StateLock
from arbiter.slices.store import Store

__all__ = ["Attachment", "AttachmentFactory", "Daemon", "DaemonError", "exit_process", "main"]

log = logging.getLogger("vgpud")

# Every change goes through one lock and batched commits, so more threads only add GIL
# hand-offs: with a slice's files made in one call (arbiter.files.fileops), 3 measured
# best on 2 cores (bench/arbiter.py at 8 clients, alternating: 3 workers 454 pairs/s and
# 47 context switches a pair, 4 workers 444/s and 57, 2 workers ~446/s).
_WORKERS = 3
_DRAIN_S = 5.0
#: The run dir: others may pass through (a runtime in a user namespace opening a
#: bind-mount source by its path) but not list it.
_RUN_DIR_MODE = 0o711
#: Under socket activation gRPC listens here (in the run dir, 0600) behind the relay.
_PRIVATE_GRPC_NAME = "vgpud.grpc.sock"


class DaemonError(VgpuError):
    """vgpud cannot start: the socket is taken, a directory cannot be made, ..."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"failed to start vgpud: {reason}")


class Attachment(Protocol):
    """A part another package serves from vgpud's process (vgpud/ composes them), e.g.
    the container lifecycle socket. The daemon starts it once the domain serves, closes it
    first at stop, and reports its paths in Health (`vgpu info`)."""

    @property
    def paths(self) -> Mapping[str, str]:
        """Name -> path of what it serves (Health reports them)."""
        ...

    def start(self) -> None:
        """Start serving; an OSError is one warning line, vgpud serves on without it."""
        ...

    def close(self) -> None:
        """Stop serving and remove what start made."""
        ...

    def serve_on(self, sock: socket.socket) -> None:
        """Serve on this inherited listening socket (bound to one of `paths`) at start,
        instead of binding one; close() then leaves the path alone."""
        ...


#: Makes an attachment from the domain and vgpud's loaded config.
AttachmentFactory = Callable[[Arbiter, Config], Attachment]


def _socket_in_use(path: Path) -> bool:
    """True when something accepts connections on the unix socket at path."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(str(path))
    except OSError:
        return False
    finally:
        s.close()
    return True


class Daemon:
    """One running vgpud: store, regions, arbiter, reconciler, gRPC server, metrics."""

    def __init__(self, config: Config, config_file: Path | None,
                 overrides: dict[str, object], *, proc: Path = Path("/proc"),
                 attachments: Sequence[AttachmentFactory] = (),
                 listeners: Listeners | None = None, wait_lock_s: float = 0) -> None:
        self.config = config
        self.config_file = config_file
        self.overrides = overrides
        self.proc = proc
        self._signals: SignalWaiter | None = None  # install_signals: what run() waits on
        self._lock_fd: int | None = None
        self._state_lock: StateLock | None = None
        self.server: grpc.Server | None = None
        self.rpc_pool: RpcPool | None = None
        self.metrics: Metrics | None = None
        self.store: Store | None = None
        self.events: EventLog | None = None
        self.arbiter: Arbiter | None = None
        self.reconciler: Reconciler | None = None
        self.guard: ComputeGuard | None = None
        self.sched_files: dict[str, Path] = {}  # GPU uuid -> its scheduling region
        self.broker: BrokerSupervisor | None = None
        self.broker_watch: BrokerWatch | None = None
        self.serving = False  # start() finished: the broker is left serving at close()
        self._factories = tuple(attachments)
        self.attachments: list[Attachment] = []  # made at start; those that serve
        #: Sockets a service manager passed (none: vgpud binds its own).
        self.listeners = listeners if listeners is not None else Listeners([])
        #: How long a start waits for another vgpud to let go of the state dir.
        self.wait_lock_s = wait_lock_s
        self._grpc_listener: socket.socket | None = None  # inherited: the relay's
        self._relay: Relay | None = None
        self._grpc_bound: Path | None = None  # the socket file this vgpud bound

    # -- start -----------------------------------------------------------------

    def _claim_socket(self) -> None:
        """Take the socket's lock file, refusing when another vgpud holds it or serves there."""
        sock = self.config.socket
        try:
            # Only a directory we make gets our mode: the socket may live in a
            # shared directory (/tmp) whose mode is not ours to change.
            if not sock.parent.is_dir():
                sock.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(sock.parent,
                         _RUN_DIR_MODE if sock.parent == self.config.run_dir else 0o755)
        except OSError as e:
            raise DaemonError(f"cannot make socket directory {sock.parent}: {e.strerror}") from e
        lock = sock.with_name(sock.name + ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise DaemonError(f"another vgpud is running on {sock} "
                                  f"(it holds {lock})") from e
            raise
        self._lock_fd = fd
        if self._grpc_listener is not None:
            return  # the service manager's socket: never unlinked or bound here
        if sock.exists() or sock.is_symlink():
            if _socket_in_use(sock):
                raise DaemonError(f"another vgpud serves {sock}")
            log.info("removing stale socket %s", sock)
            sock.unlink()

    def _lock_state_dir(self, ready: Callable[[], None] = lambda: None) -> None:
        """Hold the state dir's lock for the daemon's life: one vgpud per state dir.

        With wait_lock_s, a held lock is waited for: `ready` first does what needs no
        lock (NVML, the inventory), so the takeover is quick once the holder exits."""
        c = self.config
        try:
            try:
                self._state_lock = StateLock.acquire(c.state_dir, c.socket)
            except StateDirInUseError as e:
                if self.wait_lock_s <= 0:
                    raise
                log.info("%s: waiting up to %gs for it to exit", e, self.wait_lock_s)
                ready()
                self._state_lock = StateLock.acquire(c.state_dir, c.socket,
                                                     wait_s=self.wait_lock_s)
        except OSError as e:
            raise DaemonError(f"cannot lock the state dir {c.state_dir}: "
                              f"{e.strerror or e}") from e

    def _prepare_run_dir(self) -> None:
        """The run dir and its scheduling dir: ours (vgpud's uid), never writable by others.

        Set at every start, so a run dir an older vgpud made 0755 is closed too.
        slices/ is Regions' (0711; each slice's own directory 0700).
        """
        c = self.config
        sched = c.run_dir / SCHED_DIR_NAME
        for d, mode in ((c.run_dir, _RUN_DIR_MODE), (sched, SCHED_DIR_MODE)):
            try:
                if not d.is_dir():
                    d.mkdir(mode=mode, parents=True, exist_ok=True)
                st = d.stat()
                if st.st_uid != os.geteuid():
                    # Its owner could swap any file vgpud makes there.
                    raise DaemonError(f"{d} belongs to uid {st.st_uid}, not to vgpud's "
                                      f"uid {os.geteuid()}: refusing to keep slices there")
                if stat.S_IMODE(st.st_mode) != mode:
                    os.chmod(d, mode)
                    log.info("%s: mode %04o, was %04o", d, mode, stat.S_IMODE(st.st_mode))
            except OSError as e:
                raise DaemonError(f"cannot prepare {d}: {e.strerror or e}") from e

    def _broker_supervisor(self) -> BrokerSupervisor:
        broker = program_path("vgpu-broker")
        if broker is None:
            raise DaemonError("vgpu-broker not found (arbiter/native/bin or build/bin): "
                              "compute shares cannot be enforced; build it with make")
        c = self.config
        return BrokerSupervisor(broker, c.run_dir / SCHED_DIR_NAME, c.run_dir,
                                orphan_s=c.broker_orphan_s, proc=self.proc)

    def start(self) -> None:
        """Bring every part up; raise VgpuError with a one-line reason on failure."""
        c = self.config
        found: list[Gpu] = []

        def discover() -> None:
            if not found:
                found.extend(inventory.discover(c))

        def get_ready() -> None:
            """Before waiting for the lock: NVML up, and /metrics served (a DaemonSet's
            readiness probe: the old pod is stopped only once the new one is ready)."""
            discover()
            self.metrics = self._make_metrics()
            if c.metrics_address:
                self.metrics.start(c.metrics_address, key="metrics.address")
            # The old vgpud's broker may die with its pod: ours waits to serve at once.
            self.broker = self._broker_supervisor()
            self.broker.start_standby()

        self._lock_state_dir(get_ready)  # first: a second vgpud must touch nothing
        self._grpc_listener = self.listeners.take("socket", c.socket)
        self._claim_socket()
        discover()
        gpus = list(found)
        self._prepare_run_dir()
        regions = Regions(c.run_dir, context_reserve=c.context_reserve, proc=self.proc)
        regions.prepare()
        # Before any slice exists (and before the hook can ask for one to mount):
        # a file that is already there is kept, same inode, for running containers.
        self.sched_files = prepare_sched_dir(c.run_dir / SCHED_DIR_NAME, [g.uuid for g in gpus])
        regions.sched_gpus = list(self.sched_files)
        # The token broker: without it no throttled slice could ever launch work.
        if self.broker is None:
            self.broker = self._broker_supervisor()
        self.broker.start()
        self.store = Store(c.state_dir)
        self.events = EventLog(c.event_log, max_bytes=c.event_log_max_bytes,
                               generations=c.event_log_generations)
        serving_metrics = self.metrics is not None
        if self.metrics is None:
            self.metrics = self._make_metrics()
        self.arbiter = Arbiter(
            gpus=gpus, store=self.store, regions=regions, events=self.events,
            settings=Settings.from_config(c), metrics=self.metrics,
            sample=inventory.sample, check=inventory.unhealthy,
            versions=inventory.driver_versions, proc=self.proc)
        # Watched from the start: the start's reconcile may find leased files to tell of.
        self._watch_regions(regions)
        self.arbiter.start()
        self.broker_watch = BrokerWatch(self.sched_files, {g.uuid: g.index for g in gpus},
                                        self.arbiter.emit)
        self.arbiter.brokers = self.broker_watch.states
        self.broker_watch.start()
        self.reconciler = Reconciler(
            self.arbiter, runtime_state_roots=c.runtime_state_roots,
            drift_action=c.drift_action, interval_s=c.reconcile_interval_s, proc=self.proc,
            metrics=self.metrics)
        # The pass at start: slices of containers that went away while vgpud was down.
        self.reconciler.run_once()
        self.reconciler.start()
        self.guard = self._make_guard()
        self.guard.start()

        self.rpc_pool = RpcPool(_WORKERS, "vgpud-rpc")
        # Typed as a ThreadPoolExecutor; gRPC's server only calls submit() and
        # add_done_callback() on what it returns (arbiter.daemon.rpc_pool).
        self.server = grpc.server(self.rpc_pool,  # type: ignore[arg-type]
                                  options=[("grpc.so_reuseport", 0)])
        paths = {"config": str(c.source or ""), "socket": str(c.socket),
                 "state_dir": str(c.state_dir), "run_dir": str(c.run_dir),
                 "sched_dir": str(c.run_dir / SCHED_DIR_NAME),
                 "event_log": str(c.event_log), "metrics_address": c.metrics_address}
        made = [factory(self.arbiter, c) for factory in self._factories]
        for a in made:
            paths.update(a.paths)
        service = ArbiterService(self.arbiter, paths)
        vgpu_pb2_grpc.add_ArbiterServicer_to_server(service, self.server)
        # Under socket activation gRPC listens privately and the relay feeds it.
        bind = c.socket if self._grpc_listener is None else c.run_dir / _PRIVATE_GRPC_NAME
        if self._grpc_listener is not None:
            with contextlib.suppress(FileNotFoundError):
                bind.unlink()  # ours (we hold the state dir): a previous vgpud's leftover
        old = os.umask(0o177)  # the socket is born 0600: no window where others can connect
        try:
            port = self.server.add_insecure_port(f"unix:{bind}")
        finally:
            os.umask(old)
        if not port:
            raise DaemonError(f"cannot listen on unix:{bind}")
        self._grpc_bound = bind
        self.server.start()
        os.chmod(bind, 0o600)
        if self._grpc_listener is not None:
            self._relay = Relay(self._grpc_listener, bind)
            self._grpc_listener = None  # the relay's now (it closes it)
            self._relay.start()
        for a in made:
            for name, path in a.paths.items():
                sock = self.listeners.take(name, path)
                if sock is not None:
                    a.serve_on(sock)
            self._attach(a)
        for extra in self.listeners.leftovers():
            log.warning("inherited socket %s: nothing of vgpud serves it; closed", extra)
        self.listeners.close_leftovers()
        if c.metrics_address and not serving_metrics:
            # A taken or unresolvable address is one warning and retries: the
            # containers vgpud serves do not depend on being scraped.
            self.metrics.start(c.metrics_address, key="metrics.address")
        self.serving = True
        log.info("vgpud serving on unix:%s%s with %d GPU(s), %d slice(s)", c.socket,
                 " (inherited)" if self._relay is not None else "", len(gpus),
                 len(self.arbiter.slices()))

    def _watch_regions(self, regions: Regions) -> None:
        """Tenant-damaged usage files and run-dir parts made again: an event and a metric."""
        arbiter, metrics = self.arbiter, self.metrics
        assert arbiter is not None and metrics is not None

        def bad_usage(slice_id: str, ordinal: int, reason: str) -> None:
            metrics.bad_usage_file()
            arbiter.emit("usage.malformed", slice=slice_id, vgpu=ordinal, reason=reason)

        def remade(what: str, path: Path) -> None:
            arbiter.emit("rundir.remade", what=what, path=str(path))

        def busy(slice_id: str, path: Path, reason: str) -> None:
            arbiter.emit("file.leased", slice=slice_id, path=str(path), reason=reason)

        regions.on_bad_usage = bad_usage
        regions.on_remade = remade
        regions.on_busy = busy

    def _make_guard(self) -> ComputeGuard:
        """The out-of-band guard (arbiter.compute.guardian) on this host's cgroup v2 root."""
        c = self.config
        assert self.arbiter is not None
        root = c.cgroup_root if c.cgroup_root is not None else find_root()
        if root is None and c.guard_action == "throttle":
            log.warning("guard: no cgroup v2 hierarchy found; throttle findings are only flagged")
        gpus = list(self.arbiter.gpus)
        return ComputeGuard(
            self.arbiter, lambda: inventory.process_utilisation(gpus),
            action=c.guard_action, margin=c.guard_margin, interval_s=c.guard_interval_s,
            memory_action=c.guard_memory_action, memory_margin=c.guard_memory_margin,
            memory_escalate_after=c.guard_memory_escalate_after,
            memory_escalate_window_s=c.guard_memory_escalate_window_s,
            memory_escalate_action=c.guard_memory_escalate_action,
            freezer=Freezer(root) if root is not None else None,
            ledger=c.run_dir / "guard-frozen", proc=self.proc, metrics=self.metrics)

    def _attach(self, a: Attachment) -> None:
        """Start one attachment; one that cannot serve is a warning, not a failed start."""
        try:
            a.start()
        except OSError as e:
            log.warning("not serving %s: %s", ", ".join(a.paths.values()) or type(a).__name__,
                        e.strerror or e)
            return
        self.attachments.append(a)

    def _make_metrics(self) -> Metrics:
        metrics = Metrics(CollectorRegistry())
        metrics.set_source(self._snapshot)
        return metrics

    def _snapshot(self) -> Snapshot:
        """What the per-GPU and per-slice gauges show at a scrape."""
        a = self.arbiter
        if a is None:
            return Snapshot(gpus=[], slices=[])
        slices = a.slices()
        samples = a.sample()
        owners = SlicePids(a.regions.pids, self.proc, users=a.users_of)
        compute_used: dict[str, list[int]] = {}
        for s in slices:
            pids_of = owners.of(s)
            per_vgpu = []
            for i, g in enumerate(s.grants):
                util = getattr(samples.get(g.gpu_index), "process_util", None) or {}
                per_vgpu.append(min(100, sum(util.get(p, 0) for p in pids_of[i])))
            compute_used[s.id] = per_vgpu
        scheds = self._sched_summaries()
        # Keys derived from the slice id: never read back from a file its tenant can write.
        gpu_ns = {s.id: slice_gpu_ns([(g.gpu_uuid, slice_key_of(s.id, i))
                                      for i, g in enumerate(s.grants)], scheds)
                  for s in slices}
        return Snapshot(
            gpus=list(a.gpus), slices=slices,
            gpu_used={i: smp.used for i, smp in samples.items()},
            gpu_util={i: smp.utilization or 0 for i, smp in samples.items()},
            slice_used={s.id: a.usage(s) for s in slices},
            slice_compute_used=compute_used,
            slice_gpu_ns=gpu_ns,
            gpu_handoffs={g.index: scheds[g.uuid].handoffs for g in a.gpus if g.uuid in scheds},
            gpu_revocations={g.index: scheds[g.uuid].revocations
                             for g in a.gpus if g.uuid in scheds},
            gpu_broker_serving={g.index: scheds[g.uuid].broker_pid != 0
                                for g in a.gpus if g.uuid in scheds},
        )

    def _sched_summaries(self) -> dict[str, SchedSummary]:
        """Each GPU's scheduling region now, by GPU uuid (unreadable ones left out)."""
        now = time.monotonic_ns()
        out = {}
        for uuid, path in self.sched_files.items():
            try:
                with open_sched(path) as sched:
                    out[uuid] = sched.summary(now)
            except VgpuError as e:
                log.warning("metrics: %s", e)
        return out

    # -- run -------------------------------------------------------------------

    def install_signals(self) -> None:
        """SIGHUP: reload; SIGTERM/SIGINT: stop (from the main thread, before start). No
        handler acts (arbiter.signals): run() does, between two waits."""
        self._signals = SignalWaiter((signal.SIGTERM, signal.SIGINT, signal.SIGHUP))

    def run(self) -> None:
        """Serve until SIGTERM/SIGINT, reloading on SIGHUP (install_signals first). A stop
        that came with a SIGHUP wins; the SIGHUPs that came during a reload make one more."""
        assert self._signals is not None, "install_signals() before run()"
        while True:
            came = self._signals.wait()
            if came & {signal.SIGTERM, signal.SIGINT}:
                return
            self.reload()  # SIGHUP: the only other one

    def reload(self) -> None:
        """Re-read the config file; apply the reloadable keys, warn about the rest."""
        assert self.arbiter is not None and self.reconciler is not None
        try:
            new = load_config(self.config_file, self.overrides)
        except ConfigError as e:
            log.error("reload refused, keeping the running config: %s", e)
            return
        changed = self.config.changed(new)
        ignored = self.config.unreloadable_changes(new)
        self.config = self.config.replace_reloadable(new)
        self.arbiter.reload(Settings.from_config(self.config))
        self.reconciler.configure(drift_action=self.config.drift_action,
                                  interval_s=self.config.reconcile_interval_s)
        if self.guard is not None:
            self.guard.configure(action=self.config.guard_action, margin=self.config.guard_margin,
                                 memory_action=self.config.guard_memory_action,
                                 memory_margin=self.config.guard_memory_margin,
                                 memory_escalate_after=self.config.guard_memory_escalate_after,
                                 memory_escalate_window_s=(
                                     self.config.guard_memory_escalate_window_s),
                                 memory_escalate_action=self.config.guard_memory_escalate_action)
        if ignored:
            log.warning("reload: %s change only after a restart", ", ".join(ignored))
        self.arbiter.emit("reload", changed=[n for n in changed if n not in ignored],
                          needs_restart=list(ignored))

    def close(self) -> None:
        """Drain and stop everything that started (safe after a partial start).

        The sockets and locks go even when a step before fails."""
        try:
            for a in reversed(self.attachments):
                with contextlib.suppress(Exception):
                    a.close()
            if self._relay is not None:
                self._relay.close()
            if self.server is not None:
                self.server.stop(_DRAIN_S).wait()
            if self.rpc_pool is not None:  # the calls drained: its threads end now
                self.rpc_pool.shutdown()
            if self.reconciler is not None:
                self.reconciler.stop()
            if self.guard is not None:  # thaws every cgroup it throttles
                self.guard.stop()
            if self.broker_watch is not None:
                self.broker_watch.stop()
            if self.arbiter is not None and not self.arbiter.slices():
                self.arbiter.regions.unshare()  # no slice left: no mount of vgpud's either
            if self.broker is not None:
                # Served slices keep their broker through a restart; a failed start
                # leaves nothing it started behind (an adopted broker served before it).
                if self.serving or self.broker.how == "adopted":
                    self.broker.stop()
                else:
                    self.broker.terminate()
            if self.metrics is not None:
                self.metrics.close()
            if self.store is not None:
                self.store.close()
            with contextlib.suppress(Exception):
                inventory.shutdown()
            if self.events is not None:
                with contextlib.suppress(Exception):
                    self.events.close()
        finally:
            self._release()

    def _release(self) -> None:
        """Remove the socket this vgpud bound (never an inherited one) and let its locks go."""
        if self._signals is not None:
            self._signals.close()
            self._signals = None
        if self._grpc_bound is not None:
            with contextlib.suppress(FileNotFoundError):
                self._grpc_bound.unlink()
        if self._grpc_listener is not None:  # a start that failed before the relay took it
            self._grpc_listener.close()
            self._grpc_listener = None
        self.listeners.close_leftovers()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._state_lock is not None:  # last: nothing of this vgpud runs any more
            self._state_lock.close()
            self._state_lock = None


def _start_failure(e: Exception) -> str:
    """The one line a failed start prints, whatever failed."""
    if isinstance(e, VgpuError):
        return str(e)
    if isinstance(e, OSError) and e.strerror:
        where = f"{e.filename}: " if e.filename else ""
        return str(DaemonError(f"{where}{e.strerror}"))
    return str(DaemonError(f"{type(e).__name__}: {e}"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """vgpud's command line."""
    p = argparse.ArgumentParser(prog="vgpud", description="vgpu host arbiter daemon")
    p.add_argument("--config", help="config file (default: $VGPU_CONFIG or "
                   "/etc/vgpu/config.yaml; only that default may be missing, "
                   "meaning the built-in defaults)")
    p.add_argument("--socket", help="gRPC unix socket (overrides paths.socket)")
    p.add_argument("--state-dir", help="state directory (overrides paths.state_dir)")
    p.add_argument("--run-dir", help="runtime directory (overrides paths.run_dir)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"], help="stderr log level")
    p.add_argument("--wait-lock", type=float, default=0, metavar="SECONDS",
                   help="when another vgpud holds the state dir, get ready and wait this long "
                   "for it to exit instead of refusing to start (a DaemonSet update)")
    return p.parse_args(argv)


def _say(line: str) -> None:
    """One line to stderr in one write: the broker vgpud started shares the stream, and
    print()'s separate newline let its lines land inside ours."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None,
         attachments: Sequence[AttachmentFactory] = ()) -> int:
    """Run vgpud (the domain alone; vgpud.main adds the container lifecycle socket)."""
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="vgpud: %(levelname)s %(message)s")
    try:
        # First, whatever else fails: the variables must not reach vgpud's children.
        listeners = activation.from_environ()
    except VgpuError as e:
        _say(f"vgpud: {e}")
        return 1
    if args.wait_lock < 0:
        _say(f"vgpud: --wait-lock: {args.wait_lock:g} is not a number of seconds >= 0")
        return 2
    path = config_path(args.config)
    overrides: dict[str, object] = {"socket": args.socket, "state_dir": args.state_dir,
                                    "run_dir": args.run_dir}
    # The run dir's record of accepted configs (the flag's, else the default one): the same
    # config as at the last start skips jsonschema (arbiter.daemon.configmemo).
    accepted = AcceptedConfigs(Path(args.run_dir) if args.run_dir else DEFAULT_RUN_DIR)
    try:
        config = load_config(path, overrides, accepted=accepted)
    except ConfigError as e:
        _say(f"vgpud: {e}")
        return 2
    # Whatever umask vgpud inherits, nothing it makes is writable by other users
    # (files whose mode matters get it explicitly as well).
    os.umask(0o022)
    daemon = Daemon(config, path, overrides, attachments=attachments, listeners=listeners,
                    wait_lock_s=args.wait_lock)
    daemon.install_signals()
    try:
        daemon.start()
    except Exception as e:
        # One line, whatever failed; the traceback only at debug level.
        log.debug("start failed", exc_info=True)
        _say(f"vgpud: {_start_failure(e)}")
        try:
            daemon.close()  # no socket left behind
        except Exception:
            log.debug("close after a failed start", exc_info=True)
        return 1
    if config.run_dir == accepted.run_dir:  # prepared by start(): vgpud's own, 0711
        accepted.save()
    # Everything start() left (modules, gRPC's and protobuf's objects, the slices loaded:
    # tens of thousands) lives as long as vgpud; frozen, the garbage collector's full
    # passes no longer walk them. Unfrozen, each full pass under load held the GIL for
    # 18-31 ms, a stall every in-flight answer waited out (docs/performance.md).
    gc.freeze()
    try:
        daemon.run()
    finally:
        log.info("stopping")
        daemon.close()
    return 0


def exit_process(status: int) -> NoReturn:
    """End vgpud's process with `status` once main() returned: logs and stdio flushed, the
    interpreter's teardown skipped. Daemon.close() already stopped every thread and child
    and closed every socket, lock and file; the teardown (modules, grpc's and the thread
    pool's exit hooks) took ~115 ms of every restart's stop and does nothing vgpud needs."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_process(main())
