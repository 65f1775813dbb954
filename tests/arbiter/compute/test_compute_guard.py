# SPDX-License-Identifier: Apache-2.0
"""The compute guard's pure decisions (arbiter.compute.compute_guard) and its host lookups on
fixture trees."""
from __future__ import annotations

from pathlib import Path

import pytest

from arbiter.compute import compute_guard
from arbiter.compute.compute_guard import Finding, SliceUse
from arbiter.compute.freezer import Freezer, cgroup_of, find_root, strangers
from arbiter.model import Grant, OwnerKind, Slice
from arbiter.slices.attribution import SlicePids, descendants


def use(sid: str, share: int, pids: dict[int, int], gpu: int = 0,
        burst: bool = False) -> SliceUse:
    return SliceUse(sid, gpu, share, burst, pids)


# --- findings: a table -------------------------------------------------------------------

FINDINGS = [
    pytest.param([use("a", 20, {10: 95})], 10, [Finding("a", 0, 95, 20, (10,))],
                 id="greedy-bypass-in-20"),
    pytest.param([use("a", 20, {10: 30})], 10, [], id="at-share-plus-margin-is-not"),
    pytest.param([use("a", 20, {10: 31})], 10, [Finding("a", 0, 31, 20, (10,))],
                 id="one-point-over-margin"),
    pytest.param([use("a", 20, {10: 21})], 0, [Finding("a", 0, 21, 20, (10,))],
                 id="margin-zero"),
    pytest.param([use("a", 100, {10: 100})], 10, [], id="whole-gpu-never"),
    pytest.param([use("a", 20, {10: 20, 11: 20, 12: 0})], 10,
                 [Finding("a", 0, 40, 20, (10, 11))], id="processes-add-up-idle-ones-left-out"),
    pytest.param([use("a", 20, {10: 80, 11: 80})], 10, [Finding("a", 0, 100, 20, (10, 11))],
                 id="sum-capped-at-100"),
    pytest.param([use("a", 20, {}), use("b", 30, {11: 35})], 10, [], id="idle-slice-and-honest"),
    pytest.param([use("a", 20, {10: 90}, burst=True)], 10, [], id="burst-alone-takes-idle"),
    pytest.param([use("a", 20, {10: 75}, burst=True), use("b", 50, {11: 25})], 10,
                 [Finding("a", 0, 75, 50, (10,))], id="burst-beside-active-neighbour"),
    pytest.param([use("a", 20, {10: 75}, burst=True), use("b", 50, {})], 10, [],
                 id="burst-beside-idle-neighbour"),
    pytest.param([use("a", 20, {10: 75}, burst=True), use("b", 50, {11: 25}, gpu=1)], 10, [],
                 id="burst-neighbour-on-other-gpu"),
    pytest.param([use("a", 20, {10: 40}, gpu=0), use("a", 20, {10: 10}, gpu=1)], 10,
                 [Finding("a", 0, 40, 20, (10,))], id="per-gpu"),
]


@pytest.mark.parametrize(("uses", "margin", "expected"), FINDINGS)
def test_findings(uses: list[SliceUse], margin: int, expected: list[Finding]) -> None:
    assert compute_guard.findings(uses, margin) == expected


def test_default_action_is_throttle_and_valid() -> None:
    assert compute_guard.DEFAULT_ACTION == "throttle"
    assert compute_guard.DEFAULT_ACTION in compute_guard.GUARD_ACTIONS


# --- the duty cycle's run fraction -------------------------------------------------------

@pytest.mark.parametrize(("allowed", "used", "expected"), [
    pytest.param(20, 100, 0.2, id="greedy"),
    pytest.param(20, 40, 0.5, id="half-greedy"),
    pytest.param(20, 0, 1.0, id="idle"),
    pytest.param(1, 100, compute_guard.MIN_RUN_FRACTION, id="floor"),
    pytest.param(50, 40, 1.0, id="under-allowance"),
])
def test_first_run_fraction(allowed: int, used: int, expected: float) -> None:
    assert compute_guard.first_run_fraction(allowed, used) == pytest.approx(expected)


@pytest.mark.parametrize(("current", "allowed", "used", "expected"), [
    pytest.param(0.2, 20, 20, 0.2, id="on-target-keeps"),
    pytest.param(0.2, 20, 25, 0.16, id="over-shrinks"),
    pytest.param(0.2, 20, 80, 0.1, id="shrinks-at-most-half"),
    pytest.param(0.2, 20, 15, 0.2 * 20 / 15, id="under-grows"),
    pytest.param(0.2, 20, 5, 0.4, id="grows-at-most-double"),
    pytest.param(0.2, 20, 0, 0.4, id="idle-doubles"),
    pytest.param(0.8, 20, 5, 1.0, id="capped-at-one"),
    pytest.param(0.03, 1, 100, compute_guard.MIN_RUN_FRACTION, id="never-below-floor"),
])
def test_next_run_fraction(current: float, allowed: int, used: int, expected: float) -> None:
    assert compute_guard.next_run_fraction(current, allowed, used) == pytest.approx(expected)


# --- host lookups on fixture trees -------------------------------------------------------

def test_find_root(tmp_path: Path) -> None:
    assert find_root(tmp_path) is None
    (tmp_path / "unified").mkdir()
    for name in ("cgroup.controllers", "cgroup.procs"):
        (tmp_path / "unified" / name).write_text("")
    assert find_root(tmp_path) == tmp_path / "unified"          # hybrid
    for name in ("cgroup.controllers", "cgroup.procs"):
        (tmp_path / name).write_text("")
    assert find_root(tmp_path) == tmp_path                      # unified


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("12:freezer:/x\n0::/kubepods/pod1/c1\n", "/kubepods/pod1/c1", id="hybrid"),
    pytest.param("0::/\n", "/", id="root"),
    pytest.param("0::/gone (deleted)\n", "/gone", id="deleted"),
    pytest.param("4:memory:/a\n", None, id="v1-only"),
])
def test_cgroup_of(tmp_path: Path, text: str, expected: str | None) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(text)
    assert cgroup_of(42, tmp_path) == expected
    assert cgroup_of(43, tmp_path) is None


def test_freezer_members_and_paths(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "cgroup.procs").write_text("1\n2\n")
    (tmp_path / "a" / "b" / "cgroup.procs").write_text("3\n")
    (tmp_path / "a" / "cgroup.freeze").write_text("0")
    f = Freezer(tmp_path)
    assert f.members("/a") == {1, 2, 3}
    assert f.members("/nope") is None
    assert f.path("/../../etc") == tmp_path / "etc"               # never above the root
    assert f.can_freeze("/a") and not f.can_freeze("/") and not f.can_freeze("/a/b")
    f.set_frozen("/a", True)
    assert (tmp_path / "a" / "cgroup.freeze").read_text() == "1"


def test_a_member_that_exits_between_the_reads_is_no_stranger(tmp_path: Path) -> None:
    """Escalation freezes a slice's cgroup only when every member is the slice's. A bypass
    the guard killed a moment ago leaves the cgroup while the slice's pids are read: it
    was the slice's and is gone, not a stranger (the flake of
    test_a_respawning_bypass_gets_its_container_frozen: a kill instead of the freeze)."""
    procs = tmp_path / "c" / "cgroup.procs"
    procs.parent.mkdir()
    procs.write_text("10\n11\n")
    f = Freezer(tmp_path)

    def slice_pids_as_11_exits() -> set[int]:
        procs.write_text("10\n")            # 11 exits before /proc is walked
        return {10}
    assert strangers(f.members("/c") or set(), slice_pids_as_11_exits,
                     lambda: f.members("/c")) == set()
    # A process forked while the pids are read is the slice's already.
    procs.write_text("10\n")

    def slice_pids_with_a_fork() -> set[int]:
        procs.write_text("10\n12\n")
        return {10, 12}
    assert strangers(f.members("/c") or set(), slice_pids_with_a_fork,
                     lambda: f.members("/c")) == set()
    # One that was there before and after and is not the slice's is a stranger.
    procs.write_text("10\n99\n")
    assert strangers(f.members("/c") or set(), lambda: {10}, lambda: f.members("/c")) == {99}
    # The cgroup removed meanwhile: nothing to freeze.
    assert strangers({10}, lambda: {10}, lambda: f.members("/gone")) is None


def _proc(tmp: Path, pid: int, ppid: int, comm: str = "sh") -> None:
    (tmp / str(pid)).mkdir()
    (tmp / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1\n")


def test_host_pids_are_owner_and_descendants_never_region_slots(tmp_path: Path) -> None:
    for pid, ppid, comm in ((100, 1, "vgpu"), (101, 100, "a) S 7 (b"), (102, 101, "x"),
                            (200, 1, "other")):
        _proc(tmp_path, pid, ppid, comm)
    s = Slice("s1", "me", (Grant(0, "GPU-0", 1, 20),), owner_kind=OwnerKind.PROCESS,
              owner_pid=100)
    owners = SlicePids(lambda _s: {0: {200}}, tmp_path)   # a tenant wrote pid 200 in its slot
    assert owners.host(s) == {100, 101, 102}
    assert owners.of(s) == [{100, 200}]
    assert descendants({1: {2}, 2: {3, 1}}, 1) == {2, 3}      # a loop ends
