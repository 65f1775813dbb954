# SPDX-License-Identifier: Apache-2.0
"""vgpud's container-lifecycle socket: the compiled vgpu-runtime and vgpu-hook ask here.

The programs engines run for every container hold only mechanisms (argv, exec, mounts);
what to do is decided here, inside vgpud, which is warm (config, schema, placement in
memory) and uses its own loaded config: a request names no config file or socket.

The socket is `<gRPC socket>.lifecycle` (beside `<gRPC socket>.lock`), mode 0600:
root only, like the gRPC socket.

Framing (both directions): a 4-byte big-endian length, then that many bytes of
`key=value` fields, each ended by a NUL byte. Keys may repeat; order matters only
where a reply says so (a `mount=` field starts a new mount). No escaping is needed
(paths and JSON hold no NUL), so a C client reads it with strchr. Every message
carries `v=<version>`. Negotiation: the client sends its version; vgpud accepts its
own (VERSION) and the one the previous release's programs speak (PREVIOUS), and
answers in the client's version, so the programs of release N-1 keep working with
vgpud N during an upgrade (docs/upgrading.md). Any other version is answered with an
error that names both (in the client's version, which its program prints).
A new op within a version is no new version: a client only sends ops it knows.

Replies: `status=` one of
  ok        nothing (more) to do
  mount     prestart: the mount plan (oci_hook.mounts.Plan.to_fields)
  error     `message=` the one line to show the user
"""
from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ACCEPTED",
    "CLIENTS",
    "MAX_FRAME",
    "PREVIOUS",
    "VERSION",
    "Fields",
    "LifecycleServer",
    "Op",
    "ProtocolError",
    "Reply",
    "decode",
    "encode",
    "lifecycle_socket",
    "read_frame",
    "request",
    "write_frame",
]

log = logging.getLogger("vgpud")

#: The lifecycle protocol this vgpud speaks (oci_hook/native/vg_defaults.h says the same).
VERSION = "2"
#: The version the previous release's programs speak (0.1.0: v2; frames unchanged since).
PREVIOUS = "2"
#: The versions vgpud answers, its own first.
ACCEPTED: tuple[str, ...] = tuple(dict.fromkeys((VERSION, PREVIOUS)))
#: Which program sends each op: the version-mismatch line names it.
CLIENTS: Mapping[str, str] = {"runtime-create": "vgpu-runtime", "prestart": "vgpu-hook",
                              "poststop": "vgpu-hook", "claim-prestart": "vgpu-hook",
                              "release": "vgpu-runtime or vgpu-hook"}
#: A request is an OCI state or a few paths; anything bigger is not one of ours.
MAX_FRAME = 1 << 20
#: A client that connects must send its request at once (it has it ready).
_READ_TIMEOUT_S = 5.0
#: How long close() waits for answers in flight.
_DRAIN_S = 5.0
#: The warm-up waits this long after start: a restart's first answers (Health, the calls
#: queued in the backlog) come first, not sharing vgpud's one Python core with it; an op
#: that needs it before makes what it needs itself.
_WARM_AFTER_S = 1.0
_HEADER = struct.Struct(">I")


def lifecycle_socket(grpc_socket: str | Path) -> Path:
    """The lifecycle socket of the vgpud serving gRPC on `grpc_socket`."""
    return Path(f"{grpc_socket}.lifecycle")


class ProtocolError(ValueError):
    """A frame that is not a lifecycle message."""


@dataclass
class Fields:
    """A decoded message: the (key, value) pairs in order, with lookups."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def get(self, key: str, default: str = "") -> str:
        """The first value of `key`."""
        for k, v in self.items:
            if k == key:
                return v
        return default

    def as_dict(self) -> dict[str, str]:
        """The first value of every key."""
        out: dict[str, str] = {}
        for k, v in self.items:
            out.setdefault(k, v)
        return out


def encode(items: Iterable[tuple[str, str]]) -> bytes:
    """One frame of `key=value\\0` fields."""
    parts = []
    for k, v in items:
        if "\0" in k or "=" in k or "\0" in v:
            raise ProtocolError(f"field {k!r} cannot be framed (NUL or '=' in the key)")
        parts.append(f"{k}={v}\0".encode())
    body = b"".join(parts)
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"message of {len(body)} bytes is over {MAX_FRAME}")
    return _HEADER.pack(len(body)) + body


def decode(body: bytes) -> Fields:
    """The fields of one frame's body."""
    if body and not body.endswith(b"\0"):
        raise ProtocolError("the last field is not NUL-terminated")
    out = Fields()
    for raw in body.split(b"\0")[:-1]:
        key, sep, value = raw.partition(b"=")
        if not sep or not key:
            raise ProtocolError(f"field {raw[:40]!r} is not key=value")
        try:
            out.items.append((key.decode(), value.decode()))
        except UnicodeDecodeError as e:
            raise ProtocolError(f"field {raw[:40]!r} is not UTF-8") from e
    return out


def _read_exact(sock: socket.socket, n: int) -> bytes:
    chunks: list[bytes] = []
    while n:
        chunk = sock.recv(min(n, 65536))
        if not chunk:
            raise ProtocolError("the peer closed the connection mid-frame")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> Fields:
    """Read one frame from `sock`."""
    (size,) = _HEADER.unpack(_read_exact(sock, _HEADER.size))
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes is over {MAX_FRAME}")
    return decode(_read_exact(sock, size))


def write_frame(sock: socket.socket, items: Iterable[tuple[str, str]]) -> None:
    """Write one frame to `sock`."""
    sock.sendall(encode(items))


@dataclass
class Reply:
    """What an op answers, and what to undo when the answer cannot be delivered."""

    items: list[tuple[str, str]]
    undo: Callable[[], None] | None = None

    @classmethod
    def of(cls, status: str, *items: tuple[str, str],
           undo: Callable[[], None] | None = None) -> Reply:
        """A reply with `status` and more fields."""
        return cls([("v", VERSION), ("status", status), *items], undo)

    @classmethod
    def error(cls, message: str) -> Reply:
        """The one line the user sees."""
        line = " ".join(message.split())
        return cls.of("error", ("message", line if line.startswith("vgpu: ") else
                                f"vgpu: {line}"))


#: An op: the request's fields in, the reply out.
Op = Callable[[Fields], Reply]


def _in_version(v: str, reply: Reply) -> Reply:
    """The reply in the client's protocol version (ours when it sent none we can name):
    a client checks the version of what it reads before anything else."""
    v = v if v and v.isdigit() and len(v) <= 4 else VERSION
    reply.items = [("v", v) if k == "v" else (k, x) for k, x in reply.items]
    return reply


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(_READ_TIMEOUT_S)
        try:
            request = read_frame(sock)
        except (OSError, ProtocolError) as e:
            log.warning("lifecycle: bad request: %s", e)
            return
        reply = self.server.owner.dispatch(request)
        try:
            write_frame(sock, reply.items)
        except (OSError, ProtocolError) as e:
            # The client is gone (killed, or timed out): it will not act on the answer,
            # so nothing it was given may stay allocated.
            log.warning("lifecycle: %s: could not answer (%s); undoing", request.get("op"), e)
            if reply.undo is not None:
                try:
                    reply.undo()
                except Exception:
                    log.exception("lifecycle: undo failed (the reconciler frees it)")


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    owner: LifecycleServer
    #: Container starts arriving together (or while vgpud restarts) wait in the kernel,
    #: not refused: socketserver's default of 5 would refuse the sixth.
    request_queue_size = 512
    #: Requests answered at once; more wait in the listen backlog. Each takes a few ms
    #: of vgpud's one Python core, so more threads would only add switching (and a
    #: flood of connections must not become a flood of threads).
    max_concurrent = 32

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(self.max_concurrent)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.slots.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def accept_one(self) -> None:
        """Accept the waiting connection and hand it to a thread (serve_forever's step)."""
        try:
            request, client_address = self.get_request()
        except OSError:
            return
        try:
            self.process_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
            self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class LifecycleServer:
    """The lifecycle socket, served by threads of vgpud's process."""

    def __init__(self, path: Path, ops: Mapping[str, Op],
                 warm: Callable[[], None] | None = None) -> None:
        self.path = Path(path)
        self.ops = dict(ops)
        #: Run in a thread once serving (_WARM_AFTER_S later): what the ops need, made
        #: before most requests ask.
        self.warm = warm
        self._closing = threading.Event()
        #: What vgpud's Health reports of it (`vgpu info`).
        self.paths = {"lifecycle_socket": str(self.path)}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None  # close() writes to [1]: the loop stops
        #: A listening socket a service manager passed (vgpud restarts keep it).
        self._inherited: socket.socket | None = None

    def dispatch(self, request: Fields) -> Reply:
        """Answer one request; never raises."""
        name, theirs = request.get("op"), request.get("v")
        if theirs not in ACCEPTED:
            client = CLIENTS.get(name, "the client")
            ours = " and v".join(ACCEPTED)
            return _in_version(theirs, Reply.error(
                f"{client} speaks lifecycle protocol v{theirs or '?'}; "
                f"vgpud at {self.path} speaks v{ours}"))
        return _in_version(theirs, self._answer(name, request))

    def _answer(self, name: str, request: Fields) -> Reply:
        op = self.ops.get(name)
        if op is None:
            return Reply.error(f"unknown lifecycle op {name!r} (vgpud at {self.path} "
                               f"answers {', '.join(sorted(self.ops))})")
        try:
            return op(request)
        except Exception as e:
            log.exception("lifecycle: %s failed", request.get("op"))
            return Reply.error(f"internal error: {type(e).__name__}: {e}")

    def serve_on(self, sock: socket.socket) -> None:
        """Serve on this inherited listening socket at start (the path is left alone)."""
        self._inherited = sock

    def start(self) -> None:
        """Listen (the socket is born 0600), or take the inherited one, and serve in a thread."""
        if self._inherited is not None:
            server = _Server(str(self.path), _Handler, bind_and_activate=False)
            server.socket.close()
            server.socket = self._inherited
        else:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # vgpud holds the socket's lock: a file here is stale
            old = os.umask(0o177)
            try:
                server = _Server(str(self.path), _Handler, bind_and_activate=True)
            finally:
                os.umask(old)
        server.owner = self
        self._server = server
        self._wake = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=_accept_loop, args=(server, self._wake[0]),
                                        name="vgpud-lifecycle", daemon=True)
        self._thread.start()
        if self.warm is not None:
            threading.Thread(target=_warm, args=(self.warm, self._closing),
                             name="vgpud-lifecycle-warm", daemon=True).start()

    def close(self) -> None:
        """Stop accepting, let the answers in flight finish (a restart must not cut a
        container start off mid-answer), remove the socket unless it was inherited
        (connections not yet accepted then wait in its backlog for the next vgpud)."""
        if self._server is None:
            return
        server, self._server = self._server, None
        self._closing.set()
        deadline = time.monotonic() + _DRAIN_S
        # The loop wakes at once (socketserver's shutdown() would wait for its poll).
        assert self._wake is not None and self._thread is not None
        os.write(self._wake[1], b"x")
        self._thread.join(_DRAIN_S)
        server.server_close()
        for fd in self._wake:
            os.close(fd)
        self._wake = None
        taken = 0
        while taken < server.max_concurrent and server.slots.acquire(
                timeout=max(0.0, deadline - time.monotonic())):
            taken += 1
        if self._inherited is None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def _warm(warm: Callable[[], None], closing: threading.Event) -> None:
    """Run `warm` _WARM_AFTER_S after start unless closing by then; a failure is one log
    line (an op that needs it fails with its own)."""
    if closing.wait(_WARM_AFTER_S):
        return
    try:
        warm()
    except Exception as e:
        log.warning("lifecycle: preparing the ops failed: %s", e)


def _accept_loop(server: _Server, wake: int) -> None:
    """Accept and hand each connection to a thread until `wake` is readable."""
    poller = select.poll()
    poller.register(server.fileno(), select.POLLIN)
    poller.register(wake, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll()}
        if wake in ready:
            return
        server.accept_one()


def request(path: str | Path, items: Sequence[tuple[str, str]], timeout: float = 10.0) -> Fields:
    """One round trip at this protocol version (tests and tools; the C programs speak the
    same frames)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        write_frame(s, [("v", VERSION), *items])
        return read_frame(s)
