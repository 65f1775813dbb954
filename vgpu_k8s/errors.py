# SPDX-License-Identifier: Apache-2.0
"""Errors raised by vgpu_k8s; each message is one user-facing line."""
from __future__ import annotations

from arbiter.errors import VgpuError

__all__ = ["AllocationError", "K8sError", "UsageError", "VgpudUnreachableError"]


class K8sError(VgpuError):
    """Base of the node agents' errors."""


class UsageError(K8sError, ValueError):
    """A flag with a value the agent cannot use: names the flag, the value and why."""

    def __init__(self, flag: str, value: str, reason: str) -> None:
        self.flag = flag
        self.value = value
        super().__init__(f"{flag}={value}: {reason}")


class AllocationError(K8sError, ValueError):
    """Device IDs the kubelet passed that cannot make one container's request."""

    def __init__(self, resource: str, ids: str, reason: str) -> None:
        self.resource = resource
        super().__init__(f"failed to allocate {resource} {ids}: {reason}")


class VgpudUnreachableError(K8sError, ConnectionError):
    """vgpud did not answer (down, restarting, or the socket is wrong)."""

    def __init__(self, socket: str, cause: str) -> None:
        self.socket = socket
        super().__init__(f"failed to list GPUs from vgpud at {socket}: {cause}")
