# SPDX-License-Identifier: Apache-2.0
"""oci_hook.request: finding and validating a container's request, happy and sad."""
from __future__ import annotations

import json

import pytest
from support.paths import ROOT

from arbiter.model import OwnerKind, Policy, Priority, Request
from oci_hook.errors import RequestError
from oci_hook.request import (
    CONTAINER_TYPE_KEYS,
    ENV_KEYS,
    REQUEST_KEYS,
    container_type,
    find_request,
    parse_request,
    schema_path,
)

DEFAULTS = (10, Priority.NORMAL, Policy.FIXED)
MEM = "vgpu.io/memory"
CRI, CRIO = "io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType"


def parse(raw: dict[str, str]) -> Request:
    return parse_request(raw, owner="c1", owner_pid=42, defaults=DEFAULTS)


HAPPY = [
    ("memory-only", {MEM: "1Gi"},
     Request("c1", 1 << 30, 10, owner_pid=42)),
    ("memory-bare-mib", {MEM: "512"}, Request("c1", 512 << 20, 10, owner_pid=42)),
    ("memory-decimal", {MEM: "2G"}, Request("c1", 2 * 10**9, 10, owner_pid=42)),
    ("compute-min", {MEM: "1Gi", "vgpu.io/compute": "2"}, Request("c1", 1 << 30, 2, owner_pid=42)),
    ("compute-max", {MEM: "1Gi", "vgpu.io/compute": "100"},
     Request("c1", 1 << 30, 100, owner_pid=42)),
    ("count-2", {MEM: "1Gi", "vgpu.io/count": "2"},
     Request("c1", 1 << 30, 10, count=2, owner_pid=42)),
    ("priority-high", {MEM: "1Gi", "vgpu.io/priority": "high"},
     Request("c1", 1 << 30, 10, priority=Priority.HIGH, owner_pid=42)),
    ("priority-low", {MEM: "1Gi", "vgpu.io/priority": "low"},
     Request("c1", 1 << 30, 10, priority=Priority.LOW, owner_pid=42)),
    ("policy-burst", {MEM: "1Gi", "vgpu.io/policy": "burst"},
     Request("c1", 1 << 30, 10, policy=Policy.BURST, owner_pid=42)),
    ("devices-indices", {MEM: "1Gi", "vgpu.io/devices": "0,2"},
     Request("c1", 1 << 30, 10, devices=("0", "2"), owner_pid=42)),
    ("devices-uuid", {MEM: "1Gi", "vgpu.io/devices": "GPU-5d1f-aa"},
     Request("c1", 1 << 30, 10, devices=("GPU-5d1f-aa",), owner_pid=42)),
    ("every-key", {MEM: "3Gi", "vgpu.io/compute": "30", "vgpu.io/count": "1",
                   "vgpu.io/priority": "normal", "vgpu.io/policy": "fixed",
                   "vgpu.io/devices": "0"},
     Request("c1", 3 << 30, 30, devices=("0",), owner_pid=42)),
]


@pytest.mark.parametrize(("raw", "want"), [h[1:] for h in HAPPY], ids=[h[0] for h in HAPPY])
def test_parse_happy(raw, want):
    got = parse(raw)
    assert got == want
    assert got.owner_kind == OwnerKind.CONTAINER


SAD = [
    ("memory-word", {MEM: "lots"}, "vgpu.io/memory=lots: not a memory quantity: use an integer "
     "with an optional suffix Ki, Mi, Gi, Ti, K, M, G or T (no suffix = MiB)"),
    ("memory-zero", {MEM: "0"}, "vgpu.io/memory=0: not a memory quantity"),
    ("memory-lower-suffix", {MEM: "1gi"}, "vgpu.io/memory=1gi: not a memory quantity"),
    ("memory-negative", {MEM: "-1Gi"}, "vgpu.io/memory=-1Gi: not a memory quantity"),
    ("memory-huge", {MEM: "99999999999999Ti"}, "vgpu.io/memory=99999999999999Ti: not a memory"),
    ("memory-missing", {"vgpu.io/compute": "20"}, "vgpu.io/memory: missing"),
    ("compute-1", {MEM: "1Gi", "vgpu.io/compute": "1"},
     "vgpu.io/compute=1: not a compute share: use an integer percent from 2 to 100"),
    ("compute-101", {MEM: "1Gi", "vgpu.io/compute": "101"}, "vgpu.io/compute=101: not a compute"),
    ("compute-percent-sign", {MEM: "1Gi", "vgpu.io/compute": "30%"},
     "vgpu.io/compute=30%: not a compute share"),
    ("count-0", {MEM: "1Gi", "vgpu.io/count": "0"}, "vgpu.io/count=0: not a vGPU count"),
    ("count-word", {MEM: "1Gi", "vgpu.io/count": "two"}, "vgpu.io/count=two: not a vGPU count"),
    ("count-huge", {MEM: "1Gi", "vgpu.io/count": "4294967297"}, "vgpu.io/count=4294967297: not"),
    ("priority-urgent", {MEM: "1Gi", "vgpu.io/priority": "urgent"},
     "vgpu.io/priority=urgent: not a priority: use high, normal or low"),
    ("priority-caps", {MEM: "1Gi", "vgpu.io/priority": "HIGH"}, "vgpu.io/priority=HIGH: not a"),
    ("policy-soft", {MEM: "1Gi", "vgpu.io/policy": "soft"},
     "vgpu.io/policy=soft: not a policy: use fixed or burst"),
    ("devices-empty", {MEM: "1Gi", "vgpu.io/devices": ""}, "vgpu.io/devices=: not a device list"),
    ("devices-trailing-comma", {MEM: "1Gi", "vgpu.io/devices": "0,"},
     "vgpu.io/devices=0,: not a device list"),
    ("devices-space", {MEM: "1Gi", "vgpu.io/devices": "0, 1"}, "vgpu.io/devices=0, 1: not a"),
    ("unknown-key", {MEM: "1Gi", "vgpu.io/memroy": "1Gi"},
     "vgpu.io/memroy=1Gi: unknown key: use vgpu.io/memory, vgpu.io/compute"),
    ("unknown-beats-missing", {"vgpu.io/mem": "1Gi"}, "vgpu.io/mem=1Gi: unknown key"),
    ("first-bad-key-in-table-order", {MEM: "lots", "vgpu.io/compute": "1"},
     "vgpu.io/memory=lots:"),
    ("newline-in-value", {MEM: "1Gi\nrm -rf"}, "vgpu.io/memory=1Gi rm -rf: not a memory"),
]


@pytest.mark.parametrize(("raw", "want"), [s[1:] for s in SAD], ids=[s[0] for s in SAD])
def test_parse_sad(raw, want):
    with pytest.raises(RequestError) as info:
        parse(raw)
    msg = str(info.value)
    assert msg.startswith(want)
    assert "\n" not in msg
    assert info.value.key.startswith("vgpu.io/")


def test_long_value_is_cut():
    with pytest.raises(RequestError) as info:
        parse({MEM: "x" * 500})
    assert len(str(info.value)) < 250


FIND = [
    ("nothing", {}, [], True, None),
    ("other-annotations", {"io.kubernetes.pod": "x"}, ["PATH=/bin"], True, None),
    ("annotation", {MEM: "1Gi", "other": "x"}, [], False, {MEM: "1Gi"}),
    ("unknown-annotation-counts", {"vgpu.io/memroy": "1"}, [], False, {"vgpu.io/memroy": "1"}),
    ("internal-only", {"vgpu.io/slice": "abc", "vgpu.io/env-requests": "allowed"}, [], True,
     None),
    ("env-allowed", {}, ["VGPU_MEMORY=2Gi", "VGPU_COMPUTE=20"], True,
     {MEM: "2Gi", "vgpu.io/compute": "20"}),
    ("env-refused", {}, ["VGPU_MEMORY=2Gi"], False, None),
    ("env-first-wins", {}, ["VGPU_MEMORY=1Gi", "VGPU_MEMORY=2Gi"], True, {MEM: "1Gi"}),
    ("env-libvgpu-settings-ignored", {}, ["VGPU_MEMORY_LIMIT=1Gi", "VGPU_REGION_DIR=/x"], True,
     None),
    ("annotations-beat-env", {MEM: "1Gi"}, ["VGPU_MEMORY=2Gi", "VGPU_COUNT=2"], True,
     {MEM: "1Gi"}),
    ("env-without-equals", {}, ["VGPU_MEMORY"], True, None),
    # Kubernetes pods: the sandbox asks for nothing, whatever the pod's keys say.
    ("cri-sandbox", {CRI: "sandbox", MEM: "256Mi", "vgpu.io/compute": "30"}, [], True, None),
    ("crio-sandbox", {CRIO: "sandbox", MEM: "256Mi"}, [], True, None),
    ("sandbox-bad-request", {CRI: "sandbox", MEM: "lots", "vgpu.io/colour": "red"}, [], True,
     None),
    ("sandbox-env", {CRI: "sandbox"}, ["VGPU_MEMORY=1Gi"], True, None),
    ("sandbox-wins-over-the-other-key", {CRI: "container", CRIO: "sandbox", MEM: "1Gi"}, [],
     True, None),
    # An application container: the pod's keys merged with its own; no memory, no vGPU.
    ("cri-container-memory", {CRI: "container", MEM: "1Gi", "vgpu.io/priority": "high"}, [],
     False, {MEM: "1Gi", "vgpu.io/priority": "high"}),
    ("crio-container-memory", {CRIO: "container", MEM: "1Gi"}, [], False, {MEM: "1Gi"}),
    ("cri-container-priority-only", {CRI: "container", "vgpu.io/priority": "high"}, [], True,
     None),
    ("crio-container-priority-only", {CRIO: "container", "vgpu.io/priority": "high"}, [], True,
     None),
    ("cri-container-bad-value-without-memory", {CRI: "container", "vgpu.io/compute": "1"}, [],
     True, None),
    ("cri-container-env-without-memory", {CRI: "container"}, ["VGPU_COMPUTE=30"], True, None),
    ("cri-container-env-memory", {CRI: "container"}, ["VGPU_MEMORY=1Gi"], True, {MEM: "1Gi"}),
    ("cri-container-bad-memory-still-asks", {CRI: "container", MEM: "lots"}, [], False,
     {MEM: "lots"}),
    # Outside a pod (runc, Docker, ctr) the keys are the container's own: an incomplete
    # request is still a request (parse_request refuses it with one line).
    ("plain-compute-only", {"vgpu.io/compute": "30"}, [], False, {"vgpu.io/compute": "30"}),
    ("unknown-type-is-plain", {CRI: "podsandbox", "vgpu.io/priority": "high"}, [], False,
     {"vgpu.io/priority": "high"}),
]


@pytest.mark.parametrize(("annotations", "env", "allow", "want"), [f[1:] for f in FIND],
                         ids=[f[0] for f in FIND])
def test_find_request(annotations, env, allow, want):
    assert find_request(annotations, env, allow_env=allow) == want


@pytest.mark.parametrize(("annotations", "want"), [
    pytest.param({}, None, id="none"),
    pytest.param({CRI: "sandbox"}, "sandbox", id="cri-sandbox"),
    pytest.param({CRIO: "sandbox"}, "sandbox", id="crio-sandbox"),
    pytest.param({CRI: "container"}, "container", id="cri-container"),
    pytest.param({CRIO: "container"}, "container", id="crio-container"),
    pytest.param({CRI: "Sandbox"}, None, id="case-matters"),
    pytest.param({"io.kubernetes.cri.sandbox-id": "sandbox"}, None, id="another-key"),
])
def test_container_type(annotations, want):
    assert container_type(annotations) == want


def test_the_container_type_keys_are_containerd_then_crio():
    assert CONTAINER_TYPE_KEYS == (CRI, CRIO)


def test_a_plain_container_without_memory_is_refused_with_one_line():
    """Outside a pod the rule is unchanged: its own keys without memory are an error."""
    raw = find_request({"vgpu.io/compute": "30"}, [], allow_env=False)
    assert raw is not None
    with pytest.raises(RequestError, match=r"^vgpu\.io/memory: missing: a vGPU request needs"):
        parse(raw)


def test_every_key_has_an_env_name_and_a_schema_property():
    schema = json.loads(schema_path().read_text())
    assert set(schema["properties"]) == set(REQUEST_KEYS)
    assert sorted(ENV_KEYS.values()) == sorted(REQUEST_KEYS)
    assert "VGPU_MEMORY" in ENV_KEYS and "VGPU_DEVICES" in ENV_KEYS
    assert schema_path() == ROOT / "configs" / "request.schema.json"


def test_hooks_d_file_matches_only_vgpu_annotations():
    import re

    doc = json.loads((ROOT / "configs" / "oci-hooks.d" / "vgpu.json").read_text())
    assert doc["version"] == "1.0.0"
    assert set(doc["stages"]) == {"prestart", "poststop"}
    [(pattern, _)] = doc["when"]["annotations"].items()
    assert re.search(pattern, "vgpu.io/memory") and not re.search(pattern, "xvgpu.io/memory")
    assert doc["hook"]["args"][0] == "vgpu-hook"
