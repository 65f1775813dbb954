# SPDX-License-Identifier: Apache-2.0
"""Helpers for the tests of the compiled programs (vgpu-runtime, vgpu-hook,
containerd-shim-vgpu-v2): running them in a clean environment, a stand-in vgpud that
speaks the lifecycle framing on a real unix socket, and recording stand-ins for the
programs they exec (a lower runtime, containerd's runc shim)."""
from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from support.paths import NATIVE_BIN
from support.process import clean_env

__all__ = ["FakeVgpud", "Recorder", "Tree", "program", "run_program"]

Fields = list[tuple[str, str]]


def program(name: str) -> Path:
    """A compiled program of build/bin (`make` builds it)."""
    path = NATIVE_BIN / name
    assert path.is_file(), f"{path} is missing: run make"
    return path


def run_program(args: list[str | Path], env: dict[str, str] | None = None, *,
                input: str | None = None, timeout: float = 30,
                cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a program with a clean environment (no VGPU_* but what `env` adds)."""
    full = clean_env()
    full.update(env or {})
    return subprocess.run([str(a) for a in args], env=full, input=input, capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


class Recorder:
    """An executable shell script at `path` that writes its argv (one per line) to
    `<path>.argv` and the named environment variables to `<path>.env`, then exits 0
    (or runs `then`, a shell line)."""

    def __init__(self, path: Path, env_names: tuple[str, ...] = (), then: str = "") -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = ["#!/bin/sh", 'printf "%s\\n" "$@" > "$0.argv"', ': > "$0.env"']
        lines += [f'printf "{n}=%s\\n" "${{{n}-<unset>}}" >> "$0.env"' for n in env_names]
        lines.append(then or "exit 0")
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o755)

    @property
    def ran(self) -> bool:
        return Path(f"{self.path}.argv").exists()

    def argv(self) -> list[str]:
        return Path(f"{self.path}.argv").read_text().splitlines()

    def env(self) -> dict[str, str]:
        text = Path(f"{self.path}.env").read_text()
        return dict(line.split("=", 1) for line in text.splitlines())


def _read_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def encode(fields: Fields) -> bytes:
    """One frame: a 4-byte big-endian length, then key=value fields each ended by NUL."""
    body = b"".join(f"{k}={v}".encode() + b"\0" for k, v in fields)
    return struct.pack(">I", len(body)) + body


class FakeVgpud:
    """A lifecycle socket at `path` answering each request with `answer(request)`
    (a list of fields, sent as they are: the test chooses the version); every request
    is recorded, as a list of (key, value), in `requests`. As a context manager it
    listens inside the block."""

    def __init__(self, path: Path, answer: Callable[[Fields], Fields]) -> None:
        self.path = path
        self.answer = answer
        self.requests: list[Fields] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(0.05)
        self._bound = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def bind(self) -> FakeVgpud:
        """Bind without listening: a connect is refused, as with a stale socket file."""
        self._sock.bind(str(self.path))
        self._bound = True
        return self

    def listen(self) -> FakeVgpud:
        if not self._bound:
            self.bind()
        self._sock.listen(16)
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(10)
            with conn:
                try:
                    (length,) = struct.unpack(">I", _read_exact(conn, 4))
                    body = _read_exact(conn, length)
                except (ConnectionError, OSError):
                    continue
                request = [(k, v) for k, _, v in
                           (f.partition("=") for f in body.decode().split("\0")[:-1])]
                self.requests.append(request)
                with contextlib.suppress(OSError):   # a client that gave up
                    conn.sendall(encode(self.answer(request)))

    def __enter__(self) -> FakeVgpud:
        if not self._thread.is_alive():
            self.listen()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ops(self) -> list[str]:
        return [dict(r).get("op", "") for r in self.requests]

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class Tree:
    """A program's temporary tree: a config file (hook.wait_s = `wait_s`) and vgpud's
    socket path, where nothing listens unless a FakeVgpud from vgpud() does."""

    def __init__(self, tmp: Path, wait_s: float) -> None:
        self.tmp = tmp
        self.config = tmp / "config.yaml"
        self.write_config(f"hook:\n  wait_s: {wait_s}\n")
        self.socket = tmp / "vgpud.sock"
        self.lifecycle = Path(f"{self.socket}.lifecycle")
        self.path = "/usr/sbin:/usr/bin:/sbin:/bin"

    def write_config(self, text: str) -> None:
        self.config.write_text(text)

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": self.path, "VGPU_CONFIG": str(self.config),
                "VGPU_SOCKET": str(self.socket), **extra}

    def vgpud(self, answer: Callable[[Fields], Fields]) -> FakeVgpud:
        return FakeVgpud(self.lifecycle, answer)
