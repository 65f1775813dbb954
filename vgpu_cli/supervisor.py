# SPDX-License-Identifier: Apache-2.0
"""The process side of `vgpu run`: the child's environment, spawning it with clean
signal dispositions, forwarding signals to it and turning its end into an exit status.

The forwarded signals are blocked in every thread (block_signals, before any gRPC
thread exists) and taken with sigwaitinfo, so none is lost to a gRPC thread.
"""
from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from contextlib import suppress

from arbiter.defaults import ENV_REGION_DIR, ENV_SCHED_DIR

__all__ = ["FORWARDED", "block_signals", "child_env", "drain_signals", "exit_status",
           "pending_forwarded", "restore_signals", "spawn", "supervise"]

# Signals `vgpu run` passes on to its child (SIGCHLD only wakes the wait loop).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_WAITED = {*FORWARDED, signal.SIGCHLD}
# Dispositions Python changes at start-up that a child must not inherit.
_RESET_IN_CHILD = (*FORWARDED, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD)
_SI_KERNEL = 0x80  # si_code of a signal the kernel generated (a terminal's ^C, ^\)


def child_env(env: Mapping[str, str], library: str, region_dir: str,
              gpu_uuids: Sequence[str] = (), sched_dir: str = "") -> dict[str, str]:
    """The child's environment: libvgpu preloaded first, the slice's region dir named.

    CUDA_VISIBLE_DEVICES lists the slice's GPUs in vGPU order, by UUID (CUDA's own
    enumeration order may differ from NVML's): libvgpu checks that CUDA device i is
    the GPU of region file vgpu<i>. VGPU_SCHED_DIR names vgpud's per-GPU scheduling
    regions, so that the child shares each GPU's compute with the containers on it
    (without it, the child would schedule alone and ignore their shares).
    """
    result = dict(env)
    preload = result.get("LD_PRELOAD", "").strip()
    result["LD_PRELOAD"] = f"{library}:{preload}" if preload else library
    result[ENV_REGION_DIR] = region_dir
    if sched_dir:
        result[ENV_SCHED_DIR] = sched_dir
    if gpu_uuids and all(gpu_uuids):
        result["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_uuids)
    return result


def exit_status(wait_status: int) -> int:
    """A child's wait status as a shell exit code (128+signal when killed)."""
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.waitstatus_to_exitcode(wait_status)


def block_signals() -> set[int | signal.Signals]:
    """Block the forwarded signals and SIGCHLD in this thread (and threads it starts
    later); return the old mask for restore_signals. Main thread only."""
    # An ignored SIGCHLD survives exec; with it the kernel reaps the child and sends
    # no SIGCHLD, and supervise() would wait for one forever.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    return signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)


def restore_signals(old_mask: set[int | signal.Signals]) -> None:
    """Put back the mask block_signals returned."""
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def pending_forwarded() -> int:
    """A forwarded signal that arrived while blocked (the user gave up early), else 0."""
    pending = signal.sigpending()
    for sig in FORWARDED:
        if sig in pending:
            return int(sig)
    return 0


def drain_signals() -> None:
    """Take every blocked signal still pending, so none hits us once unblocked."""
    while signal.sigtimedwait(_WAITED, 0) is not None:
        pass


def spawn(cmd: Sequence[str], env: Mapping[str, str]) -> int:
    """Start cmd (searched on PATH) with default dispositions and an empty mask; its pid."""
    return os.posix_spawnp(cmd[0], list(cmd), env, setsigmask=(), setsigdef=_RESET_IN_CHILD)


def supervise(pid: int) -> int:
    """Wait for the child, forwarding SIGINT/SIGTERM/SIGHUP; return its wait status.

    Call with the signals blocked (block_signals). A signal the kernel generated (a
    terminal's ^C) already reached the child, which shares our process group: it is
    not sent twice.
    """
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return status
        # sigwaitinfo, not sigtimedwait: when a wait is interrupted without a signal
        # (EINTR: the cgroup freezer, as vgpud's compute guard throttles this slice) and
        # its deadline has passed, CPython's sigtimedwait (3.11) returns the siginfo it
        # never filled: stack garbage, whose si_signo can be 1, 2 or 15, a "signal" that
        # would be forwarded and kill the child. sigwaitinfo retries on EINTR and returns
        # only a signal the kernel delivered; the child's SIGCHLD ends the wait.
        info = signal.sigwaitinfo(_WAITED)
        if info.si_signo not in FORWARDED or info.si_code == _SI_KERNEL:
            continue
        with suppress(ProcessLookupError):
            os.kill(pid, info.si_signo)
