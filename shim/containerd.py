# SPDX-License-Identifier: Apache-2.0
"""containerd-shim-vgpu-v2: the runtime `io.containerd.vgpu.v2` for ctr and CRI runtime classes.

containerd maps the runtime name io.containerd.vgpu.v2 to the binary
containerd-shim-vgpu-v2 on its PATH. We exec containerd's own runc v2 shim
(containerd-shim-runc-v2) with the same arguments and with shim/bin first on PATH:
that directory's `runc` is vgpu-runtime, so every runc call the shim makes
(create, start, kill, delete, ...) goes through vgpu-runtime, which adds the vGPU
to the containers that ask and hands everything to the real runc (it skips
shim/bin when it looks for runc). The runc shim re-executes itself as the
long-running shim daemon and keeps this environment, so the daemon's runc calls
go the same way.
"""
from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from shim.lower import BIN_DIR, exec_lower, find_lower

__all__ = ["RUNC_SHIM", "main", "shim_environ"]

#: containerd's runc shim, looked up on PATH.
RUNC_SHIM = "containerd-shim-runc-v2"


def shim_environ(environ: dict[str, str], bin_dir: Path = BIN_DIR,
                 python: str = sys.executable,
                 runtime: Path | bool | None = True) -> dict[str, str]:
    """The runc shim's environment: bin_dir first on PATH, our interpreter and packages.

    `runtime`: the compiled vgpu-runtime bin_dir's `runc` runs (True: the one built
    or shipped, if any; None: the Python one). The compiled runtime skips bin_dir
    ($VGPU_SHIM_BIN) on PATH and runs $VGPU_PYTHON where it falls back.
    """
    env = dict(environ)
    path = env.get("PATH", os.defpath)
    entries = [p for p in path.split(os.pathsep) if p and os.path.realpath(p)
               != os.path.realpath(bin_dir)]
    env["PATH"] = os.pathsep.join([str(bin_dir), *entries])
    env["VGPU_SHIM_PYTHON"] = python
    env["VGPU_PYTHON"] = python
    env["VGPU_SHIM_BIN"] = str(bin_dir)
    if runtime is True:
        from arbiter.native import program_path

        runtime = program_path("vgpu-runtime")
    if isinstance(runtime, Path):
        env["VGPU_RUNTIME"] = str(runtime)
    else:
        env.pop("VGPU_RUNTIME", None)
    package_root = str(Path(__file__).resolve().parent.parent)
    if not any(part in package_root for part in ("site-packages", "dist-packages")):
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = package_root + (os.pathsep + old if old else "")
    return env


def main(argv: Sequence[str] | None = None) -> int:
    """Exec containerd-shim-runc-v2 with vgpu-runtime as its runc; returns only on failure."""
    from arbiter.errors import VgpuError

    argv = list(sys.argv if argv is None else argv)
    runc = BIN_DIR / "runc"
    try:
        # Wheels may drop the executable bit of package data.
        mode = runc.stat().st_mode
        if not mode & stat.S_IXUSR:
            runc.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        env = shim_environ(dict(os.environ))
        shim = find_lower(RUNC_SHIM, env, self_paths=(Path(argv[0]),) if argv else ())
        os.environ.clear()
        os.environ.update(env)
        exec_lower(shim, argv)
    except (VgpuError, OSError) as e:
        print(f"containerd-shim-vgpu-v2: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
