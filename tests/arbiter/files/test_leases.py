# SPDX-License-Identifier: Apache-2.0
"""arbiter.files.leases and its use in arbiter.files.slice_dirs: a real file lease, taken by a real
process, never makes vgpud wait; a file vgpud holds takes no lease at all."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.process import read_line

from arbiter.errors import RegionError
from arbiter.files.leases import Pins, open_tenant_file
from arbiter.files.region_file import open_region, usage_path_of
from arbiter.files.slice_dirs import Regions
from arbiter.model import Grant, Slice

MiB = 1 << 20

#: A lease holder: opens each file read-only, takes a write lease (else a read one), says
#: what it got, and keeps it until stdin closes (SIGIO, the break's notice, ignored).
_HOLDER = r"""
import fcntl, os, signal, sys
signal.signal(signal.SIGIO, signal.SIG_IGN)
fds = []
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    fds.append(fd)
    got = "none"
    for kind, name in ((fcntl.F_WRLCK, "write"), (fcntl.F_RDLCK, "read")):
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, kind)
            got = name
            break
        except OSError:
            pass
    print(got, flush=True)
sys.stdin.read()
"""


class Holder:
    """A process that leases files (write lease where it can) until closed."""

    def __init__(self, *paths: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _HOLDER, *map(str, paths)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.got = [self.proc.stdout.readline().strip() for _ in paths]

    def close(self) -> None:
        assert self.proc.stdin is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture
def holders():
    made: list[Holder] = []

    def make(*paths: Path) -> Holder:
        made.append(Holder(*paths))
        return made[-1]

    yield make
    for h in made:
        h.close()


def _timed(call):
    t = time.monotonic()
    out = call()
    return out, time.monotonic() - t


def test_a_leased_file_is_not_waited_on(tmp_path, holders):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    assert holders(path).got == ["write"]  # makes every other open wait 45 s
    for flags in (os.O_RDONLY, os.O_RDWR):
        start = time.monotonic()
        with pytest.raises(RegionError) as info:
            open_tenant_file(path, flags)
        assert time.monotonic() - start < 1
        assert info.value.busy and "lease" in info.value.reason


def test_a_held_file_takes_no_lease(tmp_path, holders):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    pins = Pins()
    pins.hold("s", path)
    refused = holders(path)
    assert refused.got == ["none"]
    refused.close()
    pins.drop("s")
    assert holders(path).got == ["write"]


#: A tenant that lets go when asked (SIGIO) and takes its lease back at once, every ms,
#: for 3 s: each time the kernel ended its lease, it would lease the file again before a
#: nonblocking retry came. Prints when (time.monotonic()) it last got one after the first,
#: 0 for never.
_RACER = r"""
import fcntl, os, signal, sys, time
asked = []
signal.signal(signal.SIGIO, lambda *_: asked.append(1))
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
print("write", flush=True)
while not asked:
    time.sleep(0.001)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
again, end = 0.0, time.monotonic() + 3
while time.monotonic() < end:
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        again = time.monotonic()
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError:
        pass
    time.sleep(0.001)
print(again, flush=True)
"""


def test_a_tenant_that_lets_go_and_leases_again_loses_the_file_to_vgpud(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    racer = subprocess.Popen([sys.executable, "-c", _RACER, str(path)], stdout=subprocess.PIPE,
                             text=True)
    assert read_line(racer).strip() == "write"
    pins = Pins()
    with pytest.raises(RegionError) as info:
        pins.hold("s", path)  # said at once; opened in the background
    assert info.value.busy
    # The background open is a writer from before it waits: once it has the file, the
    # tenant gets no lease again. (Between the nonblocking try and that open, one may
    # slip in, and is broken like the first.)
    deadline = time.monotonic() + 10
    while pins.held("s") != {path}:
        assert time.monotonic() < deadline, "vgpud never got the file"
        time.sleep(0.001)
    held_at = time.monotonic()
    out, _ = racer.communicate(timeout=30)
    assert float(out) < held_at, (out, held_at)
    assert pins.held("s") == {path}
    pins.hold("s", path)  # held: no error
    pins.close()


def make_slice(memory: int = 64 * MiB) -> Slice:
    return Slice(id="abc123def456", owner="owner", grants=(Grant(0, "GPU-0", memory, 20),))


def test_a_restarted_vgpud_defers_a_leased_slice_and_catches_up_when_it_ends(tmp_path,
                                                                              holders):
    run = tmp_path / "run"
    first = Regions(run)
    first.prepare()
    s = make_slice()
    first.create(s)
    region = first.region_path(s.id, 0)
    req = next(p for p in first.sched_root.iterdir() if p.name.endswith(".req"))
    files = [region, usage_path_of(region), req]
    # While vgpud holds them, the tenant gets no lease on any.
    refused = holders(*files)
    assert refused.got == ["none"] * 3
    refused.close()
    first.pins.close()  # vgpud gone

    tenant = holders(*files)
    assert tenant.got == ["write"] * 3
    told: list[tuple[str, Path]] = []
    second = Regions(run)
    second.on_busy = lambda sid, path, reason: told.append((sid, path))
    report, took = _timed(lambda: second.reconcile_dirs([s]))
    assert took < 2, took  # not the 45 s of a lease break
    assert report.created == () and region.stat().st_ino == Path(files[0]).stat().st_ino
    assert told and told[0][0] == s.id  # said once, not once per file
    bigger = dataclasses.replace(s, grants=(dataclasses.replace(s.grants[0], memory=96 * MiB),))
    _, took = _timed(lambda: second.update(bigger))
    assert took < 2, took
    assert second.usage(bigger) == [0]  # unreadable now, not malformed
    assert len(told) == 1

    tenant.close()
    second.retry_pending([bigger])
    with open_region(region, writable=False) as r:
        assert r.memory_limit == 96 * MiB
    assert holders(*files).got == ["none"] * 3  # held again
