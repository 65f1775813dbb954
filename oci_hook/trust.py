# SPDX-License-Identifier: Apache-2.0
"""Who may choose a container's request: each key's trusted sources (DESIGN.md trust model).

Outside Kubernetes every ``vgpu.io/*`` key of a spec is the host's (the engine's command
line: ``docker run --annotation``, ``ctr``, ``podman``) and env requests count where
``hook.allow_env_requests`` says. A Kubernetes pod's application container
(request.container_type is APP_CONTAINER) holds keys from three sources in one spec:

- its own (the CRI container config's): a pod manifest cannot set them, only the kubelet
  does, from the device plugin's Allocate: trusted;
- the pod's annotations (``metadata.annotations``), which containerd's ``pod_annotations``
  copies into the spec of the sandbox and of every container: the pod author's;
- its env (``VGPU_*`` from the image or the pod spec): the pod author's.

In Kubernetes the pod author is a tenant, so the last two count only for the keys that
config ``requests.trusted_sources`` lists for the pod's namespace (default: none); any other
key fails the container's start with one line naming the key, the value and the source.
The spec no longer tells the pod's keys from the container's (containerd merges them), so
the pod's are read from its sandbox's spec, which holds the pod's alone (pod_keys). CRI-O
copies a pod's annotations into its sandbox's spec only: there, every key of a
container's spec is its own. A DRA claim's container never comes here: its slice is the
claim's (oci_hook.phases.claim_prestart).

check_sources is the pure rule; pod_keys the one read it needs.
"""
from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from oci_hook.errors import SourceError, StateError
from oci_hook.request import (
    ANNOTATION_PREFIX,
    APP_CONTAINER,
    CONTAINER_TYPE_KEYS,
    ENV_KEYS,
    INTERNAL_ANNOTATIONS,
    REQUEST_KEYS,
    container_type,
)

if TYPE_CHECKING:
    from arbiter.config import Config

__all__ = [
    "ANY_NAMESPACE",
    "NAMESPACE_KEYS",
    "POD_ANNOTATIONS",
    "POD_ENV",
    "SANDBOX_ID_KEY",
    "TrustedSources",
    "check_request",
    "check_sources",
    "pod_keys",
    "pod_namespace",
    "request_keys",
]

#: The sources a pod author controls, as named under config requests.trusted_sources.
POD_ANNOTATIONS = "pod_annotations"
POD_ENV = "pod_env"
_WHERE = {POD_ANNOTATIONS: "the pod's annotations", POD_ENV: "the container's env"}
#: A namespace entry that stands for every namespace.
ANY_NAMESPACE = "*"
#: The pod's namespace, per CRI runtime (the order of CONTAINER_TYPE_KEYS): containerd
#: writes its key after the annotations it passes through, CRI-O's is the kubelet's label;
#: a pod annotation can set neither.
NAMESPACE_KEYS = ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace")
#: containerd's CRI plugin names a container's sandbox (written after the pass-through ones).
SANDBOX_ID_KEY = "io.kubernetes.cri.sandbox-id"
#: A sandbox's config.json is a few KiB; more is not one containerd wrote.
_SPEC_MAX = 4 << 20
_ENV_NAMES = {key: name for name, key in ENV_KEYS.items()}


@dataclass(frozen=True)
class TrustedSources:
    """Per pod source: namespace (or ANY_NAMESPACE) -> the request keys it may set, by short
    name (``priority`` for vgpu.io/priority)."""

    pod_annotations: Mapping[str, frozenset[str]] = field(default_factory=dict)
    pod_env: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, config: Config) -> TrustedSources:
        """The config's requests.trusted_sources."""
        def sets(rules: Mapping[str, tuple[str, ...]]) -> dict[str, frozenset[str]]:
            return {ns: frozenset(keys) for ns, keys in rules.items()}
        return cls(sets(config.trusted_pod_annotations), sets(config.trusted_pod_env))

    def listed(self, source: str, namespace: str | None) -> frozenset[str]:
        """The short keys `source` may set in `namespace` (None: a pod without one)."""
        rules = self.pod_annotations if source == POD_ANNOTATIONS else self.pod_env
        own = rules.get(namespace, frozenset()) if namespace else frozenset()
        return own | rules.get(ANY_NAMESPACE, frozenset())


def _short(key: str) -> str:
    return key.removeprefix(ANNOTATION_PREFIX)


def _rank(key: str) -> tuple[int, str]:
    """Unknown keys first, then the request keys in table order (as parse_request reports)."""
    return (REQUEST_KEYS.index(key) + 1 if key in REQUEST_KEYS else 0, key)


def request_keys(annotations: Mapping[str, str]) -> dict[str, str]:
    """The ``vgpu.io/*`` keys of `annotations` that make a request (not vgpu-runtime's own)."""
    return {k: v for k, v in annotations.items()
            if k.startswith(ANNOTATION_PREFIX) and k not in INTERNAL_ANNOTATIONS}


def pod_namespace(annotations: Mapping[str, str]) -> str | None:
    """The pod's namespace as its CRI runtime wrote it, else None."""
    for type_key, ns_key in zip(CONTAINER_TYPE_KEYS, NAMESPACE_KEYS, strict=True):
        if type_key in annotations:
            return annotations.get(ns_key) or None
    return None


def check_sources(raw: Mapping[str, str], *, from_env: bool, pod: Mapping[str, str],
                  namespace: str | None, trusted: TrustedSources) -> None:
    """Raise SourceError for the first key a pod author set that `trusted` does not allow.

    `raw` is an application container's request (find_request), read from its env when
    `from_env`; `pod` the pod's own ``vgpu.io/*`` annotations. Every pod key counts, also one
    a container key of the same name overrides: the pod asked for it all the same, and an
    admission policy (configs/kubernetes/) refuses it as well.
    """
    source, keys = (POD_ENV, raw) if from_env else (POD_ANNOTATIONS, request_keys(pod))
    allowed = trusted.listed(source, namespace)
    for key in sorted(keys, key=_rank):
        if _short(key) in allowed:
            continue
        name = _ENV_NAMES.get(key, key) if from_env else key
        where = f"namespace {namespace}" if namespace else "a pod with no namespace"
        lists = (f"lists only {', '.join(sorted(allowed))}" if allowed
                 else "lists no key")
        raise SourceError(name, keys[key], _WHERE[source],
                          f"is not allowed in {where} (requests.trusted_sources.{source} "
                          f"{lists} for it)")


def pod_keys(bundle: Path, annotations: Mapping[str, str]) -> dict[str, str]:
    """The pod's own ``vgpu.io/*`` annotations for a container of it made from `bundle`.

    containerd: its sandbox's spec, the sibling bundle its SANDBOX_ID_KEY names (the runc
    shim keeps every task's bundle in one directory per namespace). CRI-O: none reach a
    container's spec. StateError when the sandbox's spec cannot be read: without it the
    pod's keys would pass for the kubelet's."""
    if CONTAINER_TYPE_KEYS[0] not in annotations:
        return {}
    sandbox = annotations.get(SANDBOX_ID_KEY, "")
    if not sandbox or "/" in sandbox or sandbox in (".", ".."):
        raise StateError(f"annotation {SANDBOX_ID_KEY}", f"{sandbox!r} names no sandbox")
    path = bundle.parent / sandbox / "config.json"
    doc = _read_json(path)
    found = doc.get("annotations") if isinstance(doc, dict) else None
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in request_keys(found).items() if isinstance(v, str)}


def _read_json(path: Path) -> object:
    """A regular file's JSON, opened without following a link and without blocking."""
    what = f"the pod's sandbox spec {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise StateError(what, e.strerror or str(e)) from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _SPEC_MAX:
            raise StateError(what, "not a regular file of at most 4 MiB")
        data = os.read(fd, _SPEC_MAX + 1)
    except OSError as e:
        raise StateError(what, e.strerror or str(e)) from e
    finally:
        os.close(fd)
    try:
        return json.loads(data)
    except ValueError as e:
        raise StateError(what, f"not JSON: {e}") from e


def check_request(raw: Mapping[str, str], annotations: Mapping[str, str],
                  bundle: Path, config: Config) -> None:
    """check_sources for the container made from `bundle` with spec `annotations`, whose
    request is `raw`: only a pod's application container has sources to check."""
    if container_type(annotations) != APP_CONTAINER:
        return
    from_env = not request_keys(annotations)
    pod = {} if from_env else pod_keys(bundle, annotations)
    check_sources(raw, from_env=from_env, pod=pod, namespace=pod_namespace(annotations),
                  trusted=TrustedSources.of(config))
