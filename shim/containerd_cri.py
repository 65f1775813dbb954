# SPDX-License-Identifier: Apache-2.0
"""The CRI plugin section vgpu's containerd drop-in must hold, decided from the host's config.

containerd 1.x merges an imported file into its config one *plugin section* at a time: a
drop-in that names `plugins."io.containerd.grpc.v1.cri"` at all replaces the whole CRI
section of the main config (containerd issue #5837; 1.x's mergeConfig assigns each
plugin's value). A drop-in holding just the `vgpu` runtime would drop the host's sandbox
image, CNI paths, registry settings and the `runc` runtime itself, and then the CRI plugin
refuses to load (default_runtime_name names a runtime that is gone). So on a version 2
config the drop-in carries the CRI section containerd would use without it, with the
`vgpu` runtime added (the approach of nvidia-container-toolkit's installer).

containerd 2.x (config version 3; its CRI runtime settings live in their own plugin,
`io.containerd.cri.v1.runtime`) merges imported files key by key, at every depth
(mergo.Merge in cmd/containerd/server/config), so there the drop-in holds the `vgpu`
runtime alone, and with --set-as-default the default runtime's name: a copy would freeze
the host's other settings into vgpu's file. A version 2 config gives no way to tell 1.x
from 2.x; the whole-section copy is right on both. Pure: documents in, document out.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CRI_PLUGIN", "CRI_RUNTIME_PLUGIN", "DEFAULT_RUNTIME", "RUNTIME_NAME", "cri_plugin",
           "cri_section", "import_paths", "merged_cri_section", "vgpu_only", "with_vgpu"]

#: The CRI plugin of config version 2 (containerd 1.x; 2.x migrates it).
CRI_PLUGIN = "io.containerd.grpc.v1.cri"
#: Where config version 3 on (containerd 2.x) keeps the CRI runtimes.
CRI_RUNTIME_PLUGIN = "io.containerd.cri.v1.runtime"
#: The CRI runtime handler vgpu registers (a RuntimeClass's `handler`).
RUNTIME_NAME = "vgpu"
#: containerd's own default handler, as `containerd config default` writes it.
DEFAULT_RUNTIME = {"runc": {"runtime_type": "io.containerd.runc.v2"}}
#: runc options vgpu's handler must not inherit: BinaryName would make the runc shim run
#: that binary instead of vgpu-runtime (vgpu's config runtime.lower names the lower runtime).
NOT_INHERITED = frozenset({"BinaryName"})


def cri_plugin(version: int) -> str:
    """The plugin that holds the CRI runtimes in a config of `version` (2, or 3 on)."""
    return CRI_PLUGIN if version < 3 else CRI_RUNTIME_PLUGIN


def _section(doc: Mapping[str, Any], plugin: str = CRI_PLUGIN) -> dict[str, Any] | None:
    plugins = doc.get("plugins")
    section = plugins.get(plugin) if isinstance(plugins, Mapping) else None
    return section if isinstance(section, dict) else None


def cri_section(doc: Mapping[str, Any], imported: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The CRI section containerd 1.x uses for the main config `doc` and the files it
    imports (in import order, ours left out): the last one that has a section wins whole."""
    section = _section(doc)
    for sub in imported:
        section = _section(sub) or section
    return copy.deepcopy(section) if section is not None else {}


def _merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def merged_cri_section(doc: Mapping[str, Any], imported: Sequence[Mapping[str, Any]],
                       plugin: str = CRI_RUNTIME_PLUGIN) -> dict[str, Any]:
    """The section of `plugin` containerd 2.x uses: the main config's with each imported
    file's merged into it key by key (tables merged, other values replaced)."""
    out: dict[str, Any] = {}
    for sub in (doc, *imported):
        _merge(out, _section(sub, plugin) or {})
    return out


def vgpu_only(section: Mapping[str, Any], *, set_default: bool) -> dict[str, Any]:
    """Of a section `with_vgpu` made, what a drop-in merged key by key needs: the `vgpu`
    runtime, and with set_default the default runtime's name."""
    containerd = section["containerd"]
    out: dict[str, Any] = {"runtimes": {RUNTIME_NAME: copy.deepcopy(
        containerd["runtimes"][RUNTIME_NAME])}}
    if set_default:
        out = {"default_runtime_name": RUNTIME_NAME, **out}
    return {"containerd": out}


def with_vgpu(section: Mapping[str, Any], runtime: Mapping[str, Any], *,
              set_default: bool, warn: Callable[[str], None]) -> dict[str, Any]:
    """`section` with the `vgpu` runtime added (its options inherited from the default
    runtime's, so pods keep the node's cgroup driver), and with set_default, vgpu as the
    default runtime (pods that ask for nothing still pass through untouched)."""
    out = copy.deepcopy(dict(section))
    containerd = out.setdefault("containerd", {})
    runtimes = containerd.setdefault("runtimes", {})
    if not runtimes:
        runtimes.update(copy.deepcopy(DEFAULT_RUNTIME))
    base_name = containerd.get("default_runtime_name", "runc")
    if base_name == RUNTIME_NAME:   # set by hand: inherit from runc
        base_name = "runc"
    vgpu = copy.deepcopy(dict(runtime))
    base_options = runtimes.get(base_name, {}).get("options")
    if isinstance(base_options, dict) and "options" not in vgpu:
        vgpu["options"] = {k: v for k, v in base_options.items() if k not in NOT_INHERITED}
        binary = base_options.get("BinaryName")
        if binary:
            warn(f"vgpu: the {base_name} runtime runs {binary}: set `runtime.lower: {binary}` "
                 "in vgpu's config for vgpu-runtime to hand containers to it")
    runtimes[RUNTIME_NAME] = vgpu
    if set_default:
        containerd["default_runtime_name"] = RUNTIME_NAME
    return out


def import_paths(config: Path, imports: list[str]) -> list[Path]:
    """The files `imports` names, as containerd resolves them: relative to the config's
    directory, glob patterns expanded and sorted."""
    found: list[Path] = []
    for item in imports:
        pattern = item if Path(item).is_absolute() else str(config.parent / item)
        if any(c in pattern for c in "*?["):
            found += sorted(Path("/").glob(pattern.lstrip("/")))
        else:
            found.append(Path(pattern))
    return found
