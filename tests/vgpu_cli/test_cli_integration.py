# SPDX-License-Identifier: Apache-2.0
"""The `vgpu` CLI against a real vgpud on simgpu, both as subprocesses.

vgpud runs with its socket, state and run dirs in tmp_path and a config that
turns metrics off and reconciles every half second; the CLI is
`python3 -m vgpu_cli`; `vgpu run` children are build/tests/vgpu_probe.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import ROOT, TEST_BIN
from support.process import run

from arbiter.files.sched_files import BROKER_LOCK_NAME

MiB = 1 << 20
PROBE = str(TEST_BIN / "vgpu_probe")
RECONCILE_S = 0.5


class Vgpud:
    """A vgpud subprocess on a private simgpu, and a way to call the CLI against it."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.env = env
        self.socket = tmp / "vgpud.sock"
        self.config = tmp / "config.yaml"
        self.config.write_text(
            "metrics:\n  address: ''\n"
            f"reconcile:\n  interval_s: {RECONCILE_S}\n"
            "broker:\n  orphan_s: 2\n"   # it outlives vgpud; a test's goes soon after
            "devices:\n  nodes: {'*': [/dev/null]}\n")
        self.log = tmp / "vgpud.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "arbiter.daemon.server", "--config", str(self.config),
                 "--socket", str(self.socket), "--state-dir", str(self.tmp / "state"),
                 "--run-dir", str(self.tmp / "run")],
                cwd=ROOT, env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vgpud exited {self.proc.returncode}:\n"
                                     f"{self.log.read_text()}")
            if self.socket.exists() and self.vgpu("ls", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise AssertionError(f"vgpud did not start:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "vgpu_cli", "--socket", str(self.socket), *args]

    def vgpu(self, *args: str, check: bool = True,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run(self.argv(*args), env=self.env, check=check, timeout=timeout, cwd=ROOT)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*args), cwd=ROOT, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def slices(self) -> list[dict]:
        return json.loads(self.vgpu("ls", "--json").stdout)

    def wait_slices(self, n: int, timeout: float = 15) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            slices = self.slices()
            if len(slices) == n or time.monotonic() > deadline:
                return slices
            time.sleep(0.1)


@pytest.fixture
def vgpud(tmp_path: Path, simgpu_env: dict[str, str]) -> Iterator[Vgpud]:
    d = Vgpud(tmp_path, simgpu_env)
    d.start()
    yield d
    d.stop()


def read_until(p: subprocess.Popen[str], op: str, timeout: float = 30) -> dict:
    """Read the probe's JSON lines (through vgpu run's stdout) until one with this op."""
    assert p.stdout is not None
    deadline = time.monotonic() + timeout
    for line in p.stdout:
        if line.startswith("{"):
            entry = json.loads(line)
            if entry["op"] == op:
                return entry
        if time.monotonic() > deadline:
            break
    p.kill()
    raise AssertionError(f"no {op!r} line; stderr: {p.stderr.read() if p.stderr else ''}")


def holder(vgpud: Vgpud, *ops: str, memory: str = "64Mi") -> tuple[subprocess.Popen[str], int]:
    """`vgpu run` of a probe that runs ops then holds: returns (the CLI, the probe's pid)."""
    p = vgpud.popen("run", "--memory", memory, "--", PROBE, *ops, "hold")
    return p, read_until(p, "hold")["pid"]


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


# ---- listings ------------------------------------------------------------------------

def test_devices(vgpud):
    devices = json.loads(vgpud.vgpu("devices", "--json").stdout)
    assert [(d["index"], d["memory_total_bytes"], d["slices"]) for d in devices] == \
        [(0, 16 << 30, 0)]
    table = vgpud.vgpu("devices").stdout.splitlines()
    assert table[0].split()[:2] == ["GPU", "UUID"] and devices[0]["uuid"] in table[1]


def test_ls_smi_json_while_running(vgpud):
    p, pid = holder(vgpud, "info")
    try:
        [s] = vgpud.slices()
        assert s["owner"].startswith("run-") and s["owner_kind"] == "process"
        assert s["owner_pid"] == p.pid
        assert s["vgpus"][0]["memory_bytes"] == 64 * MiB
        ls = vgpud.vgpu("ls").stdout
        assert s["id"] in ls and "64Mi" in ls
        smi = vgpud.vgpu("smi").stdout
        assert s["id"] in smi and "GPU 0" in smi
        assert max(len(line) for line in smi.splitlines()) <= 100
        both = json.loads(vgpud.vgpu("smi", "--json").stdout)
        assert both["slices"][0]["id"] == s["id"] and both["devices"][0]["slices"] == 1
        info = json.loads(vgpud.vgpu("info", "--json").stdout)
        assert info["vgpud"]["reachable"] and info["vgpud"]["slices"] == 1
        paths = info["vgpud"]["paths"]
        assert paths["run_dir"] == str(vgpud.tmp / "run")
        assert paths["socket"] == info["socket"]
        assert paths["state_dir"] == str(vgpud.tmp / "state")
        assert paths["sched_dir"] == str(vgpud.tmp / "run" / "sched")
        assert re.search(r"^vgpud sched dir +" + re.escape(str(vgpud.tmp / "run" / "sched")) + "$",
                         vgpud.vgpu("info").stdout, re.M)
    finally:
        kill_quietly(pid)
        p.wait(30)
    assert vgpud.slices() == []


# ---- vgpu run ------------------------------------------------------------------------

def test_run_limits_the_child_and_releases(vgpud):
    r = vgpud.vgpu("run", "--memory", "64Mi", "--", PROBE, "info", "fill:mem:16777216")
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    info = next(x for x in lines if x["op"] == "info")
    fill = next(x for x in lines if x["op"] == "fill")
    assert info["total"] == 64 * MiB
    assert fill["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert 0 < fill["count"] * 16 * MiB <= 64 * MiB
    assert vgpud.slices() == []


def test_run_passes_exit_status_and_env(vgpud):
    r = vgpud.vgpu("run", "--memory", "1", "--", "sh", "-c",
                   'echo "$LD_PRELOAD|$VGPU_REGION_DIR|$VGPU_SCHED_DIR"; exit 7', check=False)
    assert r.returncode == 7
    preload, region_dir, sched_dir = r.stdout.strip().split("|")
    assert preload.split(":")[0] == str(ROOT / "build" / "libvgpu.so")
    assert region_dir.startswith(str(vgpud.tmp / "run" / "slices"))
    # The host process shares each GPU's compute with the containers on it.
    assert sched_dir == str(vgpud.tmp / "run" / "sched")
    assert sorted(p.name for p in Path(sched_dir).iterdir() if p.name != BROKER_LOCK_NAME) == [
        d["uuid"] for d in json.loads(vgpud.vgpu("devices", "--json").stdout)]
    assert vgpud.slices() == []


def test_run_missing_command_releases(vgpud):
    r = vgpud.vgpu("run", "--memory", "1", "--", "/nonexistent/cmd", check=False)
    assert r.returncode == 127
    assert r.stderr.startswith("vgpu: failed to run /nonexistent/cmd: ")
    assert vgpud.slices() == []


def test_child_killed_by_sigkill_releases(vgpud):
    p, pid = holder(vgpud)
    assert len(vgpud.slices()) == 1
    os.kill(pid, signal.SIGKILL)
    assert p.wait(30) == 128 + signal.SIGKILL
    assert vgpud.slices() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=lambda s: s.name)
def test_signal_to_cli_is_forwarded(vgpud, sig):
    p, pid = holder(vgpud)
    os.kill(p.pid, sig)
    assert p.wait(30) == 128 + sig
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the probe got the signal and died of it
    assert vgpud.slices() == []


def test_cli_killed_reconciler_releases(vgpud):
    p, pid = holder(vgpud)
    try:
        [s] = vgpud.slices()
        p.kill()  # SIGKILL: no finally runs; owner_pid is gone
        p.wait(10)
        assert vgpud.wait_slices(0, timeout=10 + 10 * RECONCILE_S) == []
    finally:
        kill_quietly(pid)
    assert s["owner_pid"] == p.pid


def test_update_seen_by_running_child(vgpud):
    p = vgpud.popen("run", "--memory", "64Mi", "--", PROBE, "info", "sleep:2000", "info",
                    "hold")
    try:
        assert read_until(p, "info")["total"] == 64 * MiB
        [s] = vgpud.slices()
        out = json.loads(vgpud.vgpu("update", s["id"], "--memory", "128Mi", "--compute", "30",
                                    "--json").stdout)
        assert out["vgpus"][0]["memory_bytes"] == 128 * MiB
        assert out["vgpus"][0]["compute_percent"] == 30
        assert read_until(p, "info")["total"] == 128 * MiB
        pid = read_until(p, "hold")["pid"]
        table = vgpud.vgpu("update", s["id"], "--compute", "40").stdout
        assert "40%" in table and "128Mi" in table
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_release_by_id_and_by_owner(vgpud):
    procs = [holder(vgpud), holder(vgpud)]
    try:
        a, b = sorted(vgpud.slices(), key=lambda s: s["id"])
        r = vgpud.vgpu("release", a["id"])
        assert r.stdout.strip() == f"released slice {a['id']}"
        r = vgpud.vgpu("release", b["owner"])
        assert r.stdout.strip() == f"released slice {b['id']}"
        assert vgpud.slices() == []
        r = vgpud.vgpu("release", a["id"], check=False)
        assert r.returncode == 1
        assert r.stderr == (f"vgpu: failed to release slice {a['id']}: "
                            "no slice has this id or owner\n")
    finally:
        for p, pid in procs:
            kill_quietly(pid)
            p.wait(30)


# ---- errors --------------------------------------------------------------------------

def test_no_capacity_is_one_line(vgpud):
    marker = vgpud.tmp / "ran"
    r = vgpud.vgpu("run", "--memory", "20Gi", "--", "touch", str(marker), check=False)
    assert r.returncode == 1 and not marker.exists()
    assert r.stderr.startswith("vgpu: no GPU has room for 20Gi memory")
    assert r.stderr.count("\n") == 1
    r = vgpud.vgpu("update", "nosuchslice", "--memory", "1", check=False)
    assert r.returncode == 1 and r.stderr.startswith("vgpu: ") and r.stderr.count("\n") == 1


def test_no_daemon(tmp_path, simgpu_env):
    sock = tmp_path / "absent.sock"
    for args in (["devices"], ["ls"], ["smi"], ["run", "--memory", "1", "--", "true"]):
        r = run([sys.executable, "-m", "vgpu_cli", "--socket", str(sock), *args],
                env=simgpu_env, check=False, cwd=ROOT)
        assert r.returncode == 1
        assert r.stderr == (f"vgpu: cannot reach vgpud at {sock}: no such socket "
                            "(is vgpud running? start it with 'vgpud' or pass --socket)\n")


def test_daemon_stopped(vgpud):
    vgpud.stop()
    r = vgpud.vgpu("ls", check=False)
    assert r.returncode == 1 and r.stderr.startswith(f"vgpu: cannot reach vgpud at {vgpud.socket}")


COUNT_INTS = ("import signal, sys, time\n"
              "n = [0]\n"
              "signal.signal(signal.SIGINT, lambda *a: n.__setitem__(0, n[0] + 1))\n"
              "print('ready', flush=True)\n"
              "time.sleep(2)\n"
              "sys.exit(10 + n[0])\n")


def test_terminal_ctrl_c_reaches_the_child_once(vgpud):
    """^C on a terminal signals the whole foreground group: vgpu run must not send it again."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # child: the CLI, with the pty as its controlling terminal
        os.chdir(ROOT)
        os.execve(sys.executable, [*vgpud.argv("run", "--memory", "1", "--", sys.executable,
                                               "-c", COUNT_INTS)], vgpud.env)
    out = b""
    try:
        deadline = time.monotonic() + 30
        while b"ready" not in out and time.monotonic() < deadline:
            out += os.read(fd, 1024)
        assert b"ready" in out, out
        os.write(fd, b"\x03")
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 11  # one SIGINT, handled: exit 10 + 1
    assert vgpud.slices() == []


def test_claim_slice_shown_kept_by_reconcile_and_released(vgpud):
    import grpc

    from arbiter.proto import vgpu_pb2 as pb
    from arbiter.proto import vgpu_pb2_grpc

    uid = "0b7e3c52-9f1a-4d1e-8a3b-2c4d5e6f7a8b"
    with grpc.insecure_channel(f"unix:{vgpud.socket}") as channel:
        s = vgpu_pb2_grpc.ArbiterStub(channel).Allocate(pb.AllocateRequest(
            owner=uid, owner_kind="claim",
            vgpus=[pb.VGpuRequest(memory_bytes=64 * MiB, compute_percent=20)]),
            timeout=10).slice
    time.sleep(3 * RECONCILE_S)  # passes run: no container holds it, it stays
    table = vgpud.vgpu("ls").stdout.splitlines()
    assert table[1].split()[:2] == [s.id, f"claim:{uid}"]
    (listed,) = vgpud.slices()
    assert (listed["owner_kind"], listed["owner"]) == ("claim", uid)
    devices = vgpud.vgpu("devices").stdout.splitlines()
    assert devices[0].split()[-1] == "DRIVER" and devices[1].split()[-1] == "580.95.05"
    r = vgpud.vgpu("release", uid)
    assert r.stdout.strip() == f"released slice {s.id}"
    assert vgpud.slices() == []
