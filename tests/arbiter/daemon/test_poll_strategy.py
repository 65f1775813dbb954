# SPDX-License-Identifier: Apache-2.0
"""vgpud's gRPC polls with poll() unless its environment names an engine (vgpud.command).

Seen from outside, as an operator would: the system call each of a real vgpud's gRPC
threads sits in (/proc/<pid>/task/<tid>/syscall), once it is idle and serving."""
from __future__ import annotations

import os
import platform
import time

import pytest
from support.vgpud_harness import Vgpud, pb

# The syscall numbers of the calls an idle gRPC poller sleeps in, by machine.
_SYSCALLS = {
    "x86_64": {"poll": {7, 271}, "epoll": {232, 281, 441}},  # poll ppoll; epoll_wait/_pwait/2
    "aarch64": {"poll": {73}, "epoll": {22, 441}},  # ppoll; epoll_pwait/_pwait2
}
pytestmark = pytest.mark.skipif(platform.machine() not in _SYSCALLS,
                                reason=f"no syscall table for {platform.machine()}")


def _pollers(pid: int) -> set[str]:
    """Which kind of poll gRPC's threads (comm event_engine) sleep in: 'poll', 'epoll'."""
    calls = _SYSCALLS[platform.machine()]
    kinds = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() != "event_engine":
                    continue
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                number = f.read().split()[0]
        except (OSError, IndexError):
            continue  # the thread ended, or runs (no syscall to show)
        if number.lstrip("-").isdigit():
            kinds |= {kind for kind, numbers in calls.items() if int(number) in numbers}
    return kinds


def _seen(v: Vgpud, kind: str) -> set[str]:
    """The kinds seen, once `kind` is among them (a poller between two calls shows none)."""
    assert v.proc is not None
    v.stub.Health(pb.HealthRequest(), timeout=10)  # serving: its pollers are up
    deadline = time.monotonic() + 10
    while kind not in (kinds := _pollers(v.proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return kinds


def test_vgpud_polls_with_poll_by_default(tmp_path, simgpu_env):
    simgpu_env.pop("GRPC_POLL_STRATEGY", None)
    v = Vgpud(tmp_path, simgpu_env).start()
    try:
        assert _seen(v, "poll") == {"poll"}
    finally:
        v.close()


def test_the_environment_s_engine_wins(tmp_path, simgpu_env):
    simgpu_env["GRPC_POLL_STRATEGY"] = "epoll1"
    v = Vgpud(tmp_path, simgpu_env).start()
    try:
        assert _seen(v, "epoll") == {"epoll"}
    finally:
        v.close()
