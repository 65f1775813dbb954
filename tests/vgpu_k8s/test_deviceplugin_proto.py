# SPDX-License-Identifier: Apache-2.0
"""The kubelet's device-plugin API v1beta1 as compiled into vgpu_k8s: the committed stubs are
what `make proto` makes, and the names and field numbers on the wire are the kubelet's."""
from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import ROOT
from support.protoc import assert_stubs_current

from vgpu_k8s.proto import deviceplugin_v1beta1_pb2 as api

PROTO = "vgpu_k8s/proto/deviceplugin_v1beta1.proto"
STUBS = ("deviceplugin_v1beta1_pb2.py", "deviceplugin_v1beta1_pb2_grpc.py")


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    assert_stubs_current(tmp_path, PROTO, STUBS)


def test_makefile_target_runs_the_same_command() -> None:
    assert (f"-m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. {PROTO}"
            in (ROOT / "Makefile").read_text())


# The kubelet's k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto, as the wire sees it:
# the full method paths the kubelet dials and each message's fields (name, number, type).
METHODS = {
    "v1beta1.Registration": {"Register": ("RegisterRequest", "Empty", False)},
    "v1beta1.DevicePlugin": {
        "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
        "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
        "GetPreferredAllocation": ("PreferredAllocationRequest",
                                   "PreferredAllocationResponse", False),
        "Allocate": ("AllocateRequest", "AllocateResponse", False),
        "PreStartContainer": ("PreStartContainerRequest", "PreStartContainerResponse", False),
    },
}
S, B, I64, MSG = "string", "bool", "int64", "message"
FIELDS = {
    "DevicePluginOptions": [("pre_start_required", 1, B),
                            ("get_preferred_allocation_available", 2, B)],
    "RegisterRequest": [("version", 1, S), ("endpoint", 2, S), ("resource_name", 3, S),
                        ("options", 4, MSG)],
    "Empty": [],
    "ListAndWatchResponse": [("devices", 1, MSG)],
    "TopologyInfo": [("nodes", 1, MSG)],
    "NUMANode": [("ID", 1, I64)],
    "Device": [("ID", 1, S), ("health", 2, S), ("topology", 3, MSG)],
    "PreStartContainerRequest": [("devices_ids", 1, S)],
    "PreStartContainerResponse": [],
    "PreferredAllocationRequest": [("container_requests", 1, MSG)],
    "ContainerPreferredAllocationRequest": [("available_deviceIDs", 1, S),
                                            ("must_include_deviceIDs", 2, S),
                                            ("allocation_size", 3, "int32")],
    "PreferredAllocationResponse": [("container_responses", 1, MSG)],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, S)],
    "AllocateRequest": [("container_requests", 1, MSG)],
    "ContainerAllocateRequest": [("devices_ids", 1, S)],
    "AllocateResponse": [("container_responses", 1, MSG)],
    "ContainerAllocateResponse": [("envs", 1, MSG), ("mounts", 2, MSG), ("devices", 3, MSG),
                                  ("annotations", 4, MSG), ("cdi_devices", 5, MSG)],
    "Mount": [("container_path", 1, S), ("host_path", 2, S), ("read_only", 3, B)],
    "DeviceSpec": [("container_path", 1, S), ("host_path", 2, S), ("permissions", 3, S)],
    "CDIDevice": [("name", 1, S)],
}
_TYPES = {9: S, 8: B, 3: I64, 5: "int32", 11: MSG}


def test_services_are_the_kubelets() -> None:
    services = api.DESCRIPTOR.services_by_name
    assert {f"v1beta1.{n}" for n in services} == set(METHODS)
    for full, methods in METHODS.items():
        svc = services[full.split(".")[1]]
        assert svc.full_name == full
        got = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming)
               for m in svc.methods}
        assert got == methods, full


def test_messages_are_the_kubelets() -> None:
    messages = api.DESCRIPTOR.message_types_by_name
    assert set(messages) == set(FIELDS)
    for name, fields in FIELDS.items():
        got = [(f.name, f.number, _TYPES[f.type]) for f in messages[name].fields]
        assert got == fields, name
