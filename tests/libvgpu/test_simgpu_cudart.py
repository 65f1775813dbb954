# SPDX-License-Identifier: Apache-2.0
"""What NVIDIA's CUDA runtime (libcudart, from the PyPI wheels) asks of simgpu, seen
through SIMGPU_TRACE=1, and how far it gets (docs/simgpu.md, "NVIDIA's CUDA runtime").

The runtime resolves every driver entry point it uses through cuGetProcAddress, asks
for the driver's private export tables, and gives up when they are missing: one of them
is a test of the driver's authenticity that simgpu cannot pass. These tests pin what
was observed, so a change on either side shows; the runtime API tests that need a
driver the runtime accepts are test_cudart.py's (run on a real GPU by tests/gpu/run.sh).
"""
from __future__ import annotations

import json
import re
import sys
import textwrap
import time

import pytest
from support.cudart import runtime_libs
from support.paths import SIMGPU_DIR
from support.process import run

RUNTIMES = runtime_libs()

# The runtime's first tables: the one it does without (asked again later), and the two
# it needs before it asks the driver anything else (observed with 12.9.79 and 13.0.96).
OPTIONAL_TABLE = "f8cff95121468b4eb9e2fb469e7c0dd9"
FIRST_NEEDED_TABLE = "6bd5fb6c5bf4e74a8987d93912fd9df9"

INIT = textwrap.dedent(r"""
    import ctypes, json, sys
    rt = ctypes.CDLL(sys.argv[1])
    ver, n = ctypes.c_int(-1), ctypes.c_int(-1)
    out = {"driver_version_rc": rt.cudaDriverGetVersion(ctypes.byref(ver))}
    out["driver_version"] = ver.value
    out["count_rc"] = rt.cudaGetDeviceCount(ctypes.byref(n))
    print(json.dumps(out))
""")

TRACE_RE = re.compile(r"^simgpu-trace: (cuGetProcAddress|cuGetExportTable) (.*) -> (.*)$")


@pytest.fixture(params=sorted(RUNTIMES), ids=str)
def cudart(request):
    return RUNTIMES[request.param]


def traced_init(env, cudart):
    env["SIMGPU_TRACE"] = "1"
    p = run([sys.executable, "-c", INIT, str(cudart)], env=env)
    procs, tables = [], []
    for line in p.stderr.splitlines():
        m = TRACE_RE.match(line)
        if m:
            (procs if m.group(1) == "cuGetProcAddress" else tables).append(
                (m.group(2), m.group(3)))
    return json.loads(p.stdout), procs, tables


@pytest.mark.skipif(not RUNTIMES, reason="no CUDA runtime wheel installed (the test extra)")
def test_runtime_resolves_every_entry_point_then_stops_at_the_export_tables(simgpu_env, cudart):
    out, procs, tables = traced_init(simgpu_env, cudart)
    assert out["driver_version_rc"] == 0 and out["driver_version"] == 13000
    # Every name and version the runtime asks for is in simgpu's table (hundreds).
    assert len(procs) > 300
    assert [p for p in procs if p[1] != "found"] == []
    names = {p[0].split()[0] for p in procs}
    assert {"cuInit", "cuGetExportTable", "cuModuleGetLoadingMode", "cuMemGetInfo",
            "cuMemAllocAsync", "cuMemPoolSetAttribute", "cuLaunchKernel",
            "cuDevicePrimaryCtxRetain", "cuLibraryLoadData"} <= names
    # ... and without the export tables it does not start: cudaErrorNotSupported.
    assert tables == [(OPTIONAL_TABLE, "not supported"), (FIRST_NEEDED_TABLE, "not supported")]
    assert out["count_rc"] == 801


# What tools/observe_export_tables.py replies (its docstring): enough for the runtime to
# reach its driver authenticity test, table d4082055... (the 7th asked, T = 6).
OBSERVE = ["--ret", "1:2:0", "--ret", "2:2:0", "--out", "2:2:0:1023", "--ret", "2:6:0",
           "--out", "2:6:0:1023", "--ret", "2:5:0", "--ret", "5:3:0", "--ret", "6:1:0"]
CALL_RE = re.compile(r"^observe: call table 6 word 1 \((\w+) (\w+) (\w+) ")


@pytest.mark.skipif(not RUNTIMES, reason="no CUDA runtime wheel installed (the test extra)")
def test_runtime_refuses_a_driver_that_fails_its_authenticity_test(simgpu_env, cudart):
    """Why simgpu answers no export table (docs/simgpu.md): table d4082055..., word 1, is
    called with (the runtime's version + 0, 1, 2; time(NULL); a 16-byte buffer), and
    with success but bytes the runtime did not expect it ends its start with
    cudaErrorSoftwareValidityNotEstablished (103)."""
    tool = str(SIMGPU_DIR.parents[1] / "tools" / "observe_export_tables.py")
    before = int(time.time())
    p = run([sys.executable, tool, *OBSERVE, "--", sys.executable, "-c", INIT, str(cudart)],
            env=simgpu_env, timeout=120)
    after = int(time.time())
    tables = [ln.split()[-1] for ln in p.stderr.splitlines() if ln.startswith("observe: table ")]
    assert tables[6] == "d4082055bde6704b8d34ba123c66e1f2"
    calls = [m.groups() for m in map(CALL_RE.match, p.stderr.splitlines()) if m]
    version = int(calls[0][0], 16)
    assert [int(c[0], 16) - version for c in calls] == [0, 1, 2]
    assert version in (12090, 13000)  # CUDART_VERSION of the wheel
    assert all(before <= int(c[1], 16) <= after for c in calls)
    bufs = [int(c[2], 16) for c in calls]
    assert [b - bufs[0] for b in bufs] == [0, 16, 32]
    assert json.loads(p.stdout)["count_rc"] == 103


def test_trace_is_off_by_default(simgpu_env):
    p = run([str(SIMGPU_DIR.parent / "tests" / "vgpu_probe"), "info"], env=simgpu_env)
    assert "simgpu-trace" not in p.stderr


LOADING_MODE = textwrap.dedent(r"""
    import ctypes, json, sys
    cu = ctypes.CDLL("libcuda.so.1")
    mode = ctypes.c_int(-1)
    before = cu.cuModuleGetLoadingMode(ctypes.byref(mode))
    init = cu.cuInit(0)
    rc = cu.cuModuleGetLoadingMode(ctypes.byref(mode))
    null = cu.cuModuleGetLoadingMode(None)
    print(json.dumps([before, init, rc, mode.value, null]))
""")


@pytest.mark.parametrize("setting, mode", [(None, 2), ("LAZY", 2), ("EAGER", 1)],
                         ids=["default-lazy", "lazy", "eager"])
def test_module_loading_mode(simgpu_env, setting, mode):
    """cuModuleGetLoadingMode, which the runtime needs at initialisation: CUDA_MODULE_LOADING
    EAGER gives CU_MODULE_EAGER_LOADING (1), else CU_MODULE_LAZY_LOADING (2)."""
    if setting:
        simgpu_env["CUDA_MODULE_LOADING"] = setting
    p = run([sys.executable, "-c", LOADING_MODE], env=simgpu_env)
    # CUDA_ERROR_NOT_INITIALIZED before cuInit; CUDA_ERROR_INVALID_VALUE for NULL.
    assert json.loads(p.stdout) == [3, 0, 0, mode, 1]
