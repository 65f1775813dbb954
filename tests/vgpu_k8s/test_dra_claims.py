# SPDX-License-Identifier: Apache-2.0
"""The DRA plugin's pure parts: a claim's allocation read as a plan (claims.py), the
ResourceSlice it publishes (resourceslice.py), and its checkpoint file (checkpoint.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.fake_apiserver import claim, result

from vgpu_k8s.dra import checkpoint
from vgpu_k8s.dra.claims import ClaimRef, owner_key, plan
from vgpu_k8s.dra.errors import ClaimError
from vgpu_k8s.dra.resourceslice import (
    dropped_sharing_fields,
    resource_slice,
    version_attribute,
)
from vgpu_k8s.dra.vgpud import Gpu, VGpuAsk

GI, MI = 1 << 30, 1 << 20
NODE = "node-a"
GPUS = [Gpu(0, "GPU-a", "Sim", 4 * GI + 5, "570.86.05", "12.8"),
        Gpu(1, "GPU-b", "Sim", 8 * GI), Gpu(2, "GPU-c", "Sim", 8 * GI, unhealthy="GPU is lost")]


def planned(*results, uid="u-1"):
    obj = claim("ns", "c", results, uid=uid)
    return plan(obj, ClaimRef("ns", "c", uid), NODE, GPUS)


def test_one_result_is_one_vgpu_of_its_consumed_capacity():
    p = planned(result("r", "gpu-1", NODE, memory="2Gi", compute="30", share_id="s1"))
    assert p.vgpus == (VGpuAsk(2 * GI, 30, "GPU-b"),)
    assert [(d.request, d.pool, d.device) for d in p.devices] == [("r", NODE, "gpu-1")]
    assert p.owner == owner_key("u-1", ["s1"]) and p.owner.startswith("vgpu.io/claim/u-1/")


def test_absent_amounts_are_the_request_policy_defaults():
    # The whole GPU, rounded down to the 1Mi step, and 100 %.
    p = planned(result("r", "gpu-0", NODE))
    assert p.vgpus == (VGpuAsk(4 * GI, 100, "GPU-a"),)


def test_two_results_on_one_gpu_are_summed_and_on_two_gpus_are_two_vgpus():
    p = planned(result("a", "gpu-0", NODE, memory="1Gi", compute="20"),
                result("b", "gpu-1", NODE, memory="512Mi", compute="2"),
                result("c", "gpu-0", NODE, memory=str(256 * MI), compute="30"))
    assert p.vgpus == (VGpuAsk(GI + 256 * MI, 50, "GPU-a"), VGpuAsk(512 * MI, 2, "GPU-b"))
    assert [d.device for d in p.devices] == ["gpu-0", "gpu-1", "gpu-0"]


def test_the_owner_key_follows_the_share_ids_not_their_order():
    assert owner_key("u", ["x", "y"]) == owner_key("u", ["y", "x"]) != owner_key("u", ["x"])
    assert owner_key("u", []) == "vgpu.io/claim/u"
    assert len(owner_key("u" * 36, [str(i) * 36 for i in range(32)])) < 256


def test_other_drivers_results_are_left_to_them():
    p = planned(result("x", "gpu-9", NODE, driver="gpu.nvidia.com"),
                result("r", "gpu-1", NODE, memory="1Gi", compute="5"))
    assert [d.device for d in p.devices] == ["gpu-1"]


@pytest.mark.parametrize(("results", "says"), [
    ([], "is not allocated"),
    ([result("r", "gpu-0", "node-b")], "has no device of driver vgpu.io in pool node-a "
                                       "(pools node-b)"),
    ([result("r", "gpu-5", NODE)], "device gpu-5 is not a GPU of this node (gpu-0, gpu-1, "
                                   "gpu-2)"),
    ([result("r", "disk-0", NODE)], "device disk-0 is not a GPU of this node"),
    ([result("r", "gpu-2", NODE)], "device gpu-2 (GPU-c) is unhealthy: GPU is lost"),
    ([result("r", "gpu-0", NODE, memory="lots")], "consumedCapacity memory='lots' is not a "
                                                  "quantity"),
    ([result("r", "gpu-0", NODE, memory="1.5")], "memory='1.5' is not a whole number"),
    ([result("r", "gpu-0", NODE, memory="0")], "memory must be > 0"),
    ([result("r", "gpu-0", NODE, memory="5Gi")], "is more than the GPU has"),
    ([result("r", "gpu-0", NODE, compute="1")], "compute 1 is not a percent from 2 to 100"),
    ([result("a", "gpu-1", NODE, memory="1Gi", compute="60"),
      result("b", "gpu-1", NODE, memory="1Gi", compute="60")],
     "device gpu-1: compute 120 is not a percent from 2 to 100"),
], ids=["unallocated", "other-pool", "unknown-gpu", "not-a-gpu", "unhealthy", "bad-quantity",
        "fraction", "zero-memory", "too-much-memory", "compute-1", "summed-compute-120"])
def test_a_claim_that_cannot_be_planned_says_why_in_one_line(results, says):
    obj = claim("ns", "c", results, uid="u-1")
    if not results:
        del obj["status"]["allocation"]
    with pytest.raises(ClaimError) as e:
        plan(obj, ClaimRef("ns", "c", "u-1"), NODE, GPUS)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_claim_made_again_under_the_same_name_is_refused():
    obj = claim("ns", "c", [result("r", "gpu-0", NODE)], uid="new")
    with pytest.raises(ClaimError, match="the API server has UID 'new', the kubelet asked "
                                         "for 'old'"):
        plan(obj, ClaimRef("ns", "c", "old"), NODE, GPUS)


@pytest.mark.parametrize(("text", "attribute"), [
    ("570.86.15", {"version": "570.86.15"}), ("535.104.05", {"version": "535.104.5"}),
    ("12.8", {"version": "12.8.0"}), ("13", {"version": "13.0.0"}),
    ("r570-beta", {"string": "r570-beta"})])
def test_versions_are_semantic_versions_where_they_can_be(text, attribute):
    assert version_attribute(text) == attribute


def test_the_slice_lists_healthy_gpus_only():
    s = resource_slice(NODE, GPUS, 7)
    assert s["metadata"]["name"] == "node-a-vgpu.io"
    assert s["spec"]["pool"] == {"name": NODE, "generation": 7, "resourceSliceCount": 1}
    assert [d["name"] for d in s["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    gpu0 = s["spec"]["devices"][0]
    assert gpu0["attributes"]["driverVersion"] == {"version": "570.86.5"}
    assert gpu0["capacity"]["memory"]["value"] == str(4 * GI + 5)
    assert gpu0["capacity"]["memory"]["requestPolicy"]["default"] == str(4 * GI)
    assert "driverVersion" not in s["spec"]["devices"][1]["attributes"]


def _without(devices, *, allow=False, policy=False, keep_policy_of=()):
    out = json.loads(json.dumps(devices))
    for d in out:
        if allow:
            d.pop("allowMultipleAllocations")
        for key, c in d["capacity"].items():
            if policy and key not in keep_policy_of:
                c.pop("requestPolicy")
    return out


@pytest.mark.parametrize(("stored", "dropped"), [
    (lambda ds: ds, []),
    (lambda ds: _without(ds, allow=True, policy=True),
     ["allowMultipleAllocations", "requestPolicy"]),
    (lambda ds: _without(ds, allow=True), ["allowMultipleAllocations"]),
    (lambda ds: _without(ds, policy=True, keep_policy_of=("memory",)), ["requestPolicy"]),
    (lambda ds: [], ["allowMultipleAllocations", "requestPolicy"]),
], ids=["kept", "both-dropped", "allow-dropped", "one-policy-dropped", "no-devices-stored"])
def test_the_sharing_fields_a_server_dropped_are_named(stored, dropped):
    sent = resource_slice(NODE, GPUS, 1)["spec"]["devices"]
    assert dropped_sharing_fields(sent, stored(sent)) == dropped


def test_checkpoint_round_trip_is_atomic_and_refuses_what_it_cannot_read(tmp_path: Path):
    path = tmp_path / "plugins" / "vgpu.io" / "checkpoint.json"
    assert checkpoint.load(path) == {}
    p = planned(result("r", "gpu-1", NODE, memory="1Gi", compute="5"))
    entry = checkpoint.Entry(p.claim, p.owner, "s-1", ("vgpu.io/claim=u-1",), p.devices,
                             p.vgpus)
    checkpoint.save(path, {"u-1": entry})
    assert checkpoint.load(path) == {"u-1": entry}
    assert [f.name for f in path.parent.iterdir()] == ["checkpoint.json"]
    assert json.loads(path.read_text())["version"] == 1
    path.write_text('{"version": 1, "claims": {"u": {"owner": 1}}}')
    with pytest.raises(ValueError, match=f"failed to read the checkpoint {path}: bad entry"):
        checkpoint.load(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="failed to read the checkpoint"):
        checkpoint.load(path)
