# SPDX-License-Identifier: Apache-2.0
"""What vgpu-runtime decides at `create`, run inside vgpud for the compiled vgpu-runtime.

For a bundle whose spec requests a vGPU (vgpu.io/* annotations, or VGPU_* env where the
config allows), validate the request, get the slice from the domain (idempotent by
container id; the hook's prestart later attaches the same slice), and add the vgpu hooks,
the slice's device nodes and cgroup rules, the CUDA/NVIDIA visible-devices env and the
slice annotation to config.json. A container that asks for nothing is not touched; nor
is a pod's sandbox, nor a pod's container whose keys name no memory (find_request).

The compiled vgpu-runtime (shim/native/) does the rest: argv, finding the lower runtime,
the exec, and the error line in runc's --log.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arbiter.defaults import ENV_CONFIG, ENV_SOCKET
from arbiter.errors import NotFoundError, VgpuError
from oci_hook.cdi import (
    SPEC_DIRS,
    CdiError,
    check_claim_use,
    claim_requests,
    edits_slice_id,
    find_edits,
)
from oci_hook.mounts import slice_env
from oci_hook.phases import CLAIM_KIND, release
from oci_hook.request import SANDBOX, container_type, find_request, parse_request
from oci_hook.slices import view_of
from oci_hook.trust import check_request, request_keys
from oci_hook.workload import workload_labels
from shim.errors import AllocateError, HookProgramError
from shim.modifiers import CdiEditsModifier, HookSettings, SliceInfo, for_slice
from shim.spec import Spec, SpecStore

if TYPE_CHECKING:
    from arbiter.config import Config
    from oci_hook.slices import Slices

__all__ = ["HOOK_PATH", "claim_edits", "give_vgpu", "hook_settings"]

#: The hooks' PATH: an engine may run them with an empty environment.
HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Added to hook.wait_s for the hooks' OCI timeout: the mounts after the answer.
_HOOK_MARGIN_S = 20


def hook_settings(hook: Path | None, config: Config) -> HookSettings:
    """How config.json runs the compiled vgpu-hook; it asks this vgpud (its config, its
    socket) whatever environment the engine gives it."""
    if hook is None:
        raise HookProgramError()
    env: dict[str, str] = {"PATH": HOOK_PATH, ENV_SOCKET: str(config.socket)}
    if config.source is not None:
        env[ENV_CONFIG] = str(config.source)
    return HookSettings(path=str(hook), args=(str(hook),), env=env,
                        timeout=math.ceil(config.hook_wait_s) + _HOOK_MARGIN_S)


def claim_edits(key: str, ident: str, annotations: Mapping[str, str],
                cdi_dirs: Sequence[Path], slices: Slices) -> dict[str, Any]:
    """The containerEdits of claim device `ident` (annotation `key`) for the container
    with `annotations`: the slice they give must be a claim's, and the container may use
    it (oci_hook.cdi.check_claim_use); CdiError with one line otherwise."""
    edits = find_edits(cdi_dirs, ident)
    what = f"the CDI device {ident} of annotation {key}"
    slice_id = edits_slice_id(edits)
    if not slice_id:
        raise CdiError("use", what, "its spec's hook names no slice")
    try:
        s = slices.get(slice_id)
    except NotFoundError:
        raise CdiError("use", what, f"slice {slice_id} does not exist "
                       f"(is the claim prepared?)") from None
    if s.owner_kind != CLAIM_KIND:
        raise CdiError("use", what, f"slice {slice_id} belongs to {s.owner_kind} {s.owner}, "
                       "not to a claim")
    check_claim_use(key, ident, dict(s.labels), annotations)
    return edits


def give_vgpu(store: SpecStore, spec: Spec, container_id: str, bundle: Path, config: Config,
              slices: Slices, hook: Path | None, cdi_dirs: Sequence[Path] = SPEC_DIRS
              ) -> Callable[[], None] | None:
    """The vGPU path: validate, allocate, modify and flush `spec` (loaded from `store`).

    A container whose CDI annotations name `vgpu.io/claim` devices (containerd 1.6, which
    has no CDI) gets those devices' container edits from their spec files in `cdi_dirs`,
    each only if it may use that claim (claim_edits): nothing is applied otherwise.

    Returns a function that releases the slice again (the runtime could not be told, or
    its exec failed); None, with the spec untouched, when the exact request test finds
    no request. On any failure after the allocation, releases the slice first.
    """
    annotations: Mapping[str, str] = spec.get("annotations") or {}
    claims = claim_requests(annotations)
    if claims and container_type(annotations) != SANDBOX:
        # containerd 1.6 has no CDI: apply the claim's spec here, as a CDI engine would,
        # once every device is this container's to use (a pod sets these annotations
        # itself). The claim holds the slice; nothing is allocated, nothing to undo.
        edits = tuple(claim_edits(key, ident, annotations, cdi_dirs, slices)
                      for key, ident in claims)
        CdiEditsModifier(edits).modify(spec)
        store.flush(spec)
        return None
    process = spec.get("process") or {}
    raw = find_request(annotations, process.get("env") or [],
                       allow_env=config.allow_env_requests)
    if raw is None:
        return None
    # A pod author's keys only where the config trusts them (oci_hook.trust).
    check_request(raw, annotations, bundle, config)
    from_env = not request_keys(annotations)
    settings = hook_settings(hook, config)
    request = parse_request(raw, owner=container_id, defaults=slices.defaults())
    # Who asks: the bundle tells this container from another with the same id until its
    # prestart records its init (the domain refuses an id another live container holds).
    request = dataclasses.replace(request, bundle=str(bundle),
                                  labels=workload_labels(annotations))
    try:
        granted = slices.allocate(request).slice
    except VgpuError as e:
        raise AllocateError(container_id, str(e)) from e

    def undo() -> None:
        release(slices, container_id, bundle=str(bundle))
    try:
        view = view_of(slices, granted)
        info = SliceInfo(id=view.id, gpu_uuids=tuple(v.gpu_uuid for v in view.vgpus),
                         device_nodes=tuple(n for v in view.vgpus for n in v.device_nodes),
                         env=slice_env(view))
        for_slice(info, settings, env_request=from_env).modify(spec)
        store.flush(spec)
    except BaseException:
        undo()
        raise
    return undo
