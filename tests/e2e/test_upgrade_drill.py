# SPDX-License-Identifier: Apache-2.0
"""The upgrade drill (docs/upgrading.md), as root on real runc and simgpu.

Release N-1 (arbiter.version.RELEASES: the commit 0.1.0 was cut from) is built from its
sources (`git archive` of that commit: a clone without tags has it too; cached under
build/upgrade-drill/<commit>/) and laid out as an installed 0.1.0 package whose libvgpu.so
lives in a versioned install (arbiter.install.versions). Its vgpud and programs start three
containers running allocation and kernel loops with shares 20/30/40. Then vgpud N (this
tree) takes over through socket activation (the listening sockets stay, connections queue)
and is restarted ten times while 100 more containers start and stop, half with N-1's
vgpu-hook, half with N's. Asserted: no failed start, no interrupted workload (exit codes
and progress), every slice enforced throughout (memory refused at the limit, shares within
tolerance), the old containers released at exit by vgpud N, and N-1's versioned libvgpu
removed once its last container is gone.
"""
from __future__ import annotations

import array
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.images import make_bundle
from support.paths import NATIVE_BIN, ROOT, SIMGPU_DIR
from support.prereq import require
from support.process import clean_env
from support.runc_host import MiB, probe_lines
from support.socket_activation import SocketActivation
from support.vgpud_harness import Vgpud, pb

from arbiter.install.versions import install, installed
from arbiter.version import RELEASES, previous_release, version

require(shutil.which("runc") is not None and os.geteuid() == 0, "the drill needs runc and root")

OLD = previous_release(version())
PROGRAMS = ("vgpu-runtime", "vgpu-hook", "containerd-shim-vgpu-v2", "shim/runc", "vgpu-broker")
SHARES = (20, 30, 40)   # and 5% for each short container: 95 of 100
LIMIT = 64 * MiB
STARTS = 100
RESTARTS = 10
ROUND_S = 2


def build_old() -> Path:
    """N-1's sources, built (cached by commit)."""
    assert OLD is not None, f"no release before {version()} in arbiter.version.RELEASES"
    commit = RELEASES[OLD]
    dest = ROOT / "build" / "upgrade-drill" / commit
    if (dest / ".built").is_file():
        return dest
    tmp = dest.with_name(f"{commit}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    targets = ["build/libvgpu.so", *(f"build/bin/{p}" for p in PROGRAMS)]
    subprocess.run(["make", "-s", "-j2", "-C", str(tmp), *targets], check=True,
                   capture_output=True)
    (tmp / ".built").write_text(commit + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    return dest


class OldVgpud(Vgpud):
    """vgpud N-1, run from its installed package (never this tree's modules)."""

    def __init__(self, package: Path, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.env["PYTHONPATH"] = str(package)

    def command(self) -> list[str]:
        return [sys.executable, "-P", *super().command()[1:]]   # -P: not the cwd's modules

    def write_config(self, config: dict) -> None:
        """The harness's config without what N-1 does not know (`broker`: 0.2.0)."""
        super().write_config(config)
        import yaml
        doc = yaml.safe_load(self.config_file.read_text())
        doc.pop("broker", None)
        self.config_file.write_text(yaml.safe_dump(doc))


def old_package(tmp: Path, built: Path, lib_dir: Path) -> tuple[Path, str]:
    """N-1 as a host had it installed: its package with the programs in arbiter/native/bin,
    its libvgpu.so in a versioned install. (package dir, install name)."""
    files = {"libvgpu.so": built / "build" / "libvgpu.so",
             **{f"bin/{p}": built / "build" / "bin" / p for p in PROGRAMS}}
    inst = install(lib_dir, OLD or "", files)
    pkg = tmp / f"vgpu-{OLD}"
    shutil.copytree(built, pkg, ignore=shutil.ignore_patterns("build", ".built", "tests"))
    native = pkg / "arbiter" / "native"
    (native / "libvgpu.so").symlink_to(inst.libvgpu)
    for p in PROGRAMS:
        (native / "bin" / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built / "build" / "bin" / p, native / "bin" / p)
    return pkg, inst.name


class Drill:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sim = tmp / "sim"
        self.sim.mkdir()
        self.env = clean_env()
        self.env["SIMGPU_STATE"] = str(self.sim / "simgpu.state")
        self.config = {"nvml": {"library": str(SIMGPU_DIR / "libnvidia-ml.so.1")},
                       "reconcile": {"interval_s": 1}, "hook": {"wait_s": 15}}
        self.n = 0

    def bundle(self, hook: Path, script: str, memory: int, compute: int) -> tuple[Path, str]:
        self.n += 1
        cid = f"vgpu-drill-{os.getpid()}-{self.n}"
        env = [f"VGPU_SOCKET={self.tmp / 'vgpud.sock'}",
               f"VGPU_CONFIG={self.tmp / 'config.yaml'}"]
        hooks = {ph: [{"path": str(hook), "args": ["vgpu-hook", ph], "env": env,
                       "timeout": 30}] for ph in ("prestart", "poststop")}
        b = make_bundle(self.tmp / cid, args=["/bin/sh", "-c", script],
                        annotations={"vgpu.io/memory": f"{memory // MiB}Mi",
                                     "vgpu.io/compute": str(compute),
                                     "vgpu.io/policy": "fixed"},
                        env=["SIMGPU_STATE=/sim/simgpu.state"], hooks=hooks,
                        mounts=[{"destination": "/sim", "type": "bind", "source": str(self.sim),
                                 "options": ["rbind", "rw"]}])
        return b, cid

    def runc(self, *args: str) -> list[str]:
        return ["runc", "--root", str(self.tmp / "runc"), *args]


def _long_script(pct: int) -> str:
    """Kernel rounds and an allocation to the limit after each, until /sim/stop; any
    failure exits non-zero (an interrupted workload)."""
    return (f"i=0; while [ ! -e /sim/stop ]; do "
            f"gpu_load --kernel busy_1000us --seconds {ROUND_S} --trace /sim/t{pct}.$i "
            f"|| exit 11; "
            f"vgpu_probe fill:mem:{4 * LIMIT} > /sim/f{pct} || exit 12; "
            f"grep -q CUDA_ERROR_OUT_OF_MEMORY /sim/f{pct} || exit 13; "
            f"i=$((i+1)); echo $i > /sim/p{pct}; done")


def _share(path: Path) -> float:
    """Percent of a round's window its kernels ran (after a warm-up)."""
    raw = array.array("Q", path.read_bytes())
    times, busy = raw[0::3], raw[1::3]
    if len(times) < 10:
        return float("nan")
    a, b = times[0] + 300_000_000, times[-1]
    return sum(g for t, g in zip(times, busy, strict=False) if a <= t < b) / (b - a) * 100


def test_upgrade_drill(tmp_path):
    built = build_old()
    d = Drill(tmp_path)
    lib_dir = tmp_path / "state" / "lib"
    pkg, old_install = old_package(tmp_path, built, lib_dir)
    old_hook = pkg / "arbiter" / "native" / "bin" / "vgpu-hook"
    new_hook = NATIVE_BIN / "vgpu-hook"

    # --- N-1 serves: three long containers --------------------------------------------
    old = OldVgpud(pkg, tmp_path, dict(d.env), d.config).start()
    assert old.stub.Health(pb.HealthRequest(), timeout=5).version == OLD
    long_runs = []
    try:
        for pct in SHARES:
            b, cid = d.bundle(old_hook, _long_script(pct), 256 * MiB, pct)
            long_runs.append((pct, cid, subprocess.Popen(
                d.runc("run", "--bundle", str(b), cid), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)))
        def three_up() -> bool:
            for pct, _, p in long_runs:
                if p.poll() is not None:
                    raise AssertionError(f"the {pct}% container failed: {p.communicate()}")
            return len(list(old.stub.List(pb.ListRequest(), timeout=5).slices)) == 3
        old.wait_for(three_up, timeout=60, what="the three long containers' slices")
        assert old.stop() == 0
    except BaseException:
        old.close()
        (d.sim / "stop").touch()
        raise

    # --- N takes over under socket activation ------------------------------------------
    new = Vgpud(tmp_path, dict(d.env), d.config)
    act = SocketActivation(new)
    failures: list[str] = []
    restart_s: list[float] = []
    try:
        act.start()
        health = act.health()
        assert health.version == version() != OLD
        [ours] = [i.name for i in installed(lib_dir) if i.version == version()]
        listed = {s.owner: s for s in new.stub.List(pb.ListRequest(), timeout=5).slices}
        assert {listed[cid].libvgpu_version for _, cid, _ in long_runs} == {""}  # N-1 made them

        def restarts() -> None:
            for _ in range(RESTARTS):
                time.sleep(2.5)
                try:
                    restart_s.append(act.restart())
                except Exception as e:   # reported as a drill failure
                    failures.append(f"restart: {e}")
                    return
        t = threading.Thread(target=restarts)
        t.start()
        versions: dict[str, int] = {}
        for i in range(STARTS):
            hook = old_hook if i % 2 else new_hook
            b, cid = d.bundle(hook, f"vgpu_probe info fill:mem:{4 * LIMIT}", LIMIT, 5)
            p = subprocess.run(d.runc("run", "--bundle", str(b), cid), capture_output=True,
                               text=True, timeout=120)
            shutil.rmtree(b, ignore_errors=True)
            if p.returncode != 0:
                failures.append(f"start {i} ({'N-1' if i % 2 else 'N'} hook): {p.stderr}")
                continue
            lines = probe_lines(p.stdout)
            info = next(x for x in lines if x["op"] == "info")
            fill = next(x for x in lines if x["op"] == "fill")
            if not (info["total"] == LIMIT and fill["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
                    and fill["count"] * fill["bytes_each"] <= LIMIT):
                failures.append(f"start {i}: not enforced: {lines}")
            versions["N-1" if i % 2 else "N"] = versions.get("N-1" if i % 2 else "N", 0) + 1
        t.join()
        assert failures == [], "\n".join(failures[:5])
        assert len(restart_s) == RESTARTS and versions == {"N": STARTS // 2, "N-1": STARTS // 2}

        # --- the old containers: still running, enforced, then released by vgpud N -----
        progress = {pct: int((d.sim / f"p{pct}").read_text()) for pct in SHARES}
        assert all(n >= 3 for n in progress.values()), progress
        for pct, _, p in long_runs:
            assert p.poll() is None, f"the {pct}% container stopped: {p.communicate()}"
        assert (old_install in {i.name for i in installed(lib_dir)})   # still mapped
        (d.sim / "stop").touch()
        for pct, _, p in long_runs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, f"{pct}%: exit {p.returncode}: {err}"
        assert list(new.stub.List(pb.ListRequest(), timeout=5).slices) == []
        # By the N-1 hook's poststop, or by N's reconciler when it saw the container's
        # init gone first (a race either may win on a loaded machine).
        released = {e["owner"] for e in new.events()
                    if e["kind"] in ("release", "reconcile.release")}
        assert {cid for _, cid, _ in long_runs} <= released
        # Enforced throughout: no fixed slice above its share, and the GPU split between
        # them as their shares say. (Their sum falls short of 90 % here: two CPUs also run
        # a runc start after another and vgpud's restarts, and a launch the CPU delays
        # leaves the GPU idle for everyone alike.)
        medians = {}
        for pct in SHARES:
            rounds = sorted(d.sim.glob(f"t{pct}.*"))
            shares = [s for s in map(_share, rounds[:-1]) if s == s]
            medians[pct] = statistics.median(shares)
            assert medians[pct] <= pct + 2, (pct, shares)
        total = sum(medians.values())
        for pct, got in medians.items():
            assert got / total * 100 == pytest.approx(pct / sum(SHARES) * 100, abs=5), medians
        # N-1's libvgpu goes once its last container is gone; N's stays.
        new.wait_for(lambda: old_install not in {i.name for i in installed(lib_dir)},
                     timeout=15, what=f"{old_install} removed")
        assert ours in {i.name for i in installed(lib_dir)}
        print(json.dumps({"restart_s": restart_s, "progress": progress, "shares": medians}))
    finally:
        (d.sim / "stop").touch()
        for _, _, p in long_runs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        act.close()
