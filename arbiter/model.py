# SPDX-License-Identifier: Apache-2.0
"""The typed request/slice model shared by the arbiter, the CLI, the hook and the shim.

Pure data: no I/O. Priorities and policies reuse the region file's enums
(arbiter.files.region_file.Priority/Policy) so a slice's values are written to its region
files unchanged. Conversions to and from the gRPC messages live in
arbiter.convert.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from arbiter.files.region_file import Policy, Priority

__all__ = ["WORKLOAD_LABELS", "Gpu", "Grant", "OwnerKind", "Policy", "Priority", "Request",
           "Slice", "User", "VGpuAsk"]

#: Slice labels that name the Kubernetes workload a slice serves, as whoever asked set
#: them (the hook from its CRI runtime's annotations, the DRA plugin from the claim), by
#: the name metrics and events show them under. A slice outside Kubernetes has none.
WORKLOAD_LABELS = (("namespace", "k8s.vgpu.io/namespace"), ("pod", "k8s.vgpu.io/pod"),
                   ("container", "k8s.vgpu.io/container"))


class OwnerKind:
    """Who holds a slice: decides how the reconciler checks that it still exists."""

    CONTAINER = "container"  # a container id; gone when its init and its cgroup are
    PROCESS = "process"      # a host process (vgpu run); gone when its pid is
    # A DRA ResourceClaim: no container holds it; only an explicit release (its plugin,
    # an operator) frees it, never container liveness.
    CLAIM = "claim"

    ALL = (CONTAINER, PROCESS, CLAIM)


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as the inventory found it."""

    index: int
    uuid: str
    name: str
    memory: int                      # bytes
    minor: int
    device_nodes: tuple[str, ...] = ()  # host paths the hook exposes in the container


@dataclass(frozen=True)
class VGpuAsk:
    """One vGPU of a request: its own memory (bytes) and compute (%), and an optional pin
    (a GPU index or UUID; "" = placement chooses)."""

    memory: int
    compute: int
    device: str = ""


@dataclass(frozen=True)
class Request:
    """A validated request for a slice: `count` vGPUs of `memory` bytes and `compute` %,
    or, when `vgpus` is set, one vGPU per entry with its own amounts (then `memory`,
    `compute` and `devices` are unused and `count` is len(vgpus))."""

    owner: str
    memory: int
    compute: int
    count: int = 1
    priority: Priority = Priority.NORMAL
    policy: Policy = Policy.FIXED
    devices: tuple[str, ...] = ()    # pin: GPU indices or UUIDs, as given
    owner_kind: str = OwnerKind.CONTAINER
    owner_pid: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    bundle: str = ""                 # the container's OCI bundle, as its runtime names it
    vgpus: tuple[VGpuAsk, ...] = ()  # per-vGPU amounts (a DRA claim)

    def asks(self) -> tuple[VGpuAsk, ...]:
        """The vGPUs asked for, in vGPU order: `vgpus`, else `count` equal asks (the
        legacy pin `devices` is a set the placement chooses from, not one per vGPU)."""
        if self.vgpus:
            return self.vgpus
        return tuple(VGpuAsk(self.memory, self.compute) for _ in range(max(self.count, 0)))


@dataclass(frozen=True)
class Grant:
    """One vGPU of a slice: a share of one physical GPU."""

    gpu_index: int
    gpu_uuid: str
    memory: int    # bytes
    compute: int   # percent


@dataclass(frozen=True)
class Slice:
    """A granted slice. `grants[i]` is the slice's vGPU i (/dev/vgpu<i>)."""

    id: str
    owner: str
    grants: tuple[Grant, ...]
    priority: Priority = Priority.NORMAL
    policy: Policy = Policy.FIXED
    owner_kind: str = OwnerKind.CONTAINER
    owner_pid: int = 0               # container init (0: not started yet) or the process
    created_ms: int = 0
    labels: tuple[tuple[str, str], ...] = field(default=())
    # Who holds it, as the host saw at prestart (arbiter.slices.identity): the owner pid's
    # /proc start time, the init's cgroup (`<controllers>:<path>`), the OCI bundle.
    owner_start: int = 0
    owner_cgroup: str = ""
    owner_bundle: str = ""
    # The versioned install (arbiter.install.versions, `<version>-<hash>`) whose libvgpu.so the
    # container mapped, recorded at prestart; "" when an older vgpud made the slice.
    libvgpu_version: str = ""

    def workload(self) -> dict[str, str]:
        """The Kubernetes workload it serves (WORKLOAD_LABELS): name -> value, "" unset."""
        have = dict(self.labels)
        return {name: have.get(key, "") for name, key in WORKLOAD_LABELS}


@dataclass(frozen=True)
class User:
    """A container that uses a claim's slice (recorded for attribution, like a holder):
    its init pid, that pid's /proc start time, its cgroup and its OCI bundle."""

    slice_id: str
    pid: int
    start: int = 0
    cgroup: str = ""
    bundle: str = ""
