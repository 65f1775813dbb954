/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_procaddr.c - cuGetProcAddress(_v2): how the CUDA runtime and
 * cuda-python find every other entry point. The name/version table lives in
 * cuda_procs.c; this file only checks arguments and reports the result. It
 * works before cuInit, since the runtime resolves cuInit itself through it.
 *
 * Also cuGetExportTable, the driver's private interfaces, which simgpu does not
 * have, and SIMGPU_TRACE=1: one stderr line per lookup of either kind, so what
 * a client (NVIDIA's CUDA runtime, say) asks of the driver can be seen.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "cuda_procs.h"

/* SIMGPU_TRACE, read once: 1 = trace, 0 = not, -1 = not read yet. */
static _Atomic int g_trace = -1;

static int trace_on(void)
{
    int on = atomic_load_explicit(&g_trace, memory_order_relaxed);
    if (on < 0) {
        const char *v = getenv("SIMGPU_TRACE");
        on = v && strcmp(v, "1") == 0;
        atomic_store_explicit(&g_trace, on, memory_order_relaxed);
    }
    return on;
}

/* SIMGPU_PROCADDR_UNEXPORTED=name[,name...], for tests: cuGetProcAddress answers these
 * base names with an entry point no exported symbol has (as a driver may for a variant
 * it does not export), which returns CUDA_ERROR_NOT_SUPPORTED when called. libvgpu's
 * start-up self-check must refuse to run with limits then (docs/libvgpu.md). */
static CUresult unexported_entry(void)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}

static int unexported(const char *symbol)
{
    const char *v = getenv("SIMGPU_PROCADDR_UNEXPORTED");
    size_t n = strlen(symbol);
    for (const char *p = v; p && *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        if (strncmp(p, symbol, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return 1;
    }
    return 0;
}

static CUresult get_proc(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *symbolStatus)
{
    if (symbolStatus)
        *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn || cudaVersion <= 0 ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int st = simgpu_proc_lookup(symbol, cudaVersion, flags, pfn);
    if (st != CU_GET_PROC_ADDRESS_SUCCESS)
        *pfn = NULL;
    else if (unexported(symbol))
        *pfn = (void *)unexported_entry;
    if (symbolStatus)
        *symbolStatus = st;
    if (trace_on())
        fprintf(stderr, "simgpu-trace: cuGetProcAddress %s %d 0x%llx -> %s\n", symbol, cudaVersion,
                (unsigned long long)flags,
                st == CU_GET_PROC_ADDRESS_SUCCESS          ? "found"
                : st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND ? "symbol not found"
                                                             : "version not sufficient");
    return st == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

SIMGPU_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return get_proc(symbol, pfn, cudaVersion, flags, NULL);
}

SIMGPU_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                        CUdriverProcAddressQueryResult *symbolStatus)
{
    return get_proc(symbol, pfn, cudaVersion, flags, symbolStatus);
}

#ifndef SIMGPU_OBSERVE_EXPORT_TABLES /* tools/observe_export_tables.py brings its own */
/* The driver's private interfaces, each named by a 16-byte UUID. NVIDIA's CUDA runtime
 * (libcudart 12.x and 13.x) needs several at initialisation, and one of them is a test
 * of the driver's authenticity whose answers the runtime checks: simgpu cannot give
 * them, so it has none (docs/simgpu.md, "NVIDIA's CUDA runtime"). */
SIMGPU_API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    if (!ppExportTable || !pExportTableId)
        return CUDA_ERROR_INVALID_VALUE;
    *ppExportTable = NULL;
    if (trace_on()) {
        char hex[2 * sizeof(pExportTableId->bytes) + 1];
        for (size_t i = 0; i < sizeof(pExportTableId->bytes); i++)
            snprintf(hex + 2 * i, 3, "%02x", (unsigned char)pExportTableId->bytes[i]);
        fprintf(stderr, "simgpu-trace: cuGetExportTable %s -> not supported\n", hex);
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}
#endif
