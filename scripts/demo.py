#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vgpu demo: two processes with different memory slices share one GPU.

On a machine without an NVIDIA GPU it runs on simgpu (build/simgpu), a
simulated driver with one 8 GiB device. Process A gets a 1 GiB slice and
process B a 3 GiB slice (VGPU_MEMORY_LIMIT, libvgpu preloaded); each sees its
slice as the whole GPU, fills it, and is refused past it, while the physical
device holds the sum.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "build" / "tests" / "vgpu_probe"
MiB = 1 << 20


def has_real_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


def env_for(state: Path, limit: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPU_", "SIMGPU_"))}
    if not has_real_gpu():
        env["SIMGPU_STATE"] = str(state)
        env["SIMGPU_DEVICES"] = "8Gi"
        env["LD_LIBRARY_PATH"] = str(ROOT / "build" / "simgpu")
    if limit:
        env["LD_PRELOAD"] = str(ROOT / "build" / "libvgpu.so")
        env["VGPU_MEMORY_LIMIT"] = limit
    return env


def start(name: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], dict]:
    """Start a probe that fills its slice in 256 MiB steps, then holds it."""
    p = subprocess.Popen([str(PROBE), "info", f"fill:mem:{256 * MiB}", "info", "hold"],
                         env=env, stdout=subprocess.PIPE, text=True)
    seen: dict = {"name": name, "info": []}
    assert p.stdout is not None
    for line in p.stdout:
        entry = json.loads(line)
        if entry["op"] == "info":
            seen["info"].append(entry)
        elif entry["op"] == "fill":
            seen["fill"] = entry
        elif entry["op"] == "hold":
            break
    return p, seen


def main() -> None:
    gpu = "real NVIDIA GPU" if has_real_gpu() else "simgpu (simulated 8 GiB GPU, no NVIDIA GPU here)"
    print(f"vgpu demo on {gpu}\n")
    with tempfile.TemporaryDirectory(prefix="vgpu-demo-") as tmp:
        state = Path(tmp) / "simgpu.state"
        procs = []
        try:
            for name, limit in (("A", "1Gi"), ("B", "3Gi")):
                p, seen = start(name, env_for(state, limit))
                procs.append(p)
                first, full = seen["info"]
                print(f"process {name} (pid {p.pid}), VGPU_MEMORY_LIMIT={limit}:")
                print(f"  cuMemGetInfo at start: total {first['total'] // MiB} MiB, "
                      f"free {first['free'] // MiB} MiB")
                print(f"  allocated {seen['fill']['count']} x 256 MiB, then "
                      f"{seen['fill']['result']}")
                print(f"  cuMemGetInfo when full: total {full['total'] // MiB} MiB, "
                      f"free {full['free'] // MiB} MiB\n")
            out = subprocess.run([str(PROBE), "info"], env=env_for(state, None),
                                 capture_output=True, text=True, check=True).stdout
            info = [json.loads(x) for x in out.splitlines() if '"info"' in x][-1]
            used = (info["total"] - info["free"]) // MiB
            print(f"the physical device, seen without vgpu: total {info['total'] // MiB} MiB, "
                  f"used {used} MiB (A + B)")
        finally:
            for p in procs:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
