# SPDX-License-Identifier: Apache-2.0
"""NVIDIA's CDI specs as the toolkit writes them (oci_hook.nvidia): which device names they
give, and which of them vgpu adds beside its own for a slice's GPUs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from oci_hook import nvidia

UUID0 = "GPU-0000aaaa-0000-0000-0000-000000000000"
UUID1 = "GPU-1111bbbb-0000-0000-0000-000000000000"


def write(d: Path, name: str, text: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text)


def test_names_come_from_nvidia_s_yaml_and_json_specs_only(tmp_path):
    etc, run = tmp_path / "etc", tmp_path / "run"
    write(etc, "nvidia.yaml", "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
          f"  - name: '0'\n  - name: {UUID0}\n  - name: all\n")
    write(run, "nvidia-extra.json", json.dumps({"kind": "nvidia.com/gpu",
                                                "devices": [{"name": "1"}]}))
    write(run, "vgpu.io-vgpu_compute-30.json", json.dumps({"kind": "vgpu.io/vgpu",
                                                           "devices": [{"name": "9"}]}))
    write(run, "broken.yaml", "kind: [unclosed\n")
    write(run, "notes.txt", "kind: nvidia.com/gpu\n")
    assert nvidia.spec_names([etc, run, tmp_path / "missing"]) == {"0", UUID0, "all", "1"}


@pytest.mark.parametrize(("names", "gpus", "ids"), [
    ({"0", "1", UUID0, "all"}, [(0, UUID0)], [f"nvidia.com/gpu={UUID0}"]),
    ({"0", "1", "all"}, [(1, UUID1)], ["nvidia.com/gpu=1"]),
    ({"gpu0", "gpu1"}, [(1, UUID1)], ["nvidia.com/gpu=gpu1"]),
    ({"0"}, [(0, UUID0), (1, UUID1)], ["nvidia.com/gpu=0"]),
    (set(), [(0, UUID0)], []),
    ({UUID0}, [(0, UUID0), (0, UUID0)], [f"nvidia.com/gpu={UUID0}"]),
], ids=["uuid-first", "index", "old-gpu-index", "unknown-gpu-skipped", "no-toolkit", "once"])
def test_cdi_devices(names, gpus, ids):
    assert nvidia.cdi_devices(frozenset(names), gpus) == ids
