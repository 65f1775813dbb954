# SPDX-License-Identifier: Apache-2.0
"""Who may use a claim's CDI device on containerd 1.6's annotation path
(oci_hook.cdi.check_claim_use, claim_requests, edits_slice_id): pure, annotations and the
claim slice's labels in, ok or one line out.

A pod sets `cdi.k8s.io/*` annotations itself, so the device it names is only a request:
the claim's namespace (the DRA plugin's slice label) must be the pod's, as containerd
writes it. The real containerd path is tests/e2e/test_e2e_cri_cdi.py.
"""
from __future__ import annotations

import pytest

from oci_hook import cdi

KEY = "cdi.k8s.io/vgpu.io_u1"
DEV = "vgpu.io/claim=u1"
NS = cdi.SANDBOX_NAMESPACE
CLAIM_A = {cdi.LABEL_CLAIM: "team-a/train", cdi.LABEL_UID: "u1", cdi.LABEL_NODE: "n1"}
PREFIX = f"failed to use the CDI device {DEV} of annotation {KEY}: "


@pytest.mark.parametrize(("labels", "annotations"), [
    pytest.param(CLAIM_A, {NS: "team-a"}, id="the-claim-s-namespace"),
    pytest.param({}, {}, id="a-host-slice-for-a-host-container"),
    pytest.param({cdi.LABEL_UID: "u1"}, {"io.kubernetes.cri.container-type": "container"},
                 id="no-claim-label-no-namespace"),
])
def test_a_container_may_use_the_claim_of_its_own_namespace(labels, annotations):
    assert cdi.check_claim_use(KEY, DEV, labels, {KEY: DEV, **annotations}) is None


@pytest.mark.parametrize(("labels", "annotations", "reason"), [
    pytest.param(CLAIM_A, {NS: "team-b"},
                 "claim team-a/train is not this pod's (the pod is in namespace team-b)",
                 id="another-namespace"),
    pytest.param(CLAIM_A, {},
                 f"claim team-a/train is a Kubernetes claim and the container is no pod's "
                 f"(it has no {NS} annotation)", id="no-namespace"),
    pytest.param(CLAIM_A, {NS: ""},
                 f"claim team-a/train is a Kubernetes claim and the container is no pod's "
                 f"(it has no {NS} annotation)", id="empty-namespace"),
    # Only containerd's own key counts: CRI-O's and the kubelet's label are no proof here.
    pytest.param(CLAIM_A, {NS: "team-b", "io.kubernetes.pod.namespace": "team-a"},
                 "claim team-a/train is not this pod's (the pod is in namespace team-b)",
                 id="a-second-namespace-key-is-ignored"),
    pytest.param({}, {NS: "team-b"},
                 f"its slice is no Kubernetes claim's (no {cdi.LABEL_CLAIM} label), so no "
                 f"pod may use it (the pod is in namespace team-b)", id="an-unlabelled-slice"),
    pytest.param({cdi.LABEL_CLAIM: "train"}, {NS: "team-a"},
                 f"its slice's label {cdi.LABEL_CLAIM}='train' is not <namespace>/<name>",
                 id="a-label-without-namespace"),
    pytest.param({cdi.LABEL_CLAIM: "/train"}, {NS: ""},
                 f"its slice's label {cdi.LABEL_CLAIM}='/train' is not <namespace>/<name>",
                 id="an-empty-label-namespace"),
])
def test_any_other_container_is_refused_with_one_line(labels, annotations, reason):
    with pytest.raises(cdi.CdiError) as err:
        cdi.check_claim_use(KEY, DEV, labels, {KEY: DEV, **annotations})
    assert str(err.value) == PREFIX + reason
    assert "\n" not in str(err.value)


def test_claim_requests_name_each_device_once_with_its_first_key():
    annotations = {
        "cdi.k8s.io/z": "vgpu.io/claim=a",
        "cdi.k8s.io/b": "example.com/gpu=0, vgpu.io/claim=b ,vgpu.io/claim=a",
        "vgpu.io/memory": "vgpu.io/claim=c",       # not a CDI annotation
        "cdi.k8s.io/n": 3,                         # not a string: ignored
    }
    assert cdi.claim_requests(annotations) == (  # type: ignore[arg-type]
        ("cdi.k8s.io/b", "vgpu.io/claim=b"), ("cdi.k8s.io/b", "vgpu.io/claim=a"))


def test_the_edits_name_the_slice_their_claim_hook_asks_for():
    """claim_spec's hook is `vgpu-hook claim <slice id>` (a real spec's id:
    tests/shim/test_runtime_claim_use.py)."""
    def hook(*args: str) -> dict[str, object]:
        return {"hookName": "createRuntime", "path": "/bin/vgpu-hook", "args": list(args)}
    assert cdi.edits_slice_id({"hooks": [hook("other", "x"),
                                         hook("vgpu-hook", cdi.HOOK_COMMAND, "s-7")]}) == "s-7"
    assert cdi.edits_slice_id({"hooks": [hook("vgpu-hook", "prestart", "s-7")]}) == ""
    assert cdi.edits_slice_id({"hooks": [hook("vgpu-hook", cdi.HOOK_COMMAND)]}) == ""
    assert cdi.edits_slice_id({}) == ""
