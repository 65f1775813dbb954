#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vgpud's Allocate+Release throughput and latency over its unix socket.

Starts its own vgpud on simgpu (4 simulated 16 GiB GPUs) in a temporary
directory on disk (state.db with synchronous=FULL: durable writes included),
then for 1, 8 and 64 concurrent clients (threads, each with its own gRPC
channel) runs Allocate (64Mi, 2% compute) + Release pairs for a fixed time and
reports pairs/s and the p50/p99 latency of one pair, after a baseline of two
Health calls per "pair" (transport and client cost alone). The same again with 50
slices already placed on GPU 0 (2% each: GPU 0's compute is full, so every
placement weighs it and its 50 slices and goes elsewhere). Not a timed test:
the figures depend on the machine; the targets are >= 500 pairs/s and
p99 < 20 ms at 8 clients, and never below the previous release in the same run.

By default the previous release runs beside the tree: --against REF builds that
commit or tag in a temporary git worktree (bench/against.py: the newest v* tag
before HEAD; while there is none, bfd1b41, main on 2026-12-02) and starts its
own vgpud from it with the same Python; each row is measured on both, in
alternating order, --rounds times (medians reported). --against none: the tree
alone. This machine's speed moves by 10-30 % within seconds (another tenant's load), so
rounds are short and many, and the verdict pairs them (round i of each build ran back to
back): the tree is below the other build when the geometric mean of the paired ratios says
so and more rounds went against it than chance makes (a sign test); a mean below with
rounds on both sides is said to be within this run's noise. A last line pools every
Allocate+Release row's rounds: a gap of a few % that no row shows alone. Each round also
reads vgpud's CPU (user + system, its broker included, from /proc) and reports it a pair,
which says whether a gap in the rates is time spent computing or waiting; it is shown
beside the verdict, which stays the rates' and p99s'.

    python3 bench/arbiter.py [--duration 0.5] [--clients 1,8,64] [--dir /var/tmp]
                             [--against REF|none] [--rounds 10]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from arbiter.proto import vgpu_pb2 as pb  # noqa: E402
from arbiter.proto import vgpu_pb2_grpc  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from against import (  # noqa: E402
    NONE,
    PREVIOUS_FALLBACK,
    Tree,
    built_tree,
    exit_on_sigterm,
    previous_release,
    start_vgpud,
    this_tree,
)
from paired import against, chance_of, gmean, spread, worse_past_noise  # noqa: E402
from vgpud_proc import preset, request, stop_vgpud, tree_cpu  # noqa: E402

TARGET_RATE = 500.0   # pairs/s at 8 clients
TARGET_P99_MS = 20.0  # at 8 clients
PRESET = 50


@dataclass
class Result:
    """One measurement: a scenario at one concurrency on one build."""

    scenario: str
    clients: int
    pairs: int
    errors: int
    seconds: float
    latencies: list[float]
    build: str = "tree"
    cpu_s: float = 0.0  # vgpud's CPU (and its broker's) while it ran, from /proc

    @property
    def rate(self) -> float:
        return self.pairs / self.seconds if self.seconds else 0.0

    @property
    def cpu_us(self) -> float:
        """vgpud's CPU a pair in microseconds (nan with no pairs or no CPU measured)."""
        return 1e6 * self.cpu_s / self.pairs if self.pairs and self.cpu_s else float("nan")

    def pct(self, q: float) -> float:
        """Latency percentile in ms (nearest rank)."""
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return 1000 * xs[min(len(xs) - 1, max(0, round(q * len(xs)) - 1))]


@dataclass
class Row:
    """One table row: the rounds of a scenario at one concurrency on one build, by median."""

    scenario: str
    clients: int
    build: str
    rounds: list[Result]

    @property
    def pairs(self) -> int:
        return sum(r.pairs for r in self.rounds)

    @property
    def errors(self) -> int:
        return sum(r.errors for r in self.rounds)

    @property
    def rate(self) -> float:
        return statistics.median(r.rate for r in self.rounds)

    def pct(self, q: float) -> float:
        return statistics.median(r.pct(q) for r in self.rounds)

    @property
    def cpu_us(self) -> float:
        return statistics.median(r.cpu_us for r in self.rounds)


def measure(sock: Path, scenario: str, clients: int, duration: float,
            baseline: bool = False, build: str = "tree", pid: int = 0) -> Result:
    """clients threads, each with its own channel, loop Allocate+Release for duration;
    with pid, vgpud's CPU (tree_cpu) from the start to the last pair's end."""
    connected, start = threading.Barrier(clients + 1), threading.Barrier(clients + 1)
    stop = threading.Event()
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    tag = "".join(c if c.isalnum() else "_" for c in scenario)

    def client(n: int) -> None:
        with grpc.insecure_channel(f"unix:{sock}") as ch:
            stub = vgpu_pb2_grpc.ArbiterStub(ch)
            stub.Health(pb.HealthRequest(), timeout=10)  # connect before the clock starts
            connected.wait()
            start.wait()
            i = 0
            while not stop.is_set():
                owner = f"bench-{tag}-{clients}-{n}-{i}"
                i += 1
                t0 = time.perf_counter()
                if baseline:  # two round trips that do no arbiter work: the transport
                    stub.Health(pb.HealthRequest(), timeout=10)
                    stub.Health(pb.HealthRequest(), timeout=10)
                    lat[n].append(time.perf_counter() - t0)
                    continue
                try:
                    r = stub.Allocate(request(owner), timeout=10)
                    stub.Release(pb.ReleaseRequest(id=r.slice.id), timeout=10)
                except grpc.RpcError as e:
                    errors[n] += 1
                    if errors[n] == 1:
                        print(f"bench: client {n}: {e.code().name}: {e.details()}",
                              file=sys.stderr)
                    with_owner_release(stub, owner)
                    continue
                lat[n].append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    for t in threads:
        t.start()
    connected.wait()
    cpu0 = tree_cpu(pid) if pid else 0.0
    start.wait()
    t0 = time.perf_counter()
    time.sleep(duration)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    cpu = tree_cpu(pid) - cpu0 if pid else 0.0
    flat = [x for xs in lat for x in xs]
    return Result(scenario, clients, len(flat), sum(errors), elapsed, flat, build, cpu)


def with_owner_release(stub: vgpu_pb2_grpc.ArbiterStub, owner: str) -> None:
    with contextlib.suppress(grpc.RpcError):
        stub.Release(pb.ReleaseRequest(owner=owner), timeout=10)


def table(results: list[Row]) -> str:
    head = ("scenario", "clients", "build", "pairs", "pairs/s", "p50 ms", "p99 ms", "cpu us",
            "errors", "target")
    rows = []
    for r in results:
        target = ""
        if r.clients == 8 and r.scenario != "2x Health":
            ok = r.rate >= TARGET_RATE and r.pct(0.99) < TARGET_P99_MS
            target = (f">= {TARGET_RATE:.0f}/s, p99 < {TARGET_P99_MS:.0f} ms: "
                      f"{'met' if ok else 'MISSED'}")
        rows.append((r.scenario, str(r.clients), r.build, str(r.pairs), f"{r.rate:.0f}",
                     f"{r.pct(0.50):.2f}", f"{r.pct(0.99):.2f}", f"{r.cpu_us:.0f}",
                     str(r.errors), target))
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    return "\n".join("  ".join(c.rjust(w) if 0 < i < 9 and i != 2 else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
                     for row in (head, *rows))


def paired(tree: Row, ref: Row) -> tuple[list[float], list[float]]:
    """Round by round (round i of each build ran back to back), the tree's pairs/s and p99
    over the other build's."""
    pairs = list(zip(tree.rounds, ref.rounds, strict=False))
    return ([t.rate / r.rate for t, r in pairs if r.rate],
            [t.pct(0.99) / r.pct(0.99) for t, r in pairs if r.pct(0.99)])


def paired_cpu(tree: Row, ref: Row) -> list[float]:
    """Round by round, the tree's vgpud CPU a pair over the other build's (rounds with
    CPU measured on both)."""
    return [t.cpu_us / r.cpu_us for t, r in zip(tree.rounds, ref.rounds, strict=False)
            if t.cpu_us > 0 and r.cpu_us > 0]


def verdict(tree: Row, ref: Row) -> str:
    """Never below the other build, from the paired rounds' ratios (their geometric mean:
    pairs/s at least x1.00, p99 at most x1.00).

    met: the means say so. MISSED: they do not, and the rounds that went against the tree
    are more than this machine's noise makes by chance (bench/paired.py: a sign test, with
    5 rounds all 5, with 10 rounds 9). Otherwise "within this run's noise": a machine whose
    load moves between rounds moves one build's round, not the other's, and a same-build
    run (bench --against HEAD) lands on either side by a few %."""
    rates, p99s = paired(tree, ref)
    if gmean(rates) >= 1.0 and gmean(p99s) <= 1.0:
        return "met"
    if (worse_past_noise(rates, higher_is_worse=False)
            or worse_past_noise(p99s, higher_is_worse=True)):
        return "MISSED"
    return "within this run's noise"


def _beside(rows: list[Row], ref: str) -> list[tuple[Row, Row]]:
    """Each Allocate+Release row of the tree with the same row of build `ref`."""
    by = {(r.scenario, r.clients, r.build): r for r in rows}
    return [(r, by[(r.scenario, r.clients, ref)]) for r in rows
            if r.build == "tree" and r.scenario != "2x Health"
            and (r.scenario, r.clients, ref) in by]


def comparison(rows: list[Row], builds: list[str]) -> list[str]:
    """Per Allocate+Release row, the tree against the other build: the geometric mean of
    the paired rounds' ratios, their range, how many went against the tree, and the
    verdict (never below it: at least its pairs/s, at most its p99; see verdict())."""
    if len(builds) < 2:
        return []
    ref = builds[1]
    out = []
    for r, other in _beside(rows, ref):
        rates, p99s = paired(r, other)
        cpus = paired_cpu(r, other)
        cpu = f", CPU a pair x{gmean(cpus):.2f}{spread(cpus, higher_is_worse=True)}" \
            if cpus else ""
        out.append(f"tree / {ref}, {r.scenario}, {r.clients} clients: pairs/s x{gmean(rates):.2f}"
                   f"{spread(rates, higher_is_worse=False)}, p99 x{gmean(p99s):.2f}"
                   f"{spread(p99s, higher_is_worse=True)}{cpu} "
                   f"(never below {ref}: {verdict(r, other)})")
    out += pooled(rows, ref)
    return out


def pooled(rows: list[Row], ref: str) -> list[str]:
    """Every Allocate+Release row's paired rounds together: a gap of a few % that no row
    shows past its noise still goes the same way in most rounds, and this says whether
    more went against the tree than chance makes. The same for vgpud's CPU a pair: whether
    the tree computes more for an answer, whatever it waits on."""
    beside = _beside(rows, ref)
    rates = [x for r, other in beside for x in paired(r, other)[0]]
    if len(rates) < 2:
        return []
    worse = against(rates, higher_is_worse=False)
    below = worse_past_noise(rates, higher_is_worse=False)
    out = [f"tree / {ref}, all Allocate+Release rows: pairs/s x{gmean(rates):.2f}, "
           f"{worse} of {len(rates)} paired rounds worse "
           f"(chance {chance_of(worse, len(rates)):.2g}: "
           f"{'below' if below else 'not below'} {ref} past this run's noise)"]
    cpus = [x for r, other in beside for x in paired_cpu(r, other)]
    if len(cpus) >= 2:
        more = against(cpus, higher_is_worse=True)
        costlier = worse_past_noise(cpus, higher_is_worse=True)
        out.append(f"tree / {ref}, all Allocate+Release rows: vgpud CPU a pair "
                   f"x{gmean(cpus):.2f}, {more} of {len(cpus)} paired rounds more "
                   f"(chance {chance_of(more, len(cpus)):.2g}: "
                   f"{'more' if costlier else 'not more'} than {ref} past this run's noise)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog=f"The previous release is the newest v* tag before HEAD; with none tagged, "
               f"{PREVIOUS_FALLBACK} (main on 2026-12-02). Now: {previous_release()}.")
    ap.add_argument("--duration", type=float, default=0.5, help="seconds per measurement")
    ap.add_argument("--clients", default="1,8,64", help="concurrency levels, comma separated")
    ap.add_argument("--dir", default="/var/tmp",
                    help="where the temporary state dir goes (a disk, not tmpfs, for fsync)")
    ap.add_argument("--run-dir-parent", default="/dev/shm",
                    help="where the run dir (region files) goes: tmpfs, as /run is in production")
    ap.add_argument("--against", default=None, metavar="REF",
                    help="a commit or tag to build in a temporary worktree and measure beside "
                         "the tree (default: the previous release); 'none': the tree alone")
    ap.add_argument("--rounds", type=int, default=10,
                    help="measurements of each row on each build, alternating (medians shown; "
                         "round i of each build ran back to back, and the verdict pairs them)")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = ap.parse_args()
    try:
        levels = [int(x) for x in args.clients.split(",")]
    except ValueError:
        ap.error(f"--clients {args.clients!r}: not a comma-separated list of integers")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: must be at least 1")
    ref = previous_release() if args.against is None else args.against
    exit_on_sigterm()
    with contextlib.ExitStack() as stack:
        trees = [this_tree()]
        if ref != NONE:
            trees.append(stack.enter_context(built_tree(ref, parent=args.dir)))
        rows, fs = run(trees, levels, args, stack)
    cmd = shlex.join([Path(sys.executable).name, "bench/arbiter.py", *sys.argv[1:]])
    print(f"vgpud Allocate+Release over a unix socket; {os.cpu_count()} CPUs; state dir on {fs};"
          f" {args.duration:g}s per row, {args.rounds} round(s) per build")
    if len(trees) > 1:
        print(f"builds: tree = this checkout as it is; {trees[1].label} = "
              f"{trees[1].commit[:12]}, built in a worktree; rows alternate between them")
    print(table(rows))
    for line in comparison(rows, [t.label for t in trees]):
        print(line)
    print("2x Health: two round trips without arbiter work, the ceiling the transport and "
          "this Python client allow (the baseline)")
    print("cpu us: vgpud's CPU a pair (user + system, its broker included, from /proc), "
          "the median of the rounds")
    print(f"command: {cmd}")
    if args.json:
        print(json.dumps([{"build": r.build, "scenario": r.scenario, "clients": r.clients,
                           "pairs": r.pairs, "pairs_per_s": round(r.rate, 1),
                           "p50_ms": round(r.pct(0.5), 3), "p99_ms": round(r.pct(0.99), 3),
                           "cpu_us_per_pair": round(r.cpu_us, 1), "errors": r.errors}
                          for r in rows], indent=2))
    return 0


def run(trees: list[Tree], levels: list[int], args: argparse.Namespace,
        stack: contextlib.ExitStack) -> tuple[list[Row], str]:
    """Start each build's vgpud, measure every row on each (alternating which goes first),
    stop them; (the rows, the state dir's filesystem)."""
    socks: dict[str, Path] = {}
    pids: dict[str, int] = {}
    fs = ""
    for tree in trees:
        tmp = Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="vgpu-bench-", dir=args.dir)))
        run_dir = Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="vgpu-bench-run-", dir=args.run_dir_parent)))
        proc, sock = start_vgpud(tree, tmp, run_dir)
        stack.callback(stop_vgpud, proc, run_dir)  # before the directories go (LIFO)
        socks[tree.label] = sock
        pids[tree.label] = proc.pid
        fs = fs or subprocess.run(["stat", "-f", "-c", "%T", str(tmp)], capture_output=True,
                                  text=True).stdout.strip()
    rows: list[Row] = []
    turn = 0

    def scenario(name: str, baseline: bool = False) -> None:
        nonlocal turn
        for n in levels:
            got: dict[str, list[Result]] = {t.label: [] for t in trees}
            for _ in range(args.rounds):
                order = trees if turn % 2 == 0 else trees[::-1]
                turn += 1
                for t in order:
                    got[t.label].append(measure(socks[t.label], name, n, args.duration,
                                                baseline=baseline, build=t.label,
                                                pid=pids[t.label]))
            rows.extend(Row(name, n, t.label, got[t.label]) for t in trees)

    scenario("2x Health", baseline=True)
    scenario("empty")
    for t in trees:
        preset(socks[t.label], PRESET)
    scenario(f"{PRESET} on GPU 0")
    return rows, fs


if __name__ == "__main__":
    sys.exit(main())
