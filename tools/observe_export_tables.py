#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Watch what a client does with the driver's export tables (cuGetExportTable), on simgpu.

simgpu answers no export table (docs/simgpu.md, "NVIDIA's CUDA runtime"). This tool builds
a second simgpu, build/observe/libcuda.so.1, whose cuGetExportTable answers every table
with one of its own made of distinct trap functions, runs a command on it, and lets the
tables tell what the client does with them. It is how the runtime's tables were studied;
nothing in it is a reply the client accepts as the driver's.

    python3 tools/observe_export_tables.py [options] -- COMMAND [ARG...]

On stderr, besides SIMGPU_TRACE's lines (every cuGetProcAddress and cuGetExportTable):
    observe: table T = UUID              the T-th table asked for (T counts from 0)
    observe: read table T word W (+B) rip ADDR
                                         the client read word W (8 bytes; word 0 is the
                                         size, 8 * (slots + 1)) at instruction ADDR
    observe: call table T word W (a0 .. a5) -> R
                                         word W (a trap) was called; a0..a5 are the first
                                         six integer arguments, then the first six words
                                         at each argument that points at readable memory

Options (repeatable where they take T:W):
    --ret T:W:R       the trap at table T word W returns R (default 801, not supported)
    --out T:W:V0:V1   ... and first stores V0 at *a0 and V1 at *a1 (8 bytes each)
    --deny UUID       refuse that table (CUDA_ERROR_NOT_SUPPORTED), as simgpu does
    --slots N         function words per table (default 128)

What led NVIDIA's runtime (12.9.79, 13.0.96) furthest, to its driver authenticity test
(table 6 here; docs/simgpu.md), with a ctypes or C program calling cudaGetDeviceCount:

    python3 tools/observe_export_tables.py --ret 1:2:0 --ret 2:2:0 --out 2:2:0:1023 \
        --ret 2:6:0 --out 2:6:0:1023 --ret 2:5:0 --ret 5:3:0 --ret 6:1:0 -- PROGRAM

x86-64 Linux only: a read is caught by keeping the tables' pages unreadable, catching
SIGSEGV, and single-stepping the reading instruction (the trap flag) with the pages
readable. Needs gcc and a built simgpu (make).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "observe"
TABLES = 16

C_HEAD = r"""
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#include "cuda_internal.h"

#define NT %(nt)d
#define NS %(ns)d
#define TSZ (((NS + 1) * 8 + 4095) & ~4095)

static char *g_pages;                 /* NT tables, TSZ bytes each, kept PROT_NONE */
static unsigned char g_uuid[NT][16];
static int g_n;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void dump(const long *v)
{
    for (int k = 0; k < 6; k++) {
        long w[6];
        struct iovec l = {w, sizeof w}, r = {(void *)v[k], sizeof w};
        if ((unsigned long)v[k] < 0x10000 ||
            process_vm_readv(getpid(), &l, 1, &r, 1, 0) != sizeof w)
            continue;
        fprintf(stderr, "observe:     a%%d -> %%lx %%lx %%lx %%lx %%lx %%lx\n", k,
                w[0], w[1], w[2], w[3], w[4], w[5]);
    }
}

/* OBSERVE_RET / OBSERVE_OUT for table t word w. */
static long reply(int t, int w, const long *v)
{
    long ret = 801;
    const char *e = getenv("OBSERVE_RET");
    for (int n; e && *e; e += n + (e[n] == ',')) {
        int tt, ww;
        long r;
        if (sscanf(e, "%%d:%%d:%%li%%n", &tt, &ww, &r, &n) != 3)
            break;
        if (tt == t && ww == w)
            ret = r;
    }
    e = getenv("OBSERVE_OUT");
    for (int n; e && *e; e += n + (e[n] == ',')) {
        int tt, ww;
        unsigned long v0, v1;
        if (sscanf(e, "%%d:%%d:%%li:%%li%%n", &tt, &ww, &v0, &v1, &n) != 4)
            break;
        if (tt == t && ww == w) {
            *(unsigned long *)v[0] = v0;
            *(unsigned long *)v[1] = v1;
        }
    }
    return ret;
}

static long trap(int t, int w, long a, long b, long c, long d, long e, long f)
{
    long v[6] = {a, b, c, d, e, f};
    fprintf(stderr, "observe: call table %%d word %%d (%%lx %%lx %%lx %%lx %%lx %%lx)\n",
            t, w, a, b, c, d, e, f);
    dump(v);
    long r = reply(t, w, v);
    fprintf(stderr, "observe:     -> %%ld\n", r);
    return r;
}
"""

C_TAIL = r"""
static void on_segv(int sig, siginfo_t *si, void *uc_)
{
    ucontext_t *uc = uc_;
    char *a = si->si_addr;
    if (!g_pages || a < g_pages || a >= g_pages + NT * TSZ) {
        signal(sig, SIG_DFL); /* not ours: fault again, for real */
        return;
    }
    long off = a - g_pages;
    fprintf(stderr, "observe: read table %%ld word %%ld (+%%ld) rip %%llx\n", off / TSZ,
            (off %% TSZ) / 8, off %% 8, (unsigned long long)uc->uc_mcontext.gregs[REG_RIP]);
    mprotect(g_pages, NT * TSZ, PROT_READ);
    uc->uc_mcontext.gregs[REG_EFL] |= 0x100; /* trap after this one instruction */
}

static void on_trap(int sig, siginfo_t *si, void *uc_)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = uc_;
    mprotect(g_pages, NT * TSZ, PROT_NONE);
    uc->uc_mcontext.gregs[REG_EFL] &= ~0x100;
}

static void setup(void)
{
    g_pages = mmap(NULL, NT * TSZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g_pages == MAP_FAILED) {
        perror("observe: mmap");
        abort();
    }
    for (int t = 0; t < NT; t++) {
        void **tab = (void **)(g_pages + t * TSZ);
        tab[0] = (void *)(uintptr_t)((NS + 1) * 8);
        memcpy(tab + 1, g_traps[t], sizeof(g_traps[t]));
    }
    struct sigaction sa = {0};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    sa.sa_sigaction = on_trap;
    sigaction(SIGTRAP, &sa, NULL);
    mprotect(g_pages, NT * TSZ, PROT_NONE);
}

SIMGPU_API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    if (!ppExportTable || !pExportTableId)
        return CUDA_ERROR_INVALID_VALUE;
    char hex[33];
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%%02x", (unsigned char)pExportTableId->bytes[i]);
    const char *deny = getenv("OBSERVE_DENY");
    if (deny && strstr(deny, hex)) {
        fprintf(stderr, "observe: table %%s denied\n", hex);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_lock(&g_lock);
    if (!g_pages)
        setup();
    int t;
    for (t = 0; t < g_n && memcmp(g_uuid[t], pExportTableId->bytes, 16) != 0; t++)
        ;
    if (t == g_n && g_n < NT) {
        memcpy(g_uuid[g_n++], pExportTableId->bytes, 16);
        fprintf(stderr, "observe: table %%d = %%s\n", t, hex);
    }
    pthread_mutex_unlock(&g_lock);
    if (t == NT)
        return CUDA_ERROR_NOT_SUPPORTED;
    *ppExportTable = g_pages + t * TSZ;
    return CUDA_SUCCESS;
}
"""


def generate(slots: int) -> str:
    parts = [C_HEAD % {"nt": TABLES, "ns": slots}]
    for t in range(TABLES):
        for w in range(1, slots + 1):
            parts.append(f"static long trap_{t}_{w}(long a, long b, long c, long d, long e, long f)"
                         f" {{ return trap({t}, {w}, a, b, c, d, e, f); }}\n")
    parts.append("static void *const g_traps[NT][NS] = {\n")
    for t in range(TABLES):
        parts.append("    {" + ", ".join(f"(void *)trap_{t}_{w}" for w in range(1, slots + 1))
                     + "},\n")
    parts.append("};\n")
    parts.append(C_TAIL % {})
    return "".join(parts)


def build(slots: int) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    src = OUT / "export_traps.c"
    tmp = OUT / f".export_traps.c.{os.getpid()}"
    tmp.write_text(generate(slots))
    os.replace(tmp, src)
    sim = ROOT / "libvgpu" / "simgpu"
    sources = sorted(str(p) for p in sim.glob("cuda_*.c"))
    sources += [str(sim / "state.c"), str(sim / "engine.c")]
    sources += sorted(str(p) for p in (ROOT / "libvgpu" / "common").glob("*.c"))
    lib = OUT / "libcuda.so.1"
    tmp_lib = OUT / f".libcuda.so.1.{os.getpid()}"  # replaced whole, never rewritten in place
    subprocess.run(["gcc", "-O1", "-g", "-std=gnu11", "-fPIC", "-fvisibility=hidden", "-pthread",
                    "-D_GNU_SOURCE", "-DSIMGPU_OBSERVE_EXPORT_TABLES", f"-I{sim}", "-shared",
                    "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic-functions", "-o", str(tmp_lib),
                    *sources, str(src), "-ldl", "-pthread"], check=True)
    os.replace(tmp_lib, lib)
    return lib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ret", action="append", default=[], metavar="T:W:R")
    ap.add_argument("--out", action="append", default=[], metavar="T:W:V0:V1")
    ap.add_argument("--deny", action="append", default=[], metavar="UUID")
    ap.add_argument("--slots", type=int, default=128)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command")
    lib = build(a.slots)
    env = dict(os.environ, SIMGPU_TRACE="1", OBSERVE_RET=",".join(a.ret),
               OBSERVE_OUT=",".join(a.out), OBSERVE_DENY=",".join(a.deny))
    # This driver first, simgpu's NVML after it.
    env["LD_LIBRARY_PATH"] = ":".join(
        p for p in (str(lib.parent), str(ROOT / "build" / "simgpu"), env.get("LD_LIBRARY_PATH"))
        if p)
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
