# SPDX-License-Identifier: Apache-2.0
"""`vgpu install containerd` and `vgpu uninstall containerd` on containerd's own default
configs (1.6, 1.7: config version 2; 2.x: version 3), each alone and beside NVIDIA's
conf.d/99-nvidia.toml; the 1.x results read back by the real containerd here (1.6).

The fixtures (tests/shim/fixtures/containerd/) are copied from containerd's and
nvidia-container-toolkit's sources; each names where it came from in its first lines.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.paths import ROOT

FIXTURES = Path(__file__).parent / "fixtures" / "containerd"
SHIM = "/opt/vgpu/bin/containerd-shim-vgpu-v2"
ANNOTATIONS = ["vgpu.io/*", "cdi.k8s.io/*"]
V2, V3 = "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"
#: containerd release -> (its default config, NVIDIA's drop-in for that config version)
RELEASES = {"1.6": ("default-1.6.toml", "nvidia-99-v2.toml"),
            "1.7": ("default-1.7.toml", "nvidia-99-v2.toml"),
            "2.x": ("default-2.x.toml", "nvidia-99-v3.toml")}
CASES = [pytest.param(r, nv, id=f"{r}-{'nvidia' if nv else 'plain'}")
         for r in RELEASES for nv in (False, True)]


def vgpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vgpu_cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)


def ok(*args: str) -> str:
    p = vgpu(*args)
    assert p.returncode == 0, p.stderr
    return p.stdout


def snapshot(d: Path) -> dict[str, bytes | str]:
    return {str(p.relative_to(d)): os.readlink(p) if p.is_symlink() else p.read_bytes()
            for p in sorted(d.rglob("*")) if p.is_symlink() or p.is_file()}


def node(tmp_path: Path, release: str, nvidia: bool) -> Path:
    """/etc/containerd of a node: containerd's default config, and with `nvidia` the
    toolkit's drop-in and the glob import `nvidia-ctk runtime configure` adds."""
    default, dropin = RELEASES[release]
    text = (FIXTURES / default).read_text()
    if nvidia:
        (tmp_path / "conf.d").mkdir()
        shutil.copy(FIXTURES / dropin, tmp_path / "conf.d" / "99-nvidia.toml")
        line = f'imports = ["{tmp_path}/conf.d/*.toml"]\n'
        text = text.replace("imports = []\n", line) if "imports = []\n" in text else \
            text.replace("version = 3\n", "version = 3\n" + line)
    f = tmp_path / "config.toml"
    f.write_text(text)
    return f


def install(f: Path, *extra: str) -> str:
    return ok("install", "containerd", "--config-file", str(f), "--bin-dir",
              str(f.parent / "bin"), "--shim-path", SHIM, *extra)


def uninstall(f: Path, *extra: str) -> str:
    return ok("uninstall", "containerd", "--config-file", str(f), "--bin-dir",
              str(f.parent / "bin"), *extra)


def containerd_dump(config: Path) -> dict:
    """The config the real containerd (1.6 here) makes of `config` and its imports."""
    if shutil.which("containerd") is None:
        pytest.skip("containerd is not installed (scripts/install-deps.sh installs it)")
    p = subprocess.run(["containerd", "--config", str(config), "config", "dump"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return tomllib.loads(p.stdout)


@pytest.mark.parametrize(("release", "nvidia"), CASES)
def test_install_then_uninstall_on_the_default_config(tmp_path, release, nvidia):
    f = node(tmp_path, release, nvidia)
    before = snapshot(tmp_path)
    unchanged = containerd_dump(f) if release != "2.x" else {}
    out = install(f)
    dropin = tmp_path / "conf.d" / "vgpu.toml"
    main = tomllib.loads(f.read_text())
    assert main["imports"][-1] == str(dropin)
    assert {k: v for k, v in main.items() if k != "imports"} == \
        {k: v for k, v in tomllib.loads((FIXTURES / RELEASES[release][0]).read_text()).items()
         if k != "imports"}
    written = tomllib.loads(dropin.read_text())
    if nvidia:   # the handler inherits the nvidia default's options, never its BinaryName
        assert "vgpu: the nvidia runtime runs /usr/bin/nvidia-container-runtime" in out
    if release == "2.x":
        # 2.x merges key by key: the drop-in holds vgpu's runtime and nothing else.
        options = ({"NoPivotRoot": False, "Root": "/run/containerd/runc",
                    "SystemdCgroup": True} if nvidia else
                   {"CriuImagePath": "", "CriuWorkPath": "", "IoGid": 0, "IoUid": 0,
                    "NoNewKeyring": False, "Root": "", "ShimCgroup": ""})
        assert written == {"version": 3, "plugins": {V3: {"containerd": {"runtimes": {
            "vgpu": {"runtime_type": "io.containerd.vgpu.v2", "runtime_path": SHIM,
                     "pod_annotations": ANNOTATIONS, "container_annotations": ANNOTATIONS,
                     "options": options}}}}}}
    else:
        assert list(written["plugins"]) == [V2] and written["version"] == 2
        # containerd's own view: what it used before, and vgpu's runtime.
        dump = containerd_dump(f)
        cri = dump["plugins"][V2]
        runtimes = cri["containerd"]["runtimes"]
        assert {**dump, "imports": []} == {**unchanged, "imports": []} | {"plugins": {
            **unchanged["plugins"], V2: {**unchanged["plugins"][V2], "containerd": {
                **unchanged["plugins"][V2]["containerd"], "runtimes": {
                    **unchanged["plugins"][V2]["containerd"]["runtimes"],
                    "vgpu": runtimes["vgpu"]}}}}}
        assert runtimes["vgpu"]["runtime_path"] == SHIM
        assert runtimes["vgpu"]["container_annotations"] == ANNOTATIONS
        assert runtimes["runc"]["runtime_type"] == "io.containerd.runc.v2"
        assert cri["containerd"]["default_runtime_name"] == ("nvidia" if nvidia else "runc")
        if nvidia:
            assert runtimes["nvidia"]["options"]["BinaryName"] == \
                "/usr/bin/nvidia-container-runtime"
            assert "BinaryName" not in runtimes["vgpu"].get("options", {})
    installed = snapshot(tmp_path)
    assert "already configured" in install(f)
    assert snapshot(tmp_path) == installed
    # Uninstall: the config byte for byte as it was, the drop-in and the link gone,
    # NVIDIA's drop-in untouched; the backup of the first install stays.
    out = uninstall(f, "--dry-run")
    assert f"would remove file {dropin}" in out and snapshot(tmp_path) == installed
    uninstall(f)
    after = snapshot(tmp_path)
    assert after.pop("config.toml.vgpu.bak") == before["config.toml"]
    assert after == before
    assert "nothing to change" in uninstall(f)
    assert snapshot(tmp_path) == {**before, "config.toml.vgpu.bak": before["config.toml"]}
    if release != "2.x":
        assert "vgpu" not in containerd_dump(f)["plugins"][V2]["containerd"]["runtimes"]


@pytest.mark.parametrize("nvidia", [False, True], ids=["plain", "nvidia"])
def test_2x_set_as_default_names_vgpu_and_a_rerun_without_undoes_it(tmp_path, nvidia):
    f = node(tmp_path, "2.x", nvidia)
    dropin = tmp_path / "conf.d" / "vgpu.toml"
    install(f, "--set-as-default")
    section = tomllib.loads(dropin.read_text())["plugins"][V3]["containerd"]
    assert section["default_runtime_name"] == "vgpu" and list(section["runtimes"]) == ["vgpu"]
    install(f)
    assert "default_runtime_name" not in tomllib.loads(dropin.read_text())["plugins"][V3][
        "containerd"]


def test_2x_inherits_the_options_its_imports_merge_in(tmp_path):
    """containerd 2.x merges an import into the main config key by key: SystemdCgroup set
    in the main config and Root in an import both reach vgpu's runtime."""
    f = tmp_path / "config.toml"
    f.write_text(f'version = 3\nimports = ["{tmp_path}/site.toml"]\n'
                 f'[plugins."{V3}".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n')
    (tmp_path / "site.toml").write_text(
        f'version = 3\n[plugins."{V3}".containerd.runtimes.runc.options]\n  Root = "/r"\n')
    install(f)
    runtime = tomllib.loads((tmp_path / "conf.d" / "vgpu.toml").read_text())["plugins"][V3][
        "containerd"]["runtimes"]["vgpu"]
    assert runtime["options"] == {"SystemdCgroup": True, "Root": "/r"}


@pytest.mark.parametrize(("text", "reason"), [
    ('[plugins.cri]\n  sandbox_image = "x"\n',
     "config version 1 is not supported (run `containerd config migrate` (containerd 1.x) "
     "first)"),
    ("version = 5\n", "config version 5 is not supported (vgpu knows versions 2"),
], ids=["v1", "v5"])
def test_unknown_config_versions_are_refused(tmp_path, text, reason):
    f = tmp_path / "config.toml"
    f.write_text(text)
    p = vgpu("install", "containerd", "--config-file", str(f), "--bin-dir",
             str(tmp_path / "bin"), "--shim-path", SHIM)
    assert p.returncode == 1 and reason in p.stderr
    assert sorted(os.listdir(tmp_path)) == ["config.toml"]
