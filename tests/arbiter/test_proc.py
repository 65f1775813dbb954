# SPDX-License-Identifier: Apache-2.0
"""arbiter.proc: what /proc says about processes, read from fixture trees and from real
processes."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from arbiter.proc import (
    PID_NS_INIT,
    ProcessView,
    pid_alive,
    pid_namespace_inode,
    pids_by_namespace,
    proc_start_time,
    process_tree,
    stat_fields,
    visible_pid,
)


def _stat(tree: Path, pid: int | str, comm: str = "sh", state: str = "S", ppid: int = 1,
          start: int = 0) -> Path:
    """A /proc/<pid>/stat with the given comm, state, ppid and start time (field 22)."""
    d = tree / str(pid)
    d.mkdir(exist_ok=True)
    rest = [state, str(ppid)] + ["0"] * 17 + [str(start), "1000", "10"]
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
    return d


def _in_ns(tree: Path, pid: int | str, ns: int) -> None:
    """Put pid in pid namespace ns, as the kernel's link names it."""
    (tree / str(pid) / "ns").mkdir(parents=True, exist_ok=True)
    os.symlink(f"pid:[{ns}]", tree / str(pid) / "ns" / "pid")


OURS, THEIRS = 4026532100, 4026532999  # neither is the initial namespace


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A /proc tree whose "self" is in namespace OURS."""
    _stat(tmp_path, "self")
    _in_ns(tmp_path, "self", OURS)
    return tmp_path


@pytest.mark.parametrize(("comm", "expected"), [
    ("sleep", [b"S", b"7"]),
    ("a) S 9 (b", [b"S", b"7"]),        # a comm that spells fields: the last ')' counts
    ("x y", [b"S", b"7"]),
], ids=["plain", "parens-in-comm", "space-in-comm"])
def test_stat_fields_start_after_the_comm(tmp_path: Path, comm: str, expected: list[bytes]):
    _stat(tmp_path, 42, comm=comm, ppid=7, start=555)
    fields = stat_fields(42, tmp_path)
    assert fields[:2] == expected and fields[19] == b"555"
    assert proc_start_time(42, tmp_path) == 555


def test_stat_fields_of_a_missing_or_garbled_process_are_empty(tmp_path: Path):
    assert stat_fields(42, tmp_path) == [] and proc_start_time(42, tmp_path) == 0
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "stat").write_text("43 no parenthesis at all")
    assert stat_fields(43, tmp_path) == [] and proc_start_time(43, tmp_path) == 0


def test_process_tree_maps_parents_to_children(tmp_path: Path):
    for pid, ppid, comm in ((100, 1, "init-ish"), (101, 100, "a) S 7 (b"), (102, 100, "c"),
                            (103, 101, "d")):
        _stat(tmp_path, pid, comm=comm, ppid=ppid)
    (tmp_path / "self").mkdir()               # not a pid: skipped
    (tmp_path / "104").mkdir()                # gone between listdir and read: skipped
    assert process_tree(tmp_path) == {1: {100}, 100: {101, 102}, 101: {103}}
    assert process_tree(tmp_path / "absent") == {}


def test_pids_by_namespace_groups_pids_by_inode(tree: Path):
    for pid, ns in ((10, OURS), (20, THEIRS), (21, THEIRS)):
        _stat(tree, pid)
        _in_ns(tree, pid, ns)
    _stat(tree, 30)                           # namespace unreadable: left out
    _stat(tree, 31)
    (tree / "31" / "ns").mkdir()
    os.symlink("net:[4026531840]", tree / "31" / "ns" / "pid")   # not a pid namespace
    assert pids_by_namespace(tree) == {OURS: {10}, THEIRS: {20, 21}}
    with pytest.raises(OSError):
        pids_by_namespace(tree / "absent")


def test_view_finds_a_container_process_by_namespace_and_start(tree: Path):
    ns = THEIRS
    for pid, start, state in ((20, 555, "S"), (21, 777, "Z")):
        _stat(tree, pid, state=state, start=start)
        _in_ns(tree, pid, THEIRS)
    view = ProcessView(tree)
    assert view.find(ns, 555) == 20
    assert view.find(ns, 777) == 0            # a zombie holds nothing: gone
    assert view.find(ns, 999) == 0            # the namespace lives, that process does not
    assert view.find(ns + 1, 555) == -1       # a namespace our /proc does not show: unknown
    # A container process's slot names its own pid (7); we see it as 20.
    assert view.visible(7, 555, pid_ns=ns) == 20 and visible_pid(7, 555, tree, ns) == 20
    assert view.alive(7, 555, pid_ns=ns) and not view.alive(7, 999, pid_ns=ns)
    assert view.alive(7, 1, pid_ns=ns + 1)    # cannot tell: counts as alive
    assert view.visible(7, 1, pid_ns=ns + 1) == 0


def test_in_the_initial_namespace_an_unseen_namespace_is_gone(tmp_path: Path):
    # The initial pid namespace's /proc shows every process: no member means none lives.
    _stat(tmp_path, "self")
    _in_ns(tmp_path, "self", PID_NS_INIT)
    assert ProcessView(tmp_path).find(THEIRS, 1) == 0
    assert pid_namespace_inode("self", tmp_path) == PID_NS_INIT


@pytest.mark.parametrize("pid", [0, -1, 1 << 31, (1 << 31) | os.getpid(), 1 << 40],
                         ids=["zero", "negative", "bit31", "reaping-mark", "huge"])
def test_alive_rejects_what_names_no_process(pid: int):
    # -1 must never reach kill(2): it would signal every process we may signal.
    assert not pid_alive(pid, 0)


def test_alive_follows_a_real_process_through_its_life(sleeper):
    p = sleeper()
    start = proc_start_time(p.pid)
    assert start > 0 and pid_alive(p.pid, start) and pid_alive(p.pid, 0)
    assert not pid_alive(p.pid, start + 1)    # the pid, reused by someone else
    assert visible_pid(p.pid, start) == p.pid
    ns = pid_namespace_inode("self")          # the link's text names the inode stat sees
    assert ns == os.stat("/proc/self/ns/pid").st_ino == pid_namespace_inode(p.pid)
    assert ProcessView().alive(p.pid, start, pid_ns=ns)
    p.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pid_alive(p.pid, start) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pid_alive(p.pid, start)        # a zombie (not yet reaped) is gone
    p.wait()
    assert not pid_alive(p.pid, start) and visible_pid(p.pid, start) == 0

