# SPDX-License-Identifier: Apache-2.0
"""libvgpu charges what stream-ordered memory pools keep reserved (docs/libvgpu.md, Memory).

A pool whose release threshold is raised keeps freed memory on the GPU; a slice must not
be able to free its whole limit into a pool and allocate the limit again. Driven through
a ctypes client of simgpu (whose pools keep freed memory as the driver's do) with
LD_PRELOAD=build/libvgpu.so; the memory the simulated GPU really holds is read by a
process without libvgpu.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from support.paths import LIBVGPU, TEST_BIN
from support.process import run

MiB = 1 << 20
LIMIT = 512 * MiB

CLIENT = textwrap.dedent(r"""
    import ctypes, json, os, subprocess, sys
    cu = ctypes.CDLL("libcuda.so.1")
    u64, c_int, vp, size_t = ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
    MiB = 1 << 20
    def ok(rc, what):
        if rc != 0:
            raise SystemExit(f"{what}: {rc}")
    ok(cu.cuInit(0), "cuInit")
    dev, ctx, pool = c_int(), vp(), vp()
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    ok(cu.cuCtxSetCurrent(ctx), "current")
    ok(cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev), "default pool")
    plain_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    default = pool

    class Props(ctypes.Structure):
        _fields_ = [("allocType", c_int), ("handleTypes", c_int), ("locType", c_int),
                    ("locId", c_int), ("win", vp), ("maxSize", size_t),
                    ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]
    asyncs, mems = [], []

    def step(op):
        global pool
        name, _, arg = op.partition(":")
        out = {"op": name}
        if name == "newpool":  # a pool of its own; "current": cuMemAllocAsync's too
            pool = vp()
            out["rc"] = cu.cuMemPoolCreate(ctypes.byref(pool),
                                           ctypes.byref(Props(allocType=1, locType=1)))
            if arg == "current" and out["rc"] == 0:
                out["rc"] = cu.cuDeviceSetMemPool(dev, pool)
        elif name == "destroy":
            out["rc"] = cu.cuMemPoolDestroy(pool)
            pool = default
        elif name == "frompool":
            p = u64()
            out["rc"] = cu.cuMemAllocFromPoolAsync(ctypes.byref(p), size_t(int(arg) * MiB), pool,
                                                   None)
            if out["rc"] == 0:
                asyncs.append(p)
        elif name == "threshold":
            v = 2**64 - 1 if arg == "max" else int(arg) * MiB
            out["rc"] = cu.cuMemPoolSetAttribute(pool, 4, ctypes.byref(u64(v)))
        elif name in ("async", "mem"):
            p = u64()
            if name == "async":
                out["rc"] = cu.cuMemAllocAsync(ctypes.byref(p), size_t(int(arg) * MiB), None)
            else:
                out["rc"] = cu.cuMemAlloc_v2(ctypes.byref(p), size_t(int(arg) * MiB))
            if out["rc"] == 0:
                (asyncs if name == "async" else mems).append(p)
        elif name == "freeasync":
            out["rc"] = cu.cuMemFreeAsync(asyncs.pop(), None)
        elif name == "freemem":
            out["rc"] = cu.cuMemFree_v2(mems.pop())
        elif name == "sync":
            out["rc"] = cu.cuStreamSynchronize(None)
        elif name == "trim":
            out["rc"] = cu.cuMemPoolTrimTo(pool, size_t(0))
        elif name == "info":  # the slice's view (hooked)
            free, total = size_t(), size_t()
            out["rc"] = cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
            out["free"] = free.value // MiB
        elif name == "reserved":  # the driver's own count
            v = u64()
            out["rc"] = cu.cuMemPoolGetAttribute(pool, 5, ctypes.byref(v))
            out["mib"] = v.value // MiB
        elif name == "physical":  # what the simulated GPU holds, seen without libvgpu
            p = subprocess.run([sys.argv[1], "info"], env=plain_env, capture_output=True,
                               text=True, check=True)
            info = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")][-1]
            out["mib"] = (info["total"] - info["free"]) // MiB
        elif name == "wait":  # two-process tests: one line from stdin
            sys.stdin.readline()
        else:
            raise SystemExit(f"unknown op {op}")
        print(json.dumps(out), flush=True)

    for op in sys.argv[2:]:
        if op == "--":
            break
        step(op)
    for line in sys.stdin:  # further ops, one per line, in a conversation
        step(line.strip())
""")


@pytest.fixture
def env(simgpu_env: dict[str, str]) -> dict[str, str]:
    e = dict(simgpu_env, LD_PRELOAD=str(LIBVGPU), VGPU_MEMORY_LIMIT="512Mi",
             VGPU_CONTEXT_RESERVE="0")
    return e


def client(env: dict[str, str], *ops: str) -> list[dict]:
    p = run([sys.executable, "-c", CLIENT, str(TEST_BIN / "vgpu_probe"), *ops], env=env,
            stdin=subprocess.DEVNULL)
    return [json.loads(line) for line in p.stdout.splitlines()]


def results(lines: list[dict]) -> list:
    """Each op's answer: its result code, the MiB it read, or the free MiB it was told."""
    return [x.get("mib", x.get("free", x.get("rc"))) if x["op"] in ("reserved", "physical", "info")
            else x.get("rc") for x in lines]


def test_memory_a_pool_keeps_is_not_allocated_twice(env):
    """The gap: free the limit into a pool that keeps it, allocate the limit again. It
    succeeds only once the pool has given its memory back; the GPU never holds more than
    the limit."""
    out = results(client(env, "threshold:max", "async:512", "freeasync", "sync",
                         "reserved", "info", "mem:512", "reserved", "physical"))
    assert out == [0, 0, 0, 0,
                   512,  # the pool keeps it
                   0,    # and the slice sees it as used
                   0,    # the allocation fits only because libvgpu trimmed the pool
                   0, 512]


def test_a_pool_that_cannot_give_back_makes_others_wait(env, tmp_path):
    """Another process of the slice cannot trim this one's pool: its allocation is refused
    while the pool keeps the memory, and fits once the owner trims."""
    env["VGPU_REGION_DIR"] = str(tmp_path / "slice")
    owner = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(TEST_BIN / "vgpu_probe"),
         "threshold:max", "async:512", "freeasync", "sync", "wait"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert owner.stdin and owner.stdout
    try:
        for _ in range(4):
            assert json.loads(owner.stdout.readline())["rc"] == 0
        refused = results(client(env, "mem:512", "mem:1", "info", "physical"))
        owner.stdin.write("\ntrim\nreserved\n")
        owner.stdin.flush()
        trimmed = [json.loads(owner.stdout.readline()) for _ in range(3)]
        after = results(client(env, "mem:512", "physical"))
    finally:
        owner.kill()
        owner.wait()
    assert refused == [2, 2, 0, 512]  # CUDA_ERROR_OUT_OF_MEMORY; the GPU holds the limit only
    assert [x.get("mib", x.get("rc")) for x in trimmed[1:]] == [0, 0]
    assert after == [0, 512]


def test_a_pool_reuses_its_own_memory_without_a_false_oom(env):
    """Allocating again from the pool what it keeps (synced or not, in a loop) fits."""
    ops = ["threshold:max"]
    for i in range(10):
        ops += ["async:512", "freeasync"] + (["sync"] if i % 2 else [])
    ops += ["async:256", "async:256", "physical", "freeasync", "freeasync", "sync", "info",
            "trim", "info", "physical"]
    out = results(client(env, *ops))
    assert all(rc == 0 for rc in out[:-8]), out
    assert out[-8] == 512            # never more than the limit on the GPU
    assert out[-4:] == [0, 0, 512, 0]  # kept: the slice has none free; trimmed: all of it


def test_default_threshold_gives_memory_back_at_a_sync(env, tmp_path):
    """With the default release threshold (0) a sync releases what was freed: the whole
    limit is free again, for this process and for another one of the slice."""
    env["VGPU_REGION_DIR"] = str(tmp_path / "slice")
    out = results(client(env, "async:512", "freeasync", "sync", "reserved", "info",
                         "mem:512", "physical", "freemem", "async:512", "freeasync", "sync",
                         "--"))
    assert out == [0, 0, 0, 0, 512, 0, 512, 0, 0, 0, 0]
    # the process above is gone; a sync-released pool leaves nothing charged behind it
    owner = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(TEST_BIN / "vgpu_probe"),
         "async:512", "freeasync", "sync", "wait"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert owner.stdin and owner.stdout
    try:
        for _ in range(3):
            assert json.loads(owner.stdout.readline())["rc"] == 0
        other = results(client(env, "mem:512"))
    finally:
        owner.kill()
        owner.wait()
    assert other == [0]


def test_created_and_current_pools_are_counted_too(env):
    """The same for a pool of the application's own, made current (cuDeviceSetMemPool) or
    named (cuMemAllocFromPoolAsync), and for one destroyed while it kept memory."""
    kept = results(client(env, "newpool:current", "threshold:max", "async:256", "frompool:256",
                          "freeasync", "freeasync", "sync", "reserved", "info", "mem:512",
                          "reserved", "physical"))
    assert kept == [0] * 7 + [512, 0, 0, 0, 512]
    destroyed = results(client(env, "newpool", "threshold:max", "frompool:512", "freeasync",
                               "sync", "info", "destroy", "info", "mem:512", "physical"))
    assert destroyed == [0] * 5 + [0, 0, 512, 0, 512]
