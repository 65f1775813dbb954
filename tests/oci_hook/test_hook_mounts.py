# SPDX-License-Identifier: Apache-2.0
"""Mounting a slice against hostile images: every target stays inside the rootfs.

The plan is oci_hook.mounts.plan_mounts' (the decision vgpud makes); the compiled
vgpu-hook (oci_hook/native/vg_mount.c) gets it from a lifecycle socket (a LifecycleServer
that answers it, as vgpud does) and mounts it itself.
The mounts are made for real, in the mount namespace of a process started with
`unshare --mount` (what runc's init is during prestart); the assertions look at the
host paths an escape would have written to, and at that namespace through /proc/<pid>/root.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.paths import LIBVGPU, NATIVE_BIN
from support.prereq import require

from arbiter.files.sched_files import slice_key_of
from oci_hook.errors import MountError
from oci_hook.mounts import CONTAINER_LIBVGPU, CONTAINER_SCHED_DIR, plan_mounts
from oci_hook.slices import SliceView, VGpuView
from shim.lifecycle import LifecycleServer, Reply

REQ_NAME = f"GPU-0.{slice_key_of('s1', 0):016x}.req"

require(os.geteuid() == 0 and shutil.which("unshare") is not None, "needs root and unshare")


@pytest.fixture
def tree(tmp_path):
    """A small rootfs, a host dir an escape would reach, a region file, a bundle dir."""
    rootfs = tmp_path / "bundle" / "rootfs"
    for d in ("etc", "dev", "usr/lib", "proc"):
        (rootfs / d).mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    # vgpud's layout: <run>/slices/<id>/vgpu<i> and the scheduling files in <run>/sched.
    region = tmp_path / "run" / "slices" / "s1" / "vgpu0"
    region.parent.mkdir(parents=True)
    region.write_bytes(b"R" * 64)
    region.with_name("vgpu0.usage").write_bytes(b"U" * 64)
    sched = tmp_path / "run" / "sched"
    sched.mkdir()
    (sched / "GPU-0").write_bytes(b"G" * 64)
    (sched / REQ_NAME).write_bytes(b"Q" * 64)
    return rootfs, outside, region


@pytest.fixture
def ns():
    """A process alone in a private mount namespace; its pid."""
    p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
    mnt = f"/proc/{p.pid}/ns/mnt"
    while os.readlink(mnt) == os.readlink("/proc/self/ns/mnt"):
        pass  # unshare has not exec'd sleep yet
    yield p.pid
    p.kill()
    p.wait()


def plan_for(rootfs: Path, region: Path, nodes: tuple[str, ...] = ("/dev/null",)):
    s = SliceView(id="s1", owner="c1", region_dir=str(region.parent),
                  vgpus=(VGpuView(0, "GPU-0", str(region), nodes),))
    return plan_mounts(s, rootfs=rootfs, libvgpu=LIBVGPU,
                       preload_host=rootfs.parent / "vgpu-ld.so.preload")


class CompiledHook:
    """The compiled vgpu-hook, fed `plan` by a lifecycle socket; records releases."""

    def __init__(self, tmp: Path) -> None:
        self.socket = tmp / "test.lifecycle"
        self.plan = None
        self.released: list[str] = []
        self.server = LifecycleServer(self.socket, {"prestart": self._prestart,
                                                    "release": self._release})
        self.server.start()

    def _prestart(self, req):
        state = json.loads(req.get("state"))
        return Reply.of("mount", ("id", state["id"]), ("pid", str(state["pid"])),
                        *self.plan.to_fields())

    def _release(self, req):
        self.released.append(req.get("id"))
        return Reply.of("ok")

    def apply(self, pid: int, plan) -> None:
        self.plan = plan
        state = json.dumps({"id": "c1", "pid": pid, "bundle": str(Path(plan.rootfs).parent),
                            "status": "created"})
        env = {"PATH": os.environ["PATH"], "VGPU_LIFECYCLE_SOCKET": str(self.socket)}
        p = subprocess.run([str(NATIVE_BIN / "vgpu-hook"), "prestart"], input=state, env=env,
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            assert p.stderr.count("\n") == 1, p.stderr
            assert self.released == ["c1"], "a failed mount gives the slice back"
            prefix = "vgpu: failed to set up the vGPU mounts: "
            assert p.stderr.startswith(prefix), p.stderr
            raise MountError("set up", "the vGPU mounts", p.stderr[len(prefix):].strip())
        assert p.stderr == ""

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def hook(tmp_path):
    """The compiled vgpu-hook and the socket that answers it the plan."""
    h = CompiledHook(tmp_path)
    yield h
    h.close()


def inside(pid: int, rootfs: Path, path: str) -> Path:
    """`path` of the container as the namespace sees it."""
    return Path(f"/proc/{pid}/root{rootfs}{path}")


def read_in(pid: int, rootfs: Path, path: str) -> bytes:
    """`path` read in the namespace with the rootfs as / (symlinks resolve inside it)."""
    code = ("import os, sys; os.chroot(sys.argv[1]); os.chdir('/'); "
            "sys.stdout.buffer.write(open(sys.argv[2], 'rb').read())")
    return subprocess.run(["nsenter", f"--mount=/proc/{pid}/ns/mnt", sys.executable, "-c",
                           code, str(rootfs), path], capture_output=True, check=True).stdout


def mounts_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/mountinfo").read_text().splitlines()


def test_plain_image_gets_every_mount(tree, ns, hook):
    rootfs, _, region = tree
    (rootfs / "etc/ld.so.preload").write_text("/lib/own.so\n")
    hook.apply(ns, plan_for(rootfs, region))
    assert inside(ns, rootfs, "/dev/vgpu0").read_bytes() == region.read_bytes()
    assert inside(ns, rootfs, CONTAINER_LIBVGPU).read_bytes() == LIBVGPU.read_bytes()
    assert inside(ns, rootfs, "/etc/ld.so.preload").read_text() == \
        f"{CONTAINER_LIBVGPU}\n/lib/own.so\n"
    # Only in the namespace: the host sees the image's own file and empty mount points.
    assert (rootfs / "etc/ld.so.preload").read_text() == "/lib/own.so\n"
    assert (rootfs / "dev/vgpu0").stat().st_size == 0
    # Read-only where it should be: the limits too; read-write for the slice's usage alone.
    with pytest.raises(OSError):
        inside(ns, rootfs, "/etc/ld.so.preload").write_text("x")
    with pytest.raises(OSError):
        inside(ns, rootfs, "/dev/vgpu0").write_bytes(b"W" * 64)
    with pytest.raises(OSError):
        os.truncate(inside(ns, rootfs, "/dev/vgpu0"), 0)
    assert region.read_bytes() == b"R" * 64
    inside(ns, rootfs, "/dev/vgpu0.usage").write_bytes(b"W" * 64)
    assert region.with_name("vgpu0.usage").read_bytes() == b"W" * 64
    # The GPU's scheduling file is the broker's: read-only; the slice's requests are its own.
    sched = region.parent.parent.parent / "sched"
    gpu_file = inside(ns, rootfs, f"{CONTAINER_SCHED_DIR}/GPU-0")
    assert gpu_file.read_bytes() == b"G" * 64
    with pytest.raises(OSError):
        gpu_file.write_bytes(b"X" * 64)
    with pytest.raises(OSError):
        os.truncate(gpu_file, 0)
    inside(ns, rootfs, f"{CONTAINER_SCHED_DIR}/{REQ_NAME}").write_bytes(b"w" * 64)
    assert (sched / REQ_NAME).read_bytes() == b"w" * 64
    assert (sched / "GPU-0").read_bytes() == b"G" * 64


def test_second_run_changes_nothing(tree, ns, hook):
    rootfs, _, region = tree
    hook.apply(ns, plan_for(rootfs, region))
    before = mounts_of(ns)
    hook.apply(ns, plan_for(rootfs, region))
    assert mounts_of(ns) == before
    assert inside(ns, rootfs, "/etc/ld.so.preload").read_text() == f"{CONTAINER_LIBVGPU}\n"


HOSTILE = ["etc-absolute-symlink", "etc-relative-escape", "dev-vgpu0-symlink",
           "usr-lib-vgpu-symlink", "dangling-chain", "preload-fifo"]


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_image_never_writes_outside_the_rootfs(tree, ns, hook, case):
    rootfs, outside, region = tree
    escape = rootfs.parent.parent.parent  # where ../../.. from the rootfs's /etc would land
    before = sorted(os.listdir(escape))
    if case == "etc-absolute-symlink":
        shutil.rmtree(rootfs / "etc")
        (rootfs / "etc").symlink_to(outside)
    elif case == "etc-relative-escape":
        shutil.rmtree(rootfs / "etc")
        (rootfs / "etc").symlink_to("../../..")
    elif case == "dev-vgpu0-symlink":
        (rootfs / "dev/vgpu0").symlink_to(outside / "vgpu0")
    elif case == "usr-lib-vgpu-symlink":
        (rootfs / "usr/lib/vgpu").symlink_to(outside / "lib")
    elif case == "dangling-chain":
        (rootfs / "usr/lib/vgpu").symlink_to("/a")
        (rootfs / "a").symlink_to(f"{outside}/b")
    elif case == "preload-fifo":
        os.mkfifo(rootfs / "etc/ld.so.preload")
    hook.apply(ns, plan_for(rootfs, region))
    assert os.listdir(outside) == []
    assert sorted(os.listdir(escape)) == before
    # The mounts are there, inside the rootfs, wherever the image's links led.
    assert read_in(ns, rootfs, "/dev/vgpu0") == region.read_bytes()
    assert read_in(ns, rootfs, CONTAINER_LIBVGPU) == LIBVGPU.read_bytes()
    assert read_in(ns, rootfs, "/etc/ld.so.preload").startswith(CONTAINER_LIBVGPU.encode())


def test_the_images_preload_is_opened_only_when_it_is_a_regular_file(tree, ns, hook):
    """The hook runs as host root: whatever the image has at /etc/ld.so.preload is looked
    at (O_PATH) before anything opens it (issue 22). A FIFO there is not opened: a writer
    blocked opening it stays blocked (before, the hook's open let it go), and the start goes
    on with our library alone in the container's ld.so.preload."""
    rootfs, _, region = tree
    fifo = rootfs / "etc/ld.so.preload"
    os.mkfifo(fifo)
    opened = threading.Event()

    def writer() -> None:
        fd = os.open(fifo, os.O_WRONLY)  # blocks until someone opens the FIFO to read
        opened.set()
        os.close(fd)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        hook.apply(ns, plan_for(rootfs, region))
        assert not opened.wait(0.5), "the hook opened the image's FIFO"
        assert read_in(ns, rootfs, "/etc/ld.so.preload") == f"{CONTAINER_LIBVGPU}\n".encode()
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # (lets the writer go)
        t.join(5)


def test_failure_undoes_the_mounts_made(tree, ns, hook):
    rootfs, _, region = tree
    (rootfs / "etc/ld.so.preload").mkdir()  # the last mount cannot be made
    before = mounts_of(ns)
    with pytest.raises(MountError) as info:
        hook.apply(ns, plan_for(rootfs, region))
    assert "/etc/ld.so.preload" in str(info.value) and "\n" not in str(info.value)
    assert mounts_of(ns) == before


@pytest.mark.parametrize("name", ["GPU-0", REQ_NAME])
def test_a_missing_scheduling_file_refuses_the_container(tree, name):
    """No vGPU without its GPU's broker file and the slice's own requests file."""
    rootfs, _, region = tree
    (region.parent.parent.parent / "sched" / name).unlink()
    with pytest.raises(MountError, match=f"failed to find .*sched/{name}: missing"):
        plan_for(rootfs, region)


def test_missing_source_fails_clearly(tree, ns, hook):
    rootfs, _, region = tree
    with pytest.raises(MountError, match="/dev/nvidia-missing"):
        hook.apply(ns, plan_for(rootfs, region, nodes=("/dev/nvidia-missing",)))
