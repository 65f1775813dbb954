# SPDX-License-Identifier: Apache-2.0
"""Socket activation for tests: what systemd's vgpud.socket does, around a real vgpud.

The harness binds vgpud's two listening sockets itself (the gRPC socket and
`<socket>.lifecycle`, mode 0600, backlog 512), keeps them open for its whole life, and
starts vgpud with them as fds 3 and 4 and `LISTEN_FDS=2`, `LISTEN_FDNAMES`, and
`LISTEN_PID` naming vgpud's own pid (a `bash` shim sets it to `$$` and execs vgpud, as
systemd sets it after its fork). Connections made while vgpud is down wait in the
kernel backlog, exactly as under systemd, so a restart loses no container start.

Use it with a `support.vgpud_harness.Vgpud` that is not running:

    from support.socket_activation import SocketActivation, activated_vgpud

    sim, act = activated_vgpud(tmp_path, {"hook": {"wait_s": 5}})   # started on simgpu
    act.vgpud.stub.Health(pb.HealthRequest())      # the usual client (the public socket)
    seconds = act.restart()    # SIGTERM, wait for the exit, start again: SIGTERM -> serving
    act.close()                # stop vgpud, close and remove the sockets

or wrap one you made: `act = SocketActivation(Vgpud(tmp, env, config)); act.start()`.
`act.down()` stops vgpud and leaves the sockets listening (connections queue);
`act.up()` starts it again. `act.paths` are the two socket paths; `act.starts` counts
the starts. The real protocol is proven by `systemd-socket-activate` in
tests/arbiter/daemon/test_restart.py.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from support.vgpud_harness import Vgpud, pb

__all__ = ["BACKLOG", "FDNAME", "SocketActivation", "activated_vgpud", "listening_socket"]

#: What the shipped vgpud.socket asks for (Backlog=512).
BACKLOG = 512
#: The shipped unit's FileDescriptorName (one name for both: vgpud matches by path).
FDNAME = "vgpud"
#: Inherited fds are moved above this in the harness so the shim's `exec 3<&N` is safe.
_HIGH_FD = 20


def listening_socket(path: Path, backlog: int = BACKLOG) -> socket.socket:
    """A unix stream socket listening at path, born 0600 (as SocketMode=0600)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        s.bind(str(path))
    finally:
        os.umask(old)
    s.listen(backlog)
    return s


class SocketActivation:
    """A vgpud started and restarted with inherited listening sockets."""

    def __init__(self, vgpud: Vgpud, fdnames: tuple[str, str] = (FDNAME, FDNAME)) -> None:
        self.vgpud = vgpud
        self.paths = (vgpud.socket, Path(f"{vgpud.socket}.lifecycle"))
        self.sockets = [listening_socket(p) for p in self.paths]
        # Numbers above the shim's targets (3, 4): `exec 3<&N 4<&M` never overwrites one.
        self.fds = tuple(fcntl.fcntl(s.fileno(), fcntl.F_DUPFD_CLOEXEC, _HIGH_FD)
                         for s in self.sockets)
        moves = " ".join(f"{3 + i}<&{fd} {fd}<&-" for i, fd in enumerate(self.fds))
        vgpud.wrapper = ["bash", "-c", f'exec {moves}; LISTEN_PID=$$ exec "$@"', "vgpud"]
        vgpud.pass_fds = self.fds
        vgpud.env.update(LISTEN_FDS=str(len(self.fds)), LISTEN_FDNAMES=":".join(fdnames))
        self.starts = 0

    def start(self, timeout: float = 30) -> float:
        """Start vgpud on the inherited sockets; seconds until Health answered."""
        t0 = time.monotonic()
        self.vgpud.start(timeout)
        self.starts += 1
        return time.monotonic() - t0

    up = start

    def down(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Stop vgpud (the sockets stay listening); its exit status."""
        return self.vgpud.stop(sig, timeout)

    def restart(self, timeout: float = 30) -> float:
        """SIGTERM, wait for the exit, start again: seconds from SIGTERM to serving."""
        t0 = time.monotonic()
        rc = self.down(timeout=timeout)
        if rc != 0:
            raise AssertionError(f"vgpud exited {rc} on SIGTERM:\n{self.vgpud.log()}")
        self.start(timeout)
        return time.monotonic() - t0

    def health(self, timeout: float = 10) -> Any:
        """One Health call on the public socket."""
        return self.vgpud.stub.Health(pb.HealthRequest(), timeout=timeout)

    def close(self) -> None:
        """Stop vgpud; close and remove the sockets (as stopping vgpud.socket would)."""
        self.vgpud.close()
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for s in self.sockets:
            s.close()
        for p in self.paths:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def activated_vgpud(tmp: Path, config: dict[str, Any],
                    devices: str = "16Gi") -> tuple[Path, SocketActivation]:
    """Like support.vgpud_harness.simgpu_vgpud, under socket activation: (sim dir, harness),
    vgpud started."""
    from support.paths import SIMGPU_DIR
    from support.process import clean_env

    sim = tmp / "sim"
    sim.mkdir()
    env = clean_env()
    env["SIMGPU_STATE"] = str(sim / "simgpu.state")
    config = {"nvml": {"library": str(SIMGPU_DIR / "libnvidia-ml.so.1")}, **config}
    act = SocketActivation(Vgpud(tmp, env, config, devices=devices))
    try:
        act.start()
    except BaseException:
        act.close()
        raise
    return sim, act
