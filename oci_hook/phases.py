# SPDX-License-Identifier: Apache-2.0
"""What vgpu-hook's phases decide, run inside vgpud for the compiled vgpu-hook.

Phases (runtime-spec config.md#posix-platform-hooks; runc runs both in the runtime's
namespaces while the container's init waits, before pivot_root):

- ``prestart`` (Podman/CRI-O hooks.d) or its modern twin ``createRuntime``: the
  container's slice (the one vgpu-runtime made at create, else a new one) and the
  mount plan that gives it; vgpu-hook applies the plan.
- ``poststop``: release the slice.
- ``claim`` (a CDI hook at ``createRuntime``, oci_hook.cdi): a container that a DRA claim's
  CDI spec gives the claim's slice; the engine made the spec's mounts, the plan holds
  only what depends on the image (/etc/ld.so.preload). The container uses the slice and
  never holds it: nothing is released when it fails or stops.

A container without a request (find_request: none of its keys, a pod's sandbox, a
pod's container whose keys name no memory) gets None / nothing done. Every failure is a
VgpuError whose message is the one line the engine shows; a prestart that fails
after the slice was granted releases it first.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from arbiter.errors import NotFoundError, StateError, VgpuError
from oci_hook.errors import SliceError
from oci_hook.errors import StateError as HookStateError
from oci_hook.mounts import PRELOAD_HOST_NAME, Plan, plan_mounts, preload_plan
from oci_hook.request import SLICE_ANNOTATION, find_request, parse_request
from oci_hook.slices import view_of
from oci_hook.state import HookState, Spec, load_spec
from oci_hook.trust import check_request
from oci_hook.workload import workload_labels

if TYPE_CHECKING:
    from arbiter.config import Config
    from arbiter.model import Request, Slice
    from oci_hook.slices import Slices

__all__ = ["CLAIM_KIND", "CREATE_RUNTIME", "POSTSTOP", "PRESTART", "claim_prestart", "poststop",
           "prestart", "release"]

PRESTART = "prestart"
CREATE_RUNTIME = "createRuntime"
POSTSTOP = "poststop"
#: The owner kind of a DRA claim's slice (arbiter.model.OwnerKind.CLAIM).
CLAIM_KIND = "claim"


def _request(state: HookState, spec: Spec | None,
             config: Config) -> tuple[dict[str, str] | None, dict[str, str]]:
    """(the raw request or None, the annotations: the spec's, then the state's, then the
    keys its vgpu-hook hooks carry, which win: the device plugin's CDI devices put the
    kubelet's keys there, where no pod can write).

    Env requests count by this vgpud's config alone: vgpu-runtime's decision used the same
    one, and an annotation (vgpu.io/env-requests) is something a tenant can set too."""
    annotations = {**(spec.annotations if spec else {}), **state.annotations,
                   **(spec.hook_keys if spec else {})}
    env = spec.env if spec else ()
    raw = find_request(annotations, env, allow_env=config.allow_env_requests)
    return raw, annotations


def prestart(state: HookState, config: Config, slices: Slices, *,
             libvgpu: Callable[[], Path], libvgpu_version: str = "") -> Plan | None:
    """The mount plan that gives the container its slice; None when it asks for none.

    `libvgpu` finds the library to mount (asked only for a container that gets a slice);
    `libvgpu_version` names its versioned install, recorded with the slice."""
    spec = load_spec(state.bundle)
    raw, annotations = _request(state, spec, config)
    if raw is None:
        return None
    # A pod author's keys only where the config trusts them (before anything is asked).
    check_request(raw, annotations, state.bundle, config)
    if state.pid <= 0:
        raise HookStateError("the OCI state on stdin",
                             f"no container pid (run vgpu-hook as a {PRESTART} or "
                             f"{CREATE_RUNTIME} hook)")
    # A bad request fails before anything is asked; with the runtime's slice id it was
    # checked at create already (and most likely is not needed).
    req = None if annotations.get(SLICE_ANNOTATION) else _parse(raw, state, slices,
                                                                  annotations)
    try:
        s = _slice(slices, state, raw, annotations, req)
        plan = plan_mounts(view_of(slices, s), rootfs=spec.rootfs, libvgpu=libvgpu(),
                           preload_host=state.bundle / PRELOAD_HOST_NAME)
        if libvgpu_version:
            slices.note_libvgpu(s.id, libvgpu_version)
        return plan
    except BaseException:
        # The Allocate or Attach may have granted it: give it back (best effort; the
        # reconciler frees what this misses once the container is gone).
        with contextlib.suppress(VgpuError):
            release(slices, state.id, state.pid, str(state.bundle))
        raise


def _parse(raw: dict[str, str], state: HookState, slices: Slices,
           annotations: Mapping[str, str]) -> Request:
    req = parse_request(raw, owner=state.id, owner_pid=state.pid, defaults=slices.defaults())
    return dataclasses.replace(req, bundle=str(state.bundle),
                               labels=workload_labels(annotations))


def _is(e: VgpuError, code: str) -> bool:
    return isinstance(e, StateError) and e.code == code


def _slice(slices: Slices, state: HookState, raw: dict[str, str],
           annotations: Mapping[str, str], req: Request | None) -> Slice:
    """The slice vgpu-runtime allocated (vgpu.io/slice, checked to be ours), else Allocate.

    Either way vgpud records this container's init with the slice (its liveness), and
    refuses when another live container holds the id's slice."""
    slice_id = annotations.get(SLICE_ANNOTATION)
    if slice_id:
        try:
            s = slices.attach(slice_id, state.id, state.pid, str(state.bundle))
            if s.owner == state.id:
                return s
        except NotFoundError:
            pass   # not this container's (any more): it gets its own below
        except VgpuError as e:
            if not _is(e, StateError.NOT_FOUND):
                raise SliceError("allocate a vGPU", str(e)) from e
    if req is None:
        req = _parse(raw, state, slices, annotations)
    try:
        return slices.allocate(req).slice
    except VgpuError as e:
        raise SliceError("allocate a vGPU", str(e)) from e


def release(slices: Slices, cid: str, pid: int = 0, bundle: str = "") -> bool:
    """Give the container's slice back; the container names itself (its init pid, its
    bundle), so a slice that another live container with the same id holds stays.

    False when nothing was released (none, or another's: the domain records why)."""
    try:
        return slices.release(owner=cid, pid=pid, bundle=bundle,
                              asker=bool(pid or bundle)) is not None
    except VgpuError as e:
        if _is(e, StateError.CONFLICT):
            return False
        raise SliceError("release the vGPU slice", str(e)) from e


def poststop(state: HookState, config: Config, slices: Slices) -> bool:
    """Release the container's slice; False when it had none to release."""
    try:
        spec: Spec | None = load_spec(state.bundle)
    except HookStateError:
        spec = None  # the bundle may be gone: the state's annotations still tell
    raw, annotations = _request(state, spec, config)
    if raw is None and SLICE_ANNOTATION not in annotations:
        return False
    with contextlib.suppress(OSError):
        (state.bundle / PRELOAD_HOST_NAME).unlink(missing_ok=True)
    # runc's stopped state has no pid: the bundle names the container.
    return release(slices, state.id, state.pid, str(state.bundle))



def claim_prestart(state: HookState, slice_id: str, slices: Slices) -> Plan:
    """The plan for a container that a claim's CDI spec gives slice `slice_id`: the slice
    must exist and be a claim's; the container is recorded as its user (attribution);
    the plan writes and mounts the /etc/ld.so.preload that names libvgpu."""
    if state.pid <= 0:
        raise HookStateError("the OCI state on stdin",
                             f"no container pid (run vgpu-hook claim as a {CREATE_RUNTIME} "
                             f"hook)")
    if not slice_id:
        raise SliceError("use the claim's vGPU slice", "the CDI hook names no slice")
    try:
        s = slices.get(slice_id)
    except NotFoundError as e:
        raise SliceError("use the claim's vGPU slice",
                         f"slice {slice_id} does not exist (is the claim prepared?)") from e
    except VgpuError as e:
        raise SliceError("use the claim's vGPU slice", str(e)) from e
    if s.owner_kind != CLAIM_KIND:
        raise SliceError("use the claim's vGPU slice",
                         f"slice {slice_id} belongs to {s.owner_kind} {s.owner}, not to a claim")
    spec = load_spec(state.bundle)
    add_user = getattr(slices, "add_user", None)   # the domain records users of claims
    if add_user is not None:
        try:
            add_user(slice_id, state.pid, str(state.bundle))
        except VgpuError as e:
            raise SliceError("use the claim's vGPU slice", str(e)) from e
    return preload_plan(rootfs=spec.rootfs, preload_host=state.bundle / PRELOAD_HOST_NAME)
