# SPDX-License-Identifier: Apache-2.0
"""configs/kubernetes/admission-compute.yaml: a vGPU the scheduler counts has its compute
counted too.

First the failure it prevents, on the real decision path: the device plugin's Allocate
answers for memory IDs alone, read as the hook reads a container's keys, filled with the
shipped ConfigMap's defaults, placed by the arbiter's placement. Ten such containers take
a GPU's whole compute and the eleventh is refused at container create although the
scheduler saw memory free and no compute asked. Then the policy's CEL, evaluated with
cel-python as the API server evaluates it: such pods are refused at admission with one
line, and the pods it admits get exactly the compute the scheduler counted.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from support.paths import ROOT

from arbiter.config import load_config
from arbiter.errors import NoCapacityError
from arbiter.model import Gpu, Slice
from arbiter.slices.placement import place
from oci_hook.request import find_request, parse_request
from vgpu_k8s.deviceplugin.allocate import container_annotations
from vgpu_k8s.deviceplugin.ids import COMPUTE, MEMORY

MANIFEST = ROOT / "configs" / "kubernetes" / "admission-compute.yaml"
UNIT = 256 << 20                       # the DaemonSet's --memory-unit 256Mi
GPU = Gpu(index=0, uuid="GPU-0", name="sim", memory=16 << 30, minor=0)


def shipped_defaults(tmp_path: Path) -> tuple[Any, Any, Any]:
    """(compute, priority, policy) that vgpud fills unset keys with, from the ConfigMap."""
    docs = yaml.safe_load_all((ROOT / "configs" / "kubernetes" / "config.yaml").read_text())
    (cm,) = [d for d in docs if d and d["kind"] == "ConfigMap"]
    f = tmp_path / "config.yaml"
    f.write_text(cm["data"]["config.yaml"])
    from arbiter.model import Policy, Priority
    c = load_config(f)
    return c.default_compute, Priority[c.default_priority.upper()], \
        Policy[c.default_policy.upper()]


def allocated(memory_units: int, compute: int, n: int) -> dict[str, str]:
    """A container's annotations from the device plugin's Allocate of each resource (the
    kubelet calls each resource's plugin and merges the answers)."""
    ids = [f"GPU-0-mem-{i}" for i in range(n * memory_units, (n + 1) * memory_units)]
    out = container_annotations(MEMORY, ids, UNIT)
    if compute:
        out |= container_annotations(COMPUTE, [f"GPU-0-compute-{i}" for i in range(compute)],
                                     UNIT)
    return out


def place_all(tmp_path: Path, pods: list[dict[str, str]]) -> list[Slice | NoCapacityError]:
    """Each container's request as vgpud reads it, placed on one 16Gi GPU in turn."""
    defaults = shipped_defaults(tmp_path)
    slices: list[Slice] = []
    out: list[Slice | NoCapacityError] = []
    for n, keys in enumerate(pods):
        raw = find_request(keys, [], allow_env=False)
        assert raw is not None
        req = parse_request(raw, owner=f"c{n}", defaults=defaults)
        try:
            decision = place(req, [GPU], slices, policy="binpack", allow_preemption=False)
        except NoCapacityError as e:
            out.append(e)
            continue
        s = Slice(id=f"s{n}", owner=req.owner, grants=decision.grants)
        slices.append(s)
        out.append(s)
    return out


def test_without_the_policy_the_eleventh_memory_only_container_fails_at_create(tmp_path):
    """1Gi each, no compute asked: the scheduler sees 5Gi of 16Gi free at the eleventh,
    vgpud has no compute left (10 x the default 10 %)."""
    assert shipped_defaults(tmp_path)[0] == 10
    results = place_all(tmp_path, [allocated(4, 0, n) for n in range(11)])
    assert all(isinstance(r, Slice) for r in results[:10])
    assert isinstance(results[10], NoCapacityError)
    assert "6Gi memory and 0% compute" in str(results[10])


def test_pods_that_ask_for_compute_get_what_the_scheduler_counted(tmp_path):
    """Eleven containers of 1Gi and 9 %: 99 % counted by the scheduler, 99 % granted."""
    results = place_all(tmp_path, [allocated(4, 9, n) for n in range(11)])
    assert all(isinstance(r, Slice) for r in results)
    assert sum(g.compute for s in results if isinstance(s, Slice) for g in s.grants) == 99


# ---- the policy ----------------------------------------------------------------------------

def docs() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def cel(expression: str, **activation: Any) -> Any:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})


def admit(pod: dict[str, Any]) -> list[str]:
    """[] when the API server admits the pod's CREATE, else the messages."""
    policy = docs()["ValidatingAdmissionPolicy"]
    names = {"object": pod, "oldObject": None,
             "request": {"operation": "CREATE", "namespace": "team-a"}}
    variables: dict[str, Any] = {}
    for v in policy["spec"]["variables"]:
        variables[v["name"]] = cel(v["expression"], **names, variables=variables)
    return [str(cel(c["messageExpression"], **names, variables=variables))
            for c in policy["spec"]["validations"]
            if not cel(c["expression"], **names, variables=variables)]


def pod(*resources: dict[str, Any] | None, init: dict[str, Any] | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    def container(name: str, res: dict[str, Any] | None) -> dict[str, Any]:
        c: dict[str, Any] = {"name": name, "image": "trainer:1"}
        if res is not None:
            c["resources"] = res
        return c
    spec: dict[str, Any] = {"containers": [container(f"c{i}", r)
                                           for i, r in enumerate(resources)]}
    if init is not None:
        spec["initContainers"] = [container("setup", init)]
    meta: dict[str, Any] = {"name": "p"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def line(name: str) -> str:
    return (f"container {name} asks for vgpu.io/memory without vgpu.io/compute: add "
            "vgpu.io/compute (a percent of one GPU, 2 to 100) to its resources, so that the "
            "scheduler counts the compute share its vGPU gets")


MEM = {"limits": {MEMORY: 16}}
BOTH = {"limits": {MEMORY: 16, COMPUTE: 30}}


@pytest.mark.parametrize(("sample", "want"), [
    (pod(MEM), [line("c0")]),
    (pod(None, {"requests": {MEMORY: 4}, "limits": {MEMORY: 4}}), [line("c1")]),
    (pod(BOTH, init=MEM), [line("setup")]),
    (pod(BOTH, {"limits": {MEMORY: 4}, "requests": {COMPUTE: 10}}), []),
    (pod(BOTH), []),
    (pod(None, {"limits": {"cpu": "1"}}), []),
    (pod({"limits": {COMPUTE: 30}}), []),
    (pod(MEM, annotations={"vgpu.io/compute": "20"}), []),
], ids=["memory-only", "memory-only-second", "init-container", "compute-in-requests",
        "both", "no-vgpu", "compute-only", "pod-annotation-compute"])
def test_the_policy_refuses_memory_without_compute_in_one_line(sample, want):
    assert admit(sample) == want


def test_the_binding_applies_in_every_namespace():
    policy, binding = docs()["ValidatingAdmissionPolicy"], \
        docs()["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["resources"], rule["operations"]) == (["pods"], ["CREATE"])


def test_the_base_installs_it_and_the_runbook_names_it():
    base = yaml.safe_load((ROOT / "configs" / "kubernetes" / "kustomization.yaml").read_text())
    assert MANIFEST.name in base["resources"]
    assert "configs/kubernetes/admission-compute.yaml" in \
        (ROOT / "docs" / "kubernetes.md").read_text()
