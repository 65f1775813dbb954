# SPDX-License-Identifier: Apache-2.0
"""A third-party CUDA client, NVIDIA's cuda-bindings, drives simgpu's libcuda.so.1.

How cuda-bindings (13.x) finds and uses the driver:
  * `cuda.bindings.driver` loads libcuda through cuda-pathfinder:
    load_nvidia_dynamic_lib("cuda"). For driver libraries pathfinder skips
    its toolkit search (wheels, conda, CUDA_PATH) and uses only
      1. a libcuda.so.1 already loaded in the process, else
      2. dlopen("libcuda.so.1"): the system loader, so LD_LIBRARY_PATH works.
    There is no environment variable naming the driver's path; to use a
    particular file, put its directory first in LD_LIBRARY_PATH (done here)
    or load it before the first driver call (ctypes.CDLL(path, RTLD_GLOBAL)).
  * It then dlsym()s cuGetProcAddress_v2 and resolves every entry point
    through it, passing the base name, the CUDA version that introduced the
    signature it was generated for (e.g. "cuMemAlloc", 3020) and
    symbolStatus=NULL. CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1 makes it
    ask for the per-thread-default-stream flavours.
So this exercises simgpu's cuGetProcAddress_v2 table for ~500 names, not
only direct symbols.
"""
from __future__ import annotations

import json
import sys
import textwrap

import pytest
from support.paths import SIMGPU_DIR
from support.process import run

pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings not installed")

GiB = 1 << 30

SCRIPT = textwrap.dedent(r"""
    import json, sys
    from cuda.bindings import driver as cu

    OK = cu.CUresult.CUDA_SUCCESS
    out = {}

    def check(res, what):
        err = res[0]
        if err != OK:
            print(json.dumps({"failed": what, "error": int(err)}))
            sys.exit(1)
        return res[1:] if len(res) > 2 else (res[1] if len(res) == 2 else None)

    check(cu.cuInit(0), "cuInit")
    out["driver_version"] = check(cu.cuDriverGetVersion(), "cuDriverGetVersion")
    out["count"] = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
    out["names"], out["totals"] = [], []
    for i in range(out["count"]):
        dev = check(cu.cuDeviceGet(i), "cuDeviceGet")
        name = check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
        out["names"].append(name.split(b"\0")[0].decode())
        out["totals"].append(check(cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem"))

    dev0 = check(cu.cuDeviceGet(0), "cuDeviceGet")
    ctx = check(cu.cuCtxCreate(None, 0, dev0), "cuCtxCreate")
    out["ctx_device"] = int(check(cu.cuCtxGetDevice(), "cuCtxGetDevice"))

    free0, total0 = check(cu.cuMemGetInfo(), "cuMemGetInfo")
    n = 1 << 20
    dptr = check(cu.cuMemAlloc(n), "cuMemAlloc")
    free1, total1 = check(cu.cuMemGetInfo(), "cuMemGetInfo")
    out["mem_total"] = total0
    out["alloc_used"] = free0 - free1

    src = bytes(range(256)) * (n // 256)
    dst = bytearray(n)
    check(cu.cuMemcpyHtoD(dptr, src, n), "cuMemcpyHtoD")
    check(cu.cuMemcpyDtoH(dst, dptr, n), "cuMemcpyDtoH")
    out["roundtrip_ok"] = bytes(dst) == src

    check(cu.cuMemFree(dptr), "cuMemFree")
    free2, _ = check(cu.cuMemGetInfo(), "cuMemGetInfo")
    out["freed_back"] = free2 == free0

    err, _ = cu.cuMemAlloc(total0 + (1 << 30))
    out["oom_error"] = cu.CUresult(err).name

    # An entry point simgpu does not implement resolves to its stub.
    err, = cu.cuCtxResetPersistingL2Cache()
    out["unimplemented_error"] = cu.CUresult(err).name

    check(cu.cuCtxDestroy(ctx), "cuCtxDestroy")
    with open("/proc/self/maps") as f:
        out["libcuda"] = sorted({l.split()[-1] for l in f if "libcuda.so" in l})
    print(json.dumps(out))
""")


@pytest.fixture(params=["default-stream", "per-thread-stream"])
def result(request, simgpu_env):
    env = dict(simgpu_env, SIMGPU_DEVICES="2Gi,4Gi",
               CUDA_PYTHON_DISABLE_MAJOR_VERSION_WARNING="1")
    if request.param == "per-thread-stream":
        env["CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"] = "1"
    p = run([sys.executable, "-c", SCRIPT], env, check=False)
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_loads_simgpu_not_a_real_driver(result):
    assert result["libcuda"] == [str(SIMGPU_DIR / "libcuda.so.1")]


def test_devices(result):
    assert result["driver_version"] >= 12000
    assert result["count"] == 2
    assert all(result["names"]), result["names"]
    assert result["totals"] == [2 * GiB, 4 * GiB]


def test_context_and_memory(result):
    assert result["ctx_device"] == 0
    assert result["mem_total"] == 2 * GiB
    assert result["alloc_used"] >= 1 << 20
    assert result["roundtrip_ok"]
    assert result["freed_back"]


def test_out_of_memory(result):
    assert result["oom_error"] == "CUDA_ERROR_OUT_OF_MEMORY"


def test_unimplemented_entry_point_reports_not_supported(result):
    assert result["unimplemented_error"] == "CUDA_ERROR_NOT_SUPPORTED"
