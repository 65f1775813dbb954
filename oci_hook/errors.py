# SPDX-License-Identifier: Apache-2.0
"""Errors raised by the hook; each message is the one line the engine shows the user."""
from __future__ import annotations

from arbiter.errors import VgpuError

__all__ = ["HookError", "MountError", "RequestError", "StateError", "VgpudError"]

_VALUE_MAX = 64  # longer values are cut in messages: the line must stay readable


class HookError(VgpuError):
    """Base of every error the hook raises on purpose."""


class RequestError(HookError, ValueError):
    """A request key with a value vgpu cannot accept: ``vgpu.io/memory=lots: not a memory ...``."""

    def __init__(self, key: str, value: str | None, reason: str) -> None:
        self.key = key
        self.value = value
        self.reason = reason
        shown = value if value is None or len(value) <= _VALUE_MAX else value[:_VALUE_MAX] + "..."
        where = key if shown is None else f"{key}={shown}"
        # One line, whatever the value holds: the engine prints it as the container's error.
        super().__init__(" ".join(f"{where}: {reason}".split()))


class StateError(HookError, ValueError):
    """The OCI state on stdin or the bundle's config.json cannot be read or is not one."""

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"failed to read {what}: {reason}")


class VgpudError(HookError):
    """vgpud refused the request, or did not answer within the bounded wait.

    `unavailable`: vgpud did not answer (down, or not up yet); `not_found`: it has no
    such slice.
    """

    def __init__(self, verb: str, reason: str, *, unavailable: bool = False,
                 not_found: bool = False) -> None:
        self.verb = verb
        self.reason = reason
        self.unavailable = unavailable
        self.not_found = not_found
        super().__init__(f"failed to {verb}: {reason}")


class MountError(HookError, OSError):
    """A path inside the container's rootfs cannot be resolved, made or mounted onto."""

    def __init__(self, verb: str, path: str, reason: str) -> None:
        self.verb = verb
        self.path = path
        self.reason = reason
        super().__init__(f"failed to {verb} {path}: {reason}")
