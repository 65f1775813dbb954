# SPDX-License-Identifier: Apache-2.0
"""simgpu's cuGetProcAddress_v2: which exported entry point a (name, version, flags) gets.

build/tests/procaddr_client asks the simulated libcuda.so.1 and reports the
exported symbol at the returned address (dladdr + dlsym). The expectations
follow the real driver: the caller names the base entry point and the CUDA
version it was built for, and gets the newest variant not newer than that;
PER_THREAD_DEFAULT_STREAM (flags=2) picks that variant's _ptds/_ptsz flavour.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
from support.cuda_headers import cuda_include_dirs, find_cuda_include
from support.paths import ROOT, SIMGPU_DIR, TEST_BIN
from support.process import run

CLIENT = TEST_BIN / "procaddr_client"
LIBCUDA = SIMGPU_DIR / "libcuda.so.1"

SUCCESS, SYMBOL_NOT_FOUND, VERSION_NOT_SUFFICIENT = 0, 1, 2
CUDA_SUCCESS, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_SUPPORTED = 0, 500, 801
DEFAULT, LEGACY, PTDS = 0, 1, 2


def procaddr(env, symbol: str, version: int, flags: int, call: bool = False) -> dict:
    args = [str(CLIENT), symbol, str(version), str(flags)] + (["call"] if call else [])
    return json.loads(run(args, env).stdout)


# (id, base name, requested version, flags, expected exported symbol)
RESOLVES = [
    ("cuMemAlloc@3010-v1", "cuMemAlloc", 3010, DEFAULT, "cuMemAlloc"),
    ("cuMemAlloc@3020-v2", "cuMemAlloc", 3020, DEFAULT, "cuMemAlloc_v2"),
    ("cuMemAlloc@12000-v2", "cuMemAlloc", 12000, DEFAULT, "cuMemAlloc_v2"),
    ("cuMemAlloc@13000-v2", "cuMemAlloc", 13000, DEFAULT, "cuMemAlloc_v2"),
    ("cuCtxCreate@3020-v2", "cuCtxCreate", 3020, DEFAULT, "cuCtxCreate_v2"),
    ("cuCtxCreate@11040-v3", "cuCtxCreate", 11040, DEFAULT, "cuCtxCreate_v3"),
    ("cuCtxCreate@12040-still-v3", "cuCtxCreate", 12040, DEFAULT, "cuCtxCreate_v3"),
    ("cuCtxCreate@12050-v4", "cuCtxCreate", 12050, DEFAULT, "cuCtxCreate_v4"),
    ("cuLaunchKernel-default", "cuLaunchKernel", 12000, DEFAULT, "cuLaunchKernel"),
    ("cuLaunchKernel-legacy", "cuLaunchKernel", 12000, LEGACY, "cuLaunchKernel"),
    ("cuLaunchKernel-ptds-flag-ptsz", "cuLaunchKernel", 12000, PTDS, "cuLaunchKernel_ptsz"),
    ("cuMemcpyHtoD-default-v2", "cuMemcpyHtoD", 12000, DEFAULT, "cuMemcpyHtoD_v2"),
    ("cuMemcpyHtoD-ptds", "cuMemcpyHtoD", 12000, PTDS, "cuMemcpyHtoD_v2_ptds"),
    # cuda-bindings asks ("cuMemcpy", 4000, PTDS): the flavour of the 4.0 entry
    # point although the _ptds typedef says 7000.
    ("cuMemcpy@4000-ptds", "cuMemcpy", 4000, PTDS, "cuMemcpy_ptds"),
    ("cuStreamGetCaptureInfo@12030-ptds-v3", "cuStreamGetCaptureInfo", 12030, PTDS,
     "cuStreamGetCaptureInfo_v3_ptsz"),
    ("cuStreamGetCaptureInfo@11030-v2", "cuStreamGetCaptureInfo", 11030, DEFAULT,
     "cuStreamGetCaptureInfo_v2"),
    ("cuInit-ptds-flag-no-variant", "cuInit", 12000, PTDS, "cuInit"),
    ("cuGetProcAddress@11030-v1", "cuGetProcAddress", 11030, DEFAULT, "cuGetProcAddress"),
    ("cuGetProcAddress@12000-v2", "cuGetProcAddress", 12000, DEFAULT, "cuGetProcAddress_v2"),
    ("cuTexRefSetAddress2D@4010-v3", "cuTexRefSetAddress2D", 4010, DEFAULT,
     "cuTexRefSetAddress2D_v3"),
    # exceptions to the base/base_v2/... numbering (see tools/gen_cuda_procs.py)
    ("cuGraphInstantiate@11000-v2", "cuGraphInstantiate", 11000, DEFAULT, "cuGraphInstantiate_v2"),
    ("cuGraphInstantiate@12000-WithFlags", "cuGraphInstantiate", 12000, DEFAULT,
     "cuGraphInstantiateWithFlags"),
    ("cuCtxSynchronize@12080-v1", "cuCtxSynchronize", 12080, DEFAULT, "cuCtxSynchronize"),
    ("cuCtxSynchronize@13000-v2", "cuCtxSynchronize", 13000, DEFAULT, "cuCtxSynchronize_v2"),
]


@pytest.mark.parametrize("symbol,version,flags,expected",
                         [pytest.param(*r[1:], id=r[0]) for r in RESOLVES])
def test_resolves_to(simgpu_env, symbol, version, flags, expected):
    r = procaddr(simgpu_env, symbol, version, flags)
    assert (r["result"], r["status"], r["same_as"]) == (CUDA_SUCCESS, SUCCESS, expected), r


# (id, name, version, expected symbolStatus)
NOT_RESOLVED = [
    ("future-only-cuLogsRegisterCallback@12080", "cuLogsRegisterCallback", 12080,
     VERSION_NOT_SUFFICIENT),
    ("cuMemcpyBatchAsync@12000", "cuMemcpyBatchAsync", 12000, VERSION_NOT_SUFFICIENT),
    ("unknown-cuNoSuchThing", "cuNoSuchThing", 12000, SYMBOL_NOT_FOUND),
    # the caller passes base names; a versioned name is not one
    ("versioned-name-cuMemAlloc_v2", "cuMemAlloc_v2", 12000, SYMBOL_NOT_FOUND),
]


@pytest.mark.parametrize("symbol,version,status",
                         [pytest.param(*r[1:], id=r[0]) for r in NOT_RESOLVED])
def test_not_resolved(simgpu_env, symbol, version, status):
    r = procaddr(simgpu_env, symbol, version, DEFAULT)
    assert r["status"] == status, r
    assert r["result"] == CUDA_ERROR_NOT_FOUND, r
    assert r["pfn_set"] and r["same_as"] is None, "pfn must be set to NULL"


@pytest.mark.parametrize("flags,expected", [
    pytest.param(DEFAULT, "cuGraphicsMapResources", id="default"),
    pytest.param(PTDS, "cuGraphicsMapResources_ptsz", id="ptds"),
])
def test_unimplemented_entry_point_is_a_not_supported_stub(simgpu_env, flags, expected):
    r = procaddr(simgpu_env, "cuGraphicsMapResources", 12000, flags, call=True)
    assert r["same_as"] == expected, r
    assert r["call_result"] == CUDA_ERROR_NOT_SUPPORTED, r


def table_symbols() -> set[str]:
    text = (ROOT / "libvgpu/simgpu/cuda_procs.c").read_text()
    return set(re.findall(r'^\s*\{"cu\w+", \d+, SG_\w+, "(cu\w+)", cu\w+\},$', text, re.M))


def test_every_table_symbol_is_exported():
    """Third-party bindings dlsym/resolve every name; all of them must be there."""
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("nm (binutils) not installed")
    out = subprocess.run([nm, "-D", "--defined-only", str(LIBCUDA)], capture_output=True,
                         text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    wanted = table_symbols()
    assert len(wanted) > 600
    assert not sorted(wanted - exported)


# Needs libcuda.so.1 linked with -Wl,-Bsymbolic-functions (Makefile): without it the
# table's pointers, and simgpu's internal calls, bind to a preloaded definition.
def test_preloaded_definition_does_not_replace_simgpus_entry_point(simgpu_env, tmp_path):
    """Like a real driver, cuGetProcAddress returns libcuda's own function even
    when an LD_PRELOADed library (libvgpu.so) defines the same symbol;
    otherwise a hook that asks the driver for the "real" function gets itself."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / "pre.c"
    src.write_text("int cuGraphicsMapResources(void) { return 7; }\n")
    pre = tmp_path / "pre.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(pre), str(src)], check=True)
    env = dict(simgpu_env, LD_PRELOAD=str(pre))
    r = procaddr(env, "cuGraphicsMapResources", 12000, DEFAULT, call=True)
    assert r["call_result"] == CUDA_ERROR_NOT_SUPPORTED, (
        f"{r}: the table's pointer was interposed "
        "(link libcuda.so.1 with -Wl,-Bsymbolic-functions)")


def test_generated_files_are_current():
    """simgpu's entry-point table is what tools/gen_cuda_procs.py makes of CUDA 13.0's
    headers (the `test` extra's nvidia-cuda-runtime wheel, or CUDA_HOME's)."""
    include = find_cuda_include("cudaTypedefs.h")
    assert include is not None, f"no cudaTypedefs.h in {cuda_include_dirs()}"
    p = subprocess.run([sys.executable, str(ROOT / "tools/gen_cuda_procs.py"),
                        "--include", str(include), "--check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
