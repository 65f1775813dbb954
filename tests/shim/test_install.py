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

from arbiter.install.versions import install, installed, switch_current
from arbiter.version import version

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


#: The handler's annotation lists: vgpu requests, and CDI device requests (a claim's
#: vgpu.io/claim device on containerd 1.6, which has no CDI).
ANNOTATIONS = ["vgpu.io/*", "cdi.k8s.io/*"]


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
                       "pod_annotations": ANNOTATIONS, "container_annotations": ANNOTATIONS}
    # The shipped snippet's runtime, with the shim's absolute path added; the main
    # config's CRI section carried whole (containerd 1.x takes an imported section whole),
    # with containerd's own runc handler, which the main config left to the defaults.
    shipped = cri_runtimes(tomllib.loads((SHIPPED / "containerd" / "vgpu.toml").read_text()))
    assert runtime == {**shipped["vgpu"], "runtime_path": SHIM}
    assert tomllib.loads(dropin.read_text()) == {"version": 2, "plugins": {
        "io.containerd.grpc.v1.cri": {"cni": {"bin_dir": "/usr/lib/cni"}, "containerd": {
            "runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2"},
                         "vgpu": runtime}}}}}
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
def test_default_program_is_the_stable_path_of_this_builds_install(tmp_path, target, program,
                                                                   where):
    """The engine execs <lib_dir>/current/bin/<program>; current names the versioned
    install of the checkout's build; a second run changes nothing."""
    built = ROOT / "build" / "bin" / program
    if not built.is_file():
        pytest.fail(f"{built} is missing: run `make`")
    f, lib = tmp_path / "conf.json", tmp_path / "lib"
    out = ok(target, "--config-file", str(f), "--lib-dir", str(lib), programs=())
    stable = lib / "current" / "bin" / program
    assert where(json.loads(f.read_text())) == str(stable)
    [inst] = installed(lib)
    assert os.readlink(lib / "current") == inst.name and inst.version == version()
    assert stable.read_bytes() == built.read_bytes()
    assert f"engines run the programs of {lib / 'current'} -> {inst.name}" in out
    before = snapshot(tmp_path)
    assert "already configured" in ok(target, "--config-file", str(f), "--lib-dir", str(lib),
                                      programs=())
    assert snapshot(tmp_path) == before


def test_the_lib_dir_defaults_to_the_configs(tmp_path):
    lib = tmp_path / "from-config"
    config = tmp_path / "config.yaml"
    config.write_text(f"paths:\n  lib_dir: {lib}\n")
    f = tmp_path / "daemon.json"
    ok("docker", "--config-file", str(f), "--config", str(config), programs=())
    assert json.loads(f.read_text())["runtimes"]["vgpu"]["path"] == \
        str(lib / "current" / "bin" / "vgpu-runtime")
    assert (lib / "current" / "bin" / "vgpu-runtime").is_file()


def test_a_rerun_switches_current_back_and_keeps_the_registration(tmp_path):
    """current was switched to another install (another version's `vgpu install`):
    registering again from this one switches it back; the engine's file is untouched."""
    f, lib = tmp_path / "vgpu.json", tmp_path / "lib"
    ok("podman", "--config-file", str(f), "--lib-dir", str(lib), programs=())
    [ours] = installed(lib)
    src = tmp_path / "other"
    (src / "bin").mkdir(parents=True)
    (src / "libvgpu.so").write_bytes(b"other")
    (src / "bin" / "vgpu-hook").write_bytes(b"other")
    other = install(lib, "0.1.9", {"libvgpu.so": src / "libvgpu.so",
                                   "bin/vgpu-hook": src / "bin" / "vgpu-hook"})
    switch_current(lib, other)
    registration = f.read_bytes()
    dry = ok("podman", "--config-file", str(f), "--lib-dir", str(lib), "--dry-run",
             programs=())
    assert f"-> {other.name}, would be -> {ours.name}" in dry
    assert os.readlink(lib / "current") == other.name
    out = ok("podman", "--config-file", str(f), "--lib-dir", str(lib), programs=())
    assert os.readlink(lib / "current") == ours.name and f.read_bytes() == registration
    assert f"-> {ours.name}" in out and "wrote" not in out


def test_dry_run_with_a_lib_dir_makes_nothing(tmp_path):
    f, lib = tmp_path / "daemon.json", tmp_path / "lib"
    out = ok("docker", "--config-file", str(f), "--lib-dir", str(lib), "--dry-run",
             programs=())
    assert not lib.exists() and not f.exists()
    assert f"switch {lib / 'current'}: missing, would be -> {version()}-" in out


def test_containerd_default_shim_is_the_stable_path(tmp_path):
    built = ROOT / "build" / "bin" / "containerd-shim-vgpu-v2"
    if not built.is_file():
        pytest.fail(f"{built} is missing: run `make`")
    lib = tmp_path / "lib"
    ok("containerd", "--config-file", str(tmp_path / "config.toml"),
       "--bin-dir", str(tmp_path / "bin"), "--lib-dir", str(lib), programs=())
    stable = lib / "current" / "bin" / "containerd-shim-vgpu-v2"
    assert os.readlink(tmp_path / "bin" / "containerd-shim-vgpu-v2") == str(stable)
    runtime = tomllib.loads((tmp_path / "conf.d" / "vgpu.toml").read_text())["plugins"][
        "io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["vgpu"]
    assert runtime["runtime_path"] == str(stable)
    # The shim finds its private runc beside its real file: the versioned install's.
    assert (stable.resolve().parent / "shim" / "runc").read_bytes() == \
        (ROOT / "build" / "bin" / "vgpu-runtime").read_bytes()


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


def containerd_dump(config: Path) -> dict:
    """The config containerd itself makes of `config` and what it imports."""
    if shutil.which("containerd") is None:
        pytest.skip("containerd is not installed (scripts/install-deps.sh installs it)")
    p = subprocess.run(["containerd", "--config", str(config), "config", "dump"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return tomllib.loads(p.stdout)


def test_containerd_reads_the_dropin_it_imports(tmp_path):
    """containerd itself (>= 1.6: runtime_path) merges the drop-in into its config."""
    f = tmp_path / "config.toml"
    ok("containerd", "--config-file", str(f), "--bin-dir", str(tmp_path / "bin"))
    dump = containerd_dump(f)
    runtime = cri_runtimes(dump)["vgpu"]
    assert (runtime["runtime_type"], runtime["runtime_path"], runtime["pod_annotations"],
            runtime["container_annotations"]) == (
        "io.containerd.vgpu.v2", SHIM, ANNOTATIONS, ANNOTATIONS)
    # The default handler is still there: without it the CRI plugin would not load.
    cri = dump["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert cri["default_runtime_name"] == "runc"
    assert cri_runtimes(dump)["runc"]["runtime_type"] == "io.containerd.runc.v2"


#: A Kubernetes node's main config: the sandbox image, CNI, the systemd cgroup driver.
NODE_CONFIG = """version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.example/pause:3.9"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
"""


def test_containerd_keeps_the_nodes_cri_settings(tmp_path):
    """A drop-in with the vgpu runtime alone would replace the node's whole CRI section
    (containerd#5837): containerd's own view keeps every setting, and vgpu's handler the
    node's cgroup driver."""
    f = tmp_path / "config.toml"
    f.write_text(NODE_CONFIG)
    ok("containerd", "--config-file", str(f), "--bin-dir", str(tmp_path / "bin"))
    cri = containerd_dump(f)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "registry.example/pause:3.9"
    assert (cri["cni"]["bin_dir"], cri["cni"]["conf_dir"]) == ("/opt/cni/bin", "/etc/cni/net.d")
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    assert cri["containerd"]["default_runtime_name"] == "runc"
    runtimes = cri["containerd"]["runtimes"]
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True
    assert runtimes["vgpu"]["options"]["SystemdCgroup"] is True
    assert runtimes["vgpu"]["runtime_path"] == SHIM


def test_containerd_later_import_wins_and_binary_name_is_not_inherited(tmp_path):
    """An import the main config already has replaces its CRI section in containerd: the
    drop-in (last) carries that one. runc's BinaryName would bypass vgpu-runtime: not
    inherited, and the line says to set runtime.lower instead."""
    (tmp_path / "site.toml").write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        '    BinaryName = "/usr/bin/nvidia-container-runtime"\n    SystemdCgroup = true\n')
    f = tmp_path / "config.toml"
    f.write_text('version = 2\nimports = ["site.toml"]\n' + NODE_CONFIG.split("\n", 1)[1])
    out = ok("containerd", "--config-file", str(f), "--bin-dir", str(tmp_path / "bin"))
    assert ("vgpu: the runc runtime runs /usr/bin/nvidia-container-runtime: set "
            "`runtime.lower: /usr/bin/nvidia-container-runtime` in vgpu's config") in out
    cri = containerd_dump(f)["plugins"]["io.containerd.grpc.v1.cri"]
    runtimes = cri["containerd"]["runtimes"]
    assert runtimes["runc"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert runtimes["vgpu"]["options"] == {"SystemdCgroup": True}


def test_containerd_set_as_default(tmp_path):
    f = tmp_path / "config.toml"
    f.write_text(NODE_CONFIG)
    bin_dir = ("--bin-dir", str(tmp_path / "bin"))
    before = snapshot(tmp_path)
    out = ok("containerd", "--config-file", str(f), "--set-as-default", "--dry-run", *bin_dir)
    assert '+default_runtime_name = "vgpu"' in out and "dry run: nothing was changed" in out
    assert snapshot(tmp_path) == before
    out = ok("containerd", "--config-file", str(f), "--set-as-default", *bin_dir)
    assert "vgpu is containerd's CRI default runtime" in out
    cri = containerd_dump(f)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert cri["default_runtime_name"] == "vgpu"
    assert cri["runtimes"]["vgpu"]["runtime_path"] == SHIM
    assert cri["runtimes"]["runc"]["options"]["SystemdCgroup"] is True  # still there
    assert (tmp_path / "config.toml.vgpu.bak").read_text() == NODE_CONFIG
    first = snapshot(tmp_path)
    assert "already configured" in ok("containerd", "--config-file", str(f),
                                       "--set-as-default", *bin_dir)
    assert snapshot(tmp_path) == first
    # Without the flag the default goes back to what the node's config says.
    ok("containerd", "--config-file", str(f), *bin_dir)
    assert containerd_dump(f)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"][
        "default_runtime_name"] == "runc"


@pytest.mark.parametrize("target", ["docker", "podman"])
def test_set_as_default_is_for_containerd_only(tmp_path, target):
    f = tmp_path / "conf.json"
    p = vgpu_install(target, "--config-file", str(f), "--set-as-default")
    assert p.returncode == 1
    assert p.stderr == (f"vgpu: failed to configure {f}: --set-as-default is for containerd "
                        'only (Docker: "default-runtime": "vgpu" in daemon.json)\n')
    assert not f.exists()
