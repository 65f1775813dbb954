# SPDX-License-Identifier: Apache-2.0
"""The OCI state a hook gets on stdin and the few fields of the bundle's config.json it uses."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oci_hook.errors import StateError
from oci_hook.request import hook_keys

__all__ = ["HookState", "Spec", "load_spec", "parse_state"]


@dataclass(frozen=True)
class HookState:
    """The OCI runtime state (runtime-spec state.md): only the fields the hook uses."""

    id: str
    pid: int
    bundle: Path
    annotations: Mapping[str, str] = field(default_factory=dict)
    status: str = ""  # creating, created, running, stopped


@dataclass(frozen=True)
class Spec:
    """The fields of the bundle's config.json the hook uses."""

    rootfs: Path                          # absolute: root.path, relative to the bundle
    env: tuple[str, ...] = ()             # process.env, NAME=VALUE items
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: request keys its vgpu-hook hooks carry (oci_hook.request.hook_keys): the kubelet's
    hook_keys: Mapping[str, str] = field(default_factory=dict)


def _strings(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise StateError(what, "annotations are not a map of strings")
    return dict(value)


def parse_state(data: bytes | str) -> HookState:
    """The state JSON a runtime writes to a hook's stdin."""
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise StateError("the OCI state on stdin", f"not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise StateError("the OCI state on stdin", "not a JSON object")
    cid, pid, bundle = doc.get("id"), doc.get("pid", 0), doc.get("bundle")
    if not isinstance(cid, str) or not cid:
        raise StateError("the OCI state on stdin", "no container id")
    if not isinstance(bundle, str) or not bundle.startswith("/"):
        raise StateError("the OCI state on stdin", f"bundle {bundle!r} is not an absolute path")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
        raise StateError("the OCI state on stdin", f"pid {pid!r} is not a process id")
    status = doc.get("status", "")
    return HookState(id=cid, pid=pid, bundle=Path(bundle),
                     status=status if isinstance(status, str) else "",
                     annotations=_strings(doc.get("annotations"), "the OCI state on stdin"))


def load_spec(bundle: Path) -> Spec:
    """Read <bundle>/config.json."""
    path = bundle / "config.json"
    what = str(path)
    try:
        doc = json.loads(path.read_bytes())
    except OSError as e:
        raise StateError(what, e.strerror or str(e)) from e
    except ValueError as e:
        raise StateError(what, f"not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise StateError(what, "not a JSON object")
    root = doc.get("root") or {}
    root_path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(root_path, str) or not root_path:
        raise StateError(what, "no root.path")
    process = doc.get("process") or {}
    env = process.get("env") or [] if isinstance(process, dict) else []
    if not isinstance(env, list) or not all(isinstance(e, str) for e in env):
        raise StateError(what, "process.env is not a list of strings")
    return Spec(rootfs=bundle / root_path, env=tuple(env),
                annotations=_strings(doc.get("annotations"), what),
                hook_keys=hook_keys(doc.get("hooks")))

