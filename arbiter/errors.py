# SPDX-License-Identifier: Apache-2.0
"""Errors raised by the arbiter package; each message is one user-facing line."""
from __future__ import annotations

from pathlib import Path

__all__ = ["LibraryNotFoundError", "QuantityError", "RegionError", "VgpuError"]


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

    def __init__(self, path: str | Path, verb: str, reason: str) -> None:
        self.path = Path(path)
        self.verb = verb
        self.reason = reason
        super().__init__(f"failed to {verb} region file {self.path}: {reason}")


class LibraryNotFoundError(VgpuError, FileNotFoundError):
    """libvgpu.so is neither in the installed package nor in a built source checkout."""

    def __init__(self, candidates: list[Path]) -> None:
        self.candidates = candidates
        where = " nor ".join(str(p) for p in candidates)
        super().__init__(
            f"failed to find libvgpu.so: neither {where} exists "
            "(install the package with `pip install .`, or run `make` in the checkout)"
        )
