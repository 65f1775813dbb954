# SPDX-License-Identifier: Apache-2.0
"""simgpu honours CUDA_VISIBLE_DEVICES the way the real driver does (NVML ignores it)."""
from __future__ import annotations

import json

import pytest
from support.paths import TEST_BIN
from support.process import run

GiB = 1 << 30
PROBE = str(TEST_BIN / "vgpu_probe")


def totals(env: dict[str, str]) -> list[int]:
    count = [json.loads(x) for x in run([PROBE, "count"], env=env).stdout.splitlines()][-1]["count"]
    out = []
    for dev in range(count):
        lines = run([PROBE, "--device", str(dev), "info"], env=env).stdout.splitlines()
        out.append(json.loads(lines[-1])["total"])
    return out


def uuids(env: dict[str, str]) -> list[str]:
    info = json.loads(run([str(TEST_BIN / "nvml_client"), "info"], env=env).stdout)
    return [d["uuid"] for d in info["devices"]]


@pytest.mark.parametrize("visible,expected", [
    (None, [1, 2, 3]),
    ("2,0", [3, 1]),
    ("1", [2]),
    ("1,7,0", [2]),      # parsing stops at the first entry that names no device
    ("0,0,1", [1]),      # ... or one already listed
], ids=["unset", "reordered", "one", "stops-at-unknown", "stops-at-duplicate"])
def test_visible_devices_by_index(visible, expected, simgpu_env):
    simgpu_env["SIMGPU_DEVICES"] = "1Gi,2Gi,3Gi"
    if visible is not None:
        simgpu_env["CUDA_VISIBLE_DEVICES"] = visible
    assert totals(simgpu_env) == [n * GiB for n in expected]


def test_visible_devices_by_uuid_and_nvml_sees_all(simgpu_env):
    simgpu_env["SIMGPU_DEVICES"] = "1Gi,2Gi,3Gi"
    ids = uuids(simgpu_env)
    simgpu_env["CUDA_VISIBLE_DEVICES"] = f"{ids[2]},{ids[1][:12]}"
    assert totals(simgpu_env) == [3 * GiB, 2 * GiB]
    assert len(uuids(simgpu_env)) == 3


def test_nothing_visible_is_no_device(simgpu_env):
    simgpu_env["CUDA_VISIBLE_DEVICES"] = ""
    p = run([PROBE, "info"], env=simgpu_env, check=False)
    assert p.returncode == 3
    assert json.loads(p.stdout.splitlines()[0])["result"] == "CUDA_ERROR_NO_DEVICE"
