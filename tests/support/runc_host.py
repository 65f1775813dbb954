# SPDX-License-Identifier: Apache-2.0
"""A vgpud on a private simgpu with runc bundles whose hooks are the compiled vgpu-hook:
the host of the end-to-end runc tests."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support.images import make_bundle
from support.paths import ROOT
from support.vgpud_harness import pb, simgpu_vgpud

MiB = 1 << 20
HOOK = ROOT / "build" / "bin" / "vgpu-hook"
PRELOAD_OWN = "/usr/lib/x86_64-linux-gnu/libc.so.6"  # an image's own preload line (harmless)


class Host:
    """A vgpud on a private simgpu and the bundles/hooks that talk to it."""

    def __init__(self, tmp: Path, reconcile_s: float = 3600, devices: str = "16Gi") -> None:
        self.tmp = tmp
        #: Where this vgpud finds claims' CDI specs (runtime.cdi_spec_dirs), not the host's.
        self.cdi_dir = tmp / "cdi"
        self.sim, self.vgpud = simgpu_vgpud(tmp, {
            "reconcile": {"interval_s": reconcile_s},
            "hook": {"wait_s": 5},
            "runtime": {"cdi_spec_dirs": [str(self.cdi_dir)]},
        }, devices=devices)
        self.n = 0

    def hook(self, phase: str, timeout: int = 20) -> dict[str, object]:
        """The compiled vgpu-hook (it asks vgpud's lifecycle socket)."""
        env = [f"VGPU_SOCKET={self.vgpud.socket}", f"VGPU_CONFIG={self.vgpud.config_file}"]
        return {"path": str(HOOK), "args": ["vgpu-hook", phase], "env": env, "timeout": timeout}

    def bundle(self, script: str, annotations: dict[str, str] | None = None, *,
               hooks: bool = True, env: list[str] | None = None, prestart_timeout: int = 20,
               image_preload: bool = False) -> tuple[Path, str]:
        self.n += 1
        cid = f"vgpu-e2e-{os.getpid()}-{self.n}"
        b = make_bundle(
            self.tmp / cid, args=["/bin/sh", "-c", script], annotations=annotations,
            env=["SIMGPU_STATE=/sim/simgpu.state", *(env or [])],
            hooks={"prestart": [self.hook("prestart", prestart_timeout)],
                   "poststop": [self.hook("poststop")]} if hooks else None,
            mounts=[{"destination": "/sim", "type": "bind", "source": str(self.sim),
                     "options": ["rbind", "rw"]}])
        if image_preload:
            (b / "rootfs/etc/ld.so.preload").write_text(PRELOAD_OWN + "\n")
        return b, cid

    def runc(self, *args: str) -> list[str]:
        return ["runc", "--root", str(self.vgpud.runc), *args]

    def run(self, bundle: Path, cid: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.runc("run", "--bundle", str(bundle), cid),
                              capture_output=True, text=True, timeout=timeout)

    def slices(self) -> list[pb.Slice]:
        return list(self.vgpud.stub.List(pb.ListRequest(), timeout=5).slices)

    def close(self) -> None:
        self.vgpud.close()


def probe_lines(stdout: str) -> list[dict]:
    return [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
