# SPDX-License-Identifier: Apache-2.0
"""The CDI spec of a claim's slice (oci_hook.cdi): its shape against CDI 0.3.0, the same
files as the runtime path's mount plan, the atomic writer, and the lookup containerd 1.6's
runtime handler uses.

No CDI JSON schema is available offline, so the shape is checked against the fields
CDI 0.3.0 defines (SPEC.md): engines refuse a spec with a field its version lacks.
Podman 4.3 loading it for real is tests/e2e/test_e2e_cdi_podman.py.
"""
from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from arbiter.files.sched_files import slice_key_of
from arbiter.proto import vgpu_pb2 as pb
from oci_hook import cdi, request
from oci_hook.errors import MountError, StateError
from oci_hook.mounts import CONTAINER_PRELOAD, plan_mounts
from oci_hook.slices import SliceView, VGpuView

#: Every field CDI 0.3.0 has, by object (SPEC.md "CDI JSON Specification").
FIELDS_0_3_0 = {
    "spec": {"cdiVersion", "kind", "devices", "containerEdits"},
    "device": {"name", "containerEdits"},
    "edits": {"env", "deviceNodes", "mounts", "hooks"},
    "node": {"path", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"},
    "mount": {"hostPath", "containerPath", "options"},
    "hook": {"hookName", "path", "args", "env", "timeout"},
}
OCI_HOOKS = {"prestart", "createRuntime", "createContainer", "startContainer", "poststart",
             "poststop"}


def make_slice(tmp: Path, sid: str = "s1", uuids: tuple[str, ...] = ("GPU-0",),
               nodes: tuple[str, ...] = ("/dev/null",)) -> SliceView:
    """vgpud's layout: <run>/slices/<id>/vgpu<i> (+ .usage), <run>/sched/<uuid> and .req."""
    run = tmp / "run"
    sched = run / "sched"
    sched.mkdir(parents=True, exist_ok=True)
    vgpus = []
    for i, uuid in enumerate(uuids):
        region = run / "slices" / sid / f"vgpu{i}"
        region.parent.mkdir(parents=True, exist_ok=True)
        region.write_bytes(b"R")
        region.with_name(f"vgpu{i}.usage").write_bytes(b"U")
        (sched / uuid).write_bytes(b"G")
        (sched / f"{uuid}.{slice_key_of(sid, i):016x}.req").write_bytes(b"Q")
        vgpus.append(VGpuView(index=i, gpu_uuid=uuid, region_path=str(region),
                              device_nodes=nodes))
    return SliceView(id=sid, owner="claim-uid", region_dir=str(run / "slices" / sid),
                     vgpus=tuple(vgpus))


def spec_of(tmp: Path, view: SliceView | None = None, **kw) -> dict:
    view = view or make_slice(tmp)
    return cdi.claim_spec(view, name=kw.pop("name", "claim-1"), libvgpu=Path("/opt/libvgpu.so"),
                          hook=Path("/opt/bin/vgpu-hook"), **kw)


def check_shape(spec: dict) -> None:
    """Every object has only CDI 0.3.0's fields, with the types the spec names."""
    assert set(spec) <= FIELDS_0_3_0["spec"]
    assert spec["cdiVersion"] == "0.3.0" and spec["kind"] in ("vgpu.io/claim", "vgpu.io/vgpu")
    assert spec["devices"], "a spec needs at least one device"
    for dev in spec["devices"]:
        assert set(dev) <= FIELDS_0_3_0["device"] and set(dev["containerEdits"]) <= \
            FIELDS_0_3_0["edits"]
        edits = dev["containerEdits"]
        assert all(isinstance(e, str) and "=" in e for e in edits.get("env", []))
        for n in edits.get("deviceNodes", []):
            assert set(n) <= FIELDS_0_3_0["node"] and n["path"].startswith("/")
            assert n["type"] in ("c", "b") and isinstance(n["major"], int)
        for m in edits.get("mounts", []):
            assert set(m) <= FIELDS_0_3_0["mount"]
            assert m["hostPath"].startswith("/") and m["containerPath"].startswith("/")
            assert all(isinstance(o, str) for o in m["options"])
        for h in edits.get("hooks", []):
            assert set(h) <= FIELDS_0_3_0["hook"] and h["hookName"] in OCI_HOOKS
            assert h["path"].startswith("/") and h.get("timeout", 1) > 0


def test_the_spec_has_cdi_0_3_0_s_shape_only(tmp_path):
    spec = spec_of(tmp_path, hook_env={"VGPU_SOCKET": "/run/vgpu/vgpud.sock"})
    check_shape(spec)
    json.dumps(spec)   # JSON data only


def test_the_spec_carries_the_same_files_as_the_runtime_path_s_mount_plan(tmp_path):
    view = make_slice(tmp_path, uuids=("GPU-0", "GPU-1"))
    plan = plan_mounts(view, rootfs=tmp_path / "rootfs", libvgpu=Path("/opt/libvgpu.so"),
                       preload_host=tmp_path / "preload")
    edits = spec_of(tmp_path, view)["devices"][0]["containerEdits"]
    # The plan's mounts but the preload, which the hook makes (it depends on the image).
    from_plan = [(m.source, m.target, m.read_only) for m in plan.mounts
                 if m.target != CONTAINER_PRELOAD and not m.device]
    assert [(m["hostPath"], m["containerPath"], m["options"][0] == "ro")
            for m in edits["mounts"]] == from_plan
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/null"]
    st = os.stat("/dev/null")
    assert edits["deviceNodes"][0] == {"path": "/dev/null", "type": "c",
                                       "major": os.major(st.st_rdev),
                                       "minor": os.minor(st.st_rdev), "permissions": "rw"}
    assert edits["env"] == ["CUDA_VISIBLE_DEVICES=GPU-0,GPU-1",
                            "NVIDIA_VISIBLE_DEVICES=GPU-0,GPU-1"]


@pytest.mark.parametrize(("target", "options"), [
    ("/usr/lib/vgpu/libvgpu.so", ["ro", "nosuid", "nodev", "bind"]),
    ("/dev/vgpu0", ["ro", "nosuid", "nodev", "noexec", "bind"]),
    ("/dev/vgpu0.usage", ["rw", "nosuid", "nodev", "noexec", "bind"]),
    ("/run/vgpu/sched/GPU-0", ["ro", "nosuid", "nodev", "noexec", "bind"]),
], ids=["libvgpu-exec", "region-ro", "usage-rw", "gpu-sched-ro"])
def test_each_mount_is_as_read_only_as_the_hook_s(tmp_path, target, options):
    edits = spec_of(tmp_path)["devices"][0]["containerEdits"]
    (m,) = [m for m in edits["mounts"] if m["containerPath"] == target]
    assert m["options"] == options


def test_a_stand_in_device_file_is_bind_mounted_not_a_device_node(tmp_path):
    fake = tmp_path / "nvidia0"
    fake.write_text("")
    edits = spec_of(tmp_path, make_slice(tmp_path, nodes=(str(fake),)))["devices"][0][
        "containerEdits"]
    assert "deviceNodes" not in edits
    assert {"hostPath": str(fake), "containerPath": str(fake),
            "options": ["rw", "nosuid", "bind"]} in edits["mounts"]


def test_the_hook_names_the_slice_and_reaches_vgpud(tmp_path):
    spec = spec_of(tmp_path, hook_env={"VGPU_SOCKET": "/s", "VGPU_CONFIG": "/c"},
                   hook_timeout=40)
    assert spec["devices"][0]["containerEdits"]["hooks"] == [{
        "hookName": "createRuntime", "path": "/opt/bin/vgpu-hook",
        "args": ["vgpu-hook", "claim", "s1"], "env": ["VGPU_SOCKET=/s", "VGPU_CONFIG=/c"],
        "timeout": 40}]


def test_a_missing_slice_file_is_refused_with_one_line(tmp_path):
    view = make_slice(tmp_path)
    for f in (tmp_path / "run" / "sched").glob("*.req"):
        f.unlink()
    with pytest.raises(MountError, match=r"^failed to find .*\.req: missing"):
        spec_of(tmp_path, view)


@pytest.mark.parametrize("name", ["", "-x", "x/y", "a b", "x" * 129, "claim=1", "ünï"],
                         ids=["empty", "leading-dash", "slash", "space", "long", "equals",
                              "non-ascii"])
def test_a_bad_device_name_is_one_line_and_writes_nothing(tmp_path, name):
    with pytest.raises(cdi.CdiError) as e:
        cdi.write_spec(tmp_path / "cdi", name, {})
    assert str(e.value).startswith(f"failed to name the CDI device {name!r}: ")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "cdi").exists() or not list((tmp_path / "cdi").iterdir())
    with pytest.raises(cdi.CdiError):
        cdi.device_id(name)


@pytest.mark.parametrize("name", ["1", "claim-uid_0", "a.b:c",
                                  "6f1c2d3e-0000-4000-8000-00000000000a"])
def test_device_ids_and_file_names(tmp_path, name):
    assert cdi.device_id(name) == f"vgpu.io/claim={name}"
    assert cdi.spec_path(tmp_path, name) == tmp_path / f"vgpu.io-claim_{name}.json"


def test_write_is_atomic_0644_and_remove_is_idempotent(tmp_path):
    d = tmp_path / "cdi"
    spec = spec_of(tmp_path)
    old = os.umask(0o077)
    try:
        path = cdi.write_spec(d, "claim-1", spec)
    finally:
        os.umask(old)
    assert path == d / "vgpu.io-claim_claim-1.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert json.loads(path.read_text()) == spec
    assert [p.name for p in d.iterdir()] == [path.name]     # no temporary file left
    assert cdi.remove_spec(d, "claim-1") is True
    assert cdi.remove_spec(d, "claim-1") is False
    assert list(d.iterdir()) == []


def test_a_reader_never_sees_a_partial_spec(tmp_path):
    d = tmp_path / "cdi"
    small, big = {"devices": [{"name": "a"}]}, {"devices": [{"name": "b" * 100000}]}
    cdi.write_spec(d, "x", small)
    stop = threading.Event()
    seen: list[object] = []

    def read() -> None:
        while not stop.is_set():
            seen.append(json.loads(cdi.spec_path(d, "x").read_text()))  # raises on a part
    t = threading.Thread(target=read)
    t.start()
    for i in range(50):
        cdi.write_spec(d, "x", big if i % 2 else small)
    stop.set()
    t.join()
    assert seen and all(s in (small, big) for s in seen)


def test_a_write_that_fails_is_one_line_and_leaves_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(cdi.CdiError, match=r"^failed to write .*vgpu.io-claim_x.json: "):
        cdi.write_spec(blocker / "cdi", "x", {})


def test_find_edits_reads_the_device_from_the_later_dir_first(tmp_path):
    etc, run = tmp_path / "etc", tmp_path / "run-cdi"
    spec = spec_of(tmp_path)
    cdi.write_spec(etc, "claim-1", {**spec, "devices": [{"name": "claim-1",
                                                         "containerEdits": {"env": ["A=1"]}}]})
    assert cdi.find_edits([etc, run], "vgpu.io/claim=claim-1") == {"env": ["A=1"]}
    cdi.write_spec(run, "claim-1", spec)
    assert cdi.find_edits([etc, run], "vgpu.io/claim=claim-1") == \
        spec["devices"][0]["containerEdits"]


@pytest.mark.parametrize(("ident", "files", "reason"), [
    ("nvidia.com/gpu=0", {}, "not a vgpu.io/claim device"),
    ("vgpu.io/claim=gone", {}, "no spec in"),
    ("vgpu.io/claim=bad", {"bad": "{"}, "failed to read"),
    ("vgpu.io/claim=other", {"other": json.dumps({"kind": "vgpu.io/claim", "devices": []})},
     "no device 'other'"),
], ids=["other-kind", "no-spec", "not-json", "no-such-device"])
def test_find_edits_refuses_with_one_line(tmp_path, ident, files, reason):
    for name, text in files.items():
        cdi.spec_path(tmp_path, name).write_text(text)
    with pytest.raises(cdi.CdiError) as e:
        cdi.find_edits([tmp_path], ident)
    assert reason in str(e.value) and "\n" not in str(e.value)


def test_a_slice_from_grpc_builds_the_same_view(tmp_path):
    view = make_slice(tmp_path, uuids=("GPU-0", "GPU-1"))
    msg = pb.Slice(id=view.id, owner=view.owner, region_dir=view.region_dir, vgpus=[
        pb.VGpu(index=v.index, gpu_uuid=v.gpu_uuid, region_path=v.region_path,
                device_nodes=list(v.device_nodes)) for v in reversed(view.vgpus)])
    assert cdi.view_of_message(msg) == view


# -- the device plugin's request devices (vgpu-device-plugin --cdi) -----------------------

MEM_KEYS = {"vgpu.io/memory": "4Gi", "vgpu.io/devices": "GPU-0"}


def test_a_request_device_carries_its_keys_in_vgpu_hook_s_arguments(tmp_path):
    hook = Path("/opt/vgpu/1.0/bin/vgpu-hook")
    spec = cdi.request_spec(MEM_KEYS, hook=hook, hook_env={"VGPU_SOCKET": "/run/v.sock"},
                            device_nodes=["/dev/null", "/dev/null", str(tmp_path)])
    check_shape(spec)
    assert spec["kind"] == cdi.REQUEST_KIND == "vgpu.io/vgpu"
    [dev] = spec["devices"]
    assert dev["name"] == "memory-4Gi-GPU-0"
    edits = dev["containerEdits"]
    assert edits["env"] == ["CUDA_VISIBLE_DEVICES=GPU-0", "NVIDIA_VISIBLE_DEVICES=GPU-0"]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/null"]   # once; no dir
    assert [(h["hookName"], h["args"]) for h in edits["hooks"]] == [
        ("createRuntime", ["vgpu-hook", "createRuntime", "vgpu.io/memory=4Gi",
                           "vgpu.io/devices=GPU-0"]),
        ("poststop", ["vgpu-hook", "poststop", "vgpu.io/memory=4Gi", "vgpu.io/devices=GPU-0"])]
    assert all(h["path"] == str(hook) and h["env"] == ["VGPU_SOCKET=/run/v.sock"]
               for h in edits["hooks"])
    # What vgpud reads back from config.json once the engine applied it.
    assert request.hook_keys({"createRuntime": edits["hooks"]}) == MEM_KEYS


def test_a_compute_device_only_carries_its_key():
    spec = cdi.request_spec({"vgpu.io/compute": "30"}, hook=Path("/bin/vgpu-hook"))
    check_shape(spec)
    [dev] = spec["devices"]
    assert dev["name"] == "compute-30"
    assert dev["containerEdits"] == {"hooks": [
        {"hookName": "createRuntime", "path": "/bin/vgpu-hook", "timeout": 30,
         "args": ["vgpu-hook", "createRuntime", "vgpu.io/compute=30"]}]}
    assert cdi.request_device_id({"vgpu.io/compute": "30"}) == "vgpu.io/vgpu=compute-30"


@pytest.mark.parametrize("keys", [{}, {"vgpu.io/memory": "4Gi"},
                                  {"vgpu.io/compute": "30", "vgpu.io/memory": "4Gi"},
                                  {"vgpu.io/memory": "4Gi", "vgpu.io/devices": "GPU 0"}],
                         ids=["none", "memory-without-gpu", "both", "bad-name"])
def test_keys_the_device_plugin_never_gives_make_no_device(keys):
    with pytest.raises(cdi.CdiError) as e:
        cdi.request_spec(keys, hook=Path("/bin/vgpu-hook"))
    assert str(e.value).startswith("failed to name the CDI device")


def test_request_specs_are_written_as_their_kind_s_files(tmp_path):
    spec = cdi.request_spec(MEM_KEYS, hook=Path("/bin/vgpu-hook"))
    path = cdi.write_spec(tmp_path, "memory-4Gi-GPU-0", spec)
    assert path == tmp_path / "vgpu.io-vgpu_memory-4Gi-GPU-0.json"
    assert path.read_bytes() == cdi.spec_bytes(spec)


HOOK = "/opt/vgpu/bin/vgpu-hook"
HOOKS = {
    "memory-and-compute": ({"createRuntime": [
        {"path": HOOK, "args": ["vgpu-hook", "createRuntime", "vgpu.io/memory=1Gi"]},
        {"path": HOOK, "args": ["vgpu-hook", "createRuntime", "vgpu.io/compute=20"]}]},
        {"vgpu.io/memory": "1Gi", "vgpu.io/compute": "20"}),
    "another-program": ({"createRuntime": [
        {"path": "/bin/x", "args": ["nvidia-cdi-hook", "createRuntime", "vgpu.io/memory=1Gi"]}]},
        {}),
    "another-phase": ({"prestart": [
        {"path": HOOK, "args": ["vgpu-hook", "createRuntime", "vgpu.io/memory=1Gi"]}]}, {}),
    "no-keys": ({"createRuntime": [{"path": HOOK, "args": ["vgpu-hook", "createRuntime"]}]},
                {}),
    "internal-and-foreign-keys": ({"createRuntime": [
        {"path": HOOK, "args": ["vgpu-hook", "createRuntime", "vgpu.io/slice=s1", "x=1",
                                "vgpu.io/memory=1Gi"]}]}, {"vgpu.io/memory": "1Gi"}),
    "the-same-twice": ({"createRuntime": [
        {"path": HOOK, "args": ["vgpu-hook", "createRuntime", "vgpu.io/memory=1Gi"]},
        {"path": HOOK, "args": ["vgpu-hook", "createRuntime", "vgpu.io/memory=1Gi"]}]},
        {"vgpu.io/memory": "1Gi"}),
    "not-hooks": ([], {}),
    "args-not-strings": ({"createRuntime": [{"path": HOOK, "args": ["vgpu-hook", 1, 2]}]}, {}),
}


@pytest.mark.parametrize(("hooks", "keys"), HOOKS.values(), ids=HOOKS.keys())
def test_hook_keys(hooks, keys):
    assert request.hook_keys(hooks) == keys


def test_a_key_given_twice_with_two_values_is_one_line():
    with pytest.raises(StateError) as e:
        request.hook_keys({"createRuntime": [
            {"path": HOOK, "args": ["vgpu-hook", "createRuntime", "vgpu.io/memory=1Gi"]},
            {"path": HOOK, "args": ["vgpu-hook", "createRuntime", "vgpu.io/memory=2Gi"]}]})
    assert str(e.value) == ("failed to read the vgpu-hook createRuntime hooks: vgpu.io/memory "
                            "is given twice, as '1Gi' and '2Gi'")
