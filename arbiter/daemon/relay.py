# SPDX-License-Identifier: Apache-2.0
"""A byte relay from an inherited listening socket to vgpud's gRPC server.

grpcio's Python server cannot serve a listening fd it did not bind (its only way in is
`add_insecure_port`, which binds a new socket; C-core's from-fd call is not exposed to
Python as of grpcio 1.6x-1.8x). Under socket activation the socket at the public path is
the service manager's and must survive vgpud, so vgpud serves gRPC on a private socket in
its run dir (0600) and this relay accepts on the public one and pipes every connection
through, bytes unchanged, one thread per connection (gRPC clients hold a channel open:
the CLI one per command, the device plugin one for its life).
"""
from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
from pathlib import Path

__all__ = ["Relay"]

log = logging.getLogger("vgpud")

_CHUNK = 1 << 16
#: Connections piped at once; more wait in the kernel backlog.
_MAX_CONNECTIONS = 256


class Relay:
    """Accepts on `listener` and pipes each connection to the unix socket at `target`."""

    def __init__(self, listener: socket.socket, target: Path) -> None:
        self.listener = listener
        self.target = str(target)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Accept in a thread until close()."""
        self._thread = threading.Thread(target=self._accept_loop, name="vgpud-relay",
                                        daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        poller = select.poll()
        poller.register(self.listener.fileno(), select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            self._slots.acquire()
            try:
                # Non-blocking accept: the listener's file description is shared with the
                # service manager; never switch it to O_NONBLOCK for everyone.
                conn, _ = self.listener.accept() if _readable(self.listener) else (None, None)
            except OSError as e:
                self._slots.release()
                log.warning("relay: accept failed: %s", e)
                continue
            if conn is None:
                self._slots.release()
                continue
            threading.Thread(target=self._pipe, args=(conn,), name="vgpud-relay-conn",
                             daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                upstream.connect(self.target)
            except OSError as e:
                log.warning("relay: cannot reach the gRPC server at %s: %s", self.target, e)
                return
            with self._lock:
                self._conns.update((client, upstream))
            _splice(client, upstream)
        finally:
            with self._lock:
                self._conns.discard(client)
                self._conns.discard(upstream)
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.close()
            self._slots.release()

    def close(self) -> None:
        """Stop accepting (queued connections stay in the backlog for the next vgpud) and
        end the open ones; the listener is closed here, the manager keeps its copy."""
        os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            for s in list(self._conns):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.listener.close()
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _readable(sock: socket.socket) -> bool:
    """A connection is waiting (poll says so again right before accept)."""
    return bool(select.select([sock], [], [], 0)[0])


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until both directions ended; a half-close is passed on."""
    open_from = {a.fileno(): (a, b), b.fileno(): (b, a)}
    poller = select.poll()
    for fd in open_from:
        poller.register(fd, select.POLLIN)
    while open_from:
        for fd, _ in poller.poll():
            if fd not in open_from:
                continue
            src, dst = open_from[fd]
            try:
                data = src.recv(_CHUNK)
            except OSError:
                data = b""
            if data:
                try:
                    dst.sendall(data)
                    continue
                except OSError:
                    return
            # EOF (or reset) on src: pass the half-close on and stop reading it.
            poller.unregister(fd)
            del open_from[fd]
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
