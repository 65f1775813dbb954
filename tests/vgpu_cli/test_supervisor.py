# SPDX-License-Identifier: Apache-2.0
"""`vgpu run`'s supervisor (vgpu_cli/supervisor.py) as a real process: in a real cgroup,
frozen and thawed by the cgroup v2 freezer as vgpud's compute guard throttles a slice, it
forwards the signals it gets and no signal it did not get (root only); it waits for its
child however its own parent left SIGCHLD."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.paths import ROOT

from arbiter.compute.freezer import DutyCycle, Freezer

# What `vgpu run` does around its child CMD, without the slice: block, spawn, supervise.
SUPERVISOR = """
import os, sys
from vgpu_cli.supervisor import block_signals, exit_status, spawn, supervise
block_signals()
pid = spawn(sys.argv[1:], os.environ)
print(pid, flush=True)
print(exit_status(supervise(pid)), flush=True)
"""


class Throttled:
    """The supervisor and its `sleep SECONDS` in `cgroup`, under a 30 % duty cycle."""

    def __init__(self, root: Path, cgroup: Path, seconds: float) -> None:
        # The shell joins the cgroup, then becomes the supervisor; the child inherits it.
        self.proc = subprocess.Popen(
            ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh",
             sys.executable, "-c", SUPERVISOR, "sleep", str(seconds)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.child = int(self.proc.stdout.readline())
        self.freezer, self.cgroup = Freezer(root), "/" + cgroup.name
        self.duty = DutyCycle(self.freezer, self.cgroup, run_fraction=0.3)
        self.duty.start()

    def watch(self, seconds: float) -> bool:
        """Whether the cgroup was seen frozen within the next `seconds`."""
        seen, end = False, time.monotonic() + seconds
        while time.monotonic() < end:
            seen |= self.freezer.frozen(self.cgroup)
            time.sleep(0.01)
        return seen

    def status(self) -> int:
        """The exit status the supervisor reports for its child."""
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        assert self.proc.wait(timeout=30) == 0, out
        return int(out)

    def close(self) -> None:
        self.duty.stop()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def test_a_throttled_supervisor_lets_its_child_run_to_the_end(cgroup):
    t = Throttled(*cgroup, seconds=2.5)
    try:
        assert t.watch(2.0)                  # the freezer interrupts its waits, often
        assert t.status() == 0               # the child ended on its own: nothing was sent
    finally:
        t.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=lambda s: s.name)
def test_a_throttled_supervisor_forwards_a_signal(cgroup, sig):
    t = Throttled(*cgroup, seconds=30)
    try:
        assert t.watch(1.0)
        t.proc.send_signal(sig)              # the supervisor, maybe frozen: it waits
        assert t.status() == 128 + sig       # the child died of that signal
    finally:
        t.close()


def test_an_inherited_ignored_sigchld_does_not_lose_the_child():
    # An ignored SIGCHLD survives exec: the kernel would reap the child unasked and send
    # no SIGCHLD. A parent that ignores it, then execs the supervisor:
    ignoring = ("import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); "
                "os.execv(sys.argv[1], sys.argv[1:])")
    p = subprocess.run([sys.executable, "-c", ignoring, sys.executable, "-c", SUPERVISOR,
                        "sh", "-c", "sleep 0.2; exit 7"],
                       cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[-1] == "7"       # the child's own status, not lost
