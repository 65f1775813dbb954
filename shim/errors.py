# SPDX-License-Identifier: Apache-2.0
"""Errors raised by the shim package; each message is one user-facing line."""
from __future__ import annotations

from pathlib import Path

from arbiter.errors import VgpuError

__all__ = ["AllocateError", "HookProgramError", "InstallError", "ShimError", "SpecError"]


class ShimError(VgpuError):
    """Base of the shim's errors."""


class SpecError(ShimError):
    """A bundle's config.json that cannot be read, parsed or written back."""

    def __init__(self, path: Path, verb: str, reason: str) -> None:
        self.path = path
        self.verb = verb
        self.reason = reason
        super().__init__(f"failed to {verb} {path}: {reason}")


class HookProgramError(ShimError, FileNotFoundError):
    """The compiled vgpu-hook that a modified spec must name is not built or shipped."""

    def __init__(self) -> None:
        super().__init__("failed to add the vgpu hooks: the compiled vgpu-hook is neither in "
                         "arbiter/native/bin nor in build/bin (build it with make)")


class AllocateError(ShimError):
    """vgpud refused or could not be asked for the container's slice."""

    def __init__(self, container_id: str, reason: str) -> None:
        self.container_id = container_id
        self.reason = reason
        super().__init__(reason)


class InstallError(ShimError):
    """A runtime config file that `vgpu install` cannot read, understand or write."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"failed to configure {path}: {reason}")
