# SPDX-License-Identifier: Apache-2.0
"""containerd 1.6's annotation path in vgpud (shim.runtime.claim_edits through the
runtime-create op): a claim's CDI device goes only to a container of the claim's
namespace; any other container's create is refused with one line and its config.json is
left as it was (no hook, so the claim never records it as a user).

A real domain (arbiter.slices.arbiter.Arbiter on a simulated GPU, its region files), real CDI spec
files, the op as vgpud serves it; the same through containerd itself is
tests/e2e/test_e2e_cri_cdi.py, the decision's table tests/oci_hook/test_cdi_claim_use.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from arbiter.config import Config
from arbiter.model import Request, VGpuAsk
from arbiter.slices.arbiter import Arbiter
from oci_hook import cdi
from oci_hook.request import CONTAINER_TYPE_KEYS
from oci_hook.slices import view_of
from shim.lifecycle import Fields
from shim.service import LifecycleOps

MI = 1 << 20
UID = "0b5e6c1e-1111-4a2b-9c3d-000000000001"
KEY = f"{cdi.ANNOTATION_PREFIX}vgpu.io_{UID}"
DEV = cdi.device_id(UID)
SPEC = {"ociVersion": "1.0.2", "process": {"args": ["sh"], "env": ["PATH=/bin"], "cwd": "/"},
        "root": {"path": "rootfs"}}


def prepare(domain: Arbiter, tmp: Path, uid: str, labels: dict[str, str],
            owner_kind: str = "claim") -> str:
    """What vgpu-dra-plugin's NodePrepare does: the labelled slice, then its CDI spec."""
    s = domain.allocate(Request(owner=f"vgpu.io/claim/{uid}", memory=0, compute=0,
                                owner_kind=owner_kind, labels=tuple(sorted(labels.items())),
                                vgpus=(VGpuAsk(128 * MI, 30),))).slice
    spec = cdi.claim_spec(view_of(domain, s), name=uid, libvgpu=tmp / "libvgpu.so",
                          hook=tmp / "vgpu-hook", stat_node=lambda _: None)
    cdi.write_spec(tmp / "cdi", uid, spec)
    return s.id


def create(domain: Arbiter, tmp: Path, name: str, annotations: dict[str, str]
           ) -> tuple[dict[str, str], bytes, bytes]:
    """runtime-create of a pod container with `annotations`: the reply, config.json before
    and after."""
    b = tmp / name
    (b / "rootfs").mkdir(parents=True)
    path = b / "config.json"
    path.write_text(json.dumps({**SPEC, "annotations": {
        CONTAINER_TYPE_KEYS[0]: "container", **annotations}}))
    before = path.read_bytes()
    ops = LifecycleOps(domain, Config(), cdi_dirs=(tmp / "cdi",)).ops()
    reply = dict(ops["runtime-create"](Fields([("bundle", str(b)), ("id", name)])).items)
    return reply, before, path.read_bytes()


def claim_hooks(config: bytes) -> list[list[str]]:
    doc = json.loads(config)
    return [h["args"] for h in (doc.get("hooks") or {}).get(cdi.HOOK_PHASE, [])]


def test_the_claim_s_namespace_gets_its_device(domain, tmp_path):
    sid = prepare(domain, tmp_path, UID, {cdi.LABEL_CLAIM: "team-a/train", cdi.LABEL_UID: UID})
    reply, _, after = create(domain, tmp_path, "legit",
                             {KEY: DEV, cdi.SANDBOX_NAMESPACE: "team-a"})
    assert reply["status"] == "ok", reply
    assert claim_hooks(after) == [["vgpu-hook", cdi.HOOK_COMMAND, sid]]


@pytest.mark.parametrize(("labels", "owner_kind", "namespace", "reason"), [
    pytest.param({cdi.LABEL_CLAIM: "team-a/train"}, "claim", "team-b",
                 "claim team-a/train is not this pod's (the pod is in namespace team-b)",
                 id="another-namespace"),
    pytest.param({cdi.LABEL_CLAIM: "team-a/train"}, "claim", None,
                 f"claim team-a/train is a Kubernetes claim and the container is no pod's "
                 f"(it has no {cdi.SANDBOX_NAMESPACE} annotation)", id="no-namespace"),
    pytest.param({}, "claim", "team-b",
                 f"its slice is no Kubernetes claim's (no {cdi.LABEL_CLAIM} label), so no pod "
                 f"may use it (the pod is in namespace team-b)", id="an-unlabelled-slice"),
    pytest.param({cdi.LABEL_CLAIM: "team-a/train"}, "container", "team-a",
                 f"slice {{sid}} belongs to container vgpu.io/claim/{UID}, not to a claim",
                 id="a-container-s-slice"),
])
def test_any_other_container_is_refused_with_one_line_and_its_spec_is_untouched(
        domain, tmp_path, labels, owner_kind, namespace, reason):
    sid = prepare(domain, tmp_path, UID, labels, owner_kind)
    ns = {} if namespace is None else {cdi.SANDBOX_NAMESPACE: namespace}
    reply, before, after = create(domain, tmp_path, "forged", {KEY: DEV, **ns})
    assert reply["status"] == "error"
    assert reply["message"] == (f"vgpu: failed to use the CDI device {DEV} of annotation "
                                f"{KEY}: {reason.format(sid=sid)}")
    assert after == before
    assert [s.id for s in domain.slices()] == [sid] and domain.users_of(sid) == ()


def test_one_device_refused_applies_none_of_them(domain, tmp_path):
    """Two claims named, the second another namespace's: not even the first is applied."""
    other = UID.replace("0001", "0002")
    prepare(domain, tmp_path, UID, {cdi.LABEL_CLAIM: "team-b/mine"})
    prepare(domain, tmp_path, other, {cdi.LABEL_CLAIM: "team-a/train"})
    key2 = f"{cdi.ANNOTATION_PREFIX}vgpu.io_{other}"
    reply, before, after = create(domain, tmp_path, "both", {
        KEY: DEV, key2: cdi.device_id(other), cdi.SANDBOX_NAMESPACE: "team-b"})
    assert reply["message"] == (
        f"vgpu: failed to use the CDI device {cdi.device_id(other)} of annotation {key2}: "
        "claim team-a/train is not this pod's (the pod is in namespace team-b)")
    assert after == before
