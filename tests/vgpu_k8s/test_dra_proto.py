# SPDX-License-Identifier: Apache-2.0
"""The kubelet's DRA plugin API (v1, v1beta1) and plugin registration API (v1) as compiled
into vgpu_k8s: the committed stubs are what `make proto` makes, and the package, service,
method, message and field names and numbers on the wire are the kubelet's."""
from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import ROOT
from support.protoc import assert_stubs_current

from vgpu_k8s.proto import dra_v1_pb2, dra_v1beta1_pb2, pluginregistration_v1_pb2

PROTOS = ("dra_v1", "dra_v1beta1", "pluginregistration_v1")


@pytest.mark.parametrize("name", PROTOS)
def test_committed_stubs_are_current(tmp_path: Path, name: str) -> None:
    pytest.importorskip("grpc_tools")
    assert_stubs_current(tmp_path, f"vgpu_k8s/proto/{name}.proto",
                         (f"{name}_pb2.py", f"{name}_pb2_grpc.py"))


@pytest.mark.parametrize("name", PROTOS)
def test_makefile_target_runs_the_same_command(name: str) -> None:
    assert (f"-m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. "
            f"vgpu_k8s/proto/{name}.proto" in (ROOT / "Makefile").read_text())


# k8s.io/kubelet/pkg/apis/dra/{v1,v1beta1}/api.proto and pluginregistration/v1/api.proto as
# the wire sees them: the full method paths the kubelet dials, each message's fields.
S, B, MSG = "string", "bool", "message"
DRA_METHODS = {
    "NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse"),
    "NodeUnprepareResources": ("NodeUnprepareResourcesRequest",
                               "NodeUnprepareResourcesResponse"),
}
DRA_FIELDS = {
    "NodePrepareResourcesRequest": [("claims", 1, MSG)],
    "NodePrepareResourcesResponse": [("claims", 1, MSG)],
    "NodePrepareResourceResponse": [("devices", 1, MSG), ("error", 2, S)],
    "Device": [("request_names", 1, S), ("pool_name", 2, S), ("device_name", 3, S),
               ("cdi_device_ids", 4, S)],
    "NodeUnprepareResourcesRequest": [("claims", 1, MSG)],
    "NodeUnprepareResourcesResponse": [("claims", 1, MSG)],
    "NodeUnprepareResourceResponse": [("error", 1, S)],
    "Claim": [("namespace", 1, S), ("uid", 2, S), ("name", 3, S)],
}
REGISTRATION_METHODS = {
    "GetInfo": ("InfoRequest", "PluginInfo"),
    "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse"),
}
REGISTRATION_FIELDS = {
    "PluginInfo": [("type", 1, S), ("name", 2, S), ("endpoint", 3, S),
                   ("supported_versions", 4, S)],
    "RegistrationStatus": [("plugin_registered", 1, B), ("error", 2, S)],
    "RegistrationStatusResponse": [],
    "InfoRequest": [],
}
_TYPES = {9: S, 8: B, 11: MSG}


def _methods(module, service: str) -> dict[str, tuple[str, str]]:
    svc = module.DESCRIPTOR.services_by_name[service]
    assert not any(m.server_streaming or m.client_streaming for m in svc.methods)
    return {m.name: (m.input_type.name, m.output_type.name) for m in svc.methods}


def _fields(module) -> dict[str, list[tuple[str, int, str]]]:
    return {name: [(f.name, f.number, _TYPES[f.type]) for f in msg.fields]
            for name, msg in module.DESCRIPTOR.message_types_by_name.items()}


@pytest.mark.parametrize(("module", "package"), [
    (dra_v1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1"),
    (dra_v1beta1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1beta1"),
], ids=["v1", "v1beta1"])
def test_dra_service_is_the_kubelets(module, package: str) -> None:
    assert module.DESCRIPTOR.package == package
    assert list(module.DESCRIPTOR.services_by_name) == ["DRAPlugin"]
    assert module.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == f"{package}.DRAPlugin"
    assert _methods(module, "DRAPlugin") == DRA_METHODS
    assert _fields(module) == DRA_FIELDS
    # The response maps are keyed by claim UID.
    entry = module.NodePrepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"].message_type
    assert entry.fields_by_name["key"].type == 9
    assert entry.fields_by_name["value"].message_type.name == "NodePrepareResourceResponse"


def test_registration_service_is_the_kubelets() -> None:
    module = pluginregistration_v1_pb2
    assert module.DESCRIPTOR.package == "pluginregistration"
    assert list(module.DESCRIPTOR.services_by_name) == ["Registration"]
    assert _methods(module, "Registration") == REGISTRATION_METHODS
    assert _fields(module) == REGISTRATION_FIELDS
