# SPDX-License-Identifier: Apache-2.0
"""The cgroup v2 freezer: which cgroup a process is in, freezing it, and a duty cycle.

Writing 1 to <cgroup>/cgroup.freeze stops every task of the cgroup and its
descendants (kernel-enforced, no signal the task can see or catch); 0 lets them
run again. Work a frozen process already queued on a GPU still runs, so the
duty cycle's run fraction is corrected from measurements (arbiter.compute.compute_guard).

The cgroup v2 hierarchy is /sys/fs/cgroup on a unified host and
/sys/fs/cgroup/unified on a hybrid (v1 + v2) one; `find_root` picks it.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from arbiter.files import cgroupfiles

__all__ = ["DutyCycle", "Freezer", "cgroup_of", "find_root", "strangers"]

#: Length of one freeze/thaw cycle. Short enough that a throttled tenant stalls
#: at most this long at a time and NVML's window (1 s) averages ten cycles; long
#: enough that a wake-up's jitter (~1 ms) and the kernel's freeze walk are small
#: beside it.
PERIOD_S = 0.1
#: Rounds of SIGKILL to a cgroup's processes when its cgroup.kill is leased (a process
#: forked between one look at /proc and the signals is found by the next).
_KILL_ROUNDS = 3


def strangers(first: set[int], mine: Callable[[], set[int]],
              again: Callable[[], set[int] | None]) -> set[int] | None:
    """The pids in a cgroup that are not the slice's; None when the cgroup is gone.

    `first` is what the cgroup held; `mine` is asked for the slice's pids after that read,
    `again` for the cgroup's members after that. A member that exited in between (a
    bypass the guard just killed) is gone, not a stranger; one forked in between is in
    the slice's pids already. A stranger is in both reads and not the slice's while it
    lived."""
    ours = mine()
    later = again()
    if later is None:
        return None
    return (first & later) - ours


def find_root(base: Path = Path("/sys/fs/cgroup")) -> Path | None:
    """The cgroup v2 mount: base itself, else base/unified (hybrid); None when neither."""
    for p in (Path(base), Path(base) / "unified"):
        # cgroup.controllers exists only in a cgroup v2 hierarchy.
        if (p / "cgroup.controllers").is_file() and (p / "cgroup.procs").is_file():
            return p
    return None


def cgroup_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The cgroup v2 path of pid ("/a/b", from the "0::" line of /proc/<pid>/cgroup)."""
    try:
        text = (Path(proc) / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].split(" (deleted)")[0] or "/"
    return None


class Freezer:
    """cgroup.freeze and cgroup.procs of the cgroups under one cgroup v2 root."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, cgroup: str) -> Path:
        """The directory of a cgroup path such as "/a/b" (never outside the root)."""
        parts = [p for p in cgroup.split("/") if p and p not in (".", "..")]
        return self.root.joinpath(*parts)

    def can_freeze(self, cgroup: str) -> bool:
        """True for a cgroup other than the root that has a freezer file."""
        return cgroup.strip("/") != "" and (self.path(cgroup) / "cgroup.freeze").is_file()

    def members(self, cgroup: str) -> set[int] | None:
        """Every pid in the cgroup and its descendants; None when it is gone."""
        top = self.path(cgroup)
        if not top.is_dir():
            return None
        out: set[int] = set()
        for d, _, _ in os.walk(top):
            try:
                out |= {int(x) for x in cgroupfiles.read(Path(d) / "cgroup.procs").split()}
            except BlockingIOError:  # its tenant leased it (cgroupfiles): /proc, unleased
                return cgroupfiles.pids_in(f":{cgroup}")
            except (OSError, ValueError):
                pass
        return out

    def set_frozen(self, cgroup: str, frozen: bool) -> None:
        """Freeze or thaw the cgroup (OSError when it is gone or not writable, or
        BlockingIOError when its tenant leased the file: never waited on)."""
        cgroupfiles.write(self.path(cgroup) / "cgroup.freeze", "1" if frozen else "0")

    def kill(self, cgroup: str, kill: Callable[[int, int], None] = os.kill) -> None:
        """SIGKILL every process of the cgroup and below it, forks in flight included.

        cgroup.kill (Linux >= 5.14) does it in the kernel; before that, freeze, signal
        every member (a frozen task still dies of SIGKILL) and thaw. OSError when the
        cgroup is gone or not writable."""
        top = self.path(cgroup)
        if (top / "cgroup.kill").is_file():
            try:
                cgroupfiles.write(top / "cgroup.kill", "1")
                return
            except BlockingIOError:  # leased by its tenant: each process found in /proc
                for _ in range(_KILL_ROUNDS):  # (again: forks in flight)
                    for pid in cgroupfiles.pids_in(f":{cgroup}"):
                        with contextlib.suppress(OSError):
                            kill(pid, signal.SIGKILL)
                return
        self.set_frozen(cgroup, True)
        try:
            for pid in self.members(cgroup) or ():
                with contextlib.suppress(OSError):
                    kill(pid, signal.SIGKILL)
        finally:
            self.set_frozen(cgroup, False)

    def frozen(self, cgroup: str) -> bool:
        """Whether the kernel reports the cgroup frozen (cgroup.events "frozen 1")."""
        try:
            events = cgroupfiles.read(self.path(cgroup) / "cgroup.events")
        except OSError:  # a lease too: frozen or not, vgpud does not wait to know
            return False
        return "frozen 1" in events.splitlines()


class DutyCycle:
    """A thread that lets a cgroup run `run_fraction` of each period and freezes it the rest."""

    def __init__(self, freezer: Freezer, cgroup: str, run_fraction: float,
                 period_s: float = PERIOD_S) -> None:
        self.freezer = freezer
        self.cgroup = cgroup
        self.run_fraction = run_fraction
        self.period_s = period_s
        self._stop = threading.Event()
        #: Set when a file lease on cgroup.freeze stopped the cycle (never waited on).
        self.leased = False
        self._thread = threading.Thread(target=self._loop, name=f"vgpud-throttle{cgroup}",
                                         daemon=True)

    def start(self) -> None:
        """Start cycling."""
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                run = self.period_s * self.run_fraction
                self.freezer.set_frozen(self.cgroup, False)
                if self._stop.wait(run):
                    break
                if self.run_fraction < 1.0:
                    self.freezer.set_frozen(self.cgroup, True)
                    self._stop.wait(self.period_s - run)
        except BlockingIOError:
            # Its tenant leased cgroup.freeze (arbiter.files.cgroupfiles): the throttle cannot
            # hold; the guard sees `leased` at its next window and acts otherwise.
            self.leased = True
        except OSError:  # the cgroup is gone: nothing left to hold
            pass
        finally:
            with contextlib.suppress(OSError):
                self.freezer.set_frozen(self.cgroup, False)

    def stop(self) -> None:
        """Stop cycling and leave the cgroup thawed (waits for the thread)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self.freezer.set_frozen(self.cgroup, False)
