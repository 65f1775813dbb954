# SPDX-License-Identifier: Apache-2.0
"""oci_hook.trust: which source may set which request key, happy and sad; the pod's keys
read from its sandbox's spec (real files)."""
from __future__ import annotations

import json
import os

import pytest

from oci_hook.errors import SourceError, StateError
from oci_hook.trust import (
    SANDBOX_ID_KEY,
    TrustedSources,
    check_sources,
    pod_keys,
    pod_namespace,
)

CRI, CRIO = "io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType"
NS, CRIO_NS = "io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace"
MEM, PRIO, POL = "vgpu.io/memory", "vgpu.io/priority", "vgpu.io/policy"
NONE = TrustedSources()
TEAM = TrustedSources(pod_annotations={"ml": frozenset({"priority", "policy"}),
                                       "*": frozenset({"memory"})},
                      pod_env={"ml": frozenset({"memory", "priority"})})

ALLOWED = [
    # (id, raw request, from env, the pod's keys, namespace, rules)
    ("kubelet-keys-only", {MEM: "1Gi", "vgpu.io/devices": "0"}, False, {}, "team-a", NONE),
    ("pod-key-listed", {MEM: "1Gi", PRIO: "high"}, False, {PRIO: "high"}, "ml", TEAM),
    ("pod-memory-any-namespace", {MEM: "1Gi"}, False, {MEM: "1Gi"}, "team-a", TEAM),
    ("env-listed", {MEM: "1Gi", PRIO: "high"}, True, {}, "ml", TEAM),
    ("internal-pod-key-is-no-request", {MEM: "1Gi"}, False, {"vgpu.io/slice": "s"},
     "team-a", NONE),
]


@pytest.mark.parametrize(("raw", "env", "pod", "ns", "rules"), [a[1:] for a in ALLOWED],
                         ids=[a[0] for a in ALLOWED])
def test_allowed(raw, env, pod, ns, rules):
    check_sources(raw, from_env=env, pod=pod, namespace=ns, trusted=rules)


REFUSED = [
    ("pod-priority-by-default", {MEM: "1Gi", PRIO: "high"}, False, {PRIO: "high"}, "team-a",
     NONE, "vgpu.io/priority=high from the pod's annotations is not allowed in namespace "
           "team-a (requests.trusted_sources.pod_annotations lists no key for it)"),
    ("pod-key-overridden-still-counts", {MEM: "2Gi"}, False, {MEM: "1Gi"}, "team-a", NONE,
     "vgpu.io/memory=1Gi from the pod's annotations is not allowed"),
    ("pod-key-other-namespace", {MEM: "1Gi", PRIO: "high"}, False, {PRIO: "high"}, "team-a",
     TEAM, "vgpu.io/priority=high from the pod's annotations is not allowed in namespace "
           "team-a (requests.trusted_sources.pod_annotations lists only memory for it)"),
    ("pod-misspelt-key-first", {MEM: "1Gi"}, False, {"vgpu.io/prio": "x", POL: "burst"},
     "ml", TEAM, "vgpu.io/prio=x from the pod's annotations"),
    ("env-by-default", {MEM: "1Gi", PRIO: "high"}, True, {}, "team-a", NONE,
     "VGPU_MEMORY=1Gi from the container's env is not allowed in namespace team-a "
     "(requests.trusted_sources.pod_env lists no key for it)"),
    ("env-key-not-listed", {MEM: "1Gi", POL: "burst"}, True, {}, "ml", TEAM,
     "VGPU_POLICY=burst from the container's env is not allowed in namespace ml "
     "(requests.trusted_sources.pod_env lists only memory, priority for it)"),
    ("no-namespace", {MEM: "1Gi"}, True, {}, None, TEAM,
     "VGPU_MEMORY=1Gi from the container's env is not allowed in a pod with no namespace"),
]


@pytest.mark.parametrize(("raw", "env", "pod", "ns", "rules", "want"),
                         [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_with_one_line(raw, env, pod, ns, rules, want):
    with pytest.raises(SourceError) as e:
        check_sources(raw, from_env=env, pod=pod, namespace=ns, trusted=rules)
    assert str(e.value).startswith(want)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("annotations", "want"), [
    ({CRI: "container", NS: "team-a", CRIO_NS: "forged"}, "team-a"),
    ({CRIO: "container", CRIO_NS: "team-b"}, "team-b"),
    ({CRI: "container"}, None),
    ({NS: "team-a"}, None),   # not a CRI runtime's spec: no pod, no namespace
], ids=["containerd", "cri-o", "containerd-none", "no-cri"])
def test_pod_namespace(annotations, want):
    assert pod_namespace(annotations) == want


def sandbox(tmp_path, annotations, name="sb1"):
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps({"annotations": annotations}))
    (tmp_path / "ctr").mkdir(exist_ok=True)
    return tmp_path / "ctr"


def test_pod_keys_are_the_sandbox_spec_s(tmp_path):
    bundle = sandbox(tmp_path, {PRIO: "high", "vgpu.io/slice": "x", "other": "y"})
    got = pod_keys(bundle, {CRI: "container", SANDBOX_ID_KEY: "sb1", PRIO: "high", MEM: "1"})
    assert got == {PRIO: "high"}


def test_cri_o_containers_carry_no_pod_keys(tmp_path):
    assert pod_keys(tmp_path / "ctr", {CRIO: "container"}) == {}


@pytest.mark.parametrize("sandbox_id", ["", "..", "a/b"], ids=["none", "dotdot", "slash"])
def test_a_bad_sandbox_id_is_refused(tmp_path, sandbox_id):
    with pytest.raises(StateError, match=SANDBOX_ID_KEY):
        pod_keys(tmp_path / "ctr", {CRI: "container", SANDBOX_ID_KEY: sandbox_id})


def test_an_unreadable_sandbox_spec_fails_closed(tmp_path):
    (tmp_path / "ctr").mkdir()
    with pytest.raises(StateError, match=r"the pod's sandbox spec .*sb1/config\.json: No such"):
        pod_keys(tmp_path / "ctr", {CRI: "container", SANDBOX_ID_KEY: "sb1"})


def test_a_linked_or_special_sandbox_spec_is_not_read(tmp_path):
    (tmp_path / "sb1").mkdir()
    (tmp_path / "elsewhere.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere.json", tmp_path / "sb1" / "config.json")
    (tmp_path / "sb2").mkdir()
    os.mkfifo(tmp_path / "sb2" / "config.json")   # an open would block without O_NONBLOCK
    with pytest.raises(StateError, match="sandbox spec"):
        pod_keys(tmp_path / "ctr", {CRI: "container", SANDBOX_ID_KEY: "sb1"})
    with pytest.raises(StateError, match="not a regular file"):
        pod_keys(tmp_path / "ctr", {CRI: "container", SANDBOX_ID_KEY: "sb2"})
