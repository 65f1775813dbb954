# SPDX-License-Identifier: Apache-2.0
"""Versioned installs: made once, never written again, removed when no container maps them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arbiter.install import versions
from arbiter.install.versions import Holder, InstallError, collect, install, installed, unused
from arbiter.native import own_files

TARGET = "/usr/lib/vgpu/libvgpu.so"


def _files(tmp: Path, lib: bytes = b"lib", hook: bytes = b"hook") -> dict[str, Path]:
    src = tmp / "src"
    (src / "bin" / "shim").mkdir(parents=True, exist_ok=True)
    (src / "libvgpu.so").write_bytes(lib)
    (src / "bin" / "vgpu-hook").write_bytes(hook)
    (src / "bin" / "shim" / "runc").write_bytes(b"runc")
    return {"libvgpu.so": src / "libvgpu.so", "bin/vgpu-hook": src / "bin" / "vgpu-hook",
            "bin/shim/runc": src / "bin" / "shim" / "runc"}


def test_install_is_made_once_under_version_and_hash(tmp_path):
    root = tmp_path / "lib"
    a = install(root, "0.2.0", _files(tmp_path))
    assert a.path.parent == root and a.name == f"0.2.0-{a.hash}" and len(a.hash) == 12
    assert a.libvgpu.read_bytes() == b"lib"
    assert a.program("shim/runc").read_bytes() == b"runc"
    assert os.access(a.program("vgpu-hook"), os.X_OK)
    inode = a.libvgpu.stat().st_ino
    # Same content again: the same directory, untouched (same inode, no temp left).
    again = install(root, "0.2.0", _files(tmp_path))
    assert again == a and again.libvgpu.stat().st_ino == inode
    assert sorted(p.name for p in root.iterdir()) == [a.name]
    assert installed(root) == [a]


def test_a_rebuilt_same_version_is_another_directory(tmp_path):
    root = tmp_path / "lib"
    a = install(root, "0.2.0", _files(tmp_path, lib=b"one"))
    b = install(root, "0.2.0", _files(tmp_path, lib=b"two"))
    assert a.path != b.path and a.libvgpu.read_bytes() == b"one"
    assert [i.name for i in installed(root)] == sorted([a.name, b.name])


@pytest.mark.parametrize(("version", "files", "reason"), [
    ("../x", None, "version '../x' cannot name a directory"),
    ("", None, "version '' cannot name a directory"),
    ("0.2.0", {}, "no libvgpu.so to install"),
], ids=["dotdot", "empty", "no-lib"])
def test_bad_install_is_one_line_and_leaves_nothing(tmp_path, version, files, reason):
    root = tmp_path / "lib"
    with pytest.raises(InstallError, match=reason.replace("(", r"\(")):
        install(root, version, _files(tmp_path) if files is None else files)
    assert not root.exists() or list(root.iterdir()) == []


def test_a_failed_copy_leaves_no_directory(tmp_path, monkeypatch):
    root = tmp_path / "lib"
    calls = []

    def fail(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return Path(dst).write_bytes(Path(src).read_bytes())
    monkeypatch.setattr(versions.shutil, "copyfile", fail)
    with pytest.raises(InstallError, match="No space left on device"):
        install(root, "0.2.0", _files(tmp_path))
    assert list(root.iterdir()) == []


def test_a_directory_without_manifest_is_not_an_install_and_never_touched(tmp_path):
    root = tmp_path / "lib"
    stray = root / "0.1.0-abc"
    stray.mkdir(parents=True)
    (stray / "libvgpu.so").write_bytes(b"x")
    assert installed(root) == []
    assert collect(root, "none", [], target=TARGET) == []
    assert (stray / "libvgpu.so").exists()


def _mountinfo(root_field: str, target: str = TARGET) -> str:
    return (f"22 1 0:21 / / rw - overlay overlay rw\n"
            f"611 22 8:1 {root_field} {target} ro,nosuid,nodev - ext4 /dev/sda1 rw\n")


@pytest.mark.parametrize(("root_field", "found"), [
    ("/var/lib/vgpu/lib/0.1.0-aaa/libvgpu.so", {"0.1.0-aaa"}),
    ("/vgpu/lib/0.1.0-aaa/libvgpu.so", {"0.1.0-aaa"}),      # lib dir on its own filesystem
    ("/var/lib/vgpu/lib/0.1.0-aaa/libvgpu.so//deleted", {"0.1.0-aaa"}),
    ("/home/x/build/libvgpu.so", set()),                      # not a versioned install
], ids=["rootfs", "own-fs", "deleted", "unversioned"])
def test_mounted_installs_reads_the_bind_source(root_field, found):
    assert versions.mounted_installs(_mountinfo(root_field), {"0.1.0-aaa", "0.2.0-bbb"},
                                     TARGET) == found


def test_mounted_installs_only_at_the_library_target():
    text = _mountinfo("/lib/0.1.0-aaa/libvgpu.so", target="/elsewhere")
    assert versions.mounted_installs(text, {"0.1.0-aaa"}, TARGET) == set()


def test_mounted_installs_unescapes_spaces():
    text = _mountinfo("/my\\040lib/0.1.0-aaa/libvgpu.so", target="/usr/lib/vgpu/libvgpu.so")
    assert versions.mounted_installs(text, {"0.1.0-aaa"}, TARGET) == {"0.1.0-aaa"}


@pytest.fixture
def three(tmp_path):
    root = tmp_path / "lib"
    return root, [install(root, v, _files(tmp_path, lib=v.encode())) for v in
                  ("0.1.0", "0.2.0", "0.3.0")]


def test_unused_keeps_served_recorded_and_mapped(tmp_path, three):
    root, (old, cur, other) = three
    proc = tmp_path / "proc"
    (proc / "41").mkdir(parents=True)
    (proc / "41" / "mountinfo").write_text(_mountinfo(f"/lib/{other.name}/libvgpu.so"))
    holders = [Holder(recorded=old.name, pid=40),   # recorded: kept, mountinfo not read
               Holder(recorded="", pid=41),         # an older vgpud's container: mountinfo
               Holder(recorded="", pid=0)]          # not started: gets what vgpud serves
    assert unused(installed(root), cur.name, holders, target=TARGET, proc=proc) == []
    assert unused(installed(root), cur.name, holders[1:], target=TARGET, proc=proc) == [old]
    # A holder whose init is gone keeps nothing.
    assert unused(installed(root), cur.name, [Holder("", 99)], target=TARGET,
                  proc=proc) == [old, other]


def test_unreadable_mountinfo_keeps_everything(tmp_path, three):
    root, (_, cur, _) = three
    proc = tmp_path / "proc"
    (proc / "41" / "mountinfo").mkdir(parents=True)   # reading it fails (EISDIR): unknown
    assert unused(installed(root), cur.name, [Holder("", 41)], target=TARGET, proc=proc) == []


def test_collect_removes_unused_and_leftovers(tmp_path, three):
    root, (old, cur, other) = three
    (root / ".rm-0.0.1-x").mkdir()
    fresh = root / ".tmp-0.4.0-y.1234"
    fresh.mkdir()       # an install in progress (another process): kept
    stale = root / ".tmp-0.4.0-z.5678"
    stale.mkdir()
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    removed = collect(root, cur.name, [Holder(other.name, 1)], target=TARGET)
    assert removed == [old]
    assert sorted(p.name for p in root.iterdir()) == sorted([cur.name, other.name, fresh.name])


def test_collect_keeps_what_a_live_process_maps(tmp_path, three):
    """A real process whose mount namespace binds an install's libvgpu.so at the target."""
    if os.geteuid() != 0:
        pytest.skip("needs root (unshare -m)")
    root, (old, cur, _) = three
    target = tmp_path / "target" / "libvgpu.so"
    target.parent.mkdir()
    target.write_bytes(b"")
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                          f"mount --bind {old.libvgpu} {target} && echo up && sleep 30"],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "up\n"
        holders = [Holder("", p.pid)]
        removed = collect(root, cur.name, holders, target=str(target))
        assert old not in removed and old.path.is_dir()
    finally:
        p.kill()
        p.wait()
    assert old in collect(root, cur.name, [Holder("", p.pid)], target=str(target))
    assert not old.path.exists()


def test_own_files_is_this_checkout_with_its_programs():
    files = own_files()
    assert files["libvgpu.so"].name == "libvgpu.so"
    for name in ("vgpu-hook", "vgpu-runtime", "containerd-shim-vgpu-v2", "shim/runc"):
        assert f"bin/{name}" in files, sys.path


# --- current: the install engines exec --------------------------------------------------

def _program_files(tmp: Path, version: str) -> dict[str, Path]:
    """An install whose bin/prog is a real program that prints `version`."""
    src = tmp / f"src-{version}"
    (src / "bin").mkdir(parents=True)
    (src / "libvgpu.so").write_bytes(version.encode())
    (src / "bin" / "prog").write_text(f"#!/bin/sh\necho {version}\n")
    return {"libvgpu.so": src / "libvgpu.so", "bin/prog": src / "bin" / "prog"}


def test_switch_current_names_the_install_relatively_and_says_what_it_was(tmp_path, three):
    root, (old, cur, _) = three
    assert versions.current(root) is None
    assert versions.switch_current(root, old) is None
    assert os.readlink(root / "current") == old.name   # relative: the dir may move
    assert versions.current(root) == old
    assert versions.switch_current(root, cur) == old.name
    assert versions.current(root) == cur
    assert versions.stable_program(root, "vgpu-hook").read_bytes() == b"hook"
    # Nothing but the installs and the link is left (no temporary link).
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [*(i.name for i in installed(root)), "current"])
    with pytest.raises(InstallError, match="not a complete install"):
        versions.switch_current(root, versions.Install(tmp_path / "x", "9", "h"))
    assert versions.current(root) == cur


def test_switching_current_never_breaks_a_concurrent_exec(tmp_path):
    """A loop execs current/bin/prog while current flips 0.1.0 <-> 0.2.0: every exec runs
    one complete program of either version, none fails."""
    root = tmp_path / "lib"
    a = install(root, "0.1.0", _program_files(tmp_path, "0.1.0"))
    b = install(root, "0.2.0", _program_files(tmp_path, "0.2.0"))
    versions.switch_current(root, a)
    prog = versions.stable_program(root, "prog")
    loop = subprocess.Popen(
        ["sh", "-c", f'i=0; while [ $i -lt 400 ]; do "{prog}" || exit 1; i=$((i+1)); done'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    flips = 0
    while loop.poll() is None:
        versions.switch_current(root, b if flips % 2 == 0 else a)
        flips += 1
    out, err = loop.communicate()
    assert loop.returncode == 0, err
    lines = out.splitlines()
    assert len(lines) == 400 and set(lines) == {"0.1.0", "0.2.0"}, (flips, set(lines))
    assert flips > 10


def test_collect_keeps_the_install_current_names(tmp_path, three):
    root, (old, cur, other) = three
    versions.switch_current(root, other)   # e.g. `vgpu upgrade` switched before the restart
    assert collect(root, cur.name, [], target=TARGET) == [old]
    assert {i.name for i in installed(root)} == {cur.name, other.name}
    assert versions.current(root) == other


@pytest.mark.parametrize("layout", ["runc/<id>", "containerd/<namespace>/<id>"])
def test_collect_keeps_an_install_a_runtimes_container_state_names(tmp_path, three, layout):
    """The reconciler released the slice (its init died) before the runtime ran the
    poststop hook: runc's state.json still names the install's vgpu-hook, so it stays
    until the runtime deletes the container."""
    root, (old, cur, other) = three
    state_root = tmp_path / "run" / layout.split("/")[0]
    cdir = state_root / ("k8s.io/c1" if "namespace" in layout else "c1")
    cdir.mkdir(parents=True)
    hook = {"path": str(old.program("vgpu-hook")), "args": ["vgpu-hook", "poststop"]}
    (cdir / "state.json").write_text(json.dumps({"id": "c1", "config": {
        "Hooks": {"poststop": [hook]}}}))
    assert versions.runtime_referenced(root, [old.name, other.name], [state_root]) == \
        {old.name}
    assert collect(root, cur.name, [], target=TARGET, runtime_state_roots=[state_root]) == \
        [other]
    assert old.path.is_dir()
    shutil.rmtree(cdir)   # `runc delete` ran the hook and removed the state
    assert collect(root, cur.name, [], target=TARGET, runtime_state_roots=[state_root]) == \
        [old]


def test_a_stopped_runc_container_keeps_the_install_its_poststop_hook_runs_from(tmp_path):
    """Real runc: the container's init is gone (a reconciler would release its slice) but
    `runc delete` has not run its poststop hook yet, from an install's program: collection
    keeps the install until the delete, and the hook then runs."""
    from support.images import make_bundle
    from support.prereq import require

    require(shutil.which("runc") is not None and os.geteuid() == 0, "needs runc and root")
    root = tmp_path / "lib"
    src = tmp_path / "src"
    (src / "bin").mkdir(parents=True)
    (src / "libvgpu.so").write_bytes(b"old")
    marker = tmp_path / "poststop-ran"
    (src / "bin" / "vgpu-hook").write_text(f"#!/bin/sh\ntouch {marker}\n")
    old = install(root, "0.1.0", {"libvgpu.so": src / "libvgpu.so",
                                  "bin/vgpu-hook": src / "bin" / "vgpu-hook"})
    serving = install(root, "0.2.0", _files(tmp_path))
    state_root = tmp_path / "runc"
    cid = f"vgpu-installs-{os.getpid()}"
    bundle = make_bundle(tmp_path / "bundle", args=["/bin/sh", "-c", "exit 0"], hooks={
        "poststop": [{"path": str(old.program("vgpu-hook")), "args": ["vgpu-hook"]}]})
    runc = ["runc", "--root", str(state_root)]
    subprocess.run([*runc, "create", "--bundle", str(bundle), cid], check=True, timeout=60,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        subprocess.run([*runc, "kill", cid, "KILL"], check=True, timeout=30)
        for _ in range(100):   # the init is gone; the state stays until `runc delete`
            st = subprocess.run([*runc, "state", cid], capture_output=True, text=True)
            if json.loads(st.stdout)["status"] == "stopped":
                break
            time.sleep(0.05)
        assert collect(root, serving.name, [], target=TARGET,
                       runtime_state_roots=[state_root]) == []
        assert old.program("vgpu-hook").is_file() and not marker.exists()
    finally:
        subprocess.run([*runc, "delete", "--force", cid], check=False, timeout=60)
    assert marker.exists()   # the poststop hook ran from the install
    assert collect(root, serving.name, [], target=TARGET,
                   runtime_state_roots=[state_root]) == [old]
