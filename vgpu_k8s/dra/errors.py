# SPDX-License-Identifier: Apache-2.0
"""Errors of the DRA plugin; each message is one line (the kubelet shows a claim's error
in the pod's events as it is)."""
from __future__ import annotations

from vgpu_k8s.errors import K8sError

__all__ = ["ApiError", "ClaimError", "VgpudError"]


def _one_line(text: str) -> str:
    return " ".join(text.split())


class ClaimError(K8sError, ValueError):
    """A claim's allocation this plugin cannot turn into a slice (malformed, or not ours);
    the message is the reason, the caller names the claim."""

    def __init__(self, claim: str, reason: str) -> None:
        self.claim = claim
        self.reason = reason
        super().__init__(_one_line(reason))


class VgpudError(K8sError, ConnectionError):
    """vgpud refused a call or did not answer: ``failed to <verb> ...: <vgpud's words>``."""

    def __init__(self, verb: str, cause: str, *, refused: bool = False) -> None:
        self.verb = verb
        self.cause = cause
        self.refused = refused   # vgpud answered no (as opposed to: did not answer)
        # vgpud's refusals are already one line that says what failed (its words).
        super().__init__(_one_line(cause if refused else f"failed to {verb}: {cause}"))


class ApiError(K8sError, ConnectionError):
    """The API server refused a call or did not answer."""

    def __init__(self, verb: str, cause: str, status: int = 0) -> None:
        self.verb = verb
        self.status = status     # HTTP status; 0 when there was no answer
        super().__init__(_one_line(f"failed to {verb}: {cause}"))
