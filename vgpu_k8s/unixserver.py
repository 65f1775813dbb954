# SPDX-License-Identifier: Apache-2.0
"""A gRPC server on a unix socket file it owns: the kubelet's plugin sockets.

The kubelet removes (device plugins) or rescans (plugin registry) these files when it
restarts, and a previous plugin may have left one behind: start() replaces a stale file,
serving() says whether the file at the path is still the one this server made, and
stop() removes it only then (never a file another process made since). taken() tells a
socket another live server made at the path (a newer plugin beside this one during a
DaemonSet surge update) from one that is gone or dead (the kubelet removed it, or its
server exited), so a plugin can stand aside rather than take the path back.
"""
from __future__ import annotations

import contextlib
import os
import socket as _socket
import stat
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

__all__ = ["SUN_PATH_MAX", "UnixGrpcServer", "too_long"]

# The longest path a unix socket can be bound at (sockaddr_un.sun_path less its NUL):
# gRPC fails a longer one with a traceback, so the flags that place sockets are checked.
SUN_PATH_MAX = 107


def too_long(*sockets: Path) -> str | None:
    """Why one of these socket paths cannot be bound, or None when all fit."""
    for path in sockets:
        size = len(os.fsencode(path))
        if size > SUN_PATH_MAX:
            return (f"puts the socket {path} at {size} bytes, and a unix socket's path "
                    f"holds at most {SUN_PATH_MAX}")
    return None


class UnixGrpcServer:
    """One gRPC server on `socket`; `add` registers its servicers."""

    def __init__(self, socket: Path, add: Callable[[grpc.Server], None], *,
                 workers: int, name: str) -> None:
        self.socket = Path(socket)
        self._add = add
        self._workers = workers
        self._name = name
        self._server: grpc.Server | None = None
        self._inode = 0

    def start(self) -> None:
        """Serve (a file a previous plugin left at the path is replaced)."""
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._workers,
                                                        thread_name_prefix=self._name))
        self._add(server)
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self._server = server
        self._inode = os.stat(self.socket).st_ino

    def serving(self) -> bool:
        """Whether the socket file is still the one this server made."""
        try:
            return self._server is not None and os.stat(self.socket).st_ino == self._inode
        except FileNotFoundError:
            return False

    def taken(self, timeout_s: float = 0.5) -> bool:
        """Whether another server answers on the path: a socket that is not ours and that
        accepts a connection (a stale file or a dead server's refuses one)."""
        try:
            st = os.stat(self.socket)
        except FileNotFoundError:
            return False
        if st.st_ino == self._inode or not stat.S_ISSOCK(st.st_mode):
            return False
        with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as probe:
            probe.settimeout(timeout_s)
            try:
                probe.connect(str(self.socket))
            except OSError:
                return False
        return True

    def stop(self, grace_s: float = 1.0) -> None:
        """Finish the calls in flight (up to grace_s), stop, remove our socket file."""
        if self._server is None:
            return
        self._server.stop(grace_s).wait()
        self._server = None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.socket).st_ino == self._inode:
                self.socket.unlink()
