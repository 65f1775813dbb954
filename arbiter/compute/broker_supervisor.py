# SPDX-License-Identifier: Apache-2.0
"""vgpud's token broker: keeps one vgpu-broker serving <run_dir>/sched, across vgpud restarts.

The broker (libvgpu/src/broker.c) is the one party that grants each GPU's compute
token; vgpud only keeps it running. Throttled slices wait on its grants, so it must
not stop when vgpud does (a restart, an upgrade: workloads never depend on vgpud):

- vgpud names itself in `<run_dir>/vgpud.pid`; the broker exits only once no vgpud
  named there has been alive for `broker.orphan_s` (0: never).
- The broker's pid is in `<run_dir>/vgpu-broker.pid`. A starting vgpud adopts a running broker of
  the same program file; a broker of another program (an upgrade) is replaced: the new
  one starts, waits for each GPU file's lock, and takes it within ~10 ms of the old one
  going (SIGTERM), which a broker that starts afresh would not (its threads start first).
- A vgpud that waits for another's state lock (a DaemonSet update: `--wait-lock`) starts a
  standby broker first. It waits for each GPU file's lock, so it serves within ~10 ms of the
  old pod's broker dying with its pod, not once the new vgpud has the state lock; the new
  vgpud then keeps it (or adopts the old broker, if that one lives on and is the same
  program, and stops the standby).
- vgpud watches the broker (a pidfd: it may not be vgpud's child) and starts a new one
  when it exits: immediately the first time, backing off to at most 5 s if it keeps
  failing. A broker that dies loses nothing a slice needs: the slices' requests and
  vgpud's settings are files, and a new broker takes them up.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

from arbiter.files.atomic import write_whole
from arbiter.proc import stat_fields

__all__ = ["BROKER_PIDFILE", "OWNER_PIDFILE", "BrokerSupervisor"]

log = logging.getLogger(__name__)

#: In vgpud's run dir (the sched dir holds GPU files only).
OWNER_PIDFILE = "vgpud.pid"
BROKER_PIDFILE = "vgpu-broker.pid"

_BACKOFF_MAX_S = 5.0
_STEADY_S = 10.0  # a broker that ran this long resets the back-off


class BrokerSupervisor:
    """Keeps one `vgpu-broker --dir DIR` running; stop() leaves it serving."""

    def __init__(self, program: Path, sched_dir: Path, pid_dir: Path, *,
                 orphan_s: float = 0.0, proc: Path = Path("/proc")) -> None:
        self.program = Path(program)
        self.sched_dir = Path(sched_dir)
        self.pid_dir = Path(pid_dir)
        self.orphan_s = orphan_s
        self.proc = proc
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._pid = 0
        self._pidfd = -1
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.restarts = 0
        #: "adopted" (a running broker of this program), "standby", "replaced" or "started".
        self.how = ""
        self._standby: subprocess.Popen[bytes] | None = None

    def start_standby(self) -> None:
        """Start a broker that waits for the GPU files' locks, before waiting for another
        vgpud's state lock (its pid goes in the pidfile only once start() keeps it)."""
        self._standby = self._popen()
        log.info("vgpu-broker %d standing by for %s", self._standby.pid, self.sched_dir)

    @property
    def pid(self) -> int:
        """The broker's pid, 0 when none runs."""
        return self._pid if self._pid and _alive(self._pid) else 0

    def start(self) -> None:
        """Adopt the running broker or start one, then watch it."""
        _write_atomic(self.pid_dir / OWNER_PIDFILE, f"{os.getpid()}\n")
        old = self._running_broker()
        standby, self._standby = self._standby, None
        if standby is not None and (standby.poll() is not None or
                                    (old and self._same_program(old))):
            _end(standby)  # gone, or not needed: the old broker lives on and is ours
            standby = None
        if standby is not None:
            self._keep(standby)
            self.how = "standby"
            if old:  # it has waited for each GPU file's lock: let the old one go
                with contextlib.suppress(ProcessLookupError):
                    os.kill(old, signal.SIGTERM)
            log.info("vgpu-broker %d (standby) serves %s", standby.pid, self.sched_dir)
        elif old and self._same_program(old):
            self._watch_pid(old)
            self.how = "adopted"
            log.info("vgpu-broker %d adopted for %s", old, self.sched_dir)
        else:
            self._spawn()
            self.how = "replaced" if old else "started"
            if old:  # the new one waits for each GPU file's lock: let the old one go
                with contextlib.suppress(ProcessLookupError):
                    os.kill(old, signal.SIGTERM)
                log.info("vgpu-broker %d (another program) replaced by %d", old, self._pid)
        self._thread = threading.Thread(target=self._watch, name="vgpud-broker", daemon=True)
        self._thread.start()

    def _running_broker(self) -> int:
        """The pid in .broker if it is a live vgpu-broker serving this directory, else 0."""
        try:
            pid = int((self.pid_dir / BROKER_PIDFILE).read_text().strip() or 0)
            argv = (self.proc / str(pid) / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return 0
        ours = b"--dir" in argv and os.fsencode(str(self.sched_dir)) in argv
        return pid if pid > 0 and ours and Path(os.fsdecode(argv[0])).name == "vgpu-broker" \
            else 0

    def _same_program(self, pid: int) -> bool:
        try:
            return os.path.samefile(self.proc / str(pid) / "exe", self.program)
        except OSError:
            return False

    def _popen(self) -> subprocess.Popen[bytes]:
        # Its own session: a signal to vgpud's process group does not reach it.
        return subprocess.Popen([str(self.program), "--dir", str(self.sched_dir),
                                 "--orphan-s", str(math.ceil(self.orphan_s)),
                                 "--owner", str(self.pid_dir / OWNER_PIDFILE)],
                                stdin=subprocess.DEVNULL, close_fds=True,
                                start_new_session=True)

    def _keep(self, p: subprocess.Popen[bytes]) -> None:
        self._child = p
        self._watch_pid(p.pid)
        _write_atomic(self.pid_dir / BROKER_PIDFILE, f"{p.pid}\n")

    def _spawn(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            p = self._popen()
            self._keep(p)
            log.info("vgpu-broker started (pid %d) for %s", p.pid, self.sched_dir)

    def _watch_pid(self, pid: int) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
        self._pid = pid
        self._pidfd = os.pidfd_open(pid)

    def _watch(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            started = time.monotonic()
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            events = dict(poller.poll())
            if self._stop.is_set() or self._pidfd not in events:
                return
            rc = self._reap()
            self.restarts += 1
            backoff = 0.0 if time.monotonic() - started > _STEADY_S else min(
                _BACKOFF_MAX_S, max(0.1, backoff * 2))
            log.warning("vgpu-broker exited (status %s); restarting in %.1f s", rc, backoff)
            if self._stop.wait(backoff):
                return
            try:
                self._spawn()
            except OSError as e:
                log.error("cannot restart vgpu-broker %s: %s", self.program, e)
                backoff = _BACKOFF_MAX_S

    def _reap(self) -> int | None:
        """The exit status of our child (None for an adopted broker: not ours to reap)."""
        child = self._child
        if child is not None and child.pid == self._pid:
            return child.wait()
        return None

    def stop(self) -> None:
        """Stop watching; the broker goes on serving the slices (it outlives vgpud)."""
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)

    def terminate(self) -> None:
        """Stop the broker too (SIGTERM, then SIGKILL after 2 s): tests and teardown."""
        self.stop()
        if self._standby is not None:  # a start that never got the state lock
            _end(self._standby)
            self._standby = None
        pid = self.pid
        if not pid:
            return
        if self._child is not None and self._child.pid == pid:
            _end(self._child)  # ours: reaped too
            return
        # An adopted broker is not our child: signalled and watched by pid.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 2
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _end(p: subprocess.Popen[bytes]) -> None:
    """SIGTERM a child broker and reap it (SIGKILL after 2 s)."""
    with contextlib.suppress(ProcessLookupError):
        p.terminate()
    try:
        p.wait(timeout=2)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    state = stat_fields(pid)[:1]
    return bool(state) and state[0] != b"Z"


def _write_atomic(path: Path, text: str) -> None:
    write_whole(path, text.encode(), 0o644)  # the run dir: no fsync (arbiter.files.atomic)
