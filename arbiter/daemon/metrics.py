# SPDX-License-Identifier: Apache-2.0
"""vgpud's Prometheus metrics: event counters plus a per-scrape view of GPUs and slices.

Counters and the latency histogram are updated by the daemon as things happen;
the per-GPU and per-slice gauges are computed at scrape time from a Snapshot the
daemon supplies (set_source), so they are never stale and never need cleanup
when a slice goes away.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from arbiter.model import WORKLOAD_LABELS, Gpu, Policy, Priority, Slice

__all__ = ["Metrics", "Snapshot", "parse_address"]

log = logging.getLogger(__name__)

#: Seconds between tries to bind a metrics address that failed: doubling from the
#: first, at most the last (a port freed later is served within RETRY_MAX_S).
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 10.0

#: A scrape reuses the per-GPU and per-slice snapshot taken this recently, and scrapes that
#: arrive while one is being taken wait for it and share it: however often and however many
#: at once the endpoint is scraped, vgpud reads its slices' files and NVML at most once per
#: this long. (NVML's utilisation is a one-second average anyway.)
SNAPSHOT_REUSE_S = 1.0

#: Allocation latency buckets (seconds): the target is p99 < 20 ms with durable writes.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

_GPU_LABELS = ("gpu", "uuid")
#: A slice's own labels, then the Kubernetes workload it serves ("" outside Kubernetes):
#: dashboards and alerts name the pod, not a container id.
_WORKLOAD = tuple(name for name, _ in WORKLOAD_LABELS)
_SLICE_LABELS = ("gpu", "uuid", "slice", "owner", *_WORKLOAD)


@dataclass(frozen=True)
class Snapshot:
    """What the gauges show at one scrape: inventory, slices and measured usage.

    gpu_used/gpu_util: per GPU index, bytes in use and % busy (NVML). slice_used and
    slice_compute_used: per slice id, one value per grant (same order as
    Slice.grants): bytes in use (libvgpu's region) and % of the GPU used (NVML).
    slice_gpu_ns: per slice id, per grant, the GPU time libvgpu charged to the
    slice in its GPU's scheduling region (None: the slice has no entry there).
    gpu_handoffs: per GPU index, times the broker granted the scheduling token.
    gpu_revocations: per GPU index, grants the broker took back (quantum, credit, priority, lease).
    gpu_broker_serving: per GPU index, whether a token broker serves it (a fresh heartbeat).
    Missing entries are simply not exported.
    """

    gpus: list[Gpu]
    slices: list[Slice]
    gpu_used: dict[int, int] = field(default_factory=dict)
    gpu_util: dict[int, int] = field(default_factory=dict)
    slice_used: dict[str, list[int]] = field(default_factory=dict)
    slice_compute_used: dict[str, list[int]] = field(default_factory=dict)
    slice_gpu_ns: dict[str, list[int | None]] = field(default_factory=dict)
    gpu_handoffs: dict[int, int] = field(default_factory=dict)
    gpu_revocations: dict[int, int] = field(default_factory=dict)
    gpu_broker_serving: dict[int, bool] = field(default_factory=dict)


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of 'HOST:PORT' or '[V6]:PORT'; ValueError when it is neither."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"invalid metrics address {address!r}: expected HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class _SnapshotCollector(Collector):
    """Turns the daemon's Snapshot into gauges at every scrape."""

    def __init__(self, reuse_s: float = SNAPSHOT_REUSE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source: Callable[[], Snapshot] | None = None
        self.reuse_s = reuse_s
        self.clock = clock
        self._taking = threading.Lock()  # one snapshot at a time; the others wait and share it
        self._last: tuple[float, Snapshot] | None = None

    def describe(self) -> list[Metric]:
        # Unchecked registration: the metric names depend on nothing but this module.
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        if snap is not None:
            yield from _families(snap)

    def snapshot(self) -> Snapshot | None:
        """The snapshot for this scrape: one taken within reuse_s, else a new one."""
        source = self.source
        if source is None:
            return None
        with self._taking:
            last = self._last
            if last is not None and self.clock() - last[0] < self.reuse_s:
                return last[1]
            try:
                snap = source()
            except Exception:
                # A failing source must not break the whole scrape (counters still matter).
                log.exception("metrics: failed to take a snapshot")
                return None
            self._last = (self.clock(), snap)
            return snap


def _gauge(name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _families(snap: Snapshot) -> Iterator[Metric]:
    g_total = _gauge("vgpu_gpu_memory_total_bytes", "GPU memory size.", _GPU_LABELS)
    g_alloc = _gauge("vgpu_gpu_memory_allocated_bytes",
                     "GPU memory guaranteed to slices.", _GPU_LABELS)
    g_used = _gauge("vgpu_gpu_memory_used_bytes", "GPU memory in use (NVML).", _GPU_LABELS)
    g_calloc = _gauge("vgpu_gpu_compute_allocated_percent",
                      "Compute share guaranteed to slices, % of the GPU.", _GPU_LABELS)
    g_cused = _gauge("vgpu_gpu_compute_used_percent",
                     "GPU utilisation (NVML), %.", _GPU_LABELS)
    g_slices = _gauge("vgpu_gpu_slices", "Slices with a vGPU on this GPU.", _GPU_LABELS)
    s_limit = _gauge("vgpu_slice_memory_limit_bytes",
                     "A slice's memory limit on one GPU.", _SLICE_LABELS)
    s_used = _gauge("vgpu_slice_memory_used_bytes",
                    "A slice's memory in use on one GPU (libvgpu).", _SLICE_LABELS)
    s_share = _gauge("vgpu_slice_compute_share_percent",
                     "A slice's guaranteed compute share on one GPU, %.", _SLICE_LABELS)
    s_cused = _gauge("vgpu_slice_compute_used_percent",
                     "A slice's compute use on one GPU, %.", _SLICE_LABELS)
    s_seconds = CounterMetricFamily(
        "vgpu_slice_gpu_seconds", "GPU time the broker charged a slice on one GPU, seconds "
        "(measured by the broker's clock, not sampled).", labels=list(_SLICE_LABELS))
    g_handoffs = CounterMetricFamily(
        "vgpu_gpu_token_handoffs", "Times the broker granted the GPU's scheduling token.",
        labels=list(_GPU_LABELS))
    g_revocations = CounterMetricFamily(
        "vgpu_gpu_token_revocations", "Grants of the GPU's token the broker took back "
        "(quantum, credit, priority, lapsed lease).", labels=list(_GPU_LABELS))
    g_broker = _gauge("vgpu_gpu_broker_serving",
                      "1 while a token broker serves the GPU (its heartbeat is fresh), 0 when "
                      "none does: throttled slices there cannot launch work.", _GPU_LABELS)
    s_info = InfoMetricFamily("vgpu_slice", "A slice's owner, priority, policy and the "
                              "Kubernetes namespace, pod and container it serves.",
                              labels=["slice", "owner", "priority", "policy", *_WORKLOAD])

    allocated: dict[int, int] = {}
    compute: dict[int, int] = {}
    count: dict[int, int] = {}
    for sl in snap.slices:
        # Priority()/Policy() also take the plain ints a store may hand back.
        workload = list(sl.workload().values())
        s_info.add_metric([sl.id, sl.owner, Priority(sl.priority).name.lower(),
                           Policy(sl.policy).name.lower(), *workload], {})
        used = snap.slice_used.get(sl.id, [])
        cused = snap.slice_compute_used.get(sl.id, [])
        gpu_ns = snap.slice_gpu_ns.get(sl.id, [])
        for ordinal, grant in enumerate(sl.grants):
            labels = [str(grant.gpu_index), grant.gpu_uuid, sl.id, sl.owner, *workload]
            s_limit.add_metric(labels, grant.memory)
            s_share.add_metric(labels, grant.compute)
            if ordinal < len(used):
                s_used.add_metric(labels, used[ordinal])
            if ordinal < len(cused):
                s_cused.add_metric(labels, cused[ordinal])
            ns = gpu_ns[ordinal] if ordinal < len(gpu_ns) else None
            if ns is not None:
                s_seconds.add_metric(labels, ns / 1e9)
            allocated[grant.gpu_index] = allocated.get(grant.gpu_index, 0) + grant.memory
            compute[grant.gpu_index] = compute.get(grant.gpu_index, 0) + grant.compute
        for index in {g.gpu_index for g in sl.grants}:
            count[index] = count.get(index, 0) + 1

    for gpu in snap.gpus:
        labels = [str(gpu.index), gpu.uuid]
        g_total.add_metric(labels, gpu.memory)
        g_alloc.add_metric(labels, allocated.get(gpu.index, 0))
        g_calloc.add_metric(labels, compute.get(gpu.index, 0))
        g_slices.add_metric(labels, count.get(gpu.index, 0))
        if gpu.index in snap.gpu_used:
            g_used.add_metric(labels, snap.gpu_used[gpu.index])
        if gpu.index in snap.gpu_util:
            g_cused.add_metric(labels, snap.gpu_util[gpu.index])
        if gpu.index in snap.gpu_handoffs:
            g_handoffs.add_metric(labels, snap.gpu_handoffs[gpu.index])
        if gpu.index in snap.gpu_revocations:
            g_revocations.add_metric(labels, snap.gpu_revocations[gpu.index])
        if gpu.index in snap.gpu_broker_serving:
            g_broker.add_metric(labels, int(snap.gpu_broker_serving[gpu.index]))

    yield from (g_total, g_alloc, g_used, g_calloc, g_cused, g_slices, g_handoffs, g_revocations,
                g_broker, s_limit, s_used, s_share, s_cused, s_seconds, s_info)


class Metrics:
    """vgpud's metrics on their own registry (a fresh one per instance unless given)."""

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 snapshot_reuse_s: float = SNAPSHOT_REUSE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._allocations = Counter(
            "vgpu_allocations_total", "Allocate calls by outcome (ok, exists, no_capacity, ...).",
            ["outcome"], registry=self.registry)
        self._latency = Histogram(
            "vgpu_allocation_seconds", "Time to answer an Allocate call, durable write included.",
            buckets=LATENCY_BUCKETS, registry=self.registry)
        self._releases = Counter(
            "vgpu_releases_total", "Slices released, by reason (release, exit, reconcile, ...).",
            ["reason"], registry=self.registry)
        self._evictions = Counter(
            "vgpu_evictions_total", "Low priority slices evicted to admit a high priority one.",
            registry=self.registry)
        self._drift = Counter(
            "vgpu_drift_total", "Times the reconciler measured a slice above its memory limit.",
            registry=self.registry)
        self._guard = Counter(
            "vgpu_guard_findings_total",
            "Slices the out-of-band guard measured above their share (compute) or limit "
            "(memory), by the action taken.",
            ["action", "resource"], registry=self.registry)
        self._bad_usage = Counter(
            "vgpu_usage_file_errors_total",
            "Times a slice's usage file (written by its tenant) read malformed or missing.",
            registry=self.registry)
        self._collector = _SnapshotCollector(snapshot_reuse_s, clock)
        self.registry.register(self._collector)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()           # _server, _thread and _closed
        self._closed = False
        self._stop = threading.Event()          # ends the retry thread
        self._retry: threading.Thread | None = None

    def allocation(self, seconds: float, outcome: str) -> None:
        """Count one Allocate call and record how long it took."""
        self._allocations.labels(outcome=outcome).inc()
        self._latency.observe(seconds)

    def release(self, reason: str) -> None:
        """Count one released slice."""
        self._releases.labels(reason=reason).inc()

    def eviction(self, n: int = 1) -> None:
        """Count `n` evicted slices."""
        self._evictions.inc(n)

    def drift(self, n: int = 1) -> None:
        """Count `n` drift findings (a slice's NVML-measured use above its limit)."""
        self._drift.inc(n)

    def guard_finding(self, action: str, resource: str = "compute") -> None:
        """Count one guard finding (a slice above its share or its memory limit) and its action."""
        self._guard.labels(action=action, resource=resource).inc()

    def bad_usage_file(self) -> None:
        """Count one malformed usage file (each slice, vGPU and reason once)."""
        self._bad_usage.inc()

    def set_source(self, fn: Callable[[], Snapshot] | None) -> None:
        """Use fn() for the per-GPU and per-slice gauges (None: export none), at most once per
        SNAPSHOT_REUSE_S however often the endpoint is scraped."""
        self._collector.source = fn
        self._collector._last = None

    def serve(self, address: str) -> WSGIServer:
        """Serve /metrics over HTTP at 'HOST:PORT' (port 0: any free port) on a daemon thread.

        Raises OSError (socket.gaierror included) when the address cannot be bound.
        """
        host, port = parse_address(address)
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        with self._lock:
            closed = self._closed
            if not closed:
                self._server, self._thread = server, thread
        if closed:  # close() ran while this bound: serve nothing after it
            _shutdown(server, thread)
        return server

    def start(self, address: str, *, key: str = "metrics.address",
              first_s: float = RETRY_FIRST_S, max_s: float = RETRY_MAX_S) -> bool:
        """Serve /metrics at address now, or say why not in one line and keep retrying.

        The retries run on a daemon thread, doubling the wait from first_s to max_s,
        until the address binds or close(); each prints nothing unless the reason
        changes. True when serving now. `key` names the setting in the messages.
        """
        try:
            self.serve(address)
        except OSError as e:
            log.warning("%s %r: %s; serving containers without metrics, retrying every "
                        "%g s backing off to %g s", key, address, _bind_problem(address, e),
                        first_s, max_s)
            self._retry = threading.Thread(
                target=self._keep_trying, args=(address, key, first_s, max_s,
                                                _bind_problem(address, e)),
                name="vgpud-metrics-bind", daemon=True)
            self._retry.start()
            return False
        self._say_serving(address)
        return True

    def _keep_trying(self, address: str, key: str, first_s: float, max_s: float,
                     reason: str) -> None:
        delay, tries = first_s, 1
        while not self._stop.wait(delay):
            tries += 1
            try:
                self.serve(address)
            except OSError as e:
                now = _bind_problem(address, e)
                if now != reason:
                    log.warning("%s %r: %s; still retrying", key, address, now)
                    reason = now
                else:
                    log.debug("%s %r: try %d: %s", key, address, tries, now)
                delay = min(delay * 2, max_s)
                continue
            if not self._stop.is_set():
                self._say_serving(address, tries)
            return

    def _say_serving(self, address: str, tries: int = 1) -> None:
        host, _ = parse_address(address)
        host = f"[{host}]" if ":" in host else host
        after = f" (bound at try {tries})" if tries > 1 else ""
        log.info("serving metrics on http://%s:%s/metrics%s", host, self.port, after)

    @property
    def port(self) -> int | None:
        """The port the HTTP server listens on, or None when not serving."""
        return int(self._server.server_port) if self._server is not None else None

    def close(self) -> None:
        """Stop the HTTP server, if serving, and any retry to bind one."""
        self._stop.set()
        if self._retry is not None:
            # A retry may sit in a slow DNS lookup: it serves nothing once it returns.
            self._retry.join(timeout=5)
            self._retry = None
        with self._lock:
            self._closed = True
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is not None:
            _shutdown(server, thread)


def _shutdown(server: WSGIServer, thread: threading.Thread | None) -> None:
    server.shutdown()
    server.server_close()
    if thread is not None:
        thread.join(timeout=5)


def _bind_problem(address: str, e: OSError) -> str:
    """Why the metrics address could not be served, in words (no errno numbers)."""
    if isinstance(e, socket.gaierror):
        host, _ = parse_address(address)
        return f"cannot resolve host {host!r}: {e.strerror or e}"
    return f"cannot listen there: {e.strerror or e}"
