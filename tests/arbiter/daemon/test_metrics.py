# SPDX-License-Identifier: Apache-2.0
"""arbiter.daemon.metrics: counters, the per-scrape GPU/slice gauges, and the real HTTP endpoint."""
from __future__ import annotations

import itertools
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from arbiter.daemon.metrics import SNAPSHOT_REUSE_S, Metrics, Snapshot, parse_address
from arbiter.model import Gpu, Grant, Policy, Priority, Slice

GI, MI = 1 << 30, 1 << 20

GPUS = [
    Gpu(index=0, uuid="GPU-aaaa", name="NVIDIA SimGPU 2GiB", memory=2 * GI, minor=0),
    Gpu(index=1, uuid="GPU-bbbb", name="NVIDIA SimGPU 4GiB", memory=4 * GI, minor=1),
]
SLICES = [
    Slice(id="s1", owner="ctr-1", grants=(Grant(0, "GPU-aaaa", 512 * MI, 30),),
          priority=Priority.HIGH, policy=Policy.BURST,
          labels=(("k8s.vgpu.io/namespace", "ml"), ("k8s.vgpu.io/pod", "train-0"),
                  ("k8s.vgpu.io/container", "trainer"), ("vgpu.io/command", "x"))),
    Slice(id="s2", owner="ctr-2", grants=(Grant(0, "GPU-aaaa", 256 * MI, 20),
                                          Grant(1, "GPU-bbbb", 256 * MI, 20)),
          priority=Priority.LOW),
]

# A pod's slice is named by its namespace, pod and container; others carry them empty.
POD = {"namespace": "ml", "pod": "train-0", "container": "trainer"}
NONE = {"namespace": "", "pod": "", "container": ""}
S1 = {"gpu": "0", "uuid": "GPU-aaaa", "slice": "s1", "owner": "ctr-1", **POD}
S2A = {"gpu": "0", "uuid": "GPU-aaaa", "slice": "s2", "owner": "ctr-2", **NONE}
S2B = {"gpu": "1", "uuid": "GPU-bbbb", "slice": "s2", "owner": "ctr-2", **NONE}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """{(sample name, sorted labels): value} of an exposition text."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(all_: Samples, name: str, **labels: str) -> float:
    return all_[(name, tuple(sorted(labels.items())))]


def scrape(metrics: Metrics) -> Samples:
    return samples(generate_latest(metrics.registry).decode())


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    m = Metrics()
    yield m
    m.close()


def test_counters_and_histogram(metrics: Metrics) -> None:
    metrics.allocation(0.003, "ok")
    metrics.allocation(0.015, "ok")
    metrics.allocation(0.0001, "no_capacity")
    metrics.release("release")
    metrics.release("reconcile")
    metrics.release("reconcile")
    metrics.eviction()
    metrics.eviction(2)
    metrics.drift()
    s = scrape(metrics)
    assert value(s, "vgpu_allocations_total", outcome="ok") == 2
    assert value(s, "vgpu_allocations_total", outcome="no_capacity") == 1
    assert value(s, "vgpu_allocation_seconds_count") == 3
    assert value(s, "vgpu_allocation_seconds_sum") == pytest.approx(0.0181)
    assert value(s, "vgpu_allocation_seconds_bucket", le="0.005") == 2
    assert value(s, "vgpu_allocation_seconds_bucket", le="0.02") == 3
    assert value(s, "vgpu_releases_total", reason="reconcile") == 2
    assert value(s, "vgpu_releases_total", reason="release") == 1
    assert value(s, "vgpu_evictions_total") == 3
    assert value(s, "vgpu_drift_total") == 1


def test_registry_per_instance() -> None:
    a, b = Metrics(), Metrics()              # no "Duplicated timeseries" from a global registry
    a.eviction()
    assert value(scrape(a), "vgpu_evictions_total") == 1
    assert value(scrape(b), "vgpu_evictions_total") == 0
    own = CollectorRegistry()
    assert Metrics(own).registry is own


def test_no_source_exports_no_gauges(metrics: Metrics) -> None:
    assert not any(name.startswith(("vgpu_gpu_", "vgpu_slice_")) for name, _ in scrape(metrics))


def test_snapshot_gauges(metrics: Metrics) -> None:
    snap = Snapshot(
        gpus=GPUS, slices=SLICES,
        gpu_used={0: 700 * MI},                              # GPU 1 not measured this time
        gpu_util={0: 45, 1: 0},
        slice_used={"s1": [400 * MI], "s2": [100 * MI, 50 * MI]},
        slice_compute_used={"s1": [25]},
    )
    calls = []

    def source() -> Snapshot:
        calls.append(1)
        return snap

    metrics.set_source(source)
    s = scrape(metrics)
    assert calls == [1]                                      # computed at scrape time
    g0, g1 = {"gpu": "0", "uuid": "GPU-aaaa"}, {"gpu": "1", "uuid": "GPU-bbbb"}
    assert value(s, "vgpu_gpu_memory_total_bytes", **g0) == 2 * GI
    assert value(s, "vgpu_gpu_memory_total_bytes", **g1) == 4 * GI
    assert value(s, "vgpu_gpu_memory_allocated_bytes", **g0) == 768 * MI
    assert value(s, "vgpu_gpu_memory_allocated_bytes", **g1) == 256 * MI
    assert value(s, "vgpu_gpu_memory_used_bytes", **g0) == 700 * MI
    assert ("vgpu_gpu_memory_used_bytes", tuple(sorted(g1.items()))) not in s
    assert value(s, "vgpu_gpu_compute_allocated_percent", **g0) == 50
    assert value(s, "vgpu_gpu_compute_allocated_percent", **g1) == 20
    assert value(s, "vgpu_gpu_compute_used_percent", **g0) == 45
    assert value(s, "vgpu_gpu_compute_used_percent", **g1) == 0
    assert value(s, "vgpu_gpu_slices", **g0) == 2
    assert value(s, "vgpu_gpu_slices", **g1) == 1

    s1, s2a, s2b = S1, S2A, S2B
    assert value(s, "vgpu_slice_memory_limit_bytes", **s1) == 512 * MI
    assert value(s, "vgpu_slice_memory_limit_bytes", **s2b) == 256 * MI
    assert value(s, "vgpu_slice_memory_used_bytes", **s1) == 400 * MI
    assert value(s, "vgpu_slice_memory_used_bytes", **s2a) == 100 * MI
    assert value(s, "vgpu_slice_memory_used_bytes", **s2b) == 50 * MI
    assert value(s, "vgpu_slice_compute_share_percent", **s2a) == 20
    assert value(s, "vgpu_slice_compute_used_percent", **s1) == 25
    assert ("vgpu_slice_compute_used_percent", tuple(sorted(s2a.items()))) not in s
    assert value(s, "vgpu_slice_info", slice="s1", owner="ctr-1", priority="high",
                 policy="burst", **POD) == 1
    assert value(s, "vgpu_slice_info", slice="s2", owner="ctr-2", priority="low",
                 policy="fixed", **NONE) == 1


def test_gpu_seconds_and_handoffs_from_the_sched_regions(metrics: Metrics) -> None:
    snap = Snapshot(
        gpus=GPUS, slices=SLICES,
        # s1 has run 2.5 s on GPU 0; s2 has an entry on GPU 1 only (none yet on GPU 0).
        slice_gpu_ns={"s1": [2_500_000_000], "s2": [None, 1_000]},
        gpu_handoffs={0: 41},                               # GPU 1's region unreadable
    )
    metrics.set_source(lambda: snap)
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE vgpu_slice_gpu_seconds_total counter" in text
    assert "# TYPE vgpu_gpu_token_handoffs_total counter" in text
    s = samples(text)
    s1, s2a, s2b = S1, S2A, S2B
    assert value(s, "vgpu_slice_gpu_seconds_total", **s1) == 2.5
    assert value(s, "vgpu_slice_gpu_seconds_total", **s2b) == 1e-6
    assert ("vgpu_slice_gpu_seconds_total", tuple(sorted(s2a.items()))) not in s
    assert value(s, "vgpu_gpu_token_handoffs_total", gpu="0", uuid="GPU-aaaa") == 41
    assert ("vgpu_gpu_token_handoffs_total", (("gpu", "1"), ("uuid", "GPU-bbbb"))) not in s
    # The NVML-based gauge stays alongside.
    metrics.set_source(lambda: Snapshot(gpus=GPUS, slices=SLICES,
                                        slice_compute_used={"s1": [25]}))
    s = scrape(metrics)
    assert value(s, "vgpu_slice_compute_used_percent", **s1) == 25
    assert not any(k[0] == "vgpu_slice_gpu_seconds_total" for k in s)


def test_released_slice_disappears() -> None:
    """... at the first scrape after SNAPSHOT_REUSE_S (until then the last snapshot is reused)."""
    now = [100.0]
    metrics = Metrics(CollectorRegistry(), clock=lambda: now[0])
    current = [SLICES]
    metrics.set_source(lambda: Snapshot(gpus=GPUS, slices=current[0]))
    assert any(k[0] == "vgpu_slice_info" for k in scrape(metrics))
    current[0] = []
    now[0] += SNAPSHOT_REUSE_S * 0.9
    assert any(k[0] == "vgpu_slice_info" for k in scrape(metrics))
    now[0] += SNAPSHOT_REUSE_S * 0.2
    s = scrape(metrics)
    assert not any(k[0].startswith("vgpu_slice_") for k in s)
    assert value(s, "vgpu_gpu_slices", gpu="0", uuid="GPU-aaaa") == 0
    assert value(s, "vgpu_gpu_memory_allocated_bytes", gpu="0", uuid="GPU-aaaa") == 0


def test_failing_source_keeps_counters(metrics: Metrics) -> None:
    def broken() -> Snapshot:
        raise RuntimeError("state store closed")

    metrics.set_source(broken)
    metrics.eviction()
    s = scrape(metrics)
    assert value(s, "vgpu_evictions_total") == 1
    assert not any(k[0].startswith("vgpu_gpu_") for k in s)


def test_http_endpoint_on_port_0(metrics: Metrics) -> None:
    metrics.set_source(lambda: Snapshot(gpus=GPUS, slices=SLICES[:1]))
    metrics.allocation(0.002, "ok")
    server = metrics.serve("127.0.0.1:0")
    port = metrics.port
    assert port is not None and port > 0 and server.server_port == port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        s = samples(r.read().decode())
    assert value(s, "vgpu_allocations_total", outcome="ok") == 1
    assert value(s, "vgpu_gpu_slices", gpu="0", uuid="GPU-aaaa") == 1
    metrics.close()
    assert metrics.port is None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


@pytest.mark.parametrize(("address", "expected"), [
    pytest.param("127.0.0.1:9400", ("127.0.0.1", 9400), id="ipv4"),
    pytest.param("[::1]:0", ("::1", 0), id="ipv6"),
    pytest.param("gpu-host:80", ("gpu-host", 80), id="hostname"),
])
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["", "9400", ":9400", "host:", "host:port", "h:70000"],
                         ids=["empty", "port-only", "no-host", "no-port", "word-port", "big"])
def test_parse_address_rejects(address: str) -> None:
    with pytest.raises(ValueError, match="invalid metrics address"):
        parse_address(address)


def test_scrapes_however_many_take_at_most_one_snapshot_a_second(metrics: Metrics) -> None:
    """Issue 22, item 9: a scrape reads every slice's files and NVML; 8 clients scraping as
    fast as they can over real HTTP for 2.5 s cause at most one snapshot per second (each
    took one before: hundreds here), and every scrape is answered."""
    taken: list[float] = []

    def source() -> Snapshot:
        taken.append(time.monotonic())
        time.sleep(0.02)  # what reading the files and NVML costs, roughly
        return Snapshot(gpus=GPUS, slices=SLICES)

    metrics.set_source(source)
    metrics.serve("127.0.0.1:0")
    url = f"http://127.0.0.1:{metrics.port}/metrics"
    answered: list[int] = []
    began = time.monotonic()
    end = began + 2.5

    def client() -> None:
        while time.monotonic() < end:
            with urllib.request.urlopen(url, timeout=10) as r:
                assert b"vgpu_slice_info" in r.read()
            answered.append(1)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answered) > 20, len(answered)
    span = time.monotonic() - began  # the last scrapes may end a little after `end`
    assert len(taken) <= span / SNAPSHOT_REUSE_S + 1, (len(taken), span, len(answered))
    gaps = [b - a for a, b in itertools.pairwise(taken)]
    assert all(g >= SNAPSHOT_REUSE_S * 0.99 for g in gaps), gaps
