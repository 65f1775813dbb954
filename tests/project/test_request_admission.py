# SPDX-License-Identifier: Apache-2.0
"""configs/kubernetes/admission.yaml: the ValidatingAdmissionPolicy that refuses a pod's own
vGPU request keys outside the namespaces labelled for them, its CEL evaluated with
cel-python on sample pods as the API server evaluates it (binding selector, variables in
order, validations). Its schema check is tests/project/test_manifests.py's (every object)."""
from __future__ import annotations

from typing import Any

import celpy
import pytest
import yaml
from support.paths import ROOT

from oci_hook.request import ENV_KEYS

MANIFEST = ROOT / "configs" / "kubernetes" / "admission.yaml"
LABEL = "vgpu.io/pod-requests"
WHY = f"(the namespace has no label {LABEL}=allowed)"


def docs() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def policy_and_binding() -> tuple[dict[str, Any], dict[str, Any]]:
    d = docs()
    return d["ValidatingAdmissionPolicy"], d["ValidatingAdmissionPolicyBinding"]


def cel(expression: str, **activation: Any) -> Any:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})


def selected(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's matchExpressions (the operators this binding uses) on labels."""
    for e in selector.get("matchExpressions", []):
        has, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": has and value in e["values"], "NotIn": not has or value not in e["values"],
              "Exists": has, "DoesNotExist": not has}[e["operator"]]
        if not ok:
            return False
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def admit(pod: dict[str, Any], namespace: str = "team-a",
          labels: dict[str, str] | None = None) -> list[str]:
    """[] when the API server admits the pod's CREATE in `namespace`, else the messages."""
    policy, binding = policy_and_binding()
    if not selected(binding["spec"]["matchResources"]["namespaceSelector"], labels or {}):
        return []
    names = {"object": pod, "oldObject": None,
             "request": {"operation": "CREATE", "namespace": namespace}}
    variables: dict[str, Any] = {}
    for v in policy["spec"]["variables"]:
        variables[v["name"]] = cel(v["expression"], **names, variables=variables)
    return [str(cel(c["messageExpression"], **names, variables=variables))
            for c in policy["spec"]["validations"]
            if not cel(c["expression"], **names, variables=variables)]


def pod(annotations: dict[str, str] | None = None, env: dict[str, str] | None = None,
        init_env: dict[str, str] | None = None) -> dict[str, Any]:
    def container(name: str, values: dict[str, str] | None) -> dict[str, Any]:
        c: dict[str, Any] = {"name": name, "image": "trainer:1"}
        if values is not None:
            c["env"] = [{"name": k, "value": v} for k, v in values.items()]
        return c
    meta: dict[str, Any] = {"name": "p"}
    if annotations is not None:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"runtimeClassName": "vgpu",
                            "containers": [container("sidecar", {"A": "1"}),
                                           container("app", env)]}
    if init_env is not None:
        spec["initContainers"] = [container("setup", init_env)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def test_the_binding_denies_pods_outside_labelled_namespaces():
    policy, binding = policy_and_binding()
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == ([""], ["pods"],
                                                                          ["CREATE"])


def test_the_policy_names_exactly_the_request_env_vars():
    names = cel(docs()["ValidatingAdmissionPolicy"]["spec"]["variables"][1]["expression"])
    assert sorted(map(str, names)) == sorted(ENV_KEYS)


@pytest.mark.parametrize(("sample", "want"), [
    (pod({"vgpu.io/priority": "high"}),
     f"vgpu.io/priority=high from the pod's annotations is not allowed in namespace team-a {WHY}"),
    (pod({"team": "x", "vgpu.io/memory": "4Gi"}),
     f"vgpu.io/memory=4Gi from the pod's annotations is not allowed in namespace team-a {WHY}"),
    (pod(env={"PATH": "/bin", "VGPU_PRIORITY": "high"}),
     f"VGPU_PRIORITY from the env of container app is not allowed in namespace team-a {WHY}"),
    (pod(init_env={"VGPU_MEMORY": "1Gi"}),
     f"VGPU_MEMORY from the env of container setup is not allowed in namespace team-a {WHY}"),
], ids=["pod-priority", "pod-memory", "container-env", "init-container-env"])
def test_a_pod_s_own_request_is_refused_with_one_line(sample, want):
    assert admit(sample) == [want]


def test_both_sources_are_named():
    assert len(admit(pod({"vgpu.io/policy": "burst"}, {"VGPU_POLICY": "burst"}))) == 2


@pytest.mark.parametrize("sample", [
    pod(),                                             # no annotations at all
    pod({"team": "x", "cdi.k8s.io/x": "y"}),           # none of vgpu's
    pod(env={"VGPU_LOG_LEVEL": "3", "MY_VGPU_MEMORY": "1"}),  # not request names
], ids=["nothing", "other-annotations", "other-env"])
def test_a_pod_without_request_keys_is_admitted(sample):
    assert admit(sample) == []


def test_a_labelled_namespace_s_pods_may_choose():
    sample = pod({"vgpu.io/priority": "high"}, {"VGPU_PRIORITY": "high"})
    assert admit(sample, "ml-batch", {LABEL: "allowed"}) == []
    assert len(admit(sample, "ml-batch", {LABEL: "no"})) == 2


def test_the_kubernetes_page_points_at_the_policy():
    assert "configs/kubernetes/admission.yaml" in (ROOT / "docs" / "kubernetes.md").read_text()
