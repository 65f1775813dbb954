# SPDX-License-Identifier: Apache-2.0
"""Version strings are real: `vgpu --version` and vgpud's Health say pyproject's version."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from support.paths import ROOT
from support.vgpud_harness import Vgpud

from arbiter.proto import vgpu_pb2 as pb
from arbiter.version import version

PACKAGES = ("arbiter", "oci_hook", "shim", "vgpu_cli", "vgpud")


def pyproject_version(path: Path = ROOT / "pyproject.toml") -> str:
    return str(tomllib.loads(path.read_text())["project"]["version"])


def cli_module() -> str:
    """The `vgpu` CLI's module: the vgpu_cli package, or arbiter.cli before it moved."""
    return "vgpu_cli" if (ROOT / "vgpu_cli" / "__main__.py").is_file() else "arbiter.cli"


def run_cli(cwd: Path, pythonpath: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run([sys.executable, "-m", cli_module(), "--version"], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def tree(dest: Path, version_in_pyproject: str | None) -> Path:
    """A copy of the checkout's packages (symlinks), with a pyproject of the given version."""
    dest.mkdir()
    for name in PACKAGES:
        if (ROOT / name).is_dir():
            (dest / name).symlink_to(ROOT / name, target_is_directory=True)
    if version_in_pyproject is not None:
        text = (ROOT / "pyproject.toml").read_text()
        current = f'version = "{pyproject_version()}"'
        assert current in text
        (dest / "pyproject.toml").write_text(
            text.replace(current, f'version = "{version_in_pyproject}"', 1))
    return dest


def test_the_checkout_says_pyprojects_version() -> None:
    assert version() == pyproject_version()
    assert version() not in ("", "unknown", "0+source")


def test_cli_version_in_the_checkout(tmp_path: Path) -> None:
    # Run from elsewhere, so the result does not come from whatever sits in the cwd.
    assert run_cli(tmp_path, ROOT) == f"vgpu {pyproject_version()}"


def test_a_checkout_wins_over_stale_metadata(tmp_path: Path) -> None:
    """A checkout's pyproject.toml is the truth, even beside other metadata: in this
    process the real checkout (with any vgpu.egg-info in it) is on sys.path; the CLI
    runs where no metadata is found at all."""
    src = tree(tmp_path / "src", "9.8.7")
    assert version(src) == "9.8.7"
    assert run_cli(tmp_path, src) == "vgpu 9.8.7"


def test_installed_reads_the_distributions_metadata(tmp_path: Path) -> None:
    """Installed (no pyproject.toml beside the packages): the dist-info's version."""
    site = tree(tmp_path / "site", None)
    info = site / "vgpu-7.6.5.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vgpu\nVersion: 7.6.5\n")
    assert run_cli(tmp_path, site) == "vgpu 7.6.5"


def test_a_pyproject_of_another_project_is_not_ours(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\nversion = "3.0"\n')
    assert version(tmp_path) != "3.0"


def test_vgpud_and_vgpu_info_say_it_too(tmp_path: Path, simgpu_env: dict[str, str]) -> None:
    """vgpud's Health (what `vgpu smi` and `vgpu info` show) carries the same version."""
    daemon = Vgpud(tmp_path, simgpu_env).start()
    try:
        assert daemon.stub.Health(pb.HealthRequest(), timeout=10).version == pyproject_version()
        env = dict(daemon.env, VGPU_SOCKET=str(daemon.socket))
        out = subprocess.run([sys.executable, "-m", cli_module(), "info"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=60, check=True)
        assert f"version {pyproject_version()}," in out.stdout, out.stdout
    finally:
        daemon.close()
