# SPDX-License-Identifier: Apache-2.0
"""`vgpu uninstall docker|podman` after `vgpu install`, through the CLI: what install wrote
goes, the user's settings stay, a second run changes nothing. containerd's cases run on
containerd's own default configs in test_install_engines.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import ROOT

HOOK = "/opt/vgpu/bin/vgpu-hook"
RUNTIME = "/opt/vgpu/bin/vgpu-runtime"


def vgpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vgpu_cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)


def ok(*args: str) -> str:
    p = vgpu(*args)
    assert p.returncode == 0, p.stderr
    return p.stdout


def files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("original", [
    None,
    '{"debug": true, "runtimes": {"nvidia": {"path": "nv"}}}',
    '{"log-level": "warn"}\n',
], ids=["no-file", "other-runtime", "other-settings"])
def test_docker_uninstall_gives_back_the_file_as_it_was(tmp_path, original):
    f = tmp_path / "daemon.json"
    if original is not None:
        f.write_text(original)
    ok("install", "docker", "--config-file", str(f), "--runtime-path", RUNTIME)
    installed = files(tmp_path)
    out = ok("uninstall", "docker", "--config-file", str(f), "--dry-run")
    assert "dry run: nothing was changed" in out and files(tmp_path) == installed
    out = ok("uninstall", "docker", "--config-file", str(f))
    assert "systemctl restart docker" in out
    if original is None:   # install made the file: it goes
        assert files(tmp_path) == {}
    else:                  # byte for byte, and the backup stays
        assert f.read_text() == original
        assert (tmp_path / "daemon.json.vgpu.bak").read_text() == original
    before = files(tmp_path)
    assert "nothing to change" in ok("uninstall", "docker", "--config-file", str(f))
    assert files(tmp_path) == before


def test_docker_uninstall_keeps_what_the_user_added_since(tmp_path):
    f = tmp_path / "daemon.json"
    f.write_text('{"debug": true}')
    ok("install", "docker", "--config-file", str(f), "--runtime-path", RUNTIME)
    doc = json.loads(f.read_text())
    doc["log-level"] = "warn"
    f.write_text(json.dumps(doc))
    ok("uninstall", "docker", "--config-file", str(f))
    assert json.loads(f.read_text()) == {"debug": True, "log-level": "warn"}


def test_docker_uninstall_refuses_while_vgpu_is_the_default_runtime(tmp_path):
    f = tmp_path / "daemon.json"
    ok("install", "docker", "--config-file", str(f), "--runtime-path", RUNTIME)
    doc = json.loads(f.read_text())
    f.write_text(json.dumps({**doc, "default-runtime": "vgpu"}))
    before = files(tmp_path)
    p = vgpu("uninstall", "docker", "--config-file", str(f))
    assert p.returncode == 1
    assert p.stderr.startswith(f'vgpu: failed to configure {f}: default-runtime is "vgpu"')
    assert files(tmp_path) == before


def test_podman_uninstall_removes_only_vgpus_hook(tmp_path):
    f = tmp_path / "hooks.d" / "vgpu.json"
    other = tmp_path / "hooks.d" / "oci-nvidia-hook.json"
    ok("install", "podman", "--config-file", str(f), "--hook-path", HOOK)
    other.write_text('{"version": "1.0.0", "hook": {"path": "/usr/bin/nvidia-ctk"}}')
    out = ok("uninstall", "podman", "--config-file", str(f), "--dry-run")
    assert f"would remove file {f}" in out and f.exists()
    ok("uninstall", "podman", "--config-file", str(f))
    assert sorted(p.name for p in f.parent.iterdir()) == ["oci-nvidia-hook.json"]
    assert "nothing to change" in ok("uninstall", "podman", "--config-file", str(f))
    # A hook that is not vgpu's is never removed.
    p = vgpu("uninstall", "podman", "--config-file", str(other))
    assert p.returncode == 1 and "its hook is not vgpu-hook" in p.stderr and other.exists()


def test_containerd_uninstall_leaves_a_file_that_is_not_a_link(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "containerd-shim-vgpu-v2").write_text("someone else's")
    p = vgpu("uninstall", "containerd", "--config-file", str(tmp_path / "config.toml"),
             "--bin-dir", str(bin_dir))
    assert p.returncode == 1 and "it is not a symlink" in p.stderr
    assert (bin_dir / "containerd-shim-vgpu-v2").read_text() == "someone else's"


def test_containerd_uninstall_of_a_config_install_made(tmp_path):
    """No config before: install made it, uninstall takes it (and all the rest) away."""
    f = tmp_path / "config.toml"
    args = ("--config-file", str(f), "--bin-dir", str(tmp_path / "bin"))
    ok("install", "containerd", *args, "--shim-path", "/x/containerd-shim-vgpu-v2")
    ok("uninstall", "containerd", *args)
    assert files(tmp_path) == {} and not (tmp_path / "bin" / "containerd-shim-vgpu-v2").exists()
