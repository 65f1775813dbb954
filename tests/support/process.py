# SPDX-License-Identifier: Apache-2.0
"""Running programs from tests: a clean environment and a run that shows both streams."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

# Variables that would change what libvgpu or simgpu do; a test starts clean.
_CONFIG_PREFIXES = ("VGPU_", "SIMGPU_")


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CONFIG_PREFIXES)}
    env.pop("LD_PRELOAD", None)
    return env


def run(cmd: list[str], env: dict[str, str], timeout: float = 60, check: bool = True,
        **kw) -> subprocess.CompletedProcess[str]:
    """Run a command, capture text output; on failure show both streams."""
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(
            f"{cmd} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def read_line(proc: subprocess.Popen[str]) -> str:
    """One line of proc's stdout, read a byte at a time from the pipe itself: a readline
    on the buffered stream reads ahead, and what it read ahead is lost to a later
    communicate(), which reads the raw pipe (seen on a loaded machine, where the child
    has written several lines by the time the test reads the first). "" at EOF."""
    assert proc.stdout is not None
    fd, line = proc.stdout.fileno(), bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line.decode()


def pids_running(program: str, arg: str) -> list[int]:
    """Processes whose argv[0] ends with `program` and that have `arg` among their arguments
    (read from /proc: a test's own vgpu-broker, gpu_load, ...)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(program.encode()) and arg.encode() in argv:
            out.append(int(d.name))
    return out
