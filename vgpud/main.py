# SPDX-License-Identifier: Apache-2.0
"""Entry point of `vgpud`: arbiter's daemon, serving the container lifecycle socket too.

The domain (arbiter/) knows nothing of containers; the container path (shim/, oci_hook/)
reaches the domain only through oci_hook.slices.Slices. This module joins the two.
"""
from __future__ import annotations

import sys

from arbiter import daemon
from arbiter.config import Config
from arbiter.core import Arbiter
from shim.lifecycle import LifecycleServer
from shim.service import serve

__all__ = ["ATTACHMENTS", "container_lifecycle", "main"]


def container_lifecycle(arbiter: Arbiter, config: Config) -> LifecycleServer:
    """The socket the compiled vgpu-runtime and vgpu-hook ask (`<socket>.lifecycle`)."""
    return serve(arbiter, config)


#: What vgpud serves besides the domain's gRPC API.
ATTACHMENTS = (container_lifecycle,)


def main(argv: list[str] | None = None) -> int:
    """Run vgpud with everything attached; the flags are arbiter.daemon's."""
    return daemon.main(argv, attachments=ATTACHMENTS)


if __name__ == "__main__":
    sys.exit(main())
