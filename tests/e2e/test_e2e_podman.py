# SPDX-License-Identifier: Apache-2.0
"""End to end on Podman: the hooks.d file `vgpu install podman` writes runs the compiled
vgpu-hook at prestart (the slice is made and mounted) and at poststop (it is released the
moment the container exits, not when the reconciler notices).

Podman runs with private storage (--root/--runroot/--tmpdir in a temporary tree, vfs),
cgroupfs, runc (crun refuses this VM's hybrid cgroup layout) and --hooks-dir pointing at
the installed file. An engine runs a hook with the environment its definition lists and
nothing else, so the test adds VGPU_CONFIG/VGPU_SOCKET there to reach its own vgpud (an
operator with the default /etc/vgpu/config.yaml adds nothing). The image is `podman
import`ed from tests/support/images.py's tarball. Raising rlimits is not allowed on this VM:
every container gets --ulimit at 1024.
"""
from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support.engines import require, simulated_host
from support.images import build_tarball
from support.paths import ROOT
from support.process import clean_env
from support.vgpud_harness import Vgpud, pb

require("podman", "conmon", "runc")

IMAGE = "localhost/vgpu-test:latest"
MI = 1 << 20
#: The longest a container's slice may outlive the container.
RELEASE_S = 3.0


class Podman:
    """podman with every path of its own under `tmp`."""

    def __init__(self, tmp: Path, runroot: Path, hooks_dir: Path) -> None:
        self.tmp = tmp
        self.env = clean_env()
        self.base = ["podman", "--root", str(tmp / "root"), "--runroot", str(runroot),
                     "--tmpdir", str(tmp / "libpod"), "--storage-driver", "vfs",
                     "--cgroup-manager", "cgroupfs", "--events-backend", "file",
                     "--runtime", "runc", "--hooks-dir", str(hooks_dir)]

    def __call__(self, *args: str, check: bool = True,
                 timeout: float = 120) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([*self.base, *args], env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {p.returncode}:\n"
                                 f"{p.stderr}{p.stdout}")
        return p


def install_hook(hooks_dir: Path, vgpud: Vgpud) -> dict:
    """`vgpu install podman` into hooks_dir, then the env that reaches the test's vgpud."""
    hook_file = hooks_dir / "vgpu.json"
    p = subprocess.run([sys.executable, "-m", "vgpu_cli", "install", "podman",
                        "--config-file", str(hook_file),
                        "--lib-dir", str(hooks_dir.parent / "install-lib")],
                       cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    doc = json.loads(hook_file.read_text())
    doc["hook"]["env"] = [f"VGPU_CONFIG={vgpud.config_file}", f"VGPU_SOCKET={vgpud.socket}"]
    hook_file.write_text(json.dumps(doc))
    return doc


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e-podman")
    _, vgpud = simulated_host(tmp, ["/run/runc"])  # podman's runc keeps its state there
    hooks_dir = tmp / "hooks.d"
    hook = install_hook(hooks_dir, vgpud)
    # Podman refuses a runroot path longer than 50 characters: pytest's are longer.
    runroot = Path(tempfile.mkdtemp(prefix="vgpu-podman-"))
    podman = Podman(tmp / "podman", runroot, hooks_dir)
    vgpud.start()
    try:
        podman("import", str(build_tarball(tmp / "rootfs.tar")), IMAGE)
        yield podman, vgpud, hook
    finally:
        podman("rm", "--all", "--force", "--time", "0", check=False)
        vgpud.close()
        shutil.rmtree(runroot, ignore_errors=True)


def slices_of(vgpud: Vgpud, cid: str) -> list:
    return [s for s in vgpud.stub.List(pb.ListRequest(), timeout=5).slices if s.owner == cid]


def test_the_installed_hook_runs_at_prestart_and_poststop(world) -> None:
    _, _, hook = world
    # The stable path of the versioned install `vgpu install` made (docs/upgrading.md).
    path = Path(hook["hook"]["path"])
    assert path.parts[-4:] == ("install-lib", "current", "bin", "vgpu-hook")
    assert filecmp.cmp(path, ROOT / "build" / "bin" / "vgpu-hook", shallow=False)
    assert hook["stages"] == ["prestart", "poststop"]


def test_a_podman_containers_slice_is_released_within_3s_of_its_exit(world) -> None:
    podman, vgpud, _ = world
    cid = podman("run", "-d", "--network", "none",
                 "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                 "--annotation", "vgpu.io/memory=256Mi", IMAGE,
                 "/bin/sh", "-c", "sleep 3").stdout.strip()
    (s,) = vgpud.wait_for(lambda: slices_of(vgpud, cid), timeout=10, what="the slice")
    assert [v.memory_bytes for v in s.vgpus] == [256 * MI]
    running = podman("inspect", "--format", "{{.State.Running}}", cid).stdout.strip()
    assert running == "true", "the slice must exist while the container runs"
    # The hook mounted the slice: its limits, read-only, as /dev/vgpu0.
    assert podman("exec", cid, "/bin/sh", "-c",
                  "test -s /dev/vgpu0 && grep ' /dev/vgpu0 [^ ]* ro,' /proc/mounts >/dev/null "
                  "&& echo mounted"
                  ).stdout.strip() == "mounted"
    assert podman("wait", cid, timeout=60).stdout.strip() == "0"
    exited = int(podman("inspect", "--format", "{{.State.FinishedAt.UnixNano}}",
                        cid).stdout.strip()) / 1e9
    deadline = exited + RELEASE_S + 5   # look past the bound, to say by how much it missed
    while slices_of(vgpud, cid) and time.time() < deadline:
        time.sleep(0.05)
    released = time.time()
    assert not slices_of(vgpud, cid), f"slice still allocated {released - exited:.1f}s later"
    assert released - exited <= RELEASE_S, f"released {released - exited:.1f}s after the exit"
    # poststop released it, not the reconciler.
    kinds = [e["kind"] for e in vgpud.events() if e.get("owner") == cid]
    assert kinds[-1] == "release" and "reconcile.release" not in kinds, kinds
    podman("rm", cid)


def test_a_podman_container_that_asks_for_nothing_gets_no_slice(world) -> None:
    podman, vgpud, _ = world
    before = len(vgpud.stub.List(pb.ListRequest(), timeout=5).slices)
    p = podman("run", "--rm", "--network", "none",
               "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
               IMAGE, "/bin/sh", "-c", "test ! -e /dev/vgpu0 && echo plain")
    assert p.stdout.strip() == "plain"
    assert len(vgpud.stub.List(pb.ListRequest(), timeout=5).slices) == before
