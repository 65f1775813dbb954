# SPDX-License-Identifier: Apache-2.0
"""The API server, as the plugin needs it: read a ResourceClaim, and keep this node's
ResourceSlices. Through the official `kubernetes` client's CustomObjectsApi on
resource.k8s.io/v1, with plain objects: the typed models of a client older than the
cluster would drop fields this driver depends on (allowMultipleAllocations,
requestPolicy, consumedCapacity, shareID); a plain object keeps every field as sent."""
from __future__ import annotations

import json
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from vgpu_k8s.dra.errors import ApiError
from vgpu_k8s.dra.resourceslice import DRIVER

__all__ = ["Cluster", "api_client"]

_GROUP, _VERSION = "resource.k8s.io", "v1"
_TIMEOUT_S = 10.0


def api_client(kubeconfig: str | None) -> Any:
    """A client for the kubeconfig file, or the in-cluster config (the pod's service
    account) without one; ApiError when neither can be loaded."""
    try:
        if kubeconfig:
            return config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig)
        cfg = client.Configuration()
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=cfg)
        return client.ApiClient(cfg)
    except (ConfigException, OSError, ValueError, TypeError) as e:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster config"
        raise ApiError(f"load {where}", str(e)) from e


def _reason(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return f"{e.status} {e.reason}"


class Cluster:
    """ResourceClaims (read), this node's ResourceSlices (list, create, replace, delete), and
    Events about claims (create)."""

    def __init__(self, api: Any) -> None:
        self._api = client.CustomObjectsApi(api)
        self._client = api

    def _do(self, verb: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(_GROUP, _VERSION, *args, _request_timeout=_TIMEOUT_S, **kwargs)
        except ApiException as e:
            raise ApiError(verb, _reason(e), int(e.status or 0)) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            host = self._client.configuration.host
            raise ApiError(verb, f"API server {host}: {e}") from e

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim, as the API server has it."""
        got: dict[str, Any] = self._do(f"get ResourceClaim {namespace}/{name}",
                                       self._api.get_namespaced_custom_object, namespace,
                                       "resourceclaims", name)
        return got

    def node_slices(self, node: str) -> list[dict[str, Any]]:
        """Every ResourceSlice of this driver on this node."""
        got = self._do(f"list the ResourceSlices of node {node}",
                       self._api.list_cluster_custom_object, "resourceslices",
                       field_selector=f"spec.nodeName={node},spec.driver={DRIVER}")
        return [s for s in got.get("items") or []
                if (s.get("spec") or {}).get("nodeName") == node
                and (s.get("spec") or {}).get("driver") == DRIVER]

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a ResourceSlice."""
        got: dict[str, Any] = self._do(f"create ResourceSlice {body['metadata']['name']}",
                                       self._api.create_cluster_custom_object,
                                       "resourceslices", body)
        return got

    def replace_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a ResourceSlice (body carries the resourceVersion it replaces)."""
        name = body["metadata"]["name"]
        got: dict[str, Any] = self._do(f"update ResourceSlice {name}",
                                       self._api.replace_cluster_custom_object,
                                       "resourceslices", name, body)
        return got

    def delete_slice(self, name: str) -> bool:
        """Delete a ResourceSlice; False when there was none."""
        try:
            self._do(f"delete ResourceSlice {name}", self._api.delete_cluster_custom_object,
                     "resourceslices", name)
        except ApiError as e:
            if e.status == 404:
                return False
            raise
        return True

    def post_event(self, namespace: str, body: dict[str, Any]) -> bool:
        """Create a core/v1 Event; False when one of that name exists (told already)."""
        try:
            # The client sends a dict body as it is (the other calls here all do); its
            # stubs name only the model.
            client.CoreV1Api(self._client).create_namespaced_event(
                namespace, body, _request_timeout=_TIMEOUT_S)  # type: ignore[arg-type]
        except ApiException as e:
            if e.status == 409:
                return False
            raise ApiError(f"post Event {body['metadata']['name']}", _reason(e),
                           int(e.status or 0)) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ApiError(f"post Event {body['metadata']['name']}",
                           f"API server {self._client.configuration.host}: {e}") from e
        return True

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()
