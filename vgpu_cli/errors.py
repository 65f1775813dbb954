# SPDX-License-Identifier: Apache-2.0
"""Errors of the `vgpu` command; each message is one user-facing line."""
from __future__ import annotations

from arbiter.errors import VgpuError

__all__ = ["CliError"]


class CliError(VgpuError):
    """A failure the CLI reports as one line and exit status 1.

    `status` is the gRPC status code's name when the failure came from a call.
    """

    def __init__(self, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status
