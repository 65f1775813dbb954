# SPDX-License-Identifier: Apache-2.0
"""What `vgpu` prints: tables, the smi view and JSON shapes, as pure functions of
vgpud's messages (any object with the proto's fields), testable without a daemon."""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from arbiter.errors import VgpuError
from arbiter.quantity import format_memory

__all__ = [
    "POLICIES",
    "PRIORITIES",
    "device_to_dict",
    "dump_json",
    "format_bytes",
    "policy_word",
    "priority_word",
    "render_devices",
    "render_slices",
    "render_smi",
    "render_table",
    "short_owner",
    "slice_to_dict",
    "vgpu_to_dict",
]

#: The proto enums' words in value order (value 0 is "unspecified").
PRIORITIES = ("low", "normal", "high")
POLICIES = ("fixed", "burst")
_KiB, _MiB, _GiB, _TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


def format_bytes(nbytes: int) -> str:
    """Return a short size for a table: exact (``1536Mi``) when short, else ``11.8Mi``."""
    if nbytes <= 0:
        return "0"
    try:
        exact = format_memory(nbytes)
    except VgpuError:
        exact = ""
    if exact and len(exact.rstrip("KMGTi")) <= 4:
        return exact
    for unit, size in (("Ti", _TiB), ("Gi", _GiB), ("Mi", _MiB), ("Ki", _KiB)):
        if nbytes >= size:
            return f"{nbytes / size:.1f}{unit}"
    return f"{nbytes}B"


def short_owner(owner: str) -> str:
    """Shorten a container id the way `docker ps` does (12 hex digits); keep other owners."""
    bare = owner.removeprefix("sha256:")
    if len(bare) > 12 and all(c in "0123456789abcdef" for c in bare):
        return bare[:12]
    return owner


def owner_cell(s: Any) -> str:
    """The OWNER column: a container's short id; other kinds say what they are
    (`claim:<uid>` for a DRA claim's slice, which no container holds)."""
    if s.owner_kind == "claim":
        return f"claim:{s.owner}"
    return short_owner(s.owner)


def _enum_word(value: int, words: Sequence[str]) -> str:
    """Proto enum value (0 = unspecified, then words in order) -> lowercase word."""
    return words[value - 1] if 1 <= value <= len(words) else "default"


def priority_word(value: int) -> str:
    """Proto Priority -> ``low``/``normal``/``high``."""
    return _enum_word(value, PRIORITIES)


def policy_word(value: int) -> str:
    """Proto Policy -> ``fixed``/``burst``."""
    return _enum_word(value, POLICIES)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                 right: Sequence[int] = ()) -> str:
    """Render rows as aligned columns under headers (docker-style), right-aligning `right`."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(widths[i]) if i in right else c.ljust(widths[i])
               for i, c in enumerate(cells)]
        return "   ".join(out).rstrip()
    return "\n".join([line(headers), *(line(r) for r in rows)])


# ---- JSON shapes (plain ints and words, not protobuf's JSON mapping) ---------

def vgpu_to_dict(v: Any) -> dict[str, Any]:
    """One vGPU of a slice as a JSON object."""
    return {
        "index": v.index,
        "gpu_index": v.gpu_index,
        "gpu_uuid": v.gpu_uuid,
        "memory_bytes": v.memory_bytes,
        "memory_used_bytes": v.memory_used_bytes,
        "compute_percent": v.compute_percent,
        "region_path": v.region_path,
        "device_nodes": list(v.device_nodes),
    }


def slice_to_dict(s: Any) -> dict[str, Any]:
    """A Slice message as a JSON object (full owner, enum words, byte counts as ints)."""
    return {
        "id": s.id,
        "owner": s.owner,
        "owner_kind": s.owner_kind,
        "owner_pid": s.owner_pid,
        "priority": priority_word(s.priority),
        "policy": policy_word(s.policy),
        "region_dir": s.region_dir,
        "created_unix_ms": s.created_unix_ms,
        "labels": dict(sorted(s.labels.items())),
        "libvgpu_version": s.libvgpu_version,
        "vgpus": [vgpu_to_dict(v) for v in s.vgpus],
    }


def device_to_dict(d: Any) -> dict[str, Any]:
    """A Device message as a JSON object."""
    return {
        "index": d.index,
        "uuid": d.uuid,
        "name": d.name,
        "minor": d.minor,
        "memory_total_bytes": d.memory_total_bytes,
        "memory_allocated_bytes": d.memory_allocated_bytes,
        "memory_used_bytes": d.memory_used_bytes,
        "compute_allocated_percent": d.compute_allocated_percent,
        "utilization_percent": d.utilization_percent,
        "slices": d.slices,
        "device_nodes": list(d.device_nodes),
        "driver_version": d.driver_version,
        "cuda_version": d.cuda_version,
        "unhealthy": d.unhealthy,
        "broker": d.broker,
    }


def dump_json(value: object) -> str:
    """The CLI's JSON output: indented, stable key order as built."""
    return json.dumps(value, indent=2)


# ---- tables -----------------------------------------------------------------

def render_devices(devices: Sequence[Any]) -> str:
    """`vgpu devices`: one row per GPU (DRIVER: NVML's driver version, "-" if unknown)."""
    rows = [[str(d.index), d.uuid, d.name, format_bytes(d.memory_total_bytes),
             format_bytes(d.memory_allocated_bytes), format_bytes(d.memory_used_bytes),
             f"{d.compute_allocated_percent}%", str(d.slices), d.driver_version or "-"]
            for d in devices]
    return render_table(["GPU", "UUID", "NAME", "MEMORY", "ALLOCATED", "USED", "COMPUTE",
                         "SLICES", "DRIVER"], rows, right=(0, 3, 4, 5, 6, 7))


def render_slices(slices: Sequence[Any]) -> str:
    """`vgpu ls`: one row per vGPU; a multi-GPU slice's later rows leave the slice columns blank."""
    rows: list[list[str]] = []
    for s in slices:
        head = [s.id, owner_cell(s), priority_word(s.priority), policy_word(s.policy)]
        vgpus = list(s.vgpus) or [None]
        for i, v in enumerate(vgpus):
            cells = head if i == 0 else [""] * len(head)
            if v is None:
                rows.append([*cells, "-", "-", "-", "-", libvgpu_cell(s) if i == 0 else ""])
                continue
            rows.append([*cells, str(v.index), str(v.gpu_index),
                         f"{format_bytes(v.memory_used_bytes)} / {format_bytes(v.memory_bytes)}",
                         f"{v.compute_percent}%", libvgpu_cell(s) if i == 0 else ""])
    return render_table(["SLICE", "OWNER", "PRIORITY", "POLICY", "VGPU", "GPU", "MEMORY",
                         "COMPUTE", "LIBVGPU"], rows, right=(4, 5, 7))


def libvgpu_cell(s: Any) -> str:
    """The LIBVGPU column: the version of the libvgpu.so the slice's container maps (its
    versioned install, `<version>-<hash>`, shown by version); `-` for a slice an older
    vgpud made, which recorded none (docs/upgrading.md)."""
    name = str(s.libvgpu_version)
    return name.rsplit("-", 1)[0] if name else "-"


def _bar(used: int, limit: int, width: int = 10) -> str:
    if limit <= 0:
        return "[" + " " * width + "]"
    filled = min(width, round(width * used / limit))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _pct(used: int, limit: int) -> str:
    return f"{100 * used / limit:.0f}%" if limit > 0 else "-"


def render_smi(devices: Sequence[Any], slices: Sequence[Any], version: str = "",
               width: int = 96) -> str:
    """`vgpu smi`: an nvidia-smi-like box per GPU with its slices under it (<= width columns)."""
    border = "+" + "-" * (width - 2) + "+"
    double = "+" + "=" * (width - 2) + "+"

    def boxed(text: str) -> str:
        inner = width - 4
        if len(text) > inner:
            text = text[: inner - 3] + "..."
        return "| " + text.ljust(inner) + " |"

    now = time.strftime("%a %b %d %H:%M:%S %Y")
    out = [now, border]
    title = f"vgpu smi    vgpud {version or '?'}"
    summary = f"{len(devices)} GPU{'s' * (len(devices) != 1)}   " \
              f"{len(slices)} slice{'s' * (len(slices) != 1)}"
    out.append(boxed(title + summary.rjust(width - 4 - len(title))))
    by_gpu: dict[int, list[tuple[Any, Any]]] = {}
    for s in slices:
        for v in s.vgpus:
            by_gpu.setdefault(v.gpu_index, []).append((s, v))
    # Slice rows: id, owner, priority/policy, memory used/limit with a bar, compute share.
    cols = (("Slice", 14), ("Owner", 14), ("Prio/Policy", 13), ("Memory used / limit", 31),
            ("Compute", 8))
    for d in devices:
        out.append(double)  # closes the block above
        out.append(boxed(f"GPU {d.index}  {d.name}".ljust(40) + d.uuid))
        mem = (f"Memory {format_bytes(d.memory_used_bytes)} used / "
               f"{format_bytes(d.memory_allocated_bytes)} allocated / "
               f"{format_bytes(d.memory_total_bytes)}")
        comp = (f"Compute {d.utilization_percent}% used / "
                f"{d.compute_allocated_percent}% allocated")
        out.append(boxed(mem + "    " + comp))
        out.append(boxed(f"{_bar(d.memory_allocated_bytes, d.memory_total_bytes, 30)} "
                         f"memory allocated {_pct(d.memory_allocated_bytes, d.memory_total_bytes)}"
                         f"   slices {d.slices}"))
        if d.broker:
            out.append(boxed(f"BROKER {d.broker}"))
        out.append(border)
        members = by_gpu.get(d.index, [])
        if not members:
            out.append(boxed("no slices"))
        else:
            out.append(boxed(" ".join(name.ljust(w) for name, w in cols).rstrip()))
            for s, v in members:
                memory = (f"{format_bytes(v.memory_used_bytes):>7} / "
                          f"{format_bytes(v.memory_bytes):<7} "
                          f"{_bar(v.memory_used_bytes, v.memory_bytes)}")
                owner = owner_cell(s)
                if len(owner) > 14:
                    owner = owner[:13] + "~"
                cells = (s.id[:14], owner,
                         f"{priority_word(s.priority)}/{policy_word(s.policy)}", memory,
                         f"{v.compute_percent}%")
                out.append(boxed(" ".join(c.ljust(w) for c, (_, w) in zip(cells, cols,
                                                                          strict=True)).rstrip()))
    if not devices:
        out.append(border)
        out.append(boxed("no GPUs"))
    out.append(border)
    return "\n".join(out)
