# SPDX-License-Identifier: Apache-2.0
"""Real container engines for end-to-end tests: containerd and dockerd on temporary paths.

Each engine runs on its own sockets, root and state directories under a temporary
tree, with vgpu's programs (containerd-shim-vgpu-v2, vgpu-runtime) as wrapper
scripts in a private bin directory on its PATH, and is stopped (and its mounts
undone) after the tests. `require()` skips a test module with the reason when an
engine binary is missing (scripts/install-deps.sh installs them on Debian).
`CriContainerd` is containerd with its CRI plugin, as a Kubernetes node runs it.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from support.paths import NATIVE_BIN, ROOT, SIMGPU_DIR
from support.process import clean_env
from support.vgpud_harness import Vgpud

__all__ = ["Containerd", "CriContainerd", "Dockerd", "require", "vgpu_bin_dir"]


def require(*binaries: str) -> None:
    """Skip the calling test module unless we are root and every binary is on PATH."""
    if os.geteuid() != 0:
        pytest.skip("container engines need root", allow_module_level=True)
    missing = [b for b in binaries if shutil.which(b) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (scripts/install-deps.sh installs "
                    "runc, containerd and docker.io)", allow_module_level=True)


def vgpu_bin_dir(dest: Path) -> Path:
    """A bin directory with this checkout's compiled programs (links into build/bin: the
    shim finds its private `runc` dir, build/bin/shim, beside its real path)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("containerd-shim-vgpu-v2", "vgpu-runtime", "vgpu-hook"):
        (dest / name).symlink_to(NATIVE_BIN / name)
    return dest


def simulated_host(tmp: Path, runtime_state_roots: list[str],
                   devices: str = "1Gi,1Gi") -> tuple[Path, Vgpud]:
    """A simgpu state directory (to bind-mount into containers) and a vgpud on it.

    vgpud is not started; its reconciler looks for container state under
    runtime_state_roots, where the engine's runc keeps it.
    """
    sim_dir = tmp / "simgpu"
    sim_dir.mkdir()
    env = clean_env()
    env["SIMGPU_STATE"] = str(sim_dir / "simgpu.state")
    env["LD_LIBRARY_PATH"] = str(SIMGPU_DIR)
    (tmp / "vgpud").mkdir()
    vgpud = Vgpud(tmp / "vgpud", env, devices=devices, config={
        "hook": {"wait_s": 10},
        "reconcile": {"runtime_state_roots": runtime_state_roots},
    })
    return sim_dir, vgpud


def engine_env(bindir: Path) -> dict[str, str]:
    """A clean environment for an engine, with this checkout's vgpu commands first on PATH."""
    env = clean_env()
    env["PATH"] = f"{bindir}:{env['PATH']}"
    return env


def point_at(env: dict[str, str], vgpud: Vgpud) -> None:
    """Make the vgpu commands an engine starts use this vgpud."""
    env["VGPU_CONFIG"] = str(vgpud.config_file)
    env["VGPU_SOCKET"] = str(vgpud.socket)


def _umount_under(path: Path) -> None:
    """Lazily unmount whatever an engine left mounted under `path` (deepest first)."""
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _answers(call: Any) -> bool:
    """Whether a gRPC call succeeds now."""
    try:
        call()
        return True
    except grpc.RpcError:
        return False


class _Daemon:
    """A daemon subprocess with a log file."""

    name = "daemon"

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.env = dict(env)
        self.log_path = tmp / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _spawn(self, cmd: list[str]) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log,
                                         start_new_session=True)

    def _wait_ready(self, probe: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.log()}")
            if probe():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not start:\n{self.log()[-4000:]}")
            time.sleep(0.1)

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _umount_under(self.tmp)


class Containerd(_Daemon):
    """containerd with its own root, state and socket; `ctr()` talks to it."""

    name = "containerd"

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        super().__init__(tmp, env)
        self.socket = tmp / "containerd.sock"
        self.root = tmp / "root"
        self.state = tmp / "state"
        self.config = tmp / "containerd.toml"
        # A namespace of our own: the runc shim keeps state in /run/containerd/runc/<ns>.
        self.namespace = f"vgpu-test-{secrets.token_hex(3)}"

    #: Plugins this machine cannot or need not run (and the CRI plugin, but in CriContainerd).
    disabled_plugins: tuple[str, ...] = (
        "io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs",
        "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
        "io.containerd.snapshotter.v1.aufs")

    def config_text(self) -> str:
        """containerd's config file (version 2)."""
        return "\n".join([
            "version = 2",
            f'root = "{self.root}"',
            f'state = "{self.state}"',
            f"disabled_plugins = {json.dumps(list(self.disabled_plugins))}",
            "[grpc]",
            f'  address = "{self.socket}"',
            "[ttrpc]",
            f'  address = "{self.socket}.ttrpc"',
            "[debug]",
            '  address = ""',
            "[metrics]",
            '  address = ""',
            "",
        ])

    def write_config(self) -> None:
        self.config.write_text(self.config_text())

    def start(self, timeout: float = 30) -> Containerd:
        self.write_config()
        self._spawn(["containerd", "--config", str(self.config)])

        def ready() -> bool:
            return self.ctr("version", check=False, timeout=5).returncode == 0
        self._wait_ready(ready, timeout)
        return self

    def ctr(self, *args: str, check: bool = True, timeout: float = 60,
            namespace: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = ["ctr", "--address", str(self.socket), "--namespace",
               namespace or self.namespace, *args]
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{cmd} exited {p.returncode}\nstdout:\n{p.stdout}\n"
                                 f"stderr:\n{p.stderr}\ncontainerd log:\n{self.log()[-3000:]}")
        return p

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                for task in self.ctr("tasks", "ls", "-q", check=False, timeout=10
                                     ).stdout.split():
                    self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False, timeout=10)
                    self.ctr("tasks", "delete", "-f", task, check=False, timeout=10)
                for c in self.ctr("containers", "ls", "-q", check=False, timeout=10
                                  ).stdout.split():
                    self.ctr("containers", "delete", c, check=False, timeout=10)
        super().stop(timeout)
        shutil.rmtree(f"/run/containerd/runc/{self.namespace}", ignore_errors=True)


class CriContainerd(Containerd):
    """containerd with its CRI plugin, configured as on a Kubernetes node that runs vgpu.

    Its own root, state and socket; CRI's namespace `k8s.io` (the runc shim keeps that
    namespace's state in /run/containerd/runc/k8s.io, shared with any other CRI
    containerd on the host: container ids are random, and nothing here removes the
    directory); the sandbox image `sandbox_image`, imported locally (no registry is
    reachable); `restrict_oom_score_adj` (the kubelet's pods may not lower their OOM
    score below containerd's own, which this VM sets); the runtime handler `runc`; no CNI
    network (the tests' pods use the host's network) and no CDI. Then, as a user would,
    `vgpu install containerd --config-file` on that config adds the handler `vgpu`
    (io.containerd.vgpu.v2 through this checkout's containerd-shim-vgpu-v2, the pod's and
    the container's `vgpu.io/*` annotations passed through) in a drop-in it imports.
    """

    name = "containerd"
    disabled_plugins = tuple(p for p in Containerd.disabled_plugins
                             if p != "io.containerd.grpc.v1.cri")

    def __init__(self, tmp: Path, env: dict[str, str], sandbox_image: str) -> None:
        super().__init__(tmp, env)
        self.namespace = "k8s.io"
        self.sandbox_image = sandbox_image

    def config_text(self) -> str:
        cri = "plugins.\"io.containerd.grpc.v1.cri\""
        return super().config_text() + "\n".join([
            f"[{cri}]",
            f'  sandbox_image = "{self.sandbox_image}"',
            "  restrict_oom_score_adj = true",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            f"  [{cri}.containerd]",
            '    default_runtime_name = "runc"',
            '    snapshotter = "overlayfs"',
            f"  [{cri}.containerd.runtimes.runc]",
            '    runtime_type = "io.containerd.runc.v2"',
            f"  [{cri}.cni]",
            f'    bin_dir = "{self.tmp / "cni-bin"}"',
            f'    conf_dir = "{self.tmp / "cni-conf"}"',
            "",
        ])

    def write_config(self) -> None:
        """The node's config, then `vgpu install containerd` on it (once: a restart keeps
        what is there)."""
        if self.config.exists():
            return
        super().write_config()
        env = clean_env()
        env["PYTHONPATH"] = str(ROOT)
        p = subprocess.run([sys.executable, "-m", "vgpu_cli", "install", "containerd",
                            "--config-file", str(self.config),
                            "--bin-dir", str(self.tmp / "install-bin"),
                            "--lib-dir", str(self.tmp / "install-lib")],
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise AssertionError(f"vgpu install containerd exited {p.returncode}:\n"
                                 f"{p.stdout}{p.stderr}")

    def start(self, timeout: float = 30) -> CriContainerd:
        """Start containerd and wait until CRI answers too (it initialises after the
        rest of containerd does: "server is not initialized yet")."""
        super().start(timeout)
        from support.cri import Cri  # compiles the CRI API: only where CRI is used
        cri = Cri(self.socket, timeout=5)
        try:
            self._wait_ready(lambda: _answers(cri.version), timeout)
        finally:
            cri.close()
        return self

    def import_image(self, archive: Path) -> None:
        """Import an OCI archive into CRI's namespace (unpacked for its snapshotter)."""
        self.ctr("images", "import", str(archive))

    def start_with_images(self, image: str, timeout: float = 30) -> CriContainerd:
        """start(), then import the sandbox image and the tests' image `image` (built
        locally into this containerd's directory: no registry is reachable)."""
        from support.images import build_oci_archive, build_pause_archive
        self.start(timeout)
        self.import_image(build_pause_archive(self.tmp / "pause.tar", self.sandbox_image))
        self.import_image(build_oci_archive(self.tmp / "image.tar", image))
        return self

    def restart(self, timeout: float = 30) -> CriContainerd:
        """Stop containerd alone (SIGTERM; its shims and their containers run on, as in a
        `systemctl restart containerd`) and start it again on the same root and state."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=timeout)
        return self.start(timeout)

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None and self.proc.poll() is None:
            from support.cri import Cri
            cri = Cri(self.socket, timeout=30)
            with contextlib.suppress(Exception):
                cri.remove_all()
            cri.close()
        # Containerd.stop's ctr clean-up would find nothing left; skip its rmtree of
        # the shared k8s.io runc root.
        _Daemon.stop(self, timeout)


class Dockerd(_Daemon):
    """dockerd on a temporary data root and socket, using a given containerd."""

    name = "dockerd"

    def __init__(self, tmp: Path, env: dict[str, str], containerd: Containerd,
                 daemon_json: dict[str, Any]) -> None:
        super().__init__(tmp, env)
        self.socket = tmp / "docker.sock"
        self.data_root = tmp / "data"
        self.exec_root = tmp / "exec"
        self.containerd = containerd
        self.daemon_json = tmp / "daemon.json"
        self.daemon_json.write_text(json.dumps(daemon_json, indent=2))
        self.env["DOCKER_HOST"] = f"unix://{self.socket}"

    @property
    def runc_root(self) -> Path:
        """Where runc keeps the state of dockerd's containers."""
        return self.exec_root / "runtime-runc"

    def start(self, timeout: float = 60) -> Dockerd:
        self._spawn([
            "dockerd", "--data-root", str(self.data_root), "--exec-root", str(self.exec_root),
            "-H", f"unix://{self.socket}", "--pidfile", str(self.tmp / "docker.pid"),
            "--config-file", str(self.daemon_json), "--containerd", str(self.containerd.socket),
            "--iptables=false", "--ip6tables=false", "--bridge=none", "--ip-masq=false",
            "--storage-driver", "overlay2",
        ])

        def ready() -> bool:
            return self.docker("version", check=False, timeout=5).returncode == 0
        self._wait_ready(ready, timeout)
        return self

    def docker(self, *args: str, check: bool = True, timeout: float = 60,
               ) -> subprocess.CompletedProcess[str]:
        cmd = ["docker", *args]
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{cmd} exited {p.returncode}\nstdout:\n{p.stdout}\n"
                                 f"stderr:\n{p.stderr}\ndockerd log:\n{self.log()[-3000:]}")
        return p

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                ids = self.docker("ps", "-aq", check=False, timeout=10).stdout.split()
                if ids:
                    self.docker("rm", "-f", *ids, check=False, timeout=30)
        super().stop(timeout)
