# SPDX-License-Identifier: Apache-2.0
"""What a reader checks before it trusts one of vgpu's files: a list of (field, value).

Each format's list is defined once, in its C header (VGPU_REGION_CHECKS and
VGPU_USAGE_CHECKS in libvgpu/include/vgpu_region.h, VGPU_SCHED_CHECKS and
VGPU_SCHED_REQ_CHECKS in libvgpu/include/vgpu_sched.h), and every C reader applies it
through libvgpu/include/vgpu_checks.h. vgpud keeps each list as data beside the format's
ctypes mirror (region_file.REGION_CHECKS, ...), writes it with `fill` and checks with
`first_problem`;
tests/arbiter/files/test_header_checks.py holds the two lists to one another, field by
field and value by value, so both languages apply the same rules. Which GPU a
scheduling region is for and which slice a .req is are each reader's own check.
"""
from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Callable

__all__ = ["Checks", "field_reader", "fill", "first_problem"]

#: A format's checks, in the order its header lists them: (field, the value it must hold).
Checks = tuple[tuple[str, int], ...]


def field_reader(cls: type[ctypes.Structure], data: bytes | bytearray | memoryview | mmap.mmap,
                 ) -> Callable[[str], int]:
    """read(field) for first_problem: the integer field of a header laid out as cls, read
    from the bytes data (a copy or a mapping; native byte order, as the C side writes)."""
    def read(name: str) -> int:
        field = getattr(cls, name)
        return int.from_bytes(data[field.offset : field.offset + field.size], sys.byteorder)
    return read


def fill(header: object, checks: Checks) -> int:
    """Write every checked field but magic into header (a ctypes mirror); the magic, which
    its creator writes last, once the rest is written."""
    magic = 0
    for field, value in checks:
        if field == "magic":
            magic = value
        else:
            setattr(header, field, value)
    return magic


def first_problem(read: Callable[[str], int], checks: Checks, what: str) -> str | None:
    """Why a header is not a `what` of this version (the first field that does not hold
    its value, read with read(field)), or None when every field does."""
    for field, want in checks:
        got = read(field)
        if got == want:
            continue
        if field == "magic":
            return (f"bad magic 0x{got:08x}, expected 0x{want:08x} "
                    f"(not a {what}, or one still being made)")
        if field == "version":
            return f"layout version {got}, this vgpu reads version {want}"
        if field == "size":
            return f"header size {got}, expected {want}"
        return f"{field.replace('_', ' ')} {got}, expected {want}"
    return None
