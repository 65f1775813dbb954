# SPDX-License-Identifier: Apache-2.0
"""The container lifecycle ops vgpud serves to the compiled vgpu-runtime and vgpu-hook.

Each op runs a decision (shim.runtime.give_vgpu, oci_hook.phases) with vgpud's own
loaded config against the domain's small interface (oci_hook.slices.Slices):

    runtime-create  bundle, id      -> ok (spec modified, or no request), or error
    prestart        phase, state    -> mount (the Plan), ok (no request), or error
    poststop        state           -> ok, or error
    claim-prestart  slice, state    -> mount (the ld.so.preload of a container that a
                                       claim's CDI spec gives the slice), or error
    release         id [bundle] [state] -> ok (a failed exec or mount gives it back;
                                           the container names itself, so another
                                           container's slice with the same id stays)

Every refusal is `status=error` with the one line the user sees, and leaves nothing
allocated.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from arbiter.errors import VgpuError
from arbiter.native import libvgpu_path, program_path
from oci_hook import phases
from oci_hook.cdi import SPEC_DIRS
from oci_hook.request import preload_schema
from oci_hook.state import parse_state
from shim.errors import SpecError
from shim.lifecycle import Fields, LifecycleServer, Op, Reply, lifecycle_socket
from shim.runtime import give_vgpu
from shim.spec import FileSpec

if TYPE_CHECKING:
    from arbiter.config import Config
    from arbiter.install.versions import Install
    from oci_hook.slices import Slices

__all__ = ["LifecycleOps", "serve"]

log = logging.getLogger("vgpud")


class LifecycleOps:
    """The lifecycle ops of one vgpud: its config, its slices."""

    def __init__(self, slices: Slices, config: Config, *,
                 hook: Callable[[], Path | None] = lambda: program_path("vgpu-hook"),
                 libvgpu: Callable[[], Path] = libvgpu_path,
                 libvgpu_version: str = "",
                 cdi_dirs: Sequence[Path] = SPEC_DIRS) -> None:
        self.slices = slices
        self.config = config
        self._hook = hook
        self._libvgpu = libvgpu
        self._libvgpu_version = libvgpu_version
        self.cdi_dirs = tuple(cdi_dirs)   # where a claim's CDI spec is (containerd 1.6)

    def ops(self) -> dict[str, Op]:
        """Op name -> handler, for shim.lifecycle.LifecycleServer."""
        return {"runtime-create": _one_line(self.runtime_create),
                "prestart": _one_line(self.prestart),
                "poststop": _one_line(self.poststop),
                "claim-prestart": _one_line(self.claim_prestart),
                "release": _one_line(self.release)}

    def runtime_create(self, req: Fields) -> Reply:
        """vgpu-runtime create/run: modify the spec of a container that asks for a vGPU."""
        bundle, cid = req.get("bundle"), req.get("id")
        if not bundle.startswith("/") or not cid:
            return Reply.error(f"failed to give a vGPU: runtime-create needs an absolute "
                               f"bundle and an id (got bundle={bundle!r} id={cid!r})")
        store = FileSpec.of_bundle(Path(bundle))
        try:
            spec = store.load()
        except SpecError as e:
            if isinstance(e.__cause__, FileNotFoundError):
                # vgpu-runtime asks only after it read this file: a vgpud that finds none
                # runs where the engine's bundles are not at their own path (a pod without
                # them mounted). Passing it through would start the container unsliced.
                return Reply.error(f"failed to give a vGPU: vgpud cannot see {store.path} "
                                   f"({e.reason}): mount the engine's bundle directory "
                                   "into vgpud's container at the node's own path")
            # The lower runtime reports a broken bundle its own way.
            log.debug("lifecycle: runtime-create %s: %s (left to the lower runtime)", cid, e)
            return Reply.of("ok")
        undo = give_vgpu(store, spec, cid, Path(bundle), self.config, self.slices, self._hook(),
                         self.cdi_dirs)
        return Reply.of("ok", undo=undo)

    def prestart(self, req: Fields) -> Reply:
        """vgpu-hook prestart/createRuntime: the slice and the mount plan (vgpu-hook mounts)."""
        state = parse_state(req.get("state"))
        if state.status == "stopped":  # hooks.d runs one command line for every stage
            return self.poststop(req)
        plan = phases.prestart(state, self.config, self.slices, libvgpu=self._libvgpu,
                               libvgpu_version=self._libvgpu_version)
        if plan is None:
            return Reply.of("ok")

        def undo() -> None:
            phases.release(self.slices, state.id, state.pid, str(state.bundle))
        return Reply.of("mount", ("id", state.id), ("pid", str(state.pid)), *plan.to_fields(),
                        undo=undo)

    def claim_prestart(self, req: Fields) -> Reply:
        """vgpu-hook claim (a CDI hook): check the claim's slice, record the container as
        its user, answer the ld.so.preload plan. Nothing to undo: the claim holds it."""
        state = parse_state(req.get("state"))
        plan = phases.claim_prestart(state, req.get("slice"), self.slices)
        return Reply.of("mount", ("id", state.id), ("pid", str(state.pid)), *plan.to_fields())

    def poststop(self, req: Fields) -> Reply:
        """vgpu-hook poststop: release the container's slice."""
        phases.poststop(parse_state(req.get("state")), self.config, self.slices)
        return Reply.of("ok")

    def release(self, req: Fields) -> Reply:
        """Give a container's slice back after its exec or mounts failed."""
        cid, pid, bundle = req.get("id"), 0, req.get("bundle")
        if req.get("state"):  # vgpu-hook after a failed mount: the container's OCI state
            state = parse_state(req.get("state"))
            cid, pid, bundle = cid or state.id, state.pid, bundle or str(state.bundle)
        if not cid:
            return Reply.error("failed to release the vGPU slice: no container id")
        try:
            phases.release(self.slices, cid, pid, bundle)
        except VgpuError as e:  # the reconciler frees it; say so in vgpud's log only
            log.warning("lifecycle: failed to release the slice of %s: %s", cid, e)
        return Reply.of("ok")


def _one_line(op: Op) -> Op:
    """A refusal (VgpuError) as the one line the user sees."""
    def run(req: Fields) -> Reply:
        try:
            return op(req)
        except VgpuError as e:
            return Reply.error(str(e))
    return run


def serve(slices: Slices, config: Config, install: Install | None = None) -> LifecycleServer:
    """The lifecycle socket of the vgpud serving gRPC on config.socket (not started).

    With `install` (vgpud's versioned install, arbiter.install.versions) containers get its
    libvgpu.so and vgpu-hook, never the package's files a later install may replace."""
    if install is None:
        ops = LifecycleOps(slices, config, cdi_dirs=config.cdi_spec_dirs)
    else:
        ops = LifecycleOps(slices, config, hook=lambda: install.program("vgpu-hook"),
                           libvgpu=lambda: install.libvgpu, libvgpu_version=install.name,
                           cdi_dirs=config.cdi_spec_dirs)
    # The request schema (jsonschema: ~90 ms) is compiled shortly after the socket serves
    # (LifecycleServer's warm-up), not before: a restart answers sooner.
    return LifecycleServer(lifecycle_socket(config.socket), ops.ops(), warm=preload_schema)
