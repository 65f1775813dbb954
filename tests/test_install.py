# SPDX-License-Identifier: Apache-2.0
"""`vgpu install docker|containerd|podman` on temporary config files, through the CLI."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT

RUNTIME = "/opt/vgpu/bin/vgpu-runtime"
HOOK = "/opt/vgpu/bin/vgpu-hook"

CONTAINERD_CONFIG = """\
version = 2
root = "/var/lib/containerd"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
"""


def vgpu_install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpu_cli", "install", *args,
         "--runtime-path", RUNTIME, "--hook-path", HOOK],
        capture_output=True, text=True, cwd=ROOT, timeout=60)


def ok(*args: str) -> str:
    p = vgpu_install(*args)
    assert p.returncode == 0, p.stderr
    return p.stdout


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# --- docker --------------------------------------------------------------------------

def test_docker_adds_runtime_and_keeps_settings(tmp_path):
    f = tmp_path / "daemon.json"
    f.write_text(json.dumps({"log-level": "warn", "runtimes": {"nvidia": {"path": "nv"}}}))
    original = f.read_bytes()
    out = ok("docker", "--config-file", str(f))
    doc = json.loads(f.read_text())
    assert doc == {"log-level": "warn",
                   "runtimes": {"nvidia": {"path": "nv"}, "vgpu": {"path": RUNTIME}}}
    assert (tmp_path / "daemon.json.vgpu.bak").read_bytes() == original
    assert "systemctl restart docker" in out


def test_docker_is_idempotent_and_backs_up_once(tmp_path):
    f = tmp_path / "daemon.json"
    f.write_text('{"debug": true}')
    ok("docker", "--config-file", str(f))
    first = snapshot(tmp_path)
    out = ok("docker", "--config-file", str(f))
    assert "already configured" in out
    assert snapshot(tmp_path) == first
    # A later change (new runtime path) keeps the first backup: the user's original.
    p = subprocess.run([sys.executable, "-m", "vgpu_cli", "install", "docker",
                        "--config-file", str(f), "--runtime-path", "/other/vgpu-runtime"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(f.read_text())["runtimes"]["vgpu"]["path"] == "/other/vgpu-runtime"
    assert (tmp_path / "daemon.json.vgpu.bak").read_text() == '{"debug": true}'


def test_docker_missing_file_is_created_without_backup(tmp_path):
    f = tmp_path / "docker" / "daemon.json"
    ok("docker", "--config-file", str(f))
    assert json.loads(f.read_text()) == {"runtimes": {"vgpu": {"path": RUNTIME}}}
    assert not (f.parent / "daemon.json.vgpu.bak").exists()


def test_docker_bad_json_is_refused(tmp_path):
    f = tmp_path / "daemon.json"
    f.write_text("{nope")
    p = vgpu_install("docker", "--config-file", str(f))
    assert p.returncode == 1
    assert p.stderr.startswith(f"vgpu: failed to configure {f}: not valid JSON")
    assert f.read_text() == "{nope"


# --- containerd ----------------------------------------------------------------------

def test_containerd_dropin_and_import(tmp_path):
    f = tmp_path / "config.toml"
    f.write_text(CONTAINERD_CONFIG)
    out = ok("containerd", "--config-file", str(f))
    dropin = tmp_path / "conf.d" / "vgpu.toml"
    doc = tomllib.loads(f.read_text())
    assert doc["imports"] == [str(dropin)]
    assert doc["root"] == "/var/lib/containerd"
    assert doc["plugins"]["io.containerd.grpc.v1.cri"]["cni"]["bin_dir"] == "/usr/lib/cni"
    runtime = tomllib.loads(dropin.read_text())["plugins"]["io.containerd.grpc.v1.cri"][
        "containerd"]["runtimes"]["vgpu"]
    assert runtime == {"runtime_type": "io.containerd.vgpu.v2",
                       "pod_annotations": ["vgpu.io/*"]}
    # The shipped snippet is the drop-in.
    assert tomllib.loads(dropin.read_text()) == tomllib.loads(
        (ROOT / "configs" / "containerd" / "vgpu.toml").read_text())
    assert (tmp_path / "config.toml.vgpu.bak").read_text() == CONTAINERD_CONFIG
    assert "systemctl restart containerd" in out
    first = snapshot(tmp_path)
    assert "already configured" in ok("containerd", "--config-file", str(f))
    assert snapshot(tmp_path) == first


def test_containerd_existing_imports_are_kept(tmp_path):
    f = tmp_path / "config.toml"
    f.write_text('version = 2\nimports = ["/etc/containerd/other.toml"]\n' + "[grpc]\n"
                 '  address = "/run/x.sock"\n')
    ok("containerd", "--config-file", str(f))
    doc = tomllib.loads(f.read_text())
    assert doc["imports"] == ["/etc/containerd/other.toml", str(tmp_path / "conf.d/vgpu.toml")]
    assert doc["grpc"] == {"address": "/run/x.sock"}


def test_containerd_missing_config_is_created(tmp_path):
    f = tmp_path / "config.toml"
    ok("containerd", "--config-file", str(f))
    assert tomllib.loads(f.read_text()) == {"version": 2,
                                            "imports": [str(tmp_path / "conf.d/vgpu.toml")]}


def test_containerd_version_1_is_refused(tmp_path):
    f = tmp_path / "config.toml"
    f.write_text('[plugins.cri]\n  sandbox_image = "x"\n')
    p = vgpu_install("containerd", "--config-file", str(f))
    assert p.returncode == 1
    assert "config version 1 is not supported" in p.stderr
    assert not (tmp_path / "conf.d").exists()


# --- podman --------------------------------------------------------------------------

def test_podman_hooks_file(tmp_path):
    f = tmp_path / "hooks.d" / "vgpu.json"
    out = ok("podman", "--config-file", str(f))
    doc = json.loads(f.read_text())
    assert doc["hook"]["path"] == HOOK
    assert doc["version"] == "1.0.0"
    assert "prestart" in doc["stages"]
    assert "nothing to restart" in out
    assert "already configured" in ok("podman", "--config-file", str(f))


# --- every target ----------------------------------------------------------------------

@pytest.mark.parametrize("target", ["docker", "containerd", "podman"])
def test_dry_run_prints_diff_and_changes_nothing(tmp_path, target):
    f = tmp_path / {"docker": "daemon.json", "containerd": "config.toml",
                    "podman": "vgpu.json"}[target]
    if target == "docker":
        f.write_text('{"debug": true}\n')
    elif target == "containerd":
        f.write_text(CONTAINERD_CONFIG)
    before = snapshot(tmp_path)
    out = ok(target, "--config-file", str(f), "--dry-run")
    assert snapshot(tmp_path) == before
    assert f"+++ {f}" in out
    assert "\n+" in out and "dry run: nothing was changed" in out
