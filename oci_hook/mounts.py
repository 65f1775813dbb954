# SPDX-License-Identifier: Apache-2.0
"""The mount plan: what gives a container its slice, decided inside vgpud (pure).

The compiled vgpu-hook (oci_hook/native/vg_mount.c) applies it: it enters the container's
mount namespace and resolves every target inside the rootfs with openat2
(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS), so a symlink the image planted never leads
out of it. Here is only the decision: which host file goes where, read-only or not.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from arbiter.files.region_file import USAGE_SUFFIX, usage_path_of
from arbiter.files.sched_files import SCHED_DIR_NAME, slice_key_of
from oci_hook.errors import MountError

if TYPE_CHECKING:
    from oci_hook.slices import SliceView, VGpuView

__all__ = [
    "CONTAINER_LIBVGPU",
    "CONTAINER_PRELOAD",
    "CONTAINER_SCHED_DIR",
    "PRELOAD_HOST_NAME",
    "Mount",
    "Plan",
    "plan_mounts",
    "preload_plan",
    "sched_files",
    "slice_env",
    "slice_mounts",
]

#: Where libvgpu.so appears in the container, and the line ld.so.preload gets.
CONTAINER_LIBVGPU = "/usr/lib/vgpu/libvgpu.so"
#: Where libvgpu in a container looks for its GPUs' scheduling regions (vgpu_sched.h).
CONTAINER_SCHED_DIR = "/run/vgpu/sched"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
#: The generated ld.so.preload, in the bundle (the engine removes it with the bundle;
#: the slice's region dir is vgpud's, whose reconciler removes files it did not make).
PRELOAD_HOST_NAME = "vgpu-ld.so.preload"


@dataclass(frozen=True)
class Mount:
    """One bind mount: a host path onto a path inside the container."""

    source: str
    target: str
    read_only: bool = True
    device: bool = False      # a device node: keep it usable (no nodev)
    executable: bool = False  # a library the loader maps (no noexec)


@dataclass(frozen=True)
class Plan:
    """Everything vgpu-hook does in the container's mount namespace, in order."""

    rootfs: str
    mounts: tuple[Mount, ...]
    preload_host: str = ""      # host file to write the generated ld.so.preload to
    preload_line: str = CONTAINER_LIBVGPU

    def to_fields(self) -> list[tuple[str, str]]:
        """The plan as vgpud's lifecycle socket answers it to the compiled vgpu-hook.

        Data-driven like the plan itself: each `mount=` field starts one mount, its value
        the comma-separated exceptions to read-only/nodev/noexec (`rw`, `dev`, `exec`),
        followed by its `source=` and `target=`. vgpu-hook applies them in order.
        """
        fields = [("rootfs", self.rootfs), ("preload_host", self.preload_host),
                  ("preload_line", self.preload_line)]
        for m in self.mounts:
            opts = [o for o, on in (("rw", not m.read_only), ("dev", m.device),
                                    ("exec", m.executable)) if on]
            fields += [("mount", ",".join(opts)), ("source", m.source), ("target", m.target)]
        return fields


def sched_files(s: SliceView, v: VGpuView) -> tuple[str, str]:
    """The scheduling files of a slice's vGPU: its GPU's (the broker's) and the slice's own
    requests there. vgpud keeps them in <run_dir>/sched, beside <run_dir>/slices/<id>/vgpu<i>.

    Both must be there: a container is refused rather than started unenforced."""
    if not v.gpu_uuid or "/" in v.gpu_uuid or v.gpu_uuid.startswith("."):
        raise MountError("find", f"the scheduling file of vGPU {v.index}",
                         f"GPU UUID {v.gpu_uuid!r} cannot name a file")
    root = Path(v.region_path).parent.parent.parent / SCHED_DIR_NAME
    gpu = root / v.gpu_uuid
    req = root / f"{v.gpu_uuid}.{slice_key_of(s.id, v.index):016x}.req"
    for path in (gpu, req):
        if not path.is_file():
            raise MountError("find", str(path), "missing (vgpud makes it with the slice)")
    return str(gpu), str(req)


def slice_env(s: SliceView) -> tuple[tuple[str, str], ...]:
    """The env that names the slice's GPUs, in vGPU order (the runtime path's spec
    modifier and the CDI spec both set it)."""
    visible = ",".join(v.gpu_uuid for v in s.vgpus)
    return (("CUDA_VISIBLE_DEVICES", visible), ("NVIDIA_VISIBLE_DEVICES", visible))


def slice_mounts(s: SliceView, *, libvgpu: Path) -> tuple[Mount, ...]:
    """The files that give a container slice `s`: libvgpu, /dev/vgpu<i> and its usage,
    the GPUs' scheduling files, the GPUs' device nodes. One list for both deliveries:
    vgpu-hook mounts it (plan_mounts) and a CDI spec carries it (oci_hook.cdi)."""
    mounts = [Mount(str(libvgpu), CONTAINER_LIBVGPU, executable=True)]
    for v in s.vgpus:
        # The limits and the slice's identity: read-only. Its usage is the slice's own:
        # libvgpu in the container writes it (and nobody trusts it for anything).
        mounts.append(Mount(v.region_path, f"/dev/vgpu{v.index}"))
        mounts.append(Mount(str(usage_path_of(v.region_path)), f"/dev/vgpu{v.index}{USAGE_SUFFIX}",
                            read_only=False))
    for v in s.vgpus:
        # The GPU's scheduling file is the broker's: read-only here (a futex wait on its
        # grant word only reads). The slice's .req is its own: nobody else mounts it.
        gpu, req = sched_files(s, v)
        mounts.append(Mount(gpu, f"{CONTAINER_SCHED_DIR}/{v.gpu_uuid}"))
        mounts.append(Mount(req, f"{CONTAINER_SCHED_DIR}/{Path(req).name}", read_only=False))
    seen: set[str] = set()
    for v in s.vgpus:
        for node in v.device_nodes:
            if node not in seen:
                seen.add(node)
                mounts.append(Mount(node, node, read_only=False, device=True))
    return tuple(mounts)


def preload_plan(*, rootfs: Path, preload_host: Path, mounts: tuple[Mount, ...] = ()) -> Plan:
    """`mounts`, then the generated /etc/ld.so.preload (last: it names the library that
    the mounts, or the engine through CDI, put in place)."""
    return Plan(rootfs=str(rootfs), mounts=(*mounts, Mount(str(preload_host), CONTAINER_PRELOAD)),
                preload_host=str(preload_host))


def plan_mounts(s: SliceView, *, rootfs: Path, libvgpu: Path, preload_host: Path) -> Plan:
    """The mounts that give a container slice `s`: libvgpu, /dev/vgpu<i>, the GPUs' device
    nodes, then /etc/ld.so.preload (last: it names the library mounted first)."""
    return preload_plan(rootfs=rootfs, preload_host=preload_host,
                        mounts=slice_mounts(s, libvgpu=libvgpu))
