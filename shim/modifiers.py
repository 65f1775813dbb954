# SPDX-License-Identifier: Apache-2.0
"""Spec modifiers: one small change to an OCI spec each, applied in order.

Modelled on nvidia-container-toolkit's internal/modifier: a modifier edits the
spec in place; `Modifiers` applies a list and skips the empty entries; the
factory (`for_slice`) builds the list for a granted slice. A container that
asks for no vGPU gets no modifiers at all (shim.runtime.give_vgpu never calls the factory),
so its spec stays byte-identical.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shim.spec import Spec

__all__ = [
    "HOOK_MARKERS",
    "AnnotationsModifier",
    "CdiEditsModifier",
    "DeviceNode",
    "DeviceNodesModifier",
    "EnvModifier",
    "Hook",
    "HookSettings",
    "HooksModifier",
    "Modifier",
    "Modifiers",
    "SliceInfo",
    "device_node",
    "for_slice",
]

#: A hook whose path or args contain one of these is already ours (Podman's hooks.d
#: may have added it): we never add a second one.
HOOK_MARKERS = ("vgpu-hook",)


class Modifier(Protocol):
    """One change to an OCI spec."""

    def modify(self, spec: Spec) -> None:
        """Change `spec` in place."""
        ...


@dataclass(frozen=True)
class Modifiers:
    """Modifiers applied in order; None entries are skipped."""

    items: tuple[Modifier | None, ...] = ()

    def modify(self, spec: Spec) -> None:
        """Apply every modifier to `spec`."""
        for m in self.items:
            if m is not None:
                m.modify(spec)

    def __len__(self) -> int:
        return sum(1 for m in self.items if m is not None)


@dataclass(frozen=True)
class Hook:
    """An OCI hook entry (config.json hooks.<phase>[])."""

    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The hook as config.json has it."""
        out: dict[str, Any] = {"path": self.path}
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = list(self.env)
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out


def _is_ours(hook: Any) -> bool:
    if not isinstance(hook, dict):
        return False
    words = [str(hook.get("path", "")), *map(str, hook.get("args") or [])]
    return any(marker in w for w in words for marker in HOOK_MARKERS)


@dataclass(frozen=True)
class HooksModifier:
    """Add our hooks per phase (e.g. prestart, poststop) unless one of ours is already there.

    runc runs `prestart` hooks in the runtime's namespaces after the container's
    namespaces exist and before pivot_root (what the hook's setns + mount needs);
    `poststop` after the container is deleted. Both are what Podman's hooks.d and
    nvidia-container-runtime use, and every OCI runtime supports them.
    """

    hooks: tuple[tuple[str, Hook], ...]   # (phase, hook)

    def modify(self, spec: Spec) -> None:
        """Append each hook to its phase in spec["hooks"]."""
        hooks = spec.setdefault("hooks", {})
        present = any(_is_ours(h) for phase in hooks.values() if isinstance(phase, list)
                      for h in phase)
        if present:
            return
        for phase, hook in self.hooks:
            hooks.setdefault(phase, []).append(hook.to_json())


@dataclass(frozen=True)
class DeviceNode:
    """A host device node to create in the container and allow in its device cgroup."""

    path: str
    type: str        # "c" or "b"
    major: int
    minor: int
    file_mode: int = 0o666
    uid: int = 0
    gid: int = 0


def device_node(path: str) -> DeviceNode | None:
    """Stat a host device node; None when it is not a character or block device.

    Regular files stand in for device nodes in tests; those are mounted by the hook
    and need neither a linux.devices entry nor a cgroup rule.
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        return None
    return DeviceNode(path, kind, os.major(st.st_rdev), os.minor(st.st_rdev),
                      stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)


@dataclass(frozen=True)
class DeviceNodesModifier:
    """linux.devices entries and linux.resources.devices allow rules ("rwm") for the nodes."""

    nodes: tuple[DeviceNode, ...]

    def modify(self, spec: Spec) -> None:
        """Add each node once (by path) and one allow rule per (type, major, minor)."""
        if not self.nodes:
            return
        linux = spec.setdefault("linux", {})
        devices = linux.setdefault("devices", [])
        have = {d.get("path") for d in devices if isinstance(d, dict)}
        resources = linux.setdefault("resources", {})
        rules = resources.setdefault("devices", [])
        allowed = {(r.get("type"), r.get("major"), r.get("minor")) for r in rules
                   if isinstance(r, dict) and r.get("allow")}
        for n in self.nodes:
            if n.path not in have:
                devices.append({"path": n.path, "type": n.type, "major": n.major,
                                "minor": n.minor, "fileMode": n.file_mode,
                                "uid": n.uid, "gid": n.gid})
                have.add(n.path)
            if (n.type, n.major, n.minor) not in allowed:
                rules.append({"allow": True, "type": n.type, "major": n.major,
                              "minor": n.minor, "access": "rwm"})
                allowed.add((n.type, n.major, n.minor))


@dataclass(frozen=True)
class EnvModifier:
    """Set process.env variables, replacing an existing value of the same name."""

    values: tuple[tuple[str, str], ...]

    def modify(self, spec: Spec) -> None:
        """Replace or append NAME=value entries in spec["process"]["env"]."""
        if not self.values:
            return
        process = spec.setdefault("process", {})
        env: list[str] = list(process.get("env") or [])
        names = dict(self.values)
        env = [e for e in env if e.split("=", 1)[0] not in names]
        env.extend(f"{k}={v}" for k, v in self.values)
        process["env"] = env


@dataclass(frozen=True)
class AnnotationsModifier:
    """Set annotations (the hook reads them from the state: the slice id, env permission)."""

    values: tuple[tuple[str, str], ...]

    def modify(self, spec: Spec) -> None:
        """Set each annotation in spec["annotations"]."""
        if not self.values:
            return
        annotations = spec.setdefault("annotations", {})
        annotations.update(dict(self.values))


@dataclass(frozen=True)
class SliceInfo:
    """What the modifiers need of a granted slice (from vgpud's Allocate answer)."""

    id: str
    gpu_uuids: tuple[str, ...]            # in vGPU order: /dev/vgpu<i> is gpu_uuids[i]
    device_nodes: tuple[str, ...] = ()    # host nodes of the slice's GPUs, deduplicated
    env: tuple[tuple[str, str], ...] = ()  # oci_hook.mounts.slice_env: names its GPUs


@dataclass(frozen=True)
class HookSettings:
    """How to run vgpu-hook from config.json."""

    path: str
    args: tuple[str, ...] = ()            # argv before the phase: (path,)
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: int = 30


def for_slice(s: SliceInfo, hook: HookSettings, *, env_request: bool,
              stat_node: Any = device_node, extra_annotations: Sequence[tuple[str, str]] = ()
              ) -> Modifiers:
    """The modifiers for a container granted slice `s`, in the order they apply."""
    def hook_for(phase: str) -> Hook:
        return Hook(hook.path, (*hook.args, phase),
                    tuple(f"{k}={v}" for k, v in hook.env.items()), hook.timeout)

    nodes = tuple(n for n in (stat_node(p) for p in _unique(s.device_nodes)) if n is not None)
    annotations = [("vgpu.io/slice", s.id), *extra_annotations]
    if env_request:
        annotations.append(("vgpu.io/env-requests", "allowed"))
    return Modifiers((
        HooksModifier((("prestart", hook_for("prestart")), ("poststop", hook_for("poststop")))),
        DeviceNodesModifier(nodes) if nodes else None,
        EnvModifier(s.env),
        AnnotationsModifier(tuple(annotations)),
    ))


@dataclass(frozen=True)
class CdiEditsModifier:
    """Apply CDI devices' containerEdits (oci_hook.cdi) the way a CDI engine does, for an
    engine without CDI (containerd 1.6): env (replacing a same-named entry), device nodes
    with their cgroup rules, bind mounts after the spec's own (so /dev, /run are there
    first), hooks appended to their phase."""

    edits: tuple[Mapping[str, Any], ...]

    def modify(self, spec: Spec) -> None:
        """Apply each device's edits in order."""
        for e in self.edits:
            EnvModifier(tuple((k, v) for k, _, v in (item.partition("=")
                                                     for item in e.get("env") or []))).modify(spec)
            nodes = []
            for n in e.get("deviceNodes") or []:
                node = (DeviceNode(n["path"], n["type"], int(n["major"]), int(n["minor"]),
                                   int(n.get("fileMode", 0o666)), int(n.get("uid", 0)),
                                   int(n.get("gid", 0)))
                        if "type" in n and "major" in n else device_node(n["path"]))
                if node is not None:
                    nodes.append(node)
            DeviceNodesModifier(tuple(nodes)).modify(spec)
            mounts = spec.setdefault("mounts", [])
            for m in e.get("mounts") or []:
                mounts.append({"destination": m["containerPath"], "type": "bind",
                               "source": m["hostPath"], "options": list(m.get("options") or [])})
            hooks = spec.setdefault("hooks", {})
            for h in e.get("hooks") or []:
                entry = {k: h[k] for k in ("path", "args", "env", "timeout") if k in h}
                hooks.setdefault(h["hookName"], []).append(entry)


def _unique(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for i in items:
        seen.setdefault(i, None)
    return list(seen)

