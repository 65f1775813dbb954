# SPDX-License-Identifier: Apache-2.0
"""NodePrepareResources and NodeUnprepareResources for one claim, and the start-up
reconcile against vgpud, with the checkpoint kept in step.

Prepare: a claim in the checkpoint is answered from it (vgpud's Allocate is idempotent
per owner, so its slice is made again if it vanished, and the spec rewritten); else the
claim is read from the API server, planned (claims.py), its slice allocated, its CDI spec
written, the checkpoint saved, in that order; a failure at any step undoes the earlier
ones, so a claim that cannot be prepared leaves no slice, no spec and no entry.
Unprepare: release the slice, remove the spec, drop the entry; a claim never prepared
is fine (the kubelet may ask twice).
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arbiter.errors import VgpuError
from arbiter.model import WORKLOAD_LABELS
from oci_hook import cdi, nvidia
from vgpu_k8s.dra import checkpoint
from vgpu_k8s.dra.apiserver import Cluster
from vgpu_k8s.dra.checkpoint import Entry
from vgpu_k8s.dra.claims import OWNER_PREFIX, AnsweredDevice, ClaimRef, plan
from vgpu_k8s.dra.errors import VgpudError
from vgpu_k8s.dra.vgpud import Gpu, Vgpud

__all__ = ["LABEL_CLAIM", "LABEL_NODE", "LABEL_UID", "PREPARE_FAILED", "Answer", "Preparer",
           "refusal_event"]

log = logging.getLogger("vgpu-dra-plugin")

#: Labels of a claim's vgpud slice: whose it is (`vgpu slices` shows them). One definition,
#: oci_hook.cdi's: containerd 1.6's runtime handler gives a claim's device only to a pod
#: of the namespace in LABEL_CLAIM (namespace/name).
LABEL_CLAIM = cdi.LABEL_CLAIM
LABEL_UID = cdi.LABEL_UID
LABEL_NODE = cdi.LABEL_NODE
#: The claim's namespace, under the key metrics and events name a slice's namespace by (a
#: claim may serve several pods: no pod or container label).
LABEL_NAMESPACE = dict(WORKLOAD_LABELS)["namespace"]


@dataclass(frozen=True)
class Answer:
    """A claim's answer to the kubelet: its devices with their CDI IDs, or an error."""

    devices: tuple[AnsweredDevice, ...] = ()
    cdi_device_ids: tuple[str, ...] = ()
    error: str = ""


#: The Event reason of a claim that cannot be prepared on this node.
PREPARE_FAILED = "VgpuPrepareFailed"
#: Who posts it (the Event's source and reporting component).
COMPONENT = "vgpu-dra-plugin"


def refusal_event(ref: ClaimRef, why: str, node: str) -> dict[str, Any]:
    """A core/v1 Warning Event on the claim: the one line why it cannot be prepared."""
    digest = hashlib.sha256(f"{ref.uid}\0{why}".encode()).hexdigest()[:16]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        # A name is at most 253 characters: the claim's, cut to leave room for the hash.
        "metadata": {"name": f"{ref.name[:236]}.{digest}", "namespace": ref.namespace},
        "involvedObject": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
        "type": "Warning", "reason": PREPARE_FAILED,
        "message": f"cannot prepare on node {node}: {why}"[:1024],
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT, "reportingInstance": node,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


def _spec_name(uid: str) -> str:
    """The claim's CDI device name: its UID (unique, and valid in a CDI name)."""
    return uid


class Preparer:
    """Claims in, slices and CDI specs out; one lock keeps them and the checkpoint in step."""

    def __init__(self, *, node: str, vgpud: Vgpud, cluster: Cluster, cdi_dir: Path,
                 checkpoint_path: Path, gpus: Callable[[], Sequence[Gpu]],
                 nvidia_cdi_dirs: Sequence[Path] = ()) -> None:
        self.node = node
        self.nvidia_cdi_dirs = tuple(nvidia_cdi_dirs)
        self.vgpud = vgpud
        self.cluster = cluster
        self.cdi_dir = cdi_dir
        self.checkpoint_path = checkpoint_path
        self._gpus = gpus
        self._lock = threading.Lock()
        self.entries: dict[str, Entry] = checkpoint.load(checkpoint_path)

    # -- the spec ---------------------------------------------------------------

    def _write_spec(self, uid: str, slice_msg: Any) -> str:
        """Write the claim's CDI spec for its slice; its CDI device ID."""
        paths = self.vgpud.paths()
        libvgpu, hook = paths.get("libvgpu"), paths.get("hook")
        if not libvgpu or not hook:
            raise VgpudError("write the claim's CDI spec", "vgpud does not say where libvgpu "
                             "and vgpu-hook are (its Health paths; an older vgpud?)")
        hook_env = {"VGPU_SOCKET": paths.get("socket") or self.vgpud.socket}
        if paths.get("config"):
            hook_env["VGPU_CONFIG"] = paths["config"]
        name = _spec_name(uid)
        spec = cdi.claim_spec(cdi.view_of_message(slice_msg), name=name,
                              libvgpu=Path(libvgpu), hook=Path(hook), hook_env=hook_env)
        cdi.write_spec(self.cdi_dir, name, spec)
        return cdi.device_id(name)

    def _nvidia_ids(self, vgpus: Sequence[Any]) -> list[str]:
        """NVIDIA's CDI devices of the claim's GPUs, where the toolkit's spec names them
        (oci_hook.nvidia): the engine then adds the driver and those GPUs' nodes. Chosen
        once, at the first prepare, and kept in the checkpoint with the claim's answer."""
        if not self.nvidia_cdi_dirs:
            return []
        index = {g.uuid: g.index for g in self._gpus()}
        return nvidia.cdi_devices(nvidia.spec_names(self.nvidia_cdi_dirs),
                                  [(index[v.gpu_uuid], v.gpu_uuid) for v in vgpus
                                   if v.gpu_uuid in index])

    def _save(self) -> None:
        checkpoint.save(self.checkpoint_path, self.entries)

    # -- prepare ----------------------------------------------------------------

    def prepare(self, ref: ClaimRef) -> Answer:
        """Prepare one claim (idempotent); the answer carries one line on failure."""
        with self._lock:
            try:
                entry = self.entries.get(ref.uid)
                if entry is not None:
                    return self._again(entry)
                return self._first(ref)
            except (VgpuError, OSError) as e:
                line = " ".join(f"failed to prepare claim {ref} ({ref.uid}): {e}".split())
                log.warning("%s", line)
                self._tell(ref, str(e))
                return Answer(error=line)

    def _tell(self, ref: ClaimRef, why: str) -> None:
        """A Warning Event on the claim, so `kubectl describe` shows why (best effort: the
        kubelet gets the line either way). Named by the claim and the reason, so the
        kubelet's retries of one failure post it once."""
        why = " ".join(why.split())
        try:
            self.cluster.post_event(ref.namespace, refusal_event(ref, why, self.node))
        except (VgpuError, OSError) as e:
            log.warning("claim %s: could not post its Event: %s", ref, e)

    def _again(self, entry: Entry) -> Answer:
        """A prepared claim: the same answer; its slice and spec made again if they went."""
        slice_msg, existing = self.vgpud.allocate(entry.owner, entry.vgpus,
                                                  self._labels(entry.claim))
        if not existing or slice_msg.id != entry.slice_id or not cdi.spec_path(
                self.cdi_dir, _spec_name(entry.claim.uid)).exists():
            log.info("claim %s: slice %s made again as %s", entry.claim, entry.slice_id,
                     slice_msg.id)
            self._write_spec(entry.claim.uid, slice_msg)
            self.entries[entry.claim.uid] = Entry(
                entry.claim, entry.owner, slice_msg.id, entry.cdi_device_ids, entry.devices,
                entry.vgpus)
            self._save()
        return Answer(entry.devices, entry.cdi_device_ids)

    def _labels(self, ref: ClaimRef) -> dict[str, str]:
        return {LABEL_CLAIM: str(ref), LABEL_UID: ref.uid, LABEL_NODE: self.node,
                LABEL_NAMESPACE: ref.namespace}

    def _first(self, ref: ClaimRef) -> Answer:
        claim_obj = self.cluster.get_claim(ref.namespace, ref.name)
        p = plan(claim_obj, ref, self.node, self._gpus())
        slice_msg, existing = self.vgpud.allocate(p.owner, p.vgpus, self._labels(ref))
        try:
            cdi_ids = (self._write_spec(ref.uid, slice_msg), *self._nvidia_ids(p.vgpus))
            self.entries[ref.uid] = Entry(ref, p.owner, slice_msg.id, cdi_ids, p.devices,
                                          p.vgpus)
            self._save()
        except BaseException:
            self.entries.pop(ref.uid, None)
            with contextlib.suppress(VgpuError, OSError):
                cdi.remove_spec(self.cdi_dir, _spec_name(ref.uid))
            if not existing:
                with contextlib.suppress(VgpuError):
                    self.vgpud.release(p.owner)
            raise
        log.info("prepared claim %s (%s): slice %s, %s", ref, ref.uid, slice_msg.id,
                 ", ".join(f"{v.gpu_uuid} {v.memory} bytes {v.compute}%" for v in p.vgpus))
        return Answer(p.devices, cdi_ids)

    # -- unprepare --------------------------------------------------------------

    def unprepare(self, ref: ClaimRef) -> str:
        """Unprepare one claim (a claim never prepared is fine); an error line or ""."""
        with self._lock:
            try:
                entry = self.entries.get(ref.uid)
                if entry is not None:
                    owners = [entry.owner]
                else:   # not in the checkpoint (a crash between Allocate and the save)
                    owners = [s.owner for s in self.vgpud.claim_slices()
                              if s.labels.get(LABEL_UID) == ref.uid
                              and s.owner.startswith(OWNER_PREFIX)]
                for owner in owners:
                    self.vgpud.release(owner)
                cdi.remove_spec(self.cdi_dir, _spec_name(ref.uid))
                if self.entries.pop(ref.uid, None) is not None:
                    self._save()
            except (VgpuError, OSError) as e:
                line = " ".join(f"failed to unprepare claim {ref} ({ref.uid}): {e}".split())
                log.warning("%s", line)
                return line
        if entry is not None or owners:
            log.info("unprepared claim %s (%s)", ref, ref.uid)
        return ""

    # -- reconcile --------------------------------------------------------------

    def reconcile(self) -> None:
        """At start: release this node's claim slices the checkpoint does not know (a claim
        unprepared while the plugin was down, or a crash mid-prepare), and make again the
        slices of checkpointed claims that vanished (or log why they cannot be)."""
        with self._lock:
            known = {e.owner for e in self.entries.values()}
            for s in self.vgpud.claim_slices():
                if (s.owner.startswith(OWNER_PREFIX) and s.owner not in known
                        and s.labels.get(LABEL_NODE, self.node) == self.node):
                    self.vgpud.release(s.owner)
                    log.info("released slice %s of claim %s: not in the checkpoint", s.id,
                             s.labels.get(LABEL_CLAIM, s.owner))
            for entry in list(self.entries.values()):
                try:
                    self._again(entry)
                except (VgpuError, OSError) as e:
                    log.warning("claim %s (%s): its slice %s is gone and cannot be made "
                                "again: %s", entry.claim, entry.claim.uid, entry.slice_id,
                                " ".join(str(e).split()))

