# SPDX-License-Identifier: Apache-2.0
"""The CLI's connection to vgpud: its gRPC API on a unix socket, with every failure
turned into one CliError line that names the socket.

grpc and the generated stubs are imported on first use: `vgpu --help` and argument
errors do not pay for them.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from vgpu_cli.errors import CliError

__all__ = ["Client", "check_socket", "connect", "messages", "rpc_error", "unreachable"]


@dataclass
class Client:
    """A connection to vgpud: the stub, the socket path (for messages) and the deadline."""

    socket: str
    timeout: float
    stub: Any
    channel: Any

    def call(self, method: str, request: object) -> Any:
        """Call one RPC; turn every gRPC failure into one CliError line."""
        import grpc

        try:
            return getattr(self.stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise rpc_error(e, self.socket, self.timeout) from e

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()


def unreachable(socket: str, cause: str) -> CliError:
    """The one line for "vgpud is not there"."""
    return CliError(f"cannot reach vgpud at {socket}: {cause} "
                    "(is vgpud running? start it with 'vgpud' or pass --socket)")


def check_socket(path: str) -> None:
    """Fail early, with a precise cause, when the socket path cannot be vgpud's."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise unreachable(path, "no such socket") from None
    except PermissionError:
        raise unreachable(path, "permission denied") from None
    except NotADirectoryError:
        raise unreachable(path, "no such socket") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise unreachable(path, "not a socket")
    if not os.access(path, os.R_OK | os.W_OK):
        raise CliError(f"cannot reach vgpud at {path}: permission denied "
                       "(the socket is for root; run vgpu as root)")


def rpc_error(e: Any, socket: str, timeout: float) -> CliError:
    """Map a grpc.RpcError to the CLI's one line."""
    import grpc

    code = e.code() if hasattr(e, "code") else None
    details = (e.details() if hasattr(e, "details") else "") or str(code)
    details = " ".join(str(details).split())  # one line, whatever the server sent
    name = code.name if code is not None else None
    if code == grpc.StatusCode.UNAVAILABLE:
        cause = "connection refused" if "refused" in details.lower() else details
        e2 = unreachable(socket, cause)
        e2.status = name
        return e2
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CliError(f"vgpud at {socket} did not answer within {timeout:g}s", name)
    return CliError(details, name)


@contextmanager
def connect(socket: str, timeout: float) -> Iterator[Client]:
    """Open a channel to vgpud's unix socket (after checking the path is a socket)."""
    check_socket(socket)
    import grpc

    from arbiter.proto import vgpu_pb2_grpc

    channel = grpc.insecure_channel(f"unix:{socket}")
    stub = vgpu_pb2_grpc.ArbiterStub(channel)
    client = Client(socket, timeout, stub, channel)
    try:
        yield client
    finally:
        client.close()


def messages() -> Any:
    """The generated message classes of vgpud's API (arbiter/proto/vgpu.proto)."""
    from arbiter.proto import vgpu_pb2

    return vgpu_pb2
