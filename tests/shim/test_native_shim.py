# SPDX-License-Identifier: Apache-2.0
"""containerd-shim-vgpu-v2 (shim/native/containerd_shim.c): it execs containerd's
containerd-shim-runc-v2 with the same argv, its private bin dir (build/bin/shim) first
on PATH and in $VGPU_SHIM_BIN; that dir's runc is vgpu-runtime, which skips the dir when
it looks for the real runc. Stand-ins record what they were given."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from support.native_programs import FakeVgpud, Recorder, program, run_program
from support.paths import NATIVE_BIN

SHIM = program("containerd-shim-vgpu-v2")
PRIVATE = Path(os.path.realpath(NATIVE_BIN / "shim"))
ARGV = ["-namespace", "k8s.io", "-address", "/run/containerd/containerd.sock", "-id", "c1",
        "start"]


@pytest.fixture
def runc_shim(tmp_path: Path) -> Recorder:
    """A containerd-shim-runc-v2 that records its argv, PATH and VGPU_SHIM_BIN."""
    return Recorder(tmp_path / "containerd" / "containerd-shim-runc-v2",
                    env_names=("PATH", "VGPU_SHIM_BIN"))


def test_the_private_runc_is_vgpu_runtime():
    assert (PRIVATE / "runc").read_bytes() == program("vgpu-runtime").read_bytes()


@pytest.mark.parametrize("path", ["{c}:/usr/bin:/bin", "{p}:{c}:/usr/bin:{p}/:/bin"],
                         ids=["plain", "private-dir-already-there"])
def test_it_execs_containerds_runc_shim_with_the_private_dir_first(runc_shim, path):
    path = path.format(c=runc_shim.path.parent, p=PRIVATE)
    p = run_program([SHIM, *ARGV], {"PATH": path})
    assert (p.returncode, p.stderr) == (0, "")
    assert runc_shim.argv() == ARGV
    rest = [e for e in path.split(":") if os.path.realpath(e) != str(PRIVATE)]
    assert runc_shim.env() == {"PATH": ":".join([str(PRIVATE), *rest]),
                               "VGPU_SHIM_BIN": str(PRIVATE)}


def test_through_a_link_elsewhere_it_finds_its_own_private_dir(runc_shim, tmp_path):
    """Engines find the shim through a link on their PATH (tests/support/engines.py does that)."""
    links = tmp_path / "links"
    links.mkdir()
    (links / "containerd-shim-vgpu-v2").symlink_to(SHIM)
    p = run_program([links / "containerd-shim-vgpu-v2", *ARGV],
                    {"PATH": f"{links}:{runc_shim.path.parent}:/usr/bin:/bin"})
    assert (p.returncode, p.stderr) == (0, "")
    assert runc_shim.env()["VGPU_SHIM_BIN"] == str(PRIVATE)


def test_a_runc_shim_that_is_itself_is_skipped(runc_shim, tmp_path):
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "containerd-shim-runc-v2").symlink_to(SHIM)
    p = run_program([SHIM, *ARGV], {"PATH": f"{loop}:{runc_shim.path.parent}:/usr/bin:/bin"})
    assert (p.returncode, p.stderr) == (0, "")
    assert runc_shim.argv() == ARGV


def test_without_containerds_runc_shim_it_is_one_line(tmp_path):
    p = run_program([SHIM, *ARGV], {"PATH": f"{tmp_path}:/nonexistent"})
    assert (p.returncode, p.stderr) == (
        1, "containerd-shim-vgpu-v2: failed to start: containerd-shim-runc-v2 is not on PATH "
           "(install containerd)\n")


def test_without_its_private_runc_it_is_one_line(runc_shim, tmp_path):
    lone = tmp_path / "lone" / "containerd-shim-vgpu-v2"
    lone.parent.mkdir()
    shutil.copy2(SHIM, lone)
    p = run_program([lone, *ARGV], {"PATH": f"{runc_shim.path.parent}:/usr/bin:/bin"})
    assert (p.returncode, p.stderr) == (
        1, f"containerd-shim-vgpu-v2: failed to start: {lone.parent}/shim/runc is missing or "
           "not executable (vgpu-runtime as runc: run make, or reinstall vgpu)\n")
    assert not runc_shim.ran


def test_the_runc_shims_runc_is_vgpu_runtime_and_reaches_the_real_runc(tmp_path):
    """The chain containerd builds: our shim -> its runc shim -> `runc` on PATH (the
    private one, vgpu-runtime) -> vgpud for a container that asks -> the real runc."""
    real = Recorder(tmp_path / "real" / "runc")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"annotations": {"vgpu.io/memory": "1Gi"}}))
    runc_shim = Recorder(tmp_path / "containerd" / "containerd-shim-runc-v2",
                         then=f'exec runc --root /r create --bundle {bundle} c1')
    config = tmp_path / "config.yaml"
    config.write_text(f"paths:\n  socket: {tmp_path}/vgpud.sock\nhook:\n  wait_s: 5\n")
    with FakeVgpud(tmp_path / "vgpud.sock.lifecycle",
                   lambda r: [("v", "2"), ("status", "ok")]) as vgpud:
        p = run_program([SHIM, *ARGV], {
            "PATH": f"{runc_shim.path.parent}:{real.path.parent}:/usr/bin:/bin",
            "VGPU_CONFIG": str(config)})
    assert (p.returncode, p.stderr) == (0, "")
    assert runc_shim.argv() == ARGV
    assert vgpud.requests == [[("v", "2"), ("op", "runtime-create"), ("bundle", str(bundle)),
                               ("id", "c1")]]
    assert real.argv() == ["--root", "/r", "create", "--bundle", str(bundle), "c1"]


def test_the_private_runc_alone_skips_itself(tmp_path):
    """Without $VGPU_SHIM_BIN (a runc shim that cleans its environment), the private runc
    still never runs itself: it is its own file."""
    real = Recorder(tmp_path / "real" / "runc")
    p = run_program([PRIVATE / "runc", "state", "c1"],
                    {"PATH": f"{PRIVATE}:{real.path.parent}:/usr/bin:/bin",
                     "VGPU_CONFIG": str(tmp_path / "none.yaml")})
    assert (p.returncode, p.stderr) == (0, "")
    assert real.argv() == ["state", "c1"]
