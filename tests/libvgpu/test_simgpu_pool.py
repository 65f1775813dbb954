# SPDX-License-Identifier: Apache-2.0
"""simgpu's memory pool attributes (cuMemPoolSetAttribute / cuMemPoolGetAttribute), which
a cudaMallocAsync user sets through the runtime (cudaMemPoolSetAttribute) to raise the
release threshold: kept and answered, with the memory in use counted per pool and,
since simgpu's pools cache nothing, reserved memory equal to it (docs/simgpu.md)."""
from __future__ import annotations

import json
import sys
import textwrap

from support.process import run

MiB = 1 << 20

SCRIPT = textwrap.dedent(r"""
    import ctypes, json
    cu = ctypes.CDLL("libcuda.so.1")
    u64, c_int, vp = ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p
    MiB = 1 << 20
    THRESHOLD, RES_CUR, RES_HIGH, USED_CUR, USED_HIGH = 4, 5, 6, 7, 8
    out = {}
    def ok(rc, what):
        if rc != 0:
            raise SystemExit(f"{what}: {rc}")
    def get(pool, attr):
        v = u64(0)
        ok(cu.cuMemPoolGetAttribute(pool, attr, ctypes.byref(v)), f"get {attr}")
        return v.value
    def amounts(pool):
        return [get(pool, a) for a in (RES_CUR, RES_HIGH, USED_CUR, USED_HIGH)]

    ok(cu.cuInit(0), "cuInit")
    dev, ctx, pool = c_int(), vp(), vp()
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    ok(cu.cuCtxSetCurrent(ctx), "current")
    ok(cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev), "default pool")
    out["threshold_default"] = get(pool, THRESHOLD)
    ok(cu.cuMemPoolSetAttribute(pool, THRESHOLD, ctypes.byref(u64(2**64 - 1))), "set threshold")
    out["threshold"] = get(pool, THRESHOLD)
    reuse = c_int(-1)
    ok(cu.cuMemPoolGetAttribute(pool, 2, ctypes.byref(reuse)), "get reuse")
    out["reuse_default"] = reuse.value
    ok(cu.cuMemPoolSetAttribute(pool, 2, ctypes.byref(c_int(0))), "set reuse")
    ok(cu.cuMemPoolGetAttribute(pool, 2, ctypes.byref(reuse)), "get reuse")
    out["reuse"] = reuse.value

    ptrs = [ctypes.c_uint64() for _ in range(3)]
    for p in ptrs:
        ok(cu.cuMemAllocAsync(ctypes.byref(p), 4 * MiB, None), "alloc")
    out["three"] = amounts(pool)
    ok(cu.cuMemFreeAsync(ptrs[0], None), "free")
    out["two"] = amounts(pool)
    for p in ptrs[1:]:
        ok(cu.cuMemFreeAsync(p, None), "free")
    ok(cu.cuStreamSynchronize(None), "sync")
    out["none"] = amounts(pool)
    zero = u64(0)
    ok(cu.cuMemPoolSetAttribute(pool, USED_HIGH, ctypes.byref(zero)), "reset used high")
    ok(cu.cuMemPoolSetAttribute(pool, RES_HIGH, ctypes.byref(zero)), "reset reserved high")
    out["reset"] = amounts(pool)
    out["refused"] = [
        cu.cuMemPoolSetAttribute(pool, USED_HIGH, ctypes.byref(u64(1))),  # only to zero
        cu.cuMemPoolSetAttribute(pool, USED_CUR, ctypes.byref(zero)),     # read-only
        cu.cuMemPoolGetAttribute(pool, 99, ctypes.byref(zero)),           # no such attribute
        cu.cuMemPoolGetAttribute(None, THRESHOLD, ctypes.byref(zero)),
    ]

    # A created pool counts its own; destroyed with an allocation outstanding, that
    # allocation stays valid and frees normally.
    class Props(ctypes.Structure):
        _fields_ = [("allocType", c_int), ("handleTypes", c_int), ("locType", c_int),
                    ("locId", c_int), ("win", vp), ("maxSize", ctypes.c_size_t),
                    ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]
    props = Props(allocType=1, locType=1, locId=0)
    mine, p = vp(), ctypes.c_uint64()
    ok(cu.cuMemPoolCreate(ctypes.byref(mine), ctypes.byref(props)), "create")
    ok(cu.cuMemAllocFromPoolAsync(ctypes.byref(p), 2 * MiB, mine, None), "alloc from pool")
    out["mine"] = get(mine, USED_CUR)
    out["default_after_mine"] = get(pool, USED_CUR)
    ok(cu.cuMemPoolDestroy(mine), "destroy")
    ok(cu.cuMemsetD8_v2(p, 7, 2 * MiB), "memset after destroy")
    out["free_after_destroy"] = cu.cuMemFreeAsync(p, None)
    print(json.dumps(out))
""")


def test_pool_attributes_are_kept_and_amounts_counted(simgpu_env):
    out = json.loads(run([sys.executable, "-c", SCRIPT], env=simgpu_env).stdout)
    assert out["threshold_default"] == 0 and out["threshold"] == 2**64 - 1
    assert out["reuse_default"] == 1 and out["reuse"] == 0
    # [reserved, reserved high, used, used high]: nothing cached, so reserved == used
    assert out["three"] == [12 * MiB, 12 * MiB, 12 * MiB, 12 * MiB]
    assert out["two"] == [8 * MiB, 12 * MiB, 8 * MiB, 12 * MiB]
    assert out["none"] == [0, 12 * MiB, 0, 12 * MiB]
    assert out["reset"] == [0, 0, 0, 0]
    assert out["refused"] == [1, 1, 1, 1]  # CUDA_ERROR_INVALID_VALUE
    assert out["mine"] == 2 * MiB and out["default_after_mine"] == 0
    assert out["free_after_destroy"] == 0
