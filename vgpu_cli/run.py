# SPDX-License-Identifier: Apache-2.0
"""`vgpu run`: allocate a slice, run a command in it, release it however the command ends."""
from __future__ import annotations

import argparse
import os
import secrets
import socket as socketlib
from collections.abc import Callable, Mapping
from typing import Any

from vgpu_cli.client import Client, check_socket, connect, messages
from vgpu_cli.errors import CliError
from vgpu_cli.paths import resolve_socket
from vgpu_cli.render import format_bytes
from vgpu_cli.supervisor import (
    block_signals,
    child_env,
    drain_signals,
    exit_status,
    pending_forwarded,
    restore_signals,
    spawn,
    supervise,
)

__all__ = ["cmd_run", "run_owner"]

Out = Callable[[str], None]


def run_owner(pid: int | None = None, host: str | None = None) -> str:
    """The owner name of a `vgpu run` slice: run-<hostname>-<pid>-<random>."""
    return (f"run-{host or socketlib.gethostname()}-{pid if pid is not None else os.getpid()}"
            f"-{secrets.token_hex(4)}")


def cmd_run(args: argparse.Namespace, env: Mapping[str, str], err: Out) -> int:
    """`vgpu run`: allocate a slice, run CMD in it, release it however CMD ends."""
    from arbiter.native import libvgpu_path

    library = str(libvgpu_path())
    sock = resolve_socket(args, env)
    check_socket(sock)
    # Block before the gRPC channel exists: its threads inherit the mask, so the
    # signals stay pending for supervise() (and during Allocate) instead of being lost.
    old_mask = block_signals()
    owner = run_owner()
    pb = messages()
    try:
        with connect(sock, args.timeout) as c:
            # Whether a slice may exist that the finally must release: not after a
            # definite refusal (no capacity, bad request), so the user sees one line.
            granted: bool | None = None
            try:
                try:
                    r = c.call("Allocate", pb.AllocateRequest(
                        owner=owner, memory_bytes=args.memory, compute_percent=args.compute,
                        count=args.count, priority=args.priority, policy=args.policy,
                        devices=args.devices, owner_kind="process", owner_pid=os.getpid(),
                        labels={"vgpu.io/command": " ".join(args.cmd)[:200]}))
                except CliError as e:
                    # A deadline may have passed after vgpud granted it: release quietly.
                    granted = False if e.status != "DEADLINE_EXCEEDED" else None
                    raise
                granted = True
                s = r.slice
                # An older vgpud reports no sched_dir: the child then schedules alone.
                sched_dir = c.call("Health", pb.HealthRequest()).paths.get("sched_dir", "")
                if args.verbose:
                    err(f"vgpu: running in slice {s.id} "
                        f"({len(s.vgpus)} vGPU, {format_bytes(args.memory)} each)")
                sig = pending_forwarded()
                if sig:
                    return 128 + sig
                try:
                    pid = spawn(args.cmd, child_env(
                        env, library, s.region_dir,
                        [v.gpu_uuid for v in sorted(s.vgpus, key=lambda v: v.index)],
                        sched_dir))
                except OSError as e:
                    err(f"vgpu: failed to run {args.cmd[0]}: {e.strerror or e}")
                    return 127 if isinstance(e, FileNotFoundError) else 126
                return exit_status(supervise(pid))
            finally:
                # Signals that came after the child ended must not hit the CLI once
                # unblocked: the exit status is the child's.
                drain_signals()
                # By owner, so a slice granted while we were interrupted is freed too.
                if granted is not False:
                    _release_quietly(c, pb, owner, err if granted else lambda _t: None)
    finally:
        restore_signals(old_mask)


def _release_quietly(c: Client, pb: Any, owner: str, err: Out) -> None:
    try:
        c.call("Release", pb.ReleaseRequest(owner=owner))
    except CliError as e:
        err(f"vgpu: failed to release the slice of {owner}: {e} "
            "(vgpud's reconciler frees it once this process is gone)")
