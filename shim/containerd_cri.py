# SPDX-License-Identifier: Apache-2.0
"""The CRI plugin section vgpu's containerd drop-in must hold, decided from the host's config.

containerd 1.x merges an imported file into its config one *plugin section* at a time: a
drop-in that names `plugins."io.containerd.grpc.v1.cri"` at all replaces the whole CRI
section of the main config (containerd issue #5837; only containerd 2.0 merges deeper).
A drop-in holding just the `vgpu` runtime would drop the host's sandbox image, CNI paths,
registry settings and the `runc` runtime itself, and then the CRI plugin refuses to load
(default_runtime_name names a runtime that is gone). So the drop-in carries the CRI
section containerd would use without it, with the `vgpu` runtime added (the approach of
nvidia-container-toolkit's installer). Pure: documents in, document out.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CRI_PLUGIN", "DEFAULT_RUNTIME", "RUNTIME_NAME", "cri_section", "import_paths",
           "with_vgpu"]

CRI_PLUGIN = "io.containerd.grpc.v1.cri"
#: The CRI runtime handler vgpu registers (a RuntimeClass's `handler`).
RUNTIME_NAME = "vgpu"
#: containerd's own default handler, as `containerd config default` writes it.
DEFAULT_RUNTIME = {"runc": {"runtime_type": "io.containerd.runc.v2"}}
#: runc options vgpu's handler must not inherit: BinaryName would make the runc shim run
#: that binary instead of vgpu-runtime (vgpu's config runtime.lower names the lower runtime).
NOT_INHERITED = frozenset({"BinaryName"})


def _section(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    plugins = doc.get("plugins")
    section = plugins.get(CRI_PLUGIN) if isinstance(plugins, Mapping) else None
    return section if isinstance(section, dict) else None


def cri_section(doc: Mapping[str, Any], imported: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The CRI section containerd uses for the main config `doc` and the files it imports
    (in import order, ours left out): the last one that has a section wins whole."""
    section = _section(doc)
    for sub in imported:
        section = _section(sub) or section
    return copy.deepcopy(section) if section is not None else {}


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
