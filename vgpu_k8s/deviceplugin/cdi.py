# SPDX-License-Identifier: Apache-2.0
"""Allocate's answer as CDI devices (`vgpu-device-plugin --cdi`), for engines with CDI.

containerd >= 1.7 and CRI-O apply the CDI devices the kubelet passes them (CRI field
CDIDevices, filled from ContainerAllocateResponse.cdi_devices), with no runtime class:
containerd's default handler passes no container annotation on, so the request travels
in the devices themselves. Each answer (memory on a GPU, or a compute share) becomes one
device of kind `vgpu.io/vgpu` whose spec (oci_hook.cdi.request_spec) adds vgpu-hook with
the keys as arguments; the memory device's hook makes and mounts the slice, as on the
runtime path, and releases it at poststop. The name follows from the keys, so each spec
is written once, at the first Allocate that needs it, and serves every later one.

Beside ours, NVIDIA's CDI device of the GPU (oci_hook.nvidia) where the toolkit wrote a
spec for it: the engine then adds the driver's libraries and the GPU's nodes.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from oci_hook import cdi, nvidia
from vgpu_k8s.deviceplugin.allocate import DEVICES
from vgpu_k8s.deviceplugin.gpus import Gpu

__all__ = ["CdiAnswer"]


class CdiAnswer:
    """The CDI device IDs for one container's annotations of one resource."""

    def __init__(self, cdi_dir: Path, paths: Callable[[], Mapping[str, str]],
                 gpus: Callable[[], Sequence[Gpu]], nvidia_dirs: Sequence[Path] = ()) -> None:
        self.cdi_dir = cdi_dir
        self._paths = paths
        self._gpus = gpus
        self.nvidia_dirs = tuple(nvidia_dirs)
        self._lock = threading.Lock()

    def devices(self, keys: Mapping[str, str]) -> list[str]:
        """Write (when missing or different) the spec of the device that carries `keys` and
        return its ID, then NVIDIA's for the GPU the keys name. VgpuError (one line) when
        vgpud does not say where vgpu-hook is or the spec cannot be written."""
        if not keys:
            return []
        paths = self._paths()
        hook = paths.get("hook")
        if not hook:
            raise cdi.CdiError("write", "the device plugin's CDI spec",
                               "vgpud does not say where vgpu-hook is (its Health paths)")
        hook_env = {"VGPU_SOCKET": paths.get("socket", "")}
        if paths.get("config"):
            hook_env["VGPU_CONFIG"] = paths["config"]
        gpu = next((g for g in self._gpus() if g.uuid == keys.get(DEVICES)), None)
        spec = cdi.request_spec(keys, hook=Path(hook), hook_env=hook_env,
                                device_nodes=gpu.device_nodes if gpu else ())
        with self._lock:
            path = cdi.spec_path(self.cdi_dir, cdi.request_device(keys), cdi.REQUEST_KIND)
            try:
                same = cdi.spec_bytes(spec) == path.read_bytes()
            except OSError:
                same = False
            if not same:
                cdi.write_spec(self.cdi_dir, cdi.request_device(keys), spec)
        ids = [cdi.request_device_id(keys)]
        if gpu is not None and self.nvidia_dirs:
            ids += nvidia.cdi_devices(nvidia.spec_names(self.nvidia_dirs), [(gpu.index, gpu.uuid)])
        return ids
