#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vgpu demo: vgpud hands out slices of one GPU; two containers run in them.

On a machine without an NVIDIA GPU it runs on simgpu (build/simgpu), a
simulated driver with one 8 GiB device. vgpud starts on a private socket and
state; container A asks for 1 GiB (annotation vgpu.io/memory=1Gi) and container
B for 3 GiB, both started by runc through vgpu-runtime; each sees its slice as
the whole GPU, fills it and is refused past it. `vgpu smi` shows both slices on
the GPU; when the containers stop their slices are released. Then two more
containers with compute shares of 30 % and 70 % (vgpu.io/compute) run a greedy GPU
load side by side for 3 s, and each one's measured share of the GPU's time is
shown. Without runc (or root) the same is shown with host processes started by
`vgpu run`.
"""
from __future__ import annotations

import array
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "build" / "tests" / "vgpu_probe"
LOAD = ROOT / "build" / "tests" / "gpu_load"
RUNTIME = ROOT / "build" / "bin" / "vgpu-runtime"   # make builds it
LOAD_SECONDS = 3.0
MiB = 1 << 20


def has_real_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


def environment(state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VGPU_", "SIMGPU_")) and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(ROOT)
    if not has_real_gpu():
        env["SIMGPU_STATE"] = str(state)
        env["SIMGPU_DEVICES"] = "8Gi"
        env["LD_LIBRARY_PATH"] = str(ROOT / "build" / "simgpu")
    return env


def start_vgpud(tmp: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    config = tmp / "config.yaml"
    nodes = "" if has_real_gpu() else "devices:\n  nodes: {'*': [/dev/null]}\n"
    config.write_text("metrics:\n  address: ''\n" + nodes)
    log = (tmp / "vgpud.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpud", "--config", str(config),
         "--socket", str(tmp / "vgpud.sock"), "--state-dir", str(tmp / "state"),
         "--run-dir", str(tmp / "run")], env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not (tmp / "vgpud.sock").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"demo: vgpud did not start:\n{(tmp / 'vgpud.log').read_text()}")
        time.sleep(0.1)
    return proc


def vgpu(env: dict[str, str], *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "vgpu_cli", *args], env=env, check=True,
                          capture_output=True, text=True).stdout


def run_in_slice(name: str, memory: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """`vgpu run` a probe that fills its slice in 256 MiB steps, then holds it."""
    p = subprocess.Popen(
        [sys.executable, "-m", "vgpu_cli", "run", "--memory", memory, "--compute", "30",
         "--", str(PROBE), "info", f"fill:mem:{256 * MiB}", "info", "hold"],
        env=env, stdout=subprocess.PIPE, text=True)
    report(f"$ vgpu run --memory {memory} --compute 30 -- <CUDA program {name}>", p)
    return p


def runc_usable() -> bool:
    return shutil.which("runc") is not None and os.geteuid() == 0


def run_container(name: str, memory: str, tmp: Path, env: dict[str, str]
                  ) -> tuple[subprocess.Popen[str], str]:
    """A container asking for `memory`, through vgpu-runtime and runc, running the probe."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support.images import make_bundle

    cid = f"vgpu-demo-{name}-{os.getpid()}"
    sim = Path(env["SIMGPU_STATE"]).parent if "SIMGPU_STATE" in env else None
    bundle = make_bundle(
        tmp / cid, args=["/usr/bin/vgpu_probe", "info", f"fill:mem:{256 * MiB}", "info", "hold"],
        annotations={"vgpu.io/memory": memory, "vgpu.io/compute": "30"},
        env=[f"SIMGPU_STATE={sim / 'simgpu.state'}"] if sim else [],
        mounts=[{"destination": str(sim), "type": "bind", "source": str(sim),
                 "options": ["rbind", "rw"]}] if sim else [])
    # The compiled vgpu-runtime (make builds it); vgpud's lifecycle socket decides.
    p = subprocess.Popen([str(RUNTIME), "run", "-b", str(bundle), cid],
                         env=env, stdout=subprocess.PIPE, text=True)
    report(f"$ vgpu-runtime run  (container {name}, annotation vgpu.io/memory={memory})", p)
    return p, cid


def compute_demo(tmp: Path, env: dict[str, str], containers: bool) -> None:
    """Two greedy loads with compute shares 30 % and 70 % on the one GPU, measured."""
    sim = Path(env["SIMGPU_STATE"]).parent
    start = time.monotonic_ns() + 2_000_000_000        # both are up by then
    until = start + int(LOAD_SECONDS * 1e9)
    runs = []
    for name, pct in (("C", 30), ("D", 70)):
        load = [f"--kernel busy_1000us --start-at {start} --until {until}",
                f"--trace {sim / f'trace-{name}'}"]
        if containers:
            sys.path.insert(0, str(ROOT / "tests"))
            from support.images import make_bundle

            cid = f"vgpu-demo-{name}-{os.getpid()}"
            bundle = make_bundle(
                tmp / cid, args=["/bin/sh", "-c", "gpu_load " + " ".join(load)],
                annotations={"vgpu.io/memory": "512Mi", "vgpu.io/compute": str(pct),
                             "vgpu.io/policy": "fixed"},
                env=[f"SIMGPU_STATE={sim / 'simgpu.state'}"],
                mounts=[{"destination": str(sim), "type": "bind", "source": str(sim),
                         "options": ["rbind", "rw"]}])
            print(f"$ vgpu-runtime run  (container {name}, vgpu.io/compute={pct}, "
                  "a greedy GPU load)")
            argv = [str(RUNTIME), "run", "-b", str(bundle), cid]
        else:
            print(f"$ vgpu run --memory 512Mi --compute {pct} --policy fixed "
                  f"-- <greedy GPU load {name}>")
            argv = [sys.executable, "-m", "vgpu_cli", "run", "--memory", "512Mi",
                    "--compute", str(pct), "--policy", "fixed", "--", str(LOAD),
                    *" ".join(load).split()]
        runs.append((name, pct, subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)))
    print(f"  both run for {LOAD_SECONDS:g} s on the same GPU; share of the GPU's time:")
    for name, pct, p in runs:
        p.wait(timeout=60)
        raw = array.array("Q", (sim / f"trace-{name}").read_bytes())
        a = start + 500_000_000                         # after both have settled
        busy = sum(g for t, g in zip(raw[0::3], raw[1::3], strict=False) if a <= t < until)
        print(f"  {name}: compute {pct:>2} %  ->  measured {busy / (until - a) * 100:5.1f} %")
    print()


def report(title: str, p: subprocess.Popen[str]) -> None:
    """Print what the probe saw, once it holds its slice."""
    infos, fill = [], {}
    assert p.stdout is not None
    for line in p.stdout:
        entry = json.loads(line)
        if entry["op"] == "info":
            infos.append(entry)
        elif entry["op"] == "fill":
            fill = entry
        elif entry["op"] == "hold":
            break
    first, full = infos
    print(title)
    print(f"  cuMemGetInfo at start: total {first['total'] // MiB} MiB, "
          f"free {first['free'] // MiB} MiB")
    print(f"  allocated {fill['count']} x 256 MiB, then {fill['result']}")
    print(f"  cuMemGetInfo when full: total {full['total'] // MiB} MiB, "
          f"free {full['free'] // MiB} MiB\n")


def main() -> None:
    gpu = ("a real NVIDIA GPU" if has_real_gpu()
           else "simgpu (a simulated 8 GiB GPU; no NVIDIA GPU here)")
    print(f"vgpu demo on {gpu}\n")
    with tempfile.TemporaryDirectory(prefix="vgpu-demo-") as d:
        tmp = Path(d)
        env = environment(tmp / "simgpu.state")
        daemon = start_vgpud(tmp, env)
        env["VGPU_SOCKET"] = str(tmp / "vgpud.sock")
        runs: list[subprocess.Popen[str]] = []
        containers: list[str] = []
        try:
            print(f"vgpud is serving {env['VGPU_SOCKET']}\n\n$ vgpu devices")
            print(vgpu(env, "devices"))
            if runc_usable():
                config = tmp / "runtime.yaml"
                config.write_text(f"paths:\n  socket: {env['VGPU_SOCKET']}\n"
                                  f"  run_dir: {tmp / 'run'}\nruntime:\n  lower: runc\n")
                env["VGPU_CONFIG"] = str(config)
                for name, memory in (("A", "1Gi"), ("B", "3Gi")):
                    p, cid = run_container(name, memory, tmp, env)
                    runs.append(p)
                    containers.append(cid)
            else:
                runs = [run_in_slice("A", "1Gi", env), run_in_slice("B", "3Gi", env)]
            print("$ vgpu smi")
            print(vgpu(env, "smi"))
            for cid in containers:
                subprocess.run(["runc", "kill", cid, "KILL"], check=False)
            for p in runs:
                if not containers:
                    p.send_signal(signal.SIGTERM)  # vgpu run passes it on, then releases
                p.wait(timeout=30)
            what = "containers" if containers else "programs"
            print(f"both {what} ended; their slices are released:\n$ vgpu ls")
            print(vgpu(env, "ls") or "(no slices)")
            if has_real_gpu():
                print("(compute shares on a real GPU: python3 tests/gpu/check_compute.py)")
            else:
                compute_demo(tmp, env, containers=bool(containers))
                print("$ vgpu ls")
                print(vgpu(env, "ls") or "(no slices)")
        finally:
            for p in runs:
                if p.poll() is None:
                    p.kill()
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)


if __name__ == "__main__":
    main()
