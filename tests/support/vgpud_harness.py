# SPDX-License-Identifier: Apache-2.0
"""A real vgpud for tests: a subprocess on simgpu with every path in a temporary tree."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import yaml

from arbiter.daemon.events import read_events
from arbiter.proto import vgpu_pb2 as pb
from arbiter.proto import vgpu_pb2_grpc
from support.paths import ROOT


class Vgpud:
    """One vgpud process and a client to it; start()/stop()/kill() may be repeated."""

    def __init__(self, tmp: Path, env: dict[str, str], config: dict[str, Any] | None = None,
                 devices: str = "16Gi") -> None:
        self.tmp = tmp
        self.socket = tmp / "vgpud.sock"
        self.state_dir = tmp / "state"
        self.run_dir = tmp / "run"
        self.runc = tmp / "runc"
        self.runc.mkdir(exist_ok=True)
        self.config_file = tmp / "config.yaml"
        self.env = dict(env)
        self.env["SIMGPU_DEVICES"] = devices
        self.env["PYTHONPATH"] = str(ROOT)
        self.env["PYTHONUNBUFFERED"] = "1"
        self.proc: subprocess.Popen[bytes] | None = None
        #: Put before the command and kept open in the child (support/socket_activation.py).
        self.wrapper: list[str] = []
        self.pass_fds: tuple[int, ...] = ()
        self.log_path = tmp / "vgpud.log"
        self.metrics_port = 0
        self._channel: grpc.Channel | None = None
        self.stub: Any = None
        self.write_config(config or {})

    def write_config(self, config: dict[str, Any]) -> None:
        """Write the config file: the test's sections over the harness's defaults."""
        doc: dict[str, Any] = {
            "metrics": {"address": "127.0.0.1:0"},
            "devices": {"nodes": {"*": ["/dev/null"]}},
            "reconcile": {"interval_s": 3600, "runtime_state_roots": [str(self.runc)]},
            # The broker outlives vgpud (restarts); a test's goes soon after its vgpud.
            "broker": {"orphan_s": 2},
        }
        for section, values in config.items():
            doc.setdefault(section, {}).update(values)
        self.config_file.write_text(yaml.safe_dump(doc))

    @property
    def events_path(self) -> Path:
        return self.state_dir / "events.jsonl"

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Events vgpud wrote so far (of one kind)."""
        out = read_events(self.events_path)  # with the generations rotation kept
        return [e for e in out if kind is None or e["kind"] == kind]

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "vgpud", "--config", str(self.config_file),
                "--socket", str(self.socket), "--state-dir", str(self.state_dir),
                "--run-dir", str(self.run_dir)]

    def start(self, timeout: float = 30) -> Vgpud:
        """Start vgpud and wait until Health answers."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen([*self.wrapper, *self.command()], env=self.env, cwd=ROOT,
                                     stdout=log, stderr=log, pass_fds=self.pass_fds)
        log.close()
        self._channel = grpc.insecure_channel(f"unix:{self.socket}")
        self.stub = vgpu_pb2_grpc.ArbiterStub(self._channel)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"vgpud exited {self.proc.returncode}:\n{self.log()}")
            try:
                self.stub.Health(pb.HealthRequest(), timeout=1)
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"vgpud did not start:\n{self.log()}") from None
                time.sleep(0.05)
        ports = re.findall(r"serving metrics on http://[^ ]+:(\d+)/metrics", self.log())
        self.metrics_port = int(ports[-1]) if ports else 0
        return self

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Signal vgpud and wait for it to exit; return its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=timeout)
        self._close_channel()
        return rc

    def kill(self) -> None:
        """SIGKILL: no chance to clean up."""
        self.stop(signal.SIGKILL)

    def wait_for(self, predicate: Any, timeout: float = 15, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.log()}")
            time.sleep(0.05)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_channel()
        self.stop_broker()
        unmount_under(self.run_dir)  # the slices' own tmpfs outlive a killed vgpud

    def stop_broker(self) -> None:
        """SIGTERM the vgpu-broker vgpud left serving (it outlives vgpud by design)."""
        try:
            pid = int((self.run_dir / "vgpu-broker.pid").read_text().strip())
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return
        if b"vgpu-broker" in argv and os.fsencode(str(self.run_dir)) in argv:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def unmount_under(root: Path) -> None:
    """Lazily unmount every mount at or below root (slices' tmpfs, their .req binds, the
    run dir's own bind)."""
    top = str(root).rstrip("/")
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        points = [line.split()[4] for line in f]
    for point in sorted((p for p in points if p == top or p.startswith(top + "/")),
                        reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def env_without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


__all__ = ["Vgpud", "env_without", "pb", "unmount_under"]


def simgpu_vgpud(tmp: Path, config: dict[str, Any], devices: str = "16Gi") -> tuple[Path, Vgpud]:
    """A started vgpud on a private simulated GPU whose state lives in tmp/sim (bind-mount
    it at /sim in containers that should see the same GPU): (that directory, vgpud)."""
    from support.paths import SIMGPU_DIR
    from support.process import clean_env

    sim = tmp / "sim"
    sim.mkdir()
    env = clean_env()
    env["SIMGPU_STATE"] = str(sim / "simgpu.state")
    config = {"nvml": {"library": str(SIMGPU_DIR / "libnvidia-ml.so.1")}, **config}
    return sim, Vgpud(tmp, env, config, devices=devices).start()


class Takeover:
    """A second vgpud on the same dirs with `--wait-lock` (a DaemonSet's new pod), its
    output in `log_path`; a context manager that kills it if a test left it running."""

    def __init__(self, old: Vgpud, log_path: Path, wait_s: float = 60) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen([*old.command(), "--wait-lock", f"{wait_s:g}"],
                                         env=old.env, stdout=log, stderr=log)
        self.waiting_line = f"waiting up to {wait_s:g}s"

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_waiting(self, also: Any = lambda: True, timeout: float = 30) -> None:
        """Until it says it waits for the lock (and `also()` holds)."""
        deadline = time.monotonic() + timeout
        while self.waiting_line not in self.log() or not also():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log()
            time.sleep(0.05)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def __enter__(self) -> Takeover:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
