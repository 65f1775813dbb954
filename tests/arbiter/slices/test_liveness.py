# SPDX-License-Identifier: Apache-2.0
"""Slices live exactly as long as their containers, on real runc and crun, whatever the
runtime's state root: a running container keeps its slice across vgpud restarts and
reconciler passes, the slice goes when the container does, and a second container with
the same id gets nothing of the first one's (its Allocate is refused with one line, its
poststop releases nothing)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from support.images import make_bundle
from support.paths import ROOT
from support.process import clean_env
from support.vgpud_harness import pb, simgpu_vgpud

pytestmark = pytest.mark.skipif(shutil.which("runc") is None or os.geteuid() != 0,
                                reason="needs runc and root")

HOOK = ROOT / "build" / "bin" / "vgpu-hook"
RUNTIME = ROOT / "build" / "bin" / "vgpu-runtime"
PASS_S = 0.3          # reconcile interval: many passes while the container runs
UNIFIED = Path("/sys/fs/cgroup/unified")


def crun_lower(tmp: Path) -> str:
    """crun, or where it refuses this host's cgroups, crun in a v1-only mount namespace.

    crun refuses a hybrid host whose v2 hierarchy holds controllers (Debian 12's crun
    1.8 on such CI machines): it then runs without /sys/fs/cgroup/unified mounted, the
    way it runs on a plain v1 host. vgpud and the hooks see the same v1 cgroups."""
    crun = shutil.which("crun")
    assert crun is not None
    try:
        hybrid = bool((UNIFIED / "cgroup.controllers").read_text().split())
    except OSError:
        hybrid = False
    if not hybrid:
        return crun
    wrapper = tmp / "crun-v1"
    wrapper.write_text("#!/bin/sh\nexec unshare -m --propagation private sh -c "
                       f"'umount {UNIFIED} 2>/dev/null; exec {crun} \"$@\"' crun \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


class Host:
    """A vgpud whose reconciler runs often and knows none of the state roots used here."""

    def __init__(self, tmp: Path, lower: str = "runc") -> None:
        self.tmp = tmp
        self.sim, self.vgpud = simgpu_vgpud(tmp, {
            "reconcile": {"interval_s": PASS_S},
            "hook": {"wait_s": 3},
            "runtime": {"lower": lower},
        })
        self.n = 0
        self.procs: list[subprocess.Popen[str]] = []

    def env(self) -> dict[str, str]:
        return dict(clean_env(), VGPU_SOCKET=str(self.vgpud.socket),
                    VGPU_CONFIG=str(self.vgpud.config_file))

    def hook(self, phase: str) -> dict[str, object]:
        env = [f"{k}={v}" for k, v in self.env().items()
               if k in ("VGPU_SOCKET", "VGPU_CONFIG")]
        return {"path": str(HOOK), "args": ["vgpu-hook", phase], "env": env, "timeout": 20}

    def bundle(self, cid: str, *, hooks: bool) -> Path:
        """A container that runs until /sim/stop-<cid> appears."""
        self.n += 1
        b = make_bundle(
            self.tmp / f"bundle-{self.n}",
            args=["/bin/sh", "-c", f"while [ ! -e /sim/stop-{cid} ]; do sleep 0.05; done"],
            annotations={"vgpu.io/memory": "256Mi"},
            env=["SIMGPU_STATE=/sim/simgpu.state"],
            hooks={"prestart": [self.hook("prestart")],
                   "poststop": [self.hook("poststop")]} if hooks else None,
            mounts=[{"destination": "/sim", "type": "bind", "source": str(self.sim),
                     "options": ["rbind", "rw"]}])
        spec = json.loads((b / "config.json").read_text())
        # Engines give each container its own cgroup (containerd: /<namespace>/<id>).
        spec["linux"]["cgroupsPath"] = f"/vgpu-liveness-{os.getpid()}-{self.n}"
        (b / "config.json").write_text(json.dumps(spec))
        return b

    def start(self, argv: list[str]) -> subprocess.Popen[str]:
        p = subprocess.Popen(argv, env=self.env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def stop(self, cid: str, p: subprocess.Popen[str]) -> tuple[str, str]:
        (self.sim / f"stop-{cid}").touch()
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        return out, err

    def slices(self) -> list[pb.Slice]:
        return list(self.vgpud.stub.List(pb.ListRequest(), timeout=5).slices)

    def started(self, cid: str) -> pb.Slice:
        """The container's slice once its prestart recorded the init."""
        def bound() -> pb.Slice | None:
            return next((s for s in self.slices() if s.owner == cid and s.owner_pid), None)
        return self.vgpud.wait_for(bound, timeout=30, what=f"{cid}'s slice bound to its init")

    def restart_vgpud(self) -> None:
        self.vgpud.stop()
        self.vgpud.start()

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.vgpud.close()


def runtime_state_pid(runtime: str, root: Path, cid: str, timeout: float = 10) -> int:
    """The init pid the runtime's state names. A runtime may write its state only after
    the prestart hooks that already bound the slice (crun does): wait for it."""
    deadline = time.monotonic() + timeout
    while True:
        p = subprocess.run([runtime, "--root", str(root), "state", cid], capture_output=True,
                           text=True)
        if p.returncode == 0:
            return int(json.loads(p.stdout)["pid"])
        assert time.monotonic() < deadline, f"{runtime} state {cid}: {p.stderr.strip()}"
        time.sleep(0.05)


def keeps_slice_while_running(host: Host, cid: str, slice_id: str, restarts: int = 2) -> None:
    """vgpud restarts and many reconciler passes: the slice stays, nothing is released."""
    for _ in range(restarts):
        host.restart_vgpud()
        time.sleep(6 * PASS_S)
        assert [(s.id, s.owner) for s in host.slices()] == [(slice_id, cid)]
    assert host.vgpud.events("reconcile.release") == []


def released_events(host: Host) -> list[dict]:
    """Released by the container's poststop, or (a loaded machine) by a reconciler pass
    that saw its init gone first: either is right, and must happen once."""
    return host.vgpud.events("release") + host.vgpud.events("reconcile.release")


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.close()


def test_runc_with_another_root_keeps_its_slice_while_it_runs(host, tmp_path):
    """`vgpu-runtime --root DIR run`: vgpud knows nothing of DIR, the init tells."""
    root, cid = tmp_path / "elsewhere", f"live-runc-{os.getpid()}"
    b = host.bundle(cid, hooks=False)   # vgpu-runtime adds the hooks at create
    p = host.start([str(RUNTIME), "--root", str(root), "run", "--bundle", str(b), cid])
    s = host.started(cid)
    assert s.owner_pid == runtime_state_pid("runc", root, cid)
    assert s.owner_start > 0 and s.owner_bundle == str(b)
    assert s.owner_cgroup.endswith(f"/vgpu-liveness-{os.getpid()}-1")
    keeps_slice_while_running(host, cid, s.id)
    host.stop(cid, p)
    assert host.slices() == []
    assert [e["slice"] for e in host.vgpud.wait_for(lambda: released_events(host),
                                                    what="the release event")] == [s.id]


def test_crun_keeps_its_slice_while_it_runs_and_loses_it_after(tmp_path):
    """crun (its own state root, /run/crun), and an exit while vgpud is down."""
    if shutil.which("crun") is None:
        pytest.skip("needs crun (apt-get install crun)")
    host = Host(tmp_path, lower=crun_lower(tmp_path))
    try:
        root, cid = tmp_path / "crun-root", f"live-crun-{os.getpid()}"
        b = host.bundle(cid, hooks=False)
        p = host.start([str(RUNTIME), "--root", str(root), "run", "--bundle", str(b), cid])
        s = host.started(cid)
        assert s.owner_pid == runtime_state_pid("crun", root, cid)
        keeps_slice_while_running(host, cid, s.id)
        # The container exits while vgpud is down: its poststop cannot release; the
        # first pass of the next vgpud does (the init and its cgroup are gone).
        host.vgpud.stop()
        host.stop(cid, p)
        host.vgpud.start()
        host.vgpud.wait_for(lambda: host.slices() == [], timeout=10, what="the slice released")
        [ev] = host.vgpud.events("reconcile.release")
        assert ev["slice"] == s.id
    finally:
        host.close()


def poststop(host: Host, cid: str, bundle: Path) -> subprocess.CompletedProcess[str]:
    """The compiled vgpu-hook's poststop, with the stopped state runc hands it."""
    state = json.dumps({"ociVersion": "1.0.2", "id": cid, "status": "stopped",
                        "bundle": str(bundle)})
    return subprocess.run([str(HOOK), "poststop"], input=state, env=host.env(),
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("second", ["hook", "runtime"])
def test_same_container_id_twice(host, tmp_path, second):
    """Two runtime roots (two engines, two containerd namespaces) and one container id:
    the second is refused with one line, the first keeps its slice, and the second's
    poststop does not release it."""
    cid = f"twice-{os.getpid()}"
    b1 = host.bundle(cid, hooks=True)
    first = host.start(["runc", "--root", str(tmp_path / "root1"), "run", "--bundle", str(b1),
                        cid])
    s = host.started(cid)
    b2 = host.bundle(cid, hooks=second == "hook")
    argv = ["runc", "--root", str(tmp_path / "root2"), "run", "--bundle", str(b2), cid]
    if second == "runtime":
        argv = [str(RUNTIME), *argv[1:]]
    p = subprocess.run(argv, env=host.env(), capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    line = f"container id '{cid}' is in use: slice {s.id}: a running container (init pid "
    assert line in p.stderr, p.stderr
    said = p.stderr.split("stderr: ", 1)[-1]      # runc wraps what the hook printed
    assert said.strip().count("vgpu:") == 1, p.stderr
    # The second container's poststop (runc runs it as it tears the container down; here
    # again, explicitly) leaves the first one's slice alone.
    assert poststop(host, cid, b2).returncode == 0
    assert [(x.id, x.owner_pid) for x in host.slices()] == [(s.id, s.owner_pid)]
    assert host.vgpud.events("release") == []
    time.sleep(4 * PASS_S)
    assert [x.id for x in host.slices()] == [s.id]
    host.stop(cid, first)
    assert host.slices() == []
    assert [e["slice"] for e in host.vgpud.wait_for(lambda: released_events(host),
                                                    what="the release event")] == [s.id]


def test_a_process_left_in_the_cgroup_keeps_the_slice(host, tmp_path):
    """The init exits, a process it started lives on in the container's cgroup (no pid
    namespace of its own, so nothing kills it): the slice stays until that one is gone."""
    root, cid = tmp_path / "detached", f"leftover-{os.getpid()}"
    b = host.bundle(cid, hooks=True)
    spec = json.loads((b / "config.json").read_text())
    spec["process"]["args"] = ["/bin/sh", "-c", "sleep 600 & exit 0"]
    spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"]
                                   if n["type"] != "pid"]
    (b / "config.json").write_text(json.dumps(spec))
    runc = ["runc", "--root", str(root)]
    subprocess.run([*runc, "run", "-d", "--bundle", str(b), cid], env=host.env(), check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=60)
    try:
        s = host.started(cid)
        assert s.owner_cgroup

        def stopped() -> bool:
            out = subprocess.run([*runc, "state", cid], capture_output=True, text=True).stdout
            return json.loads(out)["status"] == "stopped"
        host.vgpud.wait_for(stopped, timeout=20, what="the init's exit")
        time.sleep(6 * PASS_S)
        host.restart_vgpud()
        time.sleep(4 * PASS_S)
        assert [x.id for x in host.slices()] == [s.id]
        assert host.vgpud.events("reconcile.release") == []
    finally:
        # runc delete kills what is left in the cgroup, then runs the poststop hook.
        subprocess.run([*runc, "delete", "--force", cid], env=host.env(), timeout=60,
                       capture_output=True)
    host.vgpud.wait_for(lambda: host.slices() == [], timeout=10, what="the slice released")
