# SPDX-License-Identifier: Apache-2.0
"""Find and exec the lower OCI runtime (runc, nvidia-container-runtime, ...): the one exec.

vgpu-runtime is reached two ways: as the `vgpu` runtime of Docker or containerd,
or as the `runc` of containerd-shim-vgpu-v2's private bin directory (shim/bin).
Either way it must hand over to the real runtime and never to itself, so the PATH
search skips that directory and any file that is this program. As a last guard,
an environment marker holding our pid catches an exec chain that comes back to us
(an exec keeps the pid): we stop with one line instead of looping forever.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from shim.errors import LowerRuntimeError

__all__ = ["BIN_DIR", "GUARD_ENV", "exec_lower", "find_lower"]

#: containerd-shim-vgpu-v2 puts this directory first on PATH: its `runc` is vgpu-runtime.
BIN_DIR = Path(__file__).resolve().parent / "bin"
#: Set to our pid just before the exec: seeing it again with the same pid means a loop.
GUARD_ENV = "VGPU_RUNTIME_EXEC_PID"


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def find_lower(name: str, environ: Mapping[str, str] = os.environ,
               skip_dirs: Sequence[Path] = (BIN_DIR,),
               self_paths: Sequence[Path] = ()) -> str:
    """The absolute path of runtime `name` (an absolute path is taken as it is).

    A bare name is searched on $PATH like execvp does, skipping `skip_dirs` and any
    file that is one of `self_paths` (default: this program's argv[0]).
    """
    if not self_paths and sys.argv and sys.argv[0]:
        self_paths = (Path(sys.argv[0]),)
    if "/" in name:
        path = Path(name)
        if not path.is_absolute():
            raise LowerRuntimeError(name, "a path must be absolute")
        if any(_same_file(path, s) for s in self_paths):
            raise LowerRuntimeError(name, "it is vgpu-runtime itself")
        if not os.access(path, os.X_OK) or not path.is_file():
            raise LowerRuntimeError(name, "no such executable file")
        return str(path)
    skip = {os.path.realpath(d) for d in skip_dirs}
    for entry in environ.get("PATH", os.defpath).split(os.pathsep):
        directory = entry or "."
        if os.path.realpath(directory) in skip:
            continue
        candidate = Path(directory) / name
        if not candidate.is_file() or not os.access(candidate, os.X_OK):
            continue
        if any(_same_file(candidate, s) for s in self_paths):
            continue
        return str(candidate.absolute())
    raise LowerRuntimeError(name, "not found on PATH (set runtime.lower in the vgpu config "
                                  "to its absolute path)")


def exec_lower(path: str, argv: Sequence[str]) -> NoReturn:
    """Replace this process with the lower runtime, passing argv[1:] untouched."""
    mark = str(os.getpid())
    if os.environ.get(GUARD_ENV) == mark:
        raise LowerRuntimeError(path, "it execs vgpu-runtime again (a loop)")
    os.environ[GUARD_ENV] = mark
    try:
        os.execv(path, [path, *argv[1:]])
    except OSError as e:
        raise LowerRuntimeError(path, f"cannot exec it: {e.strerror or e}") from e
