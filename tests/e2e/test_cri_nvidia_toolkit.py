# SPDX-License-Identifier: Apache-2.0
"""vgpu composed with NVIDIA's container toolkit on containerd 1.6's CRI: `runtime.lower`
left at its default (`auto`) runs nvidia-container-runtime where it is on PATH.

No toolkit runs here, so a stand-in takes its place on the PATH containerd gives its
shims: a script named nvidia-container-runtime that records each call, adds one read-only
bind mount to the bundle's config.json at create (as the real one adds the driver's
libraries), then finds `runc` on PATH and execs it, as the real one does. A pod through
the `vgpu` handler with a container asking for a vGPU then shows, inside, the stand-in's
mount beside vgpu's (the region /dev/vgpu0, libvgpu in /etc/ld.so.preload, the limit
through libvgpu); the stand-in ran for that container, with the real runc below it.
"""
from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import pytest
from support.cri import ContainerSpec, Cri, PodSpec, read_log
from support.engines import CriContainerd, engine_env, point_at, require, vgpu_bin_dir
from support.vgpud_harness import pb, simgpu_vgpud

require("containerd", "ctr", "containerd-shim-runc-v2", "runc", "gcc")

IMAGE = "docker.io/library/vgpu-test:latest"
PAUSE = "registry.local/vgpu-test/pause:1"
MI = 1 << 20
DRIVER_IN_CONTAINER = "/usr/lib/nvidia-standin/libcuda.so.1"

STAND_IN = """#!{python}
# A stand-in for nvidia-container-runtime: record, add the "driver" mount at create, exec runc.
import json, os, shutil, sys
args = sys.argv[1:]
bundle = None
for flag in ("--bundle", "-b"):
    if flag in args[:-1]:
        bundle = args[args.index(flag) + 1]
with open({record!r}, "a") as f:
    f.write(json.dumps({{"argv": args, "path": os.environ.get("PATH", "")}}) + "\\n")
if "create" in args and bundle:
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        spec = json.load(f)
    spec.setdefault("mounts", []).append({{"destination": {dest!r}, "type": "bind",
                                          "source": {source!r},
                                          "options": ["rbind", "ro", "nosuid", "nodev"]}})
    with open(path + ".tmp", "w") as f:
        json.dump(spec, f)
    os.replace(path + ".tmp", path)
runc = shutil.which("runc")
os.execv(runc, [runc, *args])
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cri-nvidia")
    (tmp / "vgpud").mkdir()
    # No runtime.lower: the default, auto, must find the toolkit's runtime.
    sim, vgpud = simgpu_vgpud(tmp / "vgpud", {
        "hook": {"wait_s": 10},
        "reconcile": {"runtime_state_roots": ["/run/containerd/runc/k8s.io"]},
    }, devices="1Gi")
    driver = tmp / "driver" / "libcuda.so.1"
    driver.parent.mkdir()
    driver.write_text("the stand-in driver\n")
    toolkit = tmp / "toolkit"
    toolkit.mkdir()
    record = tmp / "stand-in.jsonl"
    stand_in = toolkit / "nvidia-container-runtime"
    stand_in.write_text(STAND_IN.format(python=sys.executable, record=str(record),
                                        dest=DRIVER_IN_CONTAINER, source=str(driver)))
    stand_in.chmod(0o755)
    env = engine_env(vgpu_bin_dir(tmp / "bin"))
    env["PATH"] = f"{toolkit}:{env['PATH']}"
    point_at(env, vgpud)
    (tmp / "containerd").mkdir()
    containerd = CriContainerd(tmp / "containerd", env, PAUSE)
    cri = None
    try:
        containerd.start_with_images(IMAGE)
        cri = Cri(containerd.socket)
        yield cri, vgpud, sim, record, tmp
    finally:
        if cri is not None:
            cri.remove_all()
            cri.close()
        containerd.stop()
        vgpud.close()


def test_a_vgpu_pod_runs_through_the_toolkit_s_runtime_with_both_mounts(world):
    cri, vgpud, sim, record, tmp = world
    uid = str(uuid.uuid4())
    (tmp / "logs" / uid).mkdir(parents=True)
    pod = cri.run_pod(PodSpec("toolkit", uid, runtime_handler="vgpu",
                              log_directory=str(tmp / "logs" / uid)))
    script = (f"cat {DRIVER_IN_CONTAINER}; cat /etc/ld.so.preload; "
              f"grep -c ' {DRIVER_IN_CONTAINER} [^ ]* ro,' /proc/mounts; "
              "grep -c ' /dev/vgpu0 [^ ]* ro,' /proc/mounts; vgpu_probe info && exec sleep 600")
    cid = cri.create_container(pod, ContainerSpec(
        "main", IMAGE, ["sh", "-c", script], envs={"SIMGPU_STATE": "/sim/simgpu.state"},
        mounts=[(str(sim), "/sim", False)], annotations={"vgpu.io/memory": "256Mi"}))
    cri.start_container(cid)
    path = cri.container_status(cid).log_path
    lines = vgpud.wait_for(lambda: (lambda ls: ls if any('"info"' in x for x in ls) else None)(
        read_log(path).splitlines()), timeout=30, what="the probe's output")
    assert lines[:4] == ["the stand-in driver", "/usr/lib/vgpu/libvgpu.so", "1", "1"], lines
    info = next(json.loads(x) for x in lines if x.startswith("{") and '"info"' in x)
    assert info["total"] == 256 * MI
    assert [s.owner for s in vgpud.stub.List(pb.ListRequest(), timeout=5).slices] == [cid]
    # The stand-in ran the container's create, below vgpu-runtime, and found the real runc:
    # the shim's private dir (whose runc is vgpu-runtime) is not on its PATH.
    calls = [json.loads(x) for x in record.read_text().splitlines()]
    creates = [c for c in calls if "create" in c["argv"] and c["argv"][-1] == cid]
    assert len(creates) == 1, calls
    shim_dir = os.path.realpath(Path(__file__).resolve().parents[2] / "build" / "bin" / "shim")
    assert all(os.path.realpath(d) != shim_dir for d in creates[0]["path"].split(":") if d)
