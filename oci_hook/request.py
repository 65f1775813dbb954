# SPDX-License-Identifier: Apache-2.0
"""A container's vGPU request: find the vgpu.io/* keys, then validate them into a model Request.

Pure logic, no I/O besides reading configs/request.schema.json once. Used by the hook's
and the runtime's decisions (oci_hook.phases, shim.runtime), so both refuse the same
requests with the same line:

    vgpu.io/memory=lots: not a memory quantity: use an integer with an optional suffix ...

Shape and spelling are checked with JSON Schema (configs/request.schema.json);
values and ranges with arbiter.quantity, the one parser of quantities.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arbiter.errors import QuantityError
from arbiter.install.shipped import shipped_file
from arbiter.quantity import COMPUTE_FORMS, MEMORY_FORMS, parse_compute, parse_memory
from oci_hook.errors import RequestError, StateError

if TYPE_CHECKING:
    from arbiter.model import Policy, Priority, Request

__all__ = [
    "ANNOTATION_PREFIX",
    "APP_CONTAINER",
    "CONTAINER_TYPE_KEYS",
    "COUNT_MAX",
    "ENV_KEYS",
    "ENV_REQUESTS_ANNOTATION",
    "HOOK_KEYS_PHASE",
    "INTERNAL_ANNOTATIONS",
    "REQUEST_KEYS",
    "SANDBOX",
    "SLICE_ANNOTATION",
    "container_type",
    "find_request",
    "hook_args",
    "hook_keys",
    "parse_request",
    "preload_schema",
    "schema_path",
]

ANNOTATION_PREFIX = "vgpu.io/"
MEMORY = "vgpu.io/memory"
COMPUTE = "vgpu.io/compute"
COUNT = "vgpu.io/count"
PRIORITY = "vgpu.io/priority"
POLICY = "vgpu.io/policy"
DEVICES = "vgpu.io/devices"

#: The request keys (DESIGN.md), in the order errors are reported.
REQUEST_KEYS = (MEMORY, COMPUTE, COUNT, PRIORITY, POLICY, DEVICES)
#: Env var -> annotation: the same request where the config allows env requests.
ENV_KEYS: Mapping[str, str] = {
    "VGPU_" + key.removeprefix(ANNOTATION_PREFIX).upper(): key for key in REQUEST_KEYS}

#: Set by vgpu-runtime on the spec after it allocated: the slice's id (the hook checks
#: that the slice's owner is the container before trusting it).
SLICE_ANNOTATION = "vgpu.io/slice"
#: Set by vgpu-runtime when the request came from env and the config allowed it: a record
#: for whoever reads the spec. The hook never trusts it (a tenant can set any vgpu.io/*
#: annotation): env requests count by vgpud's config alone.
ENV_REQUESTS_ANNOTATION = "vgpu.io/env-requests"
#: vgpu.io/* annotations that are not part of a request.
INTERNAL_ANNOTATIONS = frozenset({SLICE_ANNOTATION, ENV_REQUESTS_ANNOTATION})

#: What a CRI runtime writes on every spec of a pod, containerd's CRI plugin first, then
#: CRI-O's: the pod's sandbox (pause) container or one of its application containers.
#: containerd sets them after the pass-through annotations: a pod's own cannot override them.
CONTAINER_TYPE_KEYS = ("io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType")
SANDBOX = "sandbox"
APP_CONTAINER = "container"

#: The vgpu-hook phase whose arguments may carry request keys (`vgpu-hook createRuntime
#: vgpu.io/memory=4Gi ...`): what the device plugin's CDI devices add (oci_hook.cdi).
HOOK_KEYS_PHASE = "createRuntime"
_HOOK_NAME = "vgpu-hook"
_HOOK_KEYS_MAX = 16   # far more than the request has keys: a bound on what is read

#: More vGPUs than any host has GPUs; bounds the value before it reaches the proto's uint32.
COUNT_MAX = 1024

# What each key holds and the accepted forms: the second half of every error line.
_FORMS: Mapping[str, tuple[str, str]] = {
    MEMORY: ("a memory quantity", MEMORY_FORMS),
    COMPUTE: ("a compute share", COMPUTE_FORMS),
    COUNT: ("a vGPU count", f"an integer from 1 to {COUNT_MAX}"),
    PRIORITY: ("a priority", "high, normal or low"),
    POLICY: ("a policy", "fixed or burst"),
    DEVICES: ("a device list", "GPU indices or UUIDs, comma separated, e.g. 0,2"),
}
_SCHEMA_NAME = "request.schema.json"


def hook_args(phase: str, keys: Mapping[str, str]) -> list[str]:
    """vgpu-hook's argv after its name for `phase` carrying request `keys` (hook_keys
    reads them back): `createRuntime vgpu.io/memory=4Gi vgpu.io/devices=GPU-...`."""
    return [phase, *(f"{k}={v}" for k, v in keys.items())]


def hook_keys(hooks: object) -> dict[str, str]:
    """The request keys that a spec's vgpu-hook hooks carry as arguments (hook_args).

    `hooks` is config.json's `hooks` object. A CDI device of the device plugin adds
    `vgpu-hook createRuntime vgpu.io/memory=4Gi ...` (memory and the GPU) and another
    `vgpu-hook createRuntime vgpu.io/compute=30` (compute: the kubelet allocates each
    resource apart); their keys together are the container's request. Only the engine
    writes hooks (from a CDI spec, hooks.d or the runtime): a pod or an image cannot, so
    these keys are the kubelet's, as trusted as its container annotations. Hooks of
    another program, of another phase or without `=` arguments are not read. A key named
    twice with two values is a StateError: the request would be ambiguous."""
    found: dict[str, str] = {}
    entries = hooks.get(HOOK_KEYS_PHASE) if isinstance(hooks, dict) else None
    for h in entries if isinstance(entries, list) else []:
        args = h.get("args") if isinstance(h, dict) else None
        if (not isinstance(args, list) or len(args) < 3 or args[1] != HOOK_KEYS_PHASE
                or not all(isinstance(a, str) for a in args)
                or Path(args[0]).name != _HOOK_NAME):
            continue
        for item in args[2:2 + _HOOK_KEYS_MAX]:
            key, sep, value = item.partition("=")
            if not sep or not key.startswith(ANNOTATION_PREFIX) or key in INTERNAL_ANNOTATIONS:
                continue
            if found.setdefault(key, value) != value:
                raise StateError(f"the vgpu-hook {HOOK_KEYS_PHASE} hooks",
                                 f"{key} is given twice, as {found[key]!r} and {value!r}")
    return found


def container_type(annotations: Mapping[str, object]) -> str | None:
    """SANDBOX or APP_CONTAINER where a CRI runtime made the spec (CONTAINER_TYPE_KEYS),
    else None. Sandbox wins over any other value: a pause container never gets a slice."""
    kinds = {annotations.get(key) for key in CONTAINER_TYPE_KEYS}
    if SANDBOX in kinds:
        return SANDBOX
    return APP_CONTAINER if APP_CONTAINER in kinds else None


def find_request(annotations: Mapping[str, str], env: Sequence[str], *,
                 allow_env: bool) -> dict[str, str] | None:
    """The raw request: ``vgpu.io/<key>`` -> value, from annotations, else from env.

    Every ``vgpu.io/*`` annotation counts except the ones vgpu-runtime sets
    (INTERNAL_ANNOTATIONS), so a misspelt key is refused rather than ignored. Env
    (``NAME=VALUE`` items, as in the OCI spec's process.env) is read only with
    `allow_env` and only when no annotation asks; its names map to the annotation
    names (VGPU_MEMORY -> vgpu.io/memory); the first item of a name wins, as getenv
    does. Other VGPU_* variables (libvgpu's own settings) are not requests.

    Kubernetes pods (docs/containers.md "Kubernetes pods"): a pod's sandbox asks for
    nothing, whatever it carries; an application container whose keys (the pod's
    merged with its own) name no memory asks for nothing either: the pod's keys reach
    every container and cannot be told from its own in the spec.
    None: the container asks for no vGPU.
    """
    kind = container_type(annotations)
    if kind == SANDBOX:
        return None
    raw = {k: v for k, v in annotations.items()
           if k.startswith(ANNOTATION_PREFIX) and k not in INTERNAL_ANNOTATIONS}
    if not raw and allow_env:
        for item in env:
            name, sep, value = item.partition("=")
            key = ENV_KEYS.get(name)
            if sep and key is not None and key not in raw:
                raw[key] = value
    if kind == APP_CONTAINER and MEMORY not in raw:
        return None
    return raw or None


def parse_request(raw: Mapping[str, str], *, owner: str, owner_pid: int = 0,
                  defaults: tuple[int, Priority, Policy]) -> Request:
    """Validate a raw request (find_request's map) into a Request for `owner`.

    `defaults` are the config's (compute %, priority, policy) for keys not given.
    Raises RequestError naming the first bad key, its value and the accepted forms.
    """
    # Imported here: find_request (every container start) does not need the model.
    from arbiter.model import OwnerKind, Policy, Priority, Request

    _check_shape(raw)
    default_compute, default_priority, default_policy = defaults
    memory = _value(MEMORY, raw[MEMORY], parse_memory)
    compute = _value(COMPUTE, raw[COMPUTE], parse_compute) if COMPUTE in raw \
        else default_compute
    count = _value(COUNT, raw[COUNT], _parse_count) if COUNT in raw else 1
    priority = Priority[raw[PRIORITY].upper()] if PRIORITY in raw else default_priority
    policy = Policy[raw[POLICY].upper()] if POLICY in raw else default_policy
    devices = tuple(raw[DEVICES].split(",")) if DEVICES in raw else ()
    return Request(owner=owner, memory=memory, compute=compute, count=count,
                   priority=priority, policy=policy, devices=devices,
                   owner_kind=OwnerKind.CONTAINER, owner_pid=owner_pid)


def schema_path() -> Path:
    """configs/request.schema.json: inside an installed package, else in the checkout."""
    return shipped_file(_SCHEMA_NAME)


def preload_schema() -> None:
    """Compile the request schema now (vgpud at start), not in the first container's start."""
    _validator()


@cache
def _validator() -> Any:
    # jsonschema is imported here, not at the top: it costs tens of milliseconds
    # and the hook's path without a request never needs it.
    import jsonschema

    schema = json.loads(schema_path().read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


def _rank(key: str) -> int:
    """Report unknown keys first, then the known ones in table order."""
    return REQUEST_KEYS.index(key) + 1 if key in REQUEST_KEYS else 0


def _check_shape(raw: Mapping[str, str]) -> None:
    """Raise RequestError for the first schema violation (unknown, missing or misspelt key)."""
    problems: list[tuple[int, str, RequestError]] = []
    for error in _validator().iter_errors(dict(raw)):
        path = list(error.absolute_path)
        if error.validator == "additionalProperties":
            for key in sorted(set(raw) - set(REQUEST_KEYS)):
                value = raw[key]
                problems.append((_rank(key), key, RequestError(
                    key, value if isinstance(value, str) else repr(value),
                    f"unknown key: use {', '.join(REQUEST_KEYS)}")))
        elif error.validator == "required":
            problems.append((_rank(MEMORY), MEMORY, RequestError(
                MEMORY, None, "missing: a vGPU request needs the memory per vGPU, "
                              "e.g. vgpu.io/memory=4Gi")))
        elif path and isinstance(path[0], str) and path[0] in _FORMS:
            key = path[0]
            value = raw[key]
            what, forms = _FORMS[key]
            shown = value if isinstance(value, str) else repr(value)
            problems.append((_rank(key), key, RequestError(key, shown,
                                                           f"not {what}: use {forms}")))
        else:  # the whole map is not an object of strings: not reachable from a spec
            problems.append((-1, "", RequestError("vgpu.io/*", None, error.message)))
    if problems:
        raise min(problems, key=lambda p: (p[0], p[1]))[2]


def _parse_count(text: str) -> int:
    value = int(text)
    if not 1 <= value <= COUNT_MAX:
        raise ValueError(text)
    return value


def _value(key: str, text: str, parse: Any) -> Any:
    """parse(text), or RequestError with the key's accepted forms."""
    try:
        return parse(text)
    except (QuantityError, ValueError) as e:
        what, forms = _FORMS[key]
        raise RequestError(key, text, f"not {what}: use {forms}") from e
