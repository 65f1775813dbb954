# SPDX-License-Identifier: Apache-2.0
"""Listening sockets inherited from a service manager (systemd socket activation).

The protocol (sd_listen_fds(3)): the manager binds the sockets, forks, and in the child
sets `LISTEN_PID` to the child's pid, `LISTEN_FDS` to how many sockets it passes (as fds
3, 4, ...) and optionally `LISTEN_FDNAMES` (their names, colon separated). Variables
naming another pid are not ours (a parent's, leaked through a shell) and are ignored.
Whatever they say, they are removed from the environment, so that no child of vgpud
(the broker, a hook) believes it was passed them too.

vgpud matches an inherited socket to what it would otherwise bind by the path it is
bound to (one `.socket` unit gives both of its sockets one FileDescriptorName), else by
name. Each one must be a listening AF_UNIX stream socket: anything else is a broken unit
file, and vgpud refuses to start with one line naming the fd.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from arbiter.errors import VgpuError

__all__ = ["FIRST_FD", "ActivationError", "Inherited", "Listeners", "from_environ"]

log = logging.getLogger("vgpud")

#: SD_LISTEN_FDS_START: the first passed fd.
FIRST_FD = 3
_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
#: More than this is not a vgpud unit (it listens on two sockets).
_MAX_FDS = 64


class ActivationError(VgpuError):
    """The service manager passed something vgpud cannot serve on."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"failed to use the inherited sockets: {reason}")


@dataclass
class Inherited:
    """One passed listening socket: its fd's socket object, name and bound path."""

    sock: socket.socket
    name: str
    path: str


def _check(fd: int, name: str) -> Inherited:
    """The socket at fd, checked to be a listening AF_UNIX stream socket."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError as e:
        raise ActivationError(f"fd {fd} ({name}): {e.strerror}") from e
    if not stat.S_ISSOCK(mode):
        raise ActivationError(f"fd {fd} ({name}) is not a socket")
    sock = socket.socket(fileno=fd)
    try:
        family = sock.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN)
        kind = sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        if family != socket.AF_UNIX or kind != socket.SOCK_STREAM:
            raise ActivationError(f"fd {fd} ({name}) is not a unix stream socket "
                                  "(the unit needs ListenStream=/path)")
        if not listening:
            raise ActivationError(f"fd {fd} ({name}) is not listening (Accept=no is needed)")
        bound = sock.getsockname()
    except BaseException:
        sock.detach()  # the fd stays the manager's business until we take it
        raise
    path = bound.decode(errors="replace") if isinstance(bound, bytes) else str(bound)
    # Ours now: not inherited by the broker or anything else vgpud runs.
    sock.set_inheritable(False)
    return Inherited(sock, name, path)


def from_environ(environ: MutableMapping[str, str] | None = None,
                 pid: int | None = None, first_fd: int = FIRST_FD) -> Listeners:
    """The sockets passed to this process (none without the variables), the variables
    removed from `environ` (os.environ by default) either way."""
    env = os.environ if environ is None else environ
    values = {k: env.pop(k, None) for k in _VARS}
    raw_pid, raw_n, raw_names = values["LISTEN_PID"], values["LISTEN_FDS"], values["LISTEN_FDNAMES"]
    if raw_pid is None or raw_n is None:
        return Listeners([])
    me = os.getpid() if pid is None else pid
    if not raw_pid.strip().isdigit() or int(raw_pid) != me:
        log.debug("LISTEN_PID=%s is not this process (%d): ignoring LISTEN_FDS", raw_pid, me)
        return Listeners([])
    if not raw_n.strip().isdigit() or not 0 < int(raw_n) <= _MAX_FDS:
        raise ActivationError(f"LISTEN_FDS={raw_n!r} is not a count from 1 to {_MAX_FDS}")
    n = int(raw_n)
    names = raw_names.split(":") if raw_names else []
    if names and len(names) != n:
        raise ActivationError(f"LISTEN_FDNAMES={raw_names!r} names {len(names)} sockets, "
                              f"LISTEN_FDS={n}")
    out: list[Inherited] = []
    try:
        for i in range(n):
            out.append(_check(first_fd + i, names[i] if names else "unknown"))
    except BaseException:
        for got in out:
            got.sock.detach()
        raise
    return Listeners(out)


class Listeners:
    """The inherited sockets not yet taken by a server."""

    def __init__(self, inherited: list[Inherited]) -> None:
        self._left = list(inherited)
        #: True when any socket was passed: vgpud runs under socket activation.
        self.activated = bool(inherited)

    def take(self, name: str, path: Path | str) -> socket.socket | None:
        """The socket bound to `path`, else the only one named `name`; None when neither."""
        want = str(path)
        match = [i for i in self._left if i.path == want]
        if not match:
            named = [i for i in self._left if i.name == name]
            match = named if len(named) == 1 else []
        if not match:
            return None
        self._left.remove(match[0])
        return match[0].sock

    def leftovers(self) -> list[str]:
        """'name (path)' of every socket no server took."""
        return [f"{i.name} ({i.path or 'unbound'})" for i in self._left]

    def close_leftovers(self) -> None:
        """Close the sockets no server took (the manager keeps its own copies)."""
        for i in self._left:
            with contextlib.suppress(OSError):
                i.sock.close()
        self._left = []
