# SPDX-License-Identifier: Apache-2.0
"""Entry point of `vgpud`: arbiter's daemon, serving the container lifecycle socket too.

The domain (arbiter/) knows nothing of containers; the container path (shim/, oci_hook/)
reaches the domain only through oci_hook.slices.Slices. This module joins the two.
"""
from __future__ import annotations

from arbiter.config import Config
from arbiter.daemon import server
from arbiter.install.versions import Keeper, own_install
from arbiter.slices.arbiter import Arbiter
from oci_hook.mounts import CONTAINER_LIBVGPU
from shim.lifecycle import LifecycleServer
from shim.service import serve

__all__ = ["ATTACHMENTS", "container_lifecycle", "main", "native_installs"]


def native_installs(arbiter: Arbiter, config: Config) -> Keeper:
    """This version's libvgpu.so and programs installed under paths.lib_dir (once), and
    the removal of installs no container maps any more, nor `current` names, nor a
    runtime's container state names (its poststop hook may still run: docs/upgrading.md)."""
    return Keeper(config.lib_dir, own_install(config.lib_dir), arbiter.slices,
                  target=CONTAINER_LIBVGPU, interval_s=config.reconcile_interval_s,
                  runtime_state_roots=config.runtime_state_roots)


def container_lifecycle(arbiter: Arbiter, config: Config) -> LifecycleServer:
    """The socket the compiled vgpu-runtime and vgpu-hook ask (`<socket>.lifecycle`);
    containers get the versioned install's libvgpu.so and vgpu-hook."""
    return serve(arbiter, config, own_install(config.lib_dir))


#: What vgpud serves besides the domain's gRPC API.
ATTACHMENTS: tuple[server.AttachmentFactory, ...] = (native_installs, container_lifecycle)


def main(argv: list[str] | None = None) -> int:
    """Run vgpud with everything attached; the flags are arbiter.daemon.server's."""
    return server.main(argv, attachments=ATTACHMENTS)


if __name__ == "__main__":
    server.exit_process(main())
