# SPDX-License-Identifier: Apache-2.0
"""Errors of the hook's decisions; each message is the one line the engine shows the user."""
from __future__ import annotations

from arbiter.errors import VgpuError

__all__ = ["HookError", "MountError", "RequestError", "SliceError", "SourceError", "StateError"]

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


class SourceError(HookError, PermissionError):
    """A request key from a source the config does not trust for it (oci_hook.trust):
    ``vgpu.io/priority=high from the pod's annotations is not allowed in namespace ...``."""

    def __init__(self, name: str, value: str, where: str, reason: str) -> None:
        self.name = name
        self.value = value
        self.where = where
        self.reason = reason
        shown = value if len(value) <= _VALUE_MAX else value[:_VALUE_MAX] + "..."
        super().__init__(" ".join(f"{name}={shown} from {where} {reason}".split()))


class StateError(HookError, ValueError):
    """The OCI state on stdin or the bundle's config.json cannot be read or is not one."""

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"failed to read {what}: {reason}")


class MountError(HookError, OSError):
    """A file the mount plan needs is missing or cannot be named."""

    def __init__(self, verb: str, path: str, reason: str) -> None:
        self.verb = verb
        self.path = path
        self.reason = reason
        super().__init__(f"failed to {verb} {path}: {reason}")


class SliceError(HookError):
    """vgpud's domain refused or failed the container's slice (no room, held by another)."""

    def __init__(self, verb: str, reason: str) -> None:
        self.verb = verb
        self.reason = reason
        super().__init__(f"failed to {verb}: {reason}")
