# SPDX-License-Identifier: Apache-2.0
"""A hostile tenant against compute, end to end on real runc (issue 9's first test).

One vGPU container (fixed 20 %) runs build/tests/scribble, which writes random words,
all-ones, far-future times and forgeries at every offset of every file vgpu mounted
into it, truncates them, zeroes their magic or floods the scheduling directory (one
mode per test, one per finding of issue 9), beside its own greedy load. Two neighbour
containers on the same GPU run meanwhile: a greedy load in a fixed 40 % slice and a
step loop (8 kernels of 500 us, synced, then 2 ms of CPU work: ~65 % of the GPU
alone) in a fixed 30 % slice. Every container starts through vgpu-runtime on runc,
against a real vgpud (and its vgpu-broker) on simgpu.

The neighbours run a calm half, then scribble starts. Each test asserts: both
neighbours exit 0, the attack costs neither more than COST against its own calm half,
and each keeps at least FLOOR of its share, at most TOL above it; the attacker gets no more
than its own; the GPU's file refused every write (EROFS/EACCES) and is whole; the
broker still lists each slice with vgpud's settings and never took on a made-up
slice; vgpud answers (mid-attack too) and the broker is the same process it was.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from support.gpu_loads import read_trace
from support.hostile import REFUSED, SCRIBBLE, Host
from support.measure import timing

from arbiter.files.sched_files import BROKER_LOCK_NAME, open_sched, slice_key_of

pytestmark = [pytest.mark.skipif(shutil.which("runc") is None or os.geteuid() != 0,
                                 reason="needs runc and root (real containers)"),
              pytest.mark.timing]   # the neighbours' shares are measured


LEAD_S = 3.0       # three containers are up by then on a loaded 2-core VM
SECONDS = 8.0      # the neighbours' load window: a calm half, then the attack
WARM_S = 1.0       # the calm half is measured from here (every slice has settled) ...
ATTACK_S = 4.0     # ... to here, when scribble starts
SETTLE_S = 0.5     # the attacked half is measured from ATTACK_S + SETTLE_S to the end
TOL = 4.0          # percentage points (as tests/support/measure.py's): the attack costs a
                   # neighbour no more than this against its own calm half
COST = 1.5 * TOL   # what the attack may cost a neighbour against its calm half: the
                   # scribbler's CPU use alone (mode "none" of scribble) moves a neighbour
                   # by -1..2 pp on the 2-core VM, the lease attack by -2..4 pp (measured).
                   # Before the broker latched drain reports per hold, the attacker's
                   # missing tails made its neighbours pay 50 ms penalties: 5-9 pp.
OVER = 1.5         # and a fixed neighbour gets no more than its share: the credit it may
                   # have saved (at most 20 ms) spent in the 3.5 s window is 0.6 pp, and
                   # launches count at launch time. (A tenant that made the broker lose its
                   # neighbours' charges showed as 46 % of a fixed 40, which the old bound
                   # of share + TOL let pass.)
FLOOR = 0.5        # and leaves it at least this part of its share (a stall shows at once).
                   # Not tighter: the calm half itself is short of the share beside greedy
                   # fixed neighbours on a loaded 2-core VM (step loop fixed 30: 19-26 %,
                   # greedy fixed 40: 33-39 %; host processes without containers show the
                   # same), an accuracy matter of the scheduler
                   # (tests/libvgpu/test_compute_accuracy.py), which the calm-versus-attacked
                   # comparison does not depend on.

GREEDY = ("greedy", 40, "--kernel busy_1000us")
STEP = ("step", 30, "--kernel busy_500us --sync-every 8 --cpu-gap-us 2000")
ATTACKER_SHARE = 20
FIXED, NORMAL = 0, 1   # enum vgpu_policy / vgpu_priority

MODES = ["lease", "priority", "index", "truncate", "magic", "yield", "full"]


def share_of(path: Path, a: int, b: int) -> float:
    """Percent of [a, b) the launches traced in `path` occupied the GPU."""
    return read_trace(path).share(a, b)


def first_launch(path: Path) -> int:
    t = read_trace(path).t
    return min(t) if t else 0


def entries(gpu: Path) -> dict[int, tuple[int, int, int]]:
    """key -> (share, priority, policy) of every slice the broker lists."""
    with open_sched(gpu) as s:
        snap = s.snapshot()
    return {e.key: (e.share, e.priority, e.policy) for e in snap.entries if e.key}


def broker_beat(gpu: Path) -> tuple[int, int]:
    with open_sched(gpu) as s:
        snap = s.snapshot()
    return snap.broker_pid, snap.broker_beat_ns


@pytest.mark.parametrize("mode", MODES)
@timing
def test_hostile_tenant_cannot_touch_neighbours_compute(tmp_path, mode):
    """Runs again (a fresh vgpud, fresh containers) if a run fails, as the timing tests of
    tests/libvgpu/test_compute.py do: on the 2-core VM nine busy threads contend (three loads,
    their holder threads, the broker, vgpud, the attacker), and a holder whose process
    waits for a CPU holds the token with the GPU idle. What the attack does fails twice."""
    host = Host(tmp_path)
    try:
        _attack(host, mode)
    finally:
        host.close()


def _attack(host: Host, mode: str) -> None:
    start = time.monotonic_ns() + int(LEAD_S * 1e9)
    until = start + int(SECONDS * 1e9)
    calm = (start + int(WARM_S * 1e9), start + int(ATTACK_S * 1e9))
    attack_at = start + int(ATTACK_S * 1e9)
    a, b = attack_at + int(SETTLE_S * 1e9), until
    [broker] = host.broker_pids()

    neighbours = []
    for name, pct, load in (GREEDY, STEP):
        script = (f"gpu_load {load} --start-at {start} --until {until} "
                  f"--trace /sim/trace-{name} > /sim/out-{name} 2> /sim/err-{name}")
        p, cid = host.start(script, {"vgpu.io/memory": "256Mi", "vgpu.io/compute": str(pct),
                                     "vgpu.io/policy": "fixed"})
        neighbours.append((name, pct, p, cid))
    # The attacker: its own greedy load in the background, scribble until the window ends
    # (at nice 19: its CPU use is the CPU cgroup's business, and on a 2-core VM it would
    # slow the step neighbour's CPU work, not its GPU share).
    attack = (f"(gpu_load --kernel busy_1000us --start-at {start} --until {until} "
              f"--trace /sim/trace-attacker > /dev/null 2> /sim/err-attacker; "
              f"echo $? > /sim/rc-attacker) & "
              f"scribble {mode} 0 --nice 19 --from {attack_at} --until {until + 300_000_000} "
              f"--seed {os.getpid()} > /sim/scribble.json 2> /sim/scribble.err; "
              f"echo scribble-exit $?")
    attacker, _ = host.start(attack, {"vgpu.io/memory": "256Mi",
                                      "vgpu.io/compute": str(ATTACKER_SHARE),
                                      "vgpu.io/policy": "fixed"}, extra_bin=SCRIBBLE)

    # Mid-window, under attack: vgpud answers (List reads every slice's region) and the
    # broker lists each slice with vgpud's settings, the attacker's included.
    host.vgpud.wait_for(lambda: len(host.slices()) == 3, timeout=LEAD_S + 10,
                        what="three slices")
    time.sleep(max(0.0, (a + (b - a) // 2 - time.monotonic_ns()) / 1e9))
    listed = {s.vgpus[0].compute_percent: s for s in host.slices()}
    assert sorted(listed) == sorted([ATTACKER_SHARE, GREEDY[1], STEP[1]])
    keys = {pct: slice_key_of(s.id, 0) for pct, s in listed.items()}
    seen = entries(host.gpu_file())
    for pct, key in keys.items():
        assert seen.get(key) == (pct, NORMAL, FIXED), (pct, seen)
    assert len(seen) == 3, f"the broker took on made-up slices: {seen}"
    assert host.healthy()

    outs = {}
    for name, _, p, _ in neighbours:
        outs[name] = p.communicate(timeout=SECONDS + 60)
    a_out, a_err = attacker.communicate(timeout=SECONDS + 60)
    report = json.loads((host.sim / "scribble.json").read_text())
    files = {f["kind"]: f for f in report["files"]}

    traces = {n: host.sim / f"trace-{n}" for n in ("greedy", "step", "attacker")}
    shares = {n: (share_of(t, *calm), share_of(t, a, b)) for n, t in traces.items()
              if t.exists() and t.stat().st_size}  # (a load that never ended wrote none)
    print(f"hostile {mode}: calm -> attacked: "
          f"{', '.join(f'{k} {c:.1f} -> {v:.1f} %' for k, (c, v) in shares.items())}; "
          f"scribble {report['rounds']} rounds")
    # Each neighbour exited 0 and kept its share: the attack cost it nothing.
    for name, pct, p, _ in neighbours:
        err = (host.sim / f"err-{name}").read_text()
        assert p.returncode == 0, f"{name} ({mode}): {outs[name]} {err}"
        assert "vgpu:" not in err, f"{name} ({mode}) complained: {err}"
        trace = host.sim / f"trace-{name}"
        assert first_launch(trace) < calm[0], f"{name} started late: raise LEAD_S"
        before, got = shares[name]
        what = (f"{mode}: the {name} neighbour (fixed {pct}) got {before:.1f} % calm, "
                f"{got:.1f} % attacked")
        assert got >= min(before, pct) - COST, what
        assert pct * FLOOR <= got <= pct + OVER, what
    # The attacker gained nothing: at most its own share, whatever it forged (its own
    # load may well have lost its slice's files and been refused, or died of SIGBUS).
    if "attacker" in shares:
        assert shares["attacker"][1] <= ATTACKER_SHARE + TOL, mode
    assert "scribble-exit 0" in a_out, f"scribble crashed: {a_out} {a_err}"

    # The attack happened: it found every file vgpu mounted, and wrote its own.
    assert {"gpu", "req", "region", "lib", "preload"} <= set(files), report
    own = files["req"]
    if mode == "truncate":
        assert own["truncates_ok"] > 0, own
    elif mode not in ("full", "none"):
        assert own["writes_ok"] > 0, own
    # ... and could write nothing shared: the GPU's file and libvgpu are read-only.
    gpu = files["gpu"]
    assert gpu["mount_ro"] and gpu["open_rw"] in REFUSED and gpu["open_wo"] in REFUSED, gpu
    assert gpu["map_rw"] == "EACCES", gpu
    assert gpu["writes_ok"] == 0 and gpu["truncates_ok"] == 0, gpu
    assert files["lib"]["open_rw"] in REFUSED, files["lib"]
    # The slice's limits and identity are read-only too (issue 10); only its usage is its own.
    region = files["region"]
    assert region["mount_ro"] and region["open_rw"] in REFUSED and region["writes_ok"] == 0, region
    assert region["truncates_ok"] == 0, region
    assert {"gpu", "req", "region", "usage", "lib", "preload"} <= set(files), report
    if mode == "full":
        full = report["full"]
        assert full["created"] > 0, full            # in its own rootfs, seen by nobody
        for op in ("rename_over_gpu", "link_gpu", "rename_gpu_away", "unlink_gpu",
                   "symlink_over_gpu", "mknod_over_gpu"):
            assert full[op] != "ok", (op, full)

    # Afterwards: vgpud answers, the broker is the same process and beating, the GPU's
    # file is whole, and the host's scheduling directory holds no file the tenant made.
    assert host.healthy()
    assert host.broker_pids() == [broker], "the broker died (and was restarted)"
    pid, beat = broker_beat(host.gpu_file())
    assert pid == broker and time.monotonic_ns() - beat < 1_000_000_000
    made = {p.name for p in host.sched_dir.iterdir()} - {host.gpu_file().name, BROKER_LOCK_NAME}
    assert all(n.endswith((".req", ".conf")) for n in made), made
    assert len(made) <= 6, made
