# SPDX-License-Identifier: Apache-2.0
"""vgpu-device-plugin as a process of this checkout (`python -m vgpu_k8s.deviceplugin.main`).

Pair it with tests/support/fake_kubelet.FakeKubelet on the same directory: the plugin
registers there, and the fake kubelet makes the device manager's calls on its sockets.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from support.paths import ROOT
from support.process import clean_env

__all__ = ["DevicePlugin"]


class DevicePlugin:
    """One vgpu-device-plugin process with its sockets in `kubelet_dir`, logging to `log`."""

    def __init__(self, kubelet_dir: Path, vgpud_socket: Path, log: Path,
                 memory_unit: str = "64Mi") -> None:
        self.log_path = log
        env = clean_env()
        env["PYTHONPATH"] = str(ROOT)
        env["PYTHONUNBUFFERED"] = "1"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vgpu_k8s.deviceplugin.main", "--kubelet-dir",
                 str(kubelet_dir), "--memory-unit", memory_unit, "--socket", str(vgpud_socket),
                 "--poll-interval", "0.5"], env=env, cwd=ROOT, stdout=out, stderr=out)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        """SIGTERM (the plugin removes its sockets), SIGKILL after 15 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
