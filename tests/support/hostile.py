# SPDX-License-Identifier: Apache-2.0
"""The host of the hostile-tenant suites: a vgpud on a private simgpu, containers started
by the compiled vgpu-runtime on runc, and scribble (build/tests/scribble), the attacker."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import grpc

from support.images import make_bundle
from support.paths import NATIVE_BIN, TEST_BIN
from support.process import clean_env, pids_running
from support.vgpud_harness import pb, simgpu_vgpud

SCRIBBLE = TEST_BIN / "scribble"
RUNTIME = NATIVE_BIN / "vgpu-runtime"
#: errno names a write to a file vgpu mounted read-only may fail with.
REFUSED = {"EROFS", "EACCES", "EPERM"}


class Host:
    """A vgpud on a private simgpu; containers started by vgpu-runtime on runc."""

    def __init__(self, tmp: Path, config: dict[str, dict[str, object]] | None = None) -> None:
        self.tmp = tmp
        # config: sections of vgpud's config besides the hook's (e.g. the guard's).
        self.sim, self.vgpud = simgpu_vgpud(tmp, {"hook": {"wait_s": 10}, **(config or {})})
        # What vgpu-runtime reads: vgpud's socket and run dir, runc below it.
        self.runtime_config = tmp / "runtime.yaml"
        self.runtime_config.write_text(
            f"paths:\n  socket: {self.vgpud.socket}\n  run_dir: {self.vgpud.run_dir}\n"
            "runtime:\n  lower: runc\n")
        self.env = clean_env()
        self.env.update(VGPU_CONFIG=str(self.runtime_config),
                        VGPU_SOCKET=str(self.vgpud.socket))
        self.n = 0

    @property
    def sched_dir(self) -> Path:
        return self.vgpud.run_dir / "sched"

    def gpu_file(self) -> Path:
        [gpu] = [p for p in self.sched_dir.iterdir()
                 if p.name.startswith("GPU-") and "." not in p.name]
        return gpu

    def start(self, script: str, annotations: dict[str, str],
              extra_bin: Path | tuple[Path, ...] | None = None, cgroupns: bool = False,
              mounts: list[dict[str, object]] | None = None,
              ) -> tuple[subprocess.Popen[str], str]:
        self.n += 1
        cid = f"vgpu-hostile-{os.getpid()}-{self.n}"
        bundle = make_bundle(
            self.tmp / cid, args=["/bin/sh", "-c", script], annotations=annotations,
            env=["SIMGPU_STATE=/sim/simgpu.state"],
            mounts=[{"destination": "/sim", "type": "bind", "source": str(self.sim),
                     "options": ["rbind", "rw"]}, *(mounts or [])], cgroupns=cgroupns)
        for program in (extra_bin,) if isinstance(extra_bin, Path) else extra_bin or ():
            shutil.copy2(program, bundle / "rootfs/usr/bin" / program.name)
        cmd = [str(RUNTIME), "--root", str(self.vgpud.runc), "run", "--bundle", str(bundle), cid]
        return subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True), cid

    def slices(self) -> list[pb.Slice]:
        return list(self.vgpud.stub.List(pb.ListRequest(), timeout=5).slices)

    def healthy(self) -> bool:
        try:
            self.vgpud.stub.Health(pb.HealthRequest(), timeout=5)
            return True
        except grpc.RpcError:
            return False

    def broker_pids(self) -> list[int]:
        """vgpu-broker processes serving this vgpud's scheduling directory."""
        return pids_running("vgpu-broker", str(self.sched_dir))

    def close(self) -> None:
        for d in self.tmp.iterdir():
            if d.name.startswith("vgpu-hostile-"):
                subprocess.run(["runc", "--root", str(self.vgpud.runc), "delete", "-f", d.name],
                               capture_output=True)
        self.vgpud.close()
