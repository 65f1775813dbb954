# SPDX-License-Identifier: Apache-2.0
"""`vgpu upgrade` against real vgpuds on simgpu under socket activation.

The "old" release is this tree copied as version 0.1.9 (its pyproject.toml relabelled, its
build's libvgpu.so one byte longer, so its versioned install is another directory): a real
vgpud that reports 0.1.9 and serves `<lib>/0.1.9-<hash>`. The restart command the CLI runs
asks this test (over two FIFOs) to restart vgpud as the version in $VGPU_UPGRADE_VERSION,
as a unit whose ExecStart follows the installed version would: the listening sockets stay
(support.socket_activation), so the CLI's Health calls queue while vgpud restarts.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.paths import ROOT, SIMGPU_DIR
from support.process import clean_env
from support.socket_activation import SocketActivation
from support.vgpud_harness import Vgpud, pb

from arbiter.install.versions import current, installed
from arbiter.version import version
from vgpu_cli.upgrade import systemd_restart

OLD = "0.1.9"
NEW = version()
MiB = 1 << 20


@pytest.fixture(scope="module")
def old_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This tree as release 0.1.9: its Python packages, configs and build."""
    pkg = tmp_path_factory.mktemp("old") / f"vgpu-{OLD}"
    skip = shutil.ignore_patterns("__pycache__")
    for d in ("arbiter", "shim", "oci_hook", "vgpud", "vgpu_cli", "configs"):
        shutil.copytree(ROOT / d, pkg / d, ignore=skip)
    text = (ROOT / "pyproject.toml").read_text()
    (pkg / "pyproject.toml").write_text(text.replace(f'version = "{NEW}"',
                                                     f'version = "{OLD}"', 1))
    shutil.copytree(ROOT / "build" / "bin", pkg / "build" / "bin")
    shutil.copy2(ROOT / "build" / "libvgpu-fileops.so", pkg / "build")  # its vgpud's own
    lib = (ROOT / "build" / "libvgpu.so").read_bytes()
    (pkg / "build" / "libvgpu.so").write_bytes(lib + b"\0")   # another content hash
    return pkg


class VersionedVgpud(Vgpud):
    """vgpud of this tree, or (package set) of the old package, never this tree's modules."""

    package: Path | None = None

    def command(self) -> list[str]:
        cmd = super().command()
        return cmd if self.package is None else [sys.executable, "-P", *cmd[1:]]

    def start(self, timeout: float = 30) -> Vgpud:
        self.env["PYTHONPATH"] = str(self.package or ROOT)
        return super().start(timeout)


class Host:
    """A host running vgpud `OLD` under socket activation, its engines registered by the
    old package's `vgpu install`, and the restart command this test serves."""

    def __init__(self, tmp: Path, old_package: Path) -> None:
        self.tmp, self.old_package = tmp, old_package
        env = clean_env()
        (tmp / "sim").mkdir()
        env["SIMGPU_STATE"] = str(tmp / "sim" / "simgpu.state")
        self.vgpud = VersionedVgpud(tmp, env, {"nvml": {
            "library": str(SIMGPU_DIR / "libnvidia-ml.so.1")}})
        self.vgpud.package = old_package
        self.lib = self.vgpud.state_dir / "lib"
        self.act = SocketActivation(self.vgpud)
        self.req, self.ack = tmp / "restart.req", tmp / "restart.ack"
        os.mkfifo(self.req)
        os.mkfifo(self.ack)
        #: Versions whose vgpud "fails to start" (the restart command then fails).
        self.broken: set[str] = set()
        self.asked: list[str] = []
        self.engines = {"docker": tmp / "daemon.json", "podman": tmp / "hooks.d" / "vgpu.json",
                        "containerd": tmp / "containerd" / "config.toml"}
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def restart_command(self) -> str:
        return f'echo "$VGPU_UPGRADE_VERSION" > {self.req}; read r < {self.ack}; [ "$r" = ok ]'

    def _serve(self) -> None:
        while True:
            with open(self.req) as f:
                wanted = f.read().strip()
            if wanted == "quit":
                return
            self.asked.append(wanted)
            ok = True
            try:
                if self.vgpud.proc is not None and self.vgpud.proc.poll() is None:
                    self.act.down()
                if wanted in self.broken:
                    ok = False
                else:
                    self.vgpud.package = self.old_package if wanted == OLD else None
                    self.act.up()
            except Exception:
                ok = False
            with open(self.ack, "w") as f:
                f.write("ok\n" if ok else "fail\n")

    def start(self) -> Host:
        self.act.start()
        self._thread.start()
        # The old release registered the engines: docker and containerd through its stable
        # path, podman (hooks.d) with the old package's own vgpu-hook path.
        self.old_cli("install", "docker", "--config-file", str(self.engines["docker"]))
        self.old_cli("install", "containerd", "--config-file", str(self.engines["containerd"]),
                     "--bin-dir", str(self.tmp / "bin"))
        self.old_cli("install", "podman", "--config-file", str(self.engines["podman"]),
                     "--hook-path", str(self.old_package / "build" / "bin" / "vgpu-hook"))
        # A claim's slice that vgpud OLD made (it outlives restarts and containers).
        self.vgpud.stub.Allocate(pb.AllocateRequest(owner="old-claim", memory_bytes=64 * MiB,
                                                    owner_kind="claim"), timeout=10)
        return self

    def old_cli(self, *args: str) -> str:
        env = dict(clean_env(), PYTHONPATH=str(self.old_package))
        p = subprocess.run([sys.executable, "-P", "-m", "vgpu_cli", *args, "--lib-dir",
                            str(self.lib)], env=env, cwd=self.tmp, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout

    def upgrade(self, *args: str) -> subprocess.CompletedProcess[str]:
        """This tree's `vgpu upgrade` against the host."""
        env = dict(clean_env(), PYTHONPATH=str(ROOT))
        return subprocess.run(
            [sys.executable, "-m", "vgpu_cli", "upgrade", "--socket", str(self.vgpud.socket),
             "--lib-dir", str(self.lib), "--timeout", "30",
             "--restart-command", self.restart_command, "--bin-dir", str(self.tmp / "bin"),
             *(x for t, f in self.engines.items() for x in (f"--{t}-config", str(f))),
             *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)

    def health(self) -> pb.HealthResponse:
        return self.act.health()

    def files(self) -> dict[str, bytes | str]:
        """Every file and link under the tmp dir but vgpud's own state and logs."""
        out: dict[str, bytes | str] = {}
        for p in sorted(self.tmp.rglob("*")):
            rel = str(p.relative_to(self.tmp))
            if rel.startswith(("state/state.db", "state/events", "run/", "vgpud", "sim/")):
                continue
            if p.is_symlink():
                out[rel] = os.readlink(p)
            elif p.is_file() and not rel.startswith("restart."):
                out[rel] = p.read_bytes()
        return out

    def close(self) -> None:
        if self._thread.is_alive():
            with open(self.req, "w") as f:
                f.write("quit\n")
            self._thread.join(timeout=10)
        self.act.close()


@pytest.fixture
def host(tmp_path: Path, old_package: Path):
    h = Host(tmp_path, old_package)
    try:
        yield h.start()
    finally:
        h.close()


def _install(lib: Path, v: str) -> str:
    [name] = [i.name for i in installed(lib) if i.version == v]
    return name


def test_upgrade_switches_engines_restarts_vgpud_and_reports_containers(host: Host) -> None:
    old = _install(host.lib, OLD)
    assert host.health().version == OLD and current(host.lib).name == old  # type: ignore[union-attr]
    docker_before = host.engines["docker"].read_bytes()
    p = host.upgrade()
    assert p.returncode == 0, p.stdout + p.stderr
    new = _install(host.lib, NEW)
    h = host.health()
    assert h.version == NEW and Path(h.paths["libvgpu"]).parent.name == new
    assert os.readlink(host.lib / "current") == new
    assert host.asked == [NEW]
    # docker already named the stable path: untouched; podman named the old package's own
    # hook: re-registered to the stable path.
    assert host.engines["docker"].read_bytes() == docker_before
    assert json.loads(host.engines["podman"].read_text())["hook"]["path"] == \
        str(host.lib / "current" / "bin" / "vgpu-hook")
    # No container maps the old install and current left it: vgpud N removed it.
    assert not (host.lib / old).exists()
    assert f"vgpu: upgraded {OLD} -> {NEW}: vgpud serves {new}" in p.stdout
    assert "containers by libvgpu install:" in p.stdout and "old-claim" in p.stdout
    # Again: nothing to do.
    again = host.upgrade()
    assert again.returncode == 0 and "already at" in again.stdout and host.asked == [NEW]


def test_a_failing_restart_rolls_back_and_the_old_version_serves(host: Host) -> None:
    old = _install(host.lib, OLD)
    engines_before = {t: f.read_bytes() for t, f in host.engines.items()}
    host.broken.add(NEW)
    p = host.upgrade()
    assert p.returncode == 1
    [line] = p.stderr.splitlines()
    assert line.startswith(f"vgpu: upgrade to {NEW} failed: restart command "), line
    assert f"rolled back: {host.lib / 'current'} -> {old}, vgpud {OLD} serving" in line
    assert host.asked == [NEW, OLD]
    assert host.health().version == OLD
    assert os.readlink(host.lib / "current") == old
    assert {t: f.read_bytes() for t, f in host.engines.items()} == engines_before
    assert [s.owner for s in host.vgpud.stub.List(pb.ListRequest(), timeout=5).slices] == \
        ["old-claim"]


def test_a_version_that_never_serves_rolls_back_after_the_timeout(host: Host) -> None:
    """The restart 'succeeds' but brings the old version back (a unit still naming the
    old vgpud): Health never reports the new one within --timeout."""
    old = _install(host.lib, OLD)
    p = host.upgrade("--restart-command",
                     host.restart_command.replace('"$VGPU_UPGRADE_VERSION"', OLD),
                     "--timeout", "3")
    assert p.returncode == 1
    assert f"did not report version {NEW} within 3s (it reports {OLD} serving {old})" \
        in p.stderr
    assert os.readlink(host.lib / "current") == old and host.health().version == OLD


def test_dry_run_prints_the_steps_and_changes_nothing(host: Host) -> None:
    before = host.files()
    up = host.health().uptime_seconds
    p = host.upgrade("--dry-run")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith(f"1. install {host.lib}/{NEW}-")
    assert any(f"switch {host.lib / 'current'}: {_install(host.lib, OLD)} -> {NEW}-" in x
               for x in lines)
    assert any(x.startswith(f"3. re-register podman: {host.engines['podman']}") for x in lines)
    assert lines[-1] == "vgpu: dry run: nothing was changed"
    assert host.files() == before and host.asked == []
    assert host.health().version == OLD and host.health().uptime_seconds >= up


def test_without_systemd_or_a_restart_command_it_says_so_and_changes_nothing(host: Host):
    if systemd_restart() is not None:
        pytest.skip("vgpud.service runs here")
    before = host.files()
    env = dict(clean_env(), PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "vgpu_cli", "upgrade", "--socket",
                        str(host.vgpud.socket), "--lib-dir", str(host.lib)],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert p.stderr == ("vgpu: vgpud does not run as systemd's vgpud.service here: pass "
                        "--restart-command CMD (how to restart it)\n")
    assert host.files() == before


def test_systemd_is_detected_by_its_run_dir_and_the_units_state(tmp_path: Path) -> None:
    """A stand-in systemctl (a real program) that says vgpud.service is active or not."""
    run_dir = tmp_path / "systemd"
    tool = tmp_path / "systemctl"
    tool.write_text('#!/bin/sh\n[ "$1 $2 $3" = "is-active --quiet vgpud.service" ] && '
                    f'[ -e {tmp_path}/active ]\n')
    tool.chmod(0o755)
    assert systemd_restart(run_dir, str(tool)) is None          # no systemd running
    run_dir.mkdir()
    assert systemd_restart(run_dir, str(tool)) is None          # the unit is not active
    (tmp_path / "active").touch()
    assert systemd_restart(run_dir, str(tool)) == [str(tool), "restart", "vgpud.service"]
