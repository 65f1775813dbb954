# SPDX-License-Identifier: Apache-2.0
"""The plugin's checkpoint: the claims it prepared, so a restarted plugin answers a
prepared claim the same way and knows which vgpud claim slices are its own.

One JSON file in the plugin's dir, replaced atomically (a temporary file, fsync, rename):
a crash leaves the old checkpoint or the new one. Layout:

    {"version": 1, "claims": {"<claim uid>": {"namespace", "name", "owner", "slice_id",
      "cdi_device_ids": [...], "devices": [{"request", "pool", "device"}],
      "vgpus": [{"memory", "compute", "gpu_uuid"}]}}}
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arbiter.files.atomic import write_whole
from vgpu_k8s.dra.claims import AnsweredDevice, ClaimRef
from vgpu_k8s.dra.vgpud import VGpuAsk

__all__ = ["VERSION", "Entry", "load", "save"]

VERSION = 1


@dataclass(frozen=True)
class Entry:
    """One prepared claim."""

    claim: ClaimRef
    owner: str
    slice_id: str
    cdi_device_ids: tuple[str, ...]
    devices: tuple[AnsweredDevice, ...]
    vgpus: tuple[VGpuAsk, ...]

    def to_json(self) -> dict[str, Any]:
        """The entry as the file holds it."""
        return {"namespace": self.claim.namespace, "name": self.claim.name,
                "owner": self.owner, "slice_id": self.slice_id,
                "cdi_device_ids": list(self.cdi_device_ids),
                "devices": [{"request": d.request, "pool": d.pool, "device": d.device}
                            for d in self.devices],
                "vgpus": [{"memory": v.memory, "compute": v.compute, "gpu_uuid": v.gpu_uuid}
                          for v in self.vgpus]}

    @classmethod
    def from_json(cls, uid: str, doc: dict[str, Any]) -> Entry:
        """An entry as the file holds it (KeyError/TypeError/ValueError when it is not one)."""
        return cls(claim=ClaimRef(str(doc["namespace"]), str(doc["name"]), uid),
                   owner=str(doc["owner"]), slice_id=str(doc["slice_id"]),
                   cdi_device_ids=tuple(str(i) for i in doc["cdi_device_ids"]),
                   devices=tuple(AnsweredDevice(str(d["request"]), str(d["pool"]),
                                                str(d["device"])) for d in doc["devices"]),
                   vgpus=tuple(VGpuAsk(int(v["memory"]), int(v["compute"]),
                                       str(v["gpu_uuid"])) for v in doc["vgpus"]))


def load(path: Path) -> dict[str, Entry]:
    """The checkpoint's entries by claim UID; {} when there is no file. ValueError names the
    file when it is not a checkpoint this plugin can read (the plugin then refuses to start:
    guessing would release slices that claims still use)."""
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(f"failed to read the checkpoint {path}: {e}") from e
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ValueError(f"failed to read the checkpoint {path}: not a version {VERSION} "
                         "checkpoint")
    try:
        return {uid: Entry.from_json(uid, e) for uid, e in doc["claims"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"failed to read the checkpoint {path}: bad entry ({e!r})") from e


def save(path: Path, entries: dict[str, Entry]) -> None:
    """Replace the checkpoint with `entries`, atomically."""
    data = json.dumps({"version": VERSION,
                       "claims": {uid: e.to_json() for uid, e in sorted(entries.items())}},
                      separators=(",", ":")).encode()   # no indent: the C encoder
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, data, 0o600, durable=True)
