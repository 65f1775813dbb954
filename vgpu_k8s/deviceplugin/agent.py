# SPDX-License-Identifier: Apache-2.0
"""The plugin's life: wait for vgpud, serve both resources, register, keep the lists current,
serve and register again after a kubelet restart, and stop cleanly.

A DaemonSet surge update runs two plugins on one node for a while, on the same kubelet dir.
The hand-over: the newer one takes the socket paths when it starts (it replaces the files
and registers; the kubelet then dials it and drops the older one's stream). The older one
sees its paths held by a server that answers, stands aside (it does not take them back,
which would make the two fight over the paths and re-register without end), and keeps
running until its pod is stopped. Should the newer one go away first (its files removed,
or left by a dead process), the older one serves and registers again.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from vgpu_k8s.deviceplugin import kubelet
from vgpu_k8s.deviceplugin.board import Board
from vgpu_k8s.deviceplugin.cdi import CdiAnswer
from vgpu_k8s.deviceplugin.gpus import Gpu, Vgpud, device_list, health_of
from vgpu_k8s.deviceplugin.ids import COMPUTE, MEMORY
from vgpu_k8s.deviceplugin.plugin import ENDPOINTS, Endpoint, PluginServer, Servicer

__all__ = ["Agent", "Settings"]

log = logging.getLogger("vgpu-device-plugin")

#: How often the kubelet's socket and ours are looked at (a stat each).
_TICK_S = 0.2
#: Wait between two registration attempts that failed.
_RETRY_S = 2.0


@dataclass(frozen=True)
class Settings:
    """What the flags say."""

    kubelet_dir: Path
    memory_unit: int        # bytes per vgpu.io/memory device
    vgpud_socket: str
    poll_s: float = 5.0     # how often vgpud is asked for the GPUs and their health
    grace_s: float = 30.0   # vgpud unreachable this long: every device Unhealthy
    cdi_dir: Path | None = None   # --cdi: Allocate answers CDI devices, specs written here
    nvidia_cdi_dirs: tuple[Path, ...] = ()  # where NVIDIA's CDI specs are looked for


class Agent:
    """Both resources' plugins, registered with one kubelet, fed by one vgpud."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.vgpud = Vgpud(settings.vgpud_socket)
        self.boards = {r: Board() for r in (MEMORY, COMPUTE)}
        answer = None if settings.cdi_dir is None else CdiAnswer(
            settings.cdi_dir, self.vgpud.paths, lambda: self._gpus or [],
            settings.nvidia_cdi_dirs)
        self.servers = {
            r: PluginServer(Servicer(Endpoint(r, settings.kubelet_dir / ENDPOINTS[r]),
                                     self.boards[r], settings.memory_unit, answer))
            for r in (MEMORY, COMPUTE)}
        self._gpus: list[Gpu] | None = None
        self._down_since: float | None = None
        self._last_error = ("", False)
        self._registered_inode = 0     # the kubelet socket we registered with; 0: none
        self._retry_at = 0.0
        self._aside = False            # a newer plugin serves our paths
        self._missing_seen = False     # a path of ours was missing at the last tick

    # -- vgpud ----------------------------------------------------------------

    def poll(self) -> bool:
        """Ask vgpud once and publish what changed; False while no list is known yet."""
        gpus, self._down_since, down, error = health_of(
            self.vgpud.gpus, self._gpus, self._down_since, self.settings.grace_s)
        if (error, down) != self._last_error:
            if error:
                log.warning("%s; %s", error, f"every device Unhealthy after "
                            f"{self.settings.grace_s:g} s" if down else
                            "keeping the last device list")
            else:
                log.info("vgpud answers again at %s", self.settings.vgpud_socket)
            self._last_error = (error, down)
        if gpus is None:
            return False
        if gpus != self._gpus:
            log.info("GPUs: %s", ", ".join(f"{g.index} {g.uuid}"
                                           + (f" (unhealthy: {g.unhealthy})" if g.unhealthy
                                              else "") for g in gpus) or "none")
        self._gpus = gpus
        for resource, board in self.boards.items():
            board.publish(device_list(resource, gpus, self.settings.memory_unit, down))
        return True

    # -- kubelet ----------------------------------------------------------------

    def keep_registered(self, now: float) -> None:
        """Serve and register again when the kubelet restarted or our sockets went away."""
        kubelet_inode = kubelet.inode(self.settings.kubelet_dir / kubelet.KUBELET_SOCKET)
        lost = [s for s in self.servers.values() if not s.serving()]
        taken = [s for s in lost if s.taken()]
        if taken:
            if not self._aside:
                log.info("another plugin serves %s (a newer pod during an update): standing "
                         "aside while it answers", ", ".join(str(s.socket) for s in taken))
                self._aside = True
                self._registered_inode = 0
            return
        # A newer plugin replaces a file by removing it, then binding its own: a path found
        # missing while the kubelet is the one we registered with gets one more tick
        # before it is taken back, so that the two do not both serve and register.
        if (lost and self._registered_inode == kubelet_inode != 0
                and not self._missing_seen):
            self._missing_seen = True
            return
        self._missing_seen = False
        if self._aside:
            log.info("%s no longer answered by another plugin: serving and registering again",
                     self.settings.kubelet_dir)
            self._aside = False
            self._retry_at = 0.0
            lost = list(self.servers.values())
        if self._registered_inode and (kubelet_inode != self._registered_inode or lost):
            log.info("kubelet restarted (or removed our sockets): serving and registering again")
            self._registered_inode = 0
            self._retry_at = 0.0
            lost = list(self.servers.values())
        for server in lost:
            server.stop(0)
            server.start()
        if self._registered_inode or not kubelet_inode or now < self._retry_at:
            return
        try:
            for server in self.servers.values():
                kubelet.register(self.settings.kubelet_dir, server.servicer.endpoint)
        except kubelet.RegistrationError as e:
            log.warning("%s; retrying", e)
            self._retry_at = now + _RETRY_S
            return
        self._registered_inode = kubelet_inode
        log.info("registered %s with the kubelet at %s", ", ".join(self.servers),
                 self.settings.kubelet_dir / kubelet.KUBELET_SOCKET)

    # -- life -------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Until stop is set: the first list from vgpud, then serve, register and poll."""
        try:
            while not self.poll():
                if stop.wait(min(self.settings.poll_s, 1.0)):
                    return
            for server in self.servers.values():
                server.start()
            log.info("serving %s in %s", ", ".join(str(s.socket.name)
                                                    for s in self.servers.values()),
                     self.settings.kubelet_dir)
            next_poll = time.monotonic() + self.settings.poll_s
            while not stop.is_set():
                now = time.monotonic()
                self.keep_registered(now)
                if now >= next_poll:
                    self.poll()
                    next_poll = now + self.settings.poll_s
                stop.wait(_TICK_S)
        finally:
            self.close()

    def close(self) -> None:
        """End the streams, stop serving, remove our sockets."""
        for board in self.boards.values():
            board.close()
        for server in self.servers.values():
            server.stop()
        self.vgpud.close()
