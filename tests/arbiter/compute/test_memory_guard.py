# SPDX-License-Identifier: Apache-2.0
"""The out-of-band memory guard: arbiter.compute.memory_guard's decisions, the guardian acting
on them, and a real vgpud on simgpu catching a dlmopen() bypass of libvgpu that allocates past its
slice's limit (real processes, real NVML figures, real SIGKILL)."""
from __future__ import annotations

import contextlib
import json
import os
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

from arbiter.compute import memory_guard
from arbiter.compute.freezer import Freezer
from arbiter.compute.guardian import Guardian
from arbiter.compute.memory_guard import MemoryFinding, MemoryUse
from arbiter.config import Config
from arbiter.daemon.events import EventLog
from arbiter.files.slice_dirs import Regions
from arbiter.model import Gpu, OwnerKind, Request
from arbiter.slices.arbiter import Arbiter
from arbiter.slices.store import Store

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
    pytest.param([use("a", 64 * MiB, {10: 64 * MiB + 128 * MiB})], 128 * MiB, [],
                 id="margin-covers-up-to-it"),
    pytest.param([use("a", 64 * MiB, {10: 100 * MiB, 11: 92 * MiB + 1})], 128 * MiB,
                 [MemoryFinding("a", 0, 192 * MiB + 1, 64 * MiB, 192 * MiB, (10, 11), (10,))],
                 id="margin-per-slice-not-per-process"),
    # Issue 22: 64 processes of 512 MiB in a 1 GiB slice were 0 findings with a margin of
    # 512 MiB per process; per slice they are one, and all but the two that fit go.
    pytest.param([use("a", GiB, {p: 512 * MiB for p in range(100, 164)})], 512 * MiB,
                 [MemoryFinding("a", 0, 32 * GiB, GiB, GiB + 512 * MiB, tuple(range(100, 164)),
                                tuple(range(163, 102, -1)))],
                 id="many-processes-each-within-a-per-process-margin"),
    pytest.param([use("a", GiB, {p: (2 * GiB) // 100 for p in range(100, 200)})],
                 memory_guard.DEFAULT_MARGIN,
                 [MemoryFinding("a", 0, 100 * ((2 * GiB) // 100), GiB,
                                GiB + memory_guard.DEFAULT_MARGIN, tuple(range(100, 200)),
                                tuple(range(199, 155, -1)))],
                 id="100-processes-holding-limit-plus-1GiB"),
    pytest.param([use("a", 64 * MiB, {}), use("b", 64 * MiB, {20: 10 * MiB})], 0, [],
                 id="idle-and-honest"),
    pytest.param([use("a", 64 * MiB, {10: 60 * MiB}, gpu=0),
                  use("a", 64 * MiB, {10: 70 * MiB}, gpu=1)], 0,
                 [MemoryFinding("a", 1, 70 * MiB, 64 * MiB, 64 * MiB, (10,), (10,))],
                 id="per-gpu"),
]


@pytest.mark.parametrize(("uses", "margin", "expected"), FINDINGS)
def test_findings(uses: list[MemoryUse], margin: int, expected: list[MemoryFinding]) -> None:
    assert memory_guard.findings(uses, margin) == expected


def test_defaults_are_the_configs() -> None:
    c = Config()
    assert (c.guard_memory_action, c.guard_memory_margin) == \
        (memory_guard.DEFAULT_ACTION, memory_guard.DEFAULT_MARGIN)
    assert memory_guard.DEFAULT_ACTION == "kill"


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


def test_a_tick_reads_proc_only_when_a_gpu_shows_a_process(arbiter, tmp_path):
    """Attributing pids to slices scans /proc (every process's stat): a tick whose NVML
    readings show no process on any GPU of the slices has nothing to attribute and reads
    none of it, so an idle node's guard costs the allocations beside it nothing; once a
    process shows, it does. Read from the fixture /proc's access times."""
    proc = tmp_path / "proc"
    (proc / "100").mkdir(parents=True)
    stat = proc / "100" / "stat"
    stat.write_text("100 (owner) S 1 1 1 0 -1\n")

    def unread() -> None:
        os.utime(stat, (0, stat.stat().st_mtime))

    def was_read() -> bool:
        return stat.stat().st_atime > 0

    unread()
    stat.read_bytes()
    if not was_read():
        pytest.skip(f"{tmp_path} keeps no access times")
    owned(arbiter, "o", 100, 64 * MiB)
    memory: dict[int, dict[int, int]] = {}
    g = Guardian(arbiter, lambda: {}, memory=lambda: memory, memory_action="flag", proc=proc)
    unread()
    g.tick()
    assert not was_read()
    memory[1] = {100: MiB}  # a process, but on a GPU the slice has no vGPU on
    unread()
    g.tick()
    assert not was_read()
    memory[0] = {100: MiB}
    unread()
    g.tick()
    assert was_read()


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


# --- many small bypasses: the margin is per slice (issue 22) ------------------------------

def _alive(pid: int) -> bool:
    """pid runs (a zombie its shell has not reaped yet holds nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_hundred_small_bypasses_over_the_limit_together_are_caught(tmp_path, simgpu_env):
    """One `vgpu run` slice of 1 GiB, 100 dlmopen() bypasses of 21 MiB each: 2100 MiB, its
    limit + 1 GiB. Each holds far less than a CUDA context; with a margin per process
    (512 MiB each, the old default) they were no finding. With the default margin, once
    per slice, the guard kills the largest holders until the rest fit."""
    v = Vgpud(tmp_path, simgpu_env, {"guard": {"action": "flag", "memory_action": "kill"}})
    v.start()
    each, n, limit = 21 * MiB, 100, GiB
    loop = (f"for i in $(seq {n}); do {LOAD} --queue 0 --alloc {each} --seconds 60 & done; "
            "wait")
    cli = [sys.executable, "-m", "vgpu_cli", "--socket", str(v.socket), "run",
           "--memory", "1Gi", "--", "sh", "-c", loop]
    p = subprocess.Popen(cli, cwd=ROOT, env=v.env, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)
    pids: list[int] = []
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith('{"op":"ready"'):
                pids.append(json.loads(line)["pid"])
                if len(pids) == n:
                    break
        assert len(pids) == n, f"{len(pids)} of {n} bypasses started"
        fits = (limit + memory_guard.DEFAULT_MARGIN) // each     # 54 may stay
        v.wait_for(lambda: sum(map(_alive, pids)) <= fits, timeout=5,
                   what=f"at most {fits} bypasses left")
        (found, *_) = v.events("guard.over_memory")
        assert found["limit"] == limit and found["used"] > limit + memory_guard.DEFAULT_MARGIN
        assert found["allowed"] == limit + memory_guard.DEFAULT_MARGIN
        killed = {q for e in v.events("guard.kill") for q in e["pids"]}
        assert len(killed) >= n - fits and killed <= set(pids)
        time.sleep(1.5)  # three more ticks: the survivors fit, nobody else goes
        assert sum(map(_alive, pids)) == n - len(killed) >= fits - 1
    finally:
        p.kill()
        p.wait(timeout=30)
        for q in pids:
            with contextlib.suppress(OSError):
                os.kill(q, signal.SIGKILL)
        v.close()


# --- escalation: a bypass that comes back (issue 22) --------------------------------------

ESCALATES = [
    pytest.param([], 10.0, 3, 60.0, False, id="none"),
    pytest.param([1.0, 2.0], 3.0, 3, 60.0, False, id="two-of-three"),
    pytest.param([1.0, 2.0, 3.0], 3.0, 3, 60.0, True, id="three-in-the-window"),
    pytest.param([1.0, 2.0, 70.0], 70.0, 3, 60.0, False, id="one-fell-out-of-the-window"),
    pytest.param([1.0, 2.0, 3.0, 4.0], 4.0, 0, 60.0, False, id="after-0-never"),
]


@pytest.mark.parametrize(("times", "now", "after", "window", "due"), ESCALATES)
def test_escalates(times: list[float], now: float, after: int, window: float, due: bool) -> None:
    assert memory_guard.escalates(times, now, after, window) is due


def test_escalation_defaults_are_the_configs() -> None:
    c = Config()
    assert (c.guard_memory_escalate_after, c.guard_memory_escalate_window_s,
            c.guard_memory_escalate_action) == (memory_guard.DEFAULT_ESCALATE_AFTER,
                                                memory_guard.DEFAULT_ESCALATE_WINDOW_S,
                                                memory_guard.DEFAULT_ESCALATE_ACTION)
    assert c.context_reserve == memory_guard.DEFAULT_CONTEXT_RESERVE
    assert memory_guard.DEFAULT_ESCALATE_ACTION in memory_guard.ESCALATE_ACTIONS


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


@pytest.fixture
def respawner() -> Iterator[subprocess.Popen[bytes]]:
    """A shell that starts a `sleep` again as soon as the last one dies (a supervisor)."""
    p = subprocess.Popen(["sh", "-c", "while true; do sleep 60 & wait $!; done"])
    yield p
    for c in _children(p.pid):
        with contextlib.suppress(OSError):
            os.kill(c, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(p.pid, signal.SIGCONT)
    p.kill()
    p.wait(timeout=10)


def _over_until(g: Guardian, a: Arbiter, kind: str, ticks: int = 20) -> list[dict]:
    for _ in range(ticks):
        g.tick()
        if kinds(a, kind):
            break
        time.sleep(0.1)  # the supervisor's turn to start the next one
    return kinds(a, kind)


def test_a_respawned_bypass_gets_its_whole_slice_killed(arbiter, respawner):
    """Each `sleep` the shell starts is reported holding 1 GiB of a 64 MiB slice: the guard
    kills it, the shell starts another; at the third the shell is killed too."""
    sid = owned(arbiter, "loop", respawner.pid, 64 * MiB)
    g = Guardian(arbiter, lambda: {}, memory_action="kill", memory_margin=0,
                 memory=lambda: {0: {c: GiB for c in _children(respawner.pid)}},
                 memory_escalate_after=3, memory_escalate_window_s=60,
                 memory_escalate_action="kill")
    (ev,) = _over_until(g, arbiter, "guard.escalate")
    assert (ev["slice"], ev["action"], ev["findings"]) == (sid, "kill", 3)
    assert "3 memory findings within 60 s" in ev["reason"] and respawner.pid in ev["pids"]
    assert respawner.wait(timeout=10) == -signal.SIGKILL
    assert len({p for e in kinds(arbiter, "guard.kill") for p in e["pids"]}) == 3


def test_without_escalation_the_supervisor_keeps_respawning(arbiter, respawner):
    """The same loop with escalation off: the guard kills one bypass after another and
    the loop lives on, which is what escalation is for."""
    owned(arbiter, "loop", respawner.pid, 64 * MiB)
    g = Guardian(arbiter, lambda: {}, memory_action="kill", memory_margin=0,
                 memory=lambda: {0: {c: GiB for c in _children(respawner.pid)}},
                 memory_escalate_after=0)
    assert _over_until(g, arbiter, "guard.escalate", ticks=12) == []
    assert respawner.poll() is None and len(kinds(arbiter, "guard.kill")) >= 4


def test_escalation_freeze_stops_the_supervisor_and_frees_the_memory(arbiter, cgroup):
    """freeze: the loop's cgroup (only its processes) is frozen for good; the bypass it had
    running is still killed, and no new one starts. Each bypass also computes past its
    10 % share, so the compute guard throttles the cgroup first: its duty cycle is lifted
    (it would thaw the cgroup ten times a second) and not started again."""
    root, path = cgroup
    loop = subprocess.Popen(["sh", "-c", f'echo $$ > {path}/cgroup.procs && '
                             'while true; do sleep 60 & wait $!; done'])
    try:
        deadline = time.monotonic() + 5
        while not _children(loop.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        sid = owned(arbiter, "loop", loop.pid, 64 * MiB)
        g = Guardian(arbiter, lambda: {0: {c: 100 for c in _children(loop.pid)}},
                     action="throttle", memory_action="kill", memory_margin=0,
                     memory=lambda: {0: {c: GiB for c in _children(loop.pid)}},
                     freezer=Freezer(root), memory_escalate_after=3,
                     memory_escalate_window_s=60, memory_escalate_action="freeze")
        (ev,) = _over_until(g, arbiter, "guard.escalate")
        assert (ev["slice"], ev["action"], ev["cgroups"]) == (sid, "freeze", ["/" + path.name])
        assert (path / "cgroup.freeze").read_text().strip() == "1" and loop.poll() is None
        deadline = time.monotonic() + 2  # the kernel reports it once every task stopped
        while not Freezer(root).frozen("/" + path.name):
            assert time.monotonic() < deadline, "the cgroup never froze"
            time.sleep(0.01)
        # A bypass the loop started between the measurement and the freeze is frozen with
        # it: the next findings kill it (a frozen process still dies of SIGKILL).
        for _ in range(4):
            g.tick()
            time.sleep(0.1)
        # Every bypass died (zombies the frozen shell cannot reap), none came after them.
        killed = {p for e in kinds(arbiter, "guard.kill") for p in e["pids"]} | set(ev["pids"])
        assert _children(loop.pid) <= killed
        assert not any(map(_alive, _children(loop.pid)))
        assert len(kinds(arbiter, "guard.escalate")) == 1
        assert kinds(arbiter, "guard.throttle")[0]["resource"] == "compute"
        assert kinds(arbiter, "guard.unthrottle")[-1]["reason"] == "slice escalated"
        for _ in range(20):                             # no duty cycle thaws it any more
            assert (path / "cgroup.freeze").read_text().strip() == "1"
            time.sleep(0.02)
        g.stop()                                        # vgpud stopping does not thaw it
        assert (path / "cgroup.freeze").read_text().strip() == "1"
    finally:
        loop.kill()
        loop.wait(timeout=10)


# --- contexts: what NVML counts per process, charged as context_reserve (issue 22) ------

NVML_CLIENT = TEST_BIN / "nvml_client"
PROBE = TEST_BIN / "vgpu_probe"


def _nvml_used(env: dict[str, str]) -> dict[int, int]:
    """host pid -> the device memory NVML reports for it, from `nvml_client info`."""
    out = subprocess.run([str(NVML_CLIENT), "info"], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    [dev] = json.loads(out)["devices"]
    return {p["pid"]: p["used_memory"] for p in dev["processes"]}


@pytest.mark.parametrize(("context_memory", "expected"), [
    pytest.param(None, memory_guard.DEFAULT_CONTEXT_RESERVE, id="simgpu-default"),
    pytest.param("300Mi", 300 * MiB, id="simgpu-300Mi"),
])
def test_what_nvml_shows_for_a_process_with_only_a_context(simgpu_env, context_memory,
                                                           expected):
    """Measures context_reserve on simgpu's model: two processes that made a context and
    allocated nothing each show what one context holds (DEFAULT_CONTEXT_RESERVE by
    default; per process, so two show it twice)."""
    if context_memory is not None:
        simgpu_env["SIMGPU_CONTEXT_MEMORY"] = context_memory
    procs = [subprocess.Popen([LOAD, "--queue", "0", "--seconds", "30"], env=simgpu_env,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        pids = []
        for p in procs:
            assert p.stdout is not None
            pids.append(json.loads(p.stdout.readline())["pid"])
        used = _nvml_used(simgpu_env)
        assert [used.get(pid, 0) for pid in pids] == [expected, expected]
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


@pytest.mark.parametrize(("reserve", "caught"), [
    pytest.param("64Mi", False, id="reserve-covers-the-context"),
    pytest.param("0", True, id="reserve-short-of-the-context"),
])
def test_an_honest_slice_is_within_its_limit_when_contexts_are_charged(
        tmp_path, simgpu_env, reserve, caught):
    """Eight processes of one 1 GiB slice fill it through libvgpu, on a GPU whose contexts
    hold 64 MiB each: seven hold 32 MiB, the eighth takes what is left. With context_reserve
    at 64Mi libvgpu charges each context against the limit and NVML's sum stays within it:
    no finding. With 0, NVML shows 512 MiB more than libvgpu charged, which the per-slice
    margin does not cover: context_reserve must be at least a context's size on the GPU."""
    simgpu_env["SIMGPU_CONTEXT_MEMORY"] = "64Mi"
    v = Vgpud(tmp_path, simgpu_env, {"defaults": {"context_reserve": reserve},
                                     "guard": {"action": "flag", "memory_action": "flag"}})
    v.start()
    fill = (f"for i in 1 2 3 4 5 6 7; do {PROBE} alloc:mem:{32 * MiB} sleep:5000 & done; "
            f"sleep 1; {PROBE} fill:mem:{16 * MiB} sleep:3000; wait")
    p = subprocess.Popen([sys.executable, "-m", "vgpu_cli", "--socket", str(v.socket), "run",
                          "--memory", "1Gi", "--", "sh", "-c", fill], cwd=ROOT, env=v.env,
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None
        allocs = []
        for line in p.stdout:
            if '"op":"alloc"' in line:
                allocs.append(json.loads(line)["result"])
            if '"op":"fill"' in line:
                fill_line = json.loads(line)
                break
        assert allocs == ["CUDA_SUCCESS"] * 7
        filled = 7 * 32 * MiB + fill_line["count"] * fill_line["bytes_each"]
        contexts = 8 * 64 * MiB if reserve == "64Mi" else 0
        assert GiB - 16 * MiB < filled + contexts <= GiB  # the slice is full, by libvgpu
        time.sleep(1.5)  # three guard ticks
        assert bool(v.events("guard.over_memory")) is caught
        if caught:
            (found,) = v.events("guard.over_memory")
            assert found["used"] == filled + 8 * 64 * MiB > GiB + memory_guard.DEFAULT_MARGIN
    finally:
        p.kill()
        p.wait(timeout=30)
        v.close()


def test_freezer_kill_without_cgroup_kill_freezes_signals_and_thaws(tmp_path, sleeper):
    """Before Linux 5.14 (no cgroup.kill): freeze, SIGKILL every member, thaw. On a fixture
    tree (this kernel has cgroup.kill) with real processes and real signals."""
    a, b = sleeper(), sleeper()
    (tmp_path / "t" / "sub").mkdir(parents=True)
    (tmp_path / "t" / "cgroup.procs").write_text(f"{a.pid}\n")
    (tmp_path / "t" / "sub" / "cgroup.procs").write_text(f"{b.pid}\n")
    (tmp_path / "t" / "cgroup.freeze").write_text("0")
    states = []

    def kill(pid: int, sig: int) -> None:
        states.append((tmp_path / "t" / "cgroup.freeze").read_text())
        os.kill(pid, sig)

    Freezer(tmp_path).kill("/t", kill)
    assert a.wait(timeout=10) == b.wait(timeout=10) == -signal.SIGKILL
    assert states == ["1", "1"]                          # signalled while frozen
    assert (tmp_path / "t" / "cgroup.freeze").read_text() == "0"
