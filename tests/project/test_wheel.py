# SPDX-License-Identifier: Apache-2.0
"""The wheel is a complete vgpu: built offline, installed into a fresh venv that cannot
see the checkout, `vgpu install docker|containerd|podman` from it points every engine at
the compiled programs it ships (arbiter/native/bin/) and writes the shipped snippets."""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from support.paths import ROOT

from arbiter.install.shipped import CONFIGS
from arbiter.native import PROGRAMS

ELF = b"\x7fELF"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built as `pip wheel .` does, without build isolation (offline)."""
    out = tmp_path_factory.mktemp("wheel")
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
         "-w", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    (built,) = out.glob("vgpu-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed; its dependencies are the packages of the
    interpreter running the tests (nothing from an index), named in a .pth file."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)],
                   check=True, capture_output=True, timeout=300)
    p = subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q",
                        "--no-index", "--no-deps", str(wheel)],
                       capture_output=True, text=True, timeout=300, env=outside_env(root))
    assert p.returncode == 0, p.stderr[-4000:]
    # Not --system-site-packages: a venv made from a venv (the project's .venv on Debian)
    # sees the *base* interpreter's site-packages, not the running one's. A .pth names the
    # running interpreter's own; it is read after the venv's site-packages, so the wheel's
    # copy of vgpu comes first, and it is written after pip ran, so pip saw only the venv.
    (site_dir,) = (root / "lib").glob("python3*/site-packages")
    (site_dir / "vgpu-test-deps.pth").write_text("".join(f"{d}\n" for d in running_site_dirs()))
    return root


def running_site_dirs() -> list[str]:
    """The site-packages directories of the interpreter running the tests."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


def outside_env(venv: Path) -> dict[str, str]:
    """An environment that knows nothing of the checkout (no PYTHONPATH, no VGPU_*)."""
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith(("VGPU_", "SIMGPU_"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def in_venv(venv: Path, tmp_path: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    """Run a venv program from a directory outside the checkout."""
    return subprocess.run([str(venv / "bin" / cmd[0]), *cmd[1:]], cwd=tmp_path,
                          env=outside_env(venv), capture_output=True, text=True, timeout=120)


def test_wheel_ships_the_native_parts_the_configs_and_types(wheel: Path) -> None:
    assert "-py3-none-linux_" in wheel.name  # platform wheel: it holds native code
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = zf.read(
            next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
        lib = zf.read("arbiter/native/libvgpu.so")
        fileops_lib = zf.read("arbiter/native/libvgpu-fileops.so")
        programs = {p: zf.read(f"arbiter/native/bin/{p}") for p in PROGRAMS}
        modes = {p: zf.getinfo(f"arbiter/native/bin/{p}").external_attr >> 16 for p in PROGRAMS}
        configs = {c: zf.read(f"arbiter/configs/{c}") for c in CONFIGS}
    assert lib.startswith(ELF) and fileops_lib.startswith(ELF)
    assert {"vgpu-runtime", "vgpu-hook", "containerd-shim-vgpu-v2", "shim/runc"} <= set(PROGRAMS)
    assert all(p.startswith(ELF) for p in programs.values())   # compiled, no script
    assert all(m & 0o111 for m in modes.values()), modes
    for c, text in configs.items():                              # the checkout's files
        assert text == (ROOT / "configs" / c).read_bytes(), c
    # Nothing of the Python container path's fallback is left.
    assert "arbiter/native/bin/vgpu-python" not in names
    for name in ("arbiter/py.typed", "oci_hook/py.typed", "shim/py.typed",
                 "arbiter/native/__init__.py", "arbiter/proto/vgpu_pb2.py",
                 "vgpu_k8s/py.typed", "vgpu_k8s/proto/deviceplugin_v1beta1_pb2_grpc.py",
                 "vgpu_k8s/dra/main.py", "vgpu_k8s/proto/dra_v1_pb2_grpc.py",
                 "vgpu_k8s/proto/pluginregistration_v1_pb2_grpc.py"):
        assert name in names
    assert not any(n.startswith(("tests/", "libvgpu/", "configs/", "shim/native/",
                                  "oci_hook/native/", "arbiter/files/native/"))
                   for n in names)
    scripts = {line.split(" = ")[0] for line in entry_points.splitlines() if " = " in line}
    assert {"vgpu", "vgpud", "vgpu-device-plugin", "vgpu-dra-plugin"} <= scripts
    assert not scripts & {"vgpu-runtime", "vgpu-hook", "containerd-shim-vgpu-v2"}  # compiled
    assert "License-Expression: Apache-2.0" in metadata
    assert "Requires-Python: >=3.11" in metadata


def test_the_venv_uses_its_own_copy(venv: Path, tmp_path: Path) -> None:
    p = in_venv(venv, tmp_path, "python", "-c",
                "import arbiter, shim, vgpu_cli; from arbiter.install.shipped import shipped_file; "
                "from arbiter.native import fileops_path; "
                "print(arbiter.__file__, shim.__file__, vgpu_cli.__file__, "
                "shipped_file('oci-hooks.d/vgpu.json'), fileops_path())")
    assert p.returncode == 0, p.stderr
    for path in p.stdout.split():
        assert Path(path).is_relative_to(venv), path
        assert not Path(path).is_relative_to(ROOT), path


def shipped_program(venv: Path, name: str) -> Path:
    """`name` as the venv's arbiter/native/bin holds it, checked to be a program."""
    (site,) = (venv / "lib").glob("python3*/site-packages")
    path = site / "arbiter" / "native" / "bin" / name
    assert path.is_file() and os.access(path, os.X_OK), path
    assert path.read_bytes()[:4] == ELF
    return path


def test_vgpu_install_docker_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    daemon = tmp_path / "daemon.json"
    p = in_venv(venv, tmp_path, "vgpu", "install", "docker", "--config-file", str(daemon),
                "--lib-dir", str(tmp_path / "lib"))
    assert p.returncode == 0, p.stderr
    path = json.loads(daemon.read_text())["runtimes"]["vgpu"]["path"]
    # The stable path through <lib dir>/current, which names the wheel's versioned install.
    assert path == str(tmp_path / "lib" / "current" / "bin" / "vgpu-runtime")
    assert Path(path).read_bytes() == shipped_program(venv, "vgpu-runtime").read_bytes()


def test_vgpu_install_podman_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    hook_file = tmp_path / "hooks.d" / "vgpu.json"
    p = in_venv(venv, tmp_path, "vgpu", "install", "podman", "--config-file", str(hook_file),
                "--lib-dir", str(tmp_path / "lib"))
    assert p.returncode == 0, p.stderr
    doc = json.loads(hook_file.read_text())
    assert doc["hook"]["path"] == str(tmp_path / "lib" / "current" / "bin" / "vgpu-hook")
    assert Path(doc["hook"]["path"]).read_bytes() == \
        shipped_program(venv, "vgpu-hook").read_bytes()
    # Every stage the shipped file lists: poststop releases the slice at the exit.
    assert doc["stages"] == ["prestart", "poststop"]


def test_vgpu_install_containerd_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    config, bin_dir = tmp_path / "config.toml", tmp_path / "bin"
    p = in_venv(venv, tmp_path, "vgpu", "install", "containerd", "--config-file", str(config),
                "--bin-dir", str(bin_dir), "--lib-dir", str(tmp_path / "lib"))
    assert p.returncode == 0, p.stderr
    shim = tmp_path / "lib" / "current" / "bin" / "containerd-shim-vgpu-v2"
    assert shim.read_bytes() == shipped_program(venv, "containerd-shim-vgpu-v2").read_bytes()
    dropin = tmp_path / "conf.d" / "vgpu.toml"
    assert tomllib.loads(config.read_text())["imports"] == [str(dropin)]
    runtime = tomllib.loads(dropin.read_text())["plugins"]["io.containerd.grpc.v1.cri"][
        "containerd"]["runtimes"]["vgpu"]
    assert runtime["runtime_path"] == str(shim)
    assert os.readlink(bin_dir / "containerd-shim-vgpu-v2") == str(shim)
    # The shim's private dir: its runc is the compiled vgpu-runtime.
    assert shipped_program(venv, "shim/runc").read_bytes() == \
        shipped_program(venv, "vgpu-runtime").read_bytes()
    assert f"through {bin_dir / 'containerd-shim-vgpu-v2'} on containerd's PATH" in p.stdout
