# SPDX-License-Identifier: Apache-2.0
"""shim.containerd_cri: the CRI section vgpu's drop-in carries, as containerd 1.x merges."""
from __future__ import annotations

from pathlib import Path

import pytest

from shim.containerd_cri import cri_section, import_paths, with_vgpu

RUNTIME = {"runtime_type": "io.containerd.vgpu.v2", "runtime_path": "/x/shim"}


def cri(**section):
    return {"plugins": {"io.containerd.grpc.v1.cri": section}}


def test_imports_resolve_like_containerd(tmp_path):
    (tmp_path / "conf.d").mkdir()
    for name in ("b.toml", "a.toml", "c.txt"):
        (tmp_path / "conf.d" / name).write_text("")
    config = tmp_path / "config.toml"
    assert import_paths(config, ["conf.d/*.toml", "/abs/x.toml", "rel.toml"]) == [
        tmp_path / "conf.d" / "a.toml", tmp_path / "conf.d" / "b.toml",
        Path("/abs/x.toml"), tmp_path / "rel.toml"]


def test_the_last_file_with_a_section_wins_whole():
    main = cri(sandbox_image="main", cni={"bin_dir": "/cni"})
    assert cri_section(main, []) == {"sandbox_image": "main", "cni": {"bin_dir": "/cni"}}
    assert cri_section(main, [cri(sandbox_image="a"), {"version": 2}]) == {
        "sandbox_image": "a"}
    assert cri_section({}, []) == {}


@pytest.mark.parametrize(("section", "default", "options"), [
    ({}, "runc", None),
    ({"containerd": {"runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2",
                                            "options": {"SystemdCgroup": True}}}}},
     "runc", {"SystemdCgroup": True}),
    ({"containerd": {"default_runtime_name": "crun", "runtimes": {
        "crun": {"runtime_type": "io.containerd.runc.v2",
                 "options": {"BinaryName": "crun", "SystemdCgroup": True}}}}},
     "crun", {"SystemdCgroup": True}),
], ids=["empty: containerd's runc", "runc's options", "the default's options but BinaryName"])
def test_vgpu_joins_the_section(section, default, options):
    said = []
    out = with_vgpu(section, RUNTIME, set_default=False, warn=said.append)
    runtimes = out["containerd"]["runtimes"]
    assert out["containerd"].get("default_runtime_name", "runc") == default
    assert runtimes[default]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["vgpu"] == ({**RUNTIME, "options": options} if options else RUNTIME)
    assert [("BinaryName" in section.get("containerd", {}).get("runtimes", {})
             .get(default, {}).get("options", {}))] == [bool(said)]
    assert "vgpu" not in section.get("containerd", {}).get("runtimes", {})  # not mutated


def test_set_default():
    out = with_vgpu({}, RUNTIME, set_default=True, warn=print)
    assert out["containerd"]["default_runtime_name"] == "vgpu"
    assert set(out["containerd"]["runtimes"]) == {"runc", "vgpu"}
