# SPDX-License-Identifier: Apache-2.0
"""The out-of-band memory guard: arbiter.memguard's decisions, the guardian acting on them,
and a real vgpud on simgpu catching a dlmopen() bypass of libvgpu that allocates past its
slice's limit (real processes, real NVML figures, real SIGKILL)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import ROOT, TEST_BIN
from support.vgpud_harness import Vgpud

from arbiter import memguard
from arbiter.config import Config
from arbiter.core import Arbiter
from arbiter.events import EventLog
from arbiter.freezer import Freezer
from arbiter.guardian import Guardian
from arbiter.memguard import MemoryFinding, MemoryUse
from arbiter.model import Gpu, OwnerKind, Request
from arbiter.regions import Regions
from arbiter.state import Store

MiB = 1 << 20
GiB = 1 << 30
LOAD = str(TEST_BIN / "dlmopen_load")


def use(sid: str, limit: int, pids: dict[int, int], gpu: int = 0) -> MemoryUse:
    return MemoryUse(sid, gpu, limit, pids)


# --- decisions: a table -------------------------------------------------------------------

FINDINGS = [
    pytest.param([use("a", 64 * MiB, {10: 64 * MiB})], 0, [], id="at-the-limit-is-not"),
    pytest.param([use("a", 64 * MiB, {10: 64 * MiB + 1})], 0,
                 [MemoryFinding("a", 0, 64 * MiB + 1, 64 * MiB, 64 * MiB, (10,), (10,))],
                 id="one-byte-over"),
    pytest.param([use("a", 64 * MiB, {10: GiB, 11: 8 * MiB, 12: 0})], 0,
                 [MemoryFinding("a", 0, GiB + 8 * MiB, 64 * MiB, 64 * MiB, (10, 11), (10,))],
                 id="largest-goes-honest-small-stays"),
    pytest.param([use("a", 64 * MiB, {10: 40 * MiB, 11: 40 * MiB, 12: 40 * MiB})], 0,
                 [MemoryFinding("a", 0, 120 * MiB, 64 * MiB, 64 * MiB, (10, 11, 12), (12, 11))],
                 id="as-many-as-it-takes"),
    pytest.param([use("a", 64 * MiB, {10: 64 * MiB + 500 * MiB})], 512 * MiB, [],
                 id="margin-covers-one-context"),
    pytest.param([use("a", 64 * MiB, {10: 500 * MiB, 11: 500 * MiB})], 512 * MiB, [],
                 id="margin-per-process"),
    pytest.param([use("a", 64 * MiB, {10: 1200 * MiB, 11: 100 * MiB})], 512 * MiB,
                 [MemoryFinding("a", 0, 1300 * MiB, 64 * MiB, 64 * MiB + 1024 * MiB, (10, 11),
                                (10,))],
                 id="margin-over"),
    pytest.param([use("a", 64 * MiB, {}), use("b", 64 * MiB, {20: 10 * MiB})], 0, [],
                 id="idle-and-honest"),
    pytest.param([use("a", 64 * MiB, {10: 60 * MiB}, gpu=0),
                  use("a", 64 * MiB, {10: 70 * MiB}, gpu=1)], 0,
                 [MemoryFinding("a", 1, 70 * MiB, 64 * MiB, 64 * MiB, (10,), (10,))],
                 id="per-gpu"),
]


@pytest.mark.parametrize(("uses", "margin", "expected"), FINDINGS)
def test_findings(uses: list[MemoryUse], margin: int, expected: list[MemoryFinding]) -> None:
    assert memguard.findings(uses, margin) == expected


def test_defaults_are_the_configs() -> None:
    c = Config()
    assert (c.guard_memory_action, c.guard_memory_margin) == \
        (memguard.DEFAULT_ACTION, memguard.DEFAULT_MARGIN)
    assert memguard.DEFAULT_ACTION == "kill"


# --- the guardian with a fake NVML, real processes, real signals -------------------------

GPUS = [Gpu(0, "GPU-0", "sim", 16 * GiB, 0)]


@pytest.fixture
def arbiter(tmp_path: Path) -> Iterator[Arbiter]:
    store = Store(tmp_path / "state")
    a = Arbiter(gpus=GPUS, store=store, regions=Regions(tmp_path / "run"), events=EventLog(None))
    a.start()
    yield a
    store.close()


def kinds(a: Arbiter, kind: str) -> list[dict]:
    return [e for e in a.events.recent() if e["kind"] == kind]  # type: ignore[attr-defined]


def owned(a: Arbiter, owner: str, pid: int, limit: int) -> str:
    return a.allocate(Request(owner=owner, memory=limit, compute=10,
                              owner_kind=OwnerKind.PROCESS, owner_pid=pid)).slice.id


@pytest.mark.parametrize("action", ["flag", "kill"])
def test_guardian_confirms_then_acts_once_per_episode(arbiter, sleeper, action):
    hog, honest = sleeper(), sleeper()
    sid = owned(arbiter, "hog", hog.pid, 64 * MiB)
    owned(arbiter, "honest", honest.pid, 64 * MiB)
    memory = {0: {hog.pid: GiB, honest.pid: 64 * MiB}}
    g = Guardian(arbiter, lambda: {}, memory=lambda: memory, memory_action=action,
                 memory_margin=0)
    assert g.tick().memory == []                    # one measurement is not yet a finding
    (f,) = g.tick().memory
    assert (f.slice_id, f.used, f.limit, f.victims) == (sid, GiB, 64 * MiB, (hog.pid,))
    g.tick()
    (ev,) = kinds(arbiter, "guard.over_memory")     # one event per episode
    assert (ev["slice"], ev["pids"], ev["action"]) == (sid, [hog.pid], action)
    if action == "kill":
        assert hog.wait(timeout=10) == -signal.SIGKILL
        assert [e["pids"] for e in kinds(arbiter, "guard.kill")] == [[hog.pid]]
        assert kinds(arbiter, "guard.kill")[0]["resource"] == "memory"
    else:
        assert hog.poll() is None and kinds(arbiter, "guard.kill") == []
    assert honest.poll() is None
    # Back within the limit: the episode ends, the next one is reported anew.
    memory[0] = {honest.pid: 64 * MiB}
    g.tick()
    memory[0] = {honest.pid: 65 * MiB}
    g.tick()
    g.tick()
    assert [e["slice"] for e in kinds(arbiter, "guard.over_memory")][-1] != sid
    if action == "kill":
        assert honest.wait(timeout=10) == -signal.SIGKILL


def test_a_blip_of_one_measurement_is_not_a_finding(arbiter, sleeper):
    p = sleeper()
    owned(arbiter, "p", p.pid, 64 * MiB)
    readings = iter([{0: {p.pid: GiB}}, {0: {p.pid: 10 * MiB}}, {0: {p.pid: GiB}},
                     {0: {p.pid: 10 * MiB}}])
    g = Guardian(arbiter, lambda: {}, memory=lambda: next(readings), memory_action="kill",
                 memory_margin=0)
    for _ in range(4):
        assert g.tick().memory == []
    assert p.poll() is None and kinds(arbiter, "guard.over_memory") == []


def test_memory_of_processes_outside_the_slice_is_not_counted(arbiter, sleeper):
    """NVML names a stranger holding 1 GiB: nobody's slice is over, nobody is killed."""
    owner, stranger = sleeper(), sleeper()
    owned(arbiter, "o", owner.pid, 64 * MiB)
    g = Guardian(arbiter, lambda: {}, memory=lambda: {0: {stranger.pid: GiB, owner.pid: MiB}},
                 memory_action="kill", memory_margin=0)
    for _ in range(3):
        assert g.tick().memory == []
    assert stranger.poll() is None and owner.poll() is None


def test_memory_throttle_holds_the_cgroup_until_within_the_limit(arbiter, tmp_path):
    """On a fixture cgroup tree and /proc: freeze at the least run fraction, lift when it fits."""
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    (proc / "100").mkdir(parents=True)
    (proc / "100" / "stat").write_text("100 (hog) S 1 1 1 0 -1\n")
    (proc / "100" / "cgroup").write_text("0::/tenant\n")
    (cg / "tenant").mkdir(parents=True)
    (cg / "tenant" / "cgroup.procs").write_text("100\n")
    (cg / "tenant" / "cgroup.freeze").write_text("0")
    sid = owned(arbiter, "hog", 100, 64 * MiB)
    memory = {0: {100: GiB}}
    g = Guardian(arbiter, lambda: {}, memory=lambda: memory, memory_action="throttle",
                 memory_margin=0, freezer=Freezer(cg), proc=proc)
    try:
        g.tick()
        g.tick()
        (ev,) = kinds(arbiter, "guard.throttle")
        assert (ev["slice"], ev["cgroup"], ev["resource"]) == (sid, "/tenant", "memory")
        memory[0] = {100: 32 * MiB}
        g.tick()
        (lift,) = kinds(arbiter, "guard.unthrottle")
        assert lift["reason"] == "within its memory limit"
        assert (cg / "tenant" / "cgroup.freeze").read_text() == "0"
    finally:
        g.stop()


def test_memory_throttle_without_a_freezer_is_refused_once_per_episode(arbiter, sleeper):
    p = sleeper()
    owned(arbiter, "p", p.pid, 64 * MiB)
    g = Guardian(arbiter, lambda: {}, memory=lambda: {0: {p.pid: GiB}},
                 memory_action="throttle", memory_margin=0, freezer=None)
    for _ in range(5):
        g.tick()
    (refused,) = kinds(arbiter, "guard.throttle_refused")
    assert refused["resource"] == "memory" and "freezer" in refused["reason"]
    assert len(kinds(arbiter, "guard.over_memory")) == 1 and p.poll() is None


# --- a real vgpud: a dlmopen() bypass allocating past its limit ---------------------------

class Tenant:
    """`vgpu run --memory LIMIT -- dlmopen_load --queue 0 --alloc BYTES` (libvgpu bypassed)."""

    def __init__(self, v: Vgpud, limit: str, alloc: int, seconds: float = 30,
                 cgroup: Path | None = None) -> None:
        cli = [sys.executable, "-m", "vgpu_cli", "--socket", str(v.socket), "run",
               "--memory", limit, "--", LOAD, "--queue", "0", "--alloc", str(alloc),
               "--seconds", str(seconds)]
        if cgroup is not None:  # the shell joins the cgroup, then becomes vgpu run
            cli = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *cli]
        self.proc = subprocess.Popen(cli, cwd=ROOT, env=v.env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.ready: dict = {}
        self.ready_at = 0.0
        self._event = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith('{"op":"ready"'):
                self.ready, self.ready_at = json.loads(line), time.monotonic()
                self._event.set()

    def wait_ready(self, timeout: float = 30) -> int:
        if not self._event.wait(timeout):
            self.proc.kill()
            raise AssertionError(f"no ready line: {self.proc.communicate()[1]}")
        return int(self.ready["pid"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def vgpud(tmp_path: Path, simgpu_env: dict[str, str]) -> Iterator:
    made: list[Vgpud] = []

    def make(**guard: object) -> Vgpud:
        # The compute guard only flags here: these tenants launch nothing anyway.
        v = Vgpud(tmp_path, simgpu_env, {"guard": {"action": "flag", "memory_margin": 0,
                                                   **guard}})
        made.append(v)
        return v.start()

    yield make
    for v in made:
        v.close()


def test_kill_catches_a_dlmopen_bypass_past_its_limit_within_2s(vgpud):
    v = vgpud(memory_action="kill")
    t = Tenant(v, "64Mi", GiB)
    try:
        pid = t.wait_ready()
        assert t.ready["allocated"] == GiB        # libvgpu (64 MiB) never saw it
        killed = v.wait_for(lambda: v.events("guard.kill"), timeout=10, what="guard.kill")[0]
        caught = time.monotonic() - t.ready_at
        assert caught <= 2.0, f"killed after {caught:.2f} s"
        assert killed["pids"] == [pid] and killed["resource"] == "memory"
        assert t.proc.wait(timeout=10) == 128 + 9  # vgpu run reports its child's SIGKILL
        (found,) = v.events("guard.over_memory")
        assert (found["used"], found["limit"], found["pids"]) == (GiB, 64 * MiB, [pid])
    finally:
        t.close()


def test_flag_reports_the_bypass_and_leaves_it_running(vgpud):
    v = vgpud(memory_action="flag")
    t = Tenant(v, "64Mi", 256 * MiB)
    try:
        pid = t.wait_ready()
        found = v.wait_for(lambda: v.events("guard.over_memory"), timeout=10,
                           what="guard.over_memory")[0]
        caught = time.monotonic() - t.ready_at
        assert caught <= 2.0, f"flagged after {caught:.2f} s"
        assert (found["pids"], found["action"]) == ([pid], "flag")
        time.sleep(1.0)
        assert t.proc.poll() is None
        assert len(v.events("guard.over_memory")) == 1    # one event per episode
        assert v.events("guard.kill") == []
    finally:
        t.close()


def test_a_process_within_its_limit_is_left_alone(vgpud):
    v = vgpud(memory_action="kill")
    t = Tenant(v, "64Mi", 48 * MiB, seconds=2.5)
    try:
        t.wait_ready()
        assert t.proc.wait(timeout=30) == 0
        assert v.events("guard.over_memory") == [] and v.events("guard.kill") == []
    finally:
        t.close()



def test_throttle_freezes_the_bypass_and_vgpud_thaws_it(vgpud, cgroup):
    root, path = cgroup
    v = vgpud(memory_action="throttle", cgroup_root=str(root))
    t = Tenant(v, "64Mi", GiB, cgroup=path)
    try:
        t.wait_ready()
        held = v.wait_for(lambda: v.events("guard.throttle"), timeout=10,
                          what="guard.throttle")[0]
        caught = time.monotonic() - t.ready_at
        assert caught <= 2.0, f"throttled after {caught:.2f} s"
        assert (held["cgroup"], held["resource"]) == ("/" + path.name, "memory")
        freezer = Freezer(root)
        deadline = time.monotonic() + 2
        frozen = False
        while not frozen and time.monotonic() < deadline:
            frozen = freezer.frozen("/" + path.name)
            time.sleep(0.01)
        assert frozen
        assert t.proc.poll() is None                  # held, not killed: it keeps its memory
        assert v.stop() == 0                          # vgpud never leaves it frozen
        assert (path / "cgroup.freeze").read_text().strip() == "0"
        assert v.events("guard.unthrottle")[-1]["reason"] == "vgpud stopping"
    finally:
        t.close()
