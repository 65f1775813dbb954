# SPDX-License-Identifier: Apache-2.0
"""The domain as the container path sees it: a small interface, and the slice as mounts need it.

The lifecycle service runs inside vgpud and calls the domain directly
(arbiter.slices.arbiter.Arbiter satisfies `Slices`), never through a gRPC stub of itself:
the container code decides what to ask, the domain keeps the slices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from arbiter.model import Policy, Priority, Request, Slice

__all__ = ["Allocated", "SliceView", "Slices", "VGpuView", "view_of"]


class Allocated(Protocol):
    """What an allocation answers: the slice (new, or the one the owner had)."""

    @property
    def slice(self) -> Slice:
        """The granted slice."""
        ...


class Slices(Protocol):
    """What the container path needs of the domain."""

    def defaults(self) -> tuple[int, Priority, Policy]:
        """(compute %, priority, policy) for the request keys a container left out."""
        ...

    def allocate(self, req: Request) -> Allocated:
        """The owner's slice: made now, or the one it holds (idempotent by owner)."""
        ...

    def get(self, slice_id: str = "", owner: str = "") -> Slice:
        """The slice with that id (or owner); NotFoundError otherwise."""
        ...

    def attach(self, slice_id: str, owner: str, pid: int, bundle: str = "") -> Slice:
        """Bind the slice made at create to the container's init (records its identity)."""
        ...

    def release(self, slice_id: str = "", owner: str = "", *, reason: str = "release",
                event: str = "release", pid: int = 0, bundle: str = "",
                asker: bool = False) -> Slice | None:
        """Release; with `asker` only when that container holds it or its holder is gone."""
        ...

    def add_user(self, slice_id: str, pid: int, bundle: str = "") -> Slice:
        """Record a container (its init pid, bundle) as a user of a claim's slice, for
        attribution; the claim keeps holding the slice. Refused for other slices."""
        ...

    def note_libvgpu(self, slice_id: str, libvgpu_version: str) -> None:
        """Record the versioned install whose libvgpu.so the slice's container maps."""
        ...

    def region_dir(self, s: Slice) -> str:
        """Host directory of the slice's region files."""
        ...

    def device_nodes(self) -> Mapping[int, Sequence[str]]:
        """Device node paths of each GPU, by index."""
        ...


@dataclass(frozen=True)
class VGpuView:
    """One vGPU of a slice, as the mounts need it."""

    index: int
    gpu_uuid: str
    region_path: str
    device_nodes: tuple[str, ...]


@dataclass(frozen=True)
class SliceView:
    """A granted slice, as the spec modifiers and the mounts need it."""

    id: str
    owner: str
    region_dir: str
    vgpus: tuple[VGpuView, ...]


def view_of(slices: Slices, s: Slice) -> SliceView:
    """The slice with its region files and device nodes, in vGPU order."""
    region_dir = slices.region_dir(s)
    nodes = slices.device_nodes()
    return SliceView(id=s.id, owner=s.owner, region_dir=region_dir, vgpus=tuple(
        VGpuView(index=i, gpu_uuid=g.gpu_uuid, region_path=f"{region_dir}/vgpu{i}",
                 device_nodes=tuple(nodes.get(g.gpu_index, ())))
        for i, g in enumerate(s.grants)))
