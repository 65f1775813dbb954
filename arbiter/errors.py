# SPDX-License-Identifier: Apache-2.0
"""Errors raised by the arbiter package; each message is one user-facing line."""
from __future__ import annotations

from pathlib import Path

__all__ = [
    "ConfigError",
    "InventoryError",
    "LibraryMismatchError",
    "LibraryNotFoundError",
    "NotFoundError",
    "QuantityError",
    "RegionError",
    "RequestError",
    "SchedError",
    "ShippedFileNotFoundError",
    "VgpuError",
]


class VgpuError(Exception):
    """Base of every error vgpu raises on purpose."""


class QuantityError(VgpuError, ValueError):
    """A memory or compute quantity that does not follow the accepted forms."""

    def __init__(self, kind: str, value: str, forms: str) -> None:
        self.kind = kind
        self.value = value
        self.forms = forms
        super().__init__(f"invalid {kind} quantity {value!r}: expected {forms}")


class RegionError(VgpuError):
    """A slice region file that cannot be made, opened, updated or trusted."""

    noun = "region file"

    def __init__(self, path: str | Path, verb: str, reason: str, *, busy: bool = False) -> None:
        self.path = Path(path)
        self.verb = verb
        self.reason = reason
        #: A tenant's file lease held the file (arbiter.files.leases): not opened now, worth a
        #: retry.
        self.busy = busy
        super().__init__(f"failed to {verb} {self.noun} {self.path}: {reason}")


class SchedError(RegionError):
    """A GPU's scheduling region file that cannot be made, opened or trusted."""

    noun = "scheduling region"


class LibraryNotFoundError(VgpuError, FileNotFoundError):
    """A library vgpu builds (libvgpu.so, libvgpu-fileops.so) is neither in the installed
    package nor in a built source checkout."""

    def __init__(self, candidates: list[Path]) -> None:
        self.candidates = candidates
        where = " nor ".join(str(p) for p in candidates)
        name = candidates[0].name if candidates else "libvgpu.so"
        super().__init__(
            f"failed to find {name}: neither {where} exists "
            "(install the package with `pip install .`, or run `make` in the checkout)"
        )


class LibraryMismatchError(VgpuError, OSError):
    """A library vgpu builds is there but from another build: its interface differs."""

    def __init__(self, path: Path, found: str, expected: str) -> None:
        self.path = path
        super().__init__(f"{path} is not this vgpu's: {found}; expected {expected} "
                         "(run `make` in the checkout, or install the package again)")


class ShippedFileNotFoundError(VgpuError, FileNotFoundError):
    """A file vgpu ships (configs/...) is neither in the installed package nor in the checkout."""

    def __init__(self, name: str, candidates: list[Path]) -> None:
        self.name = name
        self.candidates = candidates
        where = " nor ".join(str(p) for p in candidates)
        super().__init__(f"failed to find the shipped file {name}: neither {where} exists "
                         "(a broken installation: reinstall vgpu)")


class ConfigError(VgpuError, ValueError):
    """A config file that cannot be read or breaks the schema; names the key, line and why."""

    def __init__(self, path: str | Path | None, reason: str, *, key: str = "",
                 line: int | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.reason = reason
        self.key = key
        self.line = line
        where = "".join(
            part for part in (
                f"line {line}: " if line is not None else "",
                f"{key}: " if key else "",
            )
        )
        source = str(self.path) if self.path is not None else "(built-in defaults)"
        super().__init__(f"failed to load config {source}: {where}{reason}")


class InventoryError(VgpuError):
    """NVML cannot be loaded or queried, or the config names GPUs that do not exist."""

    def __init__(self, verb: str, reason: str) -> None:
        self.verb = verb
        self.reason = reason
        super().__init__(f"failed to {verb}: {reason}")


class RequestError(VgpuError, ValueError):
    """An API request with a field the arbiter cannot accept; names the field, value and why."""

    def __init__(self, verb: str, field: str, value: object, reason: str) -> None:
        self.verb = verb
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"failed to {verb}: {field} {value!r} {reason}")


class NotFoundError(VgpuError, LookupError):
    """No slice has the given id or owner."""

    def __init__(self, verb: str, what: str) -> None:
        self.verb = verb
        self.what = what
        super().__init__(f"failed to {verb}: no slice {what}")


# --- placement and state errors (arbiter/slices/placement.py, arbiter/slices/store.py) ---

__all__ += ["BadPinError", "CountError", "NoCapacityError", "StateError"]


def _quantity(nbytes: int) -> str:
    """Memory for a message: exact form from format_memory, ``0`` for none, else bytes."""
    # Imported here: arbiter.quantity imports this module (QuantityError).
    from arbiter.quantity import format_memory

    if nbytes <= 0:
        return "0"
    try:
        return format_memory(nbytes)
    except QuantityError:
        return f"{nbytes} bytes"


class NoCapacityError(VgpuError):
    """No set of GPUs can hold a request (or an update) without over-committing one.

    Attributes say what was asked (per vGPU), how many distinct GPUs were needed, how
    many could take it, and the most memory and compute free on any eligible GPU (each
    maximum on its own GPU). `reason` replaces the generated cause where the caller
    knows better (an update of one slice on its own GPUs).
    """

    def __init__(self, *, memory: int, compute: int, count: int = 1, fitting: int = 0,
                 free_memory: int = 0, free_compute: int = 0, pinned: bool = False,
                 preemption_would_help: bool = False, slice_id: str = "",
                 reason: str = "") -> None:
        self.memory = memory
        self.compute = compute
        self.count = count
        self.fitting = fitting
        self.free_memory = free_memory
        self.free_compute = free_compute
        self.pinned = pinned
        self.preemption_would_help = preemption_would_help
        self.slice_id = slice_id
        if reason:
            super().__init__(reason)
            return
        asked = f"{_quantity(memory)} memory and {compute}% compute"
        if count > 1:
            asked = f"{count} x {asked}"
        which = "pinned GPU" if pinned else "GPU"
        if fitting == 0:
            head = f"no {which} has room for {asked}"
            most = f"the most free on any {which} is"
        else:
            gpus = "GPU has" if fitting == 1 else "GPUs have"
            head = (f"only {fitting} {'pinned ' if pinned else ''}{gpus} room for {asked} "
                    f"(each vGPU needs its own GPU)")
            most = f"the most free on any other {which} is"
        msg = (f"{head}: {most} {_quantity(free_memory)} memory and "
               f"{max(free_compute, 0)}% compute")
        if preemption_would_help:
            msg += ("; evicting low priority slices would make room, "
                    "but preemption is disabled in the config")
        super().__init__(msg)


class BadPinError(VgpuError, ValueError):
    """A device pin (vgpu.io/devices) names a GPU that does not exist, or one GPU twice."""

    def __init__(self, pin: str, have: tuple[int, ...], reason: str = "", *,
                 key: str = "vgpu.io/devices") -> None:
        self.pin = pin
        self.have = have
        self.reason = reason or "does not exist"
        self.key = key  # the request key that names it (vgpus[<i>].device over gRPC)
        super().__init__(
            f"{key}: GPU {pin} {self.reason} (have {_index_ranges(have)})"
        )


class CountError(VgpuError, ValueError):
    """vgpu.io/count asks for fewer than one vGPU, or more than there are (pinned) GPUs."""

    def __init__(self, count: int, available: int, *, pinned: bool = False) -> None:
        self.count = count
        self.available = available
        self.pinned = pinned
        if count < 1:
            msg = f"vgpu.io/count: {count} is not a positive number of vGPUs"
        elif pinned:
            msg = (f"vgpu.io/count: {count} vGPUs need {count} distinct GPUs "
                   f"but vgpu.io/devices names only {available}")
        else:
            msg = (f"vgpu.io/count: {count} vGPUs need {count} distinct GPUs "
                   f"but this host has {available}")
        super().__init__(msg)


class StateError(VgpuError):
    """The slice database refused a change or cannot be opened, migrated or trusted.

    `code` says which, for mapping to an API status: CONFLICT (an owner or id already
    holds a slice), NOT_FOUND, SCHEMA (a database from a newer vgpud, or a failed
    migration) or IO (SQLite itself failed).
    """

    CONFLICT = "conflict"
    NOT_FOUND = "not_found"
    SCHEMA = "schema"
    IO = "io"

    def __init__(self, verb: str, what: str, reason: str, *, code: str = "io",
                 path: str | Path | None = None) -> None:
        self.verb = verb
        self.what = what
        self.reason = reason
        self.code = code
        self.path = Path(path) if path is not None else None
        super().__init__(f"failed to {verb} {what}: {reason}")


def _index_ranges(indices: tuple[int, ...]) -> str:
    """``0-1,3`` for (0, 1, 3); ``none`` for ()."""
    if not indices:
        return "none"
    parts: list[str] = []
    ordered = sorted(set(indices))
    start = prev = ordered[0]
    for i in [*ordered[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)
