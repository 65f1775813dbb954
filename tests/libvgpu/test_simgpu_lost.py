# SPDX-License-Identifier: Apache-2.0
"""simgpu can lose a GPU at run time, as a board that falls off the bus: `simgpu_ctl lose I`
marks device I lost in the state file and every process's NVML calls on it answer
NVML_ERROR_GPU_IS_LOST (the handle lookup included) until `simgpu_ctl restore I`."""
from __future__ import annotations

import json
import sys

import pytest
from support.paths import TEST_BIN
from support.process import run

CTL = str(TEST_BIN / "simgpu_ctl")

# Runs in the child (pynvml, like vgpud's inventory): takes every handle, then loses and
# restores GPU 1 with simgpu_ctl (argv[1]) and asks again each time; prints one JSON object.
PROBE = r'''
import json, subprocess, sys
import pynvml as N

def ask(handles):
    out = []
    for i, h in enumerate(handles):
        row = {}
        for what, call in (("handle", lambda: N.nvmlDeviceGetHandleByIndex(i)),
                           ("memory", lambda: N.nvmlDeviceGetMemoryInfo(h)),
                           ("uuid", lambda: N.nvmlDeviceGetUUID(h))):
            try:
                call()
                row[what] = "ok"
            except N.NVMLError as e:
                row[what] = e.value
        out.append(row)
    return out

N.nvmlInit()
handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
out = {"before": ask(handles)}
subprocess.run([sys.argv[1], "lose", "1"], check=True)
out["lost"] = ask(handles)
out["count_lost"] = N.nvmlDeviceGetCount()
subprocess.run([sys.argv[1], "restore", "1"], check=True)
out["restored"] = ask(handles)
print(json.dumps(out))
'''
LOST = 15  # NVML_ERROR_GPU_IS_LOST
OK = {"handle": "ok", "memory": "ok", "uuid": "ok"}


@pytest.fixture
def two_gpus(simgpu_env: dict[str, str]) -> dict[str, str]:
    simgpu_env["SIMGPU_DEVICES"] = "1Gi,3Gi"
    return simgpu_env


def test_lose_and_restore_a_gpu(two_gpus: dict[str, str]) -> None:
    out = json.loads(run([sys.executable, "-c", PROBE, CTL], two_gpus).stdout)
    assert out["before"] == [OK, OK]
    # Handles taken before the loss answer LOST too; a lost GPU is still counted.
    assert out["lost"] == [OK, {"handle": LOST, "memory": LOST, "uuid": LOST}]
    assert out["count_lost"] == 2
    assert out["restored"] == [OK, OK]


@pytest.mark.parametrize(("args", "rc", "line"), [
    (["lose"], 2, "usage: simgpu_ctl lose|restore INDEX"),
    (["drop", "0"], 2, "usage: simgpu_ctl lose|restore INDEX"),
    (["lose", "x"], 2, "usage: simgpu_ctl lose|restore INDEX"),
    (["lose", "2"], 1, "simgpu_ctl: lose 2: Invalid Argument"),
], ids=["no-index", "unknown-verb", "not-a-number", "no-such-device"])
def test_bad_use_is_one_line(two_gpus: dict[str, str], args, rc, line) -> None:
    p = run([CTL, *args], two_gpus, check=False)
    assert (p.returncode, p.stderr.splitlines()) == (rc, [line])
