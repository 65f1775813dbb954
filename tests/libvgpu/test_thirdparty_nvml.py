# SPDX-License-Identifier: Apache-2.0
"""The real nvidia-ml-py bindings (pynvml) against simgpu's libnvidia-ml.so.1.

pynvml dlopens "libnvidia-ml.so.1" by soname, so LD_LIBRARY_PATH=build/simgpu
(the simgpu_env fixture) is all it takes; each check runs in a fresh
interpreter because pynvml keeps the library loaded for the process's life.
"""
from __future__ import annotations

import ctypes
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.paths import SIMGPU_DIR, TEST_BIN
from support.process import run

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")

CUDA_CLIENT = TEST_BIN / "cuda_client"
GI, MI = 1 << 30, 1 << 20

# Runs in the child; prints one JSON object.
PROBE = r'''
import json, os, sys
import pynvml as N

out = {}
N.nvmlInit()
out["library"] = [l.split()[-1] for l in open("/proc/self/maps") if "libnvidia-ml" in l][:1]
out["driver_version"] = N.nvmlSystemGetDriverVersion()
out["cuda_driver_version"] = N.nvmlSystemGetCudaDriverVersion()
out["count"] = N.nvmlDeviceGetCount()
devs = []
for i in range(out["count"]):
    h = N.nvmlDeviceGetHandleByIndex(i)
    uuid = N.nvmlDeviceGetUUID(h)
    m1 = N.nvmlDeviceGetMemoryInfo(h)
    m2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    u = N.nvmlDeviceGetUtilizationRates(h)
    try:
        N.nvmlDeviceGetMemoryInfo(h, version=1)
        bad_version = None
    except N.NVMLError_ArgumentVersionMismatch as e:
        bad_version = str(e)
    try:
        N.nvmlDeviceGetFanSpeed(h)
        unimplemented = None
    except N.NVMLError_NotSupported as e:
        unimplemented = str(e)
    try:
        samples = [{"pid": x.pid, "sm": x.smUtil} for x in N.nvmlDeviceGetProcessUtilization(h, 0)]
    except N.NVMLError_NotFound:
        samples = "not found"  # the driver's answer when no kernel ran lately
    devs.append({
        "uuid": uuid,
        "name": N.nvmlDeviceGetName(h),
        "index_by_uuid": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(uuid)),
        "index_by_pci": N.nvmlDeviceGetIndex(
            N.nvmlDeviceGetHandleByPciBusId(N.nvmlDeviceGetPciInfo(h).busId)),
        "minor": N.nvmlDeviceGetMinorNumber(h),
        "memory": {"total": m1.total, "free": m1.free, "used": m1.used},
        "memory_v2": {"total": m2.total, "reserved": m2.reserved, "free": m2.free, "used": m2.used},
        "bad_version": bad_version,
        "utilization": {"gpu": u.gpu, "memory": u.memory},
        "compute_capability": list(N.nvmlDeviceGetCudaComputeCapability(h)),
        "processes": [{"pid": p.pid, "used": p.usedGpuMemory}
                      for p in N.nvmlDeviceGetComputeRunningProcesses(h)],
        "graphics_processes": len(N.nvmlDeviceGetGraphicsRunningProcesses(h)),
        "unimplemented": unimplemented,
        "process_utilization": samples,
    })
out["devices"] = devs
N.nvmlShutdown()
try:
    N.nvmlDeviceGetCount()
    out["after_shutdown"] = None
except N.NVMLError_Uninitialized as e:
    out["after_shutdown"] = str(e)
print(json.dumps(out))
'''


def probe(env: dict[str, str]) -> dict[str, Any]:
    return json.loads(run([sys.executable, "-c", PROBE], env).stdout)


def test_structs_match_the_bindings(simgpu_env: dict[str, str]) -> None:
    """vgpu_cuda.h's NVML structs have the layouts pynvml's ctypes declarations use."""
    layout = json.loads(run([str(TEST_BIN / "nvml_client"), "layout"], simgpu_env).stdout)
    assert layout.pop("nvmlMemory_v2") == pynvml.nvmlMemory_v2
    for name, c in layout.items():
        py = getattr(pynvml, name)
        assert c["size"] == ctypes.sizeof(py), name
        assert set(c["fields"]) == {f for f, _ in py._fields_}, name
        for field, (offset, size) in c["fields"].items():
            desc = getattr(py, field)
            assert (offset, size) == (desc.offset, desc.size), f"{name}.{field}"


def test_every_function_pynvml_looks_up_is_exported() -> None:
    """No NVML name a client can ask for is missing (the stubs answer NOT_SUPPORTED)."""
    names = set(re.findall(r'_nvmlGetFunctionPointer\(\s*"(nvml\w+)"',
                           Path(pynvml.__file__).read_text()))
    lib = ctypes.CDLL(str(SIMGPU_DIR / "libnvidia-ml.so.1"))
    assert len(names) > 100
    assert sorted(n for n in names if not hasattr(lib, n)) == []


@pytest.fixture
def two_gpus(simgpu_env: dict[str, str]) -> dict[str, str]:
    simgpu_env["SIMGPU_DEVICES"] = "1Gi,3Gi"
    return simgpu_env


def test_pynvml_reads_simulated_devices(two_gpus: dict[str, str]) -> None:
    out = probe(two_gpus)
    # The soname lookup found simgpu's library, not some other driver's.
    assert out["library"] == [str(SIMGPU_DIR / "libnvidia-ml.so.1")]
    assert isinstance(out["driver_version"], str)
    version = [int(x) for x in out["driver_version"].split(".")]  # what clients parse
    assert len(version) == 3 and version[0] >= 500
    assert out["cuda_driver_version"] == 13000
    assert out["count"] == 2
    for i, (d, total) in enumerate(zip(out["devices"], [1 * GI, 3 * GI], strict=True)):
        assert d["name"].startswith("NVIDIA ") and d["uuid"].startswith("GPU-")
        assert d["index_by_uuid"] == d["index_by_pci"] == d["minor"] == i
        assert d["memory"] == {"total": total, "free": total, "used": 0}
        assert d["memory_v2"] == {**d["memory"], "reserved": 0}
        assert d["bad_version"] == "Argument version mismatch"
        assert d["utilization"] == {"gpu": 0, "memory": 0}
        assert d["compute_capability"] == [9, 0]
        assert d["processes"] == [] and d["graphics_processes"] == 0
        assert d["unimplemented"] == "Not Supported"
        assert d["process_utilization"] == "not found"
    assert out["after_shutdown"] == "Uninitialized"


def cuda_client(env: dict[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    """A running build/tests/cuda_client, killed afterwards."""
    if not CUDA_CLIENT.exists():
        pytest.skip("build/tests/cuda_client (simgpu libcuda) not built yet")
    p = subprocess.Popen([str(CUDA_CLIENT), *args], env=env, text=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    yield p
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    p.communicate(timeout=10)


@pytest.fixture
def holder(two_gpus: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    yield from cuda_client(two_gpus, "hold", str(300 * MI))


@pytest.fixture
def exerciser(two_gpus: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    yield from cuda_client(two_gpus, "exercise")


def test_pynvml_sees_a_process_holding_memory(two_gpus: dict[str, str],
                                              holder: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 10
    while True:
        dev = probe(two_gpus)["devices"][0]
        procs = {p["pid"]: p["used"] for p in dev["processes"]}
        if holder.pid in procs or time.monotonic() > deadline:
            break
        assert holder.poll() is None, holder.communicate()
        time.sleep(0.05)
    assert procs.get(holder.pid, 0) >= 300 * MI, dev
    assert dev["memory"]["used"] == sum(procs.values())
    assert dev["memory"]["free"] == dev["memory"]["total"] - dev["memory"]["used"]
    assert dev["memory_v2"]["used"] == dev["memory"]["used"]


def test_pynvml_process_utilization_follows_kernels(two_gpus: dict[str, str],
                                                    exerciser: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 10
    while True:
        dev = probe(two_gpus)["devices"][0]
        samples = dev["process_utilization"]
        mine = [x for x in samples if x["pid"] == exerciser.pid] if samples != "not found" else []
        if (mine and mine[0]["sm"] > 0) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert mine and 0 < mine[0]["sm"] <= 100, dev
    assert 0 < dev["utilization"]["gpu"] <= 100
