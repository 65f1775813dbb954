# SPDX-License-Identifier: Apache-2.0
"""A fake Kubernetes API server for the DRA plugin: ResourceClaims to read and
ResourceSlices to keep, over real HTTP, as resource.k8s.io/v1 serves them.

Small on purpose: a threaded HTTP server on 127.0.0.1 that answers the paths the official
`kubernetes` client calls (namespaced claims: get; cluster-scoped slices: list with a
`spec.nodeName`/`spec.driver` field selector, get, create, replace with optimistic
concurrency on resourceVersion, delete), with Status objects for errors as the real one
sends. Tests put claims in (`add_claim`, real v1 shapes: status.allocation.devices.results
with consumedCapacity and shareID) and read what the plugin published (`slices`).
`kubeconfig(path)` writes a file the client loads (no auth: plain HTTP).
`kubelet_wipe(node)` is what a starting kubelet does to the API server: it deletes its
node's ResourceSlices. `consumable_capacity = False` is a server without the
DRAConsumableCapacity feature gate: like its ResourceSlice strategy, it drops
`allowMultipleAllocations` and the capacities' `requestPolicy` from what it stores, on
create, and on update unless the old slice had them; no error, no warning.
"""
from __future__ import annotations

import copy
import json
import re
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

__all__ = ["FakeApiServer", "claim", "result"]

_PREFIX = "/apis/resource.k8s.io/v1"
_CLAIM = re.compile(_PREFIX + r"/namespaces/([^/]+)/resourceclaims/([^/]+)")
_SLICES = re.compile(_PREFIX + r"/resourceslices/?")
_SLICE = re.compile(_PREFIX + r"/resourceslices/([^/]+)")
_EVENTS = re.compile(r"/api/v1/namespaces/([^/]+)/events")
#: What a core/v1 Event must carry to be created (the API server's validation, in part).
_EVENT_FIELDS = ("involvedObject", "reason", "message", "type")


def result(request: str, device: str, pool: str, *, memory: str | None = None,
           compute: str | None = None, share_id: str | None = None,
           driver: str = "vgpu.io") -> dict[str, Any]:
    """One DeviceRequestAllocationResult, as the scheduler writes it."""
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    consumed = {k: v for k, v in (("memory", memory), ("compute", compute)) if v is not None}
    if consumed:
        r["consumedCapacity"] = consumed
    r["shareID"] = share_id if share_id is not None else str(uuid.uuid4())
    return r


def claim(namespace: str, name: str, results: Sequence[dict[str, Any]],
          uid: str | None = None, node: str = "node-a") -> dict[str, Any]:
    """An allocated ResourceClaim (resource.k8s.io/v1) with these results."""
    requests = sorted({r["request"].split("/")[0] for r in results})
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                     "resourceVersion": "1"},
        "spec": {"devices": {"requests": [
            {"name": r, "exactly": {"deviceClassName": "vgpu.io"}} for r in requests]}},
        "status": {"allocation": {
            "devices": {"results": list(results)},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
    }


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeApiServer:
    """The fake; start() serves it on a free port, stop() ends it."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self._slices: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []     # (method, path) in order
        self._version = 100
        self._cond = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""
        self.consumable_capacity = True     # False: a server without the feature gate
        self.events: dict[tuple[str, str], dict[str, Any]] = {}   # (namespace, name) -> Event

    # -- what tests use -------------------------------------------------------

    def add_claim(self, obj: dict[str, Any]) -> dict[str, Any]:
        with self._cond:
            self.claims[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        return obj

    def slices(self) -> list[dict[str, Any]]:
        """The ResourceSlices held now, by name."""
        with self._cond:
            return [copy.deepcopy(s) for _, s in sorted(self._slices.items())]

    def wait_slices(self, predicate: Any, what: str, timeout: float = 20) -> list[dict[str, Any]]:
        """The slices once predicate(slices) holds."""
        with self._cond:
            ok = self._cond.wait_for(lambda: predicate(
                [copy.deepcopy(s) for _, s in sorted(self._slices.items())]), timeout)
            if not ok:
                raise AssertionError(f"timed out waiting for {what}; slices: "
                                     f"{json.dumps(list(self._slices.values()))[:2000]}")
            return [copy.deepcopy(s) for _, s in sorted(self._slices.items())]

    def kubelet_wipe(self, node: str) -> list[str]:
        """A starting kubelet's DeleteCollection of its node's ResourceSlices (every
        driver); the names deleted."""
        with self._cond:
            gone = [n for n, s in self._slices.items() if s["spec"].get("nodeName") == node]
            for name in gone:
                del self._slices[name]
                self.requests.append(("DELETE", f"{_PREFIX}/resourceslices/{name} (kubelet)"))
            self._cond.notify_all()
        return sorted(gone)

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig file that points the client here."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "plugin", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "plugin"}}],
        }))
        return path

    def start(self) -> FakeApiServer:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- the API ----------------------------------------------------------------

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: Any) -> tuple[int, Any]:
        with self._cond:
            self.requests.append((method, path))
            try:
                return self._route(method, path, query, body)
            finally:
                self._cond.notify_all()

    def _route(self, method: str, path: str, query: dict[str, list[str]],
               body: Any) -> tuple[int, Any]:
        if (m := _CLAIM.fullmatch(path)) and method == "GET":
            obj = self.claims.get((m[1], m[2]))
            if obj is None:
                return 404, _status(404, "NotFound",
                                    f'resourceclaims.resource.k8s.io "{m[2]}" not found')
            return 200, obj
        if (m := _EVENTS.fullmatch(path)) and method == "POST":
            return self._create_event(m[1], body)
        if _SLICES.fullmatch(path):
            if method == "GET":
                return 200, self._list(query)
            if method == "POST":
                return self._create(body)
        if (m := _SLICE.fullmatch(path)):
            name = m[1]
            if method == "GET":
                s = self._slices.get(name)
                return (200, s) if s else (404, self._not_found(name))
            if method == "PUT":
                return self._replace(name, body)
            if method == "DELETE":
                s = self._slices.pop(name, None)
                return (200, s) if s else (404, self._not_found(name))
        return 404, _status(404, "NotFound", f"the server could not find {method} {path}")

    def _create_event(self, namespace: str, body: Any) -> tuple[int, Any]:
        meta = body.get("metadata") or {} if isinstance(body, dict) else {}
        missing = [f for f in _EVENT_FIELDS if not (body or {}).get(f)]
        if not meta.get("name") or missing or body.get("type") not in ("Normal", "Warning") \
                or meta.get("namespace", namespace) != namespace:
            return 422, _status(422, "Invalid", f"Event is invalid: {missing or body}")
        key = (namespace, meta["name"])
        if key in self.events:
            return 409, _status(409, "AlreadyExists", f'events "{meta["name"]}" already exists')
        self.events[key] = copy.deepcopy(body)
        return 201, body

    @staticmethod
    def _not_found(name: str) -> dict[str, Any]:
        return _status(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')

    def _list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        wanted: dict[str, str] = {}
        for selector in query.get("fieldSelector", []):
            for term in selector.split(","):
                key, _, value = term.partition("=")
                wanted[key] = value
        fields = {"spec.nodeName": "nodeName", "spec.driver": "driver"}
        items = [s for _, s in sorted(self._slices.items())
                 if all(s["spec"].get(fields[k]) == v for k, v in wanted.items())]
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                "metadata": {"resourceVersion": str(self._version)}, "items": items}

    @staticmethod
    def _invalid(body: Any) -> str:
        """Why a ResourceSlice is not one (the few rules the plugin could break)."""
        if not isinstance(body, dict) or body.get("apiVersion") != "resource.k8s.io/v1" \
                or body.get("kind") != "ResourceSlice":
            return "not a resource.k8s.io/v1 ResourceSlice"
        spec = body.get("spec") or {}
        pool = spec.get("pool") or {}
        if not spec.get("driver") or not pool.get("name") or \
                not isinstance(pool.get("generation"), int) or \
                not isinstance(pool.get("resourceSliceCount"), int) or \
                pool["resourceSliceCount"] < 1:
            return "spec.driver, spec.pool.name, generation and resourceSliceCount are required"
        names = [d.get("name") for d in spec.get("devices") or []]
        if len(set(names)) != len(names) or not all(
                isinstance(n, str) and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n)
                for n in names):
            return f"spec.devices: names must be unique DNS labels: {names}"
        return ""

    def _drop_disabled(self, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        """What the real strategy's dropDisabledDRAConsumableCapacityFields does."""
        def in_use(s: dict[str, Any]) -> bool:
            return any("allowMultipleAllocations" in d or any(
                "requestPolicy" in c for c in (d.get("capacity") or {}).values())
                for d in s["spec"].get("devices") or [])
        if self.consumable_capacity or (old is not None and in_use(old)):
            return
        for d in new["spec"].get("devices") or []:
            d.pop("allowMultipleAllocations", None)
            for c in (d.get("capacity") or {}).values():
                c.pop("requestPolicy", None)

    def _create(self, body: Any) -> tuple[int, Any]:
        if why := self._invalid(body):
            return 422, _status(422, "Invalid", why)
        name = body["metadata"]["name"]
        if name in self._slices:
            return 409, _status(409, "AlreadyExists",
                                f'resourceslices.resource.k8s.io "{name}" already exists')
        obj = copy.deepcopy(body)
        self._drop_disabled(obj, None)
        obj["metadata"].update(resourceVersion=self._next_version(), uid=str(uuid.uuid4()))
        self._slices[name] = obj
        return 201, obj

    def _replace(self, name: str, body: Any) -> tuple[int, Any]:
        if why := self._invalid(body):
            return 422, _status(422, "Invalid", why)
        old = self._slices.get(name)
        if old is None:
            return 404, self._not_found(name)
        if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
            return 409, _status(409, "Conflict", f'Operation cannot be fulfilled on '
                                f'resourceslices.resource.k8s.io "{name}": the object has '
                                "been modified; please apply your changes to the latest "
                                "version and try again")
        obj = copy.deepcopy(body)
        self._drop_disabled(obj, old)
        obj["metadata"].update(resourceVersion=self._next_version(),
                               uid=old["metadata"]["uid"])
        self._slices[name] = obj
        return 200, obj


def _handler(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: with Nagle on, the body waits for the
        # client's delayed ACK (40 ms on Linux), which no real API server makes it pay.
        disable_nagle_algorithm = True

        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                code, reply = 400, _status(400, "BadRequest", "the body is not JSON")
            else:
                code, reply = api.handle(self.command, url.path, parse_qs(url.query), body)
            data = json.dumps(reply).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve  # noqa: N815 - http.server's names

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def running() -> Iterator[FakeApiServer]:
    """A started fake API server, stopped at the end."""
    api = FakeApiServer().start()
    try:
        yield api
    finally:
        api.stop()
