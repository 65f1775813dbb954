# SPDX-License-Identifier: Apache-2.0
"""The DRA plugin's life: wait for vgpud, reconcile the checkpoint, serve the DRA socket,
register, keep the node's ResourceSlice current, and on SIGTERM stop cleanly."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from arbiter.errors import VgpuError
from vgpu_k8s.dra.apiserver import Cluster
from vgpu_k8s.dra.errors import ApiError, VgpudError
from vgpu_k8s.dra.prepare import Preparer
from vgpu_k8s.dra.publisher import Publisher
from vgpu_k8s.dra.registration import RegistrationServer
from vgpu_k8s.dra.resourceslice import DRIVER
from vgpu_k8s.dra.service import DraServer
from vgpu_k8s.dra.vgpud import Gpu, Vgpud

__all__ = ["Agent", "Settings"]

log = logging.getLogger("vgpu-dra-plugin")

#: How often the sockets are looked at (a stat each).
_TICK_S = 0.2

# Keeping the published slice in the API server. The kubelet deletes every ResourceSlice
# of its node when it starts (its DRA plugin manager's start-up wipe: a driver is of no
# use until its plugin registers again), and later the slices of a driver whose plugin
# stayed unreachable for 30 s; an operator may delete or edit one. Nothing of that
# reaches the plugin as a GPU change, so two triggers look at the slice again:
# - the kubelet's re-registration (NotifyRegistrationStatus), which is how a kubelet
#   restart shows here: a LIST right away and at the delays below, because the wipe runs
#   in the background beside the kubelet's plugin watcher and may land just after the
#   registration, or seconds later when it retries (it backs off from 1 s);
# - a LIST every --resync-interval whatever happens, the bound for everything else (a
#   wipe that retried longer, an operator's delete).
# Not a watch: it would hold a stream open per node and need reconnect and
# resourceVersion bookkeeping (and the `watch` verb) for events that are rare and, in
# the common case, announced by the registration; a LIST on the node's field selector
# is served from the API server's watch cache by an index.
_AFTER_REGISTRATION_S = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0)


@dataclass(frozen=True)
class Settings:
    """What the flags say."""

    node: str
    kubelet_dir: Path
    cdi_dir: Path
    vgpud_socket: str
    kubeconfig: str | None = None
    poll_s: float = 5.0          # how often vgpud is asked for the GPUs and their health
    resync_s: float = 60.0       # how often the published slice is looked at in the API
    nvidia_cdi_dirs: tuple[Path, ...] = ()   # NVIDIA's CDI specs, added beside a claim's

    @property
    def plugin_dir(self) -> Path:
        """The plugin's own dir under the kubelet's plugins dir: DRA socket, checkpoint."""
        return self.kubelet_dir / "plugins" / DRIVER

    @property
    def registry_dir(self) -> Path:
        """Where the kubelet's plugin watcher looks for registration sockets."""
        return self.kubelet_dir / "plugins_registry"

    @property
    def dra_socket(self) -> Path:
        """The DRA service's socket (the endpoint given at registration)."""
        return self.plugin_dir / "dra.sock"

    @property
    def checkpoint(self) -> Path:
        """The checkpoint file."""
        return self.plugin_dir / "checkpoint.json"


class Agent:
    """One node's DRA plugin, fed by one vgpud, publishing through one API server client."""

    def __init__(self, settings: Settings, cluster: Cluster) -> None:
        self.settings = settings
        self.cluster = cluster
        self.vgpud = Vgpud(settings.vgpud_socket)
        self._gpus: list[Gpu] | None = None
        self.preparer = Preparer(node=settings.node, vgpud=self.vgpud, cluster=cluster,
                                 cdi_dir=settings.cdi_dir, checkpoint_path=settings.checkpoint,
                                 gpus=self.gpus, nvidia_cdi_dirs=settings.nvidia_cdi_dirs)
        self.publisher = Publisher(cluster, settings.node)
        self.dra = DraServer(settings.dra_socket, self.preparer)
        self._registered = threading.Event()    # set by the kubelet's (re-)registration
        self.registration = RegistrationServer(settings.registry_dir, DRIVER,
                                               settings.dra_socket, self._registered.set)
        self._errors: dict[str, str] = {}

    def _report(self, what: str, error: str) -> None:
        """Log an error once until it changes or clears."""
        if self._errors.get(what, "") != error:
            if error:
                log.warning("%s", error)
            elif self._errors.get(what):
                log.info("%s works again", what)
            self._errors[what] = error

    def gpus(self) -> Sequence[Gpu]:
        """The GPUs as last polled (asked now when none are known yet)."""
        if self._gpus is None:
            self._gpus = self.vgpud.gpus()
        return self._gpus

    def poll(self) -> bool:
        """Ask vgpud for its GPUs once; False while it does not answer. While it does not,
        the published slice stays (a vgpud restart must not empty the node's pool)."""
        try:
            gpus = self.vgpud.gpus()
        except VgpudError as e:
            self._report("vgpud", f"{e}; keeping the published devices")
            return False
        self._report("vgpud", "")
        if gpus != self._gpus:
            log.info("GPUs: %s", ", ".join(
                f"{g.index} {g.uuid}" + (f" (unhealthy: {g.unhealthy})" if g.unhealthy else "")
                for g in gpus) or "none")
        self._gpus = gpus
        return True

    def publish(self) -> None:
        """Publish the node's slice if the GPUs changed (or the last try failed)."""
        if self._gpus is None:
            return
        try:
            self.publisher.publish(self._gpus)
            self._report("API server", "")
        except ApiError as e:
            self._report("API server", f"{e}; retrying")

    def resync(self) -> bool:
        """Publish again if the API server lost or changed the slice; False when the API
        server did not answer (the caller tries again sooner)."""
        if self._gpus is None:
            return True
        try:
            self.publisher.resync(self._gpus)
        except ApiError as e:
            self._report("API server", f"{e}; retrying")
            return False
        self._report("API server", "")
        return True

    def keep_serving(self) -> None:
        """Serve again a socket that was removed (the plugin watcher then finds it anew)."""
        if not self.dra.serving():
            log.info("the DRA socket %s went away: serving it again", self.dra.socket)
            self.dra.stop(0)
            self.dra.start()
        if not self.registration.serving():
            log.info("the registration socket %s went away: serving it again",
                     self.registration.socket)
            self.registration.stop(0)
            self.registration.start()

    def run(self, stop: threading.Event) -> None:
        """Until stop is set."""
        started = False
        try:
            while not self.poll():
                if stop.wait(min(self.settings.poll_s, 1.0)):
                    return
            while True:
                try:
                    self.preparer.reconcile()
                    break
                except (VgpuError, OSError) as e:
                    self._report("reconcile", f"failed to reconcile the checkpoint: {e}")
                    if stop.wait(1.0):
                        return
            self.dra.start()
            self.registration.start()
            started = True
            log.info("serving DRA driver %s on %s; registration %s", DRIVER, self.dra.socket,
                     self.registration.socket)
            self.publish()
            next_poll = time.monotonic() + self.settings.poll_s
            next_resync = time.monotonic() + self.settings.resync_s
            looks: list[float] = []      # when to look again after a registration
            while not stop.wait(_TICK_S):
                self.keep_serving()
                now = time.monotonic()
                if self._registered.is_set():
                    self._registered.clear()
                    looks = [now + d for d in _AFTER_REGISTRATION_S]
                if now >= next_poll:
                    self.poll()
                    self.publish()
                    next_poll = time.monotonic() + self.settings.poll_s
                if now >= next_resync or (looks and now >= looks[0]):
                    looks = [t for t in looks if t > now]
                    wait = self.settings.resync_s if self.resync() else \
                        min(self.settings.resync_s, self.settings.poll_s)
                    next_resync = time.monotonic() + wait
        finally:
            self.close(withdraw=started)

    def close(self, withdraw: bool = True) -> None:
        """Stop registering and serving, then delete the node's ResourceSlices: a stopped
        plugin cannot prepare claims, so the scheduler should not place new ones here
        (claims already prepared keep their slices: vgpud holds them, not the plugin)."""
        self.registration.stop()
        self.dra.stop()
        if withdraw:
            try:
                self.publisher.withdraw()
            except ApiError as e:
                log.warning("%s", e)
        self.vgpud.close()
        self.cluster.close()
