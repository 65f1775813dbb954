# SPDX-License-Identifier: Apache-2.0
"""simgpu's memory pool attributes (cuMemPoolSetAttribute / cuMemPoolGetAttribute), which
a cudaMallocAsync user sets through the runtime (cudaMemPoolSetAttribute) to raise the
release threshold: kept and answered, with the memory in use counted per pool; and the
pools keep freed memory reserved up to their release threshold, as the driver's do
(docs/simgpu.md)."""
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
    # [reserved, reserved high, used, used high]: with the threshold at the maximum the
    # pool keeps what was freed reserved, through the sync too
    assert out["three"] == [12 * MiB, 12 * MiB, 12 * MiB, 12 * MiB]
    assert out["two"] == [12 * MiB, 12 * MiB, 8 * MiB, 12 * MiB]
    assert out["none"] == [12 * MiB, 12 * MiB, 0, 12 * MiB]
    assert out["reset"] == [12 * MiB, 0, 0, 0]
    assert out["refused"] == [1, 1, 1, 1]  # CUDA_ERROR_INVALID_VALUE
    assert out["mine"] == 2 * MiB and out["default_after_mine"] == 0
    assert out["free_after_destroy"] == 0


CACHING = textwrap.dedent(r"""
    import ctypes, json
    cu = ctypes.CDLL("libcuda.so.1")
    u64, c_int, vp, size_t = ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
    MiB = 1 << 20
    THRESHOLD, RES_CUR, USED_CUR = 4, 5, 7
    def ok(rc, what):
        if rc != 0:
            raise SystemExit(f"{what}: {rc}")
    def get(pool, attr):
        v = u64(0)
        ok(cu.cuMemPoolGetAttribute(pool, attr, ctypes.byref(v)), f"get {attr}")
        return v.value
    def set_threshold(pool, v):
        ok(cu.cuMemPoolSetAttribute(pool, THRESHOLD, ctypes.byref(u64(v))), "threshold")
    def used():
        free, total = size_t(), size_t()
        ok(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "info")
        return total.value - free.value
    def alloc(n, pool=None):
        p = u64()
        if pool is None:
            ok(cu.cuMemAllocAsync(ctypes.byref(p), n, None), "alloc")
        else:
            ok(cu.cuMemAllocFromPoolAsync(ctypes.byref(p), n, pool, None), "alloc pool")
        return p
    def sync():
        ok(cu.cuStreamSynchronize(None), "sync")

    ok(cu.cuInit(0), "cuInit")
    dev, ctx, pool = c_int(), vp(), vp()
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    ok(cu.cuCtxSetCurrent(ctx), "current")
    ok(cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev), "default pool")
    base = used()
    out = {}
    def note(key, p):
        out[key] = [(used() - base) // MiB, get(p, RES_CUR) // MiB, get(p, USED_CUR) // MiB]

    set_threshold(pool, 2**64 - 1)
    a = alloc(64 * MiB)
    note("allocated", pool)
    ok(cu.cuMemFreeAsync(a, None), "free")
    note("freed", pool)
    ok(cu.cuMemPoolTrimTo(pool, size_t(0)), "trim pending")
    note("trim_pending", pool)
    sync()
    note("synced", pool)
    b = alloc(32 * MiB)
    note("reused", pool)
    ok(cu.cuMemFreeAsync(b, None), "free")
    sync()
    ok(cu.cuMemPoolTrimTo(pool, size_t(16 * MiB)), "trim to 16")
    note("trim16", pool)
    ok(cu.cuMemPoolTrimTo(pool, size_t(0)), "trim to 0")
    note("trim0", pool)

    set_threshold(pool, 0)
    ok(cu.cuMemFreeAsync(alloc(64 * MiB), None), "free")
    note("t0_freed", pool)
    sync()
    note("t0_synced", pool)

    set_threshold(pool, 32 * MiB)
    ok(cu.cuMemFreeAsync(alloc(64 * MiB), None), "free")
    ok(cu.cuCtxSynchronize(), "ctx sync")
    note("t32_synced", pool)
    ok(cu.cuMemPoolTrimTo(pool, size_t(0)), "trim")

    class Props(ctypes.Structure):
        _fields_ = [("allocType", c_int), ("handleTypes", c_int), ("locType", c_int),
                    ("locId", c_int), ("win", vp), ("maxSize", ctypes.c_size_t),
                    ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]
    mine = vp()
    ok(cu.cuMemPoolCreate(ctypes.byref(mine), ctypes.byref(Props(allocType=1, locType=1))),
       "create")
    set_threshold(mine, 2**64 - 1)
    ok(cu.cuMemFreeAsync(alloc(8 * MiB, mine), None), "free")
    sync()
    note("mine_cached", mine)
    def current():
        p = vp()
        ok(cu.cuDeviceGetMemPool(ctypes.byref(p), dev), "get current")
        return p.value
    out["current_is_default"] = current() == pool.value
    ok(cu.cuDeviceSetMemPool(dev, mine), "set current")
    out["current_is_mine"] = current() == mine.value
    c = alloc(16 * MiB)  # cuMemAllocAsync takes from the current pool
    note("mine_current", mine)
    ok(cu.cuMemFreeAsync(c, None), "free")
    ok(cu.cuMemPoolDestroy(mine), "destroy")
    out["mine_destroyed"] = (used() - base) // MiB
    out["current_after_destroy"] = current() == pool.value
    print(json.dumps(out))
""")


def test_pools_keep_freed_memory_up_to_the_release_threshold(simgpu_env):
    out = json.loads(run([sys.executable, "-c", CACHING], env=simgpu_env).stdout)
    # [device used, pool reserved, pool in use], MiB
    assert out["allocated"] == [64, 64, 64]
    assert out["freed"] == [64, 64, 0]         # kept by the pool: the device still uses it
    assert out["trim_pending"] == [64, 64, 0]  # a free no sync observed is outstanding
    assert out["synced"] == [64, 64, 0]        # threshold at the maximum: nothing released
    assert out["reused"] == [64, 64, 32]       # taken from the pool, not from the device
    assert out["trim16"] == [16, 16, 0]
    assert out["trim0"] == [0, 0, 0]
    assert out["t0_freed"] == [64, 64, 0]      # the default threshold 0 releases at a sync
    assert out["t0_synced"] == [0, 0, 0]
    assert out["t32_synced"] == [32, 32, 0]    # down to the threshold
    assert out["mine_cached"] == [8, 8, 0]
    assert out["current_is_default"] and out["current_is_mine"]
    assert out["mine_current"] == [16, 16, 16]  # 8 cached reused, 8 more from the device
    assert out["mine_destroyed"] == 0           # a destroy gives back what the pool kept
    assert out["current_after_destroy"]
