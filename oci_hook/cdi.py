# SPDX-License-Identifier: Apache-2.0
"""The CDI spec of a claim's slice: what a CDI-capable engine applies to give a container it.

A DRA claim's slice (owner kind `claim`) reaches its containers through the Container
Device Interface: the DRA plugin writes one spec per claim into a CDI directory and
answers the kubelet the device ID `vgpu.io/claim=<name>`; containerd >= 1.7, CRI-O and
Podman apply the spec's container edits themselves, no runtime class needed (containerd
1.6 has no CDI: the `vgpu` runtime handler applies the same edits from the spec file,
shim.runtime).

The edits are the runtime path's own, from the same functions (oci_hook.mounts): the env
that names the slice's GPUs, the GPUs' device nodes, and as bind mounts libvgpu, the
region files (read-only), the usage files and the slice's scheduling request (the
slice's own, read-write), the GPUs' scheduling files (read-only). What the engine cannot
do from a spec is made by a `createRuntime` hook, `vgpu-hook claim <slice id>`: the
/etc/ld.so.preload that names libvgpu, merged with the image's own (it depends on the
image), which vgpud plans and vgpu-hook writes with its safe mount code.

cdiVersion 0.3.0, the lowest that carries all of it (CDI SPEC.md, "Released versions"):
0.3.0 has env, deviceNodes (path, type, major, minor, permissions), mounts (hostPath,
containerPath, options) and hooks; 0.4.0 added a mount `type`, 0.5.0 `hostPath` on device
nodes, 0.6.0 annotations: none is used, so Podman 4.x (reads up to 0.5.0) and every newer
engine read it. Engines refuse a spec with a field its version does not have.

Who may use a claim's device on that path (check_claim_use): containerd 1.6 passes pod
annotations `cdi.k8s.io/*` on to the container, so any pod can name any claim's device; the
device is given only to a container of the claim's namespace, which containerd itself
writes (`io.kubernetes.cri.sandbox-namespace`, a key no pod annotation can set through
the handler's `vgpu.io/*`, `cdi.k8s.io/*` patterns), checked against the namespace the DRA
plugin labels the claim's slice with.

Pure but for write_spec / remove_spec / find_edits (files) and the stat of device nodes
(a parameter).
"""
from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arbiter.config import DEFAULT_CDI_SPEC_DIRS
from arbiter.files.atomic import write_whole
from oci_hook.errors import HookError
from oci_hook.mounts import Mount, slice_env, slice_mounts
from oci_hook.request import COMPUTE as COMPUTE_KEY
from oci_hook.request import DEVICES as DEVICES_KEY
from oci_hook.request import HOOK_KEYS_PHASE, hook_args
from oci_hook.request import MEMORY as MEMORY_KEY
from oci_hook.slices import SliceView, VGpuView

if TYPE_CHECKING:
    from arbiter.proto import vgpu_pb2

__all__ = [
    "ANNOTATION_PREFIX",
    "CDI_VERSION",
    "HOOK_COMMAND",
    "HOOK_PHASE",
    "KIND",
    "LABEL_CLAIM",
    "LABEL_NODE",
    "LABEL_UID",
    "REQUEST_KIND",
    "SANDBOX_NAMESPACE",
    "SPEC_DIRS",
    "CdiError",
    "DeviceNode",
    "check_claim_use",
    "claim_requests",
    "claim_spec",
    "device_id",
    "edits_slice_id",
    "find_edits",
    "remove_spec",
    "request_device",
    "request_device_id",
    "request_spec",
    "spec_bytes",
    "spec_path",
    "stat_device",
    "view_of_message",
    "write_spec",
]

#: The CDI kind (vendor/class) of every claim's device.
KIND = "vgpu.io/claim"
#: The CDI kind of the device plugin's devices, each one a piece of a container's request
#: (request_spec); KIND's claims are slices that exist already.
REQUEST_KIND = "vgpu.io/vgpu"
#: The lowest CDI version with every field the spec uses (the module's docstring says why).
CDI_VERSION = "0.3.0"
#: vgpu-hook's subcommand for a claim's container: `vgpu-hook claim <slice id>`.
HOOK_COMMAND = "claim"
#: CDI device requests as annotations (`cdi.k8s.io/<plugin>_<id>: kind=name,...`): what
#: kubelets up to 1.30 set for DRA claims (1.31 and later send only the CRI field
#: CDIDevices, which containerd 1.6 does not know), and what a pod may set itself.
ANNOTATION_PREFIX = "cdi.k8s.io/"
#: Where engines look for CDI specs by default (containerd, CRI-O, Podman); vgpud's
#: runtime.cdi_spec_dirs (one definition, the config's default).
SPEC_DIRS = DEFAULT_CDI_SPEC_DIRS
#: The OCI hook phase: in the runtime's namespaces before pivot_root, like prestart
#: (which CDI does not offer), and what vgpu-hook's mount code needs.
HOOK_PHASE = "createRuntime"
#: Labels the DRA plugin gives a claim's vgpud slice (`vgpu slices` shows them): whose it
#: is, `<namespace>/<name>` (check_claim_use reads the namespace), its UID, its node.
LABEL_CLAIM = "dra.vgpu.io/claim"
LABEL_UID = "dra.vgpu.io/claim-uid"
LABEL_NODE = "dra.vgpu.io/node"
#: The pod's namespace on each of its containers, written by containerd's CRI plugin.
SANDBOX_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"

# CDI SPEC.md: a device name is letters and digits with `_ - . :` inside.
_NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
_NAME_MAX = 128  # ours: a file name and an annotation value must stay short


class CdiError(HookError, ValueError):
    """A claim's CDI spec cannot be made, written or found: ``failed to <verb> ...: why``."""

    def __init__(self, verb: str, what: str, reason: str) -> None:
        self.verb = verb
        self.what = what
        self.reason = reason
        super().__init__(" ".join(f"failed to {verb} {what}: {reason}".split()))


def _check_name(name: str) -> str:
    if not isinstance(name, str) or len(name) > _NAME_MAX or not _NAME_RE.fullmatch(name):
        raise CdiError("name", f"the CDI device {name!r}",
                       f"a name is 1..{_NAME_MAX} letters and digits, with _ - . : inside")
    return name


def device_id(name: str) -> str:
    """The fully qualified CDI device ID of claim device `name`: `vgpu.io/claim=<name>`."""
    return f"{KIND}={_check_name(name)}"


def spec_path(cdi_dir: Path, name: str, kind: str = KIND) -> Path:
    """Where the spec of device `name` of `kind` lives: `<dir>/vgpu.io-claim_<name>.json`
    (CDI's naming guidance: `<vendor>-<class>_<unique>.json`, one device per file)."""
    return Path(cdi_dir) / f"{kind.replace('/', '-')}_{_check_name(name)}.json"


@dataclass(frozen=True)
class DeviceNode:
    """A host device node as CDI's deviceNodes needs it."""

    path: str
    type: str        # "c" or "b"
    major: int
    minor: int


def stat_device(path: str) -> DeviceNode | None:
    """Stat a host device node; None when it is not a character or block device (a test's
    stand-in file: then it is bind-mounted like the other files)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        return DeviceNode(path, "c", os.major(st.st_rdev), os.minor(st.st_rdev))
    if stat.S_ISBLK(st.st_mode):
        return DeviceNode(path, "b", os.major(st.st_rdev), os.minor(st.st_rdev))
    return None


def _mount_options(m: Mount) -> list[str]:
    """The OCI options that make a bind mount what vgpu-hook's remount makes it."""
    opts = ["ro" if m.read_only else "rw", "nosuid"]
    if not m.device:
        opts.append("nodev")
    if not m.executable and not m.device:
        opts.append("noexec")
    return [*opts, "bind"]


def claim_spec(view: SliceView, *, name: str, libvgpu: Path, hook: Path,
               hook_env: Mapping[str, str] | None = None, hook_timeout: int = 30,
               stat_node: Callable[[str], DeviceNode | None] = stat_device) -> dict[str, Any]:
    """The CDI spec (a JSON document) with one device `name` that gives a container the
    claim slice `view`.

    `libvgpu` and `hook` are host paths of the library to mount and of vgpu-hook;
    `hook_env` reaches the right vgpud (VGPU_SOCKET, VGPU_CONFIG) whatever environment
    the engine runs hooks with. MountError when a file of the slice is missing."""
    _check_name(name)
    if not view.id:
        raise CdiError("make", f"the CDI spec of {name}", "the slice has no id")
    mounts: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    for m in slice_mounts(view, libvgpu=libvgpu):
        node = stat_node(m.source) if m.device else None
        if node is not None and m.source == m.target:
            nodes.append({"path": node.path, "type": node.type, "major": node.major,
                          "minor": node.minor, "permissions": "rw"})
        else:
            mounts.append({"hostPath": m.source, "containerPath": m.target,
                           "options": _mount_options(m)})
    hook_doc: dict[str, Any] = {"hookName": HOOK_PHASE, "path": str(hook),
                                "args": [hook.name, HOOK_COMMAND, view.id]}
    if hook_env:
        hook_doc["env"] = [f"{k}={v}" for k, v in hook_env.items()]
    if hook_timeout > 0:
        hook_doc["timeout"] = hook_timeout
    edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in slice_env(view)]}
    if nodes:
        edits["deviceNodes"] = nodes
    edits["mounts"] = mounts
    edits["hooks"] = [hook_doc]
    return {"cdiVersion": CDI_VERSION, "kind": KIND,
            "devices": [{"name": name, "containerEdits": edits}]}


def request_device(keys: Mapping[str, str]) -> str:
    """The name of the device-plugin CDI device that carries request `keys` (vgpu.io/*):
    `memory-4Gi-<gpu uuid>` for memory on a GPU, `compute-30` for a compute share. The name
    follows from the keys alone, so a spec once written serves every later container that
    gets the same keys, and there are at most GPUs x memory units + 99 of them."""
    memory, devices = keys.get(MEMORY_KEY), keys.get(DEVICES_KEY)
    if memory and devices and set(keys) == {MEMORY_KEY, DEVICES_KEY}:
        return _check_name(f"memory-{memory}-{devices}")
    compute = keys.get(COMPUTE_KEY)
    if compute and set(keys) == {COMPUTE_KEY}:
        return _check_name(f"compute-{compute}")
    raise CdiError("name", f"the CDI device of {dict(keys)}",
                   f"the device plugin gives {MEMORY_KEY} with {DEVICES_KEY}, or "
                   f"{COMPUTE_KEY} alone")


def request_spec(keys: Mapping[str, str], *, hook: Path,
                 hook_env: Mapping[str, str] | None = None, hook_timeout: int = 30,
                 device_nodes: Sequence[str] = (),
                 stat_node: Callable[[str], DeviceNode | None] = stat_device
                 ) -> dict[str, Any]:
    """The CDI spec (kind REQUEST_KIND) with one device, request_device(keys), that hands
    the kubelet's request `keys` (what vgpu-device-plugin's Allocate gives one container
    for one resource) to vgpu-hook: a createRuntime hook `vgpu-hook createRuntime K=V...`
    (oci_hook.request.hook_args; vgpud reads the keys of every such hook of the container,
    oci_hook.request.hook_keys). No slice exists yet: the memory device's hook asks vgpud
    for one and mounts it, as on the runtime path, and its poststop hook releases it; the
    memory device also names its GPU (env, and `device_nodes`, those that are device
    nodes here). The compute device's hook only carries its key."""
    name = request_device(keys)
    memory = MEMORY_KEY in keys

    def hook_doc(phase: str) -> dict[str, Any]:
        doc: dict[str, Any] = {"hookName": phase, "path": str(hook),
                               "args": [hook.name, *hook_args(phase, keys)]}
        if hook_env:
            doc["env"] = [f"{k}={v}" for k, v in hook_env.items()]
        if hook_timeout > 0:
            doc["timeout"] = hook_timeout
        return doc

    edits: dict[str, Any] = {}
    if memory:
        gpu = keys[DEVICES_KEY]
        edits["env"] = [f"CUDA_VISIBLE_DEVICES={gpu}", f"NVIDIA_VISIBLE_DEVICES={gpu}"]
        nodes = [n for n in (stat_node(p) for p in dict.fromkeys(device_nodes)) if n]
        if nodes:
            edits["deviceNodes"] = [{"path": n.path, "type": n.type, "major": n.major,
                                     "minor": n.minor, "permissions": "rw"} for n in nodes]
    edits["hooks"] = [hook_doc(HOOK_KEYS_PHASE)] + ([hook_doc("poststop")] if memory else [])
    return {"cdiVersion": CDI_VERSION, "kind": REQUEST_KIND,
            "devices": [{"name": name, "containerEdits": edits}]}


def request_device_id(keys: Mapping[str, str]) -> str:
    """The fully qualified ID of request_device(keys): `vgpu.io/vgpu=<name>`."""
    return f"{REQUEST_KIND}={request_device(keys)}"


def spec_bytes(spec: Mapping[str, Any]) -> bytes:
    """The bytes write_spec writes for `spec`."""
    return (json.dumps(spec, indent=2) + "\n").encode()


def write_spec(cdi_dir: Path, name: str, spec: Mapping[str, Any]) -> Path:
    """Write `spec` as the file of device `name` in `cdi_dir` (made if missing), atomically:
    an engine that reads the directory sees the old file or the new one, never a part
    (arbiter.files.atomic, durable; mode 0644). The file is named
    by the spec's kind."""
    path = spec_path(cdi_dir, name, str(spec.get("kind", KIND)))
    data = spec_bytes(spec)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # The temporary name ends in .tmp: engines that watch the directory skip it.
        write_whole(path, data, 0o644, durable=True)
    except OSError as e:
        raise CdiError("write", str(path), e.strerror or str(e)) from e
    return path


def remove_spec(cdi_dir: Path, name: str) -> bool:
    """Remove the spec of device `name`; False when there was none (idempotent)."""
    path = spec_path(cdi_dir, name)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise CdiError("remove", str(path), e.strerror or str(e)) from e
    return True


def claim_requests(annotations: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(annotation key, `vgpu.io/claim=<name>` device) for each claim device that CDI
    annotations request, in key order, each device once under its first key (other kinds
    are another driver's: left alone)."""
    found: dict[str, str] = {}
    for key in sorted(annotations):
        if not key.startswith(ANNOTATION_PREFIX) or not isinstance(annotations[key], str):
            continue
        for item in annotations[key].split(","):
            item = item.strip()
            if item.startswith(f"{KIND}="):
                found.setdefault(item, key)
    return tuple((key, ident) for ident, key in found.items())


def edits_slice_id(edits: Mapping[str, Any]) -> str:
    """The slice a device's containerEdits give: the one their `vgpu-hook claim <slice id>`
    hook names (claim_spec); "" when no hook of theirs names one."""
    for h in edits.get("hooks") or []:
        args = h.get("args") if isinstance(h, Mapping) else None
        if isinstance(args, list) and len(args) == 3 and args[1] == HOOK_COMMAND \
                and isinstance(args[2], str):
            return args[2]
    return ""


def check_claim_use(key: str, ident: str, labels: Mapping[str, str],
                    annotations: Mapping[str, str]) -> None:
    """May the container with OCI `annotations` use claim device `ident` (requested by
    annotation `key`), whose slice carries `labels`? CdiError with the one line why not.

    A Kubernetes claim's slice (label LABEL_CLAIM, `<namespace>/<name>`) goes only to a
    container of that namespace (SANDBOX_NAMESPACE, which containerd writes): a pod may name
    any device in its annotations, but Kubernetes lets it use only the claims of its own
    namespace. A container with no namespace (not a pod's: `ctr`, a host tool) gets no
    Kubernetes claim, and a pod's container no slice the plugin did not label (the host
    made it, for the host's containers)."""
    claim = labels.get(LABEL_CLAIM, "")
    pod_ns = annotations.get(SANDBOX_NAMESPACE, "")
    pod_ns = pod_ns if isinstance(pod_ns, str) else ""
    why = ""
    if claim:
        claim_ns, sep, name = claim.partition("/")
        if not sep or not claim_ns or not name:
            why = f"its slice's label {LABEL_CLAIM}={claim!r} is not <namespace>/<name>"
        elif not pod_ns:
            why = (f"claim {claim} is a Kubernetes claim and the container is no pod's "
                   f"(it has no {SANDBOX_NAMESPACE} annotation)")
        elif pod_ns != claim_ns:
            why = f"claim {claim} is not this pod's (the pod is in namespace {pod_ns})"
    elif pod_ns:
        why = (f"its slice is no Kubernetes claim's (no {LABEL_CLAIM} label), so no pod "
               f"may use it (the pod is in namespace {pod_ns})")
    if why:
        raise CdiError("use", f"the CDI device {ident} of annotation {key}", why)


def find_edits(dirs: Sequence[Path], ident: str) -> dict[str, Any]:
    """The containerEdits of CDI device `ident` (`vgpu.io/claim=<name>`), from its spec file
    in the first of `dirs` that has one (later dirs win in CDI; ours writes one file per
    device, so the first found is the one). CdiError when none has it."""
    kind, sep, name = ident.partition("=")
    if kind != KIND or not sep:
        raise CdiError("resolve", f"the CDI device {ident!r}", f"not a {KIND} device")
    found: dict[str, Any] | None = None
    for d in reversed(list(dirs)):   # CDI: a later directory's spec wins
        path = spec_path(d, name)
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            raise CdiError("read", str(path), str(e)) from e
        found = _device_edits(doc, name, path)
        break
    if found is None:
        where = ", ".join(str(d) for d in dirs) or "no CDI directory"
        raise CdiError("resolve", f"the CDI device {ident}",
                       f"no spec in {where} (is the claim prepared on this node?)")
    return found


def _device_edits(doc: Any, name: str, path: Path) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise CdiError("read", str(path), f"not a CDI spec of kind {KIND}")
    for dev in doc.get("devices") or []:
        if isinstance(dev, dict) and dev.get("name") == name:
            edits = dev.get("containerEdits") or {}
            if not isinstance(edits, dict):
                raise CdiError("read", str(path), "containerEdits is not an object")
            return edits
    raise CdiError("read", str(path), f"no device {name!r}")


def view_of_message(msg: vgpu_pb2.Slice) -> SliceView:
    """A slice as vgpud's gRPC answers it (Allocate, Get), as the spec builder needs it:
    the DRA plugin asks vgpud over gRPC, not through the domain."""
    return SliceView(id=msg.id, owner=msg.owner, region_dir=msg.region_dir, vgpus=tuple(
        VGpuView(index=v.index, gpu_uuid=v.gpu_uuid, region_path=v.region_path,
                 device_nodes=tuple(v.device_nodes))
        for v in sorted(msg.vgpus, key=lambda v: v.index)))
