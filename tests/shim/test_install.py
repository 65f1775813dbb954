# SPDX-License-Identifier: Apache-2.0
"""`vgpu install docker|containerd|podman` on temporary config files, through the CLI."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.paths import ROOT

RUNTIME = "/opt/vgpu/bin/vgpu-runtime"
HOOK = "/opt/vgpu/bin/vgpu-hook"
SHIM = "/opt/vgpu/bin/containerd-shim-vgpu-v2"
SHIPPED = ROOT / "configs"

CONTAINERD_CONFIG = """\
version = 2
root = "/var/lib/containerd"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
"""


def vgpu_install(*args: str, programs: tuple[str, ...] | None = None
                 ) -> subprocess.CompletedProcess[str]:
    """`vgpu install ARGS`; `programs`: the program path flags (default: made-up paths)."""
    if programs is None:
        programs = ("--runtime-path", RUNTIME, "--hook-path", HOOK, "--shim-path", SHIM)
    return subprocess.run(
        [sys.executable, "-m", "vgpu_cli", "install", *args, *programs],
        capture_output=True, text=True, cwd=ROOT, timeout=60)


def ok(*args: str, programs: tuple[str, ...] | None = None) -> str:
    p = vgpu_install(*args, programs=programs)
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

def cri_runtimes(doc: dict) -> dict:
    return doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]


def test_containerd_dropin_import_and_shim_link(tmp_path):
    f = tmp_path / "config.toml"
    f.write_text(CONTAINERD_CONFIG)
    bin_dir = tmp_path / "bin"
    out = ok("containerd", "--config-file", str(f), "--bin-dir", str(bin_dir))
    dropin = tmp_path / "conf.d" / "vgpu.toml"
    doc = tomllib.loads(f.read_text())
    assert doc["imports"] == [str(dropin)]
    assert doc["root"] == "/var/lib/containerd"
    assert doc["plugins"]["io.containerd.grpc.v1.cri"]["cni"]["bin_dir"] == "/usr/lib/cni"
    runtime = cri_runtimes(tomllib.loads(dropin.read_text()))["vgpu"]
    assert runtime == {"runtime_type": "io.containerd.vgpu.v2", "runtime_path": SHIM,
                       "pod_annotations": ["vgpu.io/*"]}
    # The shipped snippet is the drop-in, with the shim's absolute path added.
    shipped = tomllib.loads((SHIPPED / "containerd" / "vgpu.toml").read_text())
    cri_runtimes(shipped)["vgpu"]["runtime_path"] = SHIM
    assert tomllib.loads(dropin.read_text()) == shipped
    # ctr resolves io.containerd.vgpu.v2 by name on containerd's PATH: the link.
    link = bin_dir / "containerd-shim-vgpu-v2"
    assert os.readlink(link) == SHIM
    assert (tmp_path / "config.toml.vgpu.bak").read_text() == CONTAINERD_CONFIG
    assert "systemctl restart containerd" in out
    assert f"through runtime_path in {dropin}" in out and f"through {link}" in out
    first = snapshot(tmp_path)
    assert "already configured" in ok("containerd", "--config-file", str(f),
                                       "--bin-dir", str(bin_dir))
    assert snapshot(tmp_path) == first
    # Another installation: the link moves, the drop-in follows.
    p = vgpu_install("containerd", "--config-file", str(f), "--bin-dir", str(bin_dir),
                     programs=("--shim-path", "/v2/containerd-shim-vgpu-v2"))
    assert p.returncode == 0, p.stderr
    assert os.readlink(link) == "/v2/containerd-shim-vgpu-v2"
    assert cri_runtimes(tomllib.loads(dropin.read_text()))["vgpu"]["runtime_path"] == \
        "/v2/containerd-shim-vgpu-v2"
    assert sorted(os.listdir(bin_dir)) == ["containerd-shim-vgpu-v2"]  # no temporary left


def test_containerd_never_replaces_a_file_that_is_not_a_link(tmp_path):
    f = tmp_path / "config.toml"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "containerd-shim-vgpu-v2").write_text("someone else's")
    p = vgpu_install("containerd", "--config-file", str(f), "--bin-dir", str(bin_dir))
    assert p.returncode == 1
    assert p.stderr == (f"vgpu: failed to configure {bin_dir}/containerd-shim-vgpu-v2: "
                        "it exists and is not a symlink: remove it or pass --bin-dir\n")
    assert (bin_dir / "containerd-shim-vgpu-v2").read_text() == "someone else's"
    assert not f.exists() and not (tmp_path / "conf.d").exists()


def test_containerd_existing_imports_are_kept(tmp_path):
    f = tmp_path / "config.toml"
    f.write_text('version = 2\nimports = ["/etc/containerd/other.toml"]\n' + "[grpc]\n"
                 '  address = "/run/x.sock"\n')
    ok("containerd", "--config-file", str(f), "--bin-dir", str(tmp_path / "bin"))
    doc = tomllib.loads(f.read_text())
    assert doc["imports"] == ["/etc/containerd/other.toml", str(tmp_path / "conf.d/vgpu.toml")]
    assert doc["grpc"] == {"address": "/run/x.sock"}


def test_containerd_missing_config_is_created(tmp_path):
    f = tmp_path / "config.toml"
    ok("containerd", "--config-file", str(f), "--bin-dir", str(tmp_path / "bin"))
    assert tomllib.loads(f.read_text()) == {"version": 2,
                                            "imports": [str(tmp_path / "conf.d/vgpu.toml")]}


def test_containerd_version_1_is_refused(tmp_path):
    f = tmp_path / "config.toml"
    f.write_text('[plugins.cri]\n  sandbox_image = "x"\n')
    p = vgpu_install("containerd", "--config-file", str(f), "--bin-dir", str(tmp_path / "bin"))
    assert p.returncode == 1
    assert "config version 1 is not supported" in p.stderr
    assert not (tmp_path / "conf.d").exists() and not (tmp_path / "bin").exists()


# --- podman --------------------------------------------------------------------------

def test_podman_hooks_file_is_the_shipped_one_with_our_hook(tmp_path):
    f = tmp_path / "hooks.d" / "vgpu.json"
    out = ok("podman", "--config-file", str(f))
    doc = json.loads(f.read_text())
    shipped = json.loads((SHIPPED / "oci-hooks.d" / "vgpu.json").read_text())
    assert doc["hook"]["path"] == HOOK
    shipped["hook"]["path"] = HOOK
    assert doc == shipped
    # poststop releases the slice the moment the container exits (not the reconciler).
    assert doc["stages"] == ["prestart", "poststop"]
    assert "nothing to restart" in out
    assert "already configured" in ok("podman", "--config-file", str(f))


def test_docker_runtimes_are_the_shipped_ones(tmp_path):
    f = tmp_path / "daemon.json"
    ok("docker", "--config-file", str(f))
    shipped = json.loads((SHIPPED / "docker" / "daemon.json").read_text())
    assert set(json.loads(f.read_text())["runtimes"]) == set(shipped["runtimes"]) == {"vgpu"}


# --- the programs: this installation's compiled ones ------------------------------------

@pytest.mark.parametrize(("target", "program", "where"), [
    ("docker", "vgpu-runtime", lambda d: d["runtimes"]["vgpu"]["path"]),
    ("podman", "vgpu-hook", lambda d: d["hook"]["path"]),
], ids=["docker", "podman"])
def test_default_program_is_the_checkouts_compiled_one(tmp_path, target, program, where):
    built = ROOT / "build" / "bin" / program
    if not built.is_file():
        pytest.fail(f"{built} is missing: run `make`")
    f = tmp_path / "conf.json"
    ok(target, "--config-file", str(f), programs=())
    assert where(json.loads(f.read_text())) == str(built)


def test_containerd_default_shim_is_the_checkouts_compiled_one(tmp_path):
    built = ROOT / "build" / "bin" / "containerd-shim-vgpu-v2"
    if not built.is_file():
        pytest.fail(f"{built} is missing: run `make`")
    ok("containerd", "--config-file", str(tmp_path / "config.toml"),
       "--bin-dir", str(tmp_path / "bin"), programs=())
    assert os.readlink(tmp_path / "bin" / "containerd-shim-vgpu-v2") == str(built)


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
    out = ok(target, "--config-file", str(f), "--dry-run", "--bin-dir", str(tmp_path / "bin"))
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "bin").exists()
    assert f"+++ {f}" in out
    assert "\n+" in out and "dry run: nothing was changed" in out
    if target == "containerd":
        assert (f"link {tmp_path}/bin/containerd-shim-vgpu-v2: missing, would be -> {SHIM}"
                in out)


def test_containerd_reads_the_dropin_it_imports(tmp_path):
    """containerd itself (>= 1.6: runtime_path) merges the drop-in into its config."""
    if shutil.which("containerd") is None:
        pytest.skip("containerd is not installed (scripts/install-deps.sh installs it)")
    f = tmp_path / "config.toml"
    ok("containerd", "--config-file", str(f), "--bin-dir", str(tmp_path / "bin"))
    p = subprocess.run(["containerd", "--config", str(f), "config", "dump"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    runtime = cri_runtimes(tomllib.loads(p.stdout))["vgpu"]
    assert (runtime["runtime_type"], runtime["runtime_path"], runtime["pod_annotations"]) == (
        "io.containerd.vgpu.v2", SHIM, ["vgpu.io/*"])
