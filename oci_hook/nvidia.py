# SPDX-License-Identifier: Apache-2.0
"""NVIDIA's container toolkit, found on the node: what puts the driver into a container.

vgpu gives a container a slice (limits, libvgpu, the region files); the driver's
libraries (libcuda.so.1, libnvidia-ml.so.1) and the GPUs' device nodes come from NVIDIA's
toolkit. Two ways of composing with it:

- the runtime path: vgpu-runtime runs nvidia-container-runtime as its lower runtime
  (config `runtime.lower: auto` finds it on PATH, shim/native/vgpu_runtime.c);
- the CDI paths (device plugin with --cdi, DRA): vgpu's CDI devices go beside NVIDIA's,
  `nvidia.com/gpu=<uuid or index>` from the spec `nvidia-ctk cdi generate` writes
  (/etc/cdi/nvidia.yaml, /var/run/cdi/nvidia*.yaml), one per GPU of the slice, so the
  engine adds the driver and only that GPU's nodes (cdi_devices).

Pure but for the reads of the spec files.
"""
from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["KIND", "cdi_devices", "spec_names"]

log = logging.getLogger("vgpu")

#: The CDI kind of NVIDIA's GPUs (nvidia-ctk cdi generate; the GPU Operator's CDI mode).
KIND = "nvidia.com/gpu"
_SUFFIXES = (".json", ".yaml", ".yml")
_SPEC_MAX = 16 << 20   # nvidia.yaml lists every library of the driver: a few hundred KiB


def _read(path: Path) -> Any:
    """A regular spec file's document; None when it is not one (logged)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _SPEC_MAX:
            return None
        data = os.read(fd, _SPEC_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return json.loads(data) if path.suffix == ".json" else yaml.safe_load(data)
    except (ValueError, yaml.YAMLError) as e:
        log.warning("skipping the CDI spec %s: %s", path, " ".join(str(e).split()))
        return None


def spec_names(dirs: Iterable[Path]) -> frozenset[str]:
    """The device names NVIDIA's CDI specs in `dirs` give kind nvidia.com/gpu (an index,
    a UUID, `all`); empty when the toolkit wrote none."""
    names: set[str] = set()
    for d in dirs:
        try:
            files = sorted(p for p in Path(d).iterdir() if p.suffix in _SUFFIXES)
        except OSError:
            continue
        for path in files:
            doc = _read(path)
            if not isinstance(doc, dict) or doc.get("kind") != KIND:
                continue
            for dev in doc.get("devices") or []:
                if isinstance(dev, dict) and isinstance(dev.get("name"), str):
                    names.add(dev["name"])
    return frozenset(names)


def cdi_devices(names: frozenset[str], gpus: Sequence[tuple[int, str]]) -> list[str]:
    """NVIDIA's CDI device IDs for `gpus` ((index, uuid) each), given the names its specs
    have: the UUID where a spec names it (it survives a renumbering), else the index
    (`nvidia-ctk cdi generate`'s default strategy; `gpu<index>` in its first releases); a
    GPU that no spec names gets none (the toolkit has not seen it)."""
    out: list[str] = []
    for index, uuid in gpus:
        name = next((n for n in (uuid, str(index), f"gpu{index}") if n in names), "")
        if name and f"{KIND}={name}" not in out:
            out.append(f"{KIND}={name}")
    return out
